// The fast MTA backward and split-K decode (flashlab/cuda/mta_fast_backward.hpp) against the
// float64 reference (ref::mta::naive_forward / naive_backward / flash_infer, double).
//
// Inputs: fresh normal Q, K, V, dO rounded to bf16 (or fp16) first, kernels W random fp32
// (standard deviation 1.5/√(cq·ck), as the clear tests); the reference gets exactly those values
// in float64. O and LSE are the reference forward's, O rounded to the dtype and LSE converted to
// base 2, so the backward is tested on its own (the fast forward has its own tests). Outputs and
// the workspace are poisoned with NaN by the host API. Metric: max|got − ref| / max|ref| (NaN →
// +inf, fails); dW relative to the scale of its terms (mta_test_util.hpp). Tolerance: an error
// passes when it is within 2× the error of merely rounding the float64 result to the dtype (the
// rounding floor) or within 1e-2; dW (fp32 output) within 1e-2 of its term scale.
// Shapes: N = 1, N below one tile, ragged N in both tilings, 1 × 1 with W = 1 (also held to plain
// causal attention), 3 × 3, 6 × 11, 11 × 11, 16 × 15, d = 64 and 128, batch and heads > 1, fp16.
// The decode: O and its base-2 LSE of the last 16 rows (LSE absolute within 1e-4 · max(1,
// max|LSE|), as the forward's tests), through the kernel sizes compiled in (3 × 3, 6 × 11,
// 11 × 11) and the general one (1 × 1, 16 × 15), several key tiles per split, Q entries ±800 (a
// nearly one-hot softmax), a NaN in V that must come out as NaN.
// Tags [mta-fast-bwd-sanitize] and [mta-fast-decode-sanitize]: the small shapes, for
// compute-sanitizer.
#include <catch2/catch.hpp>

// GCC 12 at -O2/-O3 reports a false -Wrestrict inside std::string operator+ (GCC bug 105329).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wrestrict"
#endif

#include "flashlab/cuda/mta_fast_backward.hpp"
#include "flashlab/reference/attention.hpp"
#include "flashlab/reference/mta.hpp"
#include "gpu_test_util.hpp"
#include "mta_test_util.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace fc = flashlab::cuda;
namespace fr = flashlab::ref;
namespace fm = flashlab::ref::mta;
namespace ft = flashlab::test;

namespace {

constexpr double kTolRel = 1e-2;   // 16-bit gradients, or 2× their rounding floor if that is larger
constexpr double kTolDw = 1e-2;    // fp32 dW relative to the scale of its terms
constexpr double kLog2e = 1.4426950408889634;

struct Case {
  std::size_t batch, seq, heads, dim, cq, ck;
  fr::Dtype dtype = fr::Dtype::bf16;
  bool unit_kernel = false;  // W = 1 (with 1 × 1: plain causal attention)
  bool large_q = false;      // every Q entry ±800 (scores of ~1e3: a nearly one-hot softmax)
};

std::string label(const Case& c) {
  return std::string(c.dtype == fr::Dtype::bf16 ? "bf16" : "fp16") + " B=" + std::to_string(c.batch) +
         " N=" + std::to_string(c.seq) + " H=" + std::to_string(c.heads) + " d=" + std::to_string(c.dim) +
         " W=" + std::to_string(c.cq) + "x" + std::to_string(c.ck) + (c.unit_kernel ? " (W=1)" : "") +
         (c.large_q ? " +-800" : "");
}

struct Inputs {
  fr::Shape shape;
  fm::Params p;
  fc::mta::FastShape fast;  // the same problem as the fast kernels take it
  std::vector<std::uint16_t> q, k, v, d_o;
  std::vector<float> w;
  fr::Tensor<double> qd, kd, vd, dod;
  fm::Weights<double> wd;
};

Inputs make_inputs(const Case& c, unsigned long long seed) {
  Inputs in;
  in.shape = fr::Shape{c.batch, c.seq, c.heads, c.dim};
  in.p.cq = c.cq;
  in.p.ck = c.ck;
  in.fast.batch = int(c.batch);
  in.fast.seq = int(c.seq);
  in.fast.heads = int(c.heads);
  in.fast.head_dim = int(c.dim);
  in.fast.cq = int(c.cq);
  in.fast.ck = int(c.ck);
  in.fast.dtype = c.dtype;
  fr::Tensor<double> q0(in.shape), k0(in.shape), v0(in.shape), do0(in.shape);
  fr::fill_normal(q0, seed);
  fr::fill_normal(k0, seed + 1);
  fr::fill_normal(v0, seed + 2);
  fr::fill_normal(do0, seed + 3);
  if (c.large_q)
    for (std::size_t i = 0; i < q0.numel(); ++i) q0.data()[i] = q0.data()[i] < 0 ? -800.0 : 800.0;
  in.qd = in.kd = in.vd = in.dod = fr::Tensor<double>(in.shape);
  in.q = ft::round_to_16(q0, c.dtype, in.qd);
  in.k = ft::round_to_16(k0, c.dtype, in.kd);
  in.v = ft::round_to_16(v0, c.dtype, in.vd);
  in.d_o = ft::round_to_16(do0, c.dtype, in.dod);
  const fm::Weights<float> wf =
      fm::random_weights(c.heads, c.cq, c.ck, seed + 4, 1.5 / std::sqrt(double(c.cq * c.ck))).cast<float>();
  in.w.assign(wf.data(), wf.data() + wf.numel());
  if (c.unit_kernel) in.w.assign(in.w.size(), 1.f);
  in.wd = fm::Weights<double>(c.heads, c.cq, c.ck);
  for (std::size_t t = 0; t < in.w.size(); ++t) in.wd.data()[t] = in.w[t];
  return in;
}

// Per quantity (dQ, dK, dV, dW, O), the case with the largest error / tolerance of a test case:
// reported as "[group] worst dQ error E (tolerance T), worst dK error …" (the format
// cuda/bench/measure.sh tabulates).
std::map<std::string, std::pair<double, double>> g_worst;
void see(const std::string& quantity, double err, double tol) {
  auto& w = g_worst[quantity];
  if (w.second == 0.0 || !(err / tol <= w.first / w.second)) w = {err, tol};
}

// Error of a 16-bit gradient, checked against max(2 × rounding floor, 1e-2).
void check_grad(const char* name, const std::vector<std::uint16_t>& got, const fr::Tensor<double>& want, fr::Dtype dt,
                const std::string& where) {
  REQUIRE(got.size() == want.numel());
  const double err = ft::error_16(got, want.data(), dt), floor = ft::rounding_floor(want.data(), want.numel(), dt);
  const double tol = std::max(2.0 * floor, kTolRel);
  std::printf("  %-44s %-3s error %.3e (rounding floor %.1e, tolerance %.1e)\n", where.c_str(), name, err, floor, tol);
  see(std::string(name).substr(0, std::string(name).find(' ')), err, tol);
  INFO(where << ": " << name << " error " << err << ", rounding floor " << floor);
  CHECK(err <= tol);
}

void check_backward(const Case& c) {
  const unsigned long long seed = ft::fresh_seed();
  const std::string where = label(c);
  INFO(where << " seed=" << seed << " (rerun with FLASHLAB_TEST_SEED)");
  const Inputs in = make_inputs(c, seed);

  // The forward's O (rounded to the dtype) and base-2 LSE ([B, H, N]) from the reference.
  const auto fwd = fm::naive_forward<double>(in.qd, in.kd, in.vd, in.wd, in.p);
  fr::Tensor<double> o_rounded(in.shape);
  const std::vector<std::uint16_t> o16 = ft::round_to_16(fwd.o, c.dtype, o_rounded);
  std::vector<float> lse2(c.batch * c.heads * c.seq);
  for (std::size_t b = 0; b < c.batch; ++b)
    for (std::size_t n = 0; n < c.seq; ++n)
      for (std::size_t h = 0; h < c.heads; ++h)
        lse2[(b * c.heads + h) * c.seq + n] = float(fwd.lse.data()[(b * c.seq + n) * c.heads + h] * kLog2e);

  const auto want = fm::naive_backward<double>(in.qd, in.kd, in.vd, in.wd, in.dod, in.p);
  const auto got = fc::mta::fast_backward(in.fast, in.q, in.k, in.v, in.w, o16, in.d_o, lse2);
  check_grad("dQ", got.dQ, want.dq, c.dtype, where);
  check_grad("dK", got.dK, want.dk, c.dtype, where);
  check_grad("dV", got.dV, want.dv, c.dtype, where);

  REQUIRE(got.dW.size() == want.dw.numel());
  const double terms = ft::mta_dw_term_scale(in.qd, in.kd, in.vd, in.dod, in.wd, in.p);
  const double err_dw = ft::mta_dw_error(got.dW.data(), want.dw.data(), got.dW.size(), terms);
  std::printf("  %-44s dW  error %.3e of its term scale (tolerance %.0e)\n", where.c_str(), err_dw, kTolDw);
  see("dW", err_dw, kTolDw);
  INFO("dW error " << err_dw << " relative to its term scale " << terms);
  CHECK(err_dw <= kTolDw);

  if (c.unit_kernel && c.cq == 1 && c.ck == 1) {
    // A 1 × 1 kernel of weight 1 is plain causal attention: hold the gradients to that reference too.
    const auto plain = fr::naive_backward<double>(ft::plain_causal_problem(c), in.qd, in.kd, in.vd, in.dod);
    check_grad("dQ vs plain attention", got.dQ, plain.dQ, c.dtype, where);
    check_grad("dK vs plain attention", got.dK, plain.dK, c.dtype, where);
    check_grad("dV vs plain attention", got.dV, plain.dV, c.dtype, where);
  }
}

constexpr double kTolLse = 1e-4;  // base-2 LSE, absolute, over max(1, max|LSE|)

// The decode's base-2 LSE [B, H, R] against the reference's natural-log LSE [B, N, H] of the
// last R rows: absolute error over max(1, max|LSE|); NaN → +inf.
double decode_lse_error(const std::vector<float>& lse2, const fr::Tensor<double>& ref, std::size_t rows) {
  const fr::Shape& sh = ref.shape();
  double ref_max = 1.0, worst = 0.0;
  for (std::size_t i = 0; i < ref.numel(); ++i) ref_max = std::max(ref_max, std::abs(ref.data()[i]));
  for (std::size_t b = 0; b < sh.batch; ++b)
    for (std::size_t h = 0; h < sh.heads; ++h)
      for (std::size_t r = 0; r < rows; ++r) {
        const double got = double(lse2[(b * sh.heads + h) * rows + r]) / kLog2e;
        const double e = std::abs(got - ref.data()[(b * sh.seq + sh.seq - rows + r) * sh.heads + h]);
        if (!(e <= worst)) worst = std::isnan(e) ? std::numeric_limits<double>::infinity() : e;
      }
  return worst / ref_max;
}

void check_decode(const Case& c) {
  const unsigned long long seed = ft::fresh_seed();
  const std::string where = label(c) + " decode";
  INFO(where << " seed=" << seed << " (rerun with FLASHLAB_TEST_SEED)");
  const Inputs in = make_inputs(c, seed);
  const std::size_t rows = std::min<std::size_t>(c.seq, fc::mta::kDecodeRows);
  const auto got = fc::mta::fast_decode(in.fast, in.q, in.k, in.v, in.w);
  REQUIRE(got.O.size() == c.batch * rows * c.heads * c.dim);
  REQUIRE(got.LSE.size() == c.batch * c.heads * rows);

  // All R rows against the naive forward; the last row also against the reference's split-K
  // inference path (flash_infer: the output of token N − 1).
  const auto fwd = fm::naive_forward<double>(in.qd, in.kd, in.vd, in.wd, in.p);
  fr::Tensor<double> want(fr::Shape{c.batch, rows, c.heads, c.dim});
  for (std::size_t b = 0; b < c.batch; ++b)
    for (std::size_t h = 0; h < c.heads; ++h)
      want.head(b, h) = fwd.o.head(b, h).bottomRows(Eigen::Index(rows));
  check_grad("O", got.O, want, c.dtype, where);

  const double err_lse = decode_lse_error(got.LSE, fwd.lse, rows);
  std::printf("  %-44s LSE error %.3e of max(1, max|LSE|) (tolerance %.0e)\n", where.c_str(), err_lse, kTolLse);
  see("LSE", err_lse, kTolLse);
  INFO(where << ": LSE error " << err_lse);
  CHECK(err_lse <= kTolLse);

  fm::Params infer_params = in.p;
  infer_params.block = 64;
  infer_params.splits = 3;
  const auto last = fm::flash_infer<double>(in.qd, in.kd, in.vd, in.wd, infer_params);
  std::vector<std::uint16_t> got_last;
  for (std::size_t b = 0; b < c.batch; ++b)
    for (std::size_t h = 0; h < c.heads; ++h)
      for (std::size_t e = 0; e < c.dim; ++e)
        got_last.push_back(got.O[((b * rows + rows - 1) * c.heads + h) * c.dim + e]);
  check_grad("O[N-1] vs flash_infer", got_last, last, c.dtype, where);
}

void report(const char* name) {
  std::string line = "[" + std::string(name) + "]";
  const char* sep = " ";
  for (const auto& [quantity, w] : g_worst) {
    char part[96];
    std::snprintf(part, sizeof part, "%sworst %s error %.3e (tolerance %.1e)", sep, quantity.c_str(), w.first, w.second);
    line += part;
    sep = ", ";
  }
  std::printf("%s\n", line.c_str());
  g_worst.clear();
}

}  // namespace

TEST_CASE("mta fast backward: small shapes equal the float64 reference", "[mta-fast-bwd][mta-fast-bwd-sanitize]") {
  check_backward({1, 1, 1, 64, 3, 3});
  check_backward({1, 1, 1, 128, 1, 1});
  check_backward({1, 5, 2, 64, 3, 3});
  check_backward({1, 29, 1, 64, 1, 1, fr::Dtype::bf16, true});  // plain causal attention
  check_backward({2, 70, 2, 64, 6, 11});
  check_backward({1, 40, 1, 128, 16, 15});
  report("mta fast bwd small");
}

TEST_CASE("mta fast backward: 1x1 to 16x15 kernels over several tiles, d = 64 and 128", "[mta-fast-bwd]") {
  for (std::size_t d : {64, 128}) {
    check_backward({1, 300, 2, d, 3, 3});   // Br = 60, Bc = 124: 5 query tiles, 3 key tiles, ragged
    check_backward({1, 250, 1, d, 6, 11});  // Br = 54, Bc = 108
    check_backward({1, 257, 1, d, 11, 11});
    check_backward({1, 250, 1, d, 16, 15});  // Br = 34, Bc = 100
    check_backward({1, 200, 2, d, 1, 1, fr::Dtype::bf16, true});
  }
  check_backward({1, 190, 2, 64, 3, 3, fr::Dtype::fp16});
  check_backward({1, 130, 1, 128, 6, 11, fr::Dtype::fp16});
  report("mta fast bwd kernels");
}

TEST_CASE("mta fast decode: small shapes equal the float64 reference", "[mta-fast-decode][mta-fast-decode-sanitize]") {
  check_decode({1, 1, 1, 128, 3, 3});
  check_decode({1, 5, 2, 128, 3, 3});
  check_decode({1, 16, 1, 64, 16, 15});
  check_decode({2, 40, 2, 128, 6, 11});
  check_decode({1, 70, 1, 64, 11, 11});  // two tiles: the halo across a tile boundary
  check_decode({1, 100, 2, 128, 1, 1, fr::Dtype::bf16, true});
  report("mta fast decode small");
}

TEST_CASE("mta fast decode: the last 16 rows equal the float64 reference", "[mta-fast-decode]") {
  check_decode({1, 1000, 2, 128, 3, 3});
  check_decode({1, 777, 1, 128, 11, 11});
  check_decode({1, 600, 1, 64, 16, 15, fr::Dtype::fp16});
  check_decode({1, 333, 1, 128, 1, 1, fr::Dtype::bf16, true});
  // Many heads: fewer splits per head than key tiles (one wave of blocks on the device), so a
  // split streams several tiles and its two stages alternate.
  check_decode({1, 200, 96, 64, 6, 11});
  check_decode({1, 300, 64, 128, 11, 11});
  for (std::size_t d : {64, 128}) {  // ±800: scores of ~1e3, errors of Ŝ show in a one-hot P
    check_decode({1, 700, 2, d, 11, 11, fr::Dtype::bf16, false, true});
    check_decode({1, 500, 1, d, 3, 3, fr::Dtype::bf16, false, true});
    check_decode({1, 300, 1, d, 16, 15, fr::Dtype::bf16, false, true});
  }
  report("mta fast decode");
}

TEST_CASE("mta fast decode: a NaN input comes out as NaN, and the checks fail on it",
          "[mta-fast-decode][mta-fast-decode-sanitize]") {
  for (const Case c : {Case{1, 200, 1, 64, 11, 11}, Case{1, 200, 1, 64, 5, 3}}) {
    INFO(label(c));
    Inputs in = make_inputs(c, ft::fresh_seed());
    const auto want = fm::naive_forward<double>(in.qd, in.kd, in.vd, in.wd, in.p);
    // Key 0, dim 5 of V: every row sees key 0, so column 5 of every output row is NaN.
    in.v[5] = c.dtype == fr::Dtype::bf16 ? std::uint16_t(0x7fc0) : std::uint16_t(0x7e00);
    const auto got = fc::mta::fast_decode(in.fast, in.q, in.k, in.v, in.w);
    for (std::size_t r = 0; r < fc::mta::kDecodeRows; ++r) {
      const std::uint16_t bits = got.O[r * c.dim + 5];
      CHECK(((bits & 0x7f80) == 0x7f80 && (bits & 0x7f) != 0));  // a bf16 NaN (the cases are bf16)
    }
    fr::Tensor<double> last(fr::Shape{1, fc::mta::kDecodeRows, 1, c.dim});
    last.head(0, 0) = want.o.head(0, 0).bottomRows(Eigen::Index(fc::mta::kDecodeRows));
    CHECK(std::isinf(ft::error_16(got.O, last.data(), c.dtype)));
  }
}

TEST_CASE("mta fast backward and decode refuse what they do not support", "[mta-fast-bwd][errors]") {
  fc::mta::FastShape ok;
  ok.seq = 16;
  ok.cq = 3;
  ok.ck = 3;
  const std::vector<std::uint16_t> t(16 * 64), short_t(10);
  const std::vector<float> w(9), lse(16);
  fc::mta::FastShape wide_d = ok;
  wide_d.head_dim = 96;
  CHECK_THROWS_AS(fc::mta::fast_backward(wide_d, t, t, t, w, t, t, lse), std::invalid_argument);
  fc::mta::FastShape even = ok;
  even.ck = 4;
  CHECK_THROWS_AS(fc::mta::fast_decode(even, t, t, t, w), std::invalid_argument);
  CHECK_THROWS_AS(fc::mta::fast_decode(ok, t, short_t, t, w), std::invalid_argument);
  fc::mta::FastShape wide = ok;
  wide.dtype = fr::Dtype::fp32;
  CHECK_THROWS_AS(fc::mta::fast_backward(wide, t, t, t, w, t, t, lse), std::invalid_argument);
  // A wrong input size is named, not read out of bounds.
  try {
    fc::mta::fast_backward(ok, t, t, t, w, t, short_t, lse);
    FAIL("a 10-element dO was accepted");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("dO") != std::string::npos);
  }
}
