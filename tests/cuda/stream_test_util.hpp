// Helpers shared by the STREAM GPU tests (clear and fast estimate): seeded input matrices, random
// user masks, and the two comparisons of a GPU estimate with the reference's (bitwise on exact
// inputs; on random inputs, differences only at near ties).
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "flashlab/cuda/stream.hpp"
#include "flashlab/cuda/stream_fast.hpp"
#include "gpu_test_util.hpp"
#include "flashlab/reference/stream.hpp"

namespace flashlab::test {

/// A rows × cols matrix of draw() values, drawn in storage order.
template <typename Draw>
ref::Mat<float> make_mat(std::size_t rows, std::size_t cols, Draw draw) {
  ref::Mat<float> m(static_cast<Eigen::Index>(rows), static_cast<Eigen::Index>(cols));
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = draw();
  return m;
}

/// Integers in [−lo, lo]: small enough that every score is exact in fp32 (and the values in bf16).
inline ref::Mat<float> int_mat(std::size_t rows, std::size_t cols, std::mt19937_64& rng, int lo = 2) {
  std::uniform_int_distribution<int> dist(-lo, lo);
  return make_mat(rows, cols, [&] { return float(dist(rng)); });
}

/// N(0, sd) values.
inline ref::Mat<float> normal_mat(std::size_t rows, std::size_t cols, std::mt19937_64& rng, double sd = 1.0) {
  std::normal_distribution<double> dist(0.0, sd);
  return make_mat(rows, cols, [&] { return float(dist(rng)); });
}

/// A random user mask C_blk: each (query block, key block) pair kept with probability p.
inline std::vector<std::uint8_t> user_mask(const ref::stream::Geometry& g, std::mt19937_64& rng, double p) {
  std::bernoulli_distribution keep(p);
  std::vector<std::uint8_t> m(g.n_q() * g.n_k());
  for (auto& v : m) v = keep(rng) ? 1 : 0;
  return m;
}

/// The mask of a test case: user_mask() with probability p ANDed with causality, or causality alone
/// when p ≥ 1 (no user mask, and no draws).
inline ref::stream::BlockMask case_mask(const ref::stream::Geometry& g, std::mt19937_64& rng, double p) {
  return p < 1.0 ? ref::stream::BlockMask(g, user_mask(g, rng, p)) : ref::stream::BlockMask(g);
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// Two GPU runs `a`, `b` of one estimate and the reference's `ref` on inputs whose scores are all
/// exact: the runs bitwise equal, I and the scores equal to the reference's (an empty entry's score
/// NaN), I valid for the mask. The first three mismatches are printed.
inline void check_exact_estimate(const cuda::stream::EstimateOutput& a, const cuda::stream::EstimateOutput& b,
                                 const ref::stream::EstimateResult& ref, const ref::stream::BlockMask& mask,
                                 std::size_t k) {
  CHECK(a.indices == b.indices);
  CHECK(same_bits(a.scores, b.scores));
  CHECK(same_bits(a.margins, b.margins));
  REQUIRE(a.indices.size() == ref.indices.size());
  std::size_t bad = 0;
  for (std::size_t i = 0; i < ref.indices.size(); ++i) {
    const bool same_score = ref.indices[i] < 0 ? std::isnan(a.scores[i]) : double(a.scores[i]) == ref.scores[i];
    if (a.indices[i] != ref.indices[i] || !same_score) {
      if (bad++ < 3)
        UNSCOPED_INFO("q=" << i / k << " j=" << i % k << ": GPU " << a.indices[i] << " (" << a.scores[i] << "), ref "
                           << ref.indices[i] << " (" << ref.scores[i] << ")");
    }
  }
  CHECK(bad == 0);
  CHECK(ref::stream::validate_indices(a.indices, k, mask).empty());
}

/// Rows of a GPU estimate that differ from the reference's on random inputs.
struct NearTieCount {
  std::size_t differing = 0;    ///< rows whose I differs from the reference's
  std::size_t near_ties = 0;    ///< rows whose decision margin is within the rounding bound
  std::size_t unexplained = 0;  ///< differing rows without a near tie (must be 0)
};

/// Counts the rows of `gpu` whose I differs from `ref`'s, and how many of them have a margin above
/// `tie_bound` (the largest score gap that rounding can flip): those are unexplained.
inline NearTieCount count_near_ties(const cuda::stream::EstimateOutput& gpu, const ref::stream::EstimateResult& ref,
                                    std::size_t n_q, std::size_t k, double tie_bound) {
  NearTieCount c;
  for (std::size_t q = 0; q < n_q; ++q) {
    const bool near_tie = gpu.margins[q] <= tie_bound;
    c.near_ties += near_tie ? 1 : 0;
    bool same = true;
    for (std::size_t j = 0; j < k; ++j) same = same && gpu.indices[q * k + j] == ref.indices[q * k + j];
    if (same) continue;
    ++c.differing;
    if (!near_tie) ++c.unexplained;
  }
  return c;
}

/// 16-bit STREAM inputs: bit patterns [T, H, d] for the GPU and each head's rounded values (T × d,
/// float64) for the reference.
struct Inputs16 {
  std::size_t T = 0, H = 1, d = 0;
  ref::Dtype dtype = ref::Dtype::bf16;
  std::vector<std::uint16_t> Q, K, V;   // [T, H, d]
  std::vector<ref::Mat<double>> Qh, Kh, Vh;  // per head, the rounded values
  /// `x` as the fast kernels' host view.
  cuda::stream::HostHeads16 heads(const std::vector<std::uint16_t>& x) const { return {x.data(), H, d}; }
};

/// N(0, 1) values rounded to `dtype` (Q drawn with standard deviation q_sd), or, with `ints`,
/// integers in [−2, 2] (exact in every dtype, ties frequent).
inline Inputs16 make_inputs16(std::size_t T, std::size_t H, std::size_t d, ref::Dtype dtype, double q_sd,
                              std::mt19937_64& rng, bool ints = false) {
  Inputs16 in;
  in.T = T;
  in.H = H;
  in.d = d;
  in.dtype = dtype;
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_int_distribution<int> small(-2, 2);
  auto fill = [&](std::vector<std::uint16_t>& bits, std::vector<ref::Mat<double>>& per_head, double sd) {
    bits.resize(T * H * d);
    per_head.assign(H, ref::Mat<double>(Eigen::Index(T), Eigen::Index(d)));
    for (std::size_t t = 0; t < T; ++t)
      for (std::size_t h = 0; h < H; ++h)
        for (std::size_t c = 0; c < d; ++c) {
          const float f = ints ? float(small(rng)) : float(sd * normal(rng));
          const std::uint16_t b = cuda::to_bits16(f, dtype);
          bits[(t * H + h) * d + c] = b;
          per_head[h](Eigen::Index(t), Eigen::Index(c)) = to_float(b, dtype);
        }
  };
  fill(in.Q, in.Qh, q_sd);
  fill(in.K, in.Kh, 1.0);
  fill(in.V, in.Vh, 1.0);
  return in;
}

/// I of every head of `in` from the reference estimate (its τ order, valid indices), [H, n_q, k].
inline std::vector<std::int64_t> reference_indices(const Inputs16& in, const ref::stream::BlockMask& mask,
                                                   std::size_t k) {
  std::vector<std::int64_t> I;
  for (std::size_t h = 0; h < in.H; ++h) {
    const ref::stream::EstimateResult est =
        ref::stream::stream_estimate(in.Qh[h], in.Kh[h], mask, ref::stream::EstimateParams{k, 8});
    REQUIRE(ref::stream::validate_indices(est.indices, k, mask).empty());
    I.insert(I.end(), est.indices.begin(), est.indices.end());
  }
  return I;
}

}  // namespace flashlab::test
