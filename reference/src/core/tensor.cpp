#include "flashlab/reference/tensor.hpp"

#include <cmath>
#include <limits>
#include <random>
#include <sstream>

namespace flashlab::ref {

namespace {
// A portable normal generator: std::normal_distribution is implementation-defined, so
// Box–Muller over the (portable) 64-bit Mersenne Twister keeps inputs identical everywhere.
template <typename T>
void fill_box_muller(T* out, std::size_t n, unsigned long long seed, double stddev) {
  std::mt19937_64 rng(seed);
  constexpr double two_pi = 6.283185307179586476925286766559;
  auto uniform = [&rng] { return (static_cast<double>(rng() >> 11) + 0.5) * 0x1.0p-53; };
  for (std::size_t i = 0; i < n; i += 2) {
    const double r = std::sqrt(-2.0 * std::log(uniform()));
    const double theta = two_pi * uniform();
    out[i] = static_cast<T>(stddev * r * std::cos(theta));
    if (i + 1 < n) out[i + 1] = static_cast<T>(stddev * r * std::sin(theta));
  }
}

template <typename T>
double rel_error(const T* got, const double* ref, std::size_t n, double floor) {
  double worst = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    const double g = static_cast<double>(got[i]);
    const double r = ref[i];
    if (std::isnan(g) || std::isnan(r)) return std::numeric_limits<double>::infinity();
    if (std::isinf(g) || std::isinf(r)) {
      if (g == r) continue;  // equal infinities (e.g. LSE of a fully masked row) agree
      return std::numeric_limits<double>::infinity();
    }
    const double e = std::abs(g - r) / std::max(std::abs(r), floor);
    if (e > worst) worst = e;
  }
  return worst;
}
}  // namespace

std::string Shape::str() const {
  // Built with a stream: GCC 12 warns (-Wrestrict, a false positive) on chained operator+.
  std::ostringstream os;
  os << '[' << batch << ", " << seq << ", " << heads << ", " << head_dim << ']';
  return os.str();
}

void fill_normal(Tensor<double>& t, unsigned long long seed, double stddev) {
  fill_box_muller(t.data(), t.numel(), seed, stddev);
}
void fill_normal(Tensor<float>& t, unsigned long long seed, float stddev) {
  fill_box_muller(t.data(), t.numel(), seed, stddev);
}
double max_rel_error(const double* got, const double* ref, std::size_t n, double floor) {
  return rel_error(got, ref, n, floor);
}
double max_rel_error(const float* got, const double* ref, std::size_t n, double floor) {
  return rel_error(got, ref, n, floor);
}

}  // namespace flashlab::ref
