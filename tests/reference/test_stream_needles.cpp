// Planted needles (stream_needles.hpp): the generator's truth, its errors, and the recall of the
// planted key blocks by the reference estimate at a small T (the GPU test repeats it at 1M tokens).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <vector>
#include <iostream>

#include "flashlab/reference/stream.hpp"
#include "flashlab/reference/stream_needles.hpp"

using namespace flashlab::ref;
using namespace flashlab::ref::stream;

namespace {

NeedleParams small_params(bool lead_in) {
  NeedleParams p;
  p.geometry = Geometry{16384, 64, 64};  // n_k = 256, n_it = 8
  p.d = 64;
  p.needle_blocks = 8;
  p.needles_per_block = 8;
  p.lead_in = lead_in;
  p.seed = 7;
  return p;
}

}  // namespace

TEST_CASE("stream needles: planted pairs are far in the past, distinct, and the inputs are reproducible",
          "[stream][needles]") {
  const NeedleParams p = small_params(true);
  const NeedleSet a = make_needles(p), b = make_needles(p);
  REQUIRE(a.needles.size() == p.needle_blocks * p.needles_per_block);
  CHECK(a.Q == b.Q);
  CHECK(a.K == b.K);
  const BlockMask causal(p.geometry);
  for (std::size_t i = 0; i < a.needles.size(); ++i) {
    const Needle& n = a.needles[i];
    CHECK(n.q >= p.geometry.n_q() / 2);
    CHECK(n.r <= causal.causal_last(n.q) / 2);
    if (i > 0 && a.needles[i - 1].q == n.q) CHECK(a.needles[i - 1].r < n.r);
  }
  NeedleParams other = p;
  other.seed = 8;
  CHECK_FALSE(make_needles(other).K == a.K);
}

TEST_CASE("stream needles: the estimate recalls every planted block with a lead-in, fewer without",
          "[stream][needles]") {
  const std::size_t k = 16;
  double recall_with = 0, recall_without = 0;
  for (const bool lead_in : {true, false}) {
    const NeedleParams p = small_params(lead_in);
    const NeedleSet set = make_needles(p);
    const EstimateResult est = stream_estimate(set.Q, set.K, BlockMask(p.geometry), EstimateParams{k, 2});
    const NeedleRecall rec = needle_recall(set.needles, est.indices, k);
    std::cout << "needles T=" << p.geometry.T << " k=" << k << " lead_in=" << lead_in << ": recall " << rec.found
              << "/" << rec.planted << " = " << rec.recall() << "\n";
    (lead_in ? recall_with : recall_without) = rec.recall();
  }
  CHECK(recall_with >= 0.99);
  // Without the lead-in a needle is found only where a branch starts on it: below it.
  CHECK(recall_without < 0.99);
}

TEST_CASE("stream needles: a planting over several input sets covers distinct query blocks, recall >= 0.99",
          "[stream][needles]") {
  // 32 needle blocks × 8 needles = 256 needles on d = 64: four input sets of 8 blocks each.
  NeedleParams p = small_params(true);
  p.needle_blocks = 32;
  REQUIRE(needle_sets_needed(p.d, p.needle_blocks, p.needles_per_block, false) == 4);
  REQUIRE(needle_sets_needed(p.d, p.needle_blocks, p.needles_per_block, true) == 8);
  CHECK(needle_sets_needed(4, 1, 8, false) == 0);  // one block's needles alone exceed d
  p.sets = 4;
  const std::size_t k = 16;
  NeedleRecall all;
  std::vector<std::size_t> blocks;
  for (std::size_t s = 0; s < p.sets; ++s) {
    NeedleParams ps = p;
    ps.set = s;
    ps.seed = p.seed + 1000003 * s;
    REQUIRE(ps.set_blocks() == 8);
    const NeedleSet set = make_needles(ps);
    REQUIRE(set.needles.size() == 8 * p.needles_per_block);
    for (const Needle& n : set.needles)
      if (blocks.empty() || blocks.back() != n.q) blocks.push_back(n.q);
    const EstimateResult est = stream_estimate(set.Q, set.K, BlockMask(p.geometry), EstimateParams{k, 2});
    const NeedleRecall rec = needle_recall(set.needles, est.indices, k);
    all.found += rec.found;
    all.planted += rec.planted;
  }
  std::cout << "needles T=" << p.geometry.T << " k=" << k << " over 4 input sets: recall " << all.found << "/"
            << all.planted << "\n";
  CHECK(all.planted == 256);
  CHECK(all.recall() >= 0.99);
  std::sort(blocks.begin(), blocks.end());
  CHECK(std::adjacent_find(blocks.begin(), blocks.end()) == blocks.end());  // 32 distinct query blocks
  CHECK(blocks.size() == 32);
  NeedleParams one = p;
  one.sets = 1;
  CHECK_THROWS_WITH(make_needles(one), Catch::Contains("exceeds d = 64"));  // all 32 blocks in one set
  one.sets = 4;
  one.set = 4;
  CHECK_THROWS_WITH(make_needles(one), Catch::Contains("set = 4"));
}

TEST_CASE("stream needles: impossible requests are refused with the parameter named", "[stream][needles]") {
  NeedleParams p = small_params(true);
  p.needle_blocks = 9;  // 9·8 = 72 coordinates > d = 64
  CHECK_THROWS_WITH(make_needles(p), Catch::Contains("exceeds d = 64"));
  p = small_params(true);
  p.needles_per_block = 65;
  p.d = 1024;
  CHECK_THROWS_WITH(make_needles(p), Catch::Contains("exceeds b_q"));
  p = small_params(true);
  p.geometry = Geometry{256, 64, 64};
  p.needle_blocks = 2;
  CHECK_THROWS_WITH(make_needles(p), Catch::Contains("fewer than needles_per_block"));
  const std::vector<Needle> truth{{1, 0}, {1, 3}};
  const std::vector<std::int64_t> I{-1, -1, 3, 2};
  const NeedleRecall rec = needle_recall(truth, I, 2);
  CHECK(rec.found == 1);
  CHECK(rec.planted == 2);
}

TEST_CASE("stream needles: bf16 pairs keep every score, and the planted values survive bf16 rounding",
          "[stream][needles]") {
  NeedleParams one = small_params(true);
  one.needle_blocks = 4;  // 4·8 needles: 32 coordinates, or 64 as pairs, of d = 64 (the rest noise)
  NeedleParams pairs = one;
  pairs.bf16_pairs = true;
  pairs.d = one.d + 32;  // 32 noise columns in both (their values differ: only planted columns are compared)
  const NeedleSet a = make_needles(one), b = make_needles(pairs);
  REQUIRE(a.needles.size() == b.needles.size());
  // The planted columns: pair (2c, 2c + 1) sums to column c exactly; each part is a bf16 value.
  const auto bf16_exact = [](float x) {
    std::uint32_t bits = 0;
    std::memcpy(&bits, &x, sizeof bits);
    return (bits & 0xffffu) == 0;
  };
  bool sums = true, exact = true;
  for (Eigen::Index t = 0; t < a.K.rows(); ++t)
    for (Eigen::Index c = 0; c < 32; ++c) {
      sums = sums && b.K(t, 2 * c) + b.K(t, 2 * c + 1) == a.K(t, c);
      exact = exact && bf16_exact(b.K(t, 2 * c)) && bf16_exact(b.K(t, 2 * c + 1));
      sums = sums && b.Q(t, 2 * c) == a.Q(t, c) && b.Q(t, 2 * c + 1) == a.Q(t, c);
    }
  CHECK(sums);
  CHECK(exact);
  const std::size_t k = 16;
  const EstimateResult est = stream_estimate(b.Q, b.K, BlockMask(pairs.geometry), EstimateParams{k, 2});
  CHECK(needle_recall(b.needles, est.indices, k).recall() >= 0.99);
  pairs.needle_blocks = 7;  // 2·7·8 = 112 coordinates > d = 96
  CHECK_THROWS_WITH(make_needles(pairs), Catch::Contains("each needle owns two coordinates"));
}
