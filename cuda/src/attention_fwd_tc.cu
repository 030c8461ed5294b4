// attention_fwd_tc.cu — fast FlashAttention forward on tensor cores (issue 7, first step).
//
// What it does: the same algorithm, loop order and names as attention_fa2_fwd.cu (FA2 order, one
// thread block per query tile Q_i, inner loop over key tiles K_j, V_j, online softmax in base 2,
// LSE_i = m_i + log2(l_i) saved in fp32), but with bf16 or fp16 inputs and the work done by
// `mma.sync.aligned.m16n8k16` (fp32 accumulation):
//   - Tiles (FastConfig below, chosen by measurement, cuda/FAST_NOTES.md):
//       d = 128: BLOCK_M = Br = 128, 8 warps × 16 query rows, BLOCK_N = Bc = 64, 1 block/SM;
//       d = 64:  BLOCK_M = Br = 128, 4 warps × 32 query rows (two m16 tiles share every K_j/V_j
//                fragment), BLOCK_N = Bc = 64, 2 blocks/SM.
//     Each warp owns its query rows of Q_i, S_ij, P_ij and O_i for the whole loop.
//   - Q_i: HBM → SRAM once (cp.async), then SRAM → registers once (ldmatrix) as mma A fragments.
//   - K_j, V_j: HBM → SRAM with cp.async, two stages: K_{j+1}, V_{j+1} are in flight while step j
//     computes; one __syncthreads() per step. SRAM tiles are XOR-swizzled in 16-byte chunks
//     (chunk ^ (row & 7)) so both the cp.async writes and the ldmatrix reads of 8 rows hit 8
//     different bank groups (no padding).
//   - S_ij = Q_i K_jᵀ and P_ij live in registers only (mma C fragments); P_ij is rounded to 16 bits
//     in registers and reused directly as the A fragment of O_i += P_ij V_j (V_j via ldmatrix.trans).
//   - Scores stay raw; the base-2 scale is folded into one FMA: P = 2^(S·scale·log2 e − m_i) (ex2).
//   - l_i is kept per thread (partial row sums) and reduced across the 4 threads of a row only at
//     the end; 1/l_i is applied once at the end (deferred normalisation).
//   - Causal: key tiles right of the block's last row are never loaded; inside the loop a warp
//     whose rows see none of a tile skips its math; the mask is applied only on tiles that need
//     it (diagonal tiles, and the ragged last tile where keys ≥ N get −inf). Causal blocks run the
//     longest (bottom) query tiles first.
//   - Out-of-sequence rows of Q_i, K_j, V_j are zero-filled by cp.async (src-size 0), so no stale or
//     uninitialised SRAM (a possible NaN) reaches P·V (seed 001, "the NaN hazard").
// It never produces S or P outside registers; O is written once in the input dtype, LSE in fp32.
// Instantiations: d ∈ {64, 128} × {bf16, fp16}; causal is a run-time flag (a uniform branch).
//
// How to run: flashlab::cuda::fast_attention_forward(cfg, Q, K, V) (host vectors of 16-bit bit
// patterns) or fast_attention_forward_device(...) on device pointers; `bench_cuda_attention` times
// it and cuda/bench/sdpa_bench.py sets PyTorch SDPA beside it (cuda/bench/run_fast_on_device.sh).
//
// Honest performance notes (measured, cuda/RESULTS.md): H100, bf16, H = 16: d = 64 reaches
// 326–334 TFLOP/s at N ≥ 8192 (1.07–1.09× SDPA's FlashAttention-2 backend), d = 128 309–321
// (0.86–0.92× of it; issue 7's bar is 350). cuDNN is 1.5–2× faster. This is mma.sync, not
// Hopper's wgmma/TMA; the exp2/softmax phase of a warp does not overlap its own mma phase (a
// one-step-ahead S pipeline was tried and was slower, see FAST_NOTES.md), and O is stored
// straight from registers (4-byte stores) rather than staged through SRAM.
#include "common.hpp"
#include "tensor_core.cuh"
#include "flashlab/cuda/fast_attention.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstring>
#include <stdexcept>
#include <string>

// Build-time switches for the optimisation experiments (cuda/FAST_NOTES.md); the defaults are
// the measured best. Per head dim: warps per block, m16 tiles (16 query rows each) per warp,
// BLOCK_N, Q_i fragments re-read from SRAM (1) or kept in registers (0), min blocks per SM,
// K_j/V_j pipeline stages.
#ifndef FLASHLAB_FAST_D64
#define FLASHLAB_FAST_D64 4, 2, 64, 0, 2, 2
#endif
#ifndef FLASHLAB_FAST_D128
#define FLASHLAB_FAST_D128 8, 1, 64, 0, 1, 2
#endif

namespace flashlab::cuda::detail {
namespace {

// ----------------------------------------------------------------------------- tile parameters
/// One configuration: warps, m16 tiles per warp, BLOCK_N, Q from SRAM, min blocks per SM.
template <int kWarps_, int kMT_, int kBlockN_, int kQSmem_, int kMinBlocks_, int kStages_>
struct FastConfig {
  static constexpr int kWarps = kWarps_;
  static constexpr int kMT = kMT_;  // m16 tiles per warp: 16·kMT query rows per warp
  static constexpr int BLOCK_N = kBlockN_;
  // Keep Q_i's mma fragments in registers for the whole loop (true), or re-read them from SRAM
  // with ldmatrix at every k-step (false: fewer registers).
  static constexpr bool kQInRegs = kQSmem_ == 0;
  static constexpr int kMinBlocks = kMinBlocks_;
  // K_j/V_j buffers in SRAM (tile j + kStages − 1 is in flight while tile j computes).
  static constexpr int kStages = kStages_;
  static_assert(kStages >= 2, "at least double buffering");
};
template <int HEAD_DIM>
struct FastTraitsBase;
template <>
struct FastTraitsBase<64> : FastConfig<FLASHLAB_FAST_D64> {};
template <>
struct FastTraitsBase<128> : FastConfig<FLASHLAB_FAST_D128> {};

template <int HEAD_DIM>
struct FastTraits : FastTraitsBase<HEAD_DIM> {
  using C = FastTraitsBase<HEAD_DIM>;
  static constexpr int kThreads = 32 * C::kWarps;
  static constexpr int BLOCK_M = 16 * C::kMT * C::kWarps;  // Br
  using C::kStages;
  static constexpr int kChunks = HEAD_DIM / 8;  // 16-byte chunks per row
  static constexpr int kTileQBytes = BLOCK_M * HEAD_DIM * 2;
  static constexpr int kTileKVBytes = C::BLOCK_N * HEAD_DIM * 2;
  static constexpr int kSmemBytes = kTileQBytes + 2 * kStages * kTileKVBytes;
};

// ----------------------------------------------------------------------------- PTX helpers
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

/// Issue cp.async for rows [row0, row0 + ROWS) of one head (rows ≥ N are zero-filled).
template <int HEAD_DIM, int ROWS>
__device__ __forceinline__ void load_tile_async(uint32_t smem, const uint16_t* head, std::size_t stride, int row0,
                                                int N) {
  using T = FastTraits<HEAD_DIM>;
  constexpr int kPerThread = ROWS * T::kChunks / T::kThreads;
  static_assert(ROWS * T::kChunks % T::kThreads == 0, "tile chunks must divide among the threads");
#pragma unroll
  for (int it = 0; it < kPerThread; ++it) {
    const int idx = threadIdx.x + it * T::kThreads;
    const int r = idx / T::kChunks, c = idx % T::kChunks;
    const int row = row0 + r;
    const bool ok = row < N;
    const uint16_t* src = head + std::size_t(ok ? row : 0) * stride + c * 8;
    cp_async16(smem + swz<HEAD_DIM>(r, c), src, ok);
  }
}

// ----------------------------------------------------------------------------- the kernel
/// Grid (Tr, H, B), FastTraits::kThreads threads, FastTraits::kSmemBytes of dynamic SRAM:
/// [Q_i: BLOCK_M × d][K_j: kStages × BLOCK_N × d][V_j: kStages × BLOCK_N × d], all swizzled.
template <int HEAD_DIM, bool kBf16>
__global__ void __launch_bounds__(FastTraits<HEAD_DIM>::kThreads, FastTraits<HEAD_DIM>::kMinBlocks)
    fast_fwd_kernel(Problem p, const uint16_t* __restrict__ Q, const uint16_t* __restrict__ K,
                    const uint16_t* __restrict__ V, uint16_t* __restrict__ O, float* __restrict__ LSE) {
  using T = FastTraits<HEAD_DIM>;
  constexpr int BLOCK_M = T::BLOCK_M, BLOCK_N = T::BLOCK_N, kMT = T::kMT;
  constexpr int kKStepsQK = HEAD_DIM / 16;  // k-steps of S = Q Kᵀ (over d)
  constexpr int kNTilesS = BLOCK_N / 8;     // n8 tiles of S_ij per m16 tile
  constexpr int kKStepsPV = BLOCK_N / 16;   // k-steps of O += P V (over keys)
  constexpr int kNTilesO = HEAD_DIM / 8;    // n8 tiles of O_i per m16 tile
  const float NEG_INF = __int_as_float(0xff800000);  // −inf

  const int N = p.seq;
  // Causal: the bottom query tiles see the most keys; launch them first (better tail balance).
  const int i = p.causal ? int(gridDim.x) - 1 - int(blockIdx.x) : int(blockIdx.x);
  const int h = blockIdx.y, b = blockIdx.z;
  const int row0 = i * BLOCK_M;
  const std::size_t stride = p.row_stride();
  const std::size_t base = p.head_offset(b, h);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, t = lane & 3;         // mma fragment coordinates: row group, thread in group
  const int warp_m0 = 16 * kMT * warp;           // this warp's first row inside Q_i
  const int warp_row0 = row0 + warp_m0;          // ... and in the sequence

  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t sQ = uint32_t(__cvta_generic_to_shared(smem_raw));
  const uint32_t sK = sQ + T::kTileQBytes;                // + stage · kTileKVBytes
  const uint32_t sV = sK + T::kStages * T::kTileKVBytes;  // + stage · kTileKVBytes

  // Causal: key tiles starting past this tile's last query row are entirely masked — skip them.
  const int n_end = p.causal ? min(N, row0 + BLOCK_M) : N;
  const int Tc = (n_end + BLOCK_N - 1) / BLOCK_N;

  // Load Q_i, K_0, V_0: HBM → SRAM (one cp.async group), then K_s, V_s for the first stages
  // (one group each; an empty group where there is no tile, so the group count stays uniform).
  load_tile_async<HEAD_DIM, BLOCK_M>(sQ, Q + base, stride, row0, N);
  load_tile_async<HEAD_DIM, BLOCK_N>(sK, K + base, stride, 0, N);
  load_tile_async<HEAD_DIM, BLOCK_N>(sV, V + base, stride, 0, N);
  cp_async_commit();
#pragma unroll
  for (int st = 1; st < T::kStages - 1; ++st) {
    if (st < Tc) {
      load_tile_async<HEAD_DIM, BLOCK_N>(sK + st * T::kTileKVBytes, K + base, stride, st * BLOCK_N, N);
      load_tile_async<HEAD_DIM, BLOCK_N>(sV + st * T::kTileKVBytes, V + base, stride, st * BLOCK_N, N);
    }
    cp_async_commit();
  }

  // acc = 0 (unnormalised O_i), m_i = −inf, l_i = 0; per m16 tile, rows g and g + 8.
  float acc[kMT][kNTilesO][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int n = 0; n < kNTilesO; ++n) acc[mt][n][0] = acc[mt][n][1] = acc[mt][n][2] = acc[mt][n][3] = 0.f;
  float m_i[kMT][2], l_i[kMT][2];  // l_i: per-thread partial row sums (reduced over the quad at the end)
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) m_i[mt][0] = m_i[mt][1] = NEG_INF, l_i[mt][0] = l_i[mt][1] = 0.f;
  uint32_t q_frag[T::kQInRegs ? kMT : 1][T::kQInRegs ? kKStepsQK : 1][4];

  for (int j = 0; j < Tc; ++j) {
    const int start_n = j * BLOCK_N;
    const uint32_t stage_off = uint32_t((j % T::kStages) * T::kTileKVBytes);
    // kStages − 1 + j groups are committed; the (j+1)-th holds K_j, V_j: wait for it.
    cp_async_wait<T::kStages - 2>();
    // Every thread's cp.async of K_j, V_j (and Q_i) is now visible to all warps, and every warp
    // has finished step j − 1, so the stage it read may be refilled below.
    __syncthreads();
    // Load K_{j+S-1}, V_{j+S-1}: HBM → SRAM into the stage step j − 1 used, while step j computes.
    {
      const int jn = j + T::kStages - 1;
      if (jn < Tc) {
        const uint32_t next = uint32_t((jn % T::kStages) * T::kTileKVBytes);
        load_tile_async<HEAD_DIM, BLOCK_N>(sK + next, K + base, stride, jn * BLOCK_N, N);
        load_tile_async<HEAD_DIM, BLOCK_N>(sV + next, V + base, stride, jn * BLOCK_N, N);
      }
      cp_async_commit();
    }

    if constexpr (T::kQInRegs) {
      if (j == 0) {
        // Q_i: SRAM → registers once, as mma A fragments (16 rows × 16 cols per k-step).
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int kk = 0; kk < kKStepsQK; ++kk)
            ldsm_x4(sQ + swz<HEAD_DIM>(warp_m0 + 16 * mt + (lane & 15), 2 * kk + (lane >> 4)), q_frag[mt][kk][0],
                    q_frag[mt][kk][1], q_frag[mt][kk][2], q_frag[mt][kk][3]);
      }
    }

    // A warp whose rows are all left of this key tile (causal) has nothing to add.
    const bool warp_active = !p.causal || start_n <= warp_row0 + 16 * kMT - 1;
    if (warp_active) {
      // S_ij = Q_i K_jᵀ (raw scores, fp32, registers). B fragments of K_j via ldmatrix (non-trans),
      // each used by all kMT m16 tiles of the warp.
      float s[kMT][kNTilesS][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int n = 0; n < kNTilesS; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < kKStepsQK; ++kk) {
        uint32_t qa[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          if constexpr (T::kQInRegs) {
#pragma unroll
            for (int e = 0; e < 4; ++e) qa[mt][e] = q_frag[mt][kk][e];
          } else {  // Q_i fragment of this k-step: SRAM → registers
            ldsm_x4(sQ + swz<HEAD_DIM>(warp_m0 + 16 * mt + (lane & 15), 2 * kk + (lane >> 4)), qa[mt][0],
                    qa[mt][1], qa[mt][2], qa[mt][3]);
          }
        }
#pragma unroll
        for (int np = 0; np < kNTilesS / 2; ++np) {
          const int mi = lane >> 3;
          const int key = 16 * np + (lane & 7) + ((mi >> 1) << 3);
          uint32_t b0, b1, b2, b3;
          ldsm_x4(sK + stage_off + swz<HEAD_DIM>(key, 2 * kk + (mi & 1)), b0, b1, b2, b3);
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            mma16816<kBf16>(s[mt][2 * np], qa[mt], b0, b1);
            mma16816<kBf16>(s[mt][2 * np + 1], qa[mt], b2, b3);
          }
        }
      }

      // Mask (seed 001, "Out-of-Sequence Masking"): keys ≥ N, and causal keys > query row → −inf,
      // so 2^(−inf) = 0 adds nothing to l_i or acc. Only tiles that straddle N or the diagonal.
      const bool need_mask = start_n + BLOCK_N > N || (p.causal && start_n + BLOCK_N - 1 > warp_row0);
      if (need_mask) {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int n = 0; n < kNTilesS; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int col = start_n + 8 * n + 2 * t + (e & 1);
              const int row = warp_row0 + 16 * mt + g + 8 * (e >> 1);
              if (col >= N || (p.causal && col > row)) s[mt][n][e] = NEG_INF;
            }
      }

      // Online softmax (seed 001, base 2), rows r = g and g + 8 of each m16 tile:
      //   m_ij = max(m_i, rowmax(S_ij)·scale·log2 e); P_ij = 2^(S_ij·scale·log2 e − m_ij);
      //   alpha = 2^(m_i − m_ij); l_i = l_i·alpha + rowsum(P_ij); acc = diag(alpha)·acc.
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float raw_max = NEG_INF;
#pragma unroll
          for (int n = 0; n < kNTilesS; ++n) raw_max = fmaxf(raw_max, fmaxf(s[mt][n][2 * r], s[mt][n][2 * r + 1]));
          // The 4 threads of a quad hold one row between them.
          raw_max = fmaxf(raw_max, __shfl_xor_sync(0xffffffffu, raw_max, 1));
          raw_max = fmaxf(raw_max, __shfl_xor_sync(0xffffffffu, raw_max, 2));
          const float m_ij = fmaxf(m_i[mt][r], raw_max * p.scale_log2);
          // A row that has seen only masked scores keeps m = −inf; subtracting 0 instead keeps
          // 2^(−inf − m) = 0 rather than 2^(−inf + inf) = NaN.
          const float m_ref = m_ij == NEG_INF ? 0.f : m_ij;
          const float alpha = ex2(m_i[mt][r] - m_ref);
          m_i[mt][r] = m_ij;
          float row_sum = 0.f;
#pragma unroll
          for (int n = 0; n < kNTilesS; ++n) {
            s[mt][n][2 * r] = ex2(fmaf(s[mt][n][2 * r], p.scale_log2, -m_ref));
            s[mt][n][2 * r + 1] = ex2(fmaf(s[mt][n][2 * r + 1], p.scale_log2, -m_ref));
            row_sum += s[mt][n][2 * r] + s[mt][n][2 * r + 1];
          }
          l_i[mt][r] = l_i[mt][r] * alpha + row_sum;
#pragma unroll
          for (int n = 0; n < kNTilesO; ++n) {
            acc[mt][n][2 * r] *= alpha;
            acc[mt][n][2 * r + 1] *= alpha;
          }
        }

      // acc += P_ij V_j: P_ij rounded to 16 bits in registers is the A fragment (C layout of two
      // n8 tiles = A layout of one k16 step); V_j B fragments via ldmatrix.trans, each used by
      // all kMT m16 tiles.
#pragma unroll
      for (int kk = 0; kk < kKStepsPV; ++kk) {
        uint32_t a[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          a[mt][0] = pack2<kBf16>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
          a[mt][1] = pack2<kBf16>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
          a[mt][2] = pack2<kBf16>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
          a[mt][3] = pack2<kBf16>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
        }
#pragma unroll
        for (int np = 0; np < kNTilesO / 2; ++np) {
          const int mi = lane >> 3;
          const int key = 16 * kk + (lane & 7) + ((mi & 1) << 3);
          uint32_t b0, b1, b2, b3;
          ldsm_x4_trans(sV + stage_off + swz<HEAD_DIM>(key, 2 * np + (mi >> 1)), b0, b1, b2, b3);
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            mma16816<kBf16>(acc[mt][2 * np], a[mt], b0, b1);
            mma16816<kBf16>(acc[mt][2 * np + 1], a[mt], b2, b3);
          }
        }
      }
    }
  }
  cp_async_wait<0>();  // no copy may still be writing SRAM when the block exits (empty groups)

  // O_i = acc / l_i: registers → HBM (input dtype). LSE_i = m_i + log2(l_i): registers → HBM.
  const std::size_t stat = p.stat_offset(b, h);
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = l_i[mt][r];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const float inv_l = l > 0.f ? 1.f / l : 0.f;
      const int row = warp_row0 + 16 * mt + g + 8 * r;
      if (row < N) {
        uint16_t* out = O + base + std::size_t(row) * stride + 2 * t;
#pragma unroll
        for (int n = 0; n < kNTilesO; ++n)
          *reinterpret_cast<uint32_t*>(out + 8 * n) =
              pack2<kBf16>(acc[mt][n][2 * r] * inv_l, acc[mt][n][2 * r + 1] * inv_l);
        if (t == 0) LSE[stat + row] = l > 0.f ? m_i[mt][r] + log2f(l) : NEG_INF;
      }
    }
}

template <int HEAD_DIM, bool kBf16>
void launch_fast(const Problem& p, const void* Q, const void* K, const void* V, void* O, float* LSE,
                 cudaStream_t stream) {
  using T = FastTraits<HEAD_DIM>;
  auto kernel = &fast_fwd_kernel<HEAD_DIM, kBf16>;
  // Opt in to > 48 KiB of dynamic SRAM once per instantiation (thread-safe static init).
  static const bool opted_in = [&] {
    set_smem(reinterpret_cast<const void*>(kernel), T::kSmemBytes, "fast_fwd_kernel", p);
    return true;
  }();
  (void)opted_in;
  const dim3 grid((p.seq + T::BLOCK_M - 1) / T::BLOCK_M, p.heads, p.batch);
  announce("fast_fwd_kernel");
  kernel<<<grid, T::kThreads, T::kSmemBytes, stream>>>(p, static_cast<const uint16_t*>(Q),
                                                       static_cast<const uint16_t*>(K),
                                                       static_cast<const uint16_t*>(V), static_cast<uint16_t*>(O), LSE);
  FLASHLAB_CUDA_CHECK_LAUNCH("fast_fwd_kernel");
}

Problem fast_problem(const FastForwardConfig& cfg) {
  const FastTiles tiles = fast_forward_tiles(cfg.head_dim);  // throws for d ∉ {64, 128}
  Options opt;  // make_problem validates the clear kernels' tiles (≤ 128): pass legal ones, set ours after
  opt.block_m = 64;
  opt.block_n = 64;
  opt.causal = cfg.causal;
  opt.scale = cfg.scale;
  Problem p = make_problem(cfg.batch, cfg.seq, cfg.heads, cfg.head_dim, opt);
  p.block_m = tiles.block_m;
  p.block_n = tiles.block_n;
  return p;
}

}  // namespace
}  // namespace flashlab::cuda::detail

namespace flashlab::cuda {

FastTiles fast_forward_tiles(int head_dim) {
  if (head_dim == 64) return {detail::FastTraits<64>::BLOCK_M, detail::FastTraits<64>::BLOCK_N};
  if (head_dim == 128) return {detail::FastTraits<128>::BLOCK_M, detail::FastTraits<128>::BLOCK_N};
  throw std::invalid_argument("flashlab::cuda: fast forward HEAD_DIM = " + std::to_string(head_dim) +
                              " is not supported (hint: 64 or 128; the clear fa2 kernel takes any d)");
}

void fast_attention_forward_device(const FastForwardConfig& cfg, const void* Q, const void* K, const void* V,
                                   void* O, float* LSE, void* stream) {
  const detail::Problem p = detail::fast_problem(cfg);
  const auto s = static_cast<cudaStream_t>(stream);
  const bool bf16 = cfg.dtype == FastDtype::bf16;
  if (cfg.head_dim == 64) {
    if (bf16) detail::launch_fast<64, true>(p, Q, K, V, O, LSE, s);
    else detail::launch_fast<64, false>(p, Q, K, V, O, LSE, s);
  } else {
    if (bf16) detail::launch_fast<128, true>(p, Q, K, V, O, LSE, s);
    else detail::launch_fast<128, false>(p, Q, K, V, O, LSE, s);
  }
}

FastForwardResult fast_attention_forward(const FastForwardConfig& cfg, const std::vector<std::uint16_t>& Q,
                                         const std::vector<std::uint16_t>& K,
                                         const std::vector<std::uint16_t>& V) {
  const detail::Problem p = detail::fast_problem(cfg);
  const std::size_t numel = std::size_t(p.batch) * p.seq * p.heads * p.head_dim;
  const std::size_t stats = std::size_t(p.batch) * p.heads * p.seq;
  auto check = [&](const char* name, const std::vector<std::uint16_t>& x) {
    if (x.size() != numel)
      throw std::invalid_argument(std::string("flashlab::cuda: ") + name + " has " + std::to_string(x.size()) +
                                  " elements, expected B·N·H·d = " + std::to_string(numel) +
                                  " (hint: Q, K, V are [B, N, H, d])");
  };
  check("Q", Q);
  check("K", K);
  check("V", V);
  detail::DeviceBuffer<std::uint16_t> dQ(numel), dK(numel), dV(numel), dO(numel);
  detail::DeviceBuffer<float> dLSE(stats);
  dQ.upload(Q.data());
  dK.upload(K.data());
  dV.upload(V.data());
  dO.poison();  // 0xFFFF is a NaN in bf16 and fp16 alike
  dLSE.poison();
  fast_attention_forward_device(cfg, dQ.get(), dK.get(), dV.get(), dO.get(), dLSE.get(), nullptr);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  FastForwardResult r;
  r.O.resize(numel);
  r.LSE.resize(stats);
  dO.download(r.O.data());
  dLSE.download(r.LSE.data());
  return r;
}

std::uint16_t float_to_bf16(float x) {
  const __nv_bfloat16_raw raw = __float2bfloat16_rn(x);
  return raw.x;
}
float bf16_to_float(std::uint16_t bits) {
  __nv_bfloat16_raw raw;
  raw.x = bits;
  return __bfloat162float(__nv_bfloat16(raw));
}
std::uint16_t float_to_fp16(float x) {
  const __half_raw raw = __float2half_rn(x);
  return raw.x;
}
float fp16_to_float(std::uint16_t bits) {
  __half_raw raw;
  raw.x = bits;
  return __half2float(__half(raw));
}

}  // namespace flashlab::cuda
