// Shared pieces of the fast Multi-Token Attention kernels (internal): the launch description,
// the halo tile geometry, a cp.async tile loader that zero-fills rows outside [0, N) at both
// ends, and the on-chip convolution of one row strip of fp32 scores (templated on ck, so that
// the strip's accumulators and the kernel row stay in registers). Names as reference/src/mta:
// Pq, Pk, Br, Bc, m_i, ℓ_i.
//
// Geometry of one (query tile, key tile) step of the forward, in shared memory:
//   S tile: kHaloRows + Br rows (query rows i0 − 16 … i0 + Br − 1) × kHaloCols + Bc + kHaloCols
//   columns (keys j0 − 8 … j0 + Bc + 7), fp32, pitch kLdS; Ŝ of the Br × Bc own block reads
//   S[16 + r + a − Pq][8 + c + b − Pk]. The fixed 16/8 halos cover any Pq ≤ 15, Pk ≤ 7 and keep
//   every tensor-core tile whole (m16, n8).
#pragma once

#include "core/common.hpp"
#if defined(__CUDACC__)
#include "core/tensor_core.cuh"
#endif

#include <cstddef>
#include <cstdint>

namespace flashlab::cuda::detail::mta {

/// Effective query rows per block and keys per key tile (mta_fast.hpp's kFastBr, kFastBc).
inline constexpr int kFastBr = 64;
inline constexpr int kFastBc = 64;
/// Halo query rows above the tile (≥ Pq for cq ≤ 16) and halo keys on each side (≥ Pk for ck ≤ 15).
inline constexpr int kHaloRows = 16;
inline constexpr int kHaloCols = 8;
/// Rows of the loaded Q tile and of the S tile; keys of the loaded K tile and columns of S.
inline constexpr int kSRows = kHaloRows + kFastBr;      // 80
inline constexpr int kSCols = kFastBc + 2 * kHaloCols;  // 80
/// Pitches (floats) of the fp32 S and Ŝ tiles: multiples of 4 (16-byte rows) whose 8
/// consecutive rows start in 8 different 4-bank groups (84 ≡ 20, 76 ≡ 12 mod 32), so the
/// convolution's 16-byte accesses, one row per lane, are conflict-free.
inline constexpr int kLdS = 84;
inline constexpr int kLdP = 76;
static_assert(kLdS >= kSCols + 4 && kLdP >= kFastBc, "the 16-byte window of a strip stays inside its row");
/// Row pitch (floats) of W in SRAM: one 16-byte-aligned row per kernel row (ck ≤ 15 < 16).
inline constexpr int kWPitch = 16;
/// Outputs per thread of the convolution: one row strip of this many consecutive keys.
inline constexpr int kConvStrip = 32;
/// Widest kernel (ck) the forward's linear path takes (mta_fast.hpp's kFastLinearMaxCk): it
/// multiplies the QKᵀ tensor work by 2·ck, so it pays only for narrow kernels.
inline constexpr int kLinearMaxCk = 3;
static_assert(kLinearMaxCk == 3, "the linear path is instantiated for ck = 1 and 3");
/// bf16 terms Q̃ is held in on the linear path (the rounding and its remainder): one term, 2⁻⁹ of
/// |Ŝ|, misses the LSE bar on normal inputs; two are as accurate as the fp32 path.
inline constexpr int kQTildeTerms = 2;
/// The linear path's accuracy guard: a key tile takes it only while max|Q̃|·max|K_j| (Q̃ in base-2
/// units, over the block's Q̃ and the K tile with its halo) stays at most this. Q̃ in two bf16 terms
/// still errs by ~2⁻¹⁷·|Q̃| per element, and Ŝ by that times |K| summed over ck·d products: harmless
/// for inputs of unit scale (the product is 2–8 there), about one rounding floor of O at Q = ±800
/// (a product near 700, where nearly tied scores amplify it). Past the guard the block finishes on
/// the masked path, whose fp32 S is exact to 2⁻²⁴.
inline constexpr float kLinearGuard = 32.f;

/// Everything the fast forward needs besides its pointers (passed by value).
struct FastLaunch {
  int batch = 1, seq = 0, heads = 1, head_dim = 64;  ///< B, N, H, d
  int cq = 1, ck = 1;                                ///< kernel size (Pq = cq − 1, Pk = (ck − 1)/2)
  bool bf16 = true;                                  ///< bf16 (true) or fp16 inputs and output
  float scale_log2 = 0.f;                            ///< softmax scale · log2(e): S in base-2 units
  bool linear = false;  ///< the linear path on the off-diagonal key tiles (bf16, ck ≤ kLinearMaxCk)

  /// Elements between two tokens of one head (H·d).
  FLASHLAB_HD std::size_t row_stride() const { return std::size_t(heads) * head_dim; }
  /// Offset of element (b, token 0, h, 0) in a [B, N, H, d] tensor.
  FLASHLAB_HD std::size_t head_offset(int b, int h) const {
    return std::size_t(b) * seq * row_stride() + std::size_t(h) * head_dim;
  }
  /// Offset of row 0 of head (b, h) in a [B, H, N] statistics vector (LSE).
  FLASHLAB_HD std::size_t stat_offset(int b, int h) const { return (std::size_t(b) * heads + h) * std::size_t(seq); }
};

/// Launches the fast forward (grid ⌈N/Br⌉ × H × B) on `stream`. Device pointers; Q, K, V, O
/// [B, N, H, d] 16-bit; W [H, cq, ck] fp32; LSE [B, H, N] fp32 base 2. Limits are the caller's
/// (check_fast_shape).
void launch_fast_forward(const FastLaunch& L, const void* Q, const void* K, const void* V, const float* W, void* O,
                         float* LSE, cudaStream_t stream);
/// The same forward in the source's order, for measurement (bf16, d = 64 only: the caller checks):
/// O_i (fp32), m_i and ℓ_i go to `workspace` after each key tile and come back before the next.
/// `workspace`: fp32, B·H·⌈N/Br⌉·Br·(d + 2) values.
void launch_fast_forward_source_order(const FastLaunch& L, const void* Q, const void* K, const void* V,
                                      const float* W, void* O, float* LSE, float* workspace, cudaStream_t stream);

#if defined(__CUDACC__)

/// cp.async of rows [row0, row0 + ROWS) of one head of a 16-bit [B, N, H, HEAD_DIM] tensor
/// into a swizzled [ROWS][HEAD_DIM] SRAM tile; rows outside [0, N) (the convolution's zero
/// padding, or past the sequence) are zero-filled and read nothing.
template <int HEAD_DIM, int ROWS, int THREADS>
__device__ __forceinline__ void load_rows(uint32_t smem, const uint16_t* __restrict__ head, std::size_t stride,
                                          int row0, int n) {
  constexpr int kChunks = HEAD_DIM / 8;  // 16-byte chunks per row
  static_assert((ROWS * kChunks) % THREADS == 0, "the tile divides among the threads");
#pragma unroll
  for (int it = 0; it < ROWS * kChunks / THREADS; ++it) {
    const int idx = int(threadIdx.x) + it * THREADS;
    const int r = idx / kChunks, c = idx % kChunks, row = row0 + r;
    const bool ok = row >= 0 && row < n;
    // A zero-filled chunk reads nothing; its address still points inside the tensor.
    cp_async16(smem + swz<HEAD_DIM>(r, c), head + std::size_t(ok ? row : 0) * stride + 8 * c, ok);
  }
}

/// max |x| over the chunks of a 16-bit bf16 [ROWS][HEAD_DIM] SRAM tile that this thread copied
/// with load_rows (visible to it after its own cp.async wait, before any barrier); NaN → NaN.
template <int HEAD_DIM, int ROWS, int THREADS>
__device__ __forceinline__ float own_chunks_abs_max_bf16(const unsigned char* __restrict__ tile) {
  constexpr int kChunks = HEAD_DIM / 8;
  uint32_t m = 0u;  // two bf16 magnitudes; as unsigned 16-bit integers they order as the values
#pragma unroll
  for (int it = 0; it < ROWS * kChunks / THREADS; ++it) {
    const int idx = int(threadIdx.x) + it * THREADS;
    const uint4 v = *reinterpret_cast<const uint4*>(tile + swz<HEAD_DIM>(idx / kChunks, idx % kChunks));
    m = __vmaxu2(m, __vmaxu2(v.x & 0x7fff7fffu, v.y & 0x7fff7fffu));
    m = __vmaxu2(m, __vmaxu2(v.z & 0x7fff7fffu, v.w & 0x7fff7fffu));
  }
  return __uint_as_float(max(m << 16, m & 0xffff0000u));  // NaN's bits exceed every number's
}

/// One strip of Ŝ = Conv2D(S, W), kConvStrip consecutive keys of one query row:
/// acc[x] = Σ_a Σ_b W[a, b] · S[row0 + a][kHaloCols + c0 + x + b − Pk] in S-tile coordinates
/// (`row0` = the S-tile row of tap a = 0, i.e. kHaloRows + r − Pq; `c0` the strip's first key,
/// a multiple of 4). W is [cq][kWPitch] in SRAM (rows padded to 16-byte multiples). Each S row is
/// read once per kernel row in 16-byte loads (`ld` a multiple of 4, the tile 16-byte aligned;
/// Pk is a compile-time constant, so the alignment shift is too) and every value feeds up to CK
/// accumulators from registers.
template <int CK>
__device__ __forceinline__ void conv_strip(const float* __restrict__ s, int ld, const float* __restrict__ w, int cq,
                                           int row0, int c0, float (&acc)[kConvStrip]) {
  constexpr int PK = (CK - 1) / 2;
  constexpr int kShift = (kHaloCols - PK) & 3;  // S column of t = 0 minus the aligned start
  constexpr int kWidth = kConvStrip + CK - 1;   // S values one kernel row of the strip reads
  constexpr int kChunks = (kShift + kWidth + 3) / 4;
  constexpr int kWChunks = (CK + 3) / 4;
#pragma unroll
  for (int x = 0; x < kConvStrip; ++x) acc[x] = 0.f;
  const float* base = s + row0 * ld + (kHaloCols + c0 - PK - kShift);
  for (int a = 0; a < cq; ++a) {
    float wa[4 * kWChunks];
#pragma unroll
    for (int m = 0; m < kWChunks; ++m) {
      const float4 w4 = reinterpret_cast<const float4*>(w + a * kWPitch)[m];
      wa[4 * m] = w4.x, wa[4 * m + 1] = w4.y, wa[4 * m + 2] = w4.z, wa[4 * m + 3] = w4.w;
    }
    const float4* row = reinterpret_cast<const float4*>(base + a * ld);
#pragma unroll
    for (int m = 0; m < kChunks; ++m) {
      const float4 v4 = row[m];
      const float v[4] = {v4.x, v4.y, v4.z, v4.w};
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int t = 4 * m + u - kShift;  // this value is S column kHaloCols + c0 − Pk + t
        if (t < 0 || t >= kWidth) continue;
#pragma unroll
        for (int b = 0; b < CK; ++b) {
          const int x = t - b;  // output x takes it through tap b
          if (x >= 0 && x < kConvStrip) acc[x] = fmaf(wa[b], v[u], acc[x]);
        }
      }
    }
  }
}

/// conv_strip for a run-time ck ∈ {1, 3, …, 15} (one unrolled instance per width).
__device__ __forceinline__ void conv_strip_any(int ck, const float* __restrict__ s, int ld,
                                               const float* __restrict__ w, int cq, int row0, int c0,
                                               float (&acc)[kConvStrip]) {
  switch (ck) {
    case 1: conv_strip<1>(s, ld, w, cq, row0, c0, acc); break;
    case 3: conv_strip<3>(s, ld, w, cq, row0, c0, acc); break;
    case 5: conv_strip<5>(s, ld, w, cq, row0, c0, acc); break;
    case 7: conv_strip<7>(s, ld, w, cq, row0, c0, acc); break;
    case 9: conv_strip<9>(s, ld, w, cq, row0, c0, acc); break;
    case 11: conv_strip<11>(s, ld, w, cq, row0, c0, acc); break;
    case 13: conv_strip<13>(s, ld, w, cq, row0, c0, acc); break;
    default: conv_strip<15>(s, ld, w, cq, row0, c0, acc); break;  // ck = 15 (check_fast_shape)
  }
}

#endif  // __CUDACC__

}  // namespace flashlab::cuda::detail::mta
