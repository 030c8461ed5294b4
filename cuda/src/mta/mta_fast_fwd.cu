// mta_fast_fwd.cu — the fast Multi-Token Attention forward on tensor cores (mta_fast.hpp).
//
// One thread block (4 warps) per query tile of Br = 64 effective rows of one (batch, head), in
// the FlashAttention-2 order: O_i (fp32 mma accumulators), m_i and ℓ_i stay in registers across
// the key tiles and O_i is written once at the end — the clear kernel (mta_fwd.cu) instead
// read-modify-writes O in HBM per key tile, as the source does. Per key tile j (Bc = 64 keys):
//   1. S = Q Kᵀ on tensor cores (mma.sync m16n8k16, fp32) for the tile with its
//      halo: query rows i0 − 16 … i0 + 63 and keys j0 − 8 … j0 + 71 (mta_fast_tile.cuh), causal
//      zeros (key > query → 0), written to SRAM in fp32. Each warp owns 16 rows of the tile (its
//      Q fragments stay in registers) and a share of the 16 halo rows (skipped when Pq = 0).
//   2. Ŝ = Conv2D(S, W·scale·log2 e) on CUDA cores in fp32 (conv_strip: 32 keys of one row per
//      thread; the convolution is linear, so folding the scale into W gives Ŝ in base-2 units),
//      then −∞ where key > query, to SRAM.
//   3. Online softmax in base 2 on Ŝ read back in the mma fragment layout, P rounded to the input
//      dtype as the A fragment of O_i += P V_j (V_j via ldmatrix.trans).
// K_j and V_j have one SRAM buffer each, refilled as soon as the previous step is done with them
// (K_{j+1} is loaded during the convolution, softmax and P V of step j, V_j during S), so the
// copies overlap the math. Two barriers per step: each warp convolves the 16 rows of Ŝ it then
// reads itself, so only a warp barrier separates steps 2 and 3.
// Linear path (bf16, ck ≤ 3, by the API's policy): on the key tiles 0 … T_lin − 1, left of the
// diagonal band, where the causal zeros before the convolution change nothing, steps 1–2 become
// Ŝ = Σ_b Q̃_b K_bᵀ (Q̃_b = Σ_a W[a, b]·Q shifted by a − Pq rows, built once per block in two bf16
// terms), one tensor-core product from SRAM, no S round trip, no convolution FMAs, no masks; the
// band's tiles then take the steps above. One barrier pair per tile on both paths. An accuracy
// guard (kLinearGuard) sends the block to the masked path at the first key tile where
// max|Q̃|·max|K_j| is too large for two bf16 terms (inputs far from unit scale).
// Key tiles entirely right of the block's last row are never loaded: Br = Bc, so query tile i
// visits key tiles 0 … i. The bottom query tiles (the most key tiles) of every head start first
// (block_coords).
// The source's order (measurement only, launch_fast_forward_source_order): the same kernel with
// kOInHbm = true sends O_i (fp32), m_i and ℓ_i to a workspace after each key tile and reads them
// back before the next; the default instantiation has none of that code.
// Rows outside [0, N) of every tile are zero-filled by cp.async: they are exactly the zero
// padding of the convolution (S = 0 there), so no branch treats the sequence ends specially.
#include "mta/mta_fast_tile.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace flashlab::cuda::detail::mta {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kMaxCq = 16;  // cq ≤ 16 (check_fast_shape)
static_assert(kFastBr == 16 * kWarps, "one m16 row block of the tile per warp");
static_assert(kFastBr == kFastBc, "query tile i visits key tiles 0 … i only when Br = Bc");
static_assert(kFastBc == 2 * kConvStrip && kFastBr == 16 * kWarps, "the convolution gives each lane one strip of its warp's 16 rows");

/// SRAM layout (byte offsets): K tile [80][d], V tile [64][d] (16-bit, swizzled), W·scale·log2(e)
/// [16][kWPitch] fp32, then one region used two ways. Masked path: Q tile [80][d] (16-bit,
/// swizzled), S [80][kLdS] fp32, Ŝ [64][kLdP] fp32. Linear path (the off-diagonal key tiles, which
/// come first): Q̃ [2·ck][64][d] (16-bit, swizzled), written over Q, S and Ŝ; Q is loaded
/// again before the first masked tile. The K buffer holds the Q tile while Q̃ is built.
template <int HEAD_DIM>
struct FwdSmem {
  static constexpr int kRowBytes = HEAD_DIM * 2;
  static constexpr int kK = 0;
  static constexpr int kV = kK + kSCols * kRowBytes;
  static constexpr int kW = kV + kFastBc * kRowBytes;
  static constexpr int kQ = kW + kMaxCq * kWPitch * 4;  // the region; Q̃ on the linear path
  static constexpr int kS = kQ + kSRows * kRowBytes;
  static constexpr int kP = kS + kSRows * kLdS * 4;
  static constexpr int kBytes = kP + kFastBr * kLdP * 4;
  static constexpr int kQtTile = kFastBr * kRowBytes;  // one Q̃_{t,b} tile
  /// Bytes a launch needs: the masked layout, or more when Q̃ outgrows its region (d = 128).
  static constexpr int bytes(bool linear, int ck) {
    const int q_tilde_end = kQ + (linear ? kQTildeTerms * ck * kQtTile : 0);
    return q_tilde_end > kBytes ? q_tilde_end : kBytes;
  }
  static constexpr int kMaxBytes = bytes(true, kLinearMaxCk);
  /// Blocks per SM the SRAM allows the masked layout (228 KiB per SM, 1 KiB reserved per block).
  static constexpr int kMinBlocks = (228 * 1024) / (kBytes + 1024);
  static_assert(kQ % 128 == 0 && kS % 16 == 0, "swizzled tiles start on 128-byte lines");
};

/// Step 1: this warp's part of S (raw Q·Kᵀ: the scale is folded into W; causal zeros) for key
/// tile j0 into SRAM.
/// Own rows: S-tile rows 16 + 16·warp … +15, all 80 keys, A fragments from `q_frag`. Halo rows
/// 0 … 15 (only when Pq > 0): key pairs (16 keys) np ≡ warp (mod 4), A fragments from SRAM.
/// Pairs right of the diagonal are computed too (and zeroed): only the last key tile has any.
template <int HEAD_DIM, bool kBf16>
__device__ __forceinline__ void scores_to_smem(float* __restrict__ sS, const uint32_t (&q_frag)[HEAD_DIM / 16][4],
                                               uint32_t q_lane, uint32_t q_xor, uint32_t k_lane, uint32_t k_xor,
                                               int warp, int g, int t, int i0, int j0, int pq) {
  constexpr int kRowBytes = HEAD_DIM * 2;
  constexpr int kPairs = kSCols / 16;  // 5 pairs of n8 tiles
  // Writes one m16n8 C fragment (S-tile rows row_s0 + g (+8), keys 8·n + 2t (+1)); `mask`:
  // the tile reaches right of the diagonal, so keys after their query are zeroed first.
  auto store = [&](const float (&c)[4], int row_s0, int n, bool mask) {
    float v[4] = {c[0], c[1], c[2], c[3]};
    if (mask) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int gi = i0 - kHaloRows + row_s0 + g + 8 * (e >> 1), gj = j0 - kHaloCols + 8 * n + 2 * t + (e & 1);
        if (gj > gi) v[e] = 0.f;
      }
    }
    float* at = sS + (row_s0 + g) * kLdS + 8 * n + 2 * t;
    *reinterpret_cast<float2*>(at) = make_float2(v[0], v[1]);
    *reinterpret_cast<float2*>(at + 8 * kLdS) = make_float2(v[2], v[3]);
  };
  const int last_key = j0 - kHaloCols + kSCols - 1;  // the tile's last key (halo included)
  // k-steps outer, key pairs inner: the 10 accumulators of the own rows (and the 2 or 4 of the
  // halo rows) are independent chains, so consecutive mma do not wait on each other.
  const bool halo = pq > 0;  // the convolution reads halo rows
  float s[2 * kPairs][4], hs[2][2][4];
#pragma unroll
  for (int n = 0; n < 2 * kPairs; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
  for (int p = 0; p < 2; ++p)
#pragma unroll
    for (int e = 0; e < 4; ++e) hs[p][0][e] = hs[p][1][e] = 0.f;
#pragma unroll
  for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
    uint32_t ha[4] = {0u, 0u, 0u, 0u};  // halo rows' A fragment of this k-step
    if (halo) ldsm_x4(q_lane + ((32 * kk) ^ q_xor), ha[0], ha[1], ha[2], ha[3]);
    // All B fragments of this k-step first (keys 16·np + [0, 16), dims 16·kk + [0, 16)), then the
    // mma: each ldmatrix's latency is then paid once per k-step, not once per mma pair.
    uint32_t b[kPairs][4];
#pragma unroll
    for (int np = 0; np < kPairs; ++np)
      ldsm_x4(k_lane + 16 * np * kRowBytes + ((32 * kk) ^ k_xor), b[np][0], b[np][1], b[np][2], b[np][3]);
#pragma unroll
    for (int np = 0; np < kPairs; ++np) {
      mma16816<kBf16>(s[2 * np], q_frag[kk], b[np][0], b[np][1]);
      mma16816<kBf16>(s[2 * np + 1], q_frag[kk], b[np][2], b[np][3]);
    }
    if (halo) {  // halo pairs: warp 0 takes 0 and 4, warp w < 4 takes w (own B fragment load)
#pragma unroll
      for (int p = 0; p < 2; ++p) {
        const int np = warp + kWarps * p;
        if (np < kPairs) {
          uint32_t hb[4];
          ldsm_x4(k_lane + 16 * np * kRowBytes + ((32 * kk) ^ k_xor), hb[0], hb[1], hb[2], hb[3]);
          mma16816<kBf16>(hs[p][0], ha, hb[0], hb[1]);
          mma16816<kBf16>(hs[p][1], ha, hb[2], hb[3]);
        }
      }
    }
  }
  const bool mask = last_key > i0 + 16 * warp;  // some key after the warp's first row
#pragma unroll
  for (int n = 0; n < 2 * kPairs; ++n) store(s[n], kHaloRows + 16 * warp, n, mask);
  if (!halo) return;
  const bool halo_mask = last_key > i0 - kHaloRows;
#pragma unroll
  for (int p = 0; p < 2; ++p) {
    const int np = warp + kWarps * p;
    if (np < kPairs) {
      store(hs[p][0], 0, 2 * np, halo_mask);
      store(hs[p][1], 0, 2 * np + 1, halo_mask);
    }
  }
}

/// Step 2: this thread's strip of Ŝ (row r = 16·warp + lane mod 16, keys 32·(lane div 16) + [0, 32):
/// the warp's own rows, which only it reads in step 3)
/// = Conv2D(S, W), −∞ where key > query, into SRAM (16-byte stores). A strip entirely right of
/// the diagonal is −∞ without a convolution.
__device__ __forceinline__ void convolve_to_smem(float* __restrict__ sP, const float* __restrict__ sS,
                                                 const float* __restrict__ sW, int warp, int lane, int i0, int j0,
                                                 int cq, int ck) {
  const float NEG_INF = __int_as_float(0xff800000);
  const int r = 16 * warp + (lane & 15), c0 = kConvStrip * (lane >> 4);
  const int gi = i0 + r, gj0 = j0 + c0;
  float acc[kConvStrip];
  if (gj0 > gi) {
#pragma unroll
    for (int x = 0; x < kConvStrip; ++x) acc[x] = NEG_INF;
  } else {
    // Tap (a, b) of output (r, c) reads S[i + a − Pq, j + b − Pk]: S-tile row 16 + r + a − Pq.
    conv_strip_any(ck, sS, kLdS, sW, cq, kHaloRows + r - (cq - 1), c0, acc);
    if (gj0 + kConvStrip - 1 > gi) {
#pragma unroll
      for (int x = 0; x < kConvStrip; ++x)
        if (gj0 + x > gi) acc[x] = NEG_INF;
    }
  }
  float4* out = reinterpret_cast<float4*>(sP + r * kLdP + c0);
#pragma unroll
  for (int m = 0; m < kConvStrip / 4; ++m) out[m] = make_float4(acc[4 * m], acc[4 * m + 1], acc[4 * m + 2], acc[4 * m + 3]);
}

/// Linear path, once per block: Q̃_{t,b}[r] = Σ_a W[a, b]·scale·log2(e)·Q[i0 + r + a − Pq] (tap
/// (a, b) of Ŝ[i, j] reads S[i + a − Pq, j + b − Pk]) for the Br
/// own rows r and every tap column b, summed in fp32 and stored as kQTildeTerms bf16 tiles (t = 0:
/// the rounding of the sum; t = 1: the rounding of what that left over), tile t·ck + b. `q` is the
/// Q tile (rows i0 − 16 …, swizzled) in the K buffer, `qt` the region; bf16 only.
/// Returns the largest |Q̃| this thread built (as bits: NaN's exceed every number's), for the guard.
template <int HEAD_DIM>
__device__ __forceinline__ uint32_t build_q_tilde(unsigned char* __restrict__ qt, const unsigned char* __restrict__ q,
                                                  const float* __restrict__ sW, int cq, int ck) {
  uint32_t max_bits = 0u;
  constexpr int kChunks = HEAD_DIM / 8;  // 16-byte chunks (8 values) per row
  constexpr int kQtTile = FwdSmem<HEAD_DIM>::kQtTile;
  for (int idx = int(threadIdx.x); idx < kFastBr * kChunks; idx += kThreads) {
    const int r = idx / kChunks, c = idx % kChunks;
    float sum[kLinearMaxCk][8];
#pragma unroll
    for (int b = 0; b < kLinearMaxCk; ++b)
#pragma unroll
      for (int e = 0; e < 8; ++e) sum[b][e] = 0.f;
    for (int a = 0; a < cq; ++a) {
      const uint4 raw = *reinterpret_cast<const uint4*>(q + swz<HEAD_DIM>(kHaloRows + r + a - (cq - 1), c));
      const uint32_t w2[4] = {raw.x, raw.y, raw.z, raw.w};
      float x[8];  // bf16 → fp32 is a 16-bit shift
#pragma unroll
      for (int e = 0; e < 4; ++e) x[2 * e] = __uint_as_float(w2[e] << 16), x[2 * e + 1] = __uint_as_float(w2[e] & 0xffff0000u);
#pragma unroll
      for (int b = 0; b < kLinearMaxCk; ++b) {  // sW is zero right of column ck
        const float wab = sW[a * kWPitch + b];
#pragma unroll
        for (int e = 0; e < 8; ++e) sum[b][e] = fmaf(wab, x[e], sum[b][e]);
      }
    }
#pragma unroll
    for (int b = 0; b < kLinearMaxCk; ++b) {
      if (b >= ck) break;
#pragma unroll
      for (int e = 0; e < 8; ++e) max_bits = max(max_bits, __float_as_uint(fabsf(sum[b][e])));
#pragma unroll
      for (int t = 0; t < kQTildeTerms; ++t) {
        uint32_t packed[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          packed[e] = pack2<true>(sum[b][2 * e], sum[b][2 * e + 1]);
          // What the rounding left over (exact in fp32), for the next term.
          sum[b][2 * e] -= __uint_as_float(packed[e] << 16);
          sum[b][2 * e + 1] -= __uint_as_float(packed[e] & 0xffff0000u);
        }
        *reinterpret_cast<uint4*>(qt + (t * ck + b) * kQtTile + swz<HEAD_DIM>(r, c)) =
            make_uint4(packed[0], packed[1], packed[2], packed[3]);
      }
    }
  }
  return max_bits;
}

/// Linear path, per off-diagonal key tile: this warp's 16 rows of Ŝ (base-2 units), in the mma C
/// layout, as one tensor-core product of inner dimension 2·CK·d:
///   Ŝ[i, j] = Σ_t Σ_b ⟨Q̃_{t,b}[i], K[j + b − Pk]⟩,
/// K[j + b − Pk] being row kHaloCols + (j − j0) + b − Pk of the K tile: the B fragments of tap b
/// are ldmatrix reads at a row offset (the swizzle is that of the actual row). Exact algebra of
/// the convolution wherever the causal zeros before it do nothing (the caller's condition).
template <int HEAD_DIM, int CK, bool kBf16>
__device__ __forceinline__ void linear_scores(float (&s)[kFastBc / 8][4], uint32_t qt_lane, uint32_t q_xor,
                                              uint32_t sK, int lane) {
  constexpr int PK = (CK - 1) / 2;
  constexpr int kRowBytes = HEAD_DIM * 2;
  constexpr int kQtTile = FwdSmem<HEAD_DIM>::kQtTile;
#pragma unroll
  for (int n = 0; n < kFastBc / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
  const int mi = lane >> 3;
#pragma unroll
  for (int b = 0; b < CK; ++b) {
    const int k_row = (lane & 7) + ((mi >> 1) << 3) + kHaloCols + b - PK;
    const uint32_t k_lane = sK + uint32_t(k_row * kRowBytes);
    const uint32_t k_xor = uint32_t(((mi & 1) ^ (k_row & 7)) << 4);
#pragma unroll
    for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
      uint32_t bf[kFastBc / 16][4];  // K_b's B fragments serve every term
#pragma unroll
      for (int np = 0; np < kFastBc / 16; ++np)
        ldsm_x4(k_lane + 16 * np * kRowBytes + ((32 * kk) ^ k_xor), bf[np][0], bf[np][1], bf[np][2], bf[np][3]);
#pragma unroll
      for (int t = 0; t < kQTildeTerms; ++t) {
        uint32_t a[4];
        ldsm_x4(qt_lane + uint32_t((t * CK + b) * kQtTile) + ((32 * kk) ^ q_xor), a[0], a[1], a[2], a[3]);
#pragma unroll
        for (int np = 0; np < kFastBc / 16; ++np) {
          mma16816<kBf16>(s[2 * np], a, bf[np][0], bf[np][1]);
          mma16816<kBf16>(s[2 * np + 1], a, bf[np][2], bf[np][3]);
        }
      }
    }
  }
}

/// Step 3, both paths: online softmax (base 2) on this warp's 16 rows of Ŝ (mma C layout), then
/// O_i += P V_j with P rounded to 16 bits (C layout of two n8 tiles = A layout of one k16 step).
template <int HEAD_DIM, bool kBf16>
__device__ __forceinline__ void softmax_pv(float (&s)[kFastBc / 8][4], float (&acc)[HEAD_DIM / 8][4],
                                           float (&m_i)[2], float (&l_i)[2], uint32_t v_lane, uint32_t v_xor) {
  constexpr int kRowBytes = HEAD_DIM * 2;
  constexpr int kNTilesP = kFastBc / 8;
  constexpr int kNTilesO = HEAD_DIM / 8;
  const float NEG_INF = __int_as_float(0xff800000);
  bool max_moved = false;  // some row of this thread has a new maximum (α ≠ 1)
  float alpha[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float part[kNTilesP];  // row maximum as a tree (4 levels, not a chain of 16)
#pragma unroll
    for (int n = 0; n < kNTilesP; ++n) part[n] = fmaxf(s[n][2 * r], s[n][2 * r + 1]);
#pragma unroll
    for (int w = kNTilesP / 2; w > 0; w /= 2)
#pragma unroll
      for (int n = 0; n < w; ++n) part[n] = fmaxf(part[n], part[n + w]);
    float mx = part[0];
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));  // the quad holds one row
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m_i[r], mx);
    // A row with only −∞ so far keeps m = −∞; subtracting 0 then avoids 2^(−∞ + ∞) = NaN.
    const float m_ref = m_new == NEG_INF ? 0.f : m_new;
    alpha[r] = ex2(m_i[r] - m_ref);
    max_moved |= m_new != m_i[r];
#pragma unroll
    for (int n = 0; n < kNTilesP; ++n) {
      s[n][2 * r] = ex2(s[n][2 * r] - m_ref);
      s[n][2 * r + 1] = ex2(s[n][2 * r + 1] - m_ref);
      part[n] = s[n][2 * r] + s[n][2 * r + 1];
    }
#pragma unroll
    for (int w = kNTilesP / 2; w > 0; w /= 2)  // row sum as a tree too
#pragma unroll
      for (int n = 0; n < w; ++n) part[n] += part[n + w];
    l_i[r] = l_i[r] * alpha[r] + part[0];
    m_i[r] = m_new;
  }
  // acc = diag(α)·acc, skipped when no row of the warp has a new maximum (α = 2^0 = 1 exactly:
  // identical results; one warp vote), as attention_fwd_tc.cu's lazy rescale.
  if (__any_sync(0xffffffffu, max_moved)) {
#pragma unroll
    for (int n = 0; n < kNTilesO; ++n) {
      acc[n][0] *= alpha[0];
      acc[n][1] *= alpha[0];
      acc[n][2] *= alpha[1];
      acc[n][3] *= alpha[1];
    }
  }
#pragma unroll
  for (int kk = 0; kk < kFastBc / 16; ++kk) {
    uint32_t a[4];
    a[0] = pack2<kBf16>(s[2 * kk][0], s[2 * kk][1]);
    a[1] = pack2<kBf16>(s[2 * kk][2], s[2 * kk][3]);
    a[2] = pack2<kBf16>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    a[3] = pack2<kBf16>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    // B fragments in groups of 4 (keys 16·kk + [0, 16), dims 16·np + [0, 16)) loaded before their
    // mma, so the ldmatrix latencies overlap.
#pragma unroll
    for (int np0 = 0; np0 < kNTilesO / 2; np0 += 4) {
      uint32_t b[4][4];
#pragma unroll
      for (int q = 0; q < 4; ++q)
        ldsm_x4_trans(v_lane + 16 * kk * kRowBytes + ((32 * (np0 + q)) ^ v_xor), b[q][0], b[q][1], b[q][2], b[q][3]);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        mma16816<kBf16>(acc[2 * (np0 + q)], a, b[q][0], b[q][1]);
        mma16816<kBf16>(acc[2 * (np0 + q) + 1], a, b[q][2], b[q][3]);
      }
    }
  }
}

/// The source's order, for measurement only (kOInHbm): between two key tiles the block's
/// unnormalised O_i (fp32), m_i and ℓ_i leave the chip and come back. Workspace of one (batch,
/// head): O [Tq·Br][d] fp32, then m [Tq·Br], then ℓ [Tq·Br] (rows padded to whole tiles, so no
/// bounds checks). The accesses are volatile asm, so the compiler cannot keep the values in
/// registers across the trip; .cg loads read L2, as a fresh read of O by another launch would.
struct OrderWorkspace {
  float* o;   ///< this block's head: O rows [0, Tq·Br) × d
  float* m;   ///< m_i of the head's rows
  float* l;   ///< ℓ_i of the head's rows (the whole row's sum)
};

__device__ __forceinline__ void st_f2(float* at, float x, float y) {
  asm volatile("st.global.v2.f32 [%0], {%1, %2};" ::"l"(at), "f"(x), "f"(y) : "memory");
}
__device__ __forceinline__ void ld_f2(const float* at, float& x, float& y) {
  asm volatile("ld.global.cg.v2.f32 {%0, %1}, [%2];" : "=f"(x), "=f"(y) : "l"(at) : "memory");
}
__device__ __forceinline__ void st_f1(float* at, float x) {
  asm volatile("st.global.f32 [%0], %1;" ::"l"(at), "f"(x) : "memory");
}
__device__ __forceinline__ float ld_f1(const float* at) {
  float x;
  asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(x) : "l"(at) : "memory");
  return x;
}

/// Source order: this thread's part of O_i, m_i, ℓ_i (rows `row0` + g (+8) of the head) → HBM.
/// ℓ_i is summed over the quad first and stored by lane t = 0: the workspace holds the row's ℓ.
template <int HEAD_DIM>
__device__ __forceinline__ void o_state_store(const OrderWorkspace& ws, const float (&acc)[HEAD_DIM / 8][4],
                                              const float (&m_i)[2], const float (&l_i)[2], int row0, int g, int t) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + g + 8 * r;
    float l = l_i[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
#pragma unroll
    for (int n = 0; n < HEAD_DIM / 8; ++n) st_f2(ws.o + std::size_t(row) * HEAD_DIM + 8 * n + 2 * t, acc[n][2 * r], acc[n][2 * r + 1]);
    if (t == 0) {
      st_f1(ws.m + row, m_i[r]);
      st_f1(ws.l + row, l);
    }
  }
}

/// Source order: O_i, m_i, ℓ_i back from HBM (what o_state_store wrote); ℓ_i goes to lane t = 0,
/// 0 to the others, so the quad's partial sums still add up to the row's ℓ.
template <int HEAD_DIM>
__device__ __forceinline__ void o_state_load(const OrderWorkspace& ws, float (&acc)[HEAD_DIM / 8][4], float (&m_i)[2],
                                             float (&l_i)[2], int row0, int g, int t) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + g + 8 * r;
#pragma unroll
    for (int n = 0; n < HEAD_DIM / 8; ++n) ld_f2(ws.o + std::size_t(row) * HEAD_DIM + 8 * n + 2 * t, acc[n][2 * r], acc[n][2 * r + 1]);
    m_i[r] = ld_f1(ws.m + row);
    const float l = ld_f1(ws.l + row);
    l_i[r] = t == 0 ? l : 0.f;
  }
}

/// Key tiles 0 … T_lin − 1 whose every key the convolution reads (j0 − Pk … j0 + Bc − 1 + Pk)
/// precedes every query row it reads (i0 − Pq …): there the causal zeros before the convolution
/// change nothing, so the linear path's algebra is exact. 0 when the launch takes no linear path.
/// Always < Tc: the diagonal tile takes the masked path.
__device__ __forceinline__ int linear_tile_count(const FastLaunch& L, int i0) {
  const int last = i0 - (L.cq - 1) - (L.ck - 1) / 2 - (kFastBc - 1);  // last key start allowed
  return L.bf16 && L.linear && last >= 0 ? last / kFastBc + 1 : 0;
}

/// This block's query tile and (batch, head). Blocks start in the order of their linear index,
/// x fastest: rank r takes query tile Tq − 1 − r / (H·B) of head r mod (H·B), so the longest
/// blocks of every head start first and the shortest fill the last wave (with the tile in x alone,
/// the last heads' longest blocks started last and left SMs idle at the end).
struct BlockCoords {
  int tile, h, b;
};
__device__ __forceinline__ BlockCoords block_coords() {
  const int heads_batches = int(gridDim.y * gridDim.z);
  const int rank = int(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
  const int hb = rank % heads_batches;
  return {int(gridDim.x) - 1 - rank / heads_batches, hb % int(gridDim.y), hb / int(gridDim.y)};
}

/// Grid (⌈N/Br⌉, H, B), kThreads threads, FwdSmem::bytes(linear, ck) of dynamic SRAM.
/// kOInHbm (measurement only): the source's order, O_i, m_i, ℓ_i through `order_ws` (fp32,
/// [B·H][Tq·Br][d] then m and ℓ [B·H][Tq·Br]) between key tiles; false: the default, which never
/// reads `order_ws` (compiles to the same code as without it).
template <int HEAD_DIM, bool kBf16, bool kOInHbm = false>
__global__ void __launch_bounds__(kThreads, FwdSmem<HEAD_DIM>::kMinBlocks)
    mta_fast_fwd_kernel(FastLaunch L, const uint16_t* __restrict__ Q, const uint16_t* __restrict__ K,
                        const uint16_t* __restrict__ V, const float* __restrict__ W, uint16_t* __restrict__ O,
                        float* __restrict__ LSE, float* order_ws) {
  using Sm = FwdSmem<HEAD_DIM>;
  constexpr int kRowBytes = HEAD_DIM * 2;
  constexpr int kKSteps = HEAD_DIM / 16;  // k-steps of S = Q Kᵀ
  constexpr int kNTilesP = kFastBc / 8;   // n8 tiles of Ŝ per warp row block
  constexpr int kNTilesO = HEAD_DIM / 8;  // n8 tiles of O_i
  const float NEG_INF = __int_as_float(0xff800000);

  const int N = L.seq;
  const BlockCoords at = block_coords();
  const int tile = at.tile, h = at.h, b = at.b;
  const int i0 = tile * kFastBr;
  const std::size_t stride = L.row_stride(), base = L.head_offset(b, h);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, t = lane & 3;  // mma fragment coordinates
  const int taps = L.cq * L.ck;
  const int Tc = tile + 1;
  int T_lin = kBf16 ? linear_tile_count(L, i0) : 0;  // lowered where the accuracy guard trips

  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t s0 = uint32_t(__cvta_generic_to_shared(smem_raw));
  const uint32_t sQ = s0 + Sm::kQ, sK = s0 + Sm::kK, sV = s0 + Sm::kV;
  float* sS = reinterpret_cast<float*>(smem_raw + Sm::kS);
  float* sP = reinterpret_cast<float*>(smem_raw + Sm::kP);
  float* sW = reinterpret_cast<float*>(smem_raw + Sm::kW);

  // W·scale·log2(e) → SRAM, rows padded to kWPitch (visible after the first barrier): the
  // convolution is linear, so Ŝ comes out in base-2 units from raw S. Then Q rows i0 − 16 … i0 + 63
  // and K_0 (keys −8 … 71). The linear path first stages Q in the K buffer and builds Q̃ from it.
  for (int x = threadIdx.x; x < kMaxCq * kWPitch; x += kThreads) {
    const int a = x / kWPitch, bb = x % kWPitch;
    sW[x] = a < L.cq && bb < L.ck ? W[std::size_t(h) * taps + a * L.ck + bb] * L.scale_log2 : 0.f;
  }
  float q_tilde_max = 0.f;  // max |Q̃| over the block (the linear path's accuracy guard)
  if constexpr (kBf16) {
    if (T_lin > 0) {
      __shared__ uint32_t q_tilde_max_bits;
      if (threadIdx.x == 0) q_tilde_max_bits = 0u;
      load_rows<HEAD_DIM, kSRows, kThreads>(sK, Q + base, stride, i0 - kHaloRows, N);
      cp_async_commit();
      cp_async_wait<0>();
      __syncthreads();  // Q and W visible
      atomicMax(&q_tilde_max_bits, build_q_tilde<HEAD_DIM>(smem_raw + Sm::kQ, smem_raw + Sm::kK, sW, L.cq, L.ck));
      __syncthreads();  // every thread is done with Q in the K buffer; the maximum is complete
      q_tilde_max = __uint_as_float(q_tilde_max_bits);
    }
  }
  if (T_lin == 0) load_rows<HEAD_DIM, kSRows, kThreads>(sQ, Q + base, stride, i0 - kHaloRows, N);
  load_rows<HEAD_DIM, kSCols, kThreads>(sK, K + base, stride, -kHaloCols, N);
  cp_async_commit();

  // ldmatrix lane addresses, as attention_fwd_tc.cu (every block base is a multiple of 8 rows).
  const int mi = lane >> 3;
  const uint32_t q_lane = sQ + uint32_t((lane & 15) * kRowBytes);
  const uint32_t q_xor = uint32_t(((lane >> 4) ^ (lane & 7)) << 4);
  const uint32_t k_lane = sK + uint32_t(((lane & 7) + ((mi >> 1) << 3)) * kRowBytes);
  const uint32_t k_xor = uint32_t(((mi & 1) ^ (lane & 7)) << 4);
  const uint32_t v_lane = sV + uint32_t(((lane & 7) + ((mi & 1) << 3)) * kRowBytes);
  const uint32_t v_xor = uint32_t(((mi >> 1) ^ (lane & 7)) << 4);

  float acc[kNTilesO][4];  // unnormalised O_i, rows g and g + 8 of this warp's 16
#pragma unroll
  for (int n = 0; n < kNTilesO; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
  float m_i[2] = {NEG_INF, NEG_INF}, l_i[2] = {0.f, 0.f};  // l_i: per-thread partial row sums
  OrderWorkspace ws{};
  if constexpr (kOInHbm) {  // this head's part of the source-order workspace
    const std::size_t rows = std::size_t(gridDim.x) * kFastBr, head = std::size_t(b) * L.heads + h;
    const std::size_t heads_rows = rows * L.heads * L.batch;
    ws = {order_ws + head * rows * HEAD_DIM, order_ws + heads_rows * HEAD_DIM + head * rows,
          order_ws + heads_rows * (HEAD_DIM + 1) + head * rows};
  }
  const int ws_row0 = i0 + 16 * warp;  // this warp's first row (source order)

  // Linear path: key tiles 0 … T_lin − 1, one tensor-core product each, no S in SRAM.
  if constexpr (kBf16) {
    const uint32_t qt_lane = q_lane + uint32_t(16 * warp * kRowBytes);  // this warp's rows of Q̃
    for (int j = 0; j < T_lin; ++j) {
      const int j0 = j * kFastBc;
      cp_async_wait<0>();  // K_j landed for this thread
      // … for all (Q̃ too, on the first step); every warp is done with V_{j−1}. The guard, on this
      // thread's chunks of K_j (NaN trips it too): past it, tiles j … go to the masked path.
      const float k_max = own_chunks_abs_max_bf16<HEAD_DIM, kSCols, kThreads>(smem_raw + Sm::kK);
      if (__syncthreads_or(!(q_tilde_max * k_max <= kLinearGuard))) {
        T_lin = j;  // K_j stays; Q goes over Q̃, which no warp reads any more
        load_rows<HEAD_DIM, kSRows, kThreads>(sQ, Q + base, stride, i0 - kHaloRows, N);
        cp_async_commit();
        break;
      }
      load_rows<HEAD_DIM, kFastBc, kThreads>(sV, V + base, stride, j0, N);
      cp_async_commit();
      float s[kNTilesP][4];
      if (L.ck == 3) linear_scores<HEAD_DIM, 3, kBf16>(s, qt_lane, q_xor, sK, lane);
      else linear_scores<HEAD_DIM, 1, kBf16>(s, qt_lane, q_xor, sK, lane);  // ck = 1 (kLinearMaxCk = 3)
      cp_async_wait<0>();  // V_j landed for this thread
      __syncthreads();     // V_j visible; every warp is done with K_j (and, on the last step, Q̃)
      load_rows<HEAD_DIM, kSCols, kThreads>(sK, K + base, stride, j0 + kFastBc - kHaloCols, N);  // j + 1 ≤ tile
      if (j + 1 == T_lin) load_rows<HEAD_DIM, kSRows, kThreads>(sQ, Q + base, stride, i0 - kHaloRows, N);
      cp_async_commit();
      if constexpr (kOInHbm) if (j > 0) o_state_load<HEAD_DIM>(ws, acc, m_i, l_i, ws_row0, g, t);
      softmax_pv<HEAD_DIM, kBf16>(s, acc, m_i, l_i, v_lane, v_xor);
      if constexpr (kOInHbm) if (j + 1 < Tc) o_state_store<HEAD_DIM>(ws, acc, m_i, l_i, ws_row0, g, t);
    }
  }

  // Masked path: the key tiles T_lin … tile (all of them when the launch takes no linear path).
  uint32_t q_frag[kKSteps][4];
  for (int j = T_lin; j < Tc; ++j) {
    const int j0 = j * kFastBc;
    cp_async_wait<0>();  // K_j (and Q on the first step) landed for this thread
    __syncthreads();     // … for all; every warp is done with V_{j−1} and S_{j−1}
    load_rows<HEAD_DIM, kFastBc, kThreads>(sV, V + base, stride, j0, N);
    cp_async_commit();
    if (j == T_lin) {  // this warp's 16 own Q rows: SRAM → registers once, as A fragments
#pragma unroll
      for (int kk = 0; kk < kKSteps; ++kk)
        ldsm_x4(q_lane + (kHaloRows + 16 * warp) * kRowBytes + ((32 * kk) ^ q_xor), q_frag[kk][0], q_frag[kk][1],
                q_frag[kk][2], q_frag[kk][3]);
    }
    scores_to_smem<HEAD_DIM, kBf16>(sS, q_frag, q_lane, q_xor, k_lane, k_xor, warp, g, t, i0, j0, L.cq - 1);
    cp_async_wait<0>();  // V_j landed for this thread
    __syncthreads();     // S complete and V_j visible; K_j may be refilled
    if (j + 1 < Tc) load_rows<HEAD_DIM, kSCols, kThreads>(sK, K + base, stride, j0 + kFastBc - kHaloCols, N);
    cp_async_commit();
    // Each warp convolves its own 16 rows of Ŝ and is their only reader below: a warp barrier
    // suffices between the convolution and the softmax.
    convolve_to_smem(sP, sS, sW, warp, lane, i0, j0, L.cq, L.ck);
    __syncwarp();
    float s[kNTilesP][4];  // this warp's rows of Ŝ, in the mma C layout
#pragma unroll
    for (int n = 0; n < kNTilesP; ++n)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float2 v = *reinterpret_cast<const float2*>(sP + (16 * warp + g + 8 * r) * kLdP + 8 * n + 2 * t);
        s[n][2 * r] = v.x;
        s[n][2 * r + 1] = v.y;
      }
    if constexpr (kOInHbm) if (j > 0) o_state_load<HEAD_DIM>(ws, acc, m_i, l_i, ws_row0, g, t);
    softmax_pv<HEAD_DIM, kBf16>(s, acc, m_i, l_i, v_lane, v_xor);
    if constexpr (kOInHbm) if (j + 1 < Tc) o_state_store<HEAD_DIM>(ws, acc, m_i, l_i, ws_row0, g, t);
  }
  cp_async_wait<0>();  // no copy may still be writing SRAM when the block exits

  // O_i = acc / ℓ_i (input dtype) and LSE_i = m_i + log2(ℓ_i) (fp32, base 2): registers → HBM.
  // ℓ_i = 0 (no visible key; not reachable for rows < N) stores O = 0, LSE = −∞; NaN stays NaN.
  const BlockCoords at_end = block_coords();  // recomputed: cheaper than keeping h, b live
  const std::size_t stat = L.stat_offset(at_end.b, at_end.h);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = l_i[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const float inv_l = l == 0.f ? 0.f : 1.f / l;
    const int row = i0 + 16 * warp + g + 8 * r;
    if (row < N) {
      uint16_t* out = O + base + std::size_t(row) * stride + 2 * t;
#pragma unroll
      for (int n = 0; n < kNTilesO; ++n)
        *reinterpret_cast<uint32_t*>(out + 8 * n) = pack2<kBf16>(acc[n][2 * r] * inv_l, acc[n][2 * r + 1] * inv_l);
      if (t == 0) LSE[stat + row] = l == 0.f ? NEG_INF : m_i[r] + log2f(l);
    }
  }
}

template <int HEAD_DIM, bool kBf16, bool kOInHbm = false>
void launch_one(const FastLaunch& L, const void* Q, const void* K, const void* V, const float* W, void* O, float* LSE,
                cudaStream_t stream, float* order_ws = nullptr) {
  using Sm = FwdSmem<HEAD_DIM>;
  auto kernel = &mta_fast_fwd_kernel<HEAD_DIM, kBf16, kOInHbm>;
  // > 48 KiB of dynamic SRAM: opted in per device (the record is kept, thread-safe: common.hpp).
  opt_in_smem(reinterpret_cast<const void*>(kernel), std::size_t(Sm::kMaxBytes), "mta_fast_fwd_kernel");
  const dim3 grid((L.seq + kFastBr - 1) / kFastBr, L.heads, L.batch);
  const int smem = Sm::bytes(L.linear, L.ck);
  announce("mta_fast_fwd_kernel");
  kernel<<<grid, kThreads, smem, stream>>>(L, static_cast<const uint16_t*>(Q), static_cast<const uint16_t*>(K),
                                                 static_cast<const uint16_t*>(V), W, static_cast<uint16_t*>(O), LSE,
                                                 order_ws);
  FLASHLAB_CUDA_CHECK_LAUNCH("mta_fast_fwd_kernel");
}

}  // namespace

void launch_fast_forward(const FastLaunch& L, const void* Q, const void* K, const void* V, const float* W, void* O,
                         float* LSE, cudaStream_t stream) {
  if (L.head_dim == 64) {
    if (L.bf16) launch_one<64, true>(L, Q, K, V, W, O, LSE, stream);
    else launch_one<64, false>(L, Q, K, V, W, O, LSE, stream);
  } else {
    if (L.bf16) launch_one<128, true>(L, Q, K, V, W, O, LSE, stream);
    else launch_one<128, false>(L, Q, K, V, W, O, LSE, stream);
  }
}

void launch_fast_forward_source_order(const FastLaunch& L, const void* Q, const void* K, const void* V,
                                      const float* W, void* O, float* LSE, float* workspace, cudaStream_t stream) {
  // One instantiation: the shape the measurement is about (the host API refuses others).
  launch_one<64, true, true>(L, Q, K, V, W, O, LSE, stream, workspace);
}

}  // namespace flashlab::cuda::detail::mta
