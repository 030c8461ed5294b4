// cuda/src/wgmma_fwd_step.cuh — the pieces of one forward step on wgmma that both Hopper forwards
// share (attention_fwd_wgmma.cu and attention_fwd_ws.cu): issue S_ij = Q_i K_jᵀ and
// O_i += P_ij V_j, the masks, the online softmax in base 2, the rescale of O_i, P_ij packed into
// A fragments, and the store of O_i and LSE_i. One warpgroup owns 64 query rows; a thread holds
// two of them (row_base and row_base + 8) in the m64nN accumulator layout (per warp the m16n8 C
// layout repeated over n: element 4t + 2r + e = row row_base + 8r, column 8t + 2·t4 + e).
// The traits T name the tile: kHeadDim, BLOCK_M (Br of the block), BLOCK_N (Bc), kBf16, kCausal.
// Internal to cuda/src; compiled for sm_90a only (hopper.cuh).
#pragma once

#include "common.hpp"
#include "hopper.cuh"
#include "tensor_core.cuh"

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace flashlab::cuda::detail::wgmma_step {

/// Issue S_ij = Q_i K_jᵀ for this warpgroup's 64 rows (d/16 k-steps, the first overwrites:
/// scale-d = 0); not committed. Q_i and K_j are K-major in the 128-byte swizzle: a k16 step
/// inside a 64-column block advances the start by 32 bytes, the next block by rows·128 bytes.
template <class T>
__device__ __forceinline__ void issue_qk(float (&s_acc)[T::BLOCK_N / 2], uint32_t sQ_wg, uint32_t sK) {
#pragma unroll
  for (int kk = 0; kk < T::kHeadDim / 16; ++kk) {
    const uint32_t col = uint32_t(kk / 4), k32 = uint32_t(kk % 4) * 32;  // 64-column block, k16 inside it
    const uint64_t da = smem_desc(sQ_wg + col * T::BLOCK_M * 128 + k32, 16, 1024);
    const uint64_t db = smem_desc(sK + col * T::BLOCK_N * 128 + k32, 16, 1024);
    wgmma_ss_n128<T::kBf16>(s_acc, da, db, kk > 0);
  }
}

/// Issue O_i += P_ij V_j (Bc/16 k-steps, P from registers); not committed. V_j is MN-major:
/// `v_lbo` = bytes between the 64-column blocks of d (BLOCK_N·128), `v_sbo` = 1024 bytes between
/// 8-key groups, a k16 step = 16 keys = 2048 bytes.
template <class T>
__device__ __forceinline__ void issue_pv(float (&o)[T::kHeadDim / 2], const uint32_t (&pa)[T::BLOCK_N / 16][4],
                                         uint32_t sV, uint32_t v_lbo, uint32_t v_sbo) {
#pragma unroll
  for (int kk = 0; kk < T::BLOCK_N / 16; ++kk)
    wgmma_rs<T::kBf16, T::kHeadDim>(o, pa[kk], smem_desc(sV + uint32_t(kk) * 16 * 128, v_lbo, v_sbo), 1);
}

/// 2^x on the FMA pipe, for the share of the softmax's exponentials taken off the SFU: x = j + f
/// with j = round(x) and f ∈ [−0.5, 0.5], 2^f by a cubic (relative error ≤ 7.5·10⁻⁵, far below
/// the 2⁻⁹ of the 16-bit P it feeds), 2^j added to the exponent bits. x is clamped at −126 (the
/// result stays a float: never exactly 0, so callers use it only where no key is masked); max.NaN
/// keeps a NaN a NaN up to the bit trick, and the caller's row maximum is NaN then too.
__device__ __forceinline__ float ex2_fma(float x) {
#if FLASHLAB_WGMMA_OK
  asm("max.NaN.f32 %0, %0, 0fC2FC0000;\n" : "+f"(x));  // −126
#endif
  constexpr float kRound = 12582912.f;  // 1.5·2²³: x + kRound holds round(x) in its low mantissa bits
  const float t = __fadd_rn(x, kRound);
  const float f = __fsub_rn(x, __fsub_rn(t, kRound));
  const float p = fmaf(fmaf(fmaf(0.05517168f, f, 0.24261115f), f, 0.69326097f), f, 0.99992806f);
  return __int_as_float(__float_as_int(p) + (__float_as_int(t) << 23));
}

/// max that returns NaN when either operand is (fmaxf returns the other one).
__device__ __forceinline__ float fmax_nan(float a, float b) {
#if FLASHLAB_WGMMA_OK
  float y;
  asm("max.NaN.f32 %0, %1, %2;\n" : "=f"(y) : "f"(a), "f"(b));
  return y;
#else
  return fmaxf(a, b);
#endif
}

/// Masks (keys ≥ N, causal key > row) on this thread's two rows of S_ij: −inf.
template <class T>
__device__ __forceinline__ void mask_scores(float (&s_acc)[T::BLOCK_N / 2], int key0, int N, int row_base, int t4) {
#pragma unroll
  for (int t = 0; t < T::BLOCK_N / 8; ++t)
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int key = key0 + 8 * t + 2 * t4 + e;
        if (key >= N || (T::kCausal && key > row_base + 8 * r)) s_acc[4 * t + 2 * r + e] = -INFINITY;
      }
}

/// The online softmax in base 2 on this thread's two rows of S_ij (masks first when `need_mask`):
/// m_new = max(m_i, rowmax(S)·scale·log2 e), P = 2^(S·scale·log2 e − m_new) in place of S (fp32,
/// scale folded into one FMA), l_i = alpha·l_i + rowsum(P), alpha = 2^(m_old − m_new) per row.
/// Returns whether some row of this thread moved its maximum (alpha ≠ 1); touches neither O_i nor
/// the P fragments. kFmaExpPeriod > 0: on tiles without masks, the n-tiles t with
/// t % kFmaExpPeriod == kFmaExpPeriod − 1 take 2^x from ex2_fma instead of the SFU, and the row
/// maximum propagates NaN (so a NaN score still makes the row NaN).
template <class T, int kFmaExpPeriod = 0>
__device__ __forceinline__ bool online_softmax(float (&s_acc)[T::BLOCK_N / 2], float (&m_i)[2], float (&l_i)[2],
                                               float (&alpha)[2], int key0, int N, int row_base, bool need_mask,
                                               int t4, float scale_log2) {
  constexpr float NEG_INF = -INFINITY;
  constexpr int BLOCK_N = T::BLOCK_N;
  if (need_mask) mask_scores<T>(s_acc, key0, N, row_base, t4);
  const bool fma_exp = kFmaExpPeriod > 0 && !need_mask;
  bool max_moved = false;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    // kFmaExpPeriod > 0: NaN-propagating maxima all the way (ex2_fma turns a NaN into a number).
    auto row_max = [](float a, float b) { return kFmaExpPeriod > 0 ? fmax_nan(a, b) : fmaxf(a, b); };
    float mx = NEG_INF;
#pragma unroll
    for (int t = 0; t < BLOCK_N / 8; ++t) mx = row_max(mx, row_max(s_acc[4 * t + 2 * r], s_acc[4 * t + 2 * r + 1]));
    mx = row_max(mx, __shfl_xor_sync(0xffffffffu, mx, 1));  // the 4 threads of a row
    mx = row_max(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = row_max(m_i[r], mx * scale_log2);
    // A row with every key masked so far has m_new = −inf: subtract 0 instead (P = 0, no NaN).
    const float m_use = m_new == NEG_INF ? 0.f : m_new;
    alpha[r] = ex2(m_i[r] - m_use);
    max_moved |= m_new != m_i[r];
    m_i[r] = m_new;
    float sum = 0.f;
#pragma unroll
    for (int t = 0; t < BLOCK_N / 8; ++t)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float x = fmaf(s_acc[4 * t + 2 * r + e], scale_log2, -m_use);
        const bool on_fma = kFmaExpPeriod > 0 && t % (kFmaExpPeriod > 0 ? kFmaExpPeriod : 1) == kFmaExpPeriod - 1;
        const float pv = on_fma && fma_exp ? ex2_fma(x) : ex2(x);
        s_acc[4 * t + 2 * r + e] = pv;
        sum += pv;
      }
    l_i[r] = l_i[r] * alpha[r] + sum;
  }
  return max_moved;
}

/// O_i = diag(alpha) O_i on this thread's two rows.
template <int D>
__device__ __forceinline__ void rescale_o(float (&o)[D / 2], const float (&alpha)[2]) {
#pragma unroll
  for (int t = 0; t < D / 8; ++t)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      o[4 * t + 2 * r] *= alpha[r];
      o[4 * t + 2 * r + 1] *= alpha[r];
    }
}

/// P_ij (fp32 accumulator layout) → 16-bit A fragments: k-step kk = keys 16kk .. 16kk+15 = the
/// accumulator's n-tiles 2kk, 2kk+1 (register-A layout of m64nNk16 = accumulator layout of m64nN:
/// no shuffles).
template <class T>
__device__ __forceinline__ void pack_p(const float (&s_acc)[T::BLOCK_N / 2], uint32_t (&pa)[T::BLOCK_N / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < T::BLOCK_N / 16; ++kk) {
    pa[kk][0] = pack2<T::kBf16>(s_acc[8 * kk + 0], s_acc[8 * kk + 1]);  // row g,   keys 2·t4 ..
    pa[kk][1] = pack2<T::kBf16>(s_acc[8 * kk + 2], s_acc[8 * kk + 3]);  // row g+8, keys 2·t4 ..
    pa[kk][2] = pack2<T::kBf16>(s_acc[8 * kk + 4], s_acc[8 * kk + 5]);  // row g,   keys 8 + 2·t4 ..
    pa[kk][3] = pack2<T::kBf16>(s_acc[8 * kk + 6], s_acc[8 * kk + 7]);  // row g+8, keys 8 + 2·t4 ..
  }
}

/// O_i = acc / l_i → HBM (input dtype), LSE_i = m_i + log2(l_i) (fp32, base 2); l_i summed over
/// the 4 threads of a row first. A row with no key (l = 0) stores O = 0 and LSE = −inf.
template <class T>
__device__ __forceinline__ void store_o_lse(const Problem& p, uint16_t* __restrict__ O, float* __restrict__ LSE,
                                            const float (&o)[T::kHeadDim / 2], const float (&m_i)[2],
                                            const float (&l_i)[2], int b, int h, int row_base, int t4) {
  const std::size_t base = p.head_offset(b, h), stat = p.stat_offset(b, h);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = l_i[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const float inv_l = l > 0.f ? 1.f / l : 0.f;
    const int row = row_base + 8 * r;
    if (row < p.seq) {
      uint16_t* out = O + base + std::size_t(row) * p.row_stride() + 2 * t4;
#pragma unroll
      for (int t = 0; t < T::kHeadDim / 8; ++t)
        *reinterpret_cast<uint32_t*>(out + 8 * t) =
            pack2<T::kBf16>(o[4 * t + 2 * r] * inv_l, o[4 * t + 2 * r + 1] * inv_l);
      if (t4 == 0) LSE[stat + row] = l > 0.f ? m_i[r] + log2f(l) : -INFINITY;
    }
  }
}

}  // namespace flashlab::cuda::detail::wgmma_step
