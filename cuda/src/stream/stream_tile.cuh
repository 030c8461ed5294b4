// Device helpers of the STREAM kernels (internal, nvcc only): C_blk scans, τ's key order and the
// bisection (both estimate kernels), tile loads and the representative score of App. A as one
// block-wide reduction (the clear kernels). The estimate and the trace call
// the same score_tile, so the trace's edge score is bitwise the estimator's.
#pragma once

#include "stream/stream_common.hpp"

#include <cmath>

namespace flashlab::cuda::stream::detail {

__device__ inline float stream_neg_inf() { return -INFINITY; }

/// τ (App. B) on the keys that decide it within one round, for both estimate kernels: valid (r ≥
/// 0) first, then score descending, then r ascending (scores are never NaN). Within a round the
/// representatives are distinct, so only two invalid candidates tie on these keys; the clear kernel
/// then goes on to branch_id and split_bit (tau_keys_tie).
__device__ __forceinline__ bool tau_before_by_score(int a_r, float a_score, int b_r, float b_score) {
  if ((a_r >= 0) != (b_r >= 0)) return a_r >= 0;
  if (a_score != b_score) return a_score > b_score;
  return a_r < b_r;
}

/// True when tau_before_by_score() cannot order the two (same validity, score and r).
__device__ __forceinline__ bool tau_keys_tie(int a_r, float a_score, int b_r, float b_score) {
  return (a_r >= 0) == (b_r >= 0) && a_score == b_score && a_r == b_r;
}

/// The bisection of App. A, for both estimate kernels: branch b = [lo, hi] with representative r
/// (its first valid block) splits into left = [lo, mid] (⌈len/2⌉ blocks) and right = [mid + 1, hi],
/// each a copy of b otherwise. The half that holds r inherits it and its score. Returns true when
/// r lies in the left half, so the right half needs a fresh representative (its first valid
/// block); when r lies in the right half, the left half holds no valid block (r = −1); a one-block
/// branch is its own left half and has no right half (r = −1).
template <class Candidate>
__device__ __forceinline__ bool bisect_branch(const Candidate& b, Candidate& left, Candidate& right) {
  left = b;
  right = b;
  const int len = b.hi - b.lo + 1;
  if (len == 1) {
    right.r = -1;
    return false;
  }
  const int mid = b.lo + (len + 1) / 2 - 1;
  left.hi = mid;
  right.lo = mid + 1;
  if (b.r <= mid) return true;
  left.r = -1;  // [lo, mid] holds no valid block: b.r is the first of [lo, hi]
  return false;
}

/// The gap τ decided by score between two ordered scores; 0 for equal ones (−inf included).
__device__ __forceinline__ float score_gap(float before, float after) { return before == after ? 0.f : before - after; }

/// The smallest r in [a, b] with C_blk[q, r] = 1, or −1 (the representative rule). Causality
/// clips b; a stored C_blk row is scanned word by word, lowest word first, masked at both ends
/// (the reference's BlockMask::first_valid).
__device__ inline int first_valid(const StreamProblem& p, const std::uint64_t* mask, int q, int a, int b) {
  const int last = p.causal_last(q);
  if (b > last) b = last;
  if (a > b) return -1;
  if (mask == nullptr) return a;
  const std::uint64_t* row = mask + std::size_t(q) * p.words_per_row;
  for (int w = a / 64; w <= b / 64; ++w) {
    std::uint64_t bits = row[w];
    if (w == a / 64) bits &= ~0ull << (a % 64);
    if (w == b / 64 && b % 64 != 63) bits &= (1ull << (b % 64 + 1)) - 1;
    if (bits) return w * 64 + __ffsll(static_cast<long long>(bits)) - 1;
  }
  return -1;
}

/// The largest r in [a, b] with C_blk[q, r] = 1, or −1 (scanned highest word first).
__device__ inline int last_valid(const StreamProblem& p, const std::uint64_t* mask, int q, int a, int b) {
  const int last = p.causal_last(q);
  if (b > last) b = last;
  if (a > b) return -1;
  if (mask == nullptr) return b;
  const std::uint64_t* row = mask + std::size_t(q) * p.words_per_row;
  for (int w = b / 64; w >= a / 64; --w) {
    std::uint64_t bits = row[w];
    if (w == a / 64) bits &= ~0ull << (a % 64);
    if (w == b / 64 && b % 64 != 63) bits &= (1ull << (b % 64 + 1)) - 1;
    if (bits) return w * 64 + 63 - __clzll(static_cast<long long>(bits));
  }
  return -1;
}

/// Copies `rows` tokens starting at token t0 of head h (width floats each) into a shared tile of
/// `max_rows` rows, pitch StreamProblem::pitch(width); rows past `rows` are zero. All threads.
__device__ inline void load_tile(float* tile, const float* src, const StreamProblem& p, int h, int width, int t0,
                                 int rows, int max_rows) {
  const int ld = StreamProblem::pitch(width);
  for (int idx = threadIdx.x; idx < max_rows * width; idx += blockDim.x) {
    const int m = idx / width, c = idx % width;
    tile[m * ld + c] = m < rows ? src[p.at(t0 + m, h, width) + c] : 0.f;
  }
}

/// ⟨a, b⟩ over d entries in a fixed order (one fmaf chain): the same bits in every kernel and run.
__device__ inline float dot_fixed(const float* a, const float* b, int d) {
  float s = 0.f;
  for (int c = 0; c < d; ++c) s = fmaf(a[c], b[c], s);
  return s;
}

/// max of v over the thread block; NaN never wins (`v > best`), so NaN counts as −inf (App. B).
/// `red` holds one float per warp. Every thread gets the result. All threads must call it.
__device__ inline float block_max(float v, float* red) {
  for (int off = 16; off > 0; off /= 2) {
    const float o = __shfl_xor_sync(0xffffffffu, v, off);
    v = o > v ? o : v;
  }
  const int warp = threadIdx.x / 32, warps = (blockDim.x + 31) / 32;
  __syncthreads();  // red is free (a previous call has finished reading it)
  if (threadIdx.x % 32 == 0) red[warp] = v;
  __syncthreads();  // every warp's partial is in red
  float best = stream_neg_inf();
  for (int w = 0; w < warps; ++w) best = red[w] > best ? red[w] : best;
  return best;
}

/// score(q, r) of App. A: max over token-valid (t, s) of ⟨Q_t, K_s⟩ with Q_q in `Qs` and K_r in
/// `Ks` (shared, pitch d + 1); −inf when no pair is valid or every valid product is NaN.
__device__ inline float score_tile(const StreamProblem& p, const float* Qs, const float* Ks, int q, int r,
                                   float* red) {
  const int ld = StreamProblem::pitch(p.d), rows = p.q_rows(q);
  float best = stream_neg_inf();
  for (int idx = threadIdx.x; idx < p.bq * p.bk; idx += blockDim.x) {
    const int m = idx / p.bk, n = idx % p.bk;
    if (m >= rows || n >= p.valid_cols(q, r, m)) continue;
    const float s = dot_fixed(Qs + m * ld, Ks + n * ld, p.d);
    best = s > best ? s : best;
  }
  return block_max(best, red);
}

}  // namespace flashlab::cuda::stream::detail
