// STREAM mask estimation: the reference specification of the STREAM paper (§2, §5, App. A and B).
//
// For each query block q (one "CTA" of §5; here one iteration of a loop that std::threads share):
//   load Q_q once                                            (§5: "loads Q_q once")
//   admissible range [lo, hi] = first .. last valid r of C_blk[q, *]
//   k branches = equal split of [lo, hi], longer branches first    (§2 "remainder convention")
//   repeat n_it = ⌈log2 n_k⌉ times:                          (§2, §8)
//     split each branch in two → ≤ 2k candidates, representative r(c) = first valid block (App. A)
//     score(c) = max token-valid ⟨Q_t, K_s⟩ over blocks (q, r(c))      (App. A)
//     keep the top k by τ = (score ↓, r ↑, branch_id ↑, split_bit ↑)     (App. B)
//   I[q, j] = r of the j-th kept branch (τ order), −1 for missing entries
//
// Why each candidate costs at most one new K block: a branch's representative is the first valid
// block of [lo, hi], so it lies in exactly one half and is that half's representative too. Its
// score is a pure function of (q, r), so the child inherits it instead of re-reading K_r; only the
// other half needs a fresh representative and score. Hence ≤ k new K blocks per round plus the k
// initial ones: K reads ≤ n_q·k·(n_it + 1)·b_k·d, the paper's Theorem 3 bound with constant 1 on
// the n_it term and one extra round (stream_bounds, docs/stream.md).
#include "stream_detail.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace flashlab::ref::stream {

bool tau_before(const Candidate& a, const Candidate& b) {
  const bool va = a.r >= 0, vb = b.r >= 0;
  if (va != vb) return va;  // invalid candidates (no valid block in range) sort last
  // App. B: NaN ≡ −inf, and −inf is below every finite value.
  const double sa = std::isnan(a.score) ? -std::numeric_limits<double>::infinity() : a.score;
  const double sb = std::isnan(b.score) ? -std::numeric_limits<double>::infinity() : b.score;
  if (sa != sb) return sa > sb;
  if (a.r != b.r) return a.r < b.r;
  if (a.branch_id != b.branch_id) return a.branch_id < b.branch_id;
  return a.split_bit < b.split_bit;
}

namespace {

double no_nan(double s) { return std::isnan(s) ? -std::numeric_limits<double>::infinity() : s; }

template <typename S>
void check_inputs(const Mat<S>& Q, const Mat<S>& K, const Geometry& g) {
  if (Q.rows() != Eigen::Index(g.T) || K.rows() != Eigen::Index(g.T)) {
    throw StreamError("Q has " + std::to_string(Q.rows()) + " rows and K " + std::to_string(K.rows()) +
                      "; both must have T = " + std::to_string(g.T) + " rows");
  }
  if (Q.cols() != K.cols() || Q.cols() == 0) {
    throw StreamError("Q and K must have the same head dim d ≥ 1 (got " + std::to_string(Q.cols()) + " and " +
                      std::to_string(K.cols()) + ")");
  }
}

}  // namespace

template <typename S>
double stream_block_score(const Mat<S>& Q, const Mat<S>& K, const Geometry& g, std::size_t q, std::size_t r) {
  g.check();
  check_inputs(Q, K, g);
  if (q >= g.n_q() || r >= g.n_k()) throw StreamError("block (q, r) out of range");
  Mat<S> tile;
  detail::qk_tile(Q, K, g, q, r, tile);
  return detail::masked_max(tile, g, q, r);
}

template <typename S>
EstimateResult stream_estimate(const Mat<S>& Q, const Mat<S>& K, const BlockMask& mask, const EstimateParams& params) {
  const Geometry g = mask.geometry();
  g.check();
  check_inputs(Q, K, g);
  const std::size_t k = params.k;
  if (k == 0) throw StreamError("k must be at least 1");
  const std::size_t n_q = g.n_q(), n_it = g.n_it(), d = std::size_t(Q.cols());
  // branch_id doubles every round: k·2^n_it must fit in 63 bits.
  if (ceil_log2(k) + n_it > 62) throw StreamError("k·2^n_it overflows the 64-bit branch identifiers of τ");

  const Dtype dtype = sizeof(S) == 4 ? Dtype::fp32 : Dtype::fp64;
  EstimateResult res{g, k, std::vector<std::int64_t>(n_q * k, -1),
                     std::vector<double>(n_q * k, std::numeric_limits<double>::quiet_NaN()), Traffic(dtype), 0, 0};

  const std::size_t threads = std::max<std::size_t>(1, params.threads);
  std::vector<Traffic> traffic(threads, Traffic(dtype));
  std::vector<std::uint64_t> scored(threads, 0), max_scored(threads, 0);
  for (auto& t : traffic) {
    t.declare("Q");
    t.declare("K");
    t.declare("C_blk", 8);  // 64-bit words of the packed user mask
    t.declare("I", 8);      // int64 indices, as written to indices.npy
  }

  detail::parallel_for(n_q, threads, [&](std::size_t q_begin, std::size_t q_end, std::size_t w) {
    Traffic& tr = traffic[w];
    Mat<S> tile;  // the only scratch: one b_q × b_k tile per worker, never T × T
    std::vector<Candidate> cur, next;
    cur.reserve(2 * k);
    next.reserve(2 * k);
    for (std::size_t q = q_begin; q < q_end; ++q) {
      std::uint64_t words = 0, n_scored = 0;
      // Load Q_q: HBM → SRAM, once per query block (§5).
      tr.read("Q", g.q_rows(q) * d);
      auto score = [&](std::int64_t r, std::size_t /*round*/) {
        // Stream the representative K_r: HBM → SRAM, reduce the tile to one scalar (App. C).
        detail::qk_tile(Q, K, g, q, std::size_t(r), tile);
        tr.read("K", g.k_rows(std::size_t(r)) * d);
        tr.add_flops(2ull * g.q_rows(q) * g.k_rows(std::size_t(r)) * d);
        ++n_scored;
        return no_nan(detail::masked_max(tile, g, q, std::size_t(r)));
      };

      detail::refine_query_block(mask, q, k, score, cur, next, &words);
      // After n_it = ⌈log2 n_k⌉ halvings every branch (≤ n_k blocks) is a single block.
      for (std::size_t j = 0; j < cur.size(); ++j) {
        if (cur[j].lo != cur[j].hi) throw std::logic_error("stream_estimate: a final branch has more than one block");
        res.indices[q * k + j] = cur[j].r;
        res.scores[q * k + j] = cur[j].score;
      }
      tr.read("C_blk", words);
      tr.write("I", k);  // I[q, 0..k−1] → HBM
      scored[w] += n_scored;
      max_scored[w] = std::max(max_scored[w], n_scored);
    }
  });

  for (std::size_t w = 0; w < threads; ++w) {
    res.traffic.merge(traffic[w]);
    res.blocks_scored += scored[w];
    res.max_blocks_scored_per_q = std::max(res.max_blocks_scored_per_q, max_scored[w]);
  }
  return res;
}

std::string validate_indices(const std::vector<std::int64_t>& indices, std::size_t k, const BlockMask& mask) {
  const Geometry& g = mask.geometry();
  const std::size_t n_q = g.n_q(), n_k = g.n_k();
  if (k == 0 || indices.size() != n_q * k) {
    return "index tensor has " + std::to_string(indices.size()) + " entries, expected n_q·k = " +
           std::to_string(n_q) + "·" + std::to_string(k);
  }
  std::vector<std::size_t> seen(n_k, std::size_t(-1));
  for (std::size_t q = 0; q < n_q; ++q) {
    const std::string at = "I[" + std::to_string(q) + ", ";
    std::size_t filled = 0;
    bool empty_seen = false;
    for (std::size_t j = 0; j < k; ++j) {
      const std::int64_t r = indices[q * k + j];
      const std::string here = at + std::to_string(j) + "] = " + std::to_string(r);
      if (r == -1) {
        empty_seen = true;
        continue;
      }
      if (r < -1 || r >= std::int64_t(n_k)) return here + ": not a key block (valid: 0.." + std::to_string(n_k - 1) + " or −1)";
      if (empty_seen) return here + ": a selected block after an empty entry (empties must come last)";
      if (!mask.valid(q, std::size_t(r))) return here + ": block is invalid under C_blk";
      if (seen[std::size_t(r)] == q) return here + ": duplicate block in the row";
      seen[std::size_t(r)] = q;
      ++filled;
    }
    const std::size_t expect = std::min(k, mask.count_valid(q));
    if (filled != expect) {
      return "row " + std::to_string(q) + " has " + std::to_string(filled) + " selected blocks, expected min(k, valid) = " +
             std::to_string(expect);
    }
  }
  return {};
}

Bounds stream_bounds(const Geometry& g, std::size_t d, std::size_t k) {
  Bounds b;
  b.n_q = g.n_q();
  b.n_k = g.n_k();
  b.n_it = g.n_it();
  const double T = double(g.T), D = double(d), nq = double(b.n_q), K = double(k), it = double(b.n_it);
  b.io_upper_paper = T * D + nq * K * it * double(g.bk) * D;
  b.io_upper_exact = T * D + nq * K * (it + 1) * double(g.bk) * D;
  b.io_lower = T * D + nq * K * double(g.bk) * D;
  b.work_paper = 2 * nq * K * it * double(g.bq) * double(g.bk) * D;
  b.work_upper_exact = 2 * nq * K * (it + 1) * double(g.bq) * double(g.bk) * D;
  return b;
}

template EstimateResult stream_estimate<float>(const Mat<float>&, const Mat<float>&, const BlockMask&,
                                               const EstimateParams&);
template EstimateResult stream_estimate<double>(const Mat<double>&, const Mat<double>&, const BlockMask&,
                                                const EstimateParams&);
template double stream_block_score<float>(const Mat<float>&, const Mat<float>&, const Geometry&, std::size_t,
                                          std::size_t);
template double stream_block_score<double>(const Mat<double>&, const Mat<double>&, const Geometry&, std::size_t,
                                           std::size_t);

}  // namespace flashlab::ref::stream
