// mta_fast_bwd.cu — fast Multi-Token Attention backward: bf16/fp16 inputs, every matrix product
// on tensor cores (mma.sync m16n8k16, fp32 accumulation), the convolution, its transpose and dW
// on chip. Semantics and names as reference/src/mta (naive_backward, flash_backward) and the
// clear kernel mta_bwd.cu; the loop order is FlashAttention-2's atomic backward
// (attention_bwd_tc_atomic.cu): one block per key tile, query tiles streamed past it.
//
//   0. memset                      dW = 0, dQaccum = 0 (fp32 scratch, [B, N, H, d])
//   1. fast_bwd_preprocess_kernel  D_i = rowsum(dO_i ∘ O_i) (attention_bwd_tc.cuh, shared with attention)
//   2. mta_fast_bwd_kernel         one block per (h, key tile j, b); loop over query tiles i
//   3. mta_fast_dq_convert_kernel  dQ = scale · dQaccum → 16 bits
//
// TILES AND HALOS. dS on a block of queries × keys needs dŜ Pq rows further down and Pk keys
// further out on each side; dŜ needs Ŝ there, and Ŝ needs S Pq rows further up and Pk keys out
// (the doubled halos of the reference's flash_backward, row halo centred). So a step loads
// BLOCK_M = 64 query rows starting at I_s = i·Br − Pq and the block holds BLOCK_N = 128 keys from
// J_s = j·Bc − 2Pk, and owns the effective block: rows [Pq, Pq + Br), keys [2Pk, 2Pk + Bc) of
// the tile, Br = 64 − 2Pq, Bc = 128 − 4Pk. The owned blocks partition the N × N grid, so every
// dŜ entry counts once in dW, dV, and every dS entry once in dQ and dK. Rows and keys outside
// [0, N) are zero-filled by the loads (they are the convolution's zero padding). Causal: query
// tiles whose owned rows all precede the block's first owned key contribute nothing (their dS,
// P and dŜ on the owned block are all masked) and are never loaded: i starts at ⌊j·Bc / Br⌋.
//
// ONE STEP (query tile i); every phase ends with a barrier because the next reads other threads' entries:
//   A. S = scale · Q_i K_jᵀ with the causal zeros, dP = dO_i V_jᵀ: tensor cores, fp32 → SRAM
//      ([64][136] floats each; the pitch makes the fragment stores and the strip reads conflict-free).
//   B. Convolution in strips of 8 rows × 1 key per thread (lanes = consecutive keys): for each
//      kernel column b, the 8 + Pq S values of the strip's window are loaded once and feed
//      8·cq FMAs. On the exact, visible region (rows ≥ Pq, keys [Pk, 128 − Pk)):
//      P = 2^(Ŝ·log2 e − LSE_i), dŜ = P ∘ (dP − D_i) written over dP in place; P (16-bit) on the
//      owned block for dV; then dW_i += Σ over the owned entries dŜ[r, c] · S[r + a − Pq, c + b − Pk]
//      from the same kind of windows, reduced over the warp by shuffles and added to the block's
//      dW in SRAM (one shared atomic per warp and tap).
//   C. dS = TransposedConv2D(dŜ, W) on the owned block (zero where the key is in the future),
//      16-bit, into the SRAM of S (dead after B).
//   D. dQaccum_i += dS K_j (fp32 float2 atomics, owned rows only); dV_j += Pᵀ dO_i and
//      dK_j += dSᵀ Q_i in registers for the whole loop.
// After the loop: dW (SRAM, the block's sum over its steps) added to global dW once per tap;
// dK_j = scale · acc_dk and dV_j written once, owned keys only (no other block writes them).
//
// SRAM (d = 64 / 128): K_j, V_j 16 / 32 KiB each; Q_i, dO_i two stages of 8 / 16 KiB each; S and
// dP/dŜ 34 KiB each (fp32); P 16 KiB; LSE_i, D_i 2 × 512 B; W, dW 2 × 960 B: 151 / 215 KiB.
// Q_{i+1}, dO_{i+1}, LSE_{i+1}, D_{i+1} are copied by cp.async while step i computes.
//
// Numerics: S, Ŝ, dP, dŜ, dS and dW in fp32; P and dS rounded once to 16 bits for the products.
// Extra device memory: D (B·H·N floats) and dQaccum (B·N·H·d floats); no N × N buffer.
#include "attention/attention_bwd_tc.cuh"
#include "mta/mta_fast_launch.hpp"
#include "core/warp_gemm.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace flashlab::cuda::detail::mta_fast {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int BLOCK_M = kBwdBlockM;
constexpr int BLOCK_N = kBwdBlockN;
constexpr int kMaxPq = kMaxCq - 1;
constexpr int kPitch = BLOCK_N + 8;  // fp32 score tiles: 8 rows × 2 floats per fragment store hit 32 banks once
constexpr int kStrip = 8;            // rows per convolution strip
constexpr int kWindow = kStrip + kMaxPq;
constexpr float kLog2e = 1.4426950408889634f;

template <int HEAD_DIM>
struct BwdTraits {
  static constexpr int kTileQ = BLOCK_M * HEAD_DIM * 2;  // one stage of Q_i (or dO_i), 16-bit
  static constexpr int kTileK = BLOCK_N * HEAD_DIM * 2;  // K_j (or V_j)
  static constexpr int kTileF = BLOCK_M * kPitch * 4;    // S (or dP/dŜ), fp32
  static constexpr int kTileP = BLOCK_M * BLOCK_N * 2;   // P (or dS), 16-bit, swizzled [64][128]
  static constexpr int kTileL = 2 * BLOCK_M * 4;         // one stage of LSE_i and D_i
  static constexpr int kTaps = kMaxCq * kMaxCk * 4;      // W or dW, fp32
  static constexpr int kSmem = 2 * kTileK + 4 * kTileQ + 2 * kTileF + kTileP + 2 * kTileL + 2 * kTaps;
  static constexpr int kDkvNT = HEAD_DIM / 16;  // dK/dV: 4 key warps × 2 d halves
  static constexpr int kDqNT = HEAD_DIM / 32;   // dQ: 2 row warps × 4 d quarters
  // Strips whose dŜ stays in registers for one dW pass (d = 128 has less register room).
  static constexpr int kDwStrips = HEAD_DIM == 64 ? 4 : 2;
  static_assert(kTileP <= kTileF, "dS overlays S");
};

template <bool kBf16>
__device__ __forceinline__ uint16_t to_bits16(float x) {
  if constexpr (kBf16) return __bfloat16_as_ushort(__float2bfloat16_rn(x));
  else return __half_as_ushort(__float2half_rn(x));
}

/// One 16-bit entry (row r, column c) of a swizzled [rows][128] tile.
template <bool kBf16>
__device__ __forceinline__ void store16(uint32_t tile, int r, int c, float v) {
  asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(tile + swz<BLOCK_N>(r, c / 8) + 2 * (c % 8)), "h"(to_bits16<kBf16>(v)));
}

/// cp.async of rows [row0, row0 + ROWS) of one head into a swizzled tile; rows outside [0, N)
/// (row0 may be negative: the halo above token 0) are zero-filled.
template <int HEAD_DIM, int ROWS>
__device__ __forceinline__ void load_rows_async(uint32_t smem, const uint16_t* head, std::size_t stride, int row0,
                                                int N) {
  constexpr int kChunks = HEAD_DIM / 8;
  static_assert(ROWS * kChunks % kThreads == 0, "tile chunks must divide among the threads");
#pragma unroll
  for (int it = 0; it < ROWS * kChunks / kThreads; ++it) {
    const int idx = int(threadIdx.x) + it * kThreads;
    const int r = idx / kChunks, c = idx % kChunks, row = row0 + r;
    const bool ok = row >= 0 && row < N;
    cp_async16(smem + swz<HEAD_DIM>(r, c), head + std::size_t(ok ? row : 0) * stride + c * 8, ok);
  }
}

/// LSE_i then D_i of rows [row0, row0 + 64): 4-byte cp.async, rows outside [0, N) zero-filled.
__device__ __forceinline__ void load_stats_async(uint32_t dst, const float* lse, const float* d, int row0, int N) {
  if (int(threadIdx.x) < 2 * BLOCK_M) {
    const int row = row0 + int(threadIdx.x) % BLOCK_M;
    const bool ok = row >= 0 && row < N;
    const float* src = (int(threadIdx.x) < BLOCK_M ? lse : d) + (ok ? row : 0);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst + 4 * uint32_t(threadIdx.x)), "l"(src),
                 "r"(ok ? 4 : 0));
  }
}

/// The kernel height cq: the compile-time CQ of a specialised kernel (its loops over the kernel
/// rows and the window then have constant trip counts: no per-row tests), or the run-time G.cq
/// when CQ = 0 (any cq ≤ 16).
template <int CQ>
__device__ __forceinline__ int rows_of(const Geometry& G) {
  if constexpr (CQ > 0) return CQ;
  else return G.cq;
}

/// The window of one strip: win[y] = tile[row0 + y][col] for y < 8 + Pq, 0 for rows outside
/// [0, 64). Branch-free (rows clamped, then selected), so the windows of several strips can be in
/// flight at once.
__device__ __forceinline__ void load_window(float (&win)[kWindow], const float* tile, int row0, int col, int pq) {
#pragma unroll
  for (int y = 0; y < kWindow; ++y) {
    const int row = row0 + y;
    if (y < kStrip + pq) {
      const float v = tile[min(max(row, 0), BLOCK_M - 1) * kPitch + col];
      win[y] = row >= 0 && row < BLOCK_M ? v : 0.f;
    } else {
      win[y] = 0.f;
    }
  }
}

/// Column b of the kernel, SRAM → registers once for all strips: w[a] = W[a, b] for a < cq, or
/// with `flipped` w[a] = W[Pq − a, b] (the transposed convolution's order).
template <int CQ>
__device__ __forceinline__ void load_w_column(float (&w)[kMaxCq], const Geometry& G, const float* W, int b,
                                              bool flipped) {
  const int cq = rows_of<CQ>(G);
#pragma unroll
  for (int a = 0; a < kMaxCq; ++a) w[a] = a < cq ? W[(flipped ? cq - 1 - a : a) * G.ck + b] : 0.f;
}

/// Everything a step's phases share (SRAM views and the block's geometry).
struct StepView {
  float* S;         // [64][kPitch] fp32: S, later (as 16-bit, swizzled) dS
  float* dP;        // [64][kPitch] fp32: dP, then dŜ in place
  const float* W;   // [cq][ck]
  float* dW;        // [cq][ck], the block's sum
  const float* lse; // [64] LSE_i (base 2) of this stage
  const float* d_i; // [64] D_i of this stage
  uint32_t sP, sdS; // 16-bit tiles (shared addresses)
  int is, js;       // I_s, J_s: global index of tile row 0 and tile key 0
};

/// Phase B for NS strips (rows r0[k] … r0[k] + 7 of tile column c): Ŝ, P, dŜ; P (owned
/// entries) → sP; dŜ → dP in place; the owned dŜ values → dso for the dW pass. The kernel columns
/// b are the outer loop, so the NS windows of one b are loaded together (independent loads).
template <bool kBf16, int CQ, int NS>
__device__ __forceinline__ void conv_strips(const Geometry& G, const StepView& v, const int (&r0)[NS], int c,
                                            float (&dso)[NS][kStrip]) {
  const int cq = rows_of<CQ>(G), pq = cq - 1, pk = G.pk, gc = v.js + c;
  const bool col_exact = c >= pk && c < BLOCK_N - pk && gc >= 0 && gc < G.seq;
  float acc[NS][kStrip] = {};
  for (int b = 0; b < G.ck; ++b) {
    float w[kMaxCq];
    load_w_column<CQ>(w, G, v.W, b, false);
    const int col = min(max(c + b - pk, 0), BLOCK_N - 1);  // exact keys never clamp; the others are masked
#pragma unroll
    for (int k = 0; k < NS; ++k) {
      float win[kWindow];
      load_window(win, v.S, r0[k] - pq, col, pq);
#pragma unroll
      for (int a = 0; a < kMaxCq; ++a)
        if (a < cq) {
#pragma unroll
          for (int y = 0; y < kStrip; ++y) acc[k][y] = fmaf(w[a], win[y + a], acc[k][y]);
        }
    }
  }
  const bool col_owned = c >= 2 * pk && c < 2 * pk + G.bc;
#pragma unroll
  for (int k = 0; k < NS; ++k) {
    float lse[kStrip], d_i[kStrip];  // the strip's 8 rows: two 16-byte loads each (r0 is a multiple of 8)
    *reinterpret_cast<float4*>(lse) = *reinterpret_cast<const float4*>(v.lse + r0[k]);
    *reinterpret_cast<float4*>(lse + 4) = *reinterpret_cast<const float4*>(v.lse + r0[k] + 4);
    *reinterpret_cast<float4*>(d_i) = *reinterpret_cast<const float4*>(v.d_i + r0[k]);
    *reinterpret_cast<float4*>(d_i + 4) = *reinterpret_cast<const float4*>(v.d_i + r0[k] + 4);
#pragma unroll
    for (int y = 0; y < kStrip; ++y) {
      const int r = r0[k] + y, gr = v.is + r;
      const bool visible = col_exact && r >= pq && gr < G.seq && gc <= gr;
      // 2^x is computed for every entry and masked entries are SELECTED to 0 (a masked 2^x may
      // be +inf; it is discarded, never multiplied).
      const float e = ex2(fmaf(acc[k][y], kLog2e, -lse[y]));
      const float p = visible ? e : 0.f;
      const float ds_hat = p * (v.dP[r * kPitch + c] - d_i[y]);
      v.dP[r * kPitch + c] = ds_hat;
      const bool owned = visible && col_owned && r < pq + G.br;
      store16<kBf16>(v.sP, r, c, owned ? p : 0.f);
      dso[k][y] = owned ? ds_hat : 0.f;
    }
  }
}

/// Phase B, dW part: dW[a, b] += Σ over this thread's strips of dso[y] · S[r0 + y + a − Pq, c + b − Pk],
/// summed over the warp by shuffles, one shared atomic per tap per warp.
template <int NS, int CQ>
__device__ __forceinline__ void dw_pass(const Geometry& G, const StepView& v, const int (&r0)[NS], int c,
                                        const float (&dso)[NS][kStrip], int lane) {
  bool any = false;
#pragma unroll
  for (int k = 0; k < NS; ++k)
#pragma unroll
    for (int y = 0; y < kStrip; ++y) any |= dso[k][y] != 0.f;
  if (!__any_sync(0xffffffffu, any)) return;  // warp-uniform: nothing owned in these strips
  const int cq = rows_of<CQ>(G), pq = cq - 1;
  for (int b = 0; b < G.ck; ++b) {
    const int col = min(max(c + b - G.pk, 0), BLOCK_N - 1);  // owned keys never clamp; others have dso = 0
    float part[kMaxCq] = {};
#pragma unroll
    for (int k = 0; k < NS; ++k) {
      float win[kWindow];
      load_window(win, v.S, r0[k] - pq, col, pq);
#pragma unroll
      for (int a = 0; a < kMaxCq; ++a)
        if (a < cq) {
#pragma unroll
          for (int y = 0; y < kStrip; ++y) part[a] = fmaf(dso[k][y], win[y + a], part[a]);
        }
    }
#pragma unroll
    for (int a = 0; a < kMaxCq; ++a)
      if (a < cq) {
        float s = part[a];
#pragma unroll
        for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
        if (lane == 0) atomicAdd(v.dW + a * G.ck + b, s);
      }
  }
}

/// Phase C for NS strips: dS = TransposedConv2D(dŜ, W) on the owned entries (0 elsewhere and
/// where the key is in the future), 16-bit into sdS. Kernel columns outer, as conv_strips.
template <bool kBf16, int CQ, int NS>
__device__ __forceinline__ void conv_transpose_strips(const Geometry& G, const StepView& v, const int (&r0)[NS], int c) {
  const int cq = rows_of<CQ>(G), pq = cq - 1, pk = G.pk, gc = v.js + c;
  const bool col_owned = c >= 2 * pk && c < 2 * pk + G.bc && gc < G.seq;
  float acc[NS][kStrip] = {};
  // dS[r, c] = Σ_a Σ_b W[a, b] · dŜ[r − a + Pq, c − b + Pk]; with a' = Pq − a the row is r + a'.
  for (int b = 0; b < G.ck; ++b) {
    float w[kMaxCq];
    load_w_column<CQ>(w, G, v.W, b, true);  // w[a'] = W[Pq − a', b]
    const int col = min(max(c - b + pk, 0), BLOCK_N - 1);  // owned keys never clamp
#pragma unroll
    for (int k = 0; k < NS; ++k) {
      float win[kWindow];
      load_window(win, v.dP, r0[k], col, pq);
#pragma unroll
      for (int a2 = 0; a2 < kMaxCq; ++a2)
        if (a2 < cq) {
#pragma unroll
          for (int y = 0; y < kStrip; ++y) acc[k][y] = fmaf(w[a2], win[y + a2], acc[k][y]);
        }
    }
  }
#pragma unroll
  for (int k = 0; k < NS; ++k)
#pragma unroll
    for (int y = 0; y < kStrip; ++y) {
      const int r = r0[k] + y, gr = v.is + r;
      const bool owned = col_owned && r >= pq && r < pq + G.br && gr < G.seq && gc <= gr;
      store16<kBf16>(v.sdS, r, c, owned ? acc[k][y] : 0.f);
    }
}

/// The warp's fragment coordinates in the three layouts of a step.
struct WarpPlace {
  int lane, g, t;  // lane, mma row group g = lane / 4, column pair t = lane % 4
  int wm, wn;      // S/dP: 32 rows × 32 keys; dQ: 32 rows × d/4; phases B and C: rows 32·wm…, keys 32·wn…
  int wk, wd;      // dK/dV: 32 keys × d/2
};

/// Phase A: S = scale · Q_i K_jᵀ with the causal zeros and dP = dO_i V_jᵀ on tensor cores, fp32 → SRAM.
template <int HEAD_DIM, bool kBf16>
__device__ __forceinline__ void scores_to_smem(const Geometry& G, const StepView& v, uint32_t sQ, uint32_t sdO,
                                               uint32_t sK, uint32_t sV, const WarpPlace& w) {
  float s[2][4][4];
  warp_gemm_abt<HEAD_DIM, 4, kBf16>(s, sQ, 32 * w.wm, sK, 32 * w.wn, w.lane);
  // The causal zeros: one uniform branch per step picks the copy of the loop with the per-entry
  // test (tiles whose last key is after their first row) or without it.
  auto store_s = [&](auto causal) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int n = 0; n < 4; ++n) {
          const int lrow = 32 * w.wm + 16 * mt + w.g + 8 * r, lcol = 32 * w.wn + 8 * n + 2 * w.t;
          float2 val = make_float2(s[mt][n][2 * r] * G.scale, s[mt][n][2 * r + 1] * G.scale);
          if constexpr (decltype(causal)::value) {
            const int gr = v.is + lrow, gc = v.js + lcol;
            val.x = gc > gr ? 0.f : val.x;
            val.y = gc + 1 > gr ? 0.f : val.y;
          }
          *reinterpret_cast<float2*>(v.S + lrow * kPitch + lcol) = val;
        }
  };
  if (v.js + BLOCK_N - 1 > v.is) store_s(std::true_type{});
  else store_s(std::false_type{});
  warp_gemm_abt<HEAD_DIM, 4, kBf16>(s, sdO, 32 * w.wm, sV, 32 * w.wn, w.lane);
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        const int lrow = 32 * w.wm + 16 * mt + w.g + 8 * r, lcol = 32 * w.wn + 8 * n + 2 * w.t;
        *reinterpret_cast<float2*>(v.dP + lrow * kPitch + lcol) = make_float2(s[mt][n][2 * r], s[mt][n][2 * r + 1]);
      }
}

/// Phases B and C with the barriers between them: Ŝ, P, dŜ and dW (strips of rows 32·wm + 8k …
/// + 7 in tile column 32·wn + lane), then dS on the owned block (16-bit, over S).
template <int HEAD_DIM, bool kBf16, int CQ>
__device__ __forceinline__ void convolutions(const Geometry& G, const StepView& v, const WarpPlace& w) {
  using T = BwdTraits<HEAD_DIM>;
  const int c = 32 * w.wn + w.lane;
#pragma unroll
  for (int half = 0; half < 4 / T::kDwStrips; ++half) {
    float dso[T::kDwStrips][kStrip];
    int r0[T::kDwStrips];
#pragma unroll
    for (int k = 0; k < T::kDwStrips; ++k) r0[k] = 32 * w.wm + kStrip * (half * T::kDwStrips + k);
    conv_strips<kBf16, CQ, T::kDwStrips>(G, v, r0, c, dso);
    dw_pass<T::kDwStrips, CQ>(G, v, r0, c, dso, w.lane);
  }
  __syncthreads();  // dŜ complete (the transpose reads neighbours); every read of S done (dS overwrites it)
#pragma unroll
  for (int half = 0; half < 4 / T::kDwStrips; ++half) {
    int r0[T::kDwStrips];
#pragma unroll
    for (int k = 0; k < T::kDwStrips; ++k) r0[k] = 32 * w.wm + kStrip * (half * T::kDwStrips + k);
    conv_transpose_strips<kBf16, CQ, T::kDwStrips>(G, v, r0, c);
  }
}

/// Phase D, dQ part: dQaccum[owned rows] += dS K_j (fp32 float2 atomics; rows outside the owned
/// block have dS = 0 and are skipped). `head` points at (b, token 0, h, 0) of dQaccum.
template <int HEAD_DIM, bool kBf16>
__device__ __forceinline__ void dq_to_accumulator(const Geometry& G, const StepView& v, uint32_t sK, float* head,
                                                  const WarpPlace& w) {
  using T = BwdTraits<HEAD_DIM>;
  float dq[2][T::kDqNT][4];
  warp_gemm_xb<HEAD_DIM, BLOCK_N, T::kDqNT, kBf16>(dq, v.sdS, 32 * w.wm, sK, w.wn * (HEAD_DIM / 4), w.lane);
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int lrow = 32 * w.wm + 16 * mt + w.g + 8 * r, row = v.is + lrow;
      if (lrow >= G.pq && lrow < G.pq + G.br && row < G.seq) {
        float* out = head + std::size_t(row) * G.row_stride() + w.wn * (HEAD_DIM / 4) + 2 * w.t;
#pragma unroll
        for (int n = 0; n < T::kDqNT; ++n)
          atomicAdd(reinterpret_cast<float2*>(out + 8 * n), make_float2(dq[mt][n][2 * r], dq[mt][n][2 * r + 1]));
      }
    }
}

/// dK_j = scale · acc_dk, dV_j = acc_dv: registers → HBM once, owned keys [2Pk, 2Pk + Bc) only (no
/// other block writes them). `dk_head`, `dv_head` point at (b, token 0, h, 0).
template <int NT, bool kBf16>
__device__ __forceinline__ void store_dk_dv(const Geometry& G, int js, const float (&acc_dk)[2][NT][4],
                                            const float (&acc_dv)[2][NT][4], uint16_t* dk_head, uint16_t* dv_head,
                                            const WarpPlace& w) {
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int lkey = 32 * w.wk + 16 * mt + w.g + 8 * r, key = js + lkey;
      if (lkey < 2 * G.pk || lkey >= 2 * G.pk + G.bc || key >= G.seq) continue;
      const std::size_t at = std::size_t(key) * G.row_stride() + w.wd * (NT * 8) + 2 * w.t;
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        *reinterpret_cast<uint32_t*>(dk_head + at + 8 * n) =
            pack2<kBf16>(acc_dk[mt][n][2 * r] * G.scale, acc_dk[mt][n][2 * r + 1] * G.scale);
        *reinterpret_cast<uint32_t*>(dv_head + at + 8 * n) = pack2<kBf16>(acc_dv[mt][n][2 * r], acc_dv[mt][n][2 * r + 1]);
      }
    }
}

/// Grid (H, Tc, B): the blocks of the first key tiles (the most query tiles) start first. 256
/// threads, BwdTraits::kSmem bytes of dynamic SRAM (layout in the file comment).
template <int HEAD_DIM, bool kBf16, int CQ>
__global__ void __launch_bounds__(kThreads, 1)
    mta_fast_bwd_kernel(Geometry G, const uint16_t* __restrict__ Q, const uint16_t* __restrict__ K,
                        const uint16_t* __restrict__ V, const uint16_t* __restrict__ dO, const float* __restrict__ Wg,
                        const float* __restrict__ LSE, const float* __restrict__ D, float* __restrict__ dQaccum,
                        uint16_t* __restrict__ dK, uint16_t* __restrict__ dV, float* __restrict__ dWg) {
  using T = BwdTraits<HEAD_DIM>;
  const int h = blockIdx.x, j = blockIdx.y, b = blockIdx.z, N = G.seq, taps = G.taps();
  const int j0 = j * G.bc;
  const std::size_t stride = G.row_stride(), base = G.head_offset(b, h), stat = G.stat_offset(b, h);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const WarpPlace w{lane, lane >> 2, lane & 3, warp >> 2, warp & 3, warp >> 1, warp & 1};

  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t sK = uint32_t(__cvta_generic_to_shared(smem_raw));
  const uint32_t sV = sK + T::kTileK;
  const uint32_t sQ = sV + T::kTileK;       // + stage · kTileQ
  const uint32_t sdO = sQ + 2 * T::kTileQ;  // + stage · kTileQ
  const int off_S = 2 * T::kTileK + 4 * T::kTileQ;
  const int off_L = off_S + 2 * T::kTileF + T::kTileP;
  StepView v;
  v.S = reinterpret_cast<float*>(smem_raw + off_S);
  v.dP = reinterpret_cast<float*>(smem_raw + off_S + T::kTileF);
  v.sdS = sK + uint32_t(off_S);
  v.sP = sK + uint32_t(off_S + 2 * T::kTileF);
  const uint32_t sL = sK + uint32_t(off_L);  // + stage · kTileL
  float* w_s = reinterpret_cast<float*>(smem_raw + off_L + 2 * T::kTileL);
  v.W = w_s;
  v.dW = w_s + kMaxCq * kMaxCk;

  for (int tap = threadIdx.x; tap < taps; tap += kThreads) {
    w_s[tap] = Wg[std::size_t(h) * taps + tap];
    v.dW[tap] = 0.f;
  }
  const int i_begin = j0 / G.br;
  const int js = j0 - 2 * G.pk;
  v.js = js;
  load_rows_async<HEAD_DIM, BLOCK_N>(sK, K + base, stride, js, N);
  load_rows_async<HEAD_DIM, BLOCK_N>(sV, V + base, stride, js, N);
  load_rows_async<HEAD_DIM, BLOCK_M>(sQ, Q + base, stride, i_begin * G.br - G.pq, N);
  load_rows_async<HEAD_DIM, BLOCK_M>(sdO, dO + base, stride, i_begin * G.br - G.pq, N);
  load_stats_async(sL, LSE + stat, D + stat, i_begin * G.br - G.pq, N);
  cp_async_commit();

  float acc_dk[2][T::kDkvNT][4] = {}, acc_dv[2][T::kDkvNT][4] = {};

  for (int i = i_begin; i < G.tr; ++i) {
    const int is = i * G.br - G.pq, st = (i - i_begin) & 1;
    const uint32_t stage = uint32_t(st * T::kTileQ);
    v.is = is;
    v.lse = reinterpret_cast<const float*>(smem_raw + off_L + st * T::kTileL);
    v.d_i = v.lse + BLOCK_M;
    cp_async_wait<0>();
    __syncthreads();  // tile i landed and visible; every warp finished step i − 1 (other stage, S, P free)
    if (i + 1 < G.tr) {
      const uint32_t next = uint32_t((st ^ 1) * T::kTileQ);
      load_rows_async<HEAD_DIM, BLOCK_M>(sQ + next, Q + base, stride, is + G.br, N);
      load_rows_async<HEAD_DIM, BLOCK_M>(sdO + next, dO + base, stride, is + G.br, N);
      load_stats_async(sL + uint32_t((st ^ 1) * T::kTileL), LSE + stat, D + stat, is + G.br, N);
    }
    cp_async_commit();

    scores_to_smem<HEAD_DIM, kBf16>(G, v, sQ + stage, sdO + stage, sK, sV, w);  // A
    __syncthreads();  // S and dP complete: the convolution reads neighbouring rows and keys
    convolutions<HEAD_DIM, kBf16, CQ>(G, v, w);  // B, barrier, C
    __syncthreads();  // P and dS complete: the products read other warps' rows and keys
    dq_to_accumulator<HEAD_DIM, kBf16>(G, v, sK, dQaccum + base, w);  // D
    warp_gemm_xtb<HEAD_DIM, BLOCK_M, BLOCK_N, T::kDkvNT, kBf16>(acc_dv, v.sP, 32 * w.wk, sdO + stage,
                                                                w.wd * (HEAD_DIM / 2), lane);
    warp_gemm_xtb<HEAD_DIM, BLOCK_M, BLOCK_N, T::kDkvNT, kBf16>(acc_dk, v.sdS, 32 * w.wk, sQ + stage,
                                                                w.wd * (HEAD_DIM / 2), lane);
  }
  cp_async_wait<0>();  // no copy may still write SRAM when the block exits (empty groups)
  __syncthreads();     // every warp's dW adds are in SRAM
  for (int tap = threadIdx.x; tap < taps; tap += kThreads) atomicAdd(dWg + std::size_t(h) * taps + tap, v.dW[tap]);

  store_dk_dv<T::kDkvNT, kBf16>(G, js, acc_dk, acc_dv, dK + base, dV + base, w);
}

/// dQ = scale · dQaccum → 16 bits, two elements per thread (grid-stride; both layouts [B, N, H, d]).
template <bool kBf16>
__global__ void __launch_bounds__(256) mta_fast_dq_convert_kernel(const float2* __restrict__ acc,
                                                                  uint32_t* __restrict__ dQ, std::size_t pairs,
                                                                  float scale) {
  for (std::size_t k = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; k < pairs;
       k += std::size_t(gridDim.x) * blockDim.x) {
    const float2 a = acc[k];
    dQ[k] = pack2<kBf16>(a.x * scale, a.y * scale);
  }
}

template <int HEAD_DIM, bool kBf16, int CQ>
void launch_gradients(const Geometry& G, const Problem& p, const BwdArgs& a, cudaStream_t stream) {
  using T = BwdTraits<HEAD_DIM>;
  auto kernel = &mta_fast_bwd_kernel<HEAD_DIM, kBf16, CQ>;
  // > 48 KiB of dynamic SRAM: opted in per device (the record is kept, thread-safe: common.hpp).
  set_smem(reinterpret_cast<const void*>(kernel), T::kSmem, "mta_fast_bwd_kernel", p);
  announce("mta_fast_bwd_kernel");
  kernel<<<dim3(G.heads, G.tc, G.batch), kThreads, T::kSmem, stream>>>(G, a.Q, a.K, a.V, a.dO, a.W, a.LSE, a.D,
                                                                      a.dQaccum, a.dK, a.dV, a.dW);
  FLASHLAB_CUDA_CHECK_LAUNCH("mta_fast_bwd_kernel");
}

template <int HEAD_DIM, bool kBf16>
void launch(const Geometry& G, const BwdArgs& a, cudaStream_t stream) {
  Problem p;  // the attention launch description, for the shared preprocess kernel and set_smem
  p.batch = G.batch;
  p.seq = G.seq;
  p.heads = G.heads;
  p.head_dim = G.head_dim;
  p.causal = true;
  p.scale = G.scale;
  const std::size_t numel = std::size_t(G.batch) * G.seq * G.row_stride();
  FLASHLAB_CUDA_CHECK(cudaMemsetAsync(a.dQaccum, 0, numel * sizeof(float), stream));
  FLASHLAB_CUDA_CHECK(cudaMemsetAsync(a.dW, 0, std::size_t(G.heads) * G.taps() * sizeof(float), stream));
  BwdPointers bp{};
  bp.O = a.O;
  bp.dO = a.dO;
  bp.D = a.D;
  launch_fast_bwd_preprocess<HEAD_DIM, kBf16>(p, bp, stream);

  // Kernel heights with their own specialisation (the sizes the MTA paper and the benchmarks use);
  // every other cq runs the general kernel.
  switch (G.cq) {
    case 3: launch_gradients<HEAD_DIM, kBf16, 3>(G, p, a, stream); break;
    case 6: launch_gradients<HEAD_DIM, kBf16, 6>(G, p, a, stream); break;
    case 11: launch_gradients<HEAD_DIM, kBf16, 11>(G, p, a, stream); break;
    default: launch_gradients<HEAD_DIM, kBf16, 0>(G, p, a, stream);
  }

  const std::size_t pairs = numel / 2;  // d is even
  const unsigned blocks = unsigned(std::min<std::size_t>((pairs + 255) / 256, 4096));
  announce("mta_fast_dq_convert_kernel");
  mta_fast_dq_convert_kernel<kBf16><<<blocks, 256, 0, stream>>>(reinterpret_cast<const float2*>(a.dQaccum),
                                                                reinterpret_cast<uint32_t*>(a.dQ), pairs, G.scale);
  FLASHLAB_CUDA_CHECK_LAUNCH("mta_fast_dq_convert_kernel");
}

}  // namespace

void launch_backward(const Geometry& g, bool bf16, const BwdArgs& a, cudaStream_t stream) {
  if (g.head_dim == 64) {
    if (bf16) launch<64, true>(g, a, stream);
    else launch<64, false>(g, a, stream);
  } else {
    if (bf16) launch<128, true>(g, a, stream);
    else launch<128, false>(g, a, stream);
  }
}

}  // namespace flashlab::cuda::detail::mta_fast
