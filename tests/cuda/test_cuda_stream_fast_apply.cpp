// GPU tests of the fast STREAM application (flashlab/cuda/stream_fast.hpp) against float64
// references on the same 16-bit-rounded inputs: k = n_k equals dense causal attention; random I
// from the reference estimate equals the reference's stream_apply; one query block per thread
// block and two give the same bits; ragged T, T = 1, several heads, a user mask with an empty row
// (→ exact zeros), NaN inputs (→ NaN rows, never a pass), refused shapes and indices.
//
// Tolerance (bf16 and fp16 alike): the error max|O − O_ref| / max|O_ref| over the whole output
// within 2 × the rounding floor (O_ref itself rounded to the dtype, the best any 16-bit output
// can do) + 1e-7, as the fast attention tests; the row-wise error (each row against its own
// largest entry) within 1e-2 as well.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <limits>
#include <random>

#include "flashlab/cuda/stream_fast.hpp"
#include "flashlab/reference/attention.hpp"
#include "flashlab/reference/stream.hpp"
#include "gpu_test_util.hpp"
#include "stream_test_util.hpp"

using namespace flashlab;
using namespace flashlab::ref::stream;
using ref::Mat;
namespace gs = flashlab::cuda::stream;

namespace {


/// The GPU output of head h as a T × d float64 matrix.
Mat<double> head_of(const std::vector<std::uint16_t>& O, const test::Inputs16& in, std::size_t h) {
  Mat<double> m(Eigen::Index(in.T), Eigen::Index(in.d));
  for (std::size_t t = 0; t < in.T; ++t)
    for (std::size_t c = 0; c < in.d; ++c)
      m(Eigen::Index(t), Eigen::Index(c)) = test::to_float(O[(t * in.H + h) * in.d + c], in.dtype);
  return m;
}

/// Checks every head of `O` against `ref_of(h)` with the stated tolerances; returns the worst
/// global error / floor ratio for the printout.
template <typename RefOf>
double check_against(const std::vector<std::uint16_t>& O, const test::Inputs16& in, RefOf ref_of, const char* label) {
  double worst_ratio = 0;
  for (std::size_t h = 0; h < in.H; ++h) {
    const Mat<double> got = head_of(O, in, h);
    const Mat<double> ref = ref_of(h);
    const std::size_t n = std::size_t(ref.size());
    const double err = ref::max_error_vs_max(got.data(), ref.data(), n);
    const double floor = test::rounding_floor(ref.data(), n, in.dtype);
    const double row_err = row_rel_error(got, ref);
    INFO(label << " head " << h << ": error " << err << " (floor " << floor << "), row error " << row_err);
    CHECK(err <= 2.0 * floor + 1e-7);
    CHECK(row_err <= 1e-2);
    worst_ratio = std::max(worst_ratio, floor > 0 ? err / floor : (err == 0 ? 0.0 : INFINITY));
  }
  return worst_ratio;
}

const char* name_of(ref::Dtype dt) { return dt == ref::Dtype::bf16 ? "bf16" : "fp16"; }

}  // namespace

TEST_CASE("cuda stream fast apply: k = n_k equals dense causal attention (2x the 16-bit rounding floor)",
          "[gpu][stream-fast]") {
  const auto seed = test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  struct Case { std::size_t T, H, d; ref::Dtype dtype; int group; };
  const ref::Dtype bf = ref::Dtype::bf16, fp = ref::Dtype::fp16;
  for (const Case c : {Case{1, 1, 64, bf, 1}, Case{1, 2, 128, fp, 2}, Case{37, 1, 128, bf, 1}, Case{64, 1, 64, fp, 2},
                       Case{65, 2, 64, bf, 2}, Case{200, 1, 128, fp, 1}, Case{1000, 3, 64, bf, 1},
                       Case{1000, 1, 128, bf, 2}, Case{2049, 1, 128, fp, 2}, Case{3000, 2, 128, bf, 1}}) {
    INFO("T=" << c.T << " H=" << c.H << " d=" << c.d << " " << name_of(c.dtype) << " group=" << c.group);
    const test::Inputs16 in = test::make_inputs16(c.T, c.H, c.d, c.dtype, 1.0 / std::sqrt(double(c.d)), rng);
    const Geometry g{c.T, 64, 64};
    const BlockMask mask(g);
    const std::size_t k = g.n_k();
    const std::vector<std::int64_t> I = test::reference_indices(in, mask, k);
    const std::vector<std::uint16_t> O =
        gs::stream_fast_apply(c.dtype, in.heads(in.Q), in.heads(in.K), in.heads(in.V), mask, I, k, c.group);
    const double ratio = check_against(O, in, [&](std::size_t h) {
      return stream_dense_reference(in.Qh[h], in.Kh[h], in.Vh[h], mask);
    }, "dense");
    std::printf("stream fast apply k=n_k T=%zu H=%zu d=%zu %s group=%d: error %.2f x floor vs float64 dense\n", c.T, c.H,
                c.d, name_of(c.dtype), c.group, ratio);
  }
}

TEST_CASE("cuda stream fast apply: random I from the reference estimate matches the reference apply",
          "[gpu][stream-fast]") {
  const auto seed = test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  struct Case { std::size_t T, H, d, k; double q_sd, mask_p; ref::Dtype dtype; };
  const ref::Dtype bf = ref::Dtype::bf16, fp = ref::Dtype::fp16;
  for (const Case c : {Case{777, 1, 128, 3, 1.0, 1.0, bf}, Case{4096, 2, 64, 8, 0.125, 1.0, bf},
                       Case{5000, 1, 128, 8, 1.0, 0.5, fp}, Case{3333, 1, 64, 16, 0.3, 0.7, bf}}) {
    INFO("T=" << c.T << " H=" << c.H << " d=" << c.d << " k=" << c.k << " q_sd=" << c.q_sd << " mask p=" << c.mask_p);
    const test::Inputs16 in = test::make_inputs16(c.T, c.H, c.d, c.dtype, c.q_sd, rng);
    const Geometry g{c.T, 64, 64};
    const BlockMask mask = test::case_mask(g, rng, c.mask_p);
    const std::vector<std::int64_t> I = test::reference_indices(in, mask, c.k);
    std::vector<std::uint16_t> O[2];
    for (int group : {1, 2})
      O[group - 1] = gs::stream_fast_apply(c.dtype, in.heads(in.Q), in.heads(in.K), in.heads(in.V), mask, I, c.k, group);
    const std::size_t per_head = g.n_q() * c.k;
    const double ratio = check_against(O[0], in, [&](std::size_t h) {
      const std::vector<std::int64_t> Ih(I.begin() + std::ptrdiff_t(h * per_head),
                                         I.begin() + std::ptrdiff_t((h + 1) * per_head));
      return stream_apply(in.Qh[h], in.Kh[h], in.Vh[h], mask, Ih, c.k, 8, false).O;
    }, "sparse");
    // Both groupings visit each query block's kept blocks in the same order: the same bits.
    CHECK(O[0] == O[1]);
    std::printf("stream fast apply sparse T=%zu H=%zu d=%zu k=%zu %s: error %.2f x floor vs float64 reference\n", c.T,
                c.H, c.d, c.k, name_of(c.dtype), ratio);
  }
}

TEST_CASE("cuda stream fast apply: an empty row of I gives exact zeros; NaN logits give NaN rows",
          "[gpu][stream-fast][stream-fast-small]") {
  const auto seed = test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const std::size_t T = 300, k = 3;
  test::Inputs16 in = test::make_inputs16(T, 1, 64, ref::Dtype::bf16, 0.125, rng);
  const Geometry g{T, 64, 64};
  std::vector<std::uint8_t> user(g.n_q() * g.n_k(), 1);
  for (std::size_t r = 0; r < g.n_k(); ++r) user[2 * g.n_k() + r] = 0;  // query block 2 may see nothing
  const BlockMask mask(g, user);
  const std::vector<std::int64_t> I = test::reference_indices(in, mask, k);
  for (std::size_t j = 0; j < k; ++j) REQUIRE(I[2 * k + j] == -1);
  for (int group : {1, 2}) {
    INFO("group " << group);
    const std::vector<std::uint16_t> O =
        gs::stream_fast_apply(in.dtype, in.heads(in.Q), in.heads(in.K), in.heads(in.V), mask, I, k, group);
    for (std::size_t t = 128; t < 192; ++t)
      for (std::size_t c = 0; c < in.d; ++c) REQUIRE(O[t * in.d + c] == 0);  // +0.0, not a NaN, not −0
    check_against(O, in, [&](std::size_t) { return stream_apply(in.Qh[0], in.Kh[0], in.Vh[0], mask, I, k, 8, false).O; },
                  "masked");
  }
  // A NaN in Q_t: every logit of row t is NaN, so row t is NaN (as the reference); other rows
  // keep their values. The comparison treats NaN as an infinite error: it cannot pass unnoticed.
  const std::size_t t_nan = 70;
  in.Q[t_nan * in.d + 5] = 0x7fc0;  // bf16 quiet NaN
  in.Qh[0](Eigen::Index(t_nan), 5) = std::numeric_limits<double>::quiet_NaN();
  const std::vector<std::uint16_t> O =
      gs::stream_fast_apply(in.dtype, in.heads(in.Q), in.heads(in.K), in.heads(in.V), mask, I, k, 1);
  const Mat<double> got = head_of(O, in, 0);
  const Mat<double> ref = stream_apply(in.Qh[0], in.Kh[0], in.Vh[0], mask, I, k, 8, false).O;
  for (std::size_t c = 0; c < in.d; ++c) {
    CHECK(std::isnan(got(Eigen::Index(t_nan), Eigen::Index(c))));
    CHECK(std::isnan(ref(Eigen::Index(t_nan), Eigen::Index(c))));
  }
  CHECK(ref::max_error_vs_max(got.data(), ref.data(), std::size_t(got.size())) == INFINITY);  // NaN never passes
  Mat<double> got_rest = got, ref_rest = ref;
  got_rest.row(Eigen::Index(t_nan)).setZero();
  ref_rest.row(Eigen::Index(t_nan)).setZero();
  CHECK(ref::max_error_vs_max(got_rest.data(), ref_rest.data(), std::size_t(got.size())) <=
        2.0 * test::rounding_floor(ref_rest.data(), std::size_t(ref_rest.size()), in.dtype) + 1e-7);
}

TEST_CASE("cuda stream fast apply: refuses shapes and indices it cannot run, naming the parameter",
          "[gpu][stream-fast]") {
  std::mt19937_64 rng(7);
  const test::Inputs16 in = test::make_inputs16(200, 1, 64, ref::Dtype::bf16, 0.125, rng);
  const Geometry g{200, 64, 64};
  const BlockMask mask(g);
  const std::vector<std::int64_t> I = test::reference_indices(in, mask, 2);
  auto run = [&](const BlockMask& m, const std::vector<std::int64_t>& idx, std::size_t k, int group,
                 ref::Dtype dt = ref::Dtype::bf16) {
    return gs::stream_fast_apply(dt, in.heads(in.Q), in.heads(in.K), in.heads(in.V), m, idx, k, group);
  };
  CHECK_THROWS_WITH(run(BlockMask(Geometry{200, 32, 32}), I, 2, 0), Catch::Contains("b_q = b_k = 64"));
  CHECK_THROWS_WITH(run(mask, I, 2, 3), Catch::Contains("group"));
  CHECK_THROWS_WITH(run(mask, I, 2, 0, ref::Dtype::fp32), Catch::Contains("bf16 or fp16"));
  CHECK_THROWS_WITH(run(mask, std::vector<std::int64_t>(I.begin(), I.end() - 1), 2, 0), Catch::Contains("entries"));
  std::vector<std::int64_t> dup = I;
  dup[2 * 2 + 1] = dup[2 * 2];  // query block 2 keeps one block twice
  CHECK_THROWS_AS(run(mask, dup, 2, 0), StreamError);
  std::vector<std::int64_t> future = I;
  future[0] = 3;  // query block 0 cannot see key block 3
  CHECK_THROWS_AS(run(mask, future, 2, 0), StreamError);
  const std::vector<std::uint16_t> d32(200 * 32);
  const gs::HostHeads16 narrow{d32.data(), 1, 32};
  CHECK_THROWS_WITH(gs::stream_fast_apply(ref::Dtype::bf16, narrow, narrow, narrow, mask, I, 2),
                    Catch::Contains("64 or 128"));
  CHECK_THROWS_WITH(gs::check_fast_apply(gs::FastApplyShape{200, 65536, 64, 2, ref::Dtype::bf16, 0}),
                    Catch::Contains("heads = 65536"));
  CHECK_THROWS_WITH(gs::check_fast_apply(gs::FastApplyShape{200, 1, 64, gs::kFastStreamMaxK + 1, ref::Dtype::bf16, 0}),
                    Catch::Contains("k = 1025"));
}
