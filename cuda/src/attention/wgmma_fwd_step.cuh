// cuda/src/attention/wgmma_fwd_step.cuh — the pieces of one forward step on wgmma that both Hopper forwards
// share (attention_fwd_wgmma.cu and attention_fwd_ws.cu): issue S_ij = Q_i K_jᵀ and
// O_i += P_ij V_j, the masks, the online softmax in base 2, the rescale of O_i, P_ij packed into
// A fragments, and the store of O_i and LSE_i. One warpgroup owns 64 query rows; a thread holds
// two of them (row_base and row_base + 8) in the m64nN accumulator layout (per warp the m16n8 C
// layout repeated over n: element 4t + 2r + e = row row_base + 8r, column 8t + 2·t4 + e).
// The traits T name the tile: kHeadDim, BLOCK_M (Br of the block), BLOCK_N (Bc), kBf16, kCausal,
// kWindow (a lower bound of the band too: keys left of row + window_lo() masked).
// Internal to cuda/src; compiled for sm_90a only (hopper.cuh).
#pragma once

#include "core/common.hpp"
#include "core/hopper.cuh"
#include "core/tensor_core.cuh"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

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
    if constexpr (T::BLOCK_N == 128) wgmma_ss_n128<T::kBf16>(s_acc, da, db, kk > 0);
    else wgmma_ss_wide<T::kBf16, T::BLOCK_N>(s_acc, da, db, kk > 0);  // Bc ∈ {80, 144, 176, 192}
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

/// Masks (keys ≥ N, causal key > row_base, window key < lo_base: each for row 0 of the thread's
/// two, + 8 for the other) on this thread's two rows of S_ij: −inf.
template <class T>
__device__ __forceinline__ void mask_scores(float (&s_acc)[T::BLOCK_N / 2], int key0, int N, int row_base, int t4,
                                            int lo_base) {
#pragma unroll
  for (int t = 0; t < T::BLOCK_N / 8; ++t)
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int key = key0 + 8 * t + 2 * t4 + e;
        if (key >= N || (T::kCausal && key > row_base + 8 * r) || (T::kWindow && key < lo_base + 8 * r))
          s_acc[4 * t + 2 * r + e] = -INFINITY;
      }
}

/// The maximum of part[0 .. kW): fold the upper half onto the lower one until one is left
/// (ceil(log2 kW) dependent levels); part is overwritten. Compile-time widths: stays in registers.
template <int kW, int kN>
__device__ __forceinline__ float tree_max(float (&part)[kN]) {
  if constexpr (kW == 1) {
    return part[0];
  } else {
    constexpr int kHalf = (kW + 1) / 2;
#pragma unroll
    for (int t = 0; t + kHalf < kW; ++t) part[t] = fmaxf(part[t], part[t + kHalf]);
    return tree_max<kHalf>(part);
  }
}

/// The online softmax in base 2 on this thread's two rows of S_ij (masks first when `need_mask`;
/// `row_base` and `lo_base` as mask_scores):
/// m_new = max(m_i, rowmax(S)·scale·log2 e), P = 2^(S·scale·log2 e − m_new) in place of S (fp32,
/// scale folded into one FMA), l_i = alpha·l_i + rowsum(P), alpha = 2^(m_old − m_new) per row.
/// Returns whether some row of this thread moved its maximum (alpha ≠ 1); touches neither O_i nor
/// the P fragments. kShortChains: the row maximum as a tree (5 dependent fmax instead of 16 at
/// Bc = 128) and the row sum in two chains (16 dependent adds instead of 32); the exponentials
/// wait less.
template <class T, bool kShortChains = false>
__device__ __forceinline__ bool online_softmax(float (&s_acc)[T::BLOCK_N / 2], float (&m_i)[2], float (&l_i)[2],
                                               float (&alpha)[2], int key0, int N, int row_base, bool need_mask,
                                               int t4, float scale_log2, int lo_base = 0) {
  constexpr float NEG_INF = -INFINITY;
  constexpr int BLOCK_N = T::BLOCK_N;
  if (need_mask) mask_scores<T>(s_acc, key0, N, row_base, t4, lo_base);
  bool max_moved = false;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = NEG_INF;
    if constexpr (kShortChains && BLOCK_N != 128) {
      // Any width: pairs, then halve the list of partial maxima until one is left.
      constexpr int kTiles = BLOCK_N / 8;
      float part[kTiles];
#pragma unroll
      for (int t = 0; t < kTiles; ++t) part[t] = fmaxf(s_acc[4 * t + 2 * r], s_acc[4 * t + 2 * r + 1]);
      mx = tree_max<kTiles>(part);
    } else if constexpr (kShortChains) {  // Bc = 128, written out: 16 n-tiles in five levels
      float part[8];
#pragma unroll
      for (int t = 0; t < 8; ++t)
        part[t] = fmaxf(fmaxf(s_acc[4 * t + 2 * r], s_acc[4 * t + 2 * r + 1]),
                        fmaxf(s_acc[4 * (t + 8) + 2 * r], s_acc[4 * (t + 8) + 2 * r + 1]));
#pragma unroll
      for (int t = 0; t < 4; ++t) part[t] = fmaxf(part[t], part[t + 4]);
      mx = fmaxf(fmaxf(part[0], part[2]), fmaxf(part[1], part[3]));
    } else {
#pragma unroll
      for (int t = 0; t < BLOCK_N / 8; ++t) mx = fmaxf(mx, fmaxf(s_acc[4 * t + 2 * r], s_acc[4 * t + 2 * r + 1]));
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));  // the 4 threads of a row
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m_i[r], mx * scale_log2);
    // A row with every key masked so far has m_new = −inf: subtract 0 instead (P = 0, no NaN).
    const float m_ref = m_new == NEG_INF ? 0.f : m_new;
    alpha[r] = ex2(m_i[r] - m_ref);
    max_moved |= m_new != m_i[r];
    m_i[r] = m_new;
    float sum[2] = {0.f, 0.f};  // kShortChains: one chain per column parity, else one
#pragma unroll
    for (int t = 0; t < BLOCK_N / 8; ++t)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float pv = ex2(fmaf(s_acc[4 * t + 2 * r + e], scale_log2, -m_ref));
        s_acc[4 * t + 2 * r + e] = pv;
        sum[kShortChains ? e : 0] += pv;
      }
    l_i[r] = l_i[r] * alpha[r] + (kShortChains ? sum[0] + sum[1] : sum[0]);
  }
  return max_moved;
}

/// online_softmax with the warp's vote first (same results, shorter wait): a thread takes the
/// maxima of its own quarter of each of its two rows (a tree, no shuffle) and the warp votes
/// whether any of them passes m_i (or m_i is still −inf, or a maximum is NaN). If none does — the
/// common case once a row has seen its largest scores — m_i stays, alpha = 1 and P = 2^(S·scale·
/// log2 e − m_i) at once: the shuffles, the new maximum and alpha leave the exponentials' path.
/// Otherwise the row maxima over the 4 threads of a row, m_i and alpha exactly as online_softmax.
/// Either way m_i is the running maximum, so every P and every rounding is online_softmax's (the
/// row sum runs in two chains). FlashAttention-4 goes further and lets m_i lag by up to 2^8; here
/// that rounds the largest P of a row to 16 bits too and took O past twice its rounding floor, the
/// tests' bar, so m_i never lags.
template <class T>
__device__ __forceinline__ bool online_softmax_vote(float (&s_acc)[T::BLOCK_N / 2], float (&m_i)[2], float (&l_i)[2],
                                                    float (&alpha)[2], int key0, int N, int row_base, bool need_mask,
                                                    int t4, float scale_log2, int lo_base = 0) {
  static_assert(T::kShortChains, "the vote keeps the short chains' tree and two sums");
  constexpr int kTiles = T::BLOCK_N / 8;
  if (need_mask) mask_scores<T>(s_acc, key0, N, row_base, t4, lo_base);
  float mx[2];  // this thread's quarter of each row
  bool moves = false;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float part[kTiles];
#pragma unroll
    for (int t = 0; t < kTiles; ++t) part[t] = fmaxf(s_acc[4 * t + 2 * r], s_acc[4 * t + 2 * r + 1]);
    mx[r] = tree_max<kTiles>(part);
    // !(a <= b) and m_i > −inf: a row without a finite m_i yet (tile 0) or a NaN maximum moves.
    moves |= !(m_i[r] > -INFINITY && mx[r] * scale_log2 <= m_i[r]);
  }
  float m_ref[2] = {m_i[0], m_i[1]};
  alpha[0] = alpha[1] = 1.f;
  const bool warp_moves = __any_sync(0xffffffffu, moves);
  bool max_moved = false;
  if (warp_moves) {  // as online_softmax: the row maxima over the 4 threads of a row, a new m_i
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float m = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
      const float m_new = fmaxf(m_i[r], m * scale_log2);
      m_ref[r] = m_new == -INFINITY ? 0.f : m_new;  // every key masked so far: P = 0, no NaN
      alpha[r] = ex2(m_i[r] - m_ref[r]);
      max_moved |= m_new != m_i[r];
      m_i[r] = m_new;
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum[2] = {0.f, 0.f};
#pragma unroll
    for (int t = 0; t < kTiles; ++t)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float pv = ex2(fmaf(s_acc[4 * t + 2 * r + e], scale_log2, -m_ref[r]));
        s_acc[4 * t + 2 * r + e] = pv;
        sum[e] += pv;
      }
    l_i[r] = l_i[r] * alpha[r] + (sum[0] + sum[1]);
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

/// Whether traits T store O in fp32 (T::kOutF32; traits without the member store the input dtype).
template <class T, class = void>
struct OutputF32 : std::false_type {};
template <class T>
struct OutputF32<T, std::void_t<decltype(T::kOutF32)>> : std::bool_constant<T::kOutF32> {};

/// O_i = acc / l_i → HBM (input dtype), LSE_i = m_i + log2(l_i) (fp32, base 2); l_i summed over
/// the 4 threads of a row first. A row with no key (l = 0) stores O = 0 and LSE = −inf. Rows
/// below `N` of the head whose row 0 is O[base] and LSE[stat] (store_o_lse: head h of batch b; N by
/// reference, so that a kernel parameter stays one and the dense kernels keep their code).
/// Traits with kOutF32 (OutputF32) store O_i unrounded, fp32 at the same element offsets: `O` then
/// points to floats (the ring's partials, merged before they are rounded once).
/// Row r's l_i summed over the quad of threads that hold the row's columns (each thread has a
/// partial sum of its own columns).
__device__ __forceinline__ float quad_row_sum(float l) {
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  return l + __shfl_xor_sync(0xffffffffu, l, 2);
}

template <class T>
__device__ __forceinline__ void store_o_lse_at(const Problem& p, uint16_t* __restrict__ O, float* __restrict__ LSE,
                                               const float (&o)[T::kHeadDim / 2], const float (&m_i)[2],
                                               const float (&l_i)[2], std::size_t base, std::size_t stat,
                                               const int& N, int row_base, int t4) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l = quad_row_sum(l_i[r]);
    const float inv_l = l > 0.f ? 1.f / l : 0.f;
    const int row = row_base + 8 * r;
    if (row < N) {
      if constexpr (OutputF32<T>::value) {
        float* out = reinterpret_cast<float*>(O) + base + std::size_t(row) * p.row_stride() + 2 * t4;
#pragma unroll
        for (int t = 0; t < T::kHeadDim / 8; ++t)
          *reinterpret_cast<float2*>(out + 8 * t) = make_float2(o[4 * t + 2 * r] * inv_l, o[4 * t + 2 * r + 1] * inv_l);
      } else {
        uint16_t* out = O + base + std::size_t(row) * p.row_stride() + 2 * t4;
#pragma unroll
        for (int t = 0; t < T::kHeadDim / 8; ++t)
          *reinterpret_cast<uint32_t*>(out + 8 * t) =
              pack2<T::kBf16>(o[4 * t + 2 * r] * inv_l, o[4 * t + 2 * r + 1] * inv_l);
      }
      if (t4 == 0) LSE[stat + row] = l > 0.f ? m_i[r] + log2f(l) : -INFINITY;
    }
  }
}

/// store_o_lse_at() for head h of batch b of a dense problem.
template <class T>
__device__ __forceinline__ void store_o_lse(const Problem& p, uint16_t* __restrict__ O, float* __restrict__ LSE,
                                            const float (&o)[T::kHeadDim / 2], const float (&m_i)[2],
                                            const float (&l_i)[2], int b, int h, int row_base, int t4) {
  store_o_lse_at<T>(p, O, LSE, o, m_i, l_i, p.head_offset(b, h), p.stat_offset(b, h), p.seq, row_base, t4);
}

}  // namespace flashlab::cuda::detail::wgmma_step
