// Dense block masses and the comparison of the estimate's kept blocks with the dense top-k by
// mass (stream_fidelity.hpp). For each query block q (parallel over q, as the estimator):
//   S = Q_q K_{0..last}ᵀ in float64                         (every key a row of q may see)
//   per row t: ℓ = −inf where s > t or C_blk[q, r(s)] = 0; p = softmax(ℓ) in two passes
//   M(q, r) += Σ_{s∈r} p_{t,s}
// Memory: the b_q × T tile of one query block per thread and the n_q × n_k masses.
#include "flashlab/reference/stream_fidelity.hpp"

#include "stream_detail.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace flashlab::ref::stream {

template <typename S>
BlockMass dense_block_mass(const Mat<S>& Q, const Mat<S>& K, const BlockMask& mask, std::size_t threads) {
  const Geometry g = mask.geometry();
  g.check();
  if (Q.rows() != Eigen::Index(g.T) || K.rows() != Eigen::Index(g.T) || Q.cols() != K.cols() || Q.cols() == 0)
    throw StreamError("dense block mass: Q and K must be T × d with the same d ≥ 1");
  const std::size_t n_q = g.n_q(), n_k = g.n_k();
  BlockMass out{g, std::vector<double>(n_q * n_k, 0.0)};
  const Mat<double> Kd = K.template cast<double>();
  detail::parallel_for(n_q, threads, [&](std::size_t begin, std::size_t end, std::size_t) {
    Mat<double> S_q;
    std::vector<double> p;
    for (std::size_t q = begin; q < end; ++q) {
      const std::size_t rows = g.q_rows(q), keys = std::min(g.T, q * g.bq + rows);  // tokens ≤ the block's last
      const Mat<double> Qd = Q.middleRows(Eigen::Index(q * g.bq), Eigen::Index(rows)).template cast<double>();
      S_q.noalias() = Qd * Kd.topRows(Eigen::Index(keys)).transpose();
      for (std::size_t m = 0; m < rows; ++m) {
        const std::size_t t = q * g.bq + m;
        double mu = -std::numeric_limits<double>::infinity();
        bool nan = false;
        for (std::size_t s = 0; s <= t; ++s) {
          if (!mask.valid(q, s / g.bk)) continue;
          const double l = S_q(Eigen::Index(m), Eigen::Index(s));
          nan = nan || std::isnan(l);
          mu = std::max(mu, l);
        }
        if (nan) {
          for (std::size_t r = 0; r <= t / g.bk; ++r) out.mass[q * n_k + r] = std::nan("");
          continue;
        }
        if (mu == -std::numeric_limits<double>::infinity()) continue;  // no valid key: the row counts 0
        double lambda = 0;
        p.assign(t + 1, 0.0);
        for (std::size_t s = 0; s <= t; ++s) {
          if (!mask.valid(q, s / g.bk)) continue;
          lambda += (p[s] = std::exp(S_q(Eigen::Index(m), Eigen::Index(s)) - mu));
        }
        for (std::size_t s = 0; s <= t; ++s) out.mass[q * n_k + s / g.bk] += p[s] / lambda;
      }
    }
  });
  return out;
}

template BlockMass dense_block_mass<float>(const Mat<float>&, const Mat<float>&, const BlockMask&, std::size_t);
template BlockMass dense_block_mass<double>(const Mat<double>&, const Mat<double>&, const BlockMask&, std::size_t);

Fidelity compare_with_dense(const BlockMass& dense, const BlockMask& mask, const std::vector<std::int64_t>& indices,
                            std::size_t k) {
  const Geometry& g = dense.geometry;
  const std::size_t n_q = g.n_q(), n_k = g.n_k();
  if (k == 0 || indices.size() != n_q * k || dense.mass.size() != n_q * n_k)
    throw StreamError("fidelity: I must be n_q × k and the dense masses n_q × n_k of the same geometry");
  Fidelity f;
  f.k = k;
  double total = 0;
  std::vector<double> row;
  for (std::size_t q = 0; q < n_q; ++q) {
    row.clear();
    for (std::size_t r = 0; r < n_k; ++r) {
      if (!mask.valid(q, r)) continue;
      row.push_back(dense.at(q, r));
      total += dense.at(q, r);
    }
    if (row.empty()) continue;
    const std::size_t kk = std::min(k, row.size());
    std::nth_element(row.begin(), row.begin() + std::ptrdiff_t(kk - 1), row.end(), std::greater<>());
    const double m_k = row[kk - 1];
    for (std::size_t i = 0; i < kk; ++i) f.mass_oracle += row[i];
    f.wanted += kk;
    for (std::size_t j = 0; j < k; ++j) {
      const std::int64_t r = indices[q * k + j];
      if (r < 0) continue;
      if (std::size_t(r) >= n_k) throw StreamError("fidelity: I[" + std::to_string(q) + ", " + std::to_string(j) + "] is not a key block");
      const double m = dense.at(q, std::size_t(r));
      f.mass_kept += m;
      if (m >= m_k) ++f.hits;
    }
  }
  if (total > 0) {
    f.mass_kept /= total;
    f.mass_oracle /= total;
  }
  return f;
}

}  // namespace flashlab::ref::stream
