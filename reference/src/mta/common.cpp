// Parameters, tilings and input checks shared by every MTA entry point.
#include "flashlab/reference/mta.hpp"

#include "shape_text.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

namespace flashlab::ref::mta {

double resolve_scale(const Params& p, std::size_t head_dim) {
  if (p.scale) return *p.scale;
  return 1.0 / std::sqrt(static_cast<double>(head_dim));
}

namespace {
std::size_t ceil_div(std::size_t a, std::size_t b) { return (a + b - 1) / b; }

void check_kernel(const Params& p) {
  if (p.cq < 1) throw std::invalid_argument("MTA: cq must be at least 1 (got 0)");
  if (p.ck < 1 || p.ck % 2 == 0)
    throw std::invalid_argument("MTA: ck must be odd so the key padding (ck - 1)/2 is symmetric (got " +
                                std::to_string(p.ck) + ")");
}

// B ≥ 1 + halo on each side, otherwise the tile has no effective region and the loop over
// ⌈N / stride⌉ tiles would never end (stride 0) — refused rather than clamped.
Tiling make_tiling(std::size_t n, const Params& p, std::size_t row_halo, std::size_t col_halo, const char* pass) {
  check_kernel(p);
  if (p.block <= row_halo || p.block <= col_halo)
    throw std::invalid_argument(std::string("MTA ") + pass + ": block B = " + std::to_string(p.block) +
                                " leaves no effective tile (B must exceed " + std::to_string(row_halo) +
                                " rows and " + std::to_string(col_halo) + " columns of halo)");
  Tiling t;
  t.br = p.block - row_halo;
  t.bc = p.block - col_halo;
  t.tr = ceil_div(n, t.br);
  t.tc = ceil_div(n, t.bc);
  return t;
}
}  // namespace

// The MTA kernels, forward: "B_r = B − P_q, B_c = B − 2P_k".
Tiling forward_tiling(std::size_t n, const Params& p) { return make_tiling(n, p, p.pq(), 2 * p.pk(), "forward"); }

// The MTA kernels, backward: "B_r = B − 2P_q, B_c = B − 4P_k" — the halo is doubled because dS needs
// dŜ one halo further out, and dŜ needs S one halo further still.
Tiling backward_tiling(std::size_t n, const Params& p) {
  return make_tiling(n, p, 2 * p.pq(), 4 * p.pk(), "backward");
}

template <typename T>
void validate(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const Weights<T>& w, const Params& p) {
  check_kernel(p);
  if (p.splits < 1) throw std::invalid_argument("MTA: splits must be at least 1");
  const Shape& s = q.shape();
  if (s.seq < 1 || s.head_dim < 1 || s.heads < 1 || s.batch < 1)
    throw std::invalid_argument("MTA: Q has an empty dimension " + detail::shape_text(s));
  if (!(k.shape() == s)) throw std::invalid_argument("MTA: K shape " + detail::shape_text(k.shape()) + " differs from Q " + detail::shape_text(s));
  if (!(v.shape() == s)) throw std::invalid_argument("MTA: V shape " + detail::shape_text(v.shape()) + " differs from Q " + detail::shape_text(s));
  if (w.heads() != s.heads || w.cq() != p.cq || w.ck() != p.ck)
    throw std::invalid_argument("MTA: W has shape [" + std::to_string(w.heads()) + ", " + std::to_string(w.cq()) +
                                ", " + std::to_string(w.ck()) + "], expected [" + std::to_string(s.heads) + ", " +
                                std::to_string(p.cq) + ", " + std::to_string(p.ck) + "]");
  if (p.scale && !std::isfinite(*p.scale)) throw std::invalid_argument("MTA: scale must be finite");
}

template void validate(const Tensor<double>&, const Tensor<double>&, const Tensor<double>&, const Weights<double>&,
                       const Params&);
template void validate(const Tensor<float>&, const Tensor<float>&, const Tensor<float>&, const Weights<float>&,
                       const Params&);

Weights<double> random_weights(std::size_t heads, std::size_t cq, std::size_t ck, unsigned long long seed,
                               double stddev) {
  // Reuse the portable normal generator of tensor.cpp through a [1, n, 1, 1] tensor.
  Tensor<double> tmp(Shape{1, heads * cq * ck, 1, 1});
  fill_normal(tmp, seed, stddev);
  Weights<double> w(heads, cq, ck);
  for (std::size_t i = 0; i < w.numel(); ++i) w.data()[i] = tmp.data()[i];
  return w;
}

}  // namespace flashlab::ref::mta
