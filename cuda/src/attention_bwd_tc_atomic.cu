// attention_bwd_tc_atomic.cu — fast FlashAttention backward on tensor cores, ATOMIC design (issue 7).
//
// What it does: the algorithm, loop order and names of the clear fp32 atomic backward
// (attention_bwd_atomic.cu; seed 001 "Backward Pass", and "Architecture Design: Triton vs. CUDA":
// FlashAttention-2's own CUDA backward), with bf16 or fp16 inputs and every matrix product on
// `mma.sync.aligned.m16n8k16` (fp32 accumulation), as in attention_bwd_tc.cu:
//   0. cudaMemsetAsync                 dQaccum = 0 (fp32, tiled layout below, caller's workspace)
//   1. fast_bwd_preprocess_kernel      D_i = rowsum(dO_i ∘ O_i) in fp32 (attention_bwd_tc.cuh)
//   2. fast_bwd_atomic_kernel          one block per K_j, V_j (resident in SRAM), loop over Q_i, dO_i:
//        S_ij  = Q_i K_jᵀ,  P_ij = 2^(S_ij · scale·log2 e − LSE_i)   (masked → P = 0, selected)
//        dP_ij = dO_i V_jᵀ, dS_ij = P_ij ∘ (dP_ij − D_i)
//        dQaccum_i += dS_ij K_j        (fp32, one bulk asynchronous reduction SRAM → L2 per warp)
//        dV_j += P_ijᵀ dO_i,  dK_j += dS_ijᵀ Q_i          (registers, the whole loop)
//   3. fast_bwd_dq_convert_tiled_kernel  dQ = scale · dQaccum → 16 bits, [B, N, H, d]
// S and dP are computed once per (i, j) pair: 10·N²·d FLOPs of products (the two-kernel design
// recomputes S and dP in both kernels: 14·N²·d).
//
// Tiles: BLOCK_N = Bc = 128 resident keys; BLOCK_M = Br = 64 streamed query rows at d = 128, 128
// at d = 64 (twice the work per barrier; +8 % measured); 8 warps; three warp layouts per step
// (kWM = BLOCK_M/32 warps along the query rows, kWN = 8/kWM across):
//   S, dP (BLOCK_M × 128):       kWM (rows) × kWN (keys) warps, each 32 rows × 128/kWN keys
//                                (d = 128: 2 × 4, 32 × 32; d = 64: 4 × 2, 32 × 64);
//   dQ_i partial (BLOCK_M × d):  kWM (rows) × kWN (d) warps, each 32 rows × d/kWN = 32, A = dS
//                                (ldmatrix), B = K_j (ldmatrix.trans);
//   dV_j, dK_j (128 × d):        4 (keys) × 2 (d) warps, each 32 keys × d/2 of BOTH accumulators,
//                                A = Pᵀ / dSᵀ from SRAM (ldmatrix.trans), B = dO_i / Q_i (ldmatrix.trans).
// Every warp holds two m16 tiles in each product, so every B fragment read from SRAM feeds two mma.
// SRAM (swizzled in 16-byte chunks like the other fast kernels): K_j, V_j, 2 stages of Q_i and
// dO_i (cp.async, tile i+1 in flight while tile i computes), P_ij and dS_ij in 16 bits, 2 stages of
// LSE_i and D_i (fp32, 4-byte cp.async with the tiles, so their latency is off the critical path),
// and 8 warp slices of 4 KiB for the dQ partials: 193 KiB at d = 128, 194 KiB at d = 64; one
// block (8 warps) per SM. Two __syncthreads() per step: at the top (tile i landed; every warp
// finished step i−1, so its stage, P and dS may be overwritten) and after P/dS are written (the
// products read other warps' rows and columns).
// dQ reductions (the costly part: ~28 % of the time as red.global from the warps, measured in
// session 2): dQaccum is this design's own scratch, so its layout is chosen for the reduction.
// It is TILED: per (b, h, query tile i) BLOCK_M·d contiguous floats, inside them warp w's
// 32 × 32 partial as 4 KiB in mma C-fragment order (float4 number 32·(mt·4 + n) + lane =
// dq[mt][n][0..3]). Every key block j adds its partial of tile i in that same order. Per step a
// warp (a) waits until its previous bulk reduction has finished READING its slice
// (cp.async.bulk.wait_group.read, a whole step later: never a real wait), (b) writes its partial
// to the slice with 8 conflict-free float4 stores, (c) warp barrier, lane 0 fences the async
// proxy (fence.proxy.async.shared::cta: the generic-proxy stores before the bulk read) and issues
// ONE `cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32` of 4 KiB. The bulk-copy unit
// performs the adds in L2; the warp's load/store path carries none of them, and the dQ product
// comes FIRST in the step (before dK/dV), so the reduction runs under the dK/dV products. After
// the kernel, fast_bwd_dq_convert_tiled_kernel maps the tiles back to [B, N, H, d] and rounds.
// The workspace holds whole tiles: N rounded up to 128 rows (the last tile's padding rows get
// partials of exactly 0: their P, hence dS, is masked to 0).
// Causal grid (H, Tc, B): heaviest blocks (small j) start first across all heads; non-causal
// (Tc, H, B): the blocks of one head run together and share Q_i, dO_i, dQaccum tiles in L2.
// Masks: keys ≥ N, query rows ≥ N and, causal, key > query → P = 0 (selected, never 2^(−inf)·x,
// so no Inf·0 → NaN). Out-of-sequence rows are zero-filled by cp.async (src-size 0). Causal: query
// tiles that end before this block's first key are never loaded (the loop starts at i_begin).
// Numerics: P and dS are rounded to 16 bits once (when written to SRAM) and that rounded value
// feeds dV, dK and dQ; dQ's sum over key blocks is fp32 in an order that varies run to run (not
// bit-reproducible), then rounded once.
//
// How to run: flashlab::cuda::fast_attention_backward(cfg, ...) with cfg.design =
// FastBackwardDesign::atomic (the default; the host vectors API), fast_attention_backward_device(...)
// with a workspace of fast_attention_backward_workspace_bytes(cfg) bytes, or
// `flashlab bench attention --pass bwd --bwd-design atomic`. Tests: tests/cuda/test_cuda_fast_bwd.cpp.
//
// Registers (ptxas, sm_90, kept configuration 12293, bf16 and fp16 alike): 255 with 24 bytes of
// spill at d = 128, 255 without spills at d = 64; 1 block of 8 warps per SM (registers and SRAM
// both allow one).
// Measured (2026-11-22 13:36 UTC, session 2 round 2 run 2, NVIDIA H100 80GB HBM3, `flashlab_exp
// bench attention --pass bwd --seq 8192 --reps 20`: median of 20, L2 flushed, 3 input sets, O/LSE
// of a real forward; bf16, B = 1, H = 16, N = 8192; TFLOP/s = 2.5·4·N²·d·H / time, halved for
// causal), previous kept configuration (513: red.v4 from the warps, dQ last) in the same run:
//   d = 128 non-causal 4.801 ms = 286.3 TFLOP/s (513: 264.3, +8.3 %; SDPA FA2 296.3–301.1)
//   d = 128 causal     2.440 ms = 281.6        (513: 264.2, +6.6 %; FA2 244.2–259.6)
// d = 64 with 12293 and the final side-by-side table (SDPA FA2 and cuDNN, same run): run 3 in
// cuda/results/bwd_atomic_session2.md, "Round 2". Issue 7's bar (≥ 315 TFLOP/s and ≥ FA2,
// d = 128 non-causal) is still NOT met.
// Where the time goes (d = 128 non-causal): the same kernel without the bulk reductions (12421,
// 4225: diagnostics, wrong dQ) shows what the reductions still cost; with the reductions done by
// red.global from the warps (513) they cost ~28 % (368 TFLOP/s without them). ncu (session 2,
// VARIANT 1, red.v2 from registers; at its locked 1.45 GHz): tensor pipe 40.6 % of peak,
// L1/shared 66.5 %, issue slots 26.8 % busy, 2 warps per scheduler.
// Tuning steps, predicted vs measured: cuda/results/bwd_atomic_session2.md.
#include "attention_bwd_tc.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace flashlab::cuda::detail {
namespace {

// ----------------------------------------------------------------------------- tile parameters
/// Tiles of the main kernel for head dim HEAD_DIM and BM = BLOCK_M streamed query rows (64 or 128).
template <int HEAD_DIM, int BM>
struct AtomicTraits {
  static constexpr int kWarps = 8;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int BLOCK_M = BM;   // Br: streamed query rows per step
  static constexpr int BLOCK_N = 128;  // Bc: resident keys per block
  static constexpr int kRowBytes = HEAD_DIM * 2;
  static constexpr int kTileQ = BLOCK_M * kRowBytes;    // one stage of Q_i (or dO_i)
  static constexpr int kTileK = BLOCK_N * kRowBytes;    // K_j (or V_j)
  static constexpr int kTileP = BLOCK_M * BLOCK_N * 2;  // P_ij (or dS_ij), 16-bit, [BLOCK_M][BLOCK_N]
  static constexpr int kTileL = 2 * BLOCK_M * 4;        // one stage of LSE_i and D_i (fp32)
  static constexpr int kSmem = 2 * kTileK + 2 * 2 * kTileQ + 2 * kTileP + 2 * kTileL;
  static constexpr int kSmemDq = kWarps * 32 * 32 * 4;  // VARIANT bit 512: dQ partial staging
  // VARIANT bit 2048: each warp's 32 × 32 fp32 dQ partial as 32 rows of 128 contiguous bytes (one
  // bulk reduction each), row stride 160 B: the fragment stores of rows g = 0..3 fall in four
  // different 32-byte bank groups, so each float2 store takes the minimum 2 wavefronts.
  static constexpr int kDqBulkRow = 160;
  static constexpr int kSmemDqBulk = kWarps * 32 * kDqBulkRow;
  // Warp layouts. S/dP and dQ: kWM warps along the query rows (32 rows each) × kWN across
  // (keys for S/dP, d for dQ). dK/dV: 4 warps along the keys (32 each) × 2 along d.
  static constexpr int kWM = BLOCK_M / 32;
  static constexpr int kWN = kWarps / kWM;
  static constexpr int kSNT = BLOCK_N / kWN / 8;        // n8 tiles of keys per warp in S/dP
  static constexpr int kDkvNT = HEAD_DIM / 2 / 8;       // n8 tiles of d per warp in dK/dV (d/2 columns)
  static constexpr int kDqCols = HEAD_DIM / kWN;        // d columns per warp in dQ
  static constexpr int kDqNT = kDqCols / 8;
  static_assert(kWM * kWN == kWarps && kSNT % 2 == 0, "S/dP warp tile");
  static_assert(kDqNT % 2 == 0, "dQ warp tile must be a whole number of ldmatrix.x4.trans loads");
};

// ----------------------------------------------------------------------------- warp-level products
// Each product runs K k-steps; a k-step loads two A fragments (two m16 tiles: 2 ldmatrix.x4) and
// NP B fragment pairs (NP ldmatrix.x4, two n8 tiles each), then issues 4·NP mma. kPf (VARIANT bit
// 64): the fragments of k-step kk+1 are loaded before the mma of k-step kk (two register
// buffers), so ldmatrix latency overlaps the tensor cores instead of preceding them.
template <int NP>
struct Frags {
  uint32_t a[2][4];
  uint32_t b[NP][4];
};

template <int K, int NP, bool kPf, bool kBf16, int NT, class Load>
__device__ __forceinline__ void run_ksteps(float (&c)[2][NT][4], const Load& load) {
  static_assert(NT == 2 * NP, "two n8 tiles per B ldmatrix.x4");
  auto compute = [&](const Frags<NP>& f) {
#pragma unroll
    for (int np = 0; np < NP; ++np)
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        mma16816<kBf16>(c[mt][2 * np], f.a[mt], f.b[np][0], f.b[np][1]);
        mma16816<kBf16>(c[mt][2 * np + 1], f.a[mt], f.b[np][2], f.b[np][3]);
      }
  };
  if constexpr (kPf) {
    Frags<NP> f[2];
    load(0, f[0]);
#pragma unroll
    for (int kk = 0; kk < K; ++kk) {
      if (kk + 1 < K) load(kk + 1, f[(kk + 1) & 1]);
      compute(f[kk & 1]);
    }
  } else {
#pragma unroll
    for (int kk = 0; kk < K; ++kk) {
      Frags<NP> f;
      load(kk, f);
      compute(f);
    }
  }
}

/// c (32 × 8·NT, two m16 tiles × NT n8 tiles, fp32) = A Bᵀ over k = HEAD_DIM, A = rows
/// [a_row0, a_row0 + 32) of SRAM tile sA, B = rows [b_row0, b_row0 + 8·NT) of SRAM tile sB (both
/// [rows][HEAD_DIM], n-major). S = Q_i K_jᵀ and dP = dO_i V_jᵀ.
template <int HEAD_DIM, int NT, bool kBf16, bool kPf>
__device__ __forceinline__ void warp_gemm_abt(float (&c)[2][NT][4], uint32_t sA, int a_row0, uint32_t sB,
                                              int b_row0, int lane) {
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int n = 0; n < NT; ++n) c[mt][n][0] = c[mt][n][1] = c[mt][n][2] = c[mt][n][3] = 0.f;
  const int mi = lane >> 3;
  run_ksteps<HEAD_DIM / 16, NT / 2, kPf, kBf16>(c, [&](int kk, Frags<NT / 2>& f) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
      ldsm_x4(sA + swz<HEAD_DIM>(a_row0 + 16 * mt + (lane & 15), 2 * kk + (lane >> 4)), f.a[mt][0], f.a[mt][1],
              f.a[mt][2], f.a[mt][3]);
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      const int row = b_row0 + 16 * np + (lane & 7) + ((mi >> 1) << 3);
      ldsm_x4(sB + swz<HEAD_DIM>(row, 2 * kk + (mi & 1)), f.b[np][0], f.b[np][1], f.b[np][2], f.b[np][3]);
    }
  });
}

/// acc (32 keys × 8·NT columns, fp32) += Xᵀ B over k = BLOCK_M query rows: X = the 16-bit SRAM
/// tile sX ([BLOCK_M][BLOCK_N], P_ij or dS_ij), its columns [key0, key0 + 32) read transposed
/// (ldmatrix.trans gives the A fragments of Xᵀ: m = keys, k = queries); B = SRAM tile sB
/// ([BLOCK_M][HEAD_DIM], k-major, dO_i or Q_i) columns [col0, col0 + 8·NT) via ldmatrix.trans.
/// dV_j += P_ijᵀ dO_i, dK_j += dS_ijᵀ Q_i.
template <int HEAD_DIM, int BLOCK_M, int BLOCK_N, int NT, bool kBf16, bool kPf>
__device__ __forceinline__ void warp_gemm_xtb(float (&acc)[2][NT][4], uint32_t sX, int key0, uint32_t sB, int col0,
                                              int lane) {
  const int mi = lane >> 3;
  run_ksteps<BLOCK_M / 16, NT / 2, kPf, kBf16>(acc, [&](int kk, Frags<NT / 2>& f) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
      ldsm_x4_trans(sX + swz<BLOCK_N>(16 * kk + (lane & 7) + ((mi >> 1) << 3), (key0 + 16 * mt) / 8 + (mi & 1)),
                    f.a[mt][0], f.a[mt][1], f.a[mt][2], f.a[mt][3]);
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      const int row = 16 * kk + (lane & 7) + ((mi & 1) << 3);
      ldsm_x4_trans(sB + swz<HEAD_DIM>(row, col0 / 8 + 2 * np + (mi >> 1)), f.b[np][0], f.b[np][1], f.b[np][2],
                    f.b[np][3]);
    }
  });
}

/// c (32 query rows × 8·NT columns, fp32) = X B over k = BLOCK_N keys: X = rows [row0, row0 + 32)
/// of the 16-bit SRAM tile sX ([BLOCK_M][BLOCK_N], dS_ij), B = SRAM tile sB ([BLOCK_N][HEAD_DIM],
/// k-major, K_j) columns [col0, col0 + 8·NT) via ldmatrix.trans. dQ_i partial = dS_ij K_j.
template <int HEAD_DIM, int BLOCK_N, int NT, bool kBf16, bool kPf>
__device__ __forceinline__ void warp_gemm_xb(float (&c)[2][NT][4], uint32_t sX, int row0, uint32_t sB, int col0,
                                             int lane) {
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int n = 0; n < NT; ++n) c[mt][n][0] = c[mt][n][1] = c[mt][n][2] = c[mt][n][3] = 0.f;
  const int mi = lane >> 3;
  run_ksteps<BLOCK_N / 16, NT / 2, kPf, kBf16>(c, [&](int kk, Frags<NT / 2>& f) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
      ldsm_x4(sX + swz<BLOCK_N>(row0 + 16 * mt + (lane & 15), 2 * kk + (lane >> 4)), f.a[mt][0], f.a[mt][1],
              f.a[mt][2], f.a[mt][3]);
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      const int row = 16 * kk + (lane & 7) + ((mi & 1) << 3);
      ldsm_x4_trans(sB + swz<HEAD_DIM>(row, col0 / 8 + 2 * np + (mi >> 1)), f.b[np][0], f.b[np][1], f.b[np][2],
                    f.b[np][3]);
    }
  });
}

// ----------------------------------------------------------------------------- 2. main kernel
/// Grid (Tc = ceil(N / BLOCK_N), H, B), 256 threads, kSmem bytes of dynamic SRAM:
/// [K_j][V_j][Q_i: 2 stages][dO_i: 2 stages][P_ij][dS_ij][LSE_i, D_i: 2 stages], 16-bit tiles swizzled.
/// VARIANT bits (tuning experiments; the launcher instantiates only the kept 1|4|4096|8192 =
/// 12293; the measurements of each are in cuda/results/bwd_atomic_session2.md):
///    1 = LSE_i, D_i staged in SRAM by cp.async one step ahead (else __ldg per step);     kept
///    2 = dS from the 16-bit P (P kept packed, fewer live registers);                     slower
///    4 = dQ product and its reductions before dK/dV;  32 = between dV_j and dK_j:
///        slower with red (the warps wait on their own reductions); with 4096 (bulk, async)
///        dQ first is 8 % FASTER: its reductions run under the dK/dV products;           kept
///   64 = ldmatrix fragments of k-step kk+1 loaded before the mma of kk;                  slower
///  128 = no dQ reductions, 256 = no dQ at all (diagnostics: WRONG dQ, timing only);
///  512 = dQ partial staged in SRAM, row-contiguous red.v4 (else red.v2 from registers);  kept
/// 1024 = clusters of 2 key blocks sum their dQ partials in DSMEM before reducing (half the L2
///        atomics; correct, but the per-step cluster barrier made it 19 % slower).
/// 2048 = dQ partial staged in SRAM (row-contiguous, 160-byte row stride) and added into dQaccum
///        by the bulk-copy unit: one `cp.reduce.async.bulk...add.f32` of 128 B per row, issued by
///        the row's lane, instead of red.v4 from the warps (overrides 512). 7 % slower than 512:
///        256 small bulk requests per step.
/// 4096 = dQaccum in a TILED layout (the atomic design's own workspace, read only by the dQ
///        convert kernel): for each (b, h, query tile i) BLOCK_M·d contiguous floats, inside them
///        warp w's 32 × 32 partial as 4 KiB in mma-fragment order. Each warp stores its partial
///        to its SRAM slice with conflict-free float4 stores and ONE bulk reduction of 4 KiB per
///        step adds it into dQaccum (overrides 512 and 2048).                               kept
/// 8192 = (with 4096) the async-proxy fence by the issuing lane only, after the warp barrier,
///        instead of by every lane before it (+1 %).                                          kept
template <int HEAD_DIM, int BM, bool kBf16, int VARIANT>
__global__ void __launch_bounds__(AtomicTraits<HEAD_DIM, BM>::kThreads, 1)
    fast_bwd_atomic_kernel(Problem p, const uint16_t* __restrict__ Q, const uint16_t* __restrict__ K,
                           const uint16_t* __restrict__ V, const uint16_t* __restrict__ dO,
                           const float* __restrict__ LSE, const float* __restrict__ D, float* __restrict__ dQaccum,
                           uint16_t* __restrict__ dK, uint16_t* __restrict__ dV) {
  using T = AtomicTraits<HEAD_DIM, BM>;
  constexpr int BLOCK_M = T::BLOCK_M, BLOCK_N = T::BLOCK_N, kThreads = T::kThreads;
  constexpr bool kStatsInSram = VARIANT & 1, kPackedP = VARIANT & 2, kDqFirst = VARIANT & 4;
  constexpr bool kDqMiddle = VARIANT & 32, kPf = VARIANT & 64, kDqViaSram = VARIANT & 512;
  constexpr bool kPair = VARIANT & 1024;  // cluster of 2 key blocks: dQ partials summed in DSMEM
  constexpr bool kDqTiled = VARIANT & 4096;  // tiled dQaccum, one 4 KiB bulk reduction per warp
  constexpr bool kFence1 = VARIANT & 8192;   // kDqTiled: the proxy fence by the issuing lane only
  constexpr bool kDqBulk = (VARIANT & 2048) && !kDqTiled;  // row-wise bulk reductions
  // Diagnostics only (results wrong; experiment builds): 128 = no dQ reductions, 256 = no dQ product.
  constexpr bool kNoDqRed = VARIANT & 128, kNoDq = VARIANT & 256;
  constexpr int SNT = T::kSNT, kSCols = 8 * SNT;
  const int N = p.seq;
  // Causal: the grid is (H, Tc, B), so blocks start heaviest-first (small j: most query tiles)
  // across all heads (longest-first scheduling, +9-10 % measured); non-causal: (Tc, H, B), the
  // blocks of one head run together (their Q_i, dO_i and dQaccum rows are shared in L2).
  const int j = p.causal ? blockIdx.y : blockIdx.x, h = p.causal ? blockIdx.x : blockIdx.y, b = blockIdx.z;
  const int start_n = j * BLOCK_N;
  const std::size_t stride = p.row_stride(), base = p.head_offset(b, h), stat = p.stat_offset(b, h);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, t = lane & 3;  // mma fragment coordinates
  // Warp layouts: S/dP and dQ use (wm, wn) = (32-row slice, key or d slice); dK/dV use
  // (wk, wd) = (key quarter, d half).
  const int wm = warp / T::kWN, wn = warp % T::kWN;
  const int wk = warp >> 1, wd = warp & 1;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t sK = uint32_t(__cvta_generic_to_shared(smem_raw));
  const uint32_t sV = sK + T::kTileK;
  const uint32_t sQ = sV + T::kTileK;       // + stage · kTileQ
  const uint32_t sdO = sQ + 2 * T::kTileQ;  // + stage · kTileQ
  const uint32_t sP = sdO + 2 * T::kTileQ;  // [BLOCK_M][BLOCK_N] 16-bit
  const uint32_t sdS = sP + T::kTileP;      // [BLOCK_M][BLOCK_N] 16-bit
  const uint32_t sL = sdS + T::kTileP;      // + stage · kTileL: [LSE_i: BLOCK_M][D_i: BLOCK_M] fp32
  const uint32_t sDq = sL + 2 * T::kTileL;  // kDqViaSram: 8 warps × [32][32] fp32 dQ partials;
                                            // kPair: 2 slots × 8 warps × 2 KiB of partner partials
  uint32_t rank = 0, sDqRemote = 0;  // kPair: this block's rank in its cluster, partner's slot base
  if constexpr (kPair) {
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(sDqRemote) : "r"(sDq), "r"(rank ^ 1u));
    // The partner must be running before its SRAM is written (DSMEM rule).
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
  }

  // Causal: query tiles that end before this key block starts see none of it (BLOCK_N is a
  // multiple of BLOCK_M, so the first visible tile starts exactly at start_n).
  // kPair: both blocks of a cluster run the same steps (they meet at a cluster barrier every
  // step), from the even block's first tile; the odd block's extra tiles are fully masked.
  const int i_begin = p.causal ? (kPair ? (j & ~1) * BLOCK_N : start_n) / BLOCK_M : 0;
  const int Tr = (N + BLOCK_M - 1) / BLOCK_M;

  // LSE_i, D_i (2·BLOCK_M floats): HBM → SRAM, 4-byte cp.async (the rows of one head need not be
  // 16-byte aligned); rows ≥ N zero-filled.
  auto load_stats_async = [&](uint32_t dst, int row0) {
    if (int(threadIdx.x) < 2 * BLOCK_M) {
      const int r = int(threadIdx.x) % BLOCK_M, row = row0 + r;
      const float* src = (int(threadIdx.x) < BLOCK_M ? LSE : D) + stat + (row < N ? row : 0);
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst + 4 * uint32_t(threadIdx.x)),
                   "l"(src), "r"(row < N ? 4 : 0));
    }
  };

  // Load K_j, V_j, Q_first, dO_first (, LSE, D): HBM → SRAM (one cp.async group).
  load_tile_async<HEAD_DIM, BLOCK_N, kThreads>(sK, K + base, stride, start_n, N);
  load_tile_async<HEAD_DIM, BLOCK_N, kThreads>(sV, V + base, stride, start_n, N);
  load_tile_async<HEAD_DIM, BLOCK_M, kThreads>(sQ, Q + base, stride, i_begin * BLOCK_M, N);
  load_tile_async<HEAD_DIM, BLOCK_M, kThreads>(sdO, dO + base, stride, i_begin * BLOCK_M, N);
  if constexpr (kStatsInSram) load_stats_async(sL, i_begin * BLOCK_M);
  cp_async_commit();

  // dK_j, dV_j accumulators: keys [32·wk, 32·wk + 32) × columns [wd·d/2, wd·d/2 + d/2).
  float acc_dk[2][T::kDkvNT][4], acc_dv[2][T::kDkvNT][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int n = 0; n < T::kDkvNT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_dk[mt][n][e] = acc_dv[mt][n][e] = 0.f;

  // dQaccum_i += dS_ij K_j (this warp: 32 query rows × kDqCols columns), fp32 reductions in L2.
  auto dq_step = [&](int row0, int step) {
    if constexpr (kNoDq) return;
    float dq[2][T::kDqNT][4];
    warp_gemm_xb<HEAD_DIM, BLOCK_N, T::kDqNT, kBf16, kPf>(dq, sdS, 32 * wm, sK, wn * T::kDqCols, lane);
    if constexpr (kPair) {
      // The two blocks of the cluster (key blocks 2c, 2c+1) hold partials of the same dQ_i rows.
      // Rank r keeps n8 tiles [H·r, H·r + H) of each warp tile and sends the other half to the
      // partner (same warp, same lane: identical fragment layout), so each dQaccum element gets
      // one reduction per key-block PAIR — half the L2 atomic traffic — and every warp issues
      // half the reductions. Slots alternate per step: a slot is rewritten two steps later, after
      // the next cluster barrier, which the reader passes only when done reading.
      constexpr int H = T::kDqNT / 2;
      const uint32_t slot = uint32_t((step & 1) * (T::kWarps * 2048) + warp * 2048);
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nn = 0; nn < H; ++nn)
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const int n = H * int(rank ^ 1u) + nn;  // the partner's half
            const uint32_t off = uint32_t((((mt * H + nn) * 2 + r) * 32 + lane) * 8);
            asm volatile("st.shared::cluster.v2.f32 [%0], {%1, %2};\n" ::"r"(sDqRemote + slot + off),
                         "f"(dq[mt][n][2 * r]), "f"(dq[mt][n][2 * r + 1])
                         : "memory");
          }
      asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int row = row0 + 32 * wm + 16 * mt + g + 8 * r;
#pragma unroll
          for (int nn = 0; nn < H; ++nn) {
            const int n = H * int(rank) + nn;  // this block's half
            const uint32_t off = uint32_t((((mt * H + nn) * 2 + r) * 32 + lane) * 8);
            float x0, x1;
            asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(x0), "=f"(x1) : "r"(sDq + slot + off));
            if (row < N)
              red_add_f32x2(dQaccum + base + std::size_t(row) * stride + wn * T::kDqCols + 8 * n + 2 * t,
                            dq[mt][n][2 * r] + x0, dq[mt][n][2 * r + 1] + x1);
          }
        }
    } else if constexpr (kDqTiled) {
      // Tile (b, h, i) of dQaccum is BLOCK_M·d contiguous floats; warp w owns floats
      // [1024·w, 1024·w + 1024) of it, in the order its mma C fragments come: float4 number
      // 32·(mt·kDqNT + n) + lane holds dq[mt][n][0..3] (rows g, g + 8 of m tile mt, columns 2t,
      // 2t + 1 of n8 tile n). Every key block adds its partial of tile i in this same order, and
      // fast_bwd_dq_convert_tiled_kernel maps it back to [B, N, H, d]. The warp writes that
      // order to its SRAM slice (each float4 store covers 512 contiguous bytes: conflict-free)
      // and lane 0 hands the whole 4 KiB to the bulk-copy unit in one reduction — the warp's
      // load/store path carries no per-element reductions and the bulk unit one request per
      // warp per step.
      static_assert(T::BLOCK_M * HEAD_DIM == T::kWarps * 1024 && T::kDqNT == 4, "tile = 8 warps × 32 × 32");
      const uint32_t sW = sDq + uint32_t(warp) * 4096u;
      if (lane == 0) bulk_wait_group_read<0>();  // the bulk read of step i−1 is done with the slice
      __syncwarp();
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int n = 0; n < T::kDqNT; ++n)
          asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(
                           sW + uint32_t(((mt * T::kDqNT + n) * 32 + lane) * 16)),
                       "f"(dq[mt][n][0]), "f"(dq[mt][n][1]), "f"(dq[mt][n][2]), "f"(dq[mt][n][3]));
      // Generic-proxy writes → async-proxy read. Either every writer fences its own stores before
      // the warp barrier, or (kFence1) lane 0 fences after it: the barrier orders the other
      // lanes' stores before lane 0's fence, and the fence orders them before its bulk read
      // (PTX memory model, proxy-preserved causality order through a proxy fence).
      if constexpr (!kFence1) fence_proxy_async_shared();
      __syncwarp();
      if (lane == 0) {
        if constexpr (kFence1) fence_proxy_async_shared();
        const std::size_t tile = (std::size_t(b) * p.heads + h) * std::size_t(Tr) + std::size_t(row0 / BLOCK_M);
        if constexpr (!kNoDqRed)
          bulk_reduce_add_f32(dQaccum + tile * (BLOCK_M * HEAD_DIM) + 1024 * warp, sW, 4096u);
        bulk_commit_group();
      }
    } else if constexpr (kDqBulk) {
      // The warp's 32 × 32 fp32 partial goes to its own SRAM slice as 32 row segments of 128
      // contiguous bytes (the same bytes' place in dQaccum's row is contiguous too), then lane l
      // hands row l to the bulk-copy unit: dQaccum[row, wn·32 .. +32) += slice row l, performed
      // in L2 without the warp's load/store path. The warp neither reads the slice back nor
      // issues per-element reductions; it only waits, a whole step later, until its previous
      // bulk reads of the slice are done (wait_group.read: source reusable).
      static_assert(T::kDqCols == 32, "bulk slice is 32 rows × 32 floats");
      const uint32_t sW = sDq + uint32_t(warp) * (32 * T::kDqBulkRow);
      bulk_wait_group_read<0>();  // this lane's bulk read of step i−1 has finished with the slice
      __syncwarp();               // ... and so has every other lane's, before anyone overwrites it
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
          for (int n = 0; n < T::kDqNT; ++n) {
            const int lrow = 16 * mt + g + 8 * r;
            const uint32_t a = sW + uint32_t(lrow * T::kDqBulkRow + (8 * n + 2 * t) * 4);
            asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(a), "f"(dq[mt][n][2 * r]),
                         "f"(dq[mt][n][2 * r + 1]));
          }
      // Generic-proxy writes → async-proxy reads: each writer fences its own stores, then the
      // warp barrier orders them before any lane's bulk operation.
      fence_proxy_async_shared();
      __syncwarp();
      const int row = row0 + 32 * wm + lane;
      if (row < N && !kNoDqRed)
        bulk_reduce_add_f32(dQaccum + base + std::size_t(row) * stride + wn * 32,
                            sW + uint32_t(lane * T::kDqBulkRow), 32 * 4);
      bulk_commit_group();  // (an empty group when the row is past N)
    } else {
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int row = row0 + 32 * wm + 16 * mt + g + 8 * r;
          if constexpr (!kDqViaSram) {
            if (row < N && !kNoDqRed) {
              float* dst = dQaccum + base + std::size_t(row) * stride + wn * T::kDqCols + 2 * t;
#pragma unroll
              for (int n = 0; n < T::kDqNT; ++n) red_add_f32x2(dst + 8 * n, dq[mt][n][2 * r], dq[mt][n][2 * r + 1]);
            }
          }
        }
      if constexpr (kDqViaSram) {
        // The warp's 32 × 32 fp32 partial goes through its own SRAM slice ([32 rows][128 B],
        // 16-byte chunks XOR-swizzled by row: the float2 stores take the minimum 2 wavefronts, the
        // float4 loads 4), then leaves as row-contiguous red.v4: one instruction covers 4 rows ×
        // 128 B (4 L2 lines) instead of 8 rows × 32 B (8 lines) per red.v2 — a quarter of the
        // line lookups for the same bytes.
        static_assert(T::kDqCols == 32, "staging slice is 32 × 32 floats");
        const uint32_t sW = sDq + uint32_t(warp) * (32 * 32 * 4);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int n = 0; n < T::kDqNT; ++n) {
              const int lrow = 16 * mt + g + 8 * r, chunk = 2 * n + (t >> 1);
              const uint32_t a = sW + uint32_t(lrow * 128 + ((chunk ^ (lrow & 7)) << 4) + (t & 1) * 8);
              asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(a), "f"(dq[mt][n][2 * r]),
                           "f"(dq[mt][n][2 * r + 1]));
            }
        __syncwarp();
#pragma unroll
        for (int it = 0; it < 8; ++it) {
          const int lrow = 4 * it + (lane >> 3), c = lane & 7;
          float v0, v1, v2, v3;
          asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                       : "=f"(v0), "=f"(v1), "=f"(v2), "=f"(v3)
                       : "r"(sW + uint32_t(lrow * 128 + ((c ^ (lrow & 7)) << 4))));
          const int row = row0 + 32 * wm + lrow;
          if (row < N) red_add_f32x4(dQaccum + base + std::size_t(row) * stride + wn * 32 + 4 * c, v0, v1, v2, v3);
        }
        // The slice is rewritten only in the next step, after two __syncthreads().
      }
    }
  };

  for (int i = i_begin; i < Tr; ++i) {
    const int row0 = i * BLOCK_M;
    const int st = (i - i_begin) & 1;
    const uint32_t stage = uint32_t(st * T::kTileQ);
    cp_async_wait_all();  // this thread's copies of Q_i, dO_i (and K_j, V_j) have landed
    // All copies visible to all warps; every warp has finished step i−1, so the other stage, P
    // and dS may be overwritten below.
    __syncthreads();
    // Load Q_{i+1}, dO_{i+1} (, LSE, D): HBM → SRAM into the other stage, while step i computes.
    if (i + 1 < Tr) {
      const uint32_t next = uint32_t((st ^ 1) * T::kTileQ);
      load_tile_async<HEAD_DIM, BLOCK_M, kThreads>(sQ + next, Q + base, stride, row0 + BLOCK_M, N);
      load_tile_async<HEAD_DIM, BLOCK_M, kThreads>(sdO + next, dO + base, stride, row0 + BLOCK_M, N);
      if constexpr (kStatsInSram) load_stats_async(sL + uint32_t((st ^ 1) * T::kTileL), row0 + BLOCK_M);
    }
    cp_async_commit();

    // ---- S_ij = Q_i K_jᵀ, dP_ij = dO_i V_jᵀ: this warp's 32 query rows × kSCols keys (fp32).
    {
      const bool need_mask =
          row0 + BLOCK_M > N || start_n + BLOCK_N > N || (p.causal && start_n + BLOCK_N - 1 > row0);
      float lse[2][2], Di[2][2];  // LSE_i, D_i of rows g, g + 8 of each m16 tile
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int lrow = 32 * wm + 16 * mt + g + 8 * r;
          if constexpr (kStatsInSram) {
            const uint32_t a = sL + uint32_t(st * T::kTileL) + 4 * uint32_t(lrow);
            asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(lse[mt][r]) : "r"(a));
            asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(Di[mt][r]) : "r"(a + 4 * BLOCK_M));
          } else {
            const int row = row0 + lrow;
            lse[mt][r] = row < N ? __ldg(LSE + stat + row) : 0.f;  // HBM/L1 → registers
            Di[mt][r] = row < N ? __ldg(D + stat + row) : 0.f;
          }
        }
      // P_ij = 2^(S·scale·log2 e − LSE_i), 0 where masked: selected, not computed (no
      // 2^(−inf)·x, no Inf·0 → NaN). Written to SRAM in 16 bits ([query][key], swizzled, 4-byte
      // stores: 8 rows × 16 B per instruction hit 32 distinct banks thanks to the XOR swizzle).
      auto p_of = [&](float sv, int mt, int r, int n, int c) {
        const int row = row0 + 32 * wm + 16 * mt + g + 8 * r;
        const int key = start_n + wn * kSCols + 8 * n + 2 * t + c;
        const bool visible = !need_mask || (row < N && key < N && (!p.causal || key <= row));
        return visible ? ex2(fmaf(sv, p.scale_log2, -lse[mt][r])) : 0.f;
      };
      auto st_shared = [&](uint32_t tile, int mt, int r, int n, uint32_t v) {
        const int lrow = 32 * wm + 16 * mt + g + 8 * r, lcol = wn * kSCols + 8 * n + 2 * t;
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(tile + swz<BLOCK_N>(lrow, lcol / 8) + 2 * (lcol % 8)),
                     "r"(v));
      };
      if constexpr (kPackedP) {
        uint32_t pk[2][SNT][2];  // P_ij in 16 bits: [m tile][n8 tile][row g / g + 8]
        {
          float s[2][SNT][4];
          warp_gemm_abt<HEAD_DIM, SNT, kBf16, kPf>(s, sQ + stage, 32 * wm, sK, wn * kSCols, lane);
#pragma unroll
          for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int r = 0; r < 2; ++r)
#pragma unroll
              for (int n = 0; n < SNT; ++n) {
                pk[mt][n][r] = pack2<kBf16>(p_of(s[mt][n][2 * r], mt, r, n, 0), p_of(s[mt][n][2 * r + 1], mt, r, n, 1));
                st_shared(sP, mt, r, n, pk[mt][n][r]);
              }
        }
        float dp[2][SNT][4];
        warp_gemm_abt<HEAD_DIM, SNT, kBf16, kPf>(dp, sdO + stage, 32 * wm, sV, wn * kSCols, lane);
        // dS_ij = P_ij ∘ (dP_ij − D_i) with the 16-bit P (the value dV_j sees).
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int n = 0; n < SNT; ++n) {
              const float2 P = unpack2<kBf16>(pk[mt][n][r]);
              st_shared(sdS, mt, r, n,
                        pack2<kBf16>(P.x * (dp[mt][n][2 * r] - Di[mt][r]), P.y * (dp[mt][n][2 * r + 1] - Di[mt][r])));
            }
      } else {
        float s[2][SNT][4], dp[2][SNT][4];
        warp_gemm_abt<HEAD_DIM, SNT, kBf16, kPf>(s, sQ + stage, 32 * wm, sK, wn * kSCols, lane);
        warp_gemm_abt<HEAD_DIM, SNT, kBf16, kPf>(dp, sdO + stage, 32 * wm, sV, wn * kSCols, lane);
        // dS_ij = P_ij ∘ (dP_ij − D_i) with the fp32 P.
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int n = 0; n < SNT; ++n) {
              const float p0 = p_of(s[mt][n][2 * r], mt, r, n, 0), p1 = p_of(s[mt][n][2 * r + 1], mt, r, n, 1);
              st_shared(sP, mt, r, n, pack2<kBf16>(p0, p1));
              st_shared(sdS, mt, r, n,
                        pack2<kBf16>(p0 * (dp[mt][n][2 * r] - Di[mt][r]), p1 * (dp[mt][n][2 * r + 1] - Di[mt][r])));
            }
      }
    }
    __syncthreads();  // P_ij, dS_ij complete: the products below read other warps' rows and columns

    if constexpr (kDqFirst) dq_step(row0, i - i_begin);
    // ---- dV_j += P_ijᵀ dO_i, dK_j += dS_ijᵀ Q_i (this warp: 32 keys × d/2 columns of each).
    warp_gemm_xtb<HEAD_DIM, BLOCK_M, BLOCK_N, T::kDkvNT, kBf16, kPf>(acc_dv, sP, 32 * wk, sdO + stage,
                                                                 wd * (HEAD_DIM / 2), lane);
    if constexpr (kDqMiddle && !kDqFirst) dq_step(row0, i - i_begin);
    warp_gemm_xtb<HEAD_DIM, BLOCK_M, BLOCK_N, T::kDkvNT, kBf16, kPf>(acc_dk, sdS, 32 * wk, sQ + stage,
                                                                 wd * (HEAD_DIM / 2), lane);
    if constexpr (!kDqFirst && !kDqMiddle) dq_step(row0, i - i_begin);
  }
  cp_async_wait_all();  // no copy may still be writing SRAM when the block exits (empty groups)
  // Bulk dQ reductions still reading this block's SRAM or not yet performed in L2 must finish
  // before the block exits (its SRAM is then released).
  if constexpr (kDqBulk || kDqTiled) bulk_wait_group<0>();

  // dK_j = scale · acc_dk, dV_j = acc_dv: registers → HBM, once.
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
    const int key0 = start_n + 32 * wk + 16 * mt;
    store_rows16<T::kDkvNT, kBf16>(dK + base + wd * (HEAD_DIM / 2), stride, key0, N, acc_dk[mt], p.scale, g, t);
    store_rows16<T::kDkvNT, kBf16>(dV + base + wd * (HEAD_DIM / 2), stride, key0, N, acc_dv[mt], 1.f, g, t);
  }
}

// ----------------------------------------------------------------------------- 3. dQ convert
/// dQ = scale · dQaccum rounded to 16 bits, 4 elements per thread per iteration (grid-stride;
/// the element count B·N·H·d is a multiple of 64).
template <bool kBf16>
__global__ void __launch_bounds__(256) fast_bwd_dq_convert_kernel(const float4* __restrict__ acc,
                                                                  uint2* __restrict__ dQ, std::size_t n4,
                                                                  float scale) {
  for (std::size_t k = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; k < n4;
       k += std::size_t(gridDim.x) * blockDim.x) {
    const float4 v = acc[k];
    dQ[k] = make_uint2(pack2<kBf16>(v.x * scale, v.y * scale), pack2<kBf16>(v.z * scale, v.w * scale));
  }
}

/// VARIANT bit 4096: dQ = scale · dQaccum → 16 bits, dQaccum in the tiled fragment order of the
/// main kernel (tile (b, h, i): BLOCK_M·d floats; warp w: 1024 floats; float4 number
/// 32·(mt·4 + n) + lane). One thread per float4 (grid-stride): it holds columns c, c + 1 of rows
/// r and r + 8; rows ≥ N (the last tile's padding) are skipped. The accumulator is read
/// coalesced; each row of dQ gets 4-byte stores, 16 contiguous bytes per 4 lanes.
template <int HEAD_DIM, int BM, bool kBf16>
__global__ void __launch_bounds__(256) fast_bwd_dq_convert_tiled_kernel(Problem p, const float4* __restrict__ acc,
                                                                        uint16_t* __restrict__ dQ, std::size_t n4) {
  using T = AtomicTraits<HEAD_DIM, BM>;
  const int Tr = (p.seq + BM - 1) / BM;
  for (std::size_t k = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; k < n4;
       k += std::size_t(gridDim.x) * blockDim.x) {
    const int lane = int(k & 31), frag = int((k >> 5) & 7), warp = int((k >> 8) & 7);
    const std::size_t tile = k >> 11;  // 2048 float4 = BM·d floats per tile
    const int i = int(tile % Tr), h = int(tile / Tr % p.heads), b = int(tile / Tr / p.heads);
    const int mt = frag / T::kDqNT, n = frag % T::kDqNT, g = lane >> 2, t = lane & 3;
    const int wm = warp / T::kWN, wn = warp % T::kWN;
    const int row = i * BM + 32 * wm + 16 * mt + g, col = wn * T::kDqCols + 8 * n + 2 * t;
    const float4 v = acc[k];
    uint16_t* out = dQ + p.head_offset(b, h) + col;
    if (row < p.seq)
      *reinterpret_cast<uint32_t*>(out + std::size_t(row) * p.row_stride()) = pack2<kBf16>(v.x * p.scale, v.y * p.scale);
    if (row + 8 < p.seq)
      *reinterpret_cast<uint32_t*>(out + std::size_t(row + 8) * p.row_stride()) =
          pack2<kBf16>(v.z * p.scale, v.w * p.scale);
  }
}

template <int HEAD_DIM, int BM, bool kBf16, int VARIANT>
void launch_atomic(const Problem& p, const BwdPointers& a, cudaStream_t stream) {
  using T = AtomicTraits<HEAD_DIM, BM>;
  auto kernel = &fast_bwd_atomic_kernel<HEAD_DIM, BM, kBf16, VARIANT>;
  constexpr int kSmem =
      T::kSmem + ((VARIANT & 4096)                ? T::kSmemDq
                  : (VARIANT & 2048)              ? T::kSmemDqBulk
                  : (VARIANT & (512 | 1024)) ? T::kSmemDq
                                                  : 0);
  // Opt in to > 48 KiB of dynamic SRAM once per instantiation (thread-safe static init).
  static const bool opted_in = [&] {
    set_smem(reinterpret_cast<const void*>(kernel), kSmem, "fast_bwd_atomic_kernel", p);
    return true;
  }();
  (void)opted_in;
  constexpr bool kTiled = VARIANT & 4096;
  const std::size_t numel = std::size_t(p.batch) * p.seq * p.row_stride();
  // Tiled layout: Tr whole tiles per (b, h), the last one padded (the workspace holds
  // B·H·ceil(N / 128)·128·d floats, enough for both BLOCK_M).
  const std::size_t acc_numel =
      kTiled ? std::size_t(p.batch) * p.heads * ((p.seq + BM - 1) / BM) * BM * HEAD_DIM : numel;
  // dQaccum = 0: the kernel only ever adds into it.
  FLASHLAB_CUDA_CHECK(cudaMemsetAsync(a.dQaccum, 0, acc_numel * sizeof(float), stream));
  launch_fast_bwd_preprocess<HEAD_DIM, kBf16>(p, a, stream);

  announce("fast_bwd_atomic_kernel");
  const unsigned tc = unsigned((p.seq + T::BLOCK_N - 1) / T::BLOCK_N);
  constexpr bool kPair = VARIANT & 1024;
  const unsigned tcg = kPair ? (tc + 1) / 2 * 2 : tc;  // kPair: an even count (a last, empty block pairs up)
  const dim3 grid = p.causal ? dim3(p.heads, tcg, p.batch) : dim3(tcg, p.heads, p.batch);  // see the kernel
  const auto* Qp = static_cast<const uint16_t*>(a.Q);
  const auto* Kp = static_cast<const uint16_t*>(a.K);
  const auto* Vp = static_cast<const uint16_t*>(a.V);
  const auto* dOp = static_cast<const uint16_t*>(a.dO);
  auto* dKp = static_cast<uint16_t*>(a.dK);
  auto* dVp = static_cast<uint16_t*>(a.dV);
  if constexpr (kPair) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(T::kThreads);
    cfg.dynamicSmemBytes = kSmem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = p.causal ? 1 : 2;  // the key-block axis
    attr[0].val.clusterDim.y = p.causal ? 2 : 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    FLASHLAB_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, p, Qp, Kp, Vp, dOp, a.LSE, static_cast<const float*>(a.D),
                                           a.dQaccum, dKp, dVp));
  } else {
    kernel<<<grid, T::kThreads, kSmem, stream>>>(p, Qp, Kp, Vp, dOp, a.LSE, a.D, a.dQaccum, dKp, dVp);
  }
  FLASHLAB_CUDA_CHECK_LAUNCH("fast_bwd_atomic_kernel");

  const std::size_t n4 = acc_numel / 4;
  const unsigned blocks = unsigned(std::min<std::size_t>((n4 + 255) / 256, 4096));
  announce("fast_bwd_dq_convert_kernel");
  if constexpr (kTiled) {
    fast_bwd_dq_convert_tiled_kernel<HEAD_DIM, BM, kBf16><<<blocks, 256, 0, stream>>>(
        p, reinterpret_cast<const float4*>(a.dQaccum), static_cast<uint16_t*>(a.dQ), n4);
  } else {
    fast_bwd_dq_convert_kernel<kBf16><<<blocks, 256, 0, stream>>>(reinterpret_cast<const float4*>(a.dQaccum),
                                                                   static_cast<uint2*>(a.dQ), n4, p.scale);
  }
  FLASHLAB_CUDA_CHECK_LAUNCH("fast_bwd_dq_convert_kernel");
}

// Kept configuration per head dim (BLOCK_M, VARIANT bits; measurements:
// cuda/results/bwd_atomic_session2.md, "Round 2"): LSE_i/D_i staged in SRAM, fp32 P, dQ product
// first, dQ partials staged in SRAM in fragment order and added into the tiled dQaccum by one
// 4 KiB bulk asynchronous reduction per warp and step (fence by the issuing lane).
constexpr int kBM64 = 128, kV64 = 12293;
constexpr int kBM128 = 64, kV128 = 12293;

}  // namespace

void launch_fast_bwd_atomic(const Problem& p, bool bf16, const BwdPointers& a, cudaStream_t stream) {
#ifdef FLASHLAB_BWD_ATOMIC_EXPERIMENTS
  // Tuning only (not built by default; compile this file with -DFLASHLAB_BWD_ATOMIC_EXPERIMENTS):
  // FLASHLAB_BWD_ATOMIC_VARIANT = "BM,VARIANT" picks a bf16 variant. Add the variants to time to
  // the list (each is one more instantiation to compile); those measured are in
  // cuda/results/bwd_atomic_session2.md.
  if (const char* env = std::getenv("FLASHLAB_BWD_ATOMIC_VARIANT"); env && bf16) {
    const std::string v = env;
#define FLASHLAB_X(D, BM, VAR)                                                       \
  if (p.head_dim == D && v == #BM "," #VAR) return launch_atomic<D, BM, true, VAR>(p, a, stream);
    FLASHLAB_X(128, 64, 513) FLASHLAB_X(128, 64, 12293) FLASHLAB_X(128, 64, 4101) FLASHLAB_X(128, 64, 12325)
    FLASHLAB_X(128, 64, 12421) FLASHLAB_X(64, 128, 513) FLASHLAB_X(64, 128, 12293) FLASHLAB_X(64, 128, 12325)
#undef FLASHLAB_X
    throw std::invalid_argument("FLASHLAB_BWD_ATOMIC_VARIANT=" + v + " is not built");
  }
#endif
  if (p.head_dim == 64) {
    if (bf16) launch_atomic<64, kBM64, true, kV64>(p, a, stream);
    else launch_atomic<64, kBM64, false, kV64>(p, a, stream);
  } else {
    if (bf16) launch_atomic<128, kBM128, true, kV128>(p, a, stream);
    else launch_atomic<128, kBM128, false, kV128>(p, a, stream);
  }
}

}  // namespace flashlab::cuda::detail
