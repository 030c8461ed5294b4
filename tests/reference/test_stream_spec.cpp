// Differential test: the library's estimator against a literal, slow transcription of the
// paper's reference specification (§2, App. A, App. B) written independently here — every
// candidate scored from scratch by token loops (no inherited scores, no packed-word scans, no
// Eigen products), τ as a std::tuple comparison. Integer-valued inputs make every dot product
// exact, so equal scores are exactly equal and τ's tie-breaking is exercised constantly.
#include <catch2/catch.hpp>

#include <algorithm>
#include <limits>
#include <tuple>

#include "flashlab/reference/stream.hpp"
#include "test_stream_util.hpp"

using namespace flashlab::ref;
using namespace flashlab::ref::stream;
using flashlab::test::stream::random_int_mat;
using flashlab::test::stream::random_mat;
using flashlab::test::stream::random_user_mask;

namespace {

struct Lit {
  double score;
  std::int64_t r;
  std::uint64_t id;
  int bit;
  std::size_t lo, hi;
};

template <typename S>
double literal_score(const Mat<S>& Q, const Mat<S>& K, const BlockMask& m, std::size_t q, std::size_t r) {
  const Geometry& g = m.geometry();
  double best = -std::numeric_limits<double>::infinity();
  for (std::size_t t = q * g.bq; t < std::min(g.T, (q + 1) * g.bq); ++t) {
    for (std::size_t s = r * g.bk; s < std::min(g.T, (r + 1) * g.bk); ++s) {
      if (!m.token_valid(t, s)) continue;
      double dot = 0;
      for (Eigen::Index c = 0; c < Q.cols(); ++c) dot += double(Q(Eigen::Index(t), c)) * double(K(Eigen::Index(s), c));
      if (dot > best) best = dot;
    }
  }
  return best;
}

std::int64_t literal_first_valid(const BlockMask& m, std::size_t q, std::size_t a, std::size_t b) {
  for (std::size_t r = a; r <= b; ++r)
    if (m.valid(q, r)) return std::int64_t(r);
  return -1;
}

template <typename S>
std::vector<std::int64_t> literal_estimate(const Mat<S>& Q, const Mat<S>& K, const BlockMask& m, std::size_t k) {
  const Geometry& g = m.geometry();
  std::vector<std::int64_t> I(g.n_q() * k, -1);
  auto tau_key = [](const Lit& c) { return std::make_tuple(-c.score, c.r, c.id, c.bit); };
  auto by_tau = [&](const Lit& a, const Lit& b) { return tau_key(a) < tau_key(b); };
  for (std::size_t q = 0; q < g.n_q(); ++q) {
    std::int64_t lo = -1, hi = -1;
    for (std::size_t r = 0; r < g.n_k(); ++r)
      if (m.valid(q, r)) {
        if (lo < 0) lo = std::int64_t(r);
        hi = std::int64_t(r);
      }
    if (lo < 0) continue;
    const std::size_t L = std::size_t(hi - lo + 1), nb = std::min(k, L);
    std::vector<Lit> cur;
    std::size_t a = std::size_t(lo);
    for (std::size_t i = 0; i < nb; ++i) {
      const std::size_t len = L / nb + (i < L % nb ? 1 : 0);
      const std::int64_t r = literal_first_valid(m, q, a, a + len - 1);
      if (r >= 0) cur.push_back({literal_score(Q, K, m, q, std::size_t(r)), r, i, 0, a, a + len - 1});
      a += len;
    }
    std::sort(cur.begin(), cur.end(), by_tau);
    for (std::size_t it = 0; it < g.n_it(); ++it) {
      std::vector<Lit> cand;
      for (const Lit& b : cur) {
        const std::size_t len = b.hi - b.lo + 1;
        const std::size_t mid = len == 1 ? b.hi : b.lo + (len + 1) / 2 - 1;
        const std::size_t ranges[2][2] = {{b.lo, mid}, {mid + 1, b.hi}};
        for (int bit = 0; bit < 2; ++bit) {
          if (ranges[bit][0] > ranges[bit][1]) continue;  // the empty right half of a one-block branch
          const std::int64_t r = literal_first_valid(m, q, ranges[bit][0], ranges[bit][1]);
          if (r < 0) continue;
          cand.push_back({literal_score(Q, K, m, q, std::size_t(r)), r, 2 * b.id + std::uint64_t(bit), bit,
                          ranges[bit][0], ranges[bit][1]});
        }
      }
      std::sort(cand.begin(), cand.end(), by_tau);
      if (cand.size() > k) cand.resize(k);
      cur = cand;
    }
    for (std::size_t j = 0; j < cur.size(); ++j) I[q * k + j] = cur[j].r;
  }
  return I;
}

}  // namespace

TEST_CASE("stream spec: estimator equals the literal specification (integer inputs, many ties)", "[stream][spec]") {
  struct Case {
    Geometry g;
    std::size_t k, d;
  };
  const Case cases[] = {{{64, 4, 4}, 2, 3},  {{61, 4, 3}, 3, 2},  {{50, 5, 7}, 1, 4}, {{97, 3, 2}, 4, 1},
                        {{33, 8, 2}, 5, 2},  {{40, 1, 1}, 3, 1},  {{24, 6, 4}, 7, 3}, {{130, 2, 5}, 6, 2},
                        {{200, 8, 8}, 3, 4}, {{1, 4, 4}, 2, 2}};
  int seed = 100;
  for (const auto& c : cases) {
    for (int variant = 0; variant < 4; ++variant) {
      const auto Q = random_int_mat<double>(c.g.T, c.d, unsigned(seed++), variant == 3 ? 0 : 2);
      const auto K = random_int_mat<double>(c.g.T, c.d, unsigned(seed++), 1);
      const BlockMask mask = variant == 0 ? BlockMask(c.g) : BlockMask(c.g, random_user_mask(c.g, unsigned(seed++), variant == 1 ? 0.6 : 0.2));
      const auto got = stream_estimate(Q, K, mask, EstimateParams{c.k, 3});
      const auto want = literal_estimate(Q, K, mask, c.k);
      INFO("T=" << c.g.T << " bq=" << c.g.bq << " bk=" << c.g.bk << " k=" << c.k << " variant=" << variant);
      CHECK(got.indices == want);
      // The reported score of each entry is score(q, r) of App. A.
      for (std::size_t q = 0; q < c.g.n_q(); ++q)
        for (std::size_t j = 0; j < c.k; ++j)
          if (got.at(q, j) >= 0) CHECK(got.scores[q * c.k + j] == literal_score(Q, K, mask, q, std::size_t(got.at(q, j))));
    }
  }
}

TEST_CASE("stream spec: estimator equals the literal specification (float64 random inputs)", "[stream][spec]") {
  const Geometry g{157, 6, 5};
  const auto Q = random_mat<double>(g.T, 7, 1), K = random_mat<double>(g.T, 7, 2);
  for (std::size_t k : {1u, 2u, 5u, 40u}) {
    const BlockMask mask(g, random_user_mask(g, unsigned(k), 0.5));
    INFO("k=" << k);
    CHECK(stream_estimate(Q, K, mask, EstimateParams{k, 2}).indices == literal_estimate(Q, K, mask, k));
    CHECK(stream_estimate(Q, K, BlockMask(g), EstimateParams{k, 1}).indices == literal_estimate(Q, K, BlockMask(g), k));
  }
}

TEST_CASE("stream spec: float storage gives the float scores of the same tiles", "[stream][spec]") {
  const Geometry g{90, 9, 4};
  const auto Q = random_mat<float>(g.T, 6, 3), K = random_mat<float>(g.T, 6, 4);
  const auto res = stream_estimate(Q, K, BlockMask(g), EstimateParams{3, 2});
  for (std::size_t q = 0; q < g.n_q(); ++q)
    for (std::size_t j = 0; j < 3; ++j)
      if (res.at(q, j) >= 0) CHECK(res.scores[q * 3 + j] == stream_block_score(Q, K, g, q, std::size_t(res.at(q, j))));
  // Scores of one row are in τ order: non-increasing.
  for (std::size_t q = 0; q < g.n_q(); ++q)
    for (std::size_t j = 1; j < 3; ++j)
      if (res.at(q, j) >= 0) CHECK(res.scores[q * 3 + j - 1] >= res.scores[q * 3 + j]);
}

// §9's metamorphic test: changing keys that C_blk forbids for query block q cannot change I[q, ·].
TEST_CASE("stream spec: keys in blocks invalid for q do not affect I[q]", "[stream][spec]") {
  const Geometry g{180, 6, 5};
  const std::size_t k = 3;
  const auto Q = random_mat<double>(g.T, 4, 41);
  const auto K = random_mat<double>(g.T, 4, 42);
  const BlockMask mask(g, random_user_mask(g, 43, 0.5));
  const auto base = stream_estimate(Q, K, mask, EstimateParams{k, 1});
  for (std::size_t q : {std::size_t(3), std::size_t(17), g.n_q() - 1}) {
    Mat<double> K2 = K;
    const auto noise = random_mat<double>(g.T, 4, unsigned(100 + q));
    for (std::size_t r = 0; r < g.n_k(); ++r) {
      if (mask.valid(q, r)) continue;
      for (std::size_t s = r * g.bk; s < std::min(g.T, (r + 1) * g.bk); ++s) K2.row(Eigen::Index(s)) = 50 * noise.row(Eigen::Index(s));
    }
    const auto moved = stream_estimate(Q, K2, mask, EstimateParams{k, 1});
    INFO("q=" << q);
    for (std::size_t j = 0; j < k; ++j) CHECK(moved.at(q, j) == base.at(q, j));
  }
}
