// Helpers shared by the MTA GPU tests (clear and fast kernels).
#pragma once

#include "gpu_test_util.hpp"

#include "flashlab/reference/attention_problem.hpp"
#include "flashlab/reference/mta.hpp"
#include "flashlab/reference/tensor.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace flashlab::test {

/// The scale of dW's terms: max over taps (a, b) of Σ_ij |dŜ[i, j]| · |S[i + a − Pq, j + b − Pk]|,
/// summed over the batch, in float64 from the definition. dW[a, b] = Σ_ij dŜ[i, j] · S[...] is one
/// sum over N²/2 entries per head whose terms cancel (Σ_j dŜ[i, j] = 0 on every row), so |dW|
/// can be far below its terms and round-off large *relative to dW* though correct; dW's error is
/// normalised by this scale (≥ max|dW|, so never looser than needed for a well-conditioned dW).
inline double mta_dw_term_scale(const ref::Tensor<double>& q, const ref::Tensor<double>& k, const ref::Tensor<double>& v,
                                const ref::Tensor<double>& d_o, const ref::mta::Weights<double>& w,
                                const ref::mta::Params& p) {
  const ref::Shape& sh = q.shape();
  const double scale = ref::mta::resolve_scale(p, sh.head_dim);
  const long n = long(sh.seq), pq = long(p.pq()), pk = long(p.pk());
  double terms = 0.0;
  for (std::size_t h = 0; h < sh.heads; ++h) {
    ref::Mat<double> sum_abs = ref::Mat<double>::Zero(long(p.cq), long(p.ck));
    for (std::size_t b = 0; b < sh.batch; ++b) {
      ref::Mat<double> s = scale * (q.head(b, h) * k.head(b, h).transpose());
      for (long i = 0; i < n; ++i)
        for (long j = i + 1; j < n; ++j) s(i, j) = 0.0;
      auto at = [&](long r, long c) { return r < 0 || c < 0 || r >= n || c >= n ? 0.0 : s(r, c); };
      ref::Mat<double> prob = ref::Mat<double>::Zero(n, n);
      for (long i = 0; i < n; ++i) {
        double m = -std::numeric_limits<double>::infinity(), l = 0.0;
        for (long j = 0; j <= i; ++j) {
          double acc = 0.0;
          for (long a = 0; a <= pq; ++a)
            for (long c = 0; c < long(p.ck); ++c) acc += w.at(h, std::size_t(a), std::size_t(c)) * at(i + a - pq, j + c - pk);
          prob(i, j) = acc;
          m = std::max(m, acc);
        }
        for (long j = 0; j <= i; ++j) l += std::exp(prob(i, j) - m);
        for (long j = 0; j <= i; ++j) prob(i, j) = std::exp(prob(i, j) - m) / l;
      }
      const ref::Mat<double> o = prob * v.head(b, h), d_p = d_o.head(b, h) * v.head(b, h).transpose();
      for (long i = 0; i < n; ++i) {
        const double d_i = d_o.head(b, h).row(i).dot(o.row(i));
        for (long j = 0; j <= i; ++j) {
          const double ds_hat = std::abs(prob(i, j) * (d_p(i, j) - d_i));
          for (long a = 0; a <= pq; ++a)
            for (long c = 0; c < long(p.ck); ++c) sum_abs(a, c) += ds_hat * std::abs(at(i + a - pq, j + c - pk));
        }
      }
    }
    terms = std::max(terms, sum_abs.maxCoeff());
  }
  return terms;
}

/// max_t |got[t] − want[t]| / term_scale (absolute when term_scale is 0: N = 1 has no terms);
/// NaN → +inf.
template <typename G>
double mta_dw_error(const G* got, const double* want, std::size_t count, double term_scale) {
  double worst = 0.0;
  for (std::size_t t = 0; t < count; ++t) {
    const double e = std::abs(double(got[t]) - want[t]);
    if (!(e <= worst)) worst = std::isnan(e) ? std::numeric_limits<double>::infinity() : e;
  }
  return term_scale > 0.0 ? worst / term_scale : worst;
}

/// The plain causal attention problem of an MTA test case (its batch, seq, heads and dim): what
/// MTA reduces to with a 1 × 1 kernel of weight 1, the second reference the tests hold it to.
template <typename Case>
ref::AttentionProblem plain_causal_problem(const Case& c) {
  const ref::Shape shape{std::size_t(c.batch), std::size_t(c.seq), std::size_t(c.heads), std::size_t(c.dim)};
  return attention_problem(shape, true, ref::Dtype::fp32);
}

}  // namespace flashlab::test
