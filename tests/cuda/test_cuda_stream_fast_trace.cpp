// GPU tests of the fast STREAM trace (flashlab/cuda/stream_fast.hpp, stream_fast_trace): its
// records against the reference's edge records (stream_apply with edges, float64 on the same
// 16-bit-rounded inputs) — the same blocks in the same order (I's), the weights within the
// 16-bit bound — on random and exact small-integer inputs, ragged T, several heads, a user mask
// with empty entries of I, T = 1; a NaN never passes; refusals name the parameter.
//
// Tolerances. score and mass come from fp32 logits of exact products (tensor-core fp32
// accumulation): |Δscore| ≤ 1e-5·(1 + max|score|), |Δmass| ≤ 1e-4·max(1, mass). value_norm is
// ‖Σ p V‖ with p rounded to the dtype before P V (as the fast apply's P): each p moves by at
// most half an ulp, 2^-9 (bf16) or 2^-12 (fp16) relative, so ‖Δ‖ ≤ 2^-9·mass·max‖V_s‖; the check
// allows twice that.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <limits>
#include <random>

#include "flashlab/cuda/stream_fast.hpp"
#include "flashlab/reference/stream.hpp"
#include "gpu_test_util.hpp"
#include "stream_test_util.hpp"

using namespace flashlab;
using namespace flashlab::ref::stream;
using ref::Mat;
namespace gs = flashlab::cuda::stream;

namespace {

struct Worst {
  double score = 0, mass = 0, value = 0;  // error / allowance, the largest
};

// Compares the records of head h with the reference's edges; returns the worst error ratios.
Worst check_head(const std::vector<gs::FastEdge>& got, const test::Inputs16& in, std::size_t h, const BlockMask& mask,
                 const std::vector<std::int64_t>& Ih, std::size_t k) {
  const Geometry& g = mask.geometry();
  const auto ref = stream_apply(in.Qh[h], in.Kh[h], in.Vh[h], mask, Ih, k, 8, true).edges;
  const double half_ulp = in.dtype == ref::Dtype::bf16 ? std::ldexp(1.0, -9) : std::ldexp(1.0, -12);
  double max_score = 0;
  for (const auto& e : ref) max_score = std::max(max_score, std::fabs(e.score));
  std::size_t next = 0;  // the reference lists kept entries only, in (q, slot) order
  Worst w;
  for (std::size_t q = 0; q < g.n_q(); ++q)
    for (std::size_t j = 0; j < k; ++j) {
      const gs::FastEdge& e = got[(h * g.n_q() + q) * k + j];
      INFO("head " << h << " q " << q << " slot " << j);
      REQUIRE(e.q == std::int32_t(q));
      REQUIRE(e.slot == std::int32_t(j));
      REQUIRE(e.r == std::int32_t(Ih[q * k + j]));
      if (e.r < 0) {
        CHECK(e.score == 0.f);
        CHECK(e.mass == 0.f);
        CHECK(e.value_norm == 0.f);
        continue;
      }
      REQUIRE(next < ref.size());
      const Edge& x = ref[next++];
      REQUIRE(x.q == std::int64_t(q));
      REQUIRE(x.slot == std::int64_t(j));
      REQUIRE(x.r == std::int64_t(e.r));
      double max_v = 0;  // max ‖V_s‖ over the key block
      for (std::size_t s = std::size_t(e.r) * g.bk; s < std::min(g.T, (std::size_t(e.r) + 1) * g.bk); ++s)
        max_v = std::max(max_v, in.Vh[h].row(Eigen::Index(s)).norm());
      const double a_score = 1e-5 * (1 + max_score), a_mass = 1e-4 * std::max(1.0, x.mass);
      const double a_value = 2 * half_ulp * x.mass * max_v + 1e-6;
      const double d_score = std::fabs(double(e.score) - x.score), d_mass = std::fabs(double(e.mass) - x.mass);
      const double d_value = std::fabs(double(e.value_norm) - x.value_norm);
      INFO("score " << e.score << " vs " << x.score << ", mass " << e.mass << " vs " << x.mass << ", value_norm "
                    << e.value_norm << " vs " << x.value_norm);
      CHECK(d_score <= a_score);  // NaN fails every comparison
      CHECK(d_mass <= a_mass);
      CHECK(d_value <= a_value);
      w.score = std::max(w.score, d_score / a_score);
      w.mass = std::max(w.mass, d_mass / a_mass);
      w.value = std::max(w.value, d_value / a_value);
    }
  CHECK(next == ref.size());
  return w;
}

}  // namespace

TEST_CASE("cuda stream fast trace: records equal the reference's edges, weights within the 16-bit bound",
          "[gpu][stream-fast][stream-fast-trace]") {
  const auto seed = test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  struct Case { std::size_t T, H, d, k; double q_sd, mask_p; ref::Dtype dtype; bool ints; };
  const ref::Dtype bf = ref::Dtype::bf16, fp = ref::Dtype::fp16;
  for (const Case c : {Case{1, 1, 64, 2, 1.0, 1.0, bf, false}, Case{300, 2, 64, 3, 0.125, 1.0, bf, true},
                       Case{777, 1, 128, 4, 1.0, 1.0, bf, false}, Case{1000, 2, 128, 8, 0.09, 0.6, fp, false},
                       Case{2049, 1, 64, 16, 0.3, 1.0, bf, false}, Case{1500, 1, 128, 5, 0.09, 0.5, bf, true}}) {
    INFO("T=" << c.T << " H=" << c.H << " d=" << c.d << " k=" << c.k << " q_sd=" << c.q_sd << " mask p=" << c.mask_p
              << (c.ints ? " integers" : ""));
    const test::Inputs16 in = test::make_inputs16(c.T, c.H, c.d, c.dtype, c.q_sd, rng, c.ints);
    const Geometry g{c.T, 64, 64};
    const BlockMask mask = test::case_mask(g, rng, c.mask_p);
    const std::vector<std::int64_t> I = test::reference_indices(in, mask, c.k);
    const std::vector<gs::FastEdge> E =
        gs::stream_fast_trace(c.dtype, in.heads(in.Q), in.heads(in.K), in.heads(in.V), mask, I, c.k);
    REQUIRE(E.size() == c.H * g.n_q() * c.k);
    const std::size_t per_head = g.n_q() * c.k;
    Worst worst;
    for (std::size_t h = 0; h < c.H; ++h) {
      const std::vector<std::int64_t> Ih(I.begin() + std::ptrdiff_t(h * per_head),
                                         I.begin() + std::ptrdiff_t((h + 1) * per_head));
      const Worst w = check_head(E, in, h, mask, Ih, c.k);
      worst.score = std::max(worst.score, w.score);
      worst.mass = std::max(worst.mass, w.mass);
      worst.value = std::max(worst.value, w.value);
    }
    std::printf("stream fast trace T=%zu H=%zu d=%zu k=%zu: worst error / allowance: score %.3f, mass %.3f, "
                "value_norm %.3f\n", c.T, c.H, c.d, c.k, worst.score, worst.mass, worst.value);
  }
}

TEST_CASE("cuda stream fast trace: a NaN logit poisons its records; bad input is refused by name",
          "[gpu][stream-fast][stream-fast-trace][stream-fast-small]") {
  std::mt19937_64 rng(11);
  test::Inputs16 in = test::make_inputs16(200, 1, 64, ref::Dtype::bf16, 0.125, rng);
  const Geometry g{200, 64, 64};
  const BlockMask mask(g);
  const std::vector<std::int64_t> I = test::reference_indices(in, mask, 2);
  in.Q[70 * in.d + 5] = 0x7fc0;  // a NaN in row 70 (query block 1)
  const auto E = gs::stream_fast_trace(in.dtype, in.heads(in.Q), in.heads(in.K), in.heads(in.V), mask, I, 2);
  bool nan_seen = false;
  for (std::size_t j = 0; j < 2; ++j) nan_seen = nan_seen || std::isnan(E[1 * 2 + j].mass);
  CHECK(nan_seen);
  auto run = [&](const BlockMask& m, const std::vector<std::int64_t>& idx, std::size_t k,
                 ref::Dtype dt = ref::Dtype::bf16) {
    return gs::stream_fast_trace(dt, in.heads(in.Q), in.heads(in.K), in.heads(in.V), m, idx, k);
  };
  CHECK_THROWS_WITH(run(BlockMask(Geometry{200, 32, 32}), I, 2), Catch::Contains("b_q = b_k = 64"));
  CHECK_THROWS_WITH(run(mask, I, 2, ref::Dtype::fp32), Catch::Contains("bf16 or fp16"));
  CHECK_THROWS_WITH(run(mask, std::vector<std::int64_t>(I.begin(), I.end() - 1), 2), Catch::Contains("entries"));
  std::vector<std::int64_t> future = I;
  future[0] = 3;  // query block 0 cannot see key block 3
  CHECK_THROWS_AS(run(mask, future, 2), StreamError);
}
