// attention_bwd_d256.cu — the atomic tensor-core backward at head dim d = 256.
//
// WHAT. The algorithm, names and dQ hand-off of attention_bwd_tc_atomic.cu (the Triton walkthrough,
// "Backward Pass"; one block per K_j, V_j; dQ accumulated in fp32 by bulk asynchronous reductions in
// L2), with tiles and warp layouts of its own, because that kernel's layouts do not fit d = 256:
// its 8 warps hold dK_j and dV_j of a 128-key block, 32 keys × d/2 columns of both per warp, which
// is d = 256 fp32 registers per thread at d = 256 (a thread has 255).
//
// THE MODEL that picked the tiles (fp32 accumulators of dK_j and dV_j: 2·Bc·d·4 bytes over 256
// threads; SRAM: K_j, V_j, two stages of Q_i and dO_i, P_ij and dS_ij, the warps' dQ slices):
//   Bc 128, Br 64: accumulators 256 registers per thread, SRAM 352 KiB: neither fits.
//   Bc 64,  Br 64: 128 registers; SRAM 64 + 128 + 16 + 64 (dQ partial 64 × 256 fp32) = 273 KiB > 227.
//   Bc 64,  Br 32: 128 registers; SRAM 64 + 64 + 8 + 32 = 168.5 KiB: fits, one block per SM.
// Splitting dK and dV into two passes over the query tiles (or d over two warp halves) keeps Bc
// 128 but recomputes S_ij and dP_ij (or sums S across halves through SRAM) every step; Bc 64 pays
// instead with twice the reads of Q_i and dO_i from L2 and twice the dQ reductions of the d = 128
// kernel per key, and half the work per barrier. Chosen: Bc = 64, Br = 32.
//
// WARP LAYOUTS (8 warps, w = 0 … 7):
//   S, dP (32 × 64):    2 (query rows, 16 each) × 4 (keys, 16 each): one m16 tile per warp;
//   dQ_i partial (32 × 256): warp w owns columns [32w, 32w + 32) of all 32 rows (two m16 tiles),
//                       A = dS (ldmatrix), B = K_j (ldmatrix.trans), k = the 64 keys;
//   dV_j, dK_j (64 × 256): 2 (keys, 32 each) × 4 (d, 64 columns each), both accumulators in
//                       registers for the whole loop (2 × 64 floats per thread), k = the 32 rows.
// Each step: wait for tile i, barrier, prefetch tile i+1, S/dP → P/dS (16 bits, SRAM), barrier,
// dQ partial and its 4 KiB bulk reduction per warp, dV_j += P_ijᵀ dO_i, dK_j += dS_ijᵀ Q_i.
// Barriers, fences and the hand-off are those of attention_bwd_tc_atomic.cu (its file-top comment).
//
// SRAM (dynamic, 16-bit tiles swizzled in 16-byte chunks):
//   [K_j 32][V_j 32][Q_i ×2 16][dO_i ×2 16][P_ij 4][dS_ij 4][LSE_i, D_i ×2: 0.25][dQ slices 8 × 4] KiB.
//
// MASKS AND SHAPES as attention_bwd_tc_atomic.cu: causal, and (kBand) windows, grouped K/V (the
// block loops over the G query heads of its K/V head) and N_k ≠ N through the band window_lo …
// window_hi; masked P = 0 selected after 2^x; rows and keys past the ends zero-filled. The fp32-sum
// entry of the context-parallel ring (BwdPointers::add_f32) is not built at d = 256 (the front door
// refuses it).
//
// REGISTERS (ptxas, sm_90): 238, 246 with the band; no spills. MEASURED (H100, N = 8192, d = 256,
// docs/cuda.md): 241 TFLOP/s, 0.71× cuDNN (causal 0.64×), bound by SRAM reads: per step the 8 warps
// read 426 KiB by ldmatrix (S_ij and dP_ij, one m16 tile per warp, 64 of each warp's 104) for 1,280 mma.
//
// dQaccum: TILED per (b, h, query tile i of 32 rows), 32·256 floats; warp w's 32 × 32 partial is
// 1024 floats in mma C-fragment order (float4 number 32·(mt·4 + n) + lane = dq[mt][n][0..3]). The
// workspace (whole tiles of kAtomicDqTileRows rows) holds them; the convert back to [B, N, H, d] is
// the one both d = 256 backwards share (bwd_d256_dq.cuh, D256DqLayout below).
#include "attention/attention_bwd_tc.cuh"
#include "attention/bwd_d256.hpp"
#include "attention/bwd_d256_dq.cuh"
#include "core/warp_gemm.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace flashlab::cuda::detail {
namespace {

struct D256Tiles {
  static constexpr int HEAD_DIM = 256;
  static constexpr int BLOCK_M = 32;  // Br: streamed query rows per step
  static constexpr int BLOCK_N = 64;  // Bc: resident keys per block
  static constexpr int kWarps = 8, kThreads = 32 * kWarps;
  static constexpr int kTileQ = BLOCK_M * HEAD_DIM * 2;  // one stage of Q_i (or dO_i)
  static constexpr int kTileK = BLOCK_N * HEAD_DIM * 2;  // K_j (or V_j)
  static constexpr int kTileP = BLOCK_M * BLOCK_N * 2;   // P_ij (or dS_ij), [BLOCK_M][BLOCK_N]
  static constexpr int kTileL = 2 * BLOCK_M * 4;         // one stage of LSE_i and D_i (fp32)
  static constexpr int kSliceDq = 32 * 32 * 4;           // one warp's fp32 dQ partial
  static constexpr int kSmem = 2 * kTileK + 2 * 2 * kTileQ + 2 * kTileP + 2 * kTileL + kWarps * kSliceDq;
  static constexpr int kDqNT = 4;   // n8 tiles per warp in dQ (32 columns)
  static constexpr int kDkvNT = 8;  // n8 tiles per warp in dK/dV (64 columns)
  static_assert(BLOCK_M * HEAD_DIM == kWarps * 1024, "dQ tile = 8 warps × 32 × 32 floats");
  static_assert(BLOCK_N % BLOCK_M == 0, "causal: a key block's first visible query tile starts at start_n");
  static_assert(kAtomicDqTileRows % BLOCK_M == 0, "the workspace holds whole dQ tiles of this BLOCK_M");
  static_assert(kSmem <= 227 * 1024, "one block per SM");
};

/// c (16 × 16, one m16 tile × two n8 tiles, fp32) = A Bᵀ over k = 256: A = rows [a_row0, a_row0 +
/// 16) of SRAM tile sA, B = rows [b_row0, b_row0 + 16) of sB (both [rows][256], swizzled).
/// S = Q_i K_jᵀ and dP = dO_i V_jᵀ, one warp's 16 rows × 16 keys.
template <bool kBf16>
__device__ __forceinline__ void gemm_abt_16x16(float (&c)[2][4], uint32_t sA, int a_row0, uint32_t sB, int b_row0,
                                               int lane) {
#pragma unroll
  for (int n = 0; n < 2; ++n) c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.f;
  const int mi = lane >> 3;
#pragma unroll
  for (int kk = 0; kk < D256Tiles::HEAD_DIM / 16; ++kk) {
    uint32_t a[4], b[4];
    ldsm_x4(sA + swz<D256Tiles::HEAD_DIM>(a_row0 + (lane & 15), 2 * kk + (lane >> 4)), a[0], a[1], a[2], a[3]);
    ldsm_x4(sB + swz<D256Tiles::HEAD_DIM>(b_row0 + (lane & 7) + ((mi >> 1) << 3), 2 * kk + (mi & 1)), b[0], b[1], b[2],
            b[3]);
    mma16816<kBf16>(c[0], a, b[0], b[1]);
    mma16816<kBf16>(c[1], a, b[2], b[3]);
  }
}

/// Grid (Tc = ceil(N_k / 64), H_kv, B) non-causal, (H_kv, Tc, B) causal (the heaviest key blocks
/// first); 256 threads; D256Tiles::kSmem bytes of dynamic SRAM. kBand: windows, grouped K/V or
/// N_k ≠ N, masked by the band (causal folded in); else H_kv = H, N_k = N, causal or not.
template <bool kBf16, bool kBand>
__global__ void __launch_bounds__(D256Tiles::kThreads, 1)
    fast_bwd_d256_kernel(Problem p, const uint16_t* __restrict__ Q, const uint16_t* __restrict__ K,
                         const uint16_t* __restrict__ V, const uint16_t* __restrict__ dO,
                         const float* __restrict__ LSE, const float* __restrict__ D, float* __restrict__ dQaccum,
                         uint16_t* __restrict__ dK, uint16_t* __restrict__ dV) {
  using T = D256Tiles;
  constexpr int HEAD_DIM = T::HEAD_DIM, BLOCK_M = T::BLOCK_M, BLOCK_N = T::BLOCK_N, kThreads = T::kThreads;
  const int N = p.seq;
  const int Nk = kBand ? p.seq_k : N;
  // h: the K/V head (its query heads are h0 … h0 + G − 1; one, h itself, unless kBand groups them).
  const int j = p.causal ? blockIdx.y : blockIdx.x, h = p.causal ? blockIdx.x : blockIdx.y, b = blockIdx.z;
  const int start_n = j * BLOCK_N;
  const std::size_t stride = p.row_stride();
  const std::size_t kv_stride = kBand ? p.kv_row_stride() : stride;
  const std::size_t kv_base = kBand ? p.kv_head_offset(b, h) : p.head_offset(b, h);
  const int G = kBand ? p.heads / p.heads_kv : 1, h0 = h * G;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, t = lane & 3;  // mma fragment coordinates
  const int wr = warp >> 2, wc = warp & 3;  // S/dP: 16-row half × 16-key quarter
  const int wk = warp >> 2, wd = warp & 3;  // dK/dV: 32-key half × 64-column quarter

  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t sK = uint32_t(__cvta_generic_to_shared(smem_raw));
  const uint32_t sV = sK + T::kTileK;
  const uint32_t sQ = sV + T::kTileK;       // + stage · kTileQ
  const uint32_t sdO = sQ + 2 * T::kTileQ;  // + stage · kTileQ
  const uint32_t sP = sdO + 2 * T::kTileQ;  // [BLOCK_M][BLOCK_N] 16-bit
  const uint32_t sdS = sP + T::kTileP;
  const uint32_t sL = sdS + T::kTileP;      // + stage · kTileL: [LSE_i: BLOCK_M][D_i: BLOCK_M]
  const uint32_t sDq = sL + 2 * T::kTileL;  // + warp · kSliceDq

  // The query tiles that see this key block: causal from the diagonal on; the band's rows
  // key − hi … key − lo (an empty range runs no step and writes dK_j = dV_j = 0).
  const int Tr = (N + BLOCK_M - 1) / BLOCK_M;
  int i_begin = p.causal ? start_n / BLOCK_M : 0, i_end = Tr;
  const int lo = kBand ? p.window_lo() : 0, hi = kBand ? p.window_hi() : 0;
  if constexpr (kBand) {
    const int key_last = min(start_n + BLOCK_N, Nk) - 1;
    const int q_first = max(0, start_n - hi), q_last = min(N - 1, key_last - lo);
    i_begin = q_first / BLOCK_M;
    i_end = q_last < q_first ? i_begin : q_last / BLOCK_M + 1;
  }

  auto load_stats_async = [&](uint32_t dst, int row0, std::size_t head_stat) {
    if (int(threadIdx.x) < 2 * BLOCK_M) {
      const int r = int(threadIdx.x) % BLOCK_M, row = row0 + r;
      const float* src = (int(threadIdx.x) < BLOCK_M ? LSE : D) + head_stat + (row < N ? row : 0);
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst + 4 * uint32_t(threadIdx.x)),
                   "l"(src), "r"(row < N ? 4 : 0));
    }
  };
  auto load_query_tile = [&](uint32_t stage_off, int row0, int hq) {
    const std::size_t qbase = p.head_offset(b, hq);
    load_tile_async<HEAD_DIM, BLOCK_M, kThreads>(sQ + stage_off, Q + qbase, stride, row0, N);
    load_tile_async<HEAD_DIM, BLOCK_M, kThreads>(sdO + stage_off, dO + qbase, stride, row0, N);
  };

  load_tile_async<HEAD_DIM, BLOCK_N, kThreads>(sK, K + kv_base, kv_stride, start_n, Nk);
  load_tile_async<HEAD_DIM, BLOCK_N, kThreads>(sV, V + kv_base, kv_stride, start_n, Nk);
  load_query_tile(0, i_begin * BLOCK_M, h0);
  load_stats_async(sL, i_begin * BLOCK_M, p.stat_offset(b, h0));
  cp_async_commit();

  float acc_dk[2][T::kDkvNT][4], acc_dv[2][T::kDkvNT][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int n = 0; n < T::kDkvNT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_dk[mt][n][e] = acc_dv[mt][n][e] = 0.f;

  int n_step = 0;  // the step's number over the whole group: its stage parity
  for (int gh = 0; gh < G; ++gh)
  for (int i = i_begin; i < i_end; ++i) {
    const int row0 = i * BLOCK_M, hq = h0 + gh;
    const int st = n_step++ & 1;
    const uint32_t stage = uint32_t(st * T::kTileQ);
    cp_async_wait<0>();
    __syncthreads();  // tile i visible to all; step i−1 done with the other stage, P and dS
    if (i + 1 < i_end) {
      load_query_tile(uint32_t((st ^ 1) * T::kTileQ), row0 + BLOCK_M, hq);
      load_stats_async(sL + uint32_t((st ^ 1) * T::kTileL), row0 + BLOCK_M, p.stat_offset(b, hq));
    } else if (gh + 1 < G) {  // the next query head of the group, from its first tile
      load_query_tile(uint32_t((st ^ 1) * T::kTileQ), i_begin * BLOCK_M, hq + 1);
      load_stats_async(sL + uint32_t((st ^ 1) * T::kTileL), i_begin * BLOCK_M, p.stat_offset(b, hq + 1));
    }
    cp_async_commit();

    // ---- S_ij, dP_ij: this warp's 16 rows × 16 keys; P and dS rounded once to 16 bits into SRAM.
    {
      const bool need_mask = row0 + BLOCK_M > N || start_n + BLOCK_N > Nk ||
                             (!kBand && p.causal && start_n + BLOCK_N - 1 > row0) ||
                             (kBand && (row0 + BLOCK_M - 1 + lo > start_n || start_n + BLOCK_N - 1 > row0 + hi));
      float lse[2], Di[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const uint32_t a = sL + uint32_t(st * T::kTileL) + 4 * uint32_t(16 * wr + g + 8 * r);
        asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(lse[r]) : "r"(a));
        asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(Di[r]) : "r"(a + 4 * BLOCK_M));
      }
      float s[2][4], dp[2][4];
      gemm_abt_16x16<kBf16>(s, sQ + stage, 16 * wr, sK, 16 * wc, lane);
      gemm_abt_16x16<kBf16>(dp, sdO + stage, 16 * wr, sV, 16 * wc, lane);
      // Masked entries: 2^x computed, then SELECTED to 0 (a masked 2^x may be +inf: never multiplied).
      auto write_p_ds = [&](auto masked) {
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
          for (int n = 0; n < 2; ++n) {
            float p0 = ex2(fmaf(s[n][2 * r], p.scale_log2, -lse[r]));
            float p1 = ex2(fmaf(s[n][2 * r + 1], p.scale_log2, -lse[r]));
            const int lrow = 16 * wr + g + 8 * r, lcol = 16 * wc + 8 * n + 2 * t;
            if constexpr (decltype(masked)::value) {
              const int row = row0 + lrow, key = start_n + lcol;
              const bool row_ok = row < N;
              if constexpr (kBand) {
                p0 = row_ok && key < Nk && key - row >= lo && key - row <= hi ? p0 : 0.f;
                p1 = row_ok && key + 1 < Nk && key + 1 - row >= lo && key + 1 - row <= hi ? p1 : 0.f;
              } else {
                p0 = row_ok && key < N && (!p.causal || key <= row) ? p0 : 0.f;
                p1 = row_ok && key + 1 < N && (!p.causal || key + 1 <= row) ? p1 : 0.f;
              }
            }
            const uint32_t off = swz<BLOCK_N>(lrow, lcol / 8) + 2 * (lcol % 8);
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sP + off), "r"(pack2<kBf16>(p0, p1)));
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sdS + off),
                         "r"(pack2<kBf16>(p0 * (dp[n][2 * r] - Di[r]), p1 * (dp[n][2 * r + 1] - Di[r]))));
          }
      };
      if (need_mask) write_p_ds(std::true_type{});
      else write_p_ds(std::false_type{});
    }
    __syncthreads();  // P_ij, dS_ij complete: the products below read other warps' rows and columns

    // ---- dQaccum_i += dS_ij K_j: 32 rows × columns [32·warp, +32), one 4 KiB bulk reduction.
    {
      float dq[2][T::kDqNT][4];
      warp_gemm_xb<HEAD_DIM, BLOCK_N, T::kDqNT, kBf16>(dq, sdS, 0, sK, 32 * warp, lane);
      const uint32_t sW = sDq + uint32_t(warp) * uint32_t(T::kSliceDq);
      if (lane == 0) bulk_wait_group_read<0>();  // the bulk read of the previous step is done with the slice
      __syncwarp();
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int n = 0; n < T::kDqNT; ++n)
          asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(
                           sW + uint32_t(((mt * T::kDqNT + n) * 32 + lane) * 16)),
                       "f"(dq[mt][n][0]), "f"(dq[mt][n][1]), "f"(dq[mt][n][2]), "f"(dq[mt][n][3]));
      __syncwarp();  // every lane's generic-proxy stores before lane 0's proxy fence
      if (lane == 0) {
        fence_proxy_async_shared();
        const std::size_t tile = (std::size_t(b) * p.heads + hq) * std::size_t(Tr) + std::size_t(i);
        bulk_reduce_add_f32(dQaccum + tile * (BLOCK_M * HEAD_DIM) + 1024 * warp, sW, uint32_t(T::kSliceDq));
        bulk_commit_group();
      }
    }
    // ---- dV_j += P_ijᵀ dO_i, dK_j += dS_ijᵀ Q_i: keys [32·wk, +32) × columns [64·wd, +64).
    warp_gemm_xtb<HEAD_DIM, BLOCK_M, BLOCK_N, T::kDkvNT, kBf16>(acc_dv, sP, 32 * wk, sdO + stage, 64 * wd, lane);
    warp_gemm_xtb<HEAD_DIM, BLOCK_M, BLOCK_N, T::kDkvNT, kBf16>(acc_dk, sdS, 32 * wk, sQ + stage, 64 * wd, lane);
  }
  cp_async_wait<0>();     // no copy may still be writing SRAM when the block exits
  bulk_wait_group<0>();   // nor a bulk reduction still reading it

#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
    const int key0 = start_n + 32 * wk + 16 * mt;
    store_rows16<T::kDkvNT, kBf16>(dK + kv_base + 64 * wd, kv_stride, key0, Nk, acc_dk[mt], p.scale, g, t);
    store_rows16<T::kDkvNT, kBf16>(dV + kv_base + 64 * wd, kv_stride, key0, Nk, acc_dv[mt], 1.f, g, t);
  }
}

/// The accumulator's tiled order above, for the shared convert (bwd_d256_dq.cuh): tile (b, h, i)
/// holds 32·256 floats, warp w 1024 of them; float4 number 32·(mt·4 + n) + lane of warp w's slice
/// holds rows 16·mt + g, + 8 and columns 32w + 8n + 2t, + 1.
struct D256DqLayout {
  static constexpr int BLOCK_M = D256Tiles::BLOCK_M;
  static constexpr int kHeadDim = kD256HeadDim;
  __device__ static void place(int f, int& row, int& col) {
    const int lane = f & 31, frag = (f >> 5) & 7, warp = f >> 8;
    const int mt = frag / D256Tiles::kDqNT, n = frag % D256Tiles::kDqNT, g = lane >> 2, t = lane & 3;
    row = 16 * mt + g;
    col = 32 * warp + 8 * n + 2 * t;
  }
};

template <bool kBf16>
void launch_d256(const Problem& p, const BwdPointers& a, cudaStream_t stream) {
  using T = D256Tiles;
  if (a.add_f32)
    throw_cuda_error(cudaErrorInvalidValue, "d = 256 backward: no fp32 sums", __FILE__, __LINE__);
  const bool band = p.windowed() || p.heads_kv != p.heads || p.seq_k != p.seq;
  auto kernel = band ? &fast_bwd_d256_kernel<kBf16, true> : &fast_bwd_d256_kernel<kBf16, false>;
  set_smem(reinterpret_cast<const void*>(kernel), T::kSmem, "fast_bwd_d256_kernel", p);
  begin_d256_backward<D256DqLayout, kBf16>(p, a, stream);

  announce("fast_bwd_d256_kernel");
  const unsigned tc = unsigned((p.seq_k + T::BLOCK_N - 1) / T::BLOCK_N);
  const dim3 grid = p.causal ? dim3(p.heads_kv, tc, p.batch) : dim3(tc, p.heads_kv, p.batch);
  kernel<<<grid, T::kThreads, T::kSmem, stream>>>(
      p.with_tiles(T::BLOCK_M, T::BLOCK_N), static_cast<const uint16_t*>(a.Q), static_cast<const uint16_t*>(a.K),
      static_cast<const uint16_t*>(a.V), static_cast<const uint16_t*>(a.dO), a.LSE, a.D, a.dQaccum,
      static_cast<uint16_t*>(a.dK), static_cast<uint16_t*>(a.dV));
  FLASHLAB_CUDA_CHECK_LAUNCH("fast_bwd_d256_kernel");

  launch_d256_dq_convert<D256DqLayout, kBf16>(p, a, stream);
}

}  // namespace

void launch_fast_bwd_d256(const Problem& p, bool bf16, const BwdPointers& a, cudaStream_t stream) {
  if (bf16) launch_d256<true>(p, a, stream);
  else launch_d256<false>(p, a, stream);
}

}  // namespace flashlab::cuda::detail
