// Shared helpers of the MTA tests: seeded inputs and an error measure relative to the tensor's max.
#pragma once

#include "flashlab/reference/mta.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>

namespace mta_test {

using namespace flashlab::ref;

/// "[B, N, H, d]" (a stream, not Shape::str(): GCC 12 -O2 flags a false -Wrestrict there).
inline std::string shape_text(const Shape& s) {
  std::ostringstream os;
  os << '[' << s.batch << ", " << s.seq << ", " << s.heads << ", " << s.head_dim << ']';
  return os.str();
}

/// Seeded Q, K, V, dO and W for one shape.
struct Inputs {
  Tensor<double> q, k, v, d_o;
  mta::Weights<double> w;
};

inline Inputs make_inputs(Shape s, std::size_t cq, std::size_t ck, unsigned long long seed) {
  Inputs in{Tensor<double>(s), Tensor<double>(s), Tensor<double>(s), Tensor<double>(s), {}};
  fill_normal(in.q, seed + 1);
  fill_normal(in.k, seed + 2);
  fill_normal(in.v, seed + 3);
  fill_normal(in.d_o, seed + 4);
  in.w = mta::random_weights(s.heads, cq, ck, seed + 5);
  return in;
}

/// max |got − ref| / max |ref| — the "relative to the tensor's max" measure of the docs.
/// NaN or ±inf anywhere gives +inf, so a NaN can never pass a tolerance.
template <typename G>
double rel_to_max(const G* got, const double* ref, std::size_t n) {
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double g = static_cast<double>(got[i]);
    if (!std::isfinite(g) || !std::isfinite(ref[i])) return std::numeric_limits<double>::infinity();
    diff = std::max(diff, std::abs(g - ref[i]));
    scale = std::max(scale, std::abs(ref[i]));
  }
  return scale > 0 ? diff / scale : diff;
}

template <typename G>
double rel_to_max(const Tensor<G>& got, const Tensor<double>& ref) {
  if (!(got.shape() == ref.shape())) return std::numeric_limits<double>::infinity();
  return rel_to_max(got.data(), ref.data(), ref.numel());
}

template <typename G>
double rel_to_max(const mta::Weights<G>& got, const mta::Weights<double>& ref) {
  if (got.numel() != ref.numel()) return std::numeric_limits<double>::infinity();
  return rel_to_max(got.data(), ref.data(), ref.numel());
}

}  // namespace mta_test
