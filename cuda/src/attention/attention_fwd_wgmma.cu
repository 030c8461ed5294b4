// attention_fwd_wgmma.cu — FlashAttention forward on Hopper's warpgroup MMA, the further step after
// the mma.sync forward. Selected with FastForwardKernel::wgmma (fast_attention.hpp) or
// `flashlab bench attention --fwd-kernel wgmma`; built (cuda/CMakeLists.txt, object library
// flashlab_cuda_wgmma, CUDA_ARCHITECTURES 90a) only when the configured architectures include 90.
//
// What it does: the same algorithm, loop order and names as attention_fwd_tc.cu (FA2 order, one
// thread block per query tile Q_i, inner loop over key tiles K_j, V_j, online softmax in base 2,
// LSE_i = m_i + log2(l_i) in fp32, deferred 1/l_i; the Triton walkthrough), but the two matrix products are
// `wgmma.mma_async` (sm_90a only: compile this file with -gencode arch=compute_90a,code=sm_90a):
//   - A block has kWarpgroups = 2 warpgroups of 128 threads; warpgroup w owns query rows
//     64w .. 64w+63 of Q_i (Br = BLOCK_M = 128) and their S_ij, P_ij, O_i for the whole loop.
//     Bc = BLOCK_N = 128 keys per step.
//   - S_ij = Q_i K_jᵀ: `wgmma m64n128k16`, both operands read by the tensor cores straight from
//     SRAM through matrix descriptors (no ldmatrix); fp32 accumulators in registers (64 per thread).
//   - Softmax on those accumulator registers (scores raw, scale folded into one FMA before ex2, as
//     attention_fwd_tc.cu). P_ij is rounded to 16 bits in registers and is the *register* A
//     operand of O_i += P_ij V_j (`wgmma m64n{d}k16`, B = V_j from SRAM). The accumulator layout
//     of m64nN (per warp: the m16n8 C layout, repeated over n) is exactly the register-A layout of
//     m64nNk16, so P needs no shuffles.
//   - SRAM layout = the descriptors' 128-byte swizzle: a [rows][d] tile is stored as d/64 column
//     blocks ("atoms" of 64 16-bit columns = 128 bytes per row); inside a block, row r's 16-byte
//     chunk c sits at chunk c ^ (r & 7) (the same XOR as tensor_core.cuh's swz, which is why the
//     hardware's Swizzle<3,4,3> and our cp.async writes agree). Every tile starts 1024-byte aligned
//     (the swizzle is applied to absolute address bits 4–9).
//       Q_i, K_j (K-major operands): stride between 8-row groups (SBO) = 1024 B; a k16 step inside
//         a 64-column block advances the start address by 32 B, the next block by rows·128 B.
//       V_j (B of P·V, [keys][d] row-major = MN-major, imm-trans-b = 1): SBO = 1024 B between
//         8-key groups, LBO = BLOCK_N·128 B between the 64-column blocks of d; a k16 step = 16
//         keys = 2048 B.
//   - K_j, V_j: HBM → SRAM with cp.async (all 256 threads), two stages: K_{j+1}, V_{j+1} are in
//     flight while step j computes; one __syncthreads() per step. cp.async writes are generic-proxy
//     writes, wgmma reads SRAM through the async proxy: every thread fences (fence.proxy.async)
//     after its copies landed and before the barrier. Out-of-sequence rows are zero-filled (the Triton
//     walkthrough, "the NaN hazard": no stale SRAM reaches P·V).
//   - Masks as attention_fwd_tc.cu: keys ≥ N and (causal) key > row get −inf, only on tiles that
//     need it; a fully masked row gives O = 0 and LSE = −inf, never NaN. Causal blocks skip key
//     tiles right of their last row and run the longest (bottom) query tiles first.
//   - One schedule per step: S_ij, wait, softmax, P_ij·V_j, wait. FlashAttention-3's
//     intra-warpgroup pipeline (softmax_j while the tensor cores do P_{j−1}·V_{j−1}) was measured
//     slower here: it needs more registers, and the two warpgroups of a block already overlap
//     each other's softmax and wgmma.
//   - Not done: TMA loads (cp.async.bulk.tensor), a producer warp with mbarriers instead of the
//     block-wide barrier per step (which keeps both warpgroups in lock step), explicit ping-pong of
//     the two warpgroups (named barriers), O staged through SRAM for 16-byte stores, lazy rescale.
//     FlashAttention-3 has all of these, and cuDNN's forward is faster than this file.
//     attention_fwd_ws.cu (`--fwd-kernel tma-ws`) adds TMA, the producer, ping-pong and lazy rescale.
// Resources: d = 128 fits in the register budget of one 256-thread block per SM without spills,
// with Q_i 32 KiB + 2 stages × (K_j 32 KiB + V_j 32 KiB) + 1 KiB alignment slack of dynamic SRAM;
// d = 64 also runs one block per SM (two would need ≤ 128 registers per thread).
// Instantiations: d ∈ {64, 128} × {bf16, fp16} × {causal, not}.
#include "core/common.hpp"
#include "attention/launchers.hpp"
#include "core/hopper.cuh"
#include "core/tensor_core.cuh"
#include "attention/wgmma_fwd_step.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>


namespace flashlab::cuda::detail {

namespace {

// wgmma primitives (wg_fence, smem_desc, wgmma_ss_n128, wgmma_rs, ...): hopper.cuh.

// ----------------------------------------------------------------------------- tile parameters
template <int HEAD_DIM, bool kBf16_, bool kCausal_>
struct WgTraits {
  static constexpr int kHeadDim = HEAD_DIM;
  static constexpr bool kBf16 = kBf16_;
  static constexpr bool kCausal = kCausal_;
  static constexpr bool kWindow = false;  // the window's left side: the tma-ws forward's alone
  static constexpr int kWarpgroups = 2;               // consumer warpgroups, 64 query rows each
  static constexpr int kThreads = 128 * kWarpgroups;
  static constexpr int BLOCK_M = 64 * kWarpgroups;    // Br
  static constexpr int BLOCK_N = 128;                 // Bc (n of the S wgmma)
  static constexpr int kStages = 2;                   // K_j/V_j ring (stage = j & 1 in the kernel)
  static_assert(kStages == 2, "the kernel indexes stages with j & 1");
  static constexpr int kChunks = HEAD_DIM / 8;        // 16-byte chunks per row
  static constexpr int kTileQBytes = BLOCK_M * HEAD_DIM * 2;
  static constexpr int kTileKVBytes = BLOCK_N * HEAD_DIM * 2;
  // +1024: the dynamic SRAM base is rounded up to the 1024-byte swizzle period.
  static constexpr int kSmemBytes = kTileQBytes + 2 * kStages * kTileKVBytes + 1024;
  static_assert(HEAD_DIM == 64 || HEAD_DIM == 128, "d ∈ {64, 128}");
  // With Br == Bc no warpgroup ever sees a causal key tile that is masked for all its rows (the
  // last tile of block i is tile i, whose first key is the block's first row), so no per-warpgroup skip.
  static_assert(BLOCK_M == BLOCK_N, "causal loop bound assumes Br == Bc");
};

/// Byte offset of 16-byte chunk `c` of row `r` in a [rows][d] tile in the 128-byte-swizzle layout.
__device__ __forceinline__ uint32_t sw128(int rows, int r, int c) {
  return uint32_t((c >> 3) * rows * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

/// rows × d tile (token rows row0 ..) HBM → SRAM with cp.async; rows ≥ N are zero-filled.
template <class T, int kRows>
__device__ __forceinline__ void load_tile(uint32_t dst, const uint16_t* __restrict__ head, int row0, int N,
                                          std::size_t stride, int tid) {
  constexpr int kIters = kRows * T::kChunks / T::kThreads;
  static_assert(kIters * T::kThreads == kRows * T::kChunks, "whole tile per pass");
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int idx = tid + it * T::kThreads;
    const int r = idx / T::kChunks, c = idx % T::kChunks;
    const bool valid = row0 + r < N;
    const uint16_t* src = head + (valid ? std::size_t(row0 + r) * stride + 8 * c : 0);
    cp_async16(dst + sw128(kRows, r, c), src, valid);
  }
}

// One step's pieces (issue_qk, issue_pv, online_softmax, rescale_o, pack_p, store_o_lse) are
// shared with attention_fwd_ws.cu: wgmma_fwd_step.cuh.
using wgmma_step::issue_pv;
using wgmma_step::issue_qk;
using wgmma_step::online_softmax;
using wgmma_step::pack_p;
using wgmma_step::rescale_o;
using wgmma_step::store_o_lse;

// ----------------------------------------------------------------------------- the kernel
// Step j: S_ij = Q_i K_jᵀ, wait, softmax, O_i += P_ij V_j, wait; the copies of K_{j+1}, V_{j+1}
// are in flight meanwhile. The two warpgroups of a block overlap each other's softmax and wgmma.
template <class T>
__global__ void __launch_bounds__(T::kThreads, 1)
    wgmma_fwd_kernel(Problem p, const uint16_t* __restrict__ Q, const uint16_t* __restrict__ K,
                     const uint16_t* __restrict__ V, uint16_t* __restrict__ O, float* __restrict__ LSE,
                     uint32_t v_lbo, uint32_t v_sbo) {
#if FLASHLAB_WGMMA_OK
  constexpr int D = T::kHeadDim, BLOCK_M = T::BLOCK_M, BLOCK_N = T::BLOCK_N;
  constexpr bool kCausal = T::kCausal;
  constexpr float NEG_INF = -INFINITY;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t smem0 = (uint32_t(__cvta_generic_to_shared(smem_raw)) + 1023u) & ~1023u;
  const uint32_t sQ = smem0;
  auto sK = [&](int s) { return smem0 + T::kTileQBytes + uint32_t(s) * 2 * T::kTileKVBytes; };
  auto sV = [&](int s) { return sK(s) + T::kTileKVBytes; };

  const int N = p.seq;
  // Causal: the bottom query tiles have the most key tiles; launch them first.
  const int m_tile = kCausal ? int(gridDim.x) - 1 - int(blockIdx.x) : int(blockIdx.x);
  const int h = blockIdx.y, b = blockIdx.z;
  const int row0 = m_tile * BLOCK_M;
  const std::size_t stride = p.row_stride();
  const std::size_t base = p.head_offset(b, h);
  const int tid = threadIdx.x;
  const int wg = tid / 128;                   // warpgroup: query rows 64·wg .. of Q_i
  const int warp = (tid % 128) / 32;          // warp inside the warpgroup: 16 rows each
  const int lane = tid % 32, g = lane / 4, t4 = lane % 4;
  const int row_base = row0 + 64 * wg + 16 * warp + g;  // this thread's rows: row_base, row_base + 8
  const int wg_row0 = row0 + 64 * wg;

  int Tc = (N + BLOCK_N - 1) / BLOCK_N;
  if (kCausal) Tc = min(Tc, (row0 + BLOCK_M - 1) / BLOCK_N + 1);
  // Tile j needs masks when it reaches past N, or (causal) past this warpgroup's first row.
  auto need_mask = [&](int j) {
    return (j + 1) * BLOCK_N > N || (kCausal && (j + 1) * BLOCK_N - 1 > wg_row0);
  };

  load_tile<T, BLOCK_M>(sQ, Q + base, row0, N, stride, tid);
  load_tile<T, BLOCK_N>(sK(0), K + base, 0, N, stride, tid);
  load_tile<T, BLOCK_N>(sV(0), V + base, 0, N, stride, tid);
  cp_async_commit();

  float o[D / 2];            // O_i accumulator: m64nD fragment (rows row_base + 8r, cols 8t + 2·t4 + e)
  float s_acc[BLOCK_N / 2];  // S_ij, then P_ij (fp32)
  uint32_t pa[BLOCK_N / 16][4];  // P_ij in 16 bits: the A operand of P·V
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
#pragma unroll
  for (int i = 0; i < BLOCK_N / 2; ++i) s_acc[i] = 0.f;
  float m_i[2] = {NEG_INF, NEG_INF};  // running row max, base-2 scaled units
  float l_i[2] = {0.f, 0.f};          // running row sum (this thread's columns only)
  float alpha[2];
  const float scale_log2 = p.scale_log2;
  const uint32_t sQ_wg = sQ + uint32_t(wg) * 64 * 128;  // this warpgroup's 64 rows (8 swizzle periods)

  for (int j = 0; j < Tc; ++j) {
    const int s = j & 1;
    cp_async_wait<0>();      // K_j, V_j (and Q_i) of this thread landed
    fence_proxy_async_shared();  // ... and are visible to the tensor cores' (async proxy) reads
    __syncthreads();             // everyone's copies; everyone done with stage s ^ 1 (step j − 1)
    if (j + 1 < Tc) {
      load_tile<T, BLOCK_N>(sK(s ^ 1), K + base, (j + 1) * BLOCK_N, N, stride, tid);
      load_tile<T, BLOCK_N>(sV(s ^ 1), V + base, (j + 1) * BLOCK_N, N, stride, tid);
    }
    cp_async_commit();

    wg_fence();
    reg_fence(s_acc);
    issue_qk<T>(s_acc, sQ_wg, sK(s));
    wg_commit();
    wg_wait<0>();
    reg_fence(s_acc);

    online_softmax<T>(s_acc, m_i, l_i, alpha, j * BLOCK_N, N, row_base, need_mask(j), t4, scale_log2);
    rescale_o<D>(o, alpha);
    pack_p<T>(s_acc, pa);

    wg_fence();  // o and pa were written by ordinary instructions
    reg_fence(o);
    issue_pv<T>(o, pa, sV(s), v_lbo, v_sbo);
    wg_commit();
    wg_wait<0>();  // stage s is overwritten after the next barrier
    reg_fence(o);
    reg_fence_u(pa);
  }
  cp_async_wait<0>();  // no copy may still be writing SRAM when the block exits (empty groups)

  // O_i = acc / l_i: registers → HBM (input dtype). LSE_i = m_i + log2(l_i) (fp32, base 2).
  store_o_lse<T>(p, O, LSE, o, m_i, l_i, b, h, row_base, t4);
#else
  __trap();  // built without sm_90a: never launched (see the file-top comment)
#endif
}

template <int D, bool kBf16, bool kCausal>
void launch_wgmma_one(const Problem& p, const void* Q, const void* K, const void* V, void* O, float* LSE,
                      cudaStream_t stream) {
  using T = WgTraits<D, kBf16, kCausal>;
  auto kernel = &wgmma_fwd_kernel<T>;
  // > 48 KiB of dynamic SRAM: opted in per device (the record is kept, thread-safe: common.hpp).
  set_smem(reinterpret_cast<const void*>(kernel), T::kSmemBytes, "wgmma_fwd_kernel", p);
  // V's descriptor: LBO = bytes between the 64-column blocks of d, SBO = bytes between 8-key groups.
  const uint32_t lbo = uint32_t(T::BLOCK_N) * 128u, sbo = 1024u;
  const dim3 grid((p.seq + T::BLOCK_M - 1) / T::BLOCK_M, p.heads, p.batch);
  announce("wgmma_fwd_kernel");
  kernel<<<grid, T::kThreads, T::kSmemBytes, stream>>>(
      p, static_cast<const uint16_t*>(Q), static_cast<const uint16_t*>(K), static_cast<const uint16_t*>(V),
      static_cast<uint16_t*>(O), LSE, lbo, sbo);
  FLASHLAB_CUDA_CHECK_LAUNCH("wgmma_fwd_kernel");
}

template <int D, bool kBf16>
void launch_wgmma_d(const Problem& p, const void* Q, const void* K, const void* V, void* O, float* LSE,
                    cudaStream_t stream) {
  if (p.causal) launch_wgmma_one<D, kBf16, true>(p, Q, K, V, O, LSE, stream);
  else launch_wgmma_one<D, kBf16, false>(p, Q, K, V, O, LSE, stream);
}

}  // namespace

void launch_fast_wgmma(const Problem& p, bool bf16, const void* Q, const void* K, const void* V, void* O, float* LSE,
                       cudaStream_t stream) {
  static_assert(kWgmmaBlockM == WgTraits<128, true, false>::BLOCK_M && kWgmmaBlockN == WgTraits<128, true, false>::BLOCK_N,
                "launchers.hpp reports the tiles of this file");
  if (p.head_dim == 64) {
    if (bf16) launch_wgmma_d<64, true>(p, Q, K, V, O, LSE, stream);
    else launch_wgmma_d<64, false>(p, Q, K, V, O, LSE, stream);
  } else {
    if (bf16) launch_wgmma_d<128, true>(p, Q, K, V, O, LSE, stream);
    else launch_wgmma_d<128, false>(p, Q, K, V, O, LSE, stream);
  }
}

}  // namespace flashlab::cuda::detail
