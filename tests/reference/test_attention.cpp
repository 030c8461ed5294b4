// Attention numerics: flash (FA1, FA2) equals naive, naive gradients equal finite differences,
// flash backward (two-kernel, atomic) equals naive backward, the D identity, fully masked rows,
// and the Triton walkthrough's NaN hazard in emulated fp16.
//
// Error metric everywhere: max |got − ref| / max |ref| over the tensor (max_error_vs_max), with
// the float64 naive result as ref. Tolerances: float64 1e-12, float32 1e-5.
#include <catch2/catch.hpp>

#include "flashlab/reference/attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <sstream>

using namespace flashlab::ref;

namespace {

struct Case {
  std::size_t B, Nq, Nk, H, d, Br, Bc;
  bool causal;
};

AttentionProblem make_cfg(const Case& c) {
  AttentionProblem cfg;
  cfg.batch = c.B;
  cfg.seq = c.Nq;
  cfg.seq_k = c.Nk == c.Nq ? 0 : c.Nk;
  cfg.heads = c.H;
  cfg.head_dim = c.d;
  cfg.Br = c.Br;
  cfg.Bc = c.Bc;
  cfg.causal = c.causal;
  return cfg;
}

// The awkward shapes: N = 1, N not a multiple of either block, Br ≠ Bc, d = 48 and 96, causal,
// batch and heads > 1, and N_q ≠ N_k (both ways, including fully masked rows under causal).
const Case kCases[] = {
    {1, 1, 1, 1, 16, 4, 4, false},    {1, 1, 1, 1, 16, 4, 4, true},     {1, 37, 37, 1, 48, 16, 8, false},
    {1, 37, 37, 1, 48, 16, 8, true},  {1, 50, 50, 1, 96, 8, 16, true},  {1, 50, 50, 2, 96, 8, 16, false},
    {2, 23, 23, 3, 32, 5, 7, true},   {1, 64, 64, 1, 16, 16, 16, true}, {1, 20, 13, 2, 8, 6, 4, true},
    {1, 9, 30, 1, 8, 4, 7, true},     {1, 9, 30, 1, 8, 4, 7, false},    {2, 13, 5, 1, 12, 3, 2, false},
};

std::string name(const Case& c) {
  std::ostringstream s;
  s << "B" << c.B << " Nq" << c.Nq << " Nk" << c.Nk << " H" << c.H << " d" << c.d << " Br" << c.Br << " Bc" << c.Bc
    << (c.causal ? " causal" : "");
  return s.str();
}

struct Inputs {
  Tensor<double> Q, K, V, dO;
};

Inputs random_inputs(const AttentionProblem& cfg, unsigned long long seed) {
  Inputs in{Tensor<double>(cfg.q_shape()), Tensor<double>(cfg.kv_shape()), Tensor<double>(cfg.kv_shape()),
            Tensor<double>(cfg.q_shape())};
  fill_normal(in.Q, seed);
  fill_normal(in.K, seed + 1);
  fill_normal(in.V, seed + 2);
  fill_normal(in.dO, seed + 3);
  return in;
}

template <typename T>
double err(const Tensor<T>& got, const Tensor<double>& ref) {
  REQUIRE(got.shape() == ref.shape());
  return max_error_vs_max(got.data(), ref.data(), ref.numel());
}
template <typename T>
double err(const std::vector<T>& got, const std::vector<double>& ref) {
  REQUIRE(got.size() == ref.size());
  return max_error_vs_max(got.data(), ref.data(), ref.size());
}

}  // namespace

TEST_CASE("attention: error metric never passes NaN and accepts equal infinities", "[attention]") {
  const double inf = std::numeric_limits<double>::infinity();
  const double ref[3] = {-inf, 2.0, -4.0};
  const double same[3] = {-inf, 2.0, -4.0};
  const double off[3] = {-inf, 2.0, -4.4};
  const double nan[3] = {-inf, std::nan(""), -4.0};
  const double wrong_inf[3] = {0.0, 2.0, -4.0};
  CHECK(max_error_vs_max(same, ref, 3) == 0.0);
  CHECK(max_error_vs_max(off, ref, 3) == Approx(0.1));  // |0.4| / max|ref| = 0.4 / 4
  CHECK(std::isinf(max_error_vs_max(nan, ref, 3)));
  CHECK(std::isinf(max_error_vs_max(wrong_inf, ref, 3)));
}

TEST_CASE("attention: FA2 and FA1 forward equal the naive forward (float64 and float32)", "[attention][forward]") {
  unsigned long long seed = 100;
  for (const auto& c : kCases) {
    INFO(name(c));
    const auto cfg = make_cfg(c);
    const auto in = random_inputs(cfg, seed += 10);
    const auto ref = naive_forward(cfg, in.Q, in.K, in.V);
    REQUIRE_FALSE(has_nan(ref.O.data(), ref.O.numel()));

    for (Algorithm v : {Algorithm::fa2_fwd, Algorithm::fa1_fwd}) {
      INFO(algorithm_name(v));
      const auto f64 = attention_forward(v, cfg, in.Q, in.K, in.V);
      CHECK(err(f64.O, ref.O) <= 1e-12);
      CHECK(err(f64.LSE, ref.LSE) <= 1e-12);
      const auto f32 = attention_forward(v, cfg, in.Q.cast<float>(), in.K.cast<float>(), in.V.cast<float>());
      CHECK(err(f32.O, ref.O) <= 1e-5);
      CHECK(err(f32.LSE, ref.LSE) <= 1e-5);
    }
  }
}

TEST_CASE("attention: LSE is base 2 of the natural-exp softmax denominator", "[attention][forward]") {
  AttentionProblem cfg;
  cfg.seq = 3;
  cfg.head_dim = 2;
  cfg.Br = cfg.Bc = 2;
  Tensor<double> Q(cfg.q_shape()), K(cfg.kv_shape()), V(cfg.kv_shape());
  fill_normal(Q, 1);
  fill_normal(K, 2);
  fill_normal(V, 3);
  const auto f = flash_forward_fa2(cfg, Q, K, V);
  const double scale = 1.0 / std::sqrt(2.0);
  for (std::size_t i = 0; i < 3; ++i) {
    double sum = 0.0;
    for (std::size_t j = 0; j < 3; ++j)
      sum += std::exp(scale * (Q.at(0, i, 0, 0) * K.at(0, j, 0, 0) + Q.at(0, i, 0, 1) * K.at(0, j, 0, 1)));
    CHECK(f.LSE[i] == Approx(std::log2(sum)).epsilon(1e-13));
  }
}

TEST_CASE("attention: a custom softmax scale is honoured by every variant", "[attention][forward]") {
  AttentionProblem cfg = make_cfg({1, 11, 11, 1, 8, 4, 3, true});
  cfg.scale = 0.9;
  const auto in = random_inputs(cfg, 7);
  const auto ref = naive_forward(cfg, in.Q, in.K, in.V);
  AttentionProblem unit = cfg;
  unit.scale = 0.0;
  CHECK(err(naive_forward(unit, in.Q, in.K, in.V).O, ref.O) > 1e-3);  // the scale matters
  CHECK(err(flash_forward_fa2(cfg, in.Q, in.K, in.V).O, ref.O) <= 1e-12);
  CHECK(err(flash_forward_fa1(cfg, in.Q, in.K, in.V).O, ref.O) <= 1e-12);
}

TEST_CASE("attention: naive gradients equal central finite differences (float64)", "[attention][backward]") {
  const Case cases[] = {{1, 5, 5, 2, 4, 2, 3, false}, {1, 5, 5, 1, 3, 2, 2, true}, {1, 4, 3, 1, 3, 2, 2, true}};
  for (const auto& c : cases) {
    INFO(name(c));
    const auto cfg = make_cfg(c);
    auto in = random_inputs(cfg, 42);
    const auto g = naive_backward(cfg, in.Q, in.K, in.V, in.dO);
    auto loss = [&] {
      const auto f = naive_forward(cfg, in.Q, in.K, in.V);
      double L = 0.0;
      for (std::size_t n = 0; n < f.O.numel(); ++n) L += f.O.data()[n] * in.dO.data()[n];
      return L;
    };
    const double h = 1e-5;
    auto fd = [&](Tensor<double>& X) {
      Tensor<double> G(X.shape());
      for (std::size_t n = 0; n < X.numel(); ++n) {
        const double x0 = X.data()[n];
        X.data()[n] = x0 + h;
        const double up = loss();
        X.data()[n] = x0 - h;
        const double down = loss();
        X.data()[n] = x0;
        G.data()[n] = (up - down) / (2 * h);
      }
      return G;
    };
    const auto dQ = fd(in.Q), dK = fd(in.K), dV = fd(in.V);
    CHECK(err(g.dQ, dQ) <= 1e-7);
    CHECK(err(g.dK, dK) <= 1e-7);
    CHECK(err(g.dV, dV) <= 1e-7);
  }
}

TEST_CASE("attention: D = rowsum(dP∘P) equals rowsum(dO∘O), and flash D equals both", "[attention][backward]") {
  for (const auto& c : kCases) {
    INFO(name(c));
    const auto cfg = make_cfg(c);
    const auto in = random_inputs(cfg, 300);
    const auto g = naive_backward(cfg, in.Q, in.K, in.V, in.dO);
    CHECK(err(g.D_from_O, g.D) <= 1e-12);
    const auto f = flash_forward_fa2(cfg, in.Q, in.K, in.V);
    const auto fb = flash_backward_two_kernel(cfg, in.Q, in.K, in.V, f.O, f.LSE, in.dO);
    CHECK(err(fb.D, g.D) <= 1e-12);
  }
}

TEST_CASE("attention: flash backward (two-kernel, atomic) equals naive backward", "[attention][backward]") {
  unsigned long long seed = 500;
  for (const auto& c : kCases) {
    INFO(name(c));
    const auto cfg = make_cfg(c);
    const auto in = random_inputs(cfg, seed += 10);
    const auto ref = naive_backward(cfg, in.Q, in.K, in.V, in.dO);
    const auto f = flash_forward_fa2(cfg, in.Q, in.K, in.V);
    const auto two = flash_backward_two_kernel(cfg, in.Q, in.K, in.V, f.O, f.LSE, in.dO);
    const auto atom = flash_backward_atomic(cfg, in.Q, in.K, in.V, f.O, f.LSE, in.dO);
    CHECK(err(two.dQ, ref.dQ) <= 1e-12);
    CHECK(err(two.dK, ref.dK) <= 1e-12);
    CHECK(err(two.dV, ref.dV) <= 1e-12);
    // atomic equals two-kernel
    CHECK(err(atom.dQ, two.dQ) <= 1e-12);
    CHECK(err(atom.dK, two.dK) <= 1e-12);
    CHECK(err(atom.dV, two.dV) <= 1e-12);

    const auto Qf = in.Q.cast<float>(), Kf = in.K.cast<float>(), Vf = in.V.cast<float>(), dOf = in.dO.cast<float>();
    const auto ff = flash_forward_fa2(cfg, Qf, Kf, Vf);
    const auto two32 = flash_backward_two_kernel(cfg, Qf, Kf, Vf, ff.O, ff.LSE, dOf);
    const auto atom32 = flash_backward_atomic(cfg, Qf, Kf, Vf, ff.O, ff.LSE, dOf);
    CHECK(err(two32.dQ, ref.dQ) <= 1e-5);
    CHECK(err(two32.dK, ref.dK) <= 1e-5);
    CHECK(err(two32.dV, ref.dV) <= 1e-5);
    CHECK(err(atom32.dQ, ref.dQ) <= 1e-5);
    CHECK(err(atom32.dK, ref.dK) <= 1e-5);
    CHECK(err(atom32.dV, ref.dV) <= 1e-5);
  }
}

TEST_CASE("attention: fully masked rows give O = 0, LSE = -inf, dQ = 0 and no NaN", "[attention][masking]") {
  // Causal, bottom-right aligned, N_q = 20 > N_k = 13: rows 0..6 see no key at all.
  const auto cfg = make_cfg({1, 20, 13, 2, 8, 6, 4, true});
  const auto in = random_inputs(cfg, 77);
  const std::size_t masked_rows = 7;
  auto check_fwd = [&](const AttentionForward<double>& f) {
    REQUIRE_FALSE(has_nan(f.O.data(), f.O.numel()));
    for (std::size_t h = 0; h < cfg.heads; ++h) {
      for (std::size_t r = 0; r < cfg.seq; ++r) {
        const double lse = f.LSE[h * cfg.seq + r];
        if (r < masked_rows) {
          CHECK(lse == -std::numeric_limits<double>::infinity());
          for (std::size_t k = 0; k < cfg.head_dim; ++k) CHECK(f.O.at(0, r, h, k) == 0.0);
        } else {
          CHECK(std::isfinite(lse));
        }
      }
    }
  };
  const auto naive = naive_forward(cfg, in.Q, in.K, in.V);
  const auto fa2 = flash_forward_fa2(cfg, in.Q, in.K, in.V);
  const auto fa1 = flash_forward_fa1(cfg, in.Q, in.K, in.V);
  check_fwd(naive);
  check_fwd(fa2);
  check_fwd(fa1);
  const auto gn = naive_backward(cfg, in.Q, in.K, in.V, in.dO);
  const auto g2 = flash_backward_two_kernel(cfg, in.Q, in.K, in.V, fa2.O, fa2.LSE, in.dO);
  const auto ga = flash_backward_atomic(cfg, in.Q, in.K, in.V, fa2.O, fa2.LSE, in.dO);
  for (const auto* g : {&gn, &g2, &ga}) {
    REQUIRE_FALSE(has_nan(g->dQ.data(), g->dQ.numel()));
    REQUIRE_FALSE(has_nan(g->dK.data(), g->dK.numel()));
    REQUIRE_FALSE(has_nan(g->dV.data(), g->dV.numel()));
    for (std::size_t r = 0; r < masked_rows; ++r)
      for (std::size_t k = 0; k < cfg.head_dim; ++k) CHECK(g->dQ.at(0, r, 0, k) == 0.0);
  }
}

TEST_CASE("attention: round_to_half rounds to nearest even and overflows to inf", "[attention][fp16]") {
  const double inf = std::numeric_limits<double>::infinity();
  CHECK(round_to_half(1.0) == 1.0);
  CHECK(round_to_half(65504.0) == 65504.0);
  CHECK(round_to_half(65519.0) == 65504.0);
  CHECK(round_to_half(65520.0) == inf);
  CHECK(round_to_half(-70000.0) == -inf);
  CHECK(round_to_half(std::ldexp(1.0, 20)) == inf);
  CHECK(round_to_half(1.0 + std::ldexp(1.0, -11)) == 1.0);                          // tie → even
  CHECK(round_to_half(1.0 + 3 * std::ldexp(1.0, -11)) == 1.0 + std::ldexp(1.0, -9));  // tie → even
  CHECK(round_to_half(0.1) == Approx(0.0999755859375).epsilon(1e-15));
  CHECK(round_to_half(std::ldexp(1.0, -25)) == 0.0);                                // subnormal tie → 0
  CHECK(round_to_half(3 * std::ldexp(1.0, -25)) == std::ldexp(1.0, -23));
  CHECK(std::isnan(round_to_half(std::nan(""))));
}

// ForwardOptions::round_p (the floor of kernels that feed 16-bit P to their tensor cores): with the
// identity nothing changes; with fp16 rounding l_i, hence LSE, keeps the unrounded P_ij, and each O
// entry moves by at most the rounding of its P_ij: 2^-11 · Σ_j P_ij |V_jc| / l_i, plus 2^-25 a key
// for P_ij below fp16's normal range. Every awkward shape, fully masked rows among them.
TEST_CASE("attention: FA2 with P rounded keeps LSE and moves O by at most P's rounding", "[attention][forward]") {
  for (const auto& c : kCases) {
    INFO(name(c));
    const auto cfg = make_cfg(c);
    const auto in = random_inputs(cfg, 211);
    const auto plain = flash_forward_fa2(cfg, in.Q, in.K, in.V);
    ForwardOptions same;
    same.round_p = [](double p) { return p; };
    const auto ident = flash_forward_fa2(cfg, in.Q, in.K, in.V, same);
    ForwardOptions half;
    half.round_p = &round_to_half;
    const auto rounded = flash_forward_fa2(cfg, in.Q, in.K, in.V, half);
    Tensor<double> absV(cfg.kv_shape());
    double v_max = 0.0;
    for (std::size_t k = 0; k < absV.numel(); ++k) {
      absV.data()[k] = std::abs(in.V.data()[k]);
      v_max = std::max(v_max, absV.data()[k]);
    }
    const auto pv = naive_forward(cfg, in.Q, in.K, absV);  // Σ_j P_ij |V_jc| / l_i
    std::size_t over = 0, moved = 0, ident_diff = 0;
    for (std::size_t k = 0; k < plain.O.numel(); ++k) {
      const double delta = std::abs(rounded.O.data()[k] - plain.O.data()[k]);
      over += !(delta <= std::ldexp(pv.O.data()[k], -11) + std::ldexp(double(cfg.n_k()) * v_max, -25) + 1e-15);
      moved += delta > 0.0;
      ident_diff += ident.O.data()[k] != plain.O.data()[k];
    }
    CHECK(over == 0);
    CHECK(ident_diff == 0);
    if (c.Nk >= 8) CHECK(moved > 0);
    for (std::size_t r = 0; r < plain.LSE.size(); ++r) {
      const bool equal = rounded.LSE[r] == plain.LSE[r] && ident.LSE[r] == plain.LSE[r];
      CHECK(equal);
    }
  }
}

TEST_CASE("attention: the NaN hazard — no KV mask in fp16 arithmetic gives NaN, the mask prevents it",
          "[attention][fp16][masking]") {
  // The Triton walkthrough "The NaN Hazard": N_k = 5 with Bc = 4 leaves 3 zero-padded key rows in the last tile.
  // Every score is about −20 in base 2, so LSE ≈ −17.7 and an unmasked padded score 0 gives
  // P = 2^(0 − LSE) ≈ 2^17.7 > 65504: Inf in fp16, and dQ += dS·K_pad = Inf·0 = NaN.
  AttentionProblem cfg = make_cfg({1, 6, 6, 1, 16, 4, 4, false});
  cfg.seq_k = 5;
  Tensor<double> Q(cfg.q_shape()), K(cfg.kv_shape()), V(cfg.kv_shape()), dO(cfg.q_shape());
  fill_normal(Q, 11, 0.05);
  fill_normal(K, 12, 0.05);
  fill_normal(V, 13);
  fill_normal(dO, 14);
  for (std::size_t n = 0; n < Q.numel(); ++n) Q.data()[n] -= 3.5;  // q·k ≈ −3.5·16 = −56
  for (std::size_t n = 0; n < K.numel(); ++n) K.data()[n] += 1.0;
  const auto f = flash_forward_fa2(cfg, Q, K, V);
  for (double lse : f.LSE) REQUIRE(lse < -16.0);  // 2^16 already exceeds the fp16 range
  const auto ref = naive_backward(cfg, Q, K, V, dO);

  BackwardOptions half_masked{true, true}, half_unmasked{false, true}, exact_unmasked{false, false};
  for (int atomic = 0; atomic < 2; ++atomic) {
    INFO((atomic ? "atomic" : "two-kernel"));
    auto run = [&](BackwardOptions o) {
      return atomic ? flash_backward_atomic(cfg, Q, K, V, f.O, f.LSE, dO, o)
                    : flash_backward_two_kernel(cfg, Q, K, V, f.O, f.LSE, dO, o);
    };
    const auto bad = run(half_unmasked);
    CHECK(has_nan(bad.dQ.data(), bad.dQ.numel()));
    const auto good = run(half_masked);
    CHECK_FALSE(has_nan(good.dQ.data(), good.dQ.numel()));
    CHECK_FALSE(has_nan(good.dK.data(), good.dK.numel()));
    CHECK_FALSE(has_nan(good.dV.data(), good.dV.numel()));
    CHECK(err(good.dQ, ref.dQ) <= 3e-2);  // fp16 emulation is sane, just coarse
    CHECK(err(good.dV, ref.dV) <= 3e-2);
    // Without the overflow the missing mask is harmless: 2^17.7 is finite and K_pad = 0.
    const auto exact = run(exact_unmasked);
    CHECK_FALSE(has_nan(exact.dQ.data(), exact.dQ.numel()));
    CHECK(err(exact.dQ, ref.dQ) <= 1e-12);
  }
}

TEST_CASE("attention: wrong operand shapes and bad configurations are refused with a message", "[attention][errors]") {
  AttentionProblem cfg = make_cfg({1, 8, 8, 1, 4, 4, 4, false});
  Tensor<double> Q(cfg.q_shape()), K(Shape{1, 7, 1, 4}), V(cfg.kv_shape());
  REQUIRE_THROWS_WITH(flash_forward_fa2(cfg, Q, K, V), Catch::Contains("K has shape [1, 7, 1, 4]"));
  AttentionProblem bad = cfg;
  bad.Bc = 0;
  REQUIRE_THROWS_WITH(bad.validate(), Catch::Contains("Bc = 0 must be at least 1"));
  REQUIRE_THROWS_AS(attention_forward(Algorithm::bwd_atomic, cfg, Q, Tensor<double>(cfg.kv_shape()), V),
                    std::invalid_argument);
}

TEST_CASE("attention: random shapes — every variant equals naive and counts equal the formulas", "[attention][random]") {
  // 40 configurations drawn from a fixed seed: N_q, N_k in 1..70, d in 1..100, Br, Bc in 1..24,
  // B, H in 1..2, causal or not. Forward and backward in float64 against the naive float64 result.
  std::mt19937_64 rng(20261122);
  auto pick = [&](std::size_t lo, std::size_t hi) { return lo + std::size_t(rng() % (hi - lo + 1)); };
  for (int trial = 0; trial < 40; ++trial) {
    const std::size_t nq = pick(1, 70);
    const Case c{pick(1, 2), nq, rng() % 3 == 0 ? pick(1, 70) : nq, pick(1, 2), pick(1, 100), pick(1, 24), pick(1, 24),
                 rng() % 2 == 0};
    INFO("trial " << trial << ": " << name(c));
    const auto cfg = make_cfg(c);
    const auto in = random_inputs(cfg, 7000 + trial);
    const auto ref = naive_forward(cfg, in.Q, in.K, in.V);
    const auto gref = naive_backward(cfg, in.Q, in.K, in.V, in.dO);
    const auto fa2 = flash_forward_fa2(cfg, in.Q, in.K, in.V);
    const auto fa1 = flash_forward_fa1(cfg, in.Q, in.K, in.V);
    CHECK(err(fa2.O, ref.O) <= 1e-12);
    CHECK(err(fa2.LSE, ref.LSE) <= 1e-12);
    CHECK(err(fa1.O, ref.O) <= 1e-12);
    CHECK(err(fa1.LSE, ref.LSE) <= 1e-12);
    const auto two = flash_backward_two_kernel(cfg, in.Q, in.K, in.V, fa2.O, fa2.LSE, in.dO);
    const auto atom = flash_backward_atomic(cfg, in.Q, in.K, in.V, fa2.O, fa2.LSE, in.dO);
    CHECK(err(two.dQ, gref.dQ) <= 1e-12);
    CHECK(err(two.dK, gref.dK) <= 1e-12);
    CHECK(err(two.dV, gref.dV) <= 1e-12);
    CHECK(err(atom.dQ, two.dQ) <= 1e-12);
    CHECK(err(atom.dK, two.dK) <= 1e-12);
    CHECK(err(atom.dV, two.dV) <= 1e-12);
    CHECK(err(gref.D_from_O, gref.D) <= 1e-12);
    auto same = [](const Traffic& counted, const Traffic& formula, const char* what) {
      std::string why;
      const bool ok = same_counts(counted, formula, &why);
      INFO(what << ": " << why);
      CHECK(ok);
    };
    same(fa2.traffic, attention_traffic_formula(Algorithm::fa2_fwd, cfg), "fa2");
    same(fa1.traffic, attention_traffic_formula(Algorithm::fa1_fwd, cfg), "fa1");
    same(ref.traffic, attention_traffic_formula(Algorithm::naive_fwd, cfg), "naive");
    same(gref.traffic, attention_traffic_formula(Algorithm::naive_bwd, cfg), "naive bwd");
    same(two.traffic, attention_traffic_formula(Algorithm::bwd_two_kernel, cfg), "two-kernel");
    same(atom.traffic, attention_traffic_formula(Algorithm::bwd_atomic, cfg), "atomic");
  }
}
