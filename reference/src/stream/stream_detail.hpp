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

}  // namespace flashlab::ref::stream::detail
