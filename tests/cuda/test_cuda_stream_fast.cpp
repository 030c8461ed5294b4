// GPU tests of the fast bf16 STREAM estimate (flashlab/cuda/stream_fast_estimate.hpp) against the
// CPU reference (flashlab/reference/stream.hpp) fed the same bf16 values: indices and scores
// bitwise equal on exact (small-integer) inputs, ties included, T = 1 … 131072 with ragged T and
// user masks; bitwise the same run to run; on random inputs equal except at decisions within the
// rounding of a bf16-input, fp32-accumulated score (counted, printed); heads; NaN; bad
// parameters; planted-needle recall at T = 1M.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>

#include "flashlab/cuda/fast_attention.hpp"
#include "flashlab/cuda/stream_fast_estimate.hpp"
#include "flashlab/reference/stream.hpp"
#include "flashlab/reference/stream_needles.hpp"
#include "gpu_test_util.hpp"
#include "stream_test_util.hpp"

using namespace flashlab;
using namespace flashlab::ref::stream;
using ref::Mat;
namespace gs = flashlab::cuda::stream;

namespace {

using test::user_mask;

/// A T × d matrix rounded to bf16: the bit patterns for the GPU, the (exact) values for the reference.
struct Bf16Mat {
  Mat<float> values;
  std::vector<std::uint16_t> bits;
  [[nodiscard]] gs::HostHeadsBf16 view() const { return {bits.data(), 1, std::size_t(values.cols())}; }
};

Bf16Mat to_bf16(Mat<float> m) {
  Bf16Mat out{std::move(m), {}};
  out.bits.resize(std::size_t(out.values.size()));
  for (std::size_t i = 0; i < out.bits.size(); ++i) {
    out.bits[i] = cuda::float_to_bf16(out.values.data()[i]);
    out.values.data()[i] = cuda::bf16_to_float(out.bits[i]);
  }
  return out;
}

/// Integers in [−lo, lo]: exact in bf16, and every score a small integer, exact in fp32.
Bf16Mat int_bf16(std::size_t rows, std::size_t cols, std::mt19937_64& rng, int lo) {
  return to_bf16(test::int_mat(rows, cols, rng, lo));
}

Bf16Mat normal_bf16(std::size_t rows, std::size_t cols, std::mt19937_64& rng) {
  return to_bf16(test::normal_mat(rows, cols, rng));
}

constexpr std::size_t kRefThreads = 16;

/// The fast estimate twice and the reference once on the same bf16 values
/// (test::check_exact_estimate): I and the scores identical (every score is exact).
void check_exact(const Bf16Mat& Q, const Bf16Mat& K, const BlockMask& mask, std::size_t k) {
  const Geometry& g = mask.geometry();
  INFO("T=" << g.T << " d=" << Q.values.cols() << " k=" << k << " user mask=" << mask.has_user_mask());
  const gs::EstimateOutput a = gs::stream_fast_estimate(Q.view(), K.view(), mask, k);
  const gs::EstimateOutput b = gs::stream_fast_estimate(Q.view(), K.view(), mask, k);
  test::check_exact_estimate(a, b, stream_estimate(Q.values, K.values, mask, EstimateParams{k, kRefThreads}), mask,
                             k);
}

}  // namespace

TEST_CASE("cuda stream fast: estimate equals the reference bit for bit on exact inputs, ties decided by tau",
          "[gpu][stream-fast]") {
  const auto seed = test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  struct Shape { std::size_t T, d; int lo; };
  // Ragged T (not a multiple of 64), one token, one block, and values in [−1, 1] (many equal
  // block maxima: τ's r rule decides them) beside wider ones.
  const Shape shapes[] = {{1, 64, 1},      {37, 128, 1},   {64, 64, 1},    {65, 128, 2},  {200, 64, 1},
                          {1000, 128, 2},  {4097, 64, 1},  {9000, 128, 3}, {16383, 64, 2}};
  for (const Shape& s : shapes) {
    const Geometry g{s.T, 64, 64};
    const Bf16Mat Q = int_bf16(s.T, s.d, rng, s.lo), K = int_bf16(s.T, s.d, rng, s.lo);
    for (const std::size_t k : {std::size_t(1), std::size_t(2), std::size_t(3), std::size_t(8), std::size_t(32),
                                std::min<std::size_t>(g.n_k(), gs::kFastEstimateMaxK)}) {
      check_exact(Q, K, BlockMask(g), k);
      check_exact(Q, K, BlockMask(g, user_mask(g, rng, 0.5)), k);
      check_exact(Q, K, BlockMask(g, user_mask(g, rng, 0.05)), k);
    }
  }
}

TEST_CASE("cuda stream fast: estimate equals the reference at T = 131072, with and without a user mask",
          "[gpu][stream-fast][large]") {
  const auto seed = test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  for (const std::size_t T : {std::size_t(131072), std::size_t(131071)}) {
    const Geometry g{T, 64, 64};
    const Bf16Mat Q = int_bf16(T, 64, rng, 2), K = int_bf16(T, 64, rng, 2);
    check_exact(Q, K, BlockMask(g), 8);
    check_exact(Q, K, BlockMask(g, user_mask(g, rng, 0.3)), 16);
  }
}

TEST_CASE("cuda stream fast: on random bf16 inputs the indices differ only at decisions within rounding",
          "[gpu][stream-fast]") {
  const auto seed = test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  struct Case { std::size_t T, d, k; double mask_p; };
  for (const Case c : {Case{4096, 64, 8, 1.0}, Case{16384, 128, 8, 1.0}, Case{16384, 64, 16, 0.4},
                       Case{2000, 128, 4, 0.7}, Case{32768, 128, 32, 1.0}}) {
    const Geometry g{c.T, 64, 64};
    const Bf16Mat Q = normal_bf16(c.T, c.d, rng), K = normal_bf16(c.T, c.d, rng);
    const BlockMask mask = c.mask_p < 1.0 ? BlockMask(g, user_mask(g, rng, c.mask_p)) : BlockMask(g);
    const gs::EstimateOutput gpu = gs::stream_fast_estimate(Q.view(), K.view(), mask, c.k);
    const gs::EstimateOutput again = gs::stream_fast_estimate(Q.view(), K.view(), mask, c.k);
    CHECK(gpu.indices == again.indices);
    CHECK(test::same_bits(gpu.scores, again.scores));
    const EstimateResult ref = stream_estimate(Q.values, K.values, mask, EstimateParams{c.k, kRefThreads});
    // The products of bf16 values are exact in fp32; only the order (and, inside an mma, the
    // rounding) of the d-term sums differs. Each side is within d·u·Σ|q_i k_i| ≤ d·u·‖Q_t‖‖K_s‖ of
    // the exact score with u = 2^-23 (truncating accumulation allowed), so one decision can flip
    // only where the GPU's two scores are within twice that.
    const double u = std::ldexp(1.0, -23);
    const double bound = 2 * double(c.d) * u * Q.values.rowwise().norm().maxCoeff() * K.values.rowwise().norm().maxCoeff();
    const test::NearTieCount n = test::count_near_ties(gpu, ref, g.n_q(), c.k, bound);
    std::cout << "stream fast random T=" << c.T << " d=" << c.d << " k=" << c.k << " mask p=" << c.mask_p << ": "
              << n.differing << " of " << g.n_q() << " rows differ from the reference (bf16 inputs), "
              << n.unexplained << " of them without a near tie; " << n.near_ties << " rows have a decision gap within "
              << bound << "\n";
    CHECK(n.unexplained == 0);
    CHECK(validate_indices(gpu.indices, c.k, mask).empty());
  }
}

TEST_CASE("cuda stream fast: heads of [T, H, d] inputs are independent problems", "[gpu][stream-fast]") {
  const auto seed = test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const Geometry g{3000, 64, 64};
  const std::size_t H = 3, d = 128, k = 6;
  std::vector<Bf16Mat> Qh, Kh;
  std::vector<std::uint16_t> Q(g.T * H * d), K(g.T * H * d);
  for (std::size_t h = 0; h < H; ++h) {
    Qh.push_back(normal_bf16(g.T, d, rng));
    Kh.push_back(normal_bf16(g.T, d, rng));
    for (std::size_t t = 0; t < g.T; ++t)
      for (std::size_t c = 0; c < d; ++c) {
        Q[(t * H + h) * d + c] = Qh[h].bits[t * d + c];
        K[(t * H + h) * d + c] = Kh[h].bits[t * d + c];
      }
  }
  const BlockMask mask(g, user_mask(g, rng, 0.7));
  const gs::EstimateOutput all = gs::stream_fast_estimate({Q.data(), H, d}, {K.data(), H, d}, mask, k);
  const std::size_t per_head = g.n_q() * k;
  for (std::size_t h = 0; h < H; ++h) {
    const gs::EstimateOutput one = gs::stream_fast_estimate(Qh[h].view(), Kh[h].view(), mask, k);
    CHECK(std::equal(one.indices.begin(), one.indices.end(), all.indices.begin() + std::ptrdiff_t(h * per_head)));
    CHECK(std::memcmp(one.scores.data(), all.scores.data() + h * per_head, per_head * sizeof(float)) == 0);
  }
}

TEST_CASE("cuda stream fast: NaN scores count as -inf, empty rows are -1, bad parameters are refused",
          "[gpu][stream-fast]") {
  const Geometry g{1000, 64, 64};
  std::mt19937_64 rng(5);
  Bf16Mat Q = int_bf16(g.T, 64, rng, 2), K = int_bf16(g.T, 64, rng, 2);
  const std::uint16_t nan_bits = cuda::float_to_bf16(std::numeric_limits<float>::quiet_NaN());
  for (const std::size_t t : {std::size_t(130), std::size_t(640), std::size_t(641)}) {  // whole key rows NaN
    for (std::size_t c = 0; c < 64; ++c) K.bits[t * 64 + c] = nan_bits;
    K.values.row(Eigen::Index(t)).setConstant(std::numeric_limits<float>::quiet_NaN());
  }
  Q.bits[900 * 64] = nan_bits;  // every logit of token 900 is NaN
  Q.values(900, 0) = std::numeric_limits<float>::quiet_NaN();
  std::vector<std::uint8_t> user(g.n_q() * g.n_k(), 1);
  for (std::size_t r = 0; r < g.n_k(); ++r) user[5 * g.n_k() + r] = 0;  // query block 5 sees nothing
  check_exact(Q, K, BlockMask(g, user), 3);
  check_exact(Q, K, BlockMask(g), 4);
  const gs::EstimateOutput est = gs::stream_fast_estimate(Q.view(), K.view(), BlockMask(g, user), 3);
  for (std::size_t j = 0; j < 3; ++j) CHECK(est.indices[5 * 3 + j] == -1);

  const auto refuses = [&](const Geometry& bad_g, std::size_t d, std::size_t k) {
    const Bf16Mat q = int_bf16(bad_g.T, d, rng, 1), kk = int_bf16(bad_g.T, d, rng, 1);
    CHECK_THROWS_AS(gs::stream_fast_estimate(q.view(), kk.view(), BlockMask(bad_g), k), StreamError);
  };
  refuses(Geometry{256, 32, 64}, 64, 4);   // b_q ≠ 64
  refuses(Geometry{256, 64, 128}, 64, 4);  // b_k ≠ 64
  refuses(Geometry{256, 64, 64}, 96, 4);   // d ∉ {64, 128}
  refuses(Geometry{256, 64, 64}, 64, 0);   // k = 0
  refuses(Geometry{256, 64, 64}, 64, gs::kFastEstimateMaxK + 1);
  {
    const std::vector<std::uint16_t> many(std::size_t(70000) * 64, 0);  // T = 1, H = 70000: over the grid's rows
    const gs::HostHeadsBf16 heads{many.data(), 70000, 64};
    CHECK_THROWS_AS(gs::stream_fast_estimate(heads, heads, BlockMask(Geometry{1, 64, 64}), 1), StreamError);
  }
  const gs::HostHeadsBf16 two{Q.bits.data(), 2, 32};
  CHECK_THROWS_AS(gs::stream_fast_estimate(two, K.view(), BlockMask(g), 4), StreamError);
}

TEST_CASE("cuda stream fast: planted needles are recalled at T = 1M, k = 16, 8 needles per query block",
          "[gpu][stream-fast][needles][large]") {
  NeedleParams p;
  p.geometry = Geometry{1 << 20, 64, 64};
  p.d = 128;
  p.needles_per_block = 8;
  p.lead_in = true;
  p.bf16_pairs = true;  // the lead-in exact in bf16 (stream_needles.hpp)
  p.seed = test::fresh_seed();
  INFO("seed " << p.seed);
  // 4 needle blocks: 64 planted coordinates and 64 of noise; 8 needle blocks: all 128 planted.
  for (const std::size_t blocks : {std::size_t(4), std::size_t(8)}) {
    p.needle_blocks = blocks;
    const NeedleSet set = make_needles(p);
    std::vector<std::uint16_t> Q(std::size_t(set.Q.size())), K(std::size_t(set.K.size()));
    bool exact = true;  // the bf16 pairs make the rounding a no-op on the planted columns
    for (std::size_t i = 0; i < Q.size(); ++i) Q[i] = cuda::float_to_bf16(set.Q.data()[i]);
    for (std::size_t i = 0; i < K.size(); ++i) {
      K[i] = cuda::float_to_bf16(set.K.data()[i]);
      if (Eigen::Index(i % p.d) < Eigen::Index(2 * blocks * p.needles_per_block))
        exact = exact && cuda::bf16_to_float(K[i]) == set.K.data()[i];
    }
    CHECK(exact);
    const gs::EstimateOutput est =
        gs::stream_fast_estimate({Q.data(), 1, p.d}, {K.data(), 1, p.d}, BlockMask(p.geometry), 16);
    const NeedleRecall rec = needle_recall(set.needles, est.indices, 16);
    std::cout << "fast needles T=" << p.geometry.T << " k=16 needle blocks=" << blocks << " (bf16 pairs): recall "
              << rec.found << "/" << rec.planted << " = " << rec.recall() << "\n";
    CHECK(rec.recall() >= 0.99);
  }
}
