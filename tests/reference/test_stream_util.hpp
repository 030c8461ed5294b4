// Helpers for the STREAM tests: seeded random matrices and block masks.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "flashlab/reference/stream.hpp"

namespace flashlab::test::stream {

/// T × d matrix of seeded standard-normal values.
template <typename S>
ref::Mat<S> random_mat(std::size_t rows, std::size_t cols, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> dist(0.0, 1.0);
  ref::Mat<S> m(static_cast<Eigen::Index>(rows), static_cast<Eigen::Index>(cols));
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = static_cast<S>(dist(rng));
  return m;
}

/// T × d matrix of small integers in [-lo, lo]: every dot product is exact, so equal scores are
/// exactly equal and ties are frequent — the regime where τ decides.
template <typename S>
ref::Mat<S> random_int_mat(std::size_t rows, std::size_t cols, unsigned seed, int lo = 2) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> dist(-lo, lo);
  ref::Mat<S> m(static_cast<Eigen::Index>(rows), static_cast<Eigen::Index>(cols));
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = static_cast<S>(dist(rng));
  return m;
}

/// n_q × n_k user mask with each block kept with probability p.
inline std::vector<std::uint8_t> random_user_mask(const ref::stream::Geometry& g, unsigned seed, double p) {
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution keep(p);
  std::vector<std::uint8_t> m(g.n_q() * g.n_k());
  for (auto& v : m) v = keep(rng) ? 1 : 0;
  return m;
}

}  // namespace flashlab::test::stream
