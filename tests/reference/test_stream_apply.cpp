// STREAM mask application (§6): sparse == dense causal attention when every valid block is kept
// (float64, ≤ 1e-12), the edge records of §3, and the block-mask file formats.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "flashlab/reference/npy.hpp"
#include "flashlab/reference/stream.hpp"
#include "test_stream_util.hpp"

namespace fs = std::filesystem;
using namespace flashlab::ref;
using namespace flashlab::ref::stream;
using flashlab::test::stream::random_mat;
using flashlab::test::stream::random_user_mask;

TEST_CASE("stream apply: every valid block kept equals dense causal attention (float64, 1e-12)", "[stream][apply]") {
  const Geometry shapes[] = {{64, 8, 8}, {37, 4, 3}, {50, 5, 7}, {1, 4, 4}, {33, 1, 2}, {70, 16, 3}};
  unsigned seed = 1;
  for (const Geometry& g : shapes) {
    for (int variant = 0; variant < 2; ++variant) {
      const auto Q = random_mat<double>(g.T, 6, seed++), K = random_mat<double>(g.T, 6, seed++);
      const auto V = random_mat<double>(g.T, 5, seed++);
      const BlockMask mask = variant == 0 ? BlockMask(g) : BlockMask(g, random_user_mask(g, seed++, 0.6));
      const DenseCheck c = stream_check_dense(Q, K, V, mask, 2);
      INFO("T=" << g.T << " bq=" << g.bq << " bk=" << g.bk << " variant=" << variant << " err=" << c.max_rel_error);
      CHECK(c.every_valid_block_kept);
      CHECK(c.max_rel_error <= 1e-12);
      CHECK(c.passed());
    }
  }
}

TEST_CASE("stream apply: the dense check can fail — k below the valid blocks differs from dense", "[stream][apply]") {
  const Geometry g{64, 4, 4};
  const auto Q = random_mat<double>(g.T, 6, 1), K = random_mat<double>(g.T, 6, 2), V = random_mat<double>(g.T, 6, 3);
  const BlockMask mask(g);
  const auto est = stream_estimate(Q, K, mask, EstimateParams{2, 1});
  const auto sparse = stream_apply(Q, K, V, mask, est.indices, 2, 1, false);
  const Mat<double> dense = stream_dense_reference(Q, K, V, mask);
  CHECK(row_rel_error(sparse.O, dense) > 1e-3);
  // The first two query blocks have ≤ 2 valid blocks, so k = 2 keeps all of them: rows equal.
  CHECK(row_rel_error(Mat<double>(sparse.O.topRows(8)), Mat<double>(dense.topRows(8))) <= 1e-12);
}

TEST_CASE("stream apply: row_rel_error scales by the row and refuses NaN and non-zero empty rows", "[stream][apply]") {
  Mat<double> ref(2, 2), got(2, 2);
  ref << 1.0, 1e-9, 0.0, 0.0;
  got << 1.0, 1e-9 + 1e-13, 0.0, 0.0;
  CHECK(row_rel_error(got, ref) == Approx(1e-13).epsilon(1e-3));  // not 1e-4: the row's scale is 1
  got(1, 0) = 1e-300;  // a row with no valid key must be exactly 0
  CHECK(std::isinf(row_rel_error(got, ref)));
  got(1, 0) = 0.0;
  got(0, 0) = std::numeric_limits<double>::quiet_NaN();
  CHECK(std::isinf(row_rel_error(got, ref)));
  CHECK(std::isinf(row_rel_error(Mat<double>(3, 2), ref)));
}

TEST_CASE("stream apply: NaN in V reaches the output (never passes a check)", "[stream][apply]") {
  const Geometry g{16, 4, 4};
  auto Q = random_mat<double>(g.T, 3, 1), K = random_mat<double>(g.T, 3, 2), V = random_mat<double>(g.T, 3, 3);
  V(2, 1) = std::numeric_limits<double>::quiet_NaN();
  const DenseCheck c = stream_check_dense(Q, K, V, BlockMask(g), 1);
  CHECK_FALSE(c.passed());
}

TEST_CASE("stream apply: a query row whose logits are all NaN outputs NaN, not 0", "[stream][apply]") {
  const Geometry g{8, 2, 2};
  auto Q = random_mat<double>(g.T, 3, 1), K = random_mat<double>(g.T, 3, 2), V = random_mat<double>(g.T, 3, 3);
  Q(0, 1) = std::numeric_limits<double>::quiet_NaN();  // token 0 attends only to key 0: one NaN logit
  const auto est = stream_estimate(Q, K, BlockMask(g), EstimateParams{4, 1});
  const auto app = stream_apply(Q, K, V, BlockMask(g), est.indices, 4, 1, false);
  CHECK(std::isnan(app.O(0, 0)));
  CHECK(std::isfinite(app.O(2, 0)));  // other rows are unaffected
  CHECK_FALSE(stream_check_dense(Q, K, V, BlockMask(g), 1).passed());
}

TEST_CASE("stream apply: edge records follow (q, slot) order and their weights are consistent", "[stream][trace]") {
  const Geometry g{75, 6, 5};
  const std::size_t k = 3;
  const auto Q = random_mat<double>(g.T, 4, 5), K = random_mat<double>(g.T, 4, 6);
  const Mat<double> ones = Mat<double>::Ones(Eigen::Index(g.T), 1);
  const BlockMask mask(g, random_user_mask(g, 9, 0.7));
  const auto est = stream_estimate(Q, K, mask, EstimateParams{k, 2});
  const auto app = stream_apply(Q, K, ones, mask, est.indices, k, 2, true);
  std::size_t e = 0;
  for (std::size_t q = 0; q < g.n_q(); ++q) {
    double row_mass = 0;
    for (std::size_t j = 0; j < k; ++j) {
      if (est.at(q, j) < 0) continue;
      REQUIRE(e < app.edges.size());
      const Edge& ed = app.edges[e++];
      INFO("q=" << q << " j=" << j);
      CHECK(ed.q == std::int64_t(q));
      CHECK(ed.slot == std::int64_t(j));
      CHECK(ed.r == est.at(q, j));
      CHECK(ed.score == est.scores[q * k + j]);  // the same tile, bit for bit
      CHECK(ed.mass >= 0);
      CHECK(ed.mass <= double(g.q_rows(q)));
      // With V ≡ 1 the value summary Σ p V is the mass itself.
      CHECK(ed.value_norm == Approx(ed.mass).epsilon(1e-12).margin(1e-300));
      row_mass += ed.mass;
    }
    // Each query row with a non-empty sparse support distributes probability 1 over the kept blocks.
    std::size_t rows_with_support = 0;
    for (std::size_t m = 0; m < g.q_rows(q); ++m) rows_with_support += app.O(Eigen::Index(q * g.bq + m), 0) != 0.0 ? 1 : 0;
    CHECK(row_mass == Approx(double(rows_with_support)).epsilon(1e-12).margin(1e-12));
  }
  CHECK(e == app.edges.size());
  CHECK(app.traffic.find("E")->write_elements == app.edges.size());
  CHECK(app.traffic.find("Q")->read_elements == g.T * 4);
  CHECK(app.traffic.find("O")->write_elements == g.T * 1);
}

TEST_CASE("stream apply: indices that break the validity invariant are refused", "[stream][apply][errors]") {
  const Geometry g{16, 4, 4};
  const auto Q = random_mat<double>(g.T, 2, 1);
  std::vector<std::int64_t> I = {0, -1, 0, 1, 0, 1, 0, 1};
  CHECK_NOTHROW(stream_apply(Q, Q, Q, BlockMask(g), I, 2, 1, false));
  I[0] = 1;  // block 1 is in the future of query block 0
  CHECK_THROWS_WITH(stream_apply(Q, Q, Q, BlockMask(g), I, 2, 1, false), Catch::Contains("I[0, 0] = 1"));
  I[0] = 0;
  CHECK_THROWS_WITH(stream_apply(Q, Q, Q, BlockMask(g), I, 3, 1, false), Catch::Contains("n_q·k"));
}

namespace {
fs::path mask_dir() {
  auto d = fs::temp_directory_path() / "flashlab_test_stream_mask";
  fs::create_directories(d);
  return d;
}
}  // namespace

TEST_CASE("stream mask files: .npy (uint8, bool) and text load, and equal each other", "[stream][mask]") {
  const Geometry g{12, 4, 3};  // n_q = 3, n_k = 4
  const std::vector<std::uint8_t> bits = {1, 0, 1, 1, 0, 1, 1, 0, 1, 1, 0, 1};
  write_npy_raw(mask_dir() / "m.npy", {3, 4}, "|u1", bits.data(), bits.size());
  write_npy_raw(mask_dir() / "b.npy", {3, 4}, "|b1", bits.data(), bits.size());
  std::ofstream(mask_dir() / "m.txt") << "# user block mask, rows = query blocks\n1011\n0110\n\n1101\n";
  const BlockMask a = load_block_mask(mask_dir() / "m.npy", g), b = load_block_mask(mask_dir() / "b.npy", g),
                  c = load_block_mask(mask_dir() / "m.txt", g);
  for (std::size_t q = 0; q < 3; ++q)
    for (std::size_t r = 0; r < 4; ++r) {
      const bool want = bits[q * 4 + r] && BlockMask(g).valid(q, r);  // causal ∧ user
      CHECK(a.valid(q, r) == want);
      CHECK(b.valid(q, r) == want);
      CHECK(c.valid(q, r) == want);
    }
}

TEST_CASE("stream mask files: errors name the file and the position", "[stream][mask][errors]") {
  const Geometry g{12, 4, 3};
  const std::vector<std::uint8_t> bits(12, 1);
  write_npy_raw(mask_dir() / "shape.npy", {4, 3}, "|u1", bits.data(), bits.size());
  CHECK_THROWS_WITH(load_block_mask(mask_dir() / "shape.npy", g),
                    Catch::Contains("shape.npy") && Catch::Contains("(4, 3)") && Catch::Contains("(3, 4)"));
  std::vector<std::uint8_t> two = bits;
  two[6] = 2;
  write_npy_raw(mask_dir() / "two.npy", {3, 4}, "|u1", two.data(), two.size());
  CHECK_THROWS_WITH(load_block_mask(mask_dir() / "two.npy", g),
                    Catch::Contains("two.npy") && Catch::Contains("[1, 2]") && Catch::Contains("0 or 1"));
  const std::vector<double> f(12, 1.0);
  write_npy(mask_dir() / "float.npy", {3, 4}, f.data());
  CHECK_THROWS_WITH(load_block_mask(mask_dir() / "float.npy", g), Catch::Contains("float.npy") && Catch::Contains("<f8"));
  CHECK_THROWS_WITH(load_block_mask(mask_dir() / "missing.npy", g), Catch::Contains("missing.npy"));
  std::ofstream(mask_dir() / "char.txt") << "1111\n11x1\n1111\n";
  CHECK_THROWS_WITH(load_block_mask(mask_dir() / "char.txt", g), Catch::Contains("char.txt:2:3") && Catch::Contains("'x'"));
  std::ofstream(mask_dir() / "short.txt") << "1111\n111\n1111\n";
  CHECK_THROWS_WITH(load_block_mask(mask_dir() / "short.txt", g), Catch::Contains("short.txt:2:4") && Catch::Contains("n_k = 4"));
  std::ofstream(mask_dir() / "rows.txt") << "1111\n1111\n";
  CHECK_THROWS_WITH(load_block_mask(mask_dir() / "rows.txt", g), Catch::Contains("rows.txt:3:1") && Catch::Contains("n_q = 3"));
  std::ofstream(mask_dir() / "extra.txt") << "1111\n1111\n1111\n1111\n";
  CHECK_THROWS_WITH(load_block_mask(mask_dir() / "extra.txt", g), Catch::Contains("extra.txt:4:1") && Catch::Contains("extra row"));
  CHECK_THROWS_WITH(load_block_mask(mask_dir() / "nope.txt", g), Catch::Contains("nope.txt") && Catch::Contains("no such file"));
}
