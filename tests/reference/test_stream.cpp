// STREAM reference (the STREAM paper): geometry, the bit-packed block mask, τ, hand-worked selections,
// the validity invariant on random and adversarial masks, determinism across thread counts.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <set>

#include "flashlab/reference/stream.hpp"
#include "test_stream_util.hpp"

using namespace flashlab::ref;
using namespace flashlab::ref::stream;
using flashlab::test::stream::random_mat;
using flashlab::test::stream::random_user_mask;

TEST_CASE("stream: geometry pads partial blocks and counts n_it = ceil(log2 n_k)", "[stream]") {
  CHECK(ceil_log2(1) == 0);
  CHECK(ceil_log2(2) == 1);
  CHECK(ceil_log2(3) == 2);
  CHECK(ceil_log2(8) == 3);
  CHECK(ceil_log2(9) == 4);
  const Geometry g{10, 4, 3};
  CHECK(g.n_q() == 3);
  CHECK(g.n_k() == 4);
  CHECK(g.n_it() == 2);
  CHECK(g.q_rows(2) == 2);  // tokens 8, 9; the two padding tokens do not exist
  CHECK(g.k_rows(3) == 1);  // token 9 only
  CHECK_THROWS_AS((Geometry{0, 4, 4}.check()), StreamError);
  CHECK_THROWS_AS((Geometry{8, 0, 4}.check()), StreamError);
  CHECK_THROWS_AS((Geometry{8, 4, 0}.check()), StreamError);
  const Geometry big{131072, 64, 64};
  CHECK(big.n_it() == 11);
}

TEST_CASE("stream: causal block validity follows the token rule at every block shape", "[stream][mask]") {
  for (const Geometry g : {Geometry{10, 4, 3}, Geometry{17, 2, 5}, Geometry{16, 4, 4}, Geometry{9, 9, 1}}) {
    const BlockMask m(g);
    for (std::size_t q = 0; q < g.n_q(); ++q) {
      for (std::size_t r = 0; r < g.n_k(); ++r) {
        bool any = false;  // C_blk[q, r] = 1 iff some token pair (t, s) in the blocks is valid (§2)
        for (std::size_t t = q * g.bq; t < std::min(g.T, (q + 1) * g.bq); ++t)
          for (std::size_t s = r * g.bk; s < std::min(g.T, (r + 1) * g.bk); ++s) any = any || s <= t;
        INFO("T=" << g.T << " bq=" << g.bq << " bk=" << g.bk << " q=" << q << " r=" << r);
        CHECK(m.valid(q, r) == any);
      }
    }
  }
}

TEST_CASE("stream: packed first/last-valid scans agree with a brute force across word boundaries",
          "[stream][mask]") {
  const Geometry g{300, 1, 1};  // n_k = 300: five 64-bit words per row
  for (unsigned seed = 0; seed < 4; ++seed) {
    const auto user = random_user_mask(g, seed, seed == 3 ? 0.02 : 0.3);
    const BlockMask m(g, user);
    std::mt19937 rng(seed);
    for (int trial = 0; trial < 400; ++trial) {
      const std::size_t q = rng() % g.n_q();
      std::size_t a = rng() % g.n_k(), b = rng() % g.n_k();
      if (a > b) std::swap(a, b);
      std::int64_t first = -1, last = -1;
      for (std::size_t r = a; r <= b; ++r)
        if (m.valid(q, r)) {
          if (first < 0) first = std::int64_t(r);
          last = std::int64_t(r);
        }
      INFO("q=" << q << " [" << a << ", " << b << "]");
      CHECK(m.first_valid(q, a, b) == first);
      CHECK(m.last_valid(q, a, b) == last);
    }
  }
}

TEST_CASE("stream: tau orders by score desc, then r, branch_id, split_bit asc, and NaN is -inf", "[stream][tau]") {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto c = [](double s, std::int64_t r, std::uint64_t b, std::uint8_t bit) {
    Candidate x;
    x.score = s;
    x.r = r;
    x.branch_id = b;
    x.split_bit = bit;
    return x;
  };
  CHECK(tau_before(c(2, 9, 9, 1), c(1, 0, 0, 0)));   // higher score first, whatever the rest
  CHECK_FALSE(tau_before(c(1, 0, 0, 0), c(2, 9, 9, 1)));
  CHECK(tau_before(c(1, 3, 9, 1), c(1, 4, 0, 0)));   // equal score: smaller r
  CHECK(tau_before(c(1, 3, 2, 1), c(1, 3, 5, 0)));   // equal (score, r): smaller branch_id
  CHECK(tau_before(c(1, 3, 2, 0), c(1, 3, 2, 1)));   // then split_bit
  CHECK_FALSE(tau_before(c(1, 3, 2, 0), c(1, 3, 2, 0)));  // irreflexive
  CHECK(tau_before(c(-1e300, 5, 0, 0), c(-inf, 0, 0, 0)));  // -inf below every finite value
  CHECK(tau_before(c(-1e300, 5, 0, 0), c(nan, 0, 0, 0)));   // NaN ≡ -inf ...
  CHECK(tau_before(c(nan, 0, 0, 0), c(-inf, 1, 0, 0)));     // ... tied with -inf, so r decides
  CHECK(tau_before(c(-inf, 0, 0, 0), c(nan, 1, 0, 0)));
  CHECK(tau_before(c(-inf, 7, 0, 0), c(5, -1, 0, 0)));      // an invalid candidate (r = −1) is last
}

// T = 8, b_q = b_k = 1, d = 1, Q = 1, k = 2. For q = 7 (range [0, 7]) by hand (docs/stream.md):
// init   [0..3] r0 s0, [4..7] r4 s3
// round1 [0,1] r0 s0, [2,3] r2 s3, [4,5] r4 s3, [6,7] r6 s0 → tie at 3 → keep r2, r4 (r asc)
// round2 [2] s3, [3] s0, [4] s3, [5] s0 → keep r2, r4;  round3: singletons → I[7] = {2, 4}.
// Block 1 (also score 3) is never a representative, so it is never seen: the first-valid rule.
TEST_CASE("stream: planted equal scores are broken by smaller r (hand-worked q = 7)", "[stream][tau]") {
  const Geometry g{8, 1, 1};
  Mat<double> Q = Mat<double>::Ones(8, 1);
  Mat<double> K(8, 1);
  K << 0, 3, 3, 0, 3, 0, 0, 0;
  const auto res = stream_estimate(Q, K, BlockMask(g), EstimateParams{2, 1});
  CHECK(res.at(7, 0) == 2);
  CHECK(res.at(7, 1) == 4);
  CHECK(res.scores[7 * 2 + 0] == 3.0);
  CHECK(res.scores[7 * 2 + 1] == 3.0);
  // q = 0 has one valid block: one entry, then the empty sentinel.
  CHECK(res.at(0, 0) == 0);
  CHECK(res.at(0, 1) == -1);
  CHECK(std::isnan(res.scores[1]));
  // q = 1: k = 2 ≥ L = 2, two one-block branches, scored 0 (r0) and 3 (r1): τ puts r1 first.
  CHECK(res.at(1, 0) == 1);
  CHECK(res.at(1, 1) == 0);
  CHECK(validate_indices(res.indices, 2, BlockMask(g)).empty());
}

TEST_CASE("stream: all scores equal selects the smallest valid blocks, in r order", "[stream][tau]") {
  const Geometry g{16, 2, 2};  // n_k = 8
  const Mat<double> Q = random_mat<double>(16, 3, 1);
  const Mat<double> K = Mat<double>::Zero(16, 3);  // every score is exactly 0
  const auto res = stream_estimate(Q, K, BlockMask(g), EstimateParams{3, 1});
  for (std::size_t q = 0; q < g.n_q(); ++q) {
    for (std::size_t j = 0; j < 3; ++j) {
      INFO("q=" << q << " j=" << j);
      CHECK(res.at(q, j) == (j <= q ? std::int64_t(j) : -1));
    }
  }
}

// T = 4, b = 1, k = 1: K_0 = NaN, so block 0 scores NaN ≡ −inf and must lose to any finite score.
TEST_CASE("stream: NaN scores count as -inf and lose to finite ones", "[stream][tau]") {
  const Geometry g{4, 1, 1};
  Mat<double> Q = Mat<double>::Ones(4, 1);
  Mat<double> K(4, 1);
  K << std::numeric_limits<double>::quiet_NaN(), -5, -100, -200;
  const auto res = stream_estimate(Q, K, BlockMask(g), EstimateParams{1, 1});
  // q = 3: init [0..3] r0 (NaN); round1 [0,1] r0 (−inf) vs [2,3] r2 (−100) → r2; round2 [2] vs [3] → r2.
  CHECK(res.at(3, 0) == 2);
  CHECK(res.scores[3] == -100.0);
  // q = 0: only block 0 is valid; its NaN score is kept as −inf (a valid block is never dropped).
  CHECK(res.at(0, 0) == 0);
  CHECK(res.scores[0] == -std::numeric_limits<double>::infinity());
}

TEST_CASE("stream: validity invariant on random and adversarial masks", "[stream][invariant]") {
  struct Case {
    Geometry g;
    std::size_t k;
  };
  const Case cases[] = {{{64, 4, 4}, 3}, {{61, 4, 3}, 5}, {{50, 5, 7}, 2}, {{33, 8, 2}, 4},
                        {{40, 1, 1}, 6}, {{24, 3, 3}, 20}, {{7, 7, 7}, 2}, {{129, 2, 2}, 8}};
  for (const auto& c : cases) {
    const std::size_t nq = c.g.n_q(), nk = c.g.n_k();
    const Mat<float> Q = random_mat<float>(c.g.T, 5, 7), K = random_mat<float>(c.g.T, 5, 8);
    std::vector<std::vector<std::uint8_t>> masks;
    masks.push_back(random_user_mask(c.g, 11, 0.5));
    masks.push_back(random_user_mask(c.g, 12, 0.05));         // very sparse
    masks.push_back(std::vector<std::uint8_t>(nq * nk, 0));   // nothing valid: every row empty
    std::vector<std::uint8_t> only_last(nq * nk, 0), checker(nq * nk, 0), holes(nq * nk, 1), diag(nq * nk, 0);
    for (std::size_t q = 0; q < nq; ++q) {
      const std::size_t last = BlockMask(c.g).causal_last(q);
      only_last[q * nk + last] = 1;                              // one valid block, at the far end
      diag[q * nk + last] = 1;
      if (last > 0) diag[q * nk + last - 1] = 1;
      for (std::size_t r = 0; r < nk; ++r) {
        checker[q * nk + r] = (q + r) % 2;                       // every other block
        // Holes at the initial-branch boundaries and at every other quarter of the range.
        if ((r * 4 / nk) % 2 == 1 || r % std::max<std::size_t>(1, c.k) == 0) holes[q * nk + r] = 0;
      }
    }
    masks.push_back(only_last);
    masks.push_back(checker);
    masks.push_back(holes);
    masks.push_back(diag);
    for (std::size_t mi = 0; mi < masks.size(); ++mi) {
      const BlockMask mask(c.g, masks[mi]);
      const auto res = stream_estimate(Q, K, mask, EstimateParams{c.k, 2});
      INFO("T=" << c.g.T << " bq=" << c.g.bq << " bk=" << c.g.bk << " k=" << c.k << " mask #" << mi);
      CHECK(validate_indices(res.indices, c.k, mask) == "");
    }
    const BlockMask causal(c.g);
    CHECK(validate_indices(stream_estimate(Q, K, causal, EstimateParams{c.k, 1}).indices, c.k, causal) == "");
  }
}

TEST_CASE("stream: validate_indices rejects each kind of violation", "[stream][invariant]") {
  const Geometry g{8, 2, 2};  // n_q = n_k = 4
  const BlockMask m(g);
  const std::size_t k = 2;
  //                          q0       q1      q2      q3
  std::vector<std::int64_t> ok{0, -1, 1, 0, 2, 0, 3, 1};
  CHECK(validate_indices(ok, k, m) == "");
  auto bad = ok;
  bad[0] = 1;  // block 1 is in the future of query block 0
  CHECK_THAT(validate_indices(bad, k, m), Catch::Contains("I[0, 0] = 1") && Catch::Contains("invalid under C_blk"));
  bad = ok;
  bad[3] = 1;  // duplicate in row 1
  CHECK_THAT(validate_indices(bad, k, m), Catch::Contains("duplicate"));
  bad = ok;
  bad[4] = -1;  // empty before a selected block
  CHECK_THAT(validate_indices(bad, k, m), Catch::Contains("empties must come last"));
  bad = ok;
  bad[5] = -1;  // row 2 has 3 valid blocks but only one kept
  CHECK_THAT(validate_indices(bad, k, m), Catch::Contains("expected min(k, valid) = 2"));
  bad = ok;
  bad[6] = 4;
  CHECK_THAT(validate_indices(bad, k, m), Catch::Contains("not a key block"));
}

TEST_CASE("stream: estimate and apply are bitwise identical across runs and 1, 2, 4 threads", "[stream][determinism]") {
  const Geometry g{203, 8, 6};
  const Mat<float> Q = random_mat<float>(g.T, 16, 21), K = random_mat<float>(g.T, 16, 22),
                   V = random_mat<float>(g.T, 12, 23);
  const BlockMask mask(g, random_user_mask(g, 24, 0.7));
  const auto base = stream_estimate(Q, K, mask, EstimateParams{4, 1});
  const auto base_apply = stream_apply(Q, K, V, mask, base.indices, 4, 1, true);
  REQUIRE(validate_indices(base.indices, 4, mask) == "");
  for (std::size_t threads : {1u, 2u, 4u, 7u}) {
    const auto res = stream_estimate(Q, K, mask, EstimateParams{4, threads});
    INFO("threads=" << threads);
    CHECK(res.indices == base.indices);
    CHECK(std::memcmp(res.scores.data(), base.scores.data(), res.scores.size() * sizeof(double)) == 0);
    CHECK(res.traffic.read_bytes("K") == base.traffic.read_bytes("K"));
    CHECK(indices_checksum(res.indices) == indices_checksum(base.indices));
    const auto app = stream_apply(Q, K, V, mask, res.indices, 4, threads, true);
    REQUIRE(app.O.size() == base_apply.O.size());
    CHECK(std::memcmp(app.O.data(), base_apply.O.data(), sizeof(float) * std::size_t(app.O.size())) == 0);
    REQUIRE(app.edges.size() == base_apply.edges.size());
    CHECK(std::memcmp(app.edges.data(), base_apply.edges.data(), sizeof(Edge) * app.edges.size()) == 0);
  }
}

TEST_CASE("stream: counted traffic and work stay within the paper's bounds", "[stream][traffic]") {
  for (const Geometry g : {Geometry{256, 16, 16}, Geometry{250, 8, 12}, Geometry{96, 4, 4}}) {
    const std::size_t d = 8, k = 3;
    const Mat<float> Q = random_mat<float>(g.T, d, 31), K = random_mat<float>(g.T, d, 32);
    const auto res = stream_estimate(Q, K, BlockMask(g), EstimateParams{k, 2});
    const Bounds b = stream_bounds(g, d, k);
    INFO("T=" << g.T << " bq=" << g.bq << " bk=" << g.bk);
    CHECK(res.traffic.find("Q")->read_elements == g.T * d);  // Q_q loaded exactly once per block
    CHECK(res.traffic.find("I")->write_elements == g.n_q() * k);
    CHECK(res.traffic.find("C_blk")->read_elements == 0);  // causal-only: nothing stored, nothing read
    const double q_plus_k = double(res.traffic.find("Q")->read_elements + res.traffic.find("K")->read_elements);
    CHECK(q_plus_k <= b.io_upper_exact);
    CHECK(double(res.traffic.flops()) <= b.work_upper_exact);
    CHECK(res.max_blocks_scored_per_q <= k * (g.n_it() + 1));
    // Each scored candidate streams exactly one K block of ≤ b_k rows.
    CHECK(res.traffic.find("K")->read_elements <= res.blocks_scored * g.bk * d);
    CHECK(res.traffic.find("K")->read_elements >= res.blocks_scored * (g.T % g.bk ? g.T % g.bk : g.bk) * d);
    CHECK(res.traffic.read_bytes("K") == res.traffic.find("K")->read_elements * 4);  // fp32 storage
  }
  // With a user mask the packed words scanned are counted as C_blk reads.
  const Geometry g{128, 2, 2};
  const BlockMask mask(g, random_user_mask(g, 5, 0.5));
  const auto res = stream_estimate(random_mat<float>(128, 4, 1), random_mat<float>(128, 4, 2), mask, EstimateParams{2, 1});
  CHECK(res.traffic.find("C_blk")->read_elements > 0);
}

TEST_CASE("stream: bad parameters and shapes are errors, not clamps", "[stream][errors]") {
  const Geometry g{16, 4, 4};
  const Mat<double> Q = random_mat<double>(16, 4, 1), K = random_mat<double>(16, 4, 2);
  CHECK_THROWS_WITH(stream_estimate(Q, K, BlockMask(g), EstimateParams{0, 1}), Catch::Contains("k must be"));
  const Mat<double> short_k = random_mat<double>(15, 4, 2);
  CHECK_THROWS_WITH(stream_estimate(Q, short_k, BlockMask(g), EstimateParams{2, 1}), Catch::Contains("T = 16"));
  const Mat<double> wide_k = random_mat<double>(16, 5, 2);
  CHECK_THROWS_WITH(stream_estimate(Q, wide_k, BlockMask(g), EstimateParams{2, 1}), Catch::Contains("head dim"));
  CHECK_THROWS_WITH(BlockMask(g, std::vector<std::uint8_t>(15, 1)), Catch::Contains("expected n_q·n_k"));
  std::vector<std::uint8_t> two(16, 1);
  two[6] = 2;
  CHECK_THROWS_WITH(BlockMask(g, two), Catch::Contains("[1, 2]") && Catch::Contains("expected 0 or 1"));
}
