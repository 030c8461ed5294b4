// Private helpers shared by the STREAM estimator and the mask application (not installed).
#pragma once

#include "flashlab/reference/stream.hpp"

#include <algorithm>
#include <exception>
#include <functional>
#include <limits>
#include <thread>
#include <vector>

namespace flashlab::ref::stream::detail {

/// Runs fn(begin, end, worker) over [0, n) cut into `threads` contiguous chunks, one std::thread
/// each. Work is split by query block only, and every query block's result depends on nothing
/// but its own inputs, so the output is the same for any thread count (bitwise equal
/// for 1, 2, 4 threads). The first exception of any worker is rethrown on the caller.
inline void parallel_for(std::size_t n, std::size_t threads,
                         const std::function<void(std::size_t, std::size_t, std::size_t)>& fn) {
  threads = std::max<std::size_t>(1, std::min(threads, n));
  if (threads == 1) {
    fn(0, n, 0);
    return;
  }
  std::vector<std::exception_ptr> errors(threads);
  std::vector<std::thread> pool;
  pool.reserve(threads);
  for (std::size_t w = 0; w < threads; ++w) {
    const std::size_t begin = n * w / threads, end = n * (w + 1) / threads;
    pool.emplace_back([&, begin, end, w] {
      try {
        fn(begin, end, w);
      } catch (...) {
        errors[w] = std::current_exception();
      }
    });
  }
  for (auto& t : pool) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

/// S_qr = Q_q K_rᵀ for query block q and key block r into `tile` (rows × cols = q_rows × k_rows).
/// One Eigen block product: the "tensor-core dot products" of App. C on the CPU. Both the
/// estimator and the application call exactly this, so their scores agree bit for bit.
template <typename S>
void qk_tile(const Mat<S>& Q, const Mat<S>& K, const Geometry& g, std::size_t q, std::size_t r, Mat<S>& tile) {
  const auto rq = Eigen::Index(g.q_rows(q)), rk = Eigen::Index(g.k_rows(r));
  tile.resize(rq, rk);
  tile.noalias() = Q.middleRows(Eigen::Index(q * g.bq), rq) * K.middleRows(Eigen::Index(r * g.bk), rk).transpose();
}

/// Columns of tile row m (token t = q·b_q + m) that are token-valid in key block r: the causal
/// rule s ≤ t, s < T (the user mask is block-level, so inside a valid block only causality acts).
inline std::size_t valid_cols(const Geometry& g, std::size_t q, std::size_t r, std::size_t m) {
  const std::size_t t = q * g.bq + m, s0 = r * g.bk;
  if (t < s0) return 0;
  return std::min(g.k_rows(r), t - s0 + 1);
}

/// max over token-valid entries of a Q_q K_rᵀ tile (App. A's score). A NaN entry never wins a
/// `v > best` comparison, so NaN counts as −inf (App. B); max ∅ = −inf.
template <typename S>
double masked_max(const Mat<S>& tile, const Geometry& g, std::size_t q, std::size_t r) {
  S best = -std::numeric_limits<S>::infinity();
  for (Eigen::Index m = 0; m < tile.rows(); ++m) {
    const auto n_end = Eigen::Index(valid_cols(g, q, r, std::size_t(m)));
    const S* row = tile.data() + m * tile.cols();
    for (Eigen::Index n = 0; n < n_end; ++n) best = row[n] > best ? row[n] : best;
  }
  return static_cast<double>(best);
}


/// The refinement of one query block q (stream_estimate's loop body, §2 and App. A/B): the initial
/// branches over the admissible range, n_it bisection rounds, the top k by τ after each. `score(r,
/// round)` returns the representative score of key block r (NaN already mapped to −inf) and is
/// called once per new representative: round 0 for the initial branches, round i for the i-th
/// bisection. On return `cur` holds the kept candidates in τ order, each a single block. Every
/// caller (the estimate, the sharded simulation) runs exactly this, so their I agree bit for bit
/// whenever their scores do. `words` (may be null) counts the mask words scanned.
template <typename ScoreFn>
void refine_query_block(const BlockMask& mask, std::size_t q, std::size_t k, ScoreFn&& score,
                        std::vector<Candidate>& cur, std::vector<Candidate>& next, std::uint64_t* words) {
  const std::size_t n_it = mask.geometry().n_it();
  cur.clear();
  const std::size_t last_c = mask.causal_last(q);
  const std::int64_t lo = mask.first_valid(q, 0, last_c, words);
  if (lo >= 0) {
    const auto hi = std::size_t(mask.last_valid(q, std::size_t(lo), last_c, words));
    // Initial partition of the admissible range [lo, hi] (§2, App. A): L blocks into
    // nb = min(k, L) contiguous branches; the first L mod nb branches get one extra block.
    // When k > L there are only L branches, of one block each (no empty branches).
    const std::size_t L = hi - std::size_t(lo) + 1, nb = std::min(k, L);
    std::size_t a = std::size_t(lo);
    for (std::size_t i = 0; i < nb; ++i) {
      const std::size_t len = L / nb + (i < L % nb ? 1 : 0);
      Candidate c;
      c.lo = a;
      c.hi = a + len - 1;
      c.branch_id = i;
      a += len;
      // A branch with no valid block (a user-mask hole) has no representative: dropped.
      c.r = mask.first_valid(q, c.lo, c.hi, words);
      if (c.r < 0) continue;
      c.score = score(c.r, 0);
      cur.push_back(c);
    }
    std::sort(cur.begin(), cur.end(), tau_before);

    for (std::size_t it = 0; it < n_it; ++it) {
      next.clear();
      for (const Candidate& b : cur) {
        const std::size_t len = b.hi - b.lo + 1;
        if (len == 1) {
          // A one-block branch cannot be split: its left half is itself (same r, same
          // score) and its right half is empty, hence invalid and never kept.
          Candidate c = b;
          c.branch_id = 2 * b.branch_id;
          c.split_bit = 0;
          next.push_back(c);
          continue;
        }
        // Bisection: the left half takes ⌈len/2⌉ blocks.
        const std::size_t mid = b.lo + (len + 1) / 2 - 1;
        Candidate left{-std::numeric_limits<double>::infinity(), -1, 2 * b.branch_id, 0, b.lo, mid};
        Candidate right{-std::numeric_limits<double>::infinity(), -1, 2 * b.branch_id + 1, 1, mid + 1, b.hi};
        if (std::size_t(b.r) <= mid) {
          left.r = b.r;  // inherits the parent's representative and its score
          left.score = b.score;
          right.r = mask.first_valid(q, right.lo, right.hi, words);
          if (right.r >= 0) right.score = score(right.r, it + 1);
        } else {
          right.r = b.r;  // [lo, mid] holds no valid block: b.r is the first of [lo, hi]
          right.score = b.score;
        }
        if (left.r >= 0) next.push_back(left);
        if (right.r >= 0) next.push_back(right);
      }
      // Top-k by τ: a total order, so std::sort's result does not depend on its algorithm.
      std::sort(next.begin(), next.end(), tau_before);
      if (next.size() > k) next.resize(k);
      std::swap(cur, next);
    }
  }
}

}  // namespace flashlab::ref::stream::detail
