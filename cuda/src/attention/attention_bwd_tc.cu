// attention_bwd_tc.cu — fast FlashAttention backward on tensor cores, two-kernel design (its host
// API, with the atomic design's, is the attention front door: front_door.cpp). The atomic
// design (one kernel per K_j/V_j block, dQ by fp32 atomics; faster, the default) is in
// attention_bwd_tc_atomic.cu; the pieces both use (D preprocessing kernel, tile loader, stores)
// are in attention_bwd_tc.cuh.
//
// What it does: the algorithm, loop order and names of the clear fp32 backward
// (attention_bwd.cu, the Triton walkthrough "Backward Pass"), with bf16 or fp16 inputs and the matrix products
// done by `mma.sync.aligned.m16n8k16` (fp32 accumulation), as in attention_fwd_tc.cu:
//   1. fast_bwd_preprocess_kernel  D_i = rowsum(dO_i ∘ O_i) in fp32           (the O(N·d) D trick)
//   2. fast_bwd_dq_kernel          one block per Q_i (Q_i, dO_i resident), loop over K_j, V_j:
//                                  dQ_i = scale · Σ_j dS_ij K_j
//   3. fast_bwd_dkdv_kernel        one block per K_j, V_j (resident), loop over Q_i, dO_i:
//                                  dV_j = Σ_i P_ijᵀ dO_i,  dK_j = scale · Σ_i dS_ijᵀ Q_i
// with, recomputed in registers from the forward's base-2 LSE (the Triton walkthrough):
//   S_ij  = Q_i K_jᵀ (raw),  P_ij = 2^(S_ij · scale·log2 e − LSE_i)  (masked → P = 0, the NaN hazard),
//   dP_ij = dO_i V_jᵀ,       dS_ij = P_ij ∘ (dP_ij − D_i)   (the scale is applied once, at the store).
//
// Tiles (both head dims, 4 warps per block, each warp owns 16 resident rows for the whole loop):
//   dQ kernel:   BLOCK_M = Br = 64 resident query rows, BLOCK_N = Bc = 64 streamed key rows.
//   dK/dV kernel: BLOCK_N = Bc = 64 resident key rows, BLOCK_M = Br = 64 (d = 64) or 32 (d = 128)
//                streamed query rows (32 at d = 128 keeps S, dP and the two 16×128 fp32
//                accumulators dK_j, dV_j of a warp in 255 registers).
// Data movement: the resident tiles HBM → SRAM once (cp.async); the streamed tiles HBM → SRAM with
// cp.async in two stages (tile t+1 in flight while tile t computes; one __syncthreads() per
// step). SRAM tiles are XOR-swizzled in 16-byte chunks like the forward's. mma A fragments of the
// resident tiles are re-read from SRAM (ldmatrix) at every step (registers go to the
// accumulators). S, P, dP and dS live in registers only (mma C fragments); P and dS are rounded to
// 16 bits in registers and used directly as the A fragments of the next products — the dK/dV
// kernel computes the transposed tiles S_ijᵀ = K_j Q_iᵀ and dP_ijᵀ = V_j dO_iᵀ, so Pᵀ and dSᵀ come
// out in the A layout with no shuffle. LSE_i and D_i are read per thread from HBM/L1 (tiny).
// Masks: keys ≥ N and, causal, keys > query row → P = 0 (selected, not 2^(−inf), so no Inf·0);
// in the dK/dV kernel query rows ≥ N are masked too. Out-of-sequence rows are zero-filled by
// cp.async (src-size 0), so no stale SRAM reaches an mma. Causal: fully masked tiles are never
// loaded (dQ: key tiles right of the block's last row; dK/dV: query tiles above the block's first
// key), and a warp whose rows see none of a tile skips its math.
// It never produces S, P, dP or dS outside registers. dQ, dK, dV are written once in the input
// dtype (fp32 accumulators scaled then rounded); D in fp32.
//
// How to run (front_door.cpp): fast_attention_backward(ref::Algorithm::bwd_two_kernel, problem, Q,
// K, V, O, dO, LSE) (host vectors; O and LSE from fast_attention_forward) or
// fast_attention_backward_device(...) on device pointers (workspace: D only); `flashlab bench
// attention --pass bwd --bwd-design two-kernel` times it. Tests: tests/cuda/test_cuda_fast_bwd.cpp
// ([fast-bwd], both designs).
//
// Why it is slower than the atomic design: it is the straightforward version, written for
// correctness and kept as the bit-reproducible design: no registers kept for Q_i/dO_i (K_j/V_j)
// fragments, one m16 tile per warp (every B fragment read from SRAM feeds one mma), LSE/D re-read
// per step, tiles not tuned, and S and dP computed twice. The dQ and dK/dV kernels need close to
// 255 registers, so at most 2 blocks (8 warps) run per SM, few to hide the ldmatrix traffic.
#include "attention/attention_bwd_tc.cuh"
#include "attention/bwd_band.cuh"
#include "core/common.hpp"
#include "core/tensor_core.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace flashlab::cuda::detail {
namespace {

// ----------------------------------------------------------------------------- tile parameters
template <int HEAD_DIM>
struct BwdTraits {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kRowBytes = HEAD_DIM * 2;  // one 16-bit row in SRAM
  // dQ kernel: Q_i, dO_i resident (16 rows per warp), K_j, V_j streamed.
  static constexpr int kDqBlockM = 16 * kWarps;
  static constexpr int kDqBlockN = 64;
  static constexpr int kDqSmem = 2 * kDqBlockM * kRowBytes + 2 * 2 * kDqBlockN * kRowBytes;
  // dK/dV kernel: K_j, V_j resident (16 rows per warp), Q_i, dO_i streamed.
  static constexpr int kKvBlockN = 16 * kWarps;
  static constexpr int kKvBlockM = HEAD_DIM == 128 ? 32 : 64;
  static constexpr int kKvSmem = 2 * kKvBlockN * kRowBytes + 2 * 2 * kKvBlockM * kRowBytes;
};

// ----------------------------------------------------------------------------- warp-level products
/// c (16 × NS, fp32 C fragments) = A Bᵀ over k = HEAD_DIM: A = rows [a_row0, a_row0 + 16) of the
/// SRAM tile sA ([rows][HEAD_DIM]), B = the SRAM tile sB ([NS][HEAD_DIM], i.e. n-major). Used for
/// S = Q Kᵀ, dP = dO Vᵀ and their transposes K Qᵀ, V dOᵀ.
template <int HEAD_DIM, int NS, bool kBf16>
__device__ __forceinline__ void warp_gemm_abt(float (&c)[NS / 8][4], uint32_t sA, int a_row0, uint32_t sB,
                                              int lane) {
#pragma unroll
  for (int n = 0; n < NS / 8; ++n) c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
    uint32_t a[4];  // A fragment of this k-step: SRAM → registers
    ldsm_x4(sA + swz<HEAD_DIM>(a_row0 + (lane & 15), 2 * kk + (lane >> 4)), a[0], a[1], a[2], a[3]);
#pragma unroll
    for (int np = 0; np < NS / 16; ++np) {
      const int mi = lane >> 3;
      const int row = 16 * np + (lane & 7) + ((mi >> 1) << 3);
      uint32_t b0, b1, b2, b3;
      ldsm_x4(sB + swz<HEAD_DIM>(row, 2 * kk + (mi & 1)), b0, b1, b2, b3);
      mma16816<kBf16>(c[2 * np], a, b0, b1);
      mma16816<kBf16>(c[2 * np + 1], a, b2, b3);
    }
  }
}

/// acc (16 × HEAD_DIM, fp32) += X B over k = NS: X is a 16 × NS fp32 C-fragment tile held in
/// registers (P, dS or their transposes), rounded to 16 bits here and used as the A fragment (the
/// C layout of two n8 tiles is the A layout of one k16 step); B = the SRAM tile sB ([NS][HEAD_DIM],
/// k-major) read with ldmatrix.trans. Used for dQ += dS K, dV += Pᵀ dO, dK += dSᵀ Q.
template <int HEAD_DIM, int NS, bool kBf16>
__device__ __forceinline__ void warp_gemm_xb(float (&acc)[HEAD_DIM / 8][4], const float (&x)[NS / 8][4],
                                             uint32_t sB, int lane) {
#pragma unroll
  for (int kk = 0; kk < NS / 16; ++kk) {
    uint32_t a[4];
    a[0] = pack2<kBf16>(x[2 * kk][0], x[2 * kk][1]);
    a[1] = pack2<kBf16>(x[2 * kk][2], x[2 * kk][3]);
    a[2] = pack2<kBf16>(x[2 * kk + 1][0], x[2 * kk + 1][1]);
    a[3] = pack2<kBf16>(x[2 * kk + 1][2], x[2 * kk + 1][3]);
#pragma unroll
    for (int np = 0; np < HEAD_DIM / 16; ++np) {
      const int mi = lane >> 3;
      const int row = 16 * kk + (lane & 7) + ((mi & 1) << 3);
      uint32_t b0, b1, b2, b3;
      ldsm_x4_trans(sB + swz<HEAD_DIM>(row, 2 * np + (mi >> 1)), b0, b1, b2, b3);
      mma16816<kBf16>(acc[2 * np], a, b0, b1);
      mma16816<kBf16>(acc[2 * np + 1], a, b2, b3);
    }
  }
}

// ----------------------------------------------------------------------------- 1. D preprocessing
// fast_bwd_preprocess_kernel, shared with the atomic design: attention_bwd_tc.cuh.

// ----------------------------------------------------------------------------- 2. dQ kernel
/// Grid (Tr, H, B), 128 threads, kDqSmem bytes of dynamic SRAM:
/// [Q_i: BLOCK_M × d][dO_i: BLOCK_M × d][K_j: 2 × BLOCK_N × d][V_j: 2 × BLOCK_N × d], all swizzled.
/// kBand (its own instantiation): grouped K/V, N_k ≠ N or a window. K_j, V_j are then read from K/V
/// head h / (H / H_kv) ([B, N_k, H_kv, d]), the key tiles are those of the band (bwd_band.cuh) and
/// the band masks causal, windows and keys ≥ N_k alike.
/// kPacked (with kBand; Problem::packed()): grid (⌊total_q / BLOCK_M⌋ + B, H, 1), block x the query
/// tile of packed.cuh's numbering; N, N_k, the band's offset len_k − len_q and the rows are that
/// sequence's, its rows of Q, dO, dQ, LSE, D from its first query, of K, V from its first key.
template <int HEAD_DIM, bool kBf16, bool kBand = false, bool kPacked = false>
__global__ void __launch_bounds__(BwdTraits<HEAD_DIM>::kThreads)
    fast_bwd_dq_kernel(Problem p, const uint16_t* __restrict__ Q, const uint16_t* __restrict__ K,
                       const uint16_t* __restrict__ V, const uint16_t* __restrict__ dO,
                       const float* __restrict__ LSE, const float* __restrict__ D, uint16_t* __restrict__ dQ,
                       PackedLists lists) {
  using T = BwdTraits<HEAD_DIM>;
  constexpr int BLOCK_M = T::kDqBlockM, BLOCK_N = T::kDqBlockN;
  constexpr int kTileK = BLOCK_N * T::kRowBytes;
  static_assert(!kPacked || kBand, "packed sequences have their own key lengths and band");
  int N = p.seq;
  // Causal: the bottom query tiles see the most keys; launch them first.
  const int i = p.causal && !kPacked ? int(gridDim.x) - 1 - int(blockIdx.x) : int(blockIdx.x);
  const int h = blockIdx.y, b = blockIdx.z;
  int row0 = i * BLOCK_M;
  const std::size_t stride = p.row_stride();
  std::size_t base = p.head_offset(b, h), stat = p.stat_offset(b, h);
  // kBand: the keys' own length, layout and head (grouped K/V: h / (H / H_kv)); the band's edges.
  int Nk = kBand ? p.seq_k : N;
  const std::size_t kv_stride = kBand ? p.kv_row_stride() : stride;
  std::size_t kv_base = kBand ? p.kv_head_offset(b, p.kv_head(h)) : base;
  int lo = kBand ? p.window_lo() : 0, hi = kBand ? p.window_hi() : 0;
  if constexpr (kPacked) {  // the sequence of query tile i of the packed numbering, its rows and band
    const PackedTile pt = packed_tile(p, lists, i, BLOCK_M);
    if (pt.row0 >= pt.len_q) return;  // past the sequence's last query: at most one tile per sequence
    N = pt.len_q, Nk = pt.len_k, row0 = pt.row0;
    base = query_rows(p, true, 0, pt.q_start, h), stat = query_stats(p, true, 0, pt.q_start, h);
    kv_base = key_rows(p, true, 0, pt.k_start, p.kv_head(h));
    lo = p.window_lo(Nk - N), hi = p.window_hi(Nk - N);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, t = lane & 3;  // mma fragment coordinates
  const int warp_m0 = 16 * warp, warp_row0 = row0 + warp_m0;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t sQ = uint32_t(__cvta_generic_to_shared(smem_raw));
  const uint32_t sdO = sQ + BLOCK_M * T::kRowBytes;
  const uint32_t sK = sdO + BLOCK_M * T::kRowBytes;  // + stage · kTileK
  const uint32_t sV = sK + 2 * kTileK;               // + stage · kTileK

  // Causal: key tiles starting past this tile's last query row are entirely masked — skip them.
  // kBand: the key tiles j_begin … j_end − 1 of the band; none when no row sees a key (the loop
  // runs no step and the rows get dQ = 0).
  int j_begin = 0, j_end;
  if constexpr (kBand) {
    const TileRange r = band_key_tiles(row0, min(N, row0 + BLOCK_M) - 1, Nk, lo, hi, BLOCK_N);
    j_begin = r.begin;
    j_end = r.end;
  } else {
    const int n_end = p.causal ? min(N, row0 + BLOCK_M) : N;
    j_end = (n_end + BLOCK_N - 1) / BLOCK_N;
  }

  // Load Q_i, dO_i, K_first, V_first: HBM → SRAM (one cp.async group).
  load_tile_async<HEAD_DIM, BLOCK_M, T::kThreads>(sQ, Q + base, stride, row0, N);
  load_tile_async<HEAD_DIM, BLOCK_M, T::kThreads>(sdO, dO + base, stride, row0, N);
  load_tile_async<HEAD_DIM, BLOCK_N, T::kThreads>(sK, K + kv_base, kv_stride, j_begin * BLOCK_N, Nk);
  load_tile_async<HEAD_DIM, BLOCK_N, T::kThreads>(sV, V + kv_base, kv_stride, j_begin * BLOCK_N, Nk);
  cp_async_commit();

  // LSE_i, D_i of this thread's rows g and g + 8: HBM → registers (rows ≥ N: 0, never stored).
  float lse[2], Di[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = warp_row0 + g + 8 * r;
    lse[r] = row < N ? LSE[stat + row] : 0.f;
    Di[r] = row < N ? D[stat + row] : 0.f;
  }

  float acc[HEAD_DIM / 8][4];  // dQ_i (unscaled), rows g and g + 8 of the warp's 16
#pragma unroll
  for (int n = 0; n < HEAD_DIM / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;

  for (int j = j_begin; j < j_end; ++j) {
    const int start_n = j * BLOCK_N;
    const uint32_t stage = uint32_t(((j - j_begin) & 1) * kTileK);
    cp_async_wait<0>();  // this thread's copies of K_j, V_j (and Q_i, dO_i) have landed
    // Every thread's copies are visible to all warps, and every warp has finished step j − 1, so
    // the stage it read may be refilled below.
    __syncthreads();
    // Load K_{j+1}, V_{j+1}: HBM → SRAM into the other stage, while step j computes.
    if (j + 1 < j_end) {
      const uint32_t next = uint32_t(((j + 1 - j_begin) & 1) * kTileK);
      load_tile_async<HEAD_DIM, BLOCK_N, T::kThreads>(sK + next, K + kv_base, kv_stride, start_n + BLOCK_N, Nk);
      load_tile_async<HEAD_DIM, BLOCK_N, T::kThreads>(sV + next, V + kv_base, kv_stride, start_n + BLOCK_N, Nk);
    }
    cp_async_commit();

    // A warp whose rows are all left of this key tile (causal; kBand: or right of it) has nothing to add.
    if (kBand ? start_n > warp_row0 + 15 + hi || start_n + BLOCK_N - 1 < warp_row0 + lo
              : p.causal && start_n > warp_row0 + 15)
      continue;

    // S_ij = Q_i K_jᵀ, dP_ij = dO_i V_jᵀ (fp32, registers).
    float s[BLOCK_N / 8][4], dp[BLOCK_N / 8][4];
    warp_gemm_abt<HEAD_DIM, BLOCK_N, kBf16>(s, sQ, warp_m0, sK + stage, lane);
    warp_gemm_abt<HEAD_DIM, BLOCK_N, kBf16>(dp, sdO, warp_m0, sV + stage, lane);

    // P_ij = 2^(S_ij·scale·log2 e − LSE_i), 0 where masked (keys ≥ N: the NaN hazard; causal
    // keys > query row; kBand: keys outside the row's band, or ≥ N_k, and rows ≥ N, whose LSE_i
    // is 0); dS_ij = P_ij ∘ (dP_ij − D_i), kept in s. A row that sees no key (LSE_i = −inf) gets
    // P = 0 selected, never 2^(+inf) multiplied.
    const bool need_mask =
        kBand ? start_n + BLOCK_N > Nk || warp_row0 + 16 > N || start_n + BLOCK_N - 1 > warp_row0 + hi ||
                    start_n < warp_row0 + 15 + lo
              : start_n + BLOCK_N > N || (p.causal && start_n + BLOCK_N - 1 > warp_row0);
#pragma unroll
    for (int n = 0; n < BLOCK_N / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = start_n + 8 * n + 2 * t + (e & 1);
        const int row = warp_row0 + g + 8 * (e >> 1);
        const bool visible = !need_mask || (kBand ? band_visible(row, col, N, Nk, lo, hi)
                                                  : col < N && (!p.causal || col <= row));
        const float P = visible ? ex2(fmaf(s[n][e], p.scale_log2, -lse[e >> 1])) : 0.f;
        s[n][e] = P * (dp[n][e] - Di[e >> 1]);
      }

    // dQ_i += dS_ij K_j (K_j as the k-major B operand, ldmatrix.trans).
    warp_gemm_xb<HEAD_DIM, BLOCK_N, kBf16>(acc, s, sK + stage, lane);
  }
  cp_async_wait<0>();  // no copy may still be writing SRAM when the block exits (empty groups)

  // dQ_i = scale · acc: registers → HBM, once.
  store_rows16<HEAD_DIM / 8, kBf16>(dQ + base, stride, warp_row0, N, acc, p.scale, g, t);
}

// ----------------------------------------------------------------------------- 3. dK/dV kernel
/// Grid (Tc, H, B), 128 threads, kKvSmem bytes of dynamic SRAM:
/// [K_j: BLOCK_N × d][V_j: BLOCK_N × d][Q_i: 2 × BLOCK_M × d][dO_i: 2 × BLOCK_M × d], all swizzled.
/// Each warp owns 16 keys of K_j and computes the transposed tiles S_ijᵀ, dP_ijᵀ (16 keys × BLOCK_M).
/// kBand (its own instantiation): grouped K/V, N_k ≠ N or a window. Grid (Tc over the N_k keys,
/// H_kv, B): the block owns key tile j of K/V head hk and loops over the G = H / H_kv query heads
/// hk·G … hk·G + G − 1 of its group in that order, each over the query tiles of its band
/// (bwd_band.cuh), so K_j, V_j are read once for the whole group and dK_j, dV_j sum the group's
/// heads in registers in one fixed order (no atomics: bit-reproducible). A key tile no query sees
/// runs no step and writes dK_j = dV_j = 0.
/// kPacked (with kBand; Problem::packed()): grid (⌊total_k / BLOCK_N⌋ + B, H_kv, 1), block x the key
/// tile of the numbering over the keys (packed_key_tile, bwd_band.cuh); N, N_k, the band's offset
/// and the rows are that sequence's.
template <int HEAD_DIM, bool kBf16, bool kBand = false, bool kPacked = false>
__global__ void __launch_bounds__(BwdTraits<HEAD_DIM>::kThreads)
    fast_bwd_dkdv_kernel(Problem p, const uint16_t* __restrict__ Q, const uint16_t* __restrict__ K,
                         const uint16_t* __restrict__ V, const uint16_t* __restrict__ dO,
                         const float* __restrict__ LSE, const float* __restrict__ D, uint16_t* __restrict__ dK,
                         uint16_t* __restrict__ dV, PackedLists lists) {
  using T = BwdTraits<HEAD_DIM>;
  constexpr int BLOCK_M = T::kKvBlockM, BLOCK_N = T::kKvBlockN;
  constexpr int kTileQ = BLOCK_M * T::kRowBytes;
  static_assert(!kPacked || kBand, "packed sequences have their own key lengths and band");
  int N = p.seq;
  // Causal: the leftmost key tiles see the most queries; blockIdx.x order already runs them first.
  // h: the query head (kBand: the K/V head, whose query heads are h0 … h0 + G − 1).
  const int j = blockIdx.x, h = blockIdx.y;
  int b = blockIdx.z;
  int start_n = j * BLOCK_N;
  const std::size_t stride = p.row_stride();
  int Nk = kBand ? p.seq_k : N;
  const std::size_t kv_stride = kBand ? p.kv_row_stride() : stride;
  std::size_t kv_base = kBand ? p.kv_head_offset(b, h) : p.head_offset(b, h);
  const int G = kBand ? p.heads / p.heads_kv : 1, h0 = kBand ? h * G : h;
  int lo = kBand ? p.window_lo() : 0, hi = kBand ? p.window_hi() : 0;
  int q_start = 0;  // packed: the sequence's first row of Q, dO and of LSE, D
  if constexpr (kPacked) {  // the sequence of key tile j of the numbering over the keys, its rows and band
    const PackedTile pt = packed_key_tile(p, lists, j, BLOCK_N);
    if (pt.row0 >= pt.len_k) return;  // past the sequence's last key: at most one tile per sequence
    b = pt.b, N = pt.len_q, Nk = pt.len_k, start_n = pt.row0, q_start = pt.q_start;
    kv_base = key_rows(p, true, b, pt.k_start, h);
    lo = p.window_lo(Nk - N), hi = p.window_hi(Nk - N);
  }
  // Query head hq's rows of Q, dO and of LSE, D (the sequence's, packed).
  auto q_rows = [&](int hq) { return query_rows(p, kPacked, b, q_start, hq); };
  auto q_stats = [&](int hq) { return query_stats(p, kPacked, b, q_start, hq); };
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, t = lane & 3;
  const int warp_n0 = 16 * warp, warp_key0 = start_n + warp_n0;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t sK = uint32_t(__cvta_generic_to_shared(smem_raw));
  const uint32_t sV = sK + BLOCK_N * T::kRowBytes;
  const uint32_t sQ = sV + BLOCK_N * T::kRowBytes;  // + stage · kTileQ
  const uint32_t sdO = sQ + 2 * kTileQ;             // + stage · kTileQ

  // Causal: query tiles that end before this key tile starts see none of it. kBand: the query
  // tiles i_begin … i_end − 1 of the band (the same for every head of the group).
  int i_begin = p.causal ? start_n / BLOCK_M : 0, i_end = (N + BLOCK_M - 1) / BLOCK_M;
  if constexpr (kBand) {
    const TileRange r = band_query_tiles(start_n, min(start_n + BLOCK_N, Nk) - 1, N, lo, hi, BLOCK_M);
    i_begin = r.begin;
    i_end = r.end;
  }

  // Load K_j, V_j, Q_first, dO_first (of query head h0): HBM → SRAM (one cp.async group).
  load_tile_async<HEAD_DIM, BLOCK_N, T::kThreads>(sK, K + kv_base, kv_stride, start_n, Nk);
  load_tile_async<HEAD_DIM, BLOCK_N, T::kThreads>(sV, V + kv_base, kv_stride, start_n, Nk);
  load_tile_async<HEAD_DIM, BLOCK_M, T::kThreads>(sQ, Q + q_rows(h0), stride, i_begin * BLOCK_M, N);
  load_tile_async<HEAD_DIM, BLOCK_M, T::kThreads>(sdO, dO + q_rows(h0), stride, i_begin * BLOCK_M, N);
  cp_async_commit();

  float acc_dk[HEAD_DIM / 8][4], acc_dv[HEAD_DIM / 8][4];  // keys g and g + 8 of the warp's 16
#pragma unroll
  for (int n = 0; n < HEAD_DIM / 8; ++n) {
    acc_dk[n][0] = acc_dk[n][1] = acc_dk[n][2] = acc_dk[n][3] = 0.f;
    acc_dv[n][0] = acc_dv[n][1] = acc_dv[n][2] = acc_dv[n][3] = 0.f;
  }

  // Steps: query head h0 + gh (gh < G; one head unless kBand) × query tile i, heads outer, in this
  // fixed order; `step` counts them over the whole group (its stage parity).
  int step = 0;
  for (int gh = 0; gh < G; ++gh)
  for (int i = i_begin; i < i_end; ++i, ++step) {
    const int row0 = i * BLOCK_M;
    const int hq = h0 + gh;
    const std::size_t base = q_rows(hq), stat = q_stats(hq);
    const uint32_t stage = uint32_t((step & 1) * kTileQ);
    cp_async_wait<0>();  // this thread's copies of Q_i, dO_i (and K_j, V_j) have landed
    // All copies visible to all warps; every warp has finished the previous step, so the stage
    // it read may be refilled below.
    __syncthreads();
    // Load Q_{i+1}, dO_{i+1}: HBM → SRAM into the other stage, while step i computes; after a
    // head's last tile, the next head's first (kBand).
    const uint32_t next = uint32_t(((step + 1) & 1) * kTileQ);
    if (i + 1 < i_end) {
      load_tile_async<HEAD_DIM, BLOCK_M, T::kThreads>(sQ + next, Q + base, stride, row0 + BLOCK_M, N);
      load_tile_async<HEAD_DIM, BLOCK_M, T::kThreads>(sdO + next, dO + base, stride, row0 + BLOCK_M, N);
    } else if (kBand && gh + 1 < G) {
      const std::size_t nbase = q_rows(hq + 1);
      load_tile_async<HEAD_DIM, BLOCK_M, T::kThreads>(sQ + next, Q + nbase, stride, i_begin * BLOCK_M, N);
      load_tile_async<HEAD_DIM, BLOCK_M, T::kThreads>(sdO + next, dO + nbase, stride, i_begin * BLOCK_M, N);
    }
    cp_async_commit();

    // A warp whose keys are all right of this tile's last query (causal; kBand: or outside the
    // band of every query of the tile) has nothing to add.
    if (kBand ? warp_key0 > row0 + BLOCK_M - 1 + hi || warp_key0 + 15 < row0 + lo
              : p.causal && warp_key0 > row0 + BLOCK_M - 1)
      continue;

    // S_ijᵀ = K_j Q_iᵀ, dP_ijᵀ = V_j dO_iᵀ (16 keys × BLOCK_M queries, fp32, registers).
    float s[BLOCK_M / 8][4], dp[BLOCK_M / 8][4];
    warp_gemm_abt<HEAD_DIM, BLOCK_M, kBf16>(s, sK, warp_n0, sQ + stage, lane);
    warp_gemm_abt<HEAD_DIM, BLOCK_M, kBf16>(dp, sV, warp_n0, sdO + stage, lane);

    // P_ijᵀ = 2^(S·scale·log2 e − LSE_i) per query column, 0 where masked (query rows ≥ N, keys
    // ≥ N, causal key > query); dS_ijᵀ = P_ijᵀ ∘ (dP_ijᵀ − D_i). P stays in s, dS goes to dp.
    const bool need_mask =
        kBand ? row0 + BLOCK_M > N || warp_key0 + 16 > Nk || warp_key0 + 15 > row0 + hi ||
                    warp_key0 < row0 + BLOCK_M - 1 + lo
              : row0 + BLOCK_M > N || start_n + BLOCK_N > N || (p.causal && warp_key0 + 15 > row0);
#pragma unroll
    for (int n = 0; n < BLOCK_M / 8; ++n)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int col = row0 + 8 * n + 2 * t + c;  // query row of this column
        const float lse = col < N ? __ldg(LSE + stat + col) : 0.f;  // LSE_i, D_i: HBM/L1 → registers
        const float Di = col < N ? __ldg(D + stat + col) : 0.f;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int e = 2 * r + c;
          const int key = warp_key0 + g + 8 * r;
          const bool visible = !need_mask || (kBand ? band_visible(col, key, N, Nk, lo, hi)
                                                    : col < N && key < N && (!p.causal || key <= col));
          const float P = visible ? ex2(fmaf(s[n][e], p.scale_log2, -lse)) : 0.f;
          s[n][e] = P;
          dp[n][e] = P * (dp[n][e] - Di);
        }
      }

    // dV_j += P_ijᵀ dO_i, dK_j += dS_ijᵀ Q_i (dO_i, Q_i as k-major B operands, ldmatrix.trans).
    warp_gemm_xb<HEAD_DIM, BLOCK_M, kBf16>(acc_dv, s, sdO + stage, lane);
    warp_gemm_xb<HEAD_DIM, BLOCK_M, kBf16>(acc_dk, dp, sQ + stage, lane);
  }
  cp_async_wait<0>();  // no copy may still be writing SRAM when the block exits (empty groups)

  // dK_j = scale · acc_dk, dV_j = acc_dv: registers → HBM, once.
  store_rows16<HEAD_DIM / 8, kBf16>(dK + kv_base, kv_stride, warp_key0, Nk, acc_dk, p.scale, g, t);
  store_rows16<HEAD_DIM / 8, kBf16>(dV + kv_base, kv_stride, warp_key0, Nk, acc_dv, 1.f, g, t);
}

// ----------------------------------------------------------------------------- launchers
/// kPacked: D over the total_q rows as one sequence (it does not depend on the sequences: the
/// packed [1, total_q, H, d] rows give D [1, H, total_q], LSE's layout), the grids over the packed
/// tile numberings, `lists` passed to both kernels (unread when dense).
template <int HEAD_DIM, bool kBf16, bool kBand, bool kPacked = false>
void launch_fast_bwd(const Problem& p, const BwdPointers& a, cudaStream_t stream, const PackedLists& lists = {}) {
  using T = BwdTraits<HEAD_DIM>;
  auto dq_kernel = &fast_bwd_dq_kernel<HEAD_DIM, kBf16, kBand, kPacked>;
  auto kv_kernel = &fast_bwd_dkdv_kernel<HEAD_DIM, kBf16, kBand, kPacked>;
  // > 48 KiB of dynamic SRAM: opted in per device (set_smem keeps the record, thread-safe).
  set_smem(reinterpret_cast<const void*>(dq_kernel), T::kDqSmem, "fast_bwd_dq_kernel", p);
  set_smem(reinterpret_cast<const void*>(kv_kernel), T::kKvSmem, "fast_bwd_dkdv_kernel", p);
  const auto* Q = static_cast<const uint16_t*>(a.Q);
  const auto* K = static_cast<const uint16_t*>(a.K);
  const auto* V = static_cast<const uint16_t*>(a.V);
  const auto* dO = static_cast<const uint16_t*>(a.dO);

  Problem rows = p;
  if constexpr (kPacked) {
    rows.batch = 1;
    rows.seq = p.total_q;
  }
  launch_fast_bwd_preprocess<HEAD_DIM, kBf16>(rows, a, stream);

  announce("fast_bwd_dq_kernel");
  const dim3 dq_grid = kPacked ? dim3(unsigned(p.packed_tiles(T::kDqBlockM)), p.heads, 1)
                               : dim3((p.seq + T::kDqBlockM - 1) / T::kDqBlockM, p.heads, p.batch);
  dq_kernel<<<dq_grid, T::kThreads, T::kDqSmem, stream>>>(p.with_tiles(T::kDqBlockM, T::kDqBlockN), Q, K, V, dO,
                                                          a.LSE, a.D, static_cast<uint16_t*>(a.dQ), lists);
  FLASHLAB_CUDA_CHECK_LAUNCH("fast_bwd_dq_kernel");

  announce("fast_bwd_dkdv_kernel");
  // One block per key tile (kBand: of the N_k keys, per K/V head; its group's query heads loop inside).
  const dim3 kv_grid = kPacked ? dim3(unsigned(p.total_k / T::kKvBlockN + p.batch), p.heads_kv, 1)
                               : dim3((p.seq_k + T::kKvBlockN - 1) / T::kKvBlockN, p.heads_kv, p.batch);
  kv_kernel<<<kv_grid, T::kThreads, T::kKvSmem, stream>>>(p.with_tiles(T::kKvBlockM, T::kKvBlockN), Q, K, V, dO,
                                                          a.LSE, a.D, static_cast<uint16_t*>(a.dK),
                                                          static_cast<uint16_t*>(a.dV), lists);
  FLASHLAB_CUDA_CHECK_LAUNCH("fast_bwd_dkdv_kernel");
}

}  // namespace

void launch_fast_bwd_two_kernel(const Problem& p, bool bf16, const BwdPointers& a, cudaStream_t stream,
                                const PackedLists& lists) {
  if (p.packed()) {  // every sequence its own lengths and band: the packed band instantiations
    if (p.head_dim == 64)
      bf16 ? launch_fast_bwd<64, true, true, true>(p, a, stream, lists)
           : launch_fast_bwd<64, false, true, true>(p, a, stream, lists);
    else
      bf16 ? launch_fast_bwd<128, true, true, true>(p, a, stream, lists)
           : launch_fast_bwd<128, false, true, true>(p, a, stream, lists);
    return;
  }
  // Grouped K/V, N_k ≠ N or a window: the band instantiations (the plain ones keep their code).
  const bool band = p.heads_kv != p.heads || p.seq_k != p.seq || p.windowed();
  if (p.head_dim == 64) {
    if (band) bf16 ? launch_fast_bwd<64, true, true>(p, a, stream) : launch_fast_bwd<64, false, true>(p, a, stream);
    else bf16 ? launch_fast_bwd<64, true, false>(p, a, stream) : launch_fast_bwd<64, false, false>(p, a, stream);
  } else {
    if (band) bf16 ? launch_fast_bwd<128, true, true>(p, a, stream) : launch_fast_bwd<128, false, true>(p, a, stream);
    else bf16 ? launch_fast_bwd<128, true, false>(p, a, stream) : launch_fast_bwd<128, false, false>(p, a, stream);
  }
}

}  // namespace flashlab::cuda::detail
