// The fast tensor-core MTA forward (flashlab/cuda/mta_fast.hpp) against the float64 naive
// reference ref::mta::naive_forward<double> (whole S, Ŝ and P per head, scalar convolution
// loops).
//
// Inputs: fresh normal Q, K, V rounded to the dtype first and W in fp32 (the kernel's types); the
// reference gets exactly those values in float64, so the error measured is the kernel's own
// (fp32 scores and convolution, 16-bit P, fp32 accumulation, 16-bit O). Metric for O:
// ref::max_error_vs_max over the whole tensor (NaN anywhere → +inf, fails); outputs are poisoned
// with NaN by the host API. Tolerances, both must hold: O ≤ 1e-2 relative AND O ≤ 2× the error
// of merely rounding the float64 O to the dtype (the "rounding floor"); LSE (converted from the
// kernel's base 2 to natural log) absolute ≤ 1e-4 · max(1, max|LSE|).
// Shapes: N = 1, N < the 64-row tile, N not a multiple of it, several tiles; cq × ck = 1 × 1
// (with W = 1 also against plain causal attention), 3 × 3, 6 × 11, 11 × 11, 16 × 15; d = 64 and
// 128; batch and heads > 1; fp16 twice. Adversarial values: Q entries ±800, K entries ±800 (all, or
// the second half's), exact ties (Q = K = 1); a NaN in V must come out as NaN. The linear path
// (FastShape::linear_path) on its own cases, on and off, and its accuracy guard. The source-order
// variant (FastOOrder::source: O_i, m_i, ℓ_i through HBM between key tiles) to the same bar. Tag
// [mta-fast-sanitize]: the small shapes, for compute-sanitizer.
#include <catch2/catch.hpp>

#include "gpu_test_util.hpp"
#include "mta_test_util.hpp"
#include "flashlab/cuda/mta_fast.hpp"
#include "flashlab/reference/attention.hpp"
#include "flashlab/reference/mta.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <string>

namespace fc = flashlab::cuda;
namespace fr = flashlab::ref;
namespace fm = flashlab::ref::mta;

namespace {

constexpr double kTolO = 1e-2;     // 16-bit O vs float64 reference, relative to max|O|
constexpr double kTolLSE = 1e-4;   // fp32 LSE, absolute below |LSE| = 1, relative above
constexpr double kLn2 = 0.6931471805599453;

using flashlab::test::fresh_seed;

// large: Q = ±800; large_k: K = ±800; late_large_k: K = ±800 on the keys of the second half only
// (the linear path's guard trips part way); ties: Q = K = 1.
enum class Values { normal, large, large_k, late_large_k, ties };

struct FastCase {
  std::size_t batch, seq, heads, dim, cq, ck;
  fr::Dtype dtype = fr::Dtype::bf16;
  Values values = Values::normal;
  bool unit_kernel = false;  // W = 1 (with 1 × 1: plain causal attention)
  int linear_path = -1;      // FastShape::linear_path (−1: the policy)
  fc::mta::FastOOrder o_order = fc::mta::FastOOrder::on_chip;
};

std::string label(const FastCase& c) {
  return std::string(fr::dtype_name(c.dtype)) + " B=" + std::to_string(c.batch) + " N=" + std::to_string(c.seq) +
         " H=" + std::to_string(c.heads) + " d=" + std::to_string(c.dim) + " W=" + std::to_string(c.cq) + "x" +
         std::to_string(c.ck) +
         (c.values == Values::large          ? " +-800"
          : c.values == Values::large_k      ? " K=+-800"
          : c.values == Values::late_large_k ? " late K=+-800"
          : c.values == Values::ties         ? " ties"
                                             : "") +
         (c.unit_kernel ? " W=1" : "") + " linear_path=" + std::to_string(c.linear_path);
}

struct Inputs {
  fr::Tensor<double> q, k, v;  // values exactly representable in the dtype
  fm::Weights<double> w;       // values exactly representable in fp32
};

fr::Tensor<double> rounded(const fr::Tensor<double>& x, fr::Dtype dt) {
  fr::Tensor<double> out(x.shape());
  (void)flashlab::test::round_to_16(x, dt, out);
  return out;
}

Inputs make_inputs(const FastCase& c, unsigned long long seed) {
  const fr::Shape shape{c.batch, c.seq, c.heads, c.dim};
  fr::Tensor<double> q0(shape), k0(shape), v0(shape);
  fr::fill_normal(q0, seed);
  fr::fill_normal(k0, seed + 1);
  fr::fill_normal(v0, seed + 2);
  if (c.values == Values::large)  // every Q entry ±800: scores of ~1e3, a nearly one-hot softmax
    for (std::size_t i = 0; i < q0.numel(); ++i) q0.data()[i] = q0.data()[i] < 0 ? -800.0 : 800.0;
  if (c.values == Values::large_k || c.values == Values::late_large_k) {  // K entries ±800 (of the late keys)
    const std::size_t first = c.values == Values::large_k ? 0 : c.seq / 2;
    for (std::size_t b = 0; b < c.batch; ++b)
      for (std::size_t n = first; n < c.seq; ++n)
        for (std::size_t i = 0; i < c.heads * c.dim; ++i) {
          double& x = k0.data()[(b * c.seq + n) * c.heads * c.dim + i];
          x = x < 0 ? -800.0 : 800.0;
        }
  }
  if (c.values == Values::ties)  // Q = K = 1: equal raw scores, exact ties among the convolved ones
    for (fr::Tensor<double>* x : {&q0, &k0})
      for (std::size_t i = 0; i < x->numel(); ++i) x->data()[i] = 1.0;
  // Taps of standard deviation 1.5/√(cq·ck): Ŝ keeps the spread of S whatever the kernel size
  // (as the clear kernels' tests).
  fm::Weights<double> w = fm::random_weights(c.heads, c.cq, c.ck, seed + 4, 1.5 / std::sqrt(double(c.cq * c.ck)));
  if (c.unit_kernel)
    for (std::size_t i = 0; i < w.numel(); ++i) w.data()[i] = 1.0;
  return {rounded(q0, c.dtype), rounded(k0, c.dtype), rounded(v0, c.dtype), w.cast<float>().cast<double>()};
}

fm::Params params_of(const FastCase& c) {
  fm::Params p;
  p.cq = c.cq;
  p.ck = c.ck;
  return p;
}

// The kernel's base-2 LSE [B, H, N] against the reference's natural-log LSE [B, N, H, 1]:
// absolute error over max(1, max|LSE|); NaN → +inf.
double err_lse(const std::vector<float>& lse2, const fr::Tensor<double>& ref) {
  const fr::Shape& sh = ref.shape();
  double ref_max = 1.0, worst = 0.0;
  for (std::size_t i = 0; i < ref.numel(); ++i) ref_max = std::max(ref_max, std::abs(ref.data()[i]));
  for (std::size_t b = 0; b < sh.batch; ++b)
    for (std::size_t n = 0; n < sh.seq; ++n)
      for (std::size_t h = 0; h < sh.heads; ++h) {
        const double got = double(lse2[(b * sh.heads + h) * sh.seq + n]) * kLn2;
        const double e = std::abs(got - ref.data()[(b * sh.seq + n) * sh.heads + h]);
        if (!(e <= worst)) worst = std::isnan(e) ? std::numeric_limits<double>::infinity() : e;
      }
  return worst / ref_max;
}

double g_worst_O = 0.0, g_worst_ratio = 0.0, g_worst_LSE = 0.0;

void check_o(const char* what, const fc::mta::FastForwardOutput& got, const fr::Tensor<double>& ref, fr::Dtype dt) {
  const double e = fr::max_error_vs_max(got.o.data(), ref.data(), ref.numel());
  const double floor = flashlab::test::rounding_floor(ref.data(), ref.numel(), dt);
  INFO(what << ": O error " << e << ", rounding floor " << floor);
  if (!(e <= g_worst_O)) g_worst_O = e;
  if (!(e / floor <= g_worst_ratio)) g_worst_ratio = e / floor;
  CHECK(e <= kTolO);
  CHECK(e <= 2.0 * floor + 1e-7);
}

void check_fast(const FastCase& c) {
  const unsigned long long seed = fresh_seed();
  INFO(label(c) << " seed=" << seed << " (rerun with FLASHLAB_TEST_SEED)");
  const Inputs in = make_inputs(c, seed);
  const fm::Params p = params_of(c);
  const auto ref = fm::naive_forward<double>(in.q, in.k, in.v, in.w, p);
  const auto got = fc::mta::fast_forward(in.q.cast<float>(), in.k.cast<float>(), in.v.cast<float>(),
                                         in.w.cast<float>(), p, c.dtype, c.linear_path, c.o_order);
  REQUIRE(got.o.numel() == ref.o.numel());
  REQUIRE(got.lse.size() == ref.lse.numel());
  check_o("MTA", got, ref.o, c.dtype);
  const double eL = err_lse(got.lse, ref.lse);
  if (!(eL <= g_worst_LSE)) g_worst_LSE = eL;
  INFO("LSE error " << eL);
  CHECK(eL <= kTolLSE);
  if (c.unit_kernel && c.cq == 1 && c.ck == 1) {  // a 1 × 1 kernel of weight 1 is plain causal attention
    const auto plain = fr::naive_forward<double>(flashlab::test::plain_causal_problem(c), in.q, in.k, in.v);
    check_o("plain causal attention", got, plain.O, c.dtype);
  }
}

void report(const char* name) {
  std::printf("[%s] worst O error %.3e (tolerance %.0e and 2x the rounding floor; worst error/floor %.2f), worst LSE "
              "error %.3e (tolerance %.0e)\n",
              name, g_worst_O, kTolO, g_worst_ratio, g_worst_LSE, kTolLSE);
  g_worst_O = g_worst_ratio = g_worst_LSE = 0.0;
}

}  // namespace

TEST_CASE("mta fast forward, small shapes, equals the float64 reference", "[mta-fast][mta-fast-sanitize]") {
  for (std::size_t seq : {1, 17, 64, 100})
    for (auto [cq, ck] : {std::pair<std::size_t, std::size_t>{1, 1}, {3, 3}, {6, 11}, {16, 15}})
      check_fast({1, seq, 2, 64, cq, ck});
  check_fast({2, 70, 3, 128, 6, 11});
  check_fast({1, 33, 2, 64, 1, 1, fr::Dtype::bf16, Values::normal, true});
  report("mta-fast small");
}

TEST_CASE("mta fast forward, several tiles, d = 64 and 128, fp16", "[mta-fast]") {
  for (std::size_t d : {64, 128}) {
    check_fast({1, 300, 2, d, 3, 3});
    check_fast({2, 257, 2, d, 6, 11});
    check_fast({1, 200, 3, d, 16, 15});
    check_fast({1, 129, 2, d, 11, 11});
    check_fast({1, 190, 2, d, 1, 1, fr::Dtype::bf16, Values::normal, true});
    check_fast({1, 1000, 1, d, 3, 3});
  }
  check_fast({1, 150, 2, 64, 6, 11, fr::Dtype::fp16});
  check_fast({2, 150, 2, 128, 3, 3, fr::Dtype::fp16});
  report("mta-fast tiles");
}

TEST_CASE("mta fast forward, adversarial values", "[mta-fast][mta-fast-sanitize]") {
  for (auto [cq, ck] : {std::pair<std::size_t, std::size_t>{3, 3}, {6, 11}}) {
    check_fast({1, 150, 2, 64, cq, ck, fr::Dtype::bf16, Values::large});
    check_fast({1, 150, 2, 64, cq, ck, fr::Dtype::bf16, Values::ties});
  }
  report("mta-fast adversarial");
}

// The linear path (Ŝ = Σ_b Q̃_b K_bᵀ on the key tiles left of the diagonal band, the masked path on
// the band): taken only from the third query tile on for 3 × 3 (Pq + Pk = 3 > 1), from the second
// for 1 × 1; ragged N, a last tile of one row, the largest halo (cq = 16), ck = 1, plain attention
// through it, d = 64 and 128 (whatever the policy picks), each with the path forced on (1) and off
// (0): both must agree with the reference.
TEST_CASE("mta fast forward, linear path off the diagonal", "[mta-fast]") {
  for (int linear : {1, 0})
    for (std::size_t d : {64, 128}) {
      check_fast({1, 300, 2, d, 3, 3, fr::Dtype::bf16, Values::normal, false, linear});
      check_fast({2, 129, 3, d, 3, 3, fr::Dtype::bf16, Values::normal, false, linear});
      check_fast({1, 517, 2, d, 16, 3, fr::Dtype::bf16, Values::normal, false, linear});
      check_fast({1, 260, 2, d, 6, 1, fr::Dtype::bf16, Values::normal, false, linear});
      check_fast({1, 190, 2, d, 1, 1, fr::Dtype::bf16, Values::normal, true, linear});
      check_fast({1, 1025, 1, d, 1, 3, fr::Dtype::bf16, Values::normal, false, linear});
    }
  for (std::size_t d : {64, 128}) {
    check_fast({1, 300, 2, d, 3, 3, fr::Dtype::bf16, Values::large, false, 1});
    check_fast({1, 300, 2, d, 3, 3, fr::Dtype::bf16, Values::ties, false, 1});
  }
  // The accuracy guard (kLinearGuard): ±800 in Q trips it on the first linear tile, in K on the
  // first or (late keys only) a later one; the block then finishes on the masked path.
  for (std::size_t d : {64, 128})
    for (Values v : {Values::large_k, Values::late_large_k})
      check_fast({1, 460, 2, d, 3, 3, fr::Dtype::bf16, v, false, 1});
  check_fast({1, 390, 2, 64, 1, 3, fr::Dtype::bf16, Values::late_large_k, false, 1});
  report("mta-fast linear");
}

TEST_CASE("mta fast forward, linear path, small shapes under the sanitizers", "[mta-fast-sanitize]") {
  check_fast({1, 200, 1, 64, 3, 3, fr::Dtype::bf16, Values::normal, false, 1});
  check_fast({1, 330, 1, 64, 3, 3, fr::Dtype::bf16, Values::late_large_k, false, 1});  // the guard, part way
  check_fast({1, 150, 1, 128, 16, 1, fr::Dtype::bf16, Values::normal, false, 1});
  report("mta-fast linear sanitize");
}

// The source-order variant (bf16, d = 64): O_i, m_i, ℓ_i make the trip through the workspace
// between key tiles on both paths (linear on and off), with several tiles, a ragged last one, the
// guard tripping part way, and a wide kernel; the same bar as the on-chip order.
TEST_CASE("mta fast forward, source order (O through HBM between key tiles)", "[mta-fast]") {
  constexpr auto kSource = fc::mta::FastOOrder::source;
  for (int linear : {-1, 1, 0}) {
    check_fast({1, 300, 2, 64, 3, 3, fr::Dtype::bf16, Values::normal, false, linear, kSource});
    check_fast({2, 129, 3, 64, 3, 3, fr::Dtype::bf16, Values::normal, false, linear, kSource});
    check_fast({1, 1, 1, 64, 3, 3, fr::Dtype::bf16, Values::normal, false, linear, kSource});
  }
  check_fast({1, 460, 2, 64, 3, 3, fr::Dtype::bf16, Values::late_large_k, false, 1, kSource});
  check_fast({1, 257, 2, 64, 6, 11, fr::Dtype::bf16, Values::normal, false, -1, kSource});
  check_fast({1, 150, 2, 64, 3, 3, fr::Dtype::bf16, Values::large, false, -1, kSource});
  report("mta-fast source order");
}

TEST_CASE("mta fast forward, source order, small shape under the sanitizers", "[mta-fast-sanitize]") {
  check_fast({1, 200, 1, 64, 3, 3, fr::Dtype::bf16, Values::normal, false, 1, fc::mta::FastOOrder::source});
  check_fast({1, 150, 1, 64, 3, 3, fr::Dtype::bf16, Values::normal, false, 0, fc::mta::FastOOrder::source});
  report("mta-fast source order sanitize");
}

TEST_CASE("mta fast forward: a NaN input comes out as NaN, and the checks fail on it", "[mta-fast][mta-fast-sanitize]") {
  const FastCase c{1, 80, 1, 64, 3, 3};
  Inputs in = make_inputs(c, fresh_seed());
  const fm::Params p = params_of(c);
  const auto ref = fm::naive_forward<double>(in.q, in.k, in.v, in.w, p);
  in.v.data()[5] = std::numeric_limits<double>::quiet_NaN();  // key 0, dim 5: every row sees key 0
  const auto got = fc::mta::fast_forward(in.q.cast<float>(), in.k.cast<float>(), in.v.cast<float>(),
                                         in.w.cast<float>(), p, c.dtype);
  CHECK(std::isnan(got.o.data()[5]));
  CHECK(std::isnan(got.o.data()[(c.seq - 1) * c.dim + 5]));
  CHECK(std::isinf(fr::max_error_vs_max(got.o.data(), ref.o.data(), ref.o.numel())));
}

TEST_CASE("mta fast forward refuses what it does not take", "[mta-fast]") {
  fc::mta::FastShape s;
  s.seq = 10;
  CHECK_NOTHROW(fc::mta::check_fast_shape(s));
  auto refused = [&](auto change) {
    fc::mta::FastShape t = s;
    change(t);
    CHECK_THROWS_AS(fc::mta::check_fast_shape(t), std::invalid_argument);
  };
  refused([](fc::mta::FastShape& t) { t.head_dim = 96; });
  refused([](fc::mta::FastShape& t) { t.cq = 17; });
  refused([](fc::mta::FastShape& t) { t.ck = 17; });
  refused([](fc::mta::FastShape& t) { t.ck = 4; });
  refused([](fc::mta::FastShape& t) { t.seq = 0; });
  refused([](fc::mta::FastShape& t) { t.dtype = fr::Dtype::fp32; });
  refused([](fc::mta::FastShape& t) { t.linear_path = 2; });
  refused([](fc::mta::FastShape& t) { t.linear_path = -2; });
  refused([](fc::mta::FastShape& t) { t.linear_path = 1, t.ck = 5; });
  refused([](fc::mta::FastShape& t) { t.linear_path = 1, t.dtype = fr::Dtype::fp16; });
  // The source-order variant is compiled for bf16 at d = 64 only.
  CHECK_NOTHROW(fc::mta::check_fast_source_order(s));
  fc::mta::FastShape t = s;
  t.head_dim = 128;
  CHECK_THROWS_AS(fc::mta::check_fast_source_order(t), std::invalid_argument);
  t = s;
  t.dtype = fr::Dtype::fp16;
  CHECK_THROWS_AS(fc::mta::check_fast_source_order(t), std::invalid_argument);
  // The policy, stated in one place (fast_uses_linear_path): bf16, d = 64, ck <= min(cq, 3).
  s.cq = 3, s.ck = 3;
  CHECK(fc::mta::fast_uses_linear_path(s));
  s.cq = 1, s.ck = 1;
  CHECK(fc::mta::fast_uses_linear_path(s));
  s.ck = 3;
  CHECK_FALSE(fc::mta::fast_uses_linear_path(s));
  s.cq = 6, s.ck = 5;
  CHECK_FALSE(fc::mta::fast_uses_linear_path(s));
  s.ck = 3, s.head_dim = 128;
  CHECK_FALSE(fc::mta::fast_uses_linear_path(s));
  s.head_dim = 64, s.dtype = fr::Dtype::fp16;
  CHECK_FALSE(fc::mta::fast_uses_linear_path(s));
  s.linear_path = 0, s.dtype = fr::Dtype::bf16;
  CHECK_FALSE(fc::mta::fast_uses_linear_path(s));
}
