// attention_bwd_tc_atomic.cu — fast FlashAttention backward on tensor cores, ATOMIC design.
//
// WHAT. The algorithm, loop order and names of the clear fp32 atomic backward
// (attention_bwd_atomic.cu; the Triton walkthrough "Backward Pass", and "Architecture Design: Triton vs. CUDA":
// FlashAttention-2's own CUDA backward), with bf16 or fp16 inputs and every matrix product on
// `mma.sync.aligned.m16n8k16` (fp32 accumulation), as in attention_bwd_tc.cu. Plain sm_90 (no
// wgmma). Four instantiations: d ∈ {64, 128} × {bf16, fp16}; causal is a run-time flag; four
// more for sliding windows (kWindow) and four for grouped K/V or N_k ≠ N (kGroup).
//   1. fast_bwd_preprocess_kernel        D_i = rowsum(dO_i ∘ O_i) in fp32, and dQaccum = 0 (fp32, TILED
//                                        layout below, caller's workspace) (attention_bwd_tc.cuh)
//   2. fast_bwd_atomic_kernel            one block per K_j, V_j (resident in SRAM); loop over Q_i, dO_i:
//        S_ij  = Q_i K_jᵀ,  P_ij = 2^(S_ij · scale·log2 e − LSE_i)   (masked → P = 0, selected)
//        dP_ij = dO_i V_jᵀ, dS_ij = P_ij ∘ (dP_ij − D_i)
//        dQaccum_i += dS_ij K_j      (fp32; one bulk asynchronous reduction SRAM → L2 per warp)
//        dV_j += P_ijᵀ dO_i,  dK_j += dS_ijᵀ Q_i           (registers, the whole loop)
//   3. dq_convert_kernel                 dQ = scale · dQaccum → 16 bits, [B, N, H, d] (attention_bwd_tc.cuh)
// S and dP are computed once per (i, j) pair: 10·N²·d FLOPs of products (the two-kernel design
// recomputes them in both its kernels: 14·N²·d).
//
// TILES. Bc = BLOCK_N = 128 resident keys. Br = BLOCK_M streamed query rows: 64 at d = 128 (SRAM
// limit), 128 at d = 64 (twice the work per barrier, measured faster). 8 warps, 1 block per SM.
// kWM = BLOCK_M/32 warps along the query rows, kWN = 8/kWM across. Three warp layouts per step:
//   S, dP (BLOCK_M × 128):       kWM × kWN warps, each 32 rows × 128/kWN keys
//                                (d = 128: 2 × 4 warps of 32 × 32; d = 64: 4 × 2 of 32 × 64);
//   dQ_i partial (BLOCK_M × d):  kWM × kWN warps, each 32 rows × 32 columns, A = dS (ldmatrix),
//                                B = K_j (ldmatrix.trans);
//   dV_j, dK_j (128 × d):        4 (keys) × 2 (d) warps, each 32 keys × d/2 of BOTH accumulators
//                                (held in registers for the whole loop), A = Pᵀ / dSᵀ from SRAM
//                                (ldmatrix.trans), B = dO_i / Q_i (ldmatrix.trans).
// Every warp holds two m16 tiles in each product, so each B fragment read from SRAM feeds two mma.
// Grid: non-causal (Tc, H, B), so the blocks of one head run together and share Q_i, dO_i and the
// dQaccum tiles in L2; causal (H, Tc, B), so the heaviest blocks (small j: most query tiles) start
// first across all heads (measured faster for causal). Causal blocks start at the first query tile that sees
// their keys (i_begin); earlier tiles are never loaded. A sliding window (Problem::windowed(), its
// own instantiation kWindow, so the other kernels keep their code): a block loops over the query
// tiles whose band (query + window_lo() … query + window_hi()) meets its keys only, i_begin …
// i_end − 1, and masks both edges of the band in the tiles it crosses (the band replaces causal).
// GROUPED K/V (H_kv < H) or N_k ≠ N (its own instantiation kGroup, with or without a window): one
// block per (key tile j of the N_k keys, K/V head hk, b), grid (Tc, H_kv, B) / (H_kv, Tc, B); it
// loops over the G = H/H_kv query heads h0 … h0 + G − 1 of its group, heads outer (the blocks of one
// group running together read the same Q_i, dO_i from L2), each over its band's query tiles; the
// prefetch after a head's last tile loads the next head's first. dK_j, dV_j sum over the whole group
// in registers and are written once into [B, N_k, H_kv, d] (no atomics on them, K/V never
// expanded); dQ and its accumulator tiles, D_i and LSE_i stay per query head. The band (window_lo …
// window_hi with the offset N_k − N folded in: causal is j ≤ i + N_k − N) masks causal, windows and
// neither alike, and keys ≥ N_k. A key block that no query sees runs no step and writes dK_j = dV_j
// = 0; a query row that sees no key gets no partial from any block, so its dQ is the zeroed
// accumulator's 0.
// PACKED SEQUENCES (Problem::packed(), FlashAttention's varlen layout; fast_bwd_atomic_packed_kernel,
// the kGroup body with kPacked): the blocks own key tiles numbered over the keys as the forwards
// number query tiles (packed.cuh): sequence b owns key tiles ⌊cu_seqlens_k[b] / Bc⌋ + b …, grid
// (⌊total_k / Bc⌋ + B, H_kv, 1), a block finding its sequence by a binary search over the device
// lists (a tile past its sequence's end exits at once). N, N_k, the band's offset len_k − len_q and
// the first rows are the sequence's; loads stop at its last row (zero-filled past it). dQaccum holds
// H·(⌊total_q / Br⌋ + B) tiles of the packed query numbering (a sequence's query tile i is tile
// ⌊cu_seqlens_q[b] / Br⌋ + b + i of its head), which dq_convert_packed_kernel maps back to
// the sequence's rows; D runs over the total_q rows as one sequence. The dense kernels are a
// separate __global__ over the same body, so they keep their parameters and code.
//
// SRAM (dynamic; 16-bit tiles swizzled in 16-byte chunks like the other fast kernels):
//   [K_j][V_j][Q_i ×2 stages][dO_i ×2 stages][P_ij][dS_ij][LSE_i, D_i ×2 stages][dQ slices: 8 × 4 KiB]
//   d = 128: 32+32 + 2·16+2·16 + 16+16 + 2·0.5 + 32 = 193 KiB;  d = 64: 16+16 + 2·16+2·16 + 32+32 + 2·1 + 32 = 194 KiB.
// Q_{i+1}, dO_{i+1}, LSE_{i+1}, D_{i+1} are copied by cp.async into the other stage while step i
// computes (LSE/D by 4-byte cp.async: the rows of one head need not be 16-byte aligned).
//
// ONE STEP (query tile i), and why each barrier/fence is there:
//   a. cp.async.wait_group 0, __syncthreads(): tile i has landed and is visible to all warps, and
//      every warp has finished step i−1, so the other stage, P and dS may be overwritten.
//   b. Issue the copies of tile i+1 (one cp.async group).
//   c. S and dP (registers), P and dS in fp32, rounded once to 16 bits and stored to SRAM. One
//      uniform branch per step picks the element loop: without any mask test (every tile but the
//      last row/column of tiles and, causal, the diagonal ones) or with masked entries selected to 0.
//   d. __syncthreads(): P, dS complete; the products below read other warps' rows and columns.
//   e. dQ partial = dS_ij K_j (first, so its bulk reduction runs under the dK/dV products), then
//      the hand-off to the bulk-copy unit (below).
//   f. dV_j += P_ijᵀ dO_i, dK_j += dS_ijᵀ Q_i.
// After the loop: cp.async.wait_group 0 (no copy may still write SRAM when the block exits) and
// cp.async.bulk.wait_group 0 (no bulk reduction may still read the block's SRAM), then dK_j =
// scale · acc_dk and dV_j = acc_dv go registers → HBM once.
//
// THE dQ HAND-OFF. dQaccum is this design's own scratch, so its layout suits the reduction: it is
// TILED, per (b, h, query tile i) BLOCK_M·d contiguous floats; inside them warp w's 32 × 32 partial
// is 4 KiB in mma C-fragment order (float4 number 32·(mt·4 + n) + lane = dq[mt][n][0..3]). Every key
// block adds its partial of tile i in that same order. Per step each warp, in its own 4 KiB slice:
//   1. lane 0: cp.async.bulk.wait_group.read 0 — its previous bulk reduction (issued a whole step
//      earlier) has finished READING the slice; then __syncwarp, so no lane overwrites it sooner;
//   2. 8 st.shared.v4 per lane (each instruction 512 contiguous bytes: no bank conflicts);
//   3. __syncwarp, then lane 0: fence.proxy.async.shared::cta and ONE
//      cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 of 4 KiB, and a commit. The warp
//      barrier orders the other lanes' (generic-proxy) stores before lane 0's proxy fence, which
//      orders them before the async-proxy read of the bulk op (PTX memory model: causality order
//      through a proxy fence). The adds are performed in L2; the warps' load/store path carries none.
// The workspace holds whole tiles, N rounded up to 128 rows; the last tile's padding rows receive
// partials of exactly 0 (their P, hence dS, is masked to 0). dq_convert_kernel maps the
// tiles back to [B, N, H, d].
//
// Masks: keys ≥ N, query rows ≥ N and, causal, key > query → P = 0, selected after 2^x (a masked
// 2^x may be +inf; it is discarded, never multiplied: no Inf·0 → NaN). Out-of-sequence rows are
// zero-filled by cp.async (src-size 0), so their S is 0 and their LSE_i, D_i are 0.
// Numerics: P and dS are rounded to 16 bits once (when written to SRAM) and that rounded value
// feeds dV, dK and dQ; dQ's sum over key blocks is fp32 in an order that varies run to run (not
// bit-reproducible), then rounded once.
//
// REGISTERS (ptxas, sm_90, bf16 and fp16 alike): 255 at both head dims (the dK/dV accumulators
// alone take 128 at d = 128), with 48 bytes of spill at d = 128 and 8 at d = 64; the spill loads
// sit in the once-per-step prefetch branch, not in the products. Convert kernel 28. The grouped
// instantiation (kGroup): 255 as well, with 112 bytes of stack frame at d = 128 and 16 at d = 64
// (the window instantiation: 24 and 16), not measured against the plain kernel on equal work.
//
// Tried and not kept, each measured slower on the H100 (docs/optimisation.md, the backward in one
// kernel): LSE/D by __ldg; dS from packed 16-bit P (spills); red.global from the warps (v2, v4, or
// via SRAM: the issuing warps then waited on the reductions' latency); 128-byte
// row-wise bulk reductions; 2-block clusters summing dQ in distributed shared memory; ldmatrix
// prefetch of k-step kk+1; dQ between dV and dK, or last; the proxy fence by every lane; a
// per-element `visible ? 2^x : 0` (ptxas puts a branch around every MUFU.EX2).
//
// How to run: flashlab::cuda::fast_attention_backward(ref::Algorithm::bwd_atomic, problem, ...)
// (host vectors), fast_attention_backward_device(...) with a workspace of
// fast_attention_backward_workspace_bytes(design, problem) bytes, or
// `flashlab bench attention --pass bwd --bwd-design atomic`. Tests: tests/cuda/test_cuda_fast_bwd.cpp.
#include "attention/attention_bwd_tc.cuh"
#include "attention/bwd_band.cuh"
#include "attention/packed.cuh"
#include "core/warp_gemm.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace flashlab::cuda::detail {
namespace {

// ----------------------------------------------------------------------------- tile parameters
/// Tiles of the main kernel for head dim HEAD_DIM (64 or 128).
template <int HEAD_DIM>
struct AtomicTraits {
  static constexpr int kWarps = 8;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int BLOCK_M = HEAD_DIM == 64 ? 128 : 64;  // Br: streamed query rows per step
  static constexpr int BLOCK_N = 128;                         // Bc: resident keys per block
  static constexpr int kRowBytes = HEAD_DIM * 2;
  static constexpr int kTileQ = BLOCK_M * kRowBytes;    // one stage of Q_i (or dO_i)
  static constexpr int kTileK = BLOCK_N * kRowBytes;    // K_j (or V_j)
  static constexpr int kTileP = BLOCK_M * BLOCK_N * 2;  // P_ij (or dS_ij), 16-bit, [BLOCK_M][BLOCK_N]
  static constexpr int kTileL = 2 * BLOCK_M * 4;        // one stage of LSE_i and D_i (fp32)
  static constexpr int kSliceDq = 32 * 32 * 4;          // one warp's fp32 dQ partial (4 KiB)
  static constexpr int kSmem = 2 * kTileK + 2 * 2 * kTileQ + 2 * kTileP + 2 * kTileL + kWarps * kSliceDq;
  // Warp layouts. S/dP and dQ: kWM warps along the query rows (32 rows each) × kWN across
  // (keys for S/dP, d for dQ). dK/dV: 4 warps along the keys (32 each) × 2 along d.
  static constexpr int kWM = BLOCK_M / 32;
  static constexpr int kWN = kWarps / kWM;
  static constexpr int kSNT = BLOCK_N / kWN / 8;   // n8 tiles of keys per warp in S/dP
  static constexpr int kDkvNT = HEAD_DIM / 2 / 8;  // n8 tiles of d per warp in dK/dV (d/2 columns)
  static constexpr int kDqCols = HEAD_DIM / kWN;   // d columns per warp in dQ
  static constexpr int kDqNT = kDqCols / 8;
  static_assert(kWM * kWN == kWarps && kSNT % 2 == 0, "S/dP warp tile");
  static_assert(BLOCK_M * HEAD_DIM == kWarps * 1024 && kDqNT == 4, "dQ tile = 8 warps × 32 × 32 floats");
  static_assert(BLOCK_N % BLOCK_M == 0, "causal: a key block's first visible query tile starts at start_n");
  static_assert(kAtomicDqTileRows % BLOCK_M == 0, "the workspace holds whole dQ tiles of this BLOCK_M");
};

/// store_rows16's fp32 twin for the context-parallel ring (kAddF32): ADDS scale · acc into the
/// fp32 rows (this thread's rows warp_row0 + g, + 8 below N, columns 2t, 2t + 1 of each n-tile).
/// Every row of a key block belongs to that block alone, and the ring's calls on one stream run
/// in turn: the read-modify-write races with nothing.
template <int NT>
__device__ __forceinline__ void add_rows_f32(float* out_head, std::size_t stride, int warp_row0, int N,
                                             const float (&acc)[NT][4], float scale, int g, int t) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = warp_row0 + g + 8 * r;
    if (row < N) {
      float* out = out_head + std::size_t(row) * stride + 2 * t;
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        float2 v = *reinterpret_cast<const float2*>(out + 8 * n);
        v.x += acc[n][2 * r] * scale;
        v.y += acc[n][2 * r + 1] * scale;
        *reinterpret_cast<float2*>(out + 8 * n) = v;
      }
    }
  }
}

// ----------------------------------------------------------------------------- 2. main kernel
/// The main kernel's body (the kernels below: the dense one keeps its own parameters, so its code
/// is as it was; the packed one adds the prefix sums).
/// Grid (Tc = ceil(N / BLOCK_N), H, B) non-causal, (H, Tc, B) causal; 256 threads; kSmem bytes of
/// dynamic SRAM (layout in the file-top comment).
/// kGroup (its own instantiation): grouped K/V (H_kv < H) or N_k ≠ N. The block owns K/V head hk
/// (grid (Tc, H_kv, B) / (H_kv, Tc, B), Tc over the N_k keys) and loops over the H/H_kv query
/// heads of its group, each over its band's query tiles; the band (window_lo … window_hi, the
/// offset N_k − N folded in) masks causal, windows and neither alike.
/// kAddF32 (with kGroup, its own instantiation): dK, dV point to fp32 sums that dK_j, dV_j are
/// added into unrounded (add_rows_f32; BwdPointers::add_f32).
/// kPacked (with kGroup; Problem::packed()): grid (⌊total_k / BLOCK_N⌋ + B, H_kv, 1) non-causal,
/// (H_kv, ⌊total_k / BLOCK_N⌋ + B, 1) causal: each block one key tile of one sequence in the packed
/// numbering over the keys (packed_key_tile), with that sequence's lengths, rows and band; its
/// query tiles are the sequence's, numbered in the packed query numbering (packed.cuh) for dQaccum.
template <int HEAD_DIM, bool kBf16, bool kWindow, bool kGroup, bool kAddF32, bool kPacked>
__device__ __forceinline__ void fast_bwd_atomic_body(const Problem& p, const uint16_t* __restrict__ Q,
                                                     const uint16_t* __restrict__ K, const uint16_t* __restrict__ V,
                                                     const uint16_t* __restrict__ dO, const float* __restrict__ LSE,
                                                     const float* __restrict__ D, float* __restrict__ dQaccum,
                                                     uint16_t* __restrict__ dK, uint16_t* __restrict__ dV,
                                                     const PackedLists& lists) {
  using T = AtomicTraits<HEAD_DIM>;
  constexpr int BLOCK_M = T::BLOCK_M, BLOCK_N = T::BLOCK_N, kThreads = T::kThreads;
  constexpr int SNT = T::kSNT, kSCols = 8 * SNT;
  constexpr bool kBand = kWindow || kGroup;  // masks by the band (window_lo … window_hi)
  static_assert(!kPacked || kGroup, "packed sequences have their own key lengths");
  int N = p.seq;
  int Nk = kGroup ? p.seq_k : N;  // keys
  // h: the query head (kGroup: the K/V head hk, whose query heads are h0 … h0 + G − 1).
  const int j = p.causal ? blockIdx.y : blockIdx.x, h = p.causal ? blockIdx.x : blockIdx.y;
  int b = blockIdx.z;
  int start_n = j * BLOCK_N;
  const std::size_t stride = p.row_stride();
  std::size_t base = p.head_offset(b, h), stat = p.stat_offset(b, h);
  const std::size_t kv_stride = kGroup ? p.kv_row_stride() : stride;
  std::size_t kv_base = kGroup ? p.kv_head_offset(b, h) : base;
  int q_start = 0;   // packed: the sequence's first row of Q, O, dO, dQ and LSE, D
  int q_tile0 = 0;   // packed: its first query tile in the packed numbering (dQaccum)
  int offset = kGroup ? p.causal_offset() : 0;  // N_k − N
  if constexpr (kPacked) {
    // Packed sequences: key tile j of the numbering over the keys is key tile start_n / BLOCK_N of
    // sequence pt.b; N, N_k, the band's offset and the rows are that sequence's. The loads stop at
    // the sequence's own last row (zero-filled past it), so no row of the next sequence reaches SRAM.
    const PackedTile pt = packed_key_tile(p, lists, j, BLOCK_N);
    if (pt.row0 >= pt.len_k) return;  // past the sequence's last key: at most one tile per sequence
    b = pt.b;
    N = pt.len_q;
    Nk = pt.len_k;
    start_n = pt.row0;
    q_start = pt.q_start;
    q_tile0 = pt.q_start / BLOCK_M + pt.b;
    kv_base = key_rows(p, true, b, pt.k_start, h);
    offset = Nk - N;
  }
  // Q, O, dO rows and LSE, D rows of query head hq: [B, N, H, d] and [B, H, N]; packed
  // [1, total_q, H, d] and [1, H, total_q] from the sequence's first row (bwd_band.cuh).
  auto q_head = [&](int hq) { return query_rows(p, kPacked, b, q_start, hq); };
  auto q_stat = [&](int hq) { return query_stats(p, kPacked, b, q_start, hq); };
  const int G = kGroup ? p.heads / p.heads_kv : 1, h0 = kGroup ? h * G : h;
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
  const uint32_t sDq = sL + 2 * T::kTileL;  // + warp · kSliceDq: the warps' fp32 dQ partials

  // Causal: query tiles that end before this key block starts see none of it.
  int i_begin = p.causal ? start_n / BLOCK_M : 0;
  const int Tr = (N + BLOCK_M - 1) / BLOCK_M;
  // A window: keys start_n … key_last are seen by queries key − hi … key − lo (clamped to the
  // queries). With N_k = N each key sees its own query (lo ≤ 0 ≤ hi): never an empty range; with
  // N_k ≠ N it may be (the loop then runs no step, and dK_j = dV_j = 0 are written).
  int i_end = Tr;
  const int lo = kBand ? (kPacked ? p.window_lo(offset) : p.window_lo()) : 0;
  const int hi = kBand ? (kPacked ? p.window_hi(offset) : p.window_hi()) : 0;
  if constexpr (kBand) {
    const TileRange r = band_query_tiles(start_n, min(start_n + BLOCK_N, Nk) - 1, N, lo, hi, BLOCK_M);
    i_begin = r.begin;
    i_end = r.end;
  }

  // LSE_i, D_i (2·BLOCK_M floats) of the head at `head_stat`: HBM → SRAM, 4-byte cp.async; rows ≥ N zero-filled.
  auto load_stats_async = [&](uint32_t dst, int row0, std::size_t head_stat) {
    if (int(threadIdx.x) < 2 * BLOCK_M) {
      const int r = int(threadIdx.x) % BLOCK_M, row = row0 + r;
      const float* src = (int(threadIdx.x) < BLOCK_M ? LSE : D) + head_stat + (row < N ? row : 0);
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst + 4 * uint32_t(threadIdx.x)),
                   "l"(src), "r"(row < N ? 4 : 0));
    }
  };

  // Load K_j, V_j, Q_first, dO_first, LSE_first, D_first: HBM → SRAM (one cp.async group).
  // kGroup: the first query head of the group (h0).
  const std::size_t base0 = kGroup ? q_head(h0) : base, stat0 = kGroup ? q_stat(h0) : stat;
  load_tile_async<HEAD_DIM, BLOCK_N, kThreads>(sK, K + kv_base, kv_stride, start_n, Nk);
  load_tile_async<HEAD_DIM, BLOCK_N, kThreads>(sV, V + kv_base, kv_stride, start_n, Nk);
  load_tile_async<HEAD_DIM, BLOCK_M, kThreads>(sQ, Q + base0, stride, i_begin * BLOCK_M, N);
  load_tile_async<HEAD_DIM, BLOCK_M, kThreads>(sdO, dO + base0, stride, i_begin * BLOCK_M, N);
  load_stats_async(sL, i_begin * BLOCK_M, stat0);
  cp_async_commit();

  // dK_j, dV_j accumulators: keys [32·wk, 32·wk + 32) × columns [wd·d/2, wd·d/2 + d/2).
  float acc_dk[2][T::kDkvNT][4], acc_dv[2][T::kDkvNT][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int n = 0; n < T::kDkvNT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_dk[mt][n][e] = acc_dv[mt][n][e] = 0.f;

  // dQaccum_i += dS_ij K_j: this warp's 32 query rows × 32 columns, computed in registers, staged
  // in the warp's SRAM slice in mma C-fragment order and added into tile i of the TILED dQaccum by
  // one 4 KiB bulk reduction (the hand-off and its ordering: file-top comment).
  auto dq_step = [&](int row0, int hq) {
    float dq[2][T::kDqNT][4];
    warp_gemm_xb<HEAD_DIM, BLOCK_N, T::kDqNT, kBf16>(dq, sdS, 32 * wm, sK, wn * T::kDqCols, lane);
    const uint32_t sW = sDq + uint32_t(warp) * uint32_t(T::kSliceDq);
    if (lane == 0) bulk_wait_group_read<0>();  // the bulk read of step i−1 is done with the slice
    __syncwarp();
    // float4 number 32·(mt·kDqNT + n) + lane = dq[mt][n][0..3]: 512 contiguous bytes per store.
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int n = 0; n < T::kDqNT; ++n)
        asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(
                         sW + uint32_t(((mt * T::kDqNT + n) * 32 + lane) * 16)),
                     "f"(dq[mt][n][0]), "f"(dq[mt][n][1]), "f"(dq[mt][n][2]), "f"(dq[mt][n][3]));
    __syncwarp();  // every lane's generic-proxy stores before lane 0's proxy fence
    if (lane == 0) {
      fence_proxy_async_shared();  // ... before the async-proxy read of the bulk reduction
      // Packed: tile q_tile0 + i of head hq in the packed query numbering (Tq tiles per head).
      const std::size_t tile =
          kPacked ? std::size_t(hq) * std::size_t(p.total_q / BLOCK_M + p.batch) + std::size_t(q_tile0 + row0 / BLOCK_M)
                  : (std::size_t(b) * p.heads + hq) * std::size_t(Tr) + std::size_t(row0 / BLOCK_M);
      bulk_reduce_add_f32(dQaccum + tile * (BLOCK_M * HEAD_DIM) + 1024 * warp, sW, uint32_t(T::kSliceDq));
      bulk_commit_group();
    }
  };

  // Steps: query head h0 + gh (gh < G; one head unless kGroup) × query tile i, heads outer, so the
  // key blocks of one group running together read the same Q_i, dO_i from L2.
  int n = 0;  // kGroup: the step's number over the whole group (its stage parity)
  for (int gh = 0; gh < G; ++gh)
  for (int i = i_begin; i < i_end; ++i) {
    const int row0 = i * BLOCK_M;
    const int hq = h0 + gh;
    const std::size_t qbase = kGroup ? q_head(hq) : base, qstat = kGroup ? q_stat(hq) : stat;
    const int st = kGroup ? n++ & 1 : (i - i_begin) & 1;
    const uint32_t stage = uint32_t(st * T::kTileQ);
    cp_async_wait<0>();  // this thread's copies of Q_i, dO_i, LSE_i, D_i (and K_j, V_j) have landed
    // All copies visible to all warps; every warp has finished step i−1, so the other stage, P
    // and dS may be overwritten below.
    __syncthreads();
    // Load Q_{i+1}, dO_{i+1}, LSE_{i+1}, D_{i+1}: HBM → SRAM into the other stage, while step i computes.
    // kGroup: after a head's last tile, the next head's first.
    if (i + 1 < i_end) {
      const uint32_t next = uint32_t((st ^ 1) * T::kTileQ);
      load_tile_async<HEAD_DIM, BLOCK_M, kThreads>(sQ + next, Q + qbase, stride, row0 + BLOCK_M, N);
      load_tile_async<HEAD_DIM, BLOCK_M, kThreads>(sdO + next, dO + qbase, stride, row0 + BLOCK_M, N);
      load_stats_async(sL + uint32_t((st ^ 1) * T::kTileL), row0 + BLOCK_M, qstat);
    } else if (kGroup && gh + 1 < G) {
      const uint32_t next = uint32_t((st ^ 1) * T::kTileQ);
      const std::size_t nbase = q_head(hq + 1);
      load_tile_async<HEAD_DIM, BLOCK_M, kThreads>(sQ + next, Q + nbase, stride, i_begin * BLOCK_M, N);
      load_tile_async<HEAD_DIM, BLOCK_M, kThreads>(sdO + next, dO + nbase, stride, i_begin * BLOCK_M, N);
      load_stats_async(sL + uint32_t((st ^ 1) * T::kTileL), i_begin * BLOCK_M, q_stat(hq + 1));
    }
    cp_async_commit();

    // ---- S_ij = Q_i K_jᵀ, dP_ij = dO_i V_jᵀ: this warp's 32 query rows × kSCols keys (fp32).
    {
      // A window: the block's keys not all inside every row's band (the last row's left edge past
      // the first key, or the first row's right edge before the last key).
      const bool need_mask = row0 + BLOCK_M > N || start_n + BLOCK_N > Nk ||
                             (!kBand && p.causal && start_n + BLOCK_N - 1 > row0) ||
                             (kBand && (row0 + BLOCK_M - 1 + lo > start_n || start_n + BLOCK_N - 1 > row0 + hi));
      float lse[2][2], Di[2][2];  // LSE_i, D_i of rows g, g + 8 of each m16 tile (SRAM → registers)
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int lrow = 32 * wm + 16 * mt + g + 8 * r;
          const uint32_t a = sL + uint32_t(st * T::kTileL) + 4 * uint32_t(lrow);
          asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(lse[mt][r]) : "r"(a));
          asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(Di[mt][r]) : "r"(a + 4 * BLOCK_M));
        }
      float s[2][SNT][4], dp[2][SNT][4];
      warp_gemm_abt<HEAD_DIM, SNT, kBf16>(s, sQ + stage, 32 * wm, sK, wn * kSCols, lane);
      warp_gemm_abt<HEAD_DIM, SNT, kBf16>(dp, sdO + stage, 32 * wm, sV, wn * kSCols, lane);
      // P_ij = 2^(S·scale·log2 e − LSE_i), dS_ij = P_ij ∘ (dP_ij − D_i) in fp32, each rounded once
      // to 16 bits and written to SRAM ([query][key], swizzled, 4-byte stores: 8 rows × 16 B per
      // instruction hit 32 distinct banks thanks to the XOR swizzle). Two copies of this loop, one
      // uniform branch per step: tiles with no masked entry (all of them but the last row/column
      // of tiles and, causal, the diagonal) run it without any per-element test. In the masked
      // copy 2^x is computed for every entry and masked entries are then SELECTED to 0 (a
      // masked 2^x may be +inf; it is discarded, never multiplied: no Inf·0 → NaN). A per-element
      // `visible ? 2^x : 0` instead compiles to a branch around every MUFU.EX2 (measured slower).
      auto write_p_ds = [&](auto masked) {
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int n = 0; n < SNT; ++n) {
              float p0 = ex2(fmaf(s[mt][n][2 * r], p.scale_log2, -lse[mt][r]));
              float p1 = ex2(fmaf(s[mt][n][2 * r + 1], p.scale_log2, -lse[mt][r]));
              const int lrow = 32 * wm + 16 * mt + g + 8 * r, lcol = wn * kSCols + 8 * n + 2 * t;
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
                           "r"(pack2<kBf16>(p0 * (dp[mt][n][2 * r] - Di[mt][r]), p1 * (dp[mt][n][2 * r + 1] - Di[mt][r]))));
            }
      };
      if (need_mask) write_p_ds(std::true_type{});
      else write_p_ds(std::false_type{});
    }
    __syncthreads();  // P_ij, dS_ij complete: the products below read other warps' rows and columns

    // ---- dQaccum_i += dS_ij K_j first: its bulk reduction runs under the dK/dV products.
    dq_step(row0, hq);
    // ---- dV_j += P_ijᵀ dO_i, dK_j += dS_ijᵀ Q_i (this warp: 32 keys × d/2 columns of each).
    warp_gemm_xtb<HEAD_DIM, BLOCK_M, BLOCK_N, T::kDkvNT, kBf16>(acc_dv, sP, 32 * wk, sdO + stage,
                                                                wd * (HEAD_DIM / 2), lane);
    warp_gemm_xtb<HEAD_DIM, BLOCK_M, BLOCK_N, T::kDkvNT, kBf16>(acc_dk, sdS, 32 * wk, sQ + stage,
                                                                wd * (HEAD_DIM / 2), lane);
  }
  cp_async_wait<0>();  // no copy may still be writing SRAM when the block exits (empty groups)
  // Bulk dQ reductions still reading this block's SRAM or not yet performed in L2 must finish
  // before the block exits (its SRAM is then released).
  bulk_wait_group<0>();

  // dK_j = scale · acc_dk, dV_j = acc_dv: registers → HBM, once.
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
    const int key0 = start_n + 32 * wk + 16 * mt;
    if constexpr (kAddF32) {
      add_rows_f32<T::kDkvNT>(reinterpret_cast<float*>(dK) + kv_base + wd * (HEAD_DIM / 2), kv_stride, key0, Nk,
                              acc_dk[mt], p.scale, g, t);
      add_rows_f32<T::kDkvNT>(reinterpret_cast<float*>(dV) + kv_base + wd * (HEAD_DIM / 2), kv_stride, key0, Nk,
                              acc_dv[mt], 1.f, g, t);
    } else {
      store_rows16<T::kDkvNT, kBf16>(dK + kv_base + wd * (HEAD_DIM / 2), kv_stride, key0, Nk, acc_dk[mt], p.scale, g, t);
      store_rows16<T::kDkvNT, kBf16>(dV + kv_base + wd * (HEAD_DIM / 2), kv_stride, key0, Nk, acc_dv[mt], 1.f, g, t);
    }
  }
}

/// The main kernel, dense (fast_bwd_atomic_body; its grid there).
template <int HEAD_DIM, bool kBf16, bool kWindow = false, bool kGroup = false, bool kAddF32 = false>
__global__ void __launch_bounds__(AtomicTraits<HEAD_DIM>::kThreads, 1)
    fast_bwd_atomic_kernel(Problem p, const uint16_t* __restrict__ Q, const uint16_t* __restrict__ K,
                           const uint16_t* __restrict__ V, const uint16_t* __restrict__ dO,
                           const float* __restrict__ LSE, const float* __restrict__ D, float* __restrict__ dQaccum,
                           uint16_t* __restrict__ dK, uint16_t* __restrict__ dV) {
  fast_bwd_atomic_body<HEAD_DIM, kBf16, kWindow, kGroup, kAddF32, false>(p, Q, K, V, dO, LSE, D, dQaccum, dK, dV, {});
}

/// The main kernel over packed sequences (Problem::packed(); the kGroup body with kPacked, its grid
/// in fast_bwd_atomic_body): the prefix sums a parameter of their own after the others.
template <int HEAD_DIM, bool kBf16>
__global__ void __launch_bounds__(AtomicTraits<HEAD_DIM>::kThreads, 1)
    fast_bwd_atomic_packed_kernel(Problem p, const uint16_t* __restrict__ Q, const uint16_t* __restrict__ K,
                                  const uint16_t* __restrict__ V, const uint16_t* __restrict__ dO,
                                  const float* __restrict__ LSE, const float* __restrict__ D,
                                  float* __restrict__ dQaccum, uint16_t* __restrict__ dK, uint16_t* __restrict__ dV,
                                  PackedLists lists) {
  fast_bwd_atomic_body<HEAD_DIM, kBf16, false, true, false, true>(p, Q, K, V, dO, LSE, D, dQaccum, dK, dV, lists);
}

// ----------------------------------------------------------------------------- 3. dQ convert
/// The accumulator's order for the shared convert (attention_bwd_tc.cuh, launch_dq_convert): tile
/// (b, h, i) of BLOCK_M·d floats; warp w: 1024 floats; float4 number 32·(mt·4 + n) + lane holds
/// columns c, c + 1 of rows r and r + 8.
template <int HEAD_DIM>
struct AtomicDqLayout {
  using T = AtomicTraits<HEAD_DIM>;
  static constexpr int BLOCK_M = T::BLOCK_M;
  static constexpr int kHeadDim = HEAD_DIM;
  static_assert(BLOCK_M * HEAD_DIM == 8192, "2048 float4s a tile: 8 warps of 8 fragments of 32 lanes");
  __device__ static void place(int k, int& row, int& col) {
    const int lane = k & 31, frag = (k >> 5) & 7, warp = (k >> 8) & 7;
    const int mt = frag / T::kDqNT, n = frag % T::kDqNT, g = lane >> 2, t = lane & 3;
    const int wm = warp / T::kWN, wn = warp % T::kWN;
    row = 32 * wm + 16 * mt + g;
    col = wn * T::kDqCols + 8 * n + 2 * t;
  }
};

/// The atomic design over packed sequences (Problem::packed()): D over the total_q rows as one
/// sequence, the packed main kernel, the packed convert.
template <int HEAD_DIM, bool kBf16>
void launch_atomic_packed(const Problem& p, const BwdPointers& a, cudaStream_t stream, const PackedLists& lists) {
  using T = AtomicTraits<HEAD_DIM>;
  if (a.add_f32)  // the fp32 sums are the context-parallel ring's, which takes dense batches
    throw_cuda_error(cudaErrorInvalidValue, "atomic backward, fp32 sums: no packed sequences", __FILE__, __LINE__);
  auto kernel = &fast_bwd_atomic_packed_kernel<HEAD_DIM, kBf16>;
  set_smem(reinterpret_cast<const void*>(kernel), T::kSmem, "fast_bwd_atomic_packed_kernel", p);
  // Tq whole tiles per head in the packed query numbering (the workspace holds
  // H·(total_q + B·kAtomicDqTileRows)·d floats, at least this for either BLOCK_M).
  const std::size_t acc_numel =
      std::size_t(p.heads) * std::size_t(p.total_q / T::BLOCK_M + p.batch) * T::BLOCK_M * HEAD_DIM;
  // D_i = rowsum(dO_i ∘ O_i) per row and head does not depend on the sequences: the packed
  // [1, total_q, H, d] rows are one sequence of total_q rows, D [1, H, total_q] as LSE. The same
  // launch zeroes the accumulator (only ever added into).
  Problem rows = p;
  rows.batch = 1;
  rows.seq = p.total_q;
  launch_fast_bwd_preprocess<HEAD_DIM, kBf16>(rows, a, stream, a.dQaccum, acc_numel);

  announce("fast_bwd_atomic_packed_kernel");
  const unsigned tiles = unsigned(p.total_k / T::BLOCK_N + p.batch);
  const dim3 grid = p.causal ? dim3(p.heads_kv, tiles, 1) : dim3(tiles, p.heads_kv, 1);
  kernel<<<grid, T::kThreads, T::kSmem, stream>>>(
      p.with_tiles(T::BLOCK_M, T::BLOCK_N), static_cast<const uint16_t*>(a.Q), static_cast<const uint16_t*>(a.K),
      static_cast<const uint16_t*>(a.V), static_cast<const uint16_t*>(a.dO), a.LSE, a.D, a.dQaccum,
      static_cast<uint16_t*>(a.dK), static_cast<uint16_t*>(a.dV), lists);
  FLASHLAB_CUDA_CHECK_LAUNCH("fast_bwd_atomic_packed_kernel");

  launch_dq_convert<AtomicDqLayout<HEAD_DIM>, kBf16>(p, a, stream, &lists);
}

template <int HEAD_DIM, bool kBf16>
void launch_atomic(const Problem& p, const BwdPointers& a, cudaStream_t stream) {
  using T = AtomicTraits<HEAD_DIM>;
  // A window, and grouped K/V or N_k ≠ N (with or without a window): instantiations of their own
  // (causal folded into the band by make_problem). Sums in fp32 (a.add_f32): the grouped kernel,
  // which takes any H_kv and N_k, adding its dK, dV.
  const bool grouped = p.heads_kv != p.heads || p.seq_k != p.seq;
  if (a.add_f32 && p.windowed())
    throw_cuda_error(cudaErrorInvalidValue, "atomic backward, fp32 sums: no window", __FILE__, __LINE__);
  auto kernel = a.add_f32      ? &fast_bwd_atomic_kernel<HEAD_DIM, kBf16, false, true, true>
                : grouped      ? &fast_bwd_atomic_kernel<HEAD_DIM, kBf16, false, true>
                : p.windowed() ? &fast_bwd_atomic_kernel<HEAD_DIM, kBf16, true>
                               : &fast_bwd_atomic_kernel<HEAD_DIM, kBf16>;
  // > 48 KiB of dynamic SRAM: opted in per device (the record is kept, thread-safe: common.hpp).
  set_smem(reinterpret_cast<const void*>(kernel), T::kSmem, "fast_bwd_atomic_kernel", p);
  // Tiled layout: Tr whole tiles per (b, h), the last one padded (the workspace holds
  // B·H·ceil(N / kAtomicDqTileRows)·kAtomicDqTileRows·d floats, enough for this BLOCK_M).
  const std::size_t acc_numel =
      std::size_t(p.batch) * p.heads * ((p.seq + T::BLOCK_M - 1) / T::BLOCK_M) * T::BLOCK_M * HEAD_DIM;
  // D, and dQaccum = 0 (the kernel only ever adds into it), in one launch.
  launch_fast_bwd_preprocess<HEAD_DIM, kBf16>(p, a, stream, a.dQaccum, acc_numel);

  announce("fast_bwd_atomic_kernel");
  // One block per key tile of each K/V head (grouped: its query heads loop inside the block).
  const unsigned tc = unsigned((p.seq_k + T::BLOCK_N - 1) / T::BLOCK_N);
  const dim3 grid = p.causal ? dim3(p.heads_kv, tc, p.batch) : dim3(tc, p.heads_kv, p.batch);  // see the kernel
  kernel<<<grid, T::kThreads, T::kSmem, stream>>>(
      p.with_tiles(T::BLOCK_M, T::BLOCK_N), static_cast<const uint16_t*>(a.Q), static_cast<const uint16_t*>(a.K),
      static_cast<const uint16_t*>(a.V), static_cast<const uint16_t*>(a.dO), a.LSE, a.D, a.dQaccum, static_cast<uint16_t*>(a.dK),
      static_cast<uint16_t*>(a.dV));
  FLASHLAB_CUDA_CHECK_LAUNCH("fast_bwd_atomic_kernel");

  launch_dq_convert<AtomicDqLayout<HEAD_DIM>, kBf16>(p, a, stream);
}

}  // namespace

void launch_fast_bwd_atomic(const Problem& p, bool bf16, const BwdPointers& a, cudaStream_t stream,
                            const PackedLists& lists) {
  if (p.packed()) {
    if (p.head_dim == 64) {
      if (bf16) launch_atomic_packed<64, true>(p, a, stream, lists);
      else launch_atomic_packed<64, false>(p, a, stream, lists);
    } else {
      if (bf16) launch_atomic_packed<128, true>(p, a, stream, lists);
      else launch_atomic_packed<128, false>(p, a, stream, lists);
    }
    return;
  }
  if (p.head_dim == 64) {
    if (bf16) launch_atomic<64, true>(p, a, stream);
    else launch_atomic<64, false>(p, a, stream);
  } else {
    if (bf16) launch_atomic<128, true>(p, a, stream);
    else launch_atomic<128, false>(p, a, stream);
  }
}

}  // namespace flashlab::cuda::detail
