// STREAM mask application and trace emission (the STREAM paper, §3, §6), the dense float64 reference and
// the built-in check "k covers every valid block ⇒ sparse == dense causal attention".
//
// For each query block q (parallel over q only, so results do not depend on the thread count):
//   load Q_q once, I[q, ·]                                    (§6 "Execution model")
//   for j = 0..k−1, r = I[q, j] (skip −1):                     (§6: fixed slot order)
//     load K_r, V_r: HBM → SRAM
//     S = Q_q K_rᵀ; ℓ = −inf where s > t or s ≥ T               (token-level causal inside the block)
//     μ' = max(μ, rowmax ℓ); P = exp(ℓ − μ'); λ' = λ e^{μ−μ'} + rowsum P
//     o' = o e^{μ−μ'} + P V_r                                 (§6 online softmax update)
//   O_q = o / λ → HBM (rows with λ = 0, i.e. no valid key among the kept blocks, are 0)
// With edges, each slot also keeps its μ_j and its unnormalised (Σ_n P, P V_r) for the b_q rows,
// O(k·b_q·d) per worker, and rescales them by e^{μ_j − μ}/λ once the final (μ, λ) are known —
// the "mass accumulated consistently with the online softmax" of §6, without a second pass.
#include "flashlab/reference/tensor.hpp"
#include "stream_detail.hpp"

#include <cmath>
#include <limits>

namespace flashlab::ref::stream {

template <typename S>
ApplyResult<S> stream_apply(const Mat<S>& Q, const Mat<S>& K, const Mat<S>& V, const BlockMask& mask,
                            const std::vector<std::int64_t>& indices, std::size_t k, std::size_t threads,
                            bool want_edges) {
  const Geometry g = mask.geometry();
  g.check();
  if (Q.rows() != Eigen::Index(g.T) || K.rows() != Eigen::Index(g.T) || V.rows() != Eigen::Index(g.T)) {
    throw StreamError("Q, K and V must all have T = " + std::to_string(g.T) + " rows");
  }
  if (Q.cols() != K.cols() || Q.cols() == 0 || V.cols() == 0) {
    throw StreamError("Q and K must share the head dim d ≥ 1, and V must have d_v ≥ 1 columns");
  }
  const std::size_t n_q = g.n_q(), n_k = g.n_k(), d = std::size_t(Q.cols()), dv = std::size_t(V.cols());
  if (k == 0 || indices.size() != n_q * k) {
    throw StreamError("index tensor has " + std::to_string(indices.size()) + " entries, expected n_q·k = " +
                      std::to_string(n_q) + "·" + std::to_string(k));
  }
  // The application trusts nothing about I except what it checks: every kept block must exist and
  // be valid under C_blk (§3's validity invariant), otherwise the output would attend to masked keys.
  for (std::size_t q = 0; q < n_q; ++q) {
    for (std::size_t j = 0; j < k; ++j) {
      const std::int64_t r = indices[q * k + j];
      if (r == -1) continue;
      if (r < -1 || r >= std::int64_t(n_k) || !mask.valid(q, std::size_t(r))) {
        throw StreamError("I[" + std::to_string(q) + ", " + std::to_string(j) + "] = " + std::to_string(r) +
                          " is not a valid key block for query block " + std::to_string(q) + " under C_blk");
      }
    }
  }

  const Dtype dtype = sizeof(S) == 4 ? Dtype::fp32 : Dtype::fp64;
  ApplyResult<S> res{Mat<S>::Zero(Eigen::Index(g.T), Eigen::Index(dv)), {}, Traffic(dtype)};
  threads = std::max<std::size_t>(1, threads);
  std::vector<Traffic> traffic(threads, Traffic(dtype));
  for (auto& t : traffic) {
    t.declare("Q");
    t.declare("K");
    t.declare("V");
    t.declare("I", 8);
    t.declare("O");
    if (want_edges) t.declare("E", sizeof(Edge));  // one record per kept block
  }
  // Each query block owns the k record slots q·k .. q·k+k−1, so workers never share a slot
  // (§6: "a unique reserved output segment"); empty slots are squeezed out afterwards in order.
  std::vector<Edge> slots(want_edges ? n_q * k : 0);
  std::vector<char> used(want_edges ? n_q * k : 0, 0);
  constexpr S kNegInf = -std::numeric_limits<S>::infinity();

  detail::parallel_for(n_q, threads, [&](std::size_t q_begin, std::size_t q_end, std::size_t w) {
    Traffic& tr = traffic[w];
    Mat<S> tile, PV;
    Vec<S> mu, lam, corr;
    Mat<S> o;
    // Per-slot partials for the edge weights (only with edges): μ_j, Σ_n P and P V_r per row.
    std::vector<Vec<S>> mu_j(want_edges ? k : 0), sum_j(want_edges ? k : 0);
    std::vector<Mat<S>> pv_j(want_edges ? k : 0);
    std::vector<double> score_j(want_edges ? k : 0);
    std::vector<char> poisoned;  // rows that met a NaN logit
    for (std::size_t q = q_begin; q < q_end; ++q) {
      const std::size_t rq = g.q_rows(q), t0 = q * g.bq;
      tr.read("Q", rq * d);  // Q_q: HBM → SRAM once
      tr.read("I", k);       // I[q, ·]
      mu.setConstant(Eigen::Index(rq), kNegInf);
      lam.setZero(Eigen::Index(rq));
      corr.resize(Eigen::Index(rq));
      o.setZero(Eigen::Index(rq), Eigen::Index(dv));
      poisoned.assign(rq, 0);
      for (std::size_t j = 0; j < k; ++j) {
        const std::int64_t ri = indices[q * k + j];
        if (ri < 0) continue;  // empty entry: nothing streamed, nothing emitted
        const auto r = std::size_t(ri);
        const std::size_t rk = g.k_rows(r), s0 = r * g.bk;
        // K_r, V_r: HBM → SRAM.
        tr.read("K", rk * d);
        tr.read("V", rk * dv);
        detail::qk_tile(Q, K, g, q, r, tile);
        tr.add_flops(2ull * rq * rk * (d + dv));
        if (want_edges) score_j[j] = detail::masked_max(tile, g, q, r);
        // Online softmax update (§6), one query row m at a time; invalid columns get P = 0.
        for (std::size_t m = 0; m < rq; ++m) {
          const std::size_t n_end = detail::valid_cols(g, q, r, m);
          S* row = tile.data() + Eigen::Index(m) * tile.cols();
          S row_max = kNegInf;
          for (std::size_t n = 0; n < n_end; ++n) {
            row_max = std::max(row_max, row[n]);
            // A NaN logit must reach the output, even in a row whose other logits are all NaN
            // (the max above skips NaN, which would otherwise look like "no valid key").
            if (std::isnan(row[n])) poisoned[m] = 1;
          }
          const S mu_new = std::max(mu[Eigen::Index(m)], row_max);
          if (mu_new == kNegInf) {
            // No valid key for this row so far (t < s0): nothing to add, nothing to rescale.
            corr[Eigen::Index(m)] = S(1);
            for (std::size_t n = 0; n < rk; ++n) row[n] = S(0);
          } else {
            corr[Eigen::Index(m)] = std::exp(mu[Eigen::Index(m)] - mu_new);  // e^{−inf} = 0 on first use
            S sum = 0;
            for (std::size_t n = 0; n < rk; ++n) {
              row[n] = n < n_end ? std::exp(row[n] - mu_new) : S(0);
              sum += row[n];
            }
            lam[Eigen::Index(m)] = lam[Eigen::Index(m)] * corr[Eigen::Index(m)] + sum;
            mu[Eigen::Index(m)] = mu_new;
          }
        }
        PV.noalias() = tile * V.middleRows(Eigen::Index(s0), Eigen::Index(rk));  // P V_r
        o = corr.asDiagonal() * o;
        o += PV;
        if (want_edges) {
          mu_j[j] = mu;
          sum_j[j] = tile.rowwise().sum();
          pv_j[j] = PV;
        }
      }
      // O_q = o / λ → HBM.
      for (std::size_t m = 0; m < rq; ++m) {
        const S l = lam[Eigen::Index(m)];
        if (poisoned[m]) res.O.row(Eigen::Index(t0 + m)).setConstant(std::numeric_limits<S>::quiet_NaN());
        else if (l > S(0)) res.O.row(Eigen::Index(t0 + m)) = o.row(Eigen::Index(m)) / l;
      }
      tr.write("O", rq * dv);
      if (!want_edges) continue;
      // Edge weights with the final (μ, λ): p_{t,s} = e^{ℓ − μ_j} · e^{μ_j − μ} / λ.
      for (std::size_t j = 0; j < k; ++j) {
        const std::int64_t r = indices[q * k + j];
        if (r < 0) continue;
        double mass = 0;
        Eigen::Matrix<double, 1, Eigen::Dynamic> summary = Eigen::Matrix<double, 1, Eigen::Dynamic>::Zero(Eigen::Index(dv));
        for (std::size_t m = 0; m < rq; ++m) {
          const auto mi = Eigen::Index(m);
          if (lam[mi] <= S(0) || mu_j[j][mi] == kNegInf) continue;
          const double f = std::exp(double(mu_j[j][mi]) - double(mu[mi])) / double(lam[mi]);
          mass += f * double(sum_j[j][mi]);
          summary += f * pv_j[j].row(mi).template cast<double>();
        }
        slots[q * k + j] = Edge{std::int64_t(q), r, std::int64_t(j), score_j[j], mass, summary.norm()};
        used[q * k + j] = 1;
        tr.write("E", 1);
      }
    }
  });

  for (const auto& t : traffic) res.traffic.merge(t);
  if (want_edges) {
    for (std::size_t i = 0; i < slots.size(); ++i)
      if (used[i]) res.edges.push_back(slots[i]);
  }
  return res;
}

Mat<double> stream_dense_reference(const Mat<double>& Q, const Mat<double>& K, const Mat<double>& V,
                                   const BlockMask& mask) {
  const Geometry& g = mask.geometry();
  if (Q.rows() != Eigen::Index(g.T) || K.rows() != Eigen::Index(g.T) || V.rows() != Eigen::Index(g.T) ||
      Q.cols() != K.cols()) {
    throw StreamError("dense reference: Q, K, V must have T rows and Q, K the same head dim");
  }
  Mat<double> O = Mat<double>::Zero(Q.rows(), V.cols());
  Vec<double> logits(Q.rows());
  // Two passes per row (max, then exp-sum and weighted V): the textbook safe softmax, a different
  // algorithm from the online one above, over every token-valid key — no blocks, no selection.
  for (std::size_t t = 0; t < g.T; ++t) {
    double mx = -std::numeric_limits<double>::infinity();
    bool any = false;
    for (std::size_t s = 0; s <= t; ++s) {
      if (!mask.token_valid(t, s)) continue;
      logits[Eigen::Index(s)] = Q.row(Eigen::Index(t)).dot(K.row(Eigen::Index(s)));
      mx = std::max(mx, logits[Eigen::Index(s)]);
      any = true;
    }
    if (!any) continue;
    double l = 0;
    for (std::size_t s = 0; s <= t; ++s) {
      if (!mask.token_valid(t, s)) continue;
      const double p = std::exp(logits[Eigen::Index(s)] - mx);
      l += p;
      O.row(Eigen::Index(t)) += p * V.row(Eigen::Index(s));
    }
    O.row(Eigen::Index(t)) /= l;
  }
  return O;
}

double row_rel_error(const Mat<double>& got, const Mat<double>& ref) {
  if (got.rows() != ref.rows() || got.cols() != ref.cols()) return std::numeric_limits<double>::infinity();
  double worst = 0;
  for (Eigen::Index t = 0; t < ref.rows(); ++t) {
    // Each output row is a convex combination of V rows, so its natural scale is the row's
    // largest magnitude; an entry near 0 by cancellation must not inflate the error.
    const double scale = ref.row(t).cwiseAbs().maxCoeff();
    for (Eigen::Index c = 0; c < ref.cols(); ++c) {
      const double diff = std::abs(got(t, c) - ref(t, c));
      if (std::isnan(got(t, c)) || std::isnan(ref(t, c))) return std::numeric_limits<double>::infinity();
      if (diff == 0) continue;
      // A row that is exactly 0 in the reference (no valid key) must be exactly 0 in the result.
      worst = std::max(worst, scale > 0 ? diff / scale : std::numeric_limits<double>::infinity());
    }
  }
  return worst;
}

DenseCheck stream_check_dense(const Mat<double>& Q, const Mat<double>& K, const Mat<double>& V,
                              const BlockMask& mask, std::size_t threads) {
  const Geometry& g = mask.geometry();
  DenseCheck c;
  // k = n_k covers every valid block of every row: by the invariant of validate_indices the row
  // then keeps min(n_k, valid) = all of its valid blocks.
  const std::size_t k = g.n_k();
  const EstimateResult est = stream_estimate(Q, K, mask, EstimateParams{k, threads});
  c.every_valid_block_kept = validate_indices(est.indices, k, mask).empty();
  for (std::size_t q = 0; q < g.n_q() && c.every_valid_block_kept; ++q) {
    std::size_t kept = 0;
    for (std::size_t j = 0; j < k; ++j) kept += est.at(q, j) >= 0 ? 1 : 0;
    c.every_valid_block_kept = kept == mask.count_valid(q);
  }
  const auto sparse = stream_apply(Q, K, V, mask, est.indices, k, threads, false);
  const Mat<double> dense = stream_dense_reference(Q, K, V, mask);
  c.max_rel_error = row_rel_error(sparse.O, dense);
  return c;
}

template ApplyResult<float> stream_apply<float>(const Mat<float>&, const Mat<float>&, const Mat<float>&,
                                                const BlockMask&, const std::vector<std::int64_t>&, std::size_t,
                                                std::size_t, bool);
template ApplyResult<double> stream_apply<double>(const Mat<double>&, const Mat<double>&, const Mat<double>&,
                                                  const BlockMask&, const std::vector<std::int64_t>&, std::size_t,
                                                  std::size_t, bool);

}  // namespace flashlab::ref::stream
