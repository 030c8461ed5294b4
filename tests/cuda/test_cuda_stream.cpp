// GPU tests of the clear STREAM kernels (flashlab/cuda/stream.hpp) against the CPU reference
// (flashlab/reference/stream.hpp): indices bitwise equal on exact (small-integer) inputs, ties
// included; on random inputs equal except at decisions within fp32 rounding (counted, printed);
// determinism run to run; application == dense causal attention with k = n_k; edge records;
// multi-head layout; NaN and bad input; planted-needle recall at T = 1M.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>

#include "flashlab/cuda/stream.hpp"
#include "flashlab/reference/stream.hpp"
#include "flashlab/reference/stream_needles.hpp"
#include "gpu_test_util.hpp"
#include "stream_test_util.hpp"

using namespace flashlab;
using namespace flashlab::ref::stream;
using ref::Mat;
namespace gs = flashlab::cuda::stream;

namespace {

using test::int_mat;
using test::normal_mat;
using test::user_mask;

gs::HostHeads one_head(const Mat<float>& m) { return gs::HostHeads{m.data(), 1, std::size_t(m.cols())}; }

/// Runs the GPU estimate twice and the reference once (test::check_exact_estimate): identical I and
/// scores (the inputs make every score exact in fp32).
void check_exact(const Mat<float>& Q, const Mat<float>& K, const BlockMask& mask, std::size_t k) {
  const Geometry& g = mask.geometry();
  INFO("T=" << g.T << " bq=" << g.bq << " bk=" << g.bk << " d=" << Q.cols() << " k=" << k
            << " user mask=" << mask.has_user_mask());
  const gs::EstimateOutput a = gs::stream_estimate(one_head(Q), one_head(K), mask, k);
  const gs::EstimateOutput b = gs::stream_estimate(one_head(Q), one_head(K), mask, k);
  test::check_exact_estimate(a, b, stream_estimate(Q, K, mask, EstimateParams{k, 8}), mask, k);
}

}  // namespace

TEST_CASE("cuda stream: estimate equals the reference bit for bit on exact inputs, ties decided by tau",
          "[gpu][stream]") {
  const auto seed = test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  struct Shape { std::size_t T, bq, bk, d; };
  const Shape shapes[] = {{1, 1, 1, 1},    {2, 1, 1, 3},     {10, 4, 3, 2},    {37, 4, 4, 5},   {64, 16, 16, 4},
                          {100, 8, 5, 3},  {257, 16, 32, 8}, {513, 64, 64, 16}, {1000, 32, 16, 7}, {4096, 64, 64, 16},
                          {4100, 64, 32, 32}, {9000, 128, 128, 16}};
  for (const Shape& s : shapes) {
    const Geometry g{s.T, s.bq, s.bk};
    // Values in [-1, 1] at d ≤ 8 make equal block maxima common: τ's r rule decides them.
    const Mat<float> Q = int_mat(s.T, s.d, rng, s.d <= 8 ? 1 : 2), K = int_mat(s.T, s.d, rng, s.d <= 8 ? 1 : 2);
    for (const std::size_t k : {std::size_t(1), std::size_t(2), std::size_t(3), std::size_t(8), g.n_k()}) {
      check_exact(Q, K, BlockMask(g), k);
      check_exact(Q, K, BlockMask(g, user_mask(g, rng, 0.5)), k);
      check_exact(Q, K, BlockMask(g, user_mask(g, rng, 0.05)), k);
    }
  }
}

TEST_CASE("cuda stream: estimate equals the reference at T = 131072, with and without a user mask",
          "[gpu][stream][large]") {
  const auto seed = test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const Geometry g{131072, 64, 64};
  const Mat<float> Q = int_mat(g.T, 16, rng), K = int_mat(g.T, 16, rng);
  check_exact(Q, K, BlockMask(g), 8);
  check_exact(Q, K, BlockMask(g, user_mask(g, rng, 0.3)), 8);
}

TEST_CASE("cuda stream: on random inputs the indices differ only at decisions within fp32 rounding",
          "[gpu][stream]") {
  const auto seed = test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  struct Case { std::size_t T, b, d, k; double mask_p; };
  for (const Case c : {Case{4096, 64, 64, 8, 1.0}, Case{16384, 64, 128, 8, 1.0}, Case{16384, 32, 64, 16, 0.4},
                       Case{2000, 16, 32, 4, 0.7}}) {
    const Geometry g{c.T, c.b, c.b};
    const Mat<float> Q = normal_mat(c.T, c.d, rng), K = normal_mat(c.T, c.d, rng);
    const BlockMask mask = c.mask_p < 1.0 ? BlockMask(g, user_mask(g, rng, c.mask_p)) : BlockMask(g);
    const gs::EstimateOutput gpu = gs::stream_estimate(one_head(Q), one_head(K), mask, c.k);
    const EstimateResult ref = stream_estimate(Q, K, mask, EstimateParams{c.k, 8});
    // Rounding bound of one score: both sides sum d products, each within γ_d·Σ|q_i k_i| ≤
    // γ_d·‖Q_t‖‖K_s‖ of the exact value, so two fp32 scores of one pair differ by at most twice that.
    const double u = std::ldexp(1.0, -24), gamma = double(c.d) * u / (1 - double(c.d) * u);
    const double bound = 2 * gamma * Q.rowwise().norm().maxCoeff() * K.rowwise().norm().maxCoeff();
    // Either side's decision could flip: a gap within 2 × bound.
    const test::NearTieCount n = test::count_near_ties(gpu, ref, g.n_q(), c.k, 2 * bound);
    std::cout << "stream random T=" << c.T << " b=" << c.b << " d=" << c.d << " k=" << c.k << " mask p=" << c.mask_p
              << ": " << n.differing << " of " << g.n_q() << " rows differ from the reference, all at near ties: "
              << (n.unexplained == 0 ? "yes" : "NO") << " (" << n.near_ties << " rows have a decision within 2×"
              << bound << ")\n";
    CHECK(n.unexplained == 0);
    CHECK(validate_indices(gpu.indices, c.k, mask).empty());
  }
}

TEST_CASE("cuda stream: apply with k = n_k equals dense causal attention (fp32 within 1e-5 of float64)",
          "[gpu][stream]") {
  const auto seed = test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  struct Case { std::size_t T, bq, bk, d, dv; double mask_p; };
  for (const Case c : {Case{1, 1, 1, 4, 4, 1.0}, Case{37, 4, 4, 16, 8, 1.0}, Case{50, 8, 5, 8, 8, 1.0},
                       Case{70, 16, 32, 32, 16, 1.0}, Case{256, 64, 64, 64, 64, 1.0}, Case{1000, 64, 32, 64, 64, 1.0},
                       Case{1500, 32, 32, 128, 128, 1.0}, Case{300, 16, 16, 16, 16, 0.5}, Case{333, 8, 16, 32, 24, 0.3}}) {
    INFO("T=" << c.T << " bq=" << c.bq << " bk=" << c.bk << " d=" << c.d << " mask p=" << c.mask_p);
    const Geometry g{c.T, c.bq, c.bk};
    // Q pre-scaled by 1/√d (the logit is unscaled ⟨q, k⟩, as in the reference).
    const Mat<float> Q = normal_mat(c.T, c.d, rng, 1.0 / std::sqrt(double(c.d)));
    const Mat<float> K = normal_mat(c.T, c.d, rng), V = normal_mat(c.T, c.dv, rng);
    const BlockMask mask = c.mask_p < 1.0 ? BlockMask(g, user_mask(g, rng, c.mask_p)) : BlockMask(g);
    const std::size_t k = g.n_k();
    const gs::EstimateOutput est = gs::stream_estimate(one_head(Q), one_head(K), mask, k);
    REQUIRE(validate_indices(est.indices, k, mask).empty());
    for (std::size_t q = 0; q < g.n_q(); ++q) {  // k = n_k: every valid block kept
      std::size_t kept = 0;
      for (std::size_t j = 0; j < k; ++j) kept += est.indices[q * k + j] >= 0 ? 1 : 0;
      REQUIRE(kept == mask.count_valid(q));
    }
    const std::vector<float> O = gs::stream_apply(one_head(Q), one_head(K), one_head(V), mask, est.indices, k);
    Mat<double> got(Eigen::Index(c.T), Eigen::Index(c.dv));
    for (Eigen::Index i = 0; i < got.size(); ++i) got.data()[i] = O[std::size_t(i)];
    const Mat<double> dense = stream_dense_reference(Q.cast<double>(), K.cast<double>(), V.cast<double>(), mask);
    const double err = row_rel_error(got, dense);
    std::cout << "stream apply T=" << c.T << " bq=" << c.bq << " bk=" << c.bk << " d=" << c.d << ": max row error "
              << err << " vs float64 dense\n";
    CHECK(err <= 1e-5);
  }
}

TEST_CASE("cuda stream: sparse apply and trace match the reference; records stream in chunks",
          "[gpu][stream]") {
  const auto seed = test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const Geometry g{777, 32, 16};
  const std::size_t d = 32, dv = 24, k = 5;
  const Mat<float> Q = normal_mat(g.T, d, rng, 0.2), K = normal_mat(g.T, d, rng), V = normal_mat(g.T, dv, rng);
  const BlockMask mask(g, user_mask(g, rng, 0.6));
  const gs::EstimateOutput est = gs::stream_estimate(one_head(Q), one_head(K), mask, k);
  const auto ref = stream_apply(Q.cast<double>().eval(), K.cast<double>().eval(), V.cast<double>().eval(), mask,
                                est.indices, k, 4, true);
  for (const std::size_t chunk : {std::size_t(1), std::size_t(3), g.n_q()}) {
    INFO("chunk " << chunk);
    std::vector<Edge> edges;
    std::size_t chunks = 0, max_chunk = 0;
    const std::vector<float> O = gs::stream_trace(one_head(Q), one_head(K), one_head(V), mask, est.indices, k, chunk,
                                                  [&](const std::vector<gs::HeadEdge>& batch) {
                                                    ++chunks;
                                                    max_chunk = std::max(max_chunk, batch.size());
                                                    for (const auto& e : batch) edges.push_back(e.edge);
                                                  });
    CHECK(chunks == (g.n_q() + chunk - 1) / chunk);
    CHECK(max_chunk <= chunk * k);
    double o_err = 0;
    for (std::size_t t = 0; t < g.T; ++t) {
      const double scale = ref.O.row(Eigen::Index(t)).cwiseAbs().maxCoeff();
      for (std::size_t c = 0; c < dv; ++c) {
        const double diff = std::abs(double(O[t * dv + c]) - ref.O(Eigen::Index(t), Eigen::Index(c)));
        o_err = std::max(o_err, scale > 0 ? diff / scale : (diff == 0 ? 0.0 : 1.0));
      }
    }
    CHECK(o_err <= 1e-5);
    REQUIRE(edges.size() == ref.edges.size());
    double w_err = 0;
    for (std::size_t i = 0; i < edges.size(); ++i) {
      const Edge &e = edges[i], &r = ref.edges[i];
      CHECK((e.q == r.q && e.r == r.r && e.slot == r.slot));
      CHECK(float(e.score) == est.scores[std::size_t(e.q) * k + std::size_t(e.slot)]);  // bitwise the estimator's
      w_err = std::max({w_err, std::abs(e.mass - r.mass) / std::max(1.0, r.mass),
                        std::abs(e.value_norm - r.value_norm) / std::max(1.0, r.value_norm)});
    }
    CHECK(w_err <= 1e-5);
  }
}

TEST_CASE("cuda stream: [T, H, d] heads are independent problems", "[gpu][stream]") {
  const auto seed = test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const Geometry g{600, 32, 32};
  const std::size_t H = 3, d = 16, k = 4;
  std::vector<Mat<float>> Qh, Kh, Vh;
  std::vector<float> Q(g.T * H * d), K(g.T * H * d), V(g.T * H * d);
  for (std::size_t h = 0; h < H; ++h) {
    Qh.push_back(int_mat(g.T, d, rng));
    Kh.push_back(int_mat(g.T, d, rng));
    Vh.push_back(normal_mat(g.T, d, rng));
    for (std::size_t t = 0; t < g.T; ++t)
      for (std::size_t c = 0; c < d; ++c) {
        Q[(t * H + h) * d + c] = Qh[h](Eigen::Index(t), Eigen::Index(c));
        K[(t * H + h) * d + c] = Kh[h](Eigen::Index(t), Eigen::Index(c));
        V[(t * H + h) * d + c] = Vh[h](Eigen::Index(t), Eigen::Index(c));
      }
  }
  const BlockMask mask(g, user_mask(g, rng, 0.7));
  const gs::EstimateOutput all = gs::stream_estimate({Q.data(), H, d}, {K.data(), H, d}, mask, k);
  const std::vector<float> O_all = gs::stream_apply({Q.data(), H, d}, {K.data(), H, d}, {V.data(), H, d}, mask,
                                                    all.indices, k);
  const std::size_t per_head = g.n_q() * k;
  for (std::size_t h = 0; h < H; ++h) {
    const gs::EstimateOutput one = gs::stream_estimate(one_head(Qh[h]), one_head(Kh[h]), mask, k);
    CHECK(std::equal(one.indices.begin(), one.indices.end(), all.indices.begin() + std::ptrdiff_t(h * per_head)));
    const std::vector<float> O_one =
        gs::stream_apply(one_head(Qh[h]), one_head(Kh[h]), one_head(Vh[h]), mask, one.indices, k);
    bool same = true;
    for (std::size_t t = 0; t < g.T; ++t)
      for (std::size_t c = 0; c < d; ++c) same = same && O_one[t * d + c] == O_all[(t * H + h) * d + c];
    CHECK(same);
  }
}

TEST_CASE("cuda stream: NaN logits poison their rows, rows without a valid key are 0, bad input is refused",
          "[gpu][stream]") {
  const Geometry g{64, 8, 8};
  std::mt19937_64 rng(3);
  Mat<float> Q = normal_mat(g.T, 8, rng), K = normal_mat(g.T, 8, rng), V = normal_mat(g.T, 8, rng);
  Q(20, 0) = std::numeric_limits<float>::quiet_NaN();  // every logit of token 20 is NaN
  // Query block 5 (tokens 40..47) sees nothing: its whole mask row is 0.
  std::vector<std::uint8_t> user(g.n_q() * g.n_k(), 1);
  for (std::size_t r = 0; r < g.n_k(); ++r) user[5 * g.n_k() + r] = 0;
  const BlockMask mask(g, user);
  const std::size_t k = 3;
  const gs::EstimateOutput est = gs::stream_estimate(one_head(Q), one_head(K), mask, k);
  const EstimateResult ref = stream_estimate(Q, K, mask, EstimateParams{k, 1});
  CHECK(est.indices == ref.indices);  // NaN scores are −inf on both sides; r decides
  for (std::size_t j = 0; j < k; ++j) CHECK(est.indices[5 * k + j] == -1);
  const std::vector<float> O = gs::stream_apply(one_head(Q), one_head(K), one_head(V), mask, est.indices, k);
  for (std::size_t c = 0; c < 8; ++c) {
    CHECK(std::isnan(O[20 * 8 + c]));
    CHECK(O[42 * 8 + c] == 0.f);
    CHECK(std::isfinite(O[21 * 8 + c]));
  }
  std::vector<std::int64_t> bad = est.indices;
  bad[0] = 7;  // query block 0 cannot see key block 7
  CHECK_THROWS_AS(gs::stream_apply(one_head(Q), one_head(K), one_head(V), mask, bad, k), StreamError);
  CHECK_THROWS_AS(gs::stream_estimate(one_head(Q), one_head(K), BlockMask(Geometry{64, 256, 8}), k), StreamError);
  CHECK_THROWS_AS(gs::stream_estimate(one_head(Q), one_head(K), mask, 0), StreamError);
  const gs::HostHeads two{Q.data(), 2, 4};
  CHECK_THROWS_AS(gs::stream_estimate(two, one_head(K), mask, k), StreamError);
}

TEST_CASE("cuda stream: planted needles are recalled at T = 1M, k = 16, 8 needles per query block",
          "[gpu][stream][needles][large]") {
  NeedleParams p;
  p.geometry = Geometry{1 << 20, 64, 64};
  p.d = 128;
  p.needle_blocks = 8;
  p.needles_per_block = 8;
  p.seed = test::fresh_seed();
  INFO("seed " << p.seed);
  for (const bool lead_in : {true, false}) {
    p.lead_in = lead_in;
    const NeedleSet set = make_needles(p);
    const gs::EstimateOutput est = gs::stream_estimate(one_head(set.Q), one_head(set.K), BlockMask(p.geometry), 16);
    const NeedleRecall rec = needle_recall(set.needles, est.indices, 16);
    std::cout << "needles T=" << p.geometry.T << " k=16 lead_in=" << lead_in << ": recall " << rec.found << "/"
              << rec.planted << " = " << rec.recall() << "\n";
    if (lead_in) CHECK(rec.recall() >= 0.99);
  }
}
