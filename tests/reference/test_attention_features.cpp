// Attention as models call it, against an independent float64 oracle written here: grouped K/V
// (H/H_kv = 1, 4, 32), N_q ≠ N_k with the causal diagonal bottom-right, packed variable-length
// sequences (lengths 0 and 1 among them), sliding windows (wider than N too), head dims 64, 96,
// 128, 256, ±800 inputs, rows that see no key, and NaN inputs. Every forward (naive, FA1, FA2)
// and backward (naive, two-kernel, atomic) is checked, and the traffic its loops counted equals
// the closed-form formula.
//
// The oracle shares nothing with the library but the tensor layout: its own mask rule, natural
// exp, one query row at a time, gradients from the textbook formulas. Error metric:
// max_error_vs_max (max |got − ref| / max |ref|). Tolerances: float64 1e-12, float32 1e-5, both
// against the float64 oracle; the ±800 case scales the float64 one by the logit bound.
#include <catch2/catch.hpp>

#include "flashlab/reference/attention.hpp"
#include "flashlab/reference/attention_traffic.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

using namespace flashlab::ref;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// One test problem, in the test's own terms.
struct Spec {
  std::vector<std::size_t> lq, lk;  // per sequence (all equal when dense)
  bool packed = false;
  std::size_t H = 1, Hkv = 1, d = 8, Br = 4, Bc = 4;
  bool causal = false;
  long long left = -1, right = -1;

  // This problem with another mask and tiles.
  Spec masked(bool c, std::size_t br, std::size_t bc, long long l = -1, long long r = -1) const {
    Spec s = *this;
    s.causal = c;
    s.Br = br;
    s.Bc = bc;
    s.left = l;
    s.right = r;
    return s;
  }
};

Spec dense(std::size_t B, std::size_t nq, std::size_t nk, std::size_t H, std::size_t Hkv, std::size_t d) {
  Spec s;
  s.lq.assign(B, nq);
  s.lk.assign(B, nk);
  s.H = H;
  s.Hkv = Hkv;
  s.d = d;
  return s;
}

Spec packed(std::vector<std::size_t> lq, std::vector<std::size_t> lk, std::size_t H, std::size_t Hkv, std::size_t d) {
  Spec s;
  s.lq = std::move(lq);
  s.lk = std::move(lk);
  s.packed = true;
  s.H = H;
  s.Hkv = Hkv;
  s.d = d;
  return s;
}

std::string describe(const Spec& s) {
  std::ostringstream o;
  o << (s.packed ? "packed" : "dense") << " lq";
  for (auto v : s.lq) o << " " << v;
  o << " lk";
  for (auto v : s.lk) o << " " << v;
  o << " H" << s.H << " Hkv" << s.Hkv << " d" << s.d << " Br" << s.Br << " Bc" << s.Bc << (s.causal ? " causal" : "")
    << " window " << s.left << "," << s.right;
  return o.str();
}

std::vector<std::int32_t> prefix(const std::vector<std::size_t>& lens) {
  std::vector<std::int32_t> cu{0};
  for (auto l : lens) cu.push_back(cu.back() + std::int32_t(l));
  return cu;
}

AttentionProblem problem_of(const Spec& s) {
  AttentionProblem cfg;
  cfg.heads = s.H;
  cfg.heads_kv = s.Hkv;
  cfg.head_dim = s.d;
  cfg.Br = s.Br;
  cfg.Bc = s.Bc;
  cfg.causal = s.causal;
  cfg.window_left = s.left;
  cfg.window_right = s.right;
  if (s.packed) {
    cfg.set_packed(PackedSequences(prefix(s.lq), prefix(s.lk)));
  } else {
    cfg.batch = s.lq.size();
    cfg.seq = s.lq[0];
    cfg.seq_k = s.lk[0];
  }
  cfg.validate();
  return cfg;
}

// ---- the oracle ------------------------------------------------------------------------------

// Query i of a sequence with lq queries and lk keys sees key j (the rule written out anew).
bool sees(long long i, long long j, long long lq, long long lk, const Spec& s) {
  if (j < 0 || j >= lk) return false;
  const long long diagonal = i + lk - lq;
  if (s.causal && j > diagonal) return false;
  if (s.left >= 0 && j < diagonal - s.left) return false;
  if (s.right >= 0 && j > diagonal + s.right) return false;
  return true;
}

// Where things are in the tensors, computed from the spec alone.
struct Layout {
  const Spec& s;
  std::vector<std::size_t> q0, k0;  // first row of each sequence along the token axis
  std::size_t q_rows = 0, k_rows = 0, batch = 1;
  explicit Layout(const Spec& spec) : s(spec) {
    for (std::size_t b = 0; b < s.lq.size(); ++b) {
      q0.push_back(s.packed ? q_rows : 0);
      k0.push_back(s.packed ? k_rows : 0);
      q_rows += s.lq[b];
      k_rows += s.lk[b];
    }
    if (!s.packed) {
      batch = s.lq.size();
      q_rows = s.lq[0];
      k_rows = s.lk[0];
    }
  }
  Shape q_shape() const { return {batch, q_rows, s.H, s.d}; }
  Shape kv_shape() const { return {batch, k_rows, s.Hkv, s.d}; }
  std::size_t q(std::size_t b, std::size_t i, std::size_t h) const {
    const std::size_t tb = s.packed ? 0 : b;
    return ((tb * q_rows + q0[b] + i) * s.H + h) * s.d;
  }
  std::size_t k(std::size_t b, std::size_t j, std::size_t hk) const {
    const std::size_t tb = s.packed ? 0 : b;
    return ((tb * k_rows + k0[b] + j) * s.Hkv + hk) * s.d;
  }
  std::size_t stat(std::size_t b, std::size_t h, std::size_t i) const {
    const std::size_t tb = s.packed ? 0 : b;
    return (tb * s.H + h) * q_rows + q0[b] + i;
  }
};

struct Oracle {
  std::vector<double> O, LSE, dQ, dK, dV;
};

Oracle oracle(const Spec& s, double scale, const Tensor<double>& Q, const Tensor<double>& K, const Tensor<double>& V,
              const Tensor<double>& dO) {
  const Layout L(s);
  Oracle r{std::vector<double>(Q.numel(), 0.0), std::vector<double>(L.batch * s.H * L.q_rows, 0.0),
           std::vector<double>(Q.numel(), 0.0), std::vector<double>(K.numel(), 0.0),
           std::vector<double>(K.numel(), 0.0)};
  const std::size_t d = s.d, group = s.H / s.Hkv;
  for (std::size_t b = 0; b < s.lq.size(); ++b) {
    const long long lq = static_cast<long long>(s.lq[b]), lk = static_cast<long long>(s.lk[b]);
    for (std::size_t h = 0; h < s.H; ++h) {
      const std::size_t hk = h / group;
      for (long long i = 0; i < lq; ++i) {
        const double* q = Q.data() + L.q(b, std::size_t(i), h);
        std::vector<double> score(std::size_t(lk), -kInf);
        double m = -kInf;
        for (long long j = 0; j < lk; ++j) {
          if (!sees(i, j, lq, lk, s)) continue;
          const double* k = K.data() + L.k(b, std::size_t(j), hk);
          double dot = 0.0;
          for (std::size_t c = 0; c < d; ++c) dot += q[c] * k[c];
          score[std::size_t(j)] = scale * dot;
          m = std::max(m, score[std::size_t(j)]);
        }
        double* o = r.O.data() + L.q(b, std::size_t(i), h);
        double& lse = r.LSE[L.stat(b, h, std::size_t(i))];
        if (m == -kInf) {  // no visible key: O = 0, LSE = −inf, no gradient
          lse = -kInf;
          continue;
        }
        double l = 0.0;
        std::vector<double> p(std::size_t(lk), 0.0);
        for (long long j = 0; j < lk; ++j)
          if (score[std::size_t(j)] > -kInf) l += (p[std::size_t(j)] = std::exp(score[std::size_t(j)] - m));
        for (auto& x : p) x /= l;
        lse = (m + std::log(l)) / std::log(2.0);
        const double* dout = dO.data() + L.q(b, std::size_t(i), h);
        std::vector<double> dp(std::size_t(lk), 0.0);
        double D = 0.0;
        for (long long j = 0; j < lk; ++j) {
          if (p[std::size_t(j)] == 0.0) continue;
          const double* v = V.data() + L.k(b, std::size_t(j), hk);
          for (std::size_t c = 0; c < d; ++c) {
            o[c] += p[std::size_t(j)] * v[c];
            dp[std::size_t(j)] += dout[c] * v[c];
          }
          D += p[std::size_t(j)] * dp[std::size_t(j)];
        }
        double* dq = r.dQ.data() + L.q(b, std::size_t(i), h);
        for (long long j = 0; j < lk; ++j) {
          if (p[std::size_t(j)] == 0.0) continue;
          const double ds = p[std::size_t(j)] * (dp[std::size_t(j)] - D);
          const std::size_t kj = L.k(b, std::size_t(j), hk);
          for (std::size_t c = 0; c < d; ++c) {
            dq[c] += scale * ds * K.data()[kj + c];
            r.dK[kj + c] += scale * ds * q[c];
            r.dV[kj + c] += p[std::size_t(j)] * dout[c];
          }
        }
      }
    }
  }
  return r;
}

// ---- running every algorithm -------------------------------------------------------------------

struct Inputs {
  Tensor<double> Q, K, V, dO;
};

Inputs random_inputs(const Spec& s, unsigned long long seed) {
  const Layout L(s);
  Inputs in{Tensor<double>(L.q_shape()), Tensor<double>(L.kv_shape()), Tensor<double>(L.kv_shape()),
            Tensor<double>(L.q_shape())};
  fill_normal(in.Q, seed);
  fill_normal(in.K, seed + 1);
  fill_normal(in.V, seed + 2);
  fill_normal(in.dO, seed + 3);
  return in;
}

template <typename T>
double err(const std::vector<T>& got, const std::vector<double>& ref) {
  REQUIRE(got.size() == ref.size());
  return max_error_vs_max(got.data(), ref.data(), ref.size());
}
template <typename T>
double err(const Tensor<T>& got, const std::vector<double>& ref) {
  REQUIRE(got.numel() == ref.size());
  return max_error_vs_max(got.data(), ref.data(), ref.size());
}

void require_counts(const Traffic& counted, const Traffic& formula, const char* what) {
  std::string why;
  const bool same = same_counts(counted, formula, &why);
  INFO(what << ": " << why);
  CHECK(same);
}

// Every forward and backward in float64 (and the flash ones in float32) against the oracle, and
// every counted traffic against its formula.
void check_all(const Spec& s, unsigned long long seed, double tol64 = 1e-12, double tol32 = 1e-5) {
  INFO(describe(s));
  const AttentionProblem cfg = problem_of(s);
  const Layout L(s);
  REQUIRE(cfg.q_shape() == L.q_shape());
  REQUIRE(cfg.kv_shape() == L.kv_shape());
  const Inputs in = random_inputs(s, seed);
  const Oracle ref = oracle(s, cfg.softmax_scale(), in.Q, in.K, in.V, in.dO);
  const auto Qf = in.Q.cast<float>(), Kf = in.K.cast<float>(), Vf = in.V.cast<float>(), dOf = in.dO.cast<float>();

  for (Algorithm v : {Algorithm::naive_fwd, Algorithm::fa1_fwd, Algorithm::fa2_fwd}) {
    INFO(algorithm_name(v));
    const auto f = attention_forward(v, cfg, in.Q, in.K, in.V);
    CHECK(err(f.O, ref.O) <= tol64);
    CHECK(err(f.LSE, ref.LSE) <= tol64);
    require_counts(f.traffic, attention_traffic_formula(v, cfg), "forward");
    const auto f32 = attention_forward(v, cfg, Qf, Kf, Vf);
    CHECK(err(f32.O, ref.O) <= tol32);
    CHECK(err(f32.LSE, ref.LSE) <= tol32);
  }
  const auto fwd = flash_forward_fa2(cfg, in.Q, in.K, in.V);
  const auto naive = naive_backward(cfg, in.Q, in.K, in.V, in.dO);
  const auto two = flash_backward_two_kernel(cfg, in.Q, in.K, in.V, fwd.O, fwd.LSE, in.dO);
  const auto atom = flash_backward_atomic(cfg, in.Q, in.K, in.V, fwd.O, fwd.LSE, in.dO);
  for (const auto* g : {&naive, &two, &atom}) {
    CHECK(err(g->dQ, ref.dQ) <= tol64);
    CHECK(err(g->dK, ref.dK) <= tol64);
    CHECK(err(g->dV, ref.dV) <= tol64);
  }
  require_counts(naive.traffic, attention_traffic_formula(Algorithm::naive_bwd, cfg), "naive_bwd");
  require_counts(two.traffic, attention_traffic_formula(Algorithm::bwd_two_kernel, cfg), "bwd_two_kernel");
  require_counts(atom.traffic, attention_traffic_formula(Algorithm::bwd_atomic, cfg), "bwd_atomic");
  const auto f32 = flash_forward_fa2(cfg, Qf, Kf, Vf);
  const auto two32 = flash_backward_two_kernel(cfg, Qf, Kf, Vf, f32.O, f32.LSE, dOf);
  const auto atom32 = flash_backward_atomic(cfg, Qf, Kf, Vf, f32.O, f32.LSE, dOf);
  for (const auto* g : {&two32, &atom32}) {
    CHECK(err(g->dQ, ref.dQ) <= tol32);
    CHECK(err(g->dK, ref.dK) <= tol32);
    CHECK(err(g->dV, ref.dV) <= tol32);
  }
}

}  // namespace

TEST_CASE("attention features: grouped K/V with H/H_kv = 1, 4, 32 equals the oracle", "[attention][gqa]") {
  unsigned long long seed = 11000;
  for (bool causal : {false, true}) {
    for (auto [H, Hkv] : {std::pair<std::size_t, std::size_t>{4, 4}, {4, 1}, {8, 2}, {32, 1}, {32, 32}}) {
      check_all(dense(2, 13, 13, H, Hkv, 8).masked(causal, 5, 3), seed += 10);
      check_all(dense(1, 6, 17, H, Hkv, 4).masked(causal, 4, 4), seed += 10);  // N_q < N_k
    }
  }
}

TEST_CASE("attention features: N_q != N_k with the causal diagonal bottom-right", "[attention][seq_k]") {
  unsigned long long seed = 12000;
  // N_q = 1 (decoding), N_q < N_k (chunked prefill), N_q > N_k (rows that see no key), both not a
  // multiple of the tiles, Br ≠ Bc.
  for (auto [nq, nk] : {std::pair<std::size_t, std::size_t>{1, 1}, {1, 37}, {5, 37}, {9, 30}, {30, 9}, {13, 5}, {20, 13}}) {
    for (bool causal : {false, true}) check_all(dense(2, nq, nk, 2, 1, 6).masked(causal, 4, 7), seed += 10);
  }
}

TEST_CASE("attention features: packed sequences, lengths 0 and 1 among them", "[attention][varlen]") {
  unsigned long long seed = 13000;
  const std::vector<std::pair<std::vector<std::size_t>, std::vector<std::size_t>>> lengths = {
      {{3, 0, 1, 17, 5}, {3, 0, 1, 17, 5}},  // self-attention packing
      {{3, 0, 1, 17, 5}, {4, 6, 1, 20, 0}},  // a query sequence without keys, keys without queries
      {{1}, {40}},                           // one decoding row
      {{1, 1, 1}, {9, 1, 30}},
      {{12, 7}, {5, 7}},                     // N_q > N_k in one sequence
  };
  for (const auto& [lq, lk] : lengths) {
    for (bool causal : {false, true}) check_all(packed(lq, lk, 4, 2, 8).masked(causal, 4, 3), seed += 10);
  }
}

TEST_CASE("attention features: sliding windows, alone, with causal, wider than N", "[attention][window]") {
  unsigned long long seed = 14000;
  const std::pair<long long, long long> windows[] = {{2, 0}, {0, 0}, {3, 5}, {-1, 4}, {4, -1}, {1000, 1000}, {0, 2}};
  for (auto [left, right] : windows) {
    for (bool causal : {false, true}) {
      check_all(dense(1, 23, 23, 2, 2, 6).masked(causal, 4, 5, left, right), seed += 10);
      check_all(dense(1, 7, 19, 2, 1, 4).masked(causal, 4, 4, left, right), seed += 10);  // diagonal shifted by 12
      check_all(packed({9, 1, 0, 14}, {6, 3, 2, 14}, 2, 1, 4).masked(causal, 3, 2, left, right), seed += 10);
    }
  }
}

TEST_CASE("attention features: head dims 64, 96, 128 and 256", "[attention][head_dim]") {
  unsigned long long seed = 15000;
  for (std::size_t d : {64u, 96u, 128u, 256u}) {
    check_all(dense(1, 19, 26, 4, 2, d).masked(true, 8, 16), seed += 10);
    check_all(packed({5, 1, 12}, {5, 8, 12}, 2, 1, d).masked(false, 4, 4, 4), seed += 10);
  }
}

TEST_CASE("attention features: random problems with every feature at once", "[attention][random]") {
  // 60 problems drawn from a fixed seed: dense or packed (1–4 sequences, lengths 0–25), H_kv
  // dividing H ≤ 8, d 1–40, Br, Bc 1–9, causal or not, each window side −1 or 0–12.
  std::mt19937_64 rng(20261203);
  auto pick = [&](std::size_t lo, std::size_t hi) { return lo + std::size_t(rng() % (hi - lo + 1)); };
  for (int trial = 0; trial < 60; ++trial) {
    const std::size_t Hkv = pick(1, 4), H = Hkv * pick(1, 2);
    Spec s;
    if (rng() % 2) {
      const std::size_t B = pick(1, 4);
      for (std::size_t b = 0; b < B; ++b) {
        s.lq.push_back(pick(0, 25));
        s.lk.push_back(rng() % 3 ? s.lq.back() : pick(0, 25));
      }
      s.lq[pick(0, B - 1)] = pick(1, 25);  // at least one query
      s.lk[pick(0, B - 1)] = pick(1, 25);  // at least one key
      s.packed = true;
    } else {
      s = dense(pick(1, 2), pick(1, 25), pick(1, 25), 1, 1, 1);
    }
    s.H = H;
    s.Hkv = Hkv;
    s.d = pick(1, 40);
    s.Br = pick(1, 9);
    s.Bc = pick(1, 9);
    s.causal = rng() % 2 == 0;
    s.left = rng() % 2 ? -1 : static_cast<long long>(pick(0, 12));
    s.right = rng() % 2 ? -1 : static_cast<long long>(pick(0, 12));
    INFO("trial " << trial);
    check_all(s, 16000 + 10 * std::uint64_t(trial));
  }
}

TEST_CASE("attention features: gradients equal central finite differences of the oracle's loss", "[attention][backward]") {
  // Tiny problems with every feature: the loss L = Σ O∘dO of the oracle's forward, differentiated
  // numerically, against the library's backward passes.
  const Spec a = packed({3, 1, 0, 4}, {2, 3, 1, 5}, 4, 2, 3).masked(true, 2, 2, 2);
  const Spec b = dense(1, 4, 6, 2, 1, 3).masked(false, 3, 2, 1, 1);
  for (const Spec& s : {a, b}) {
    INFO(describe(s));
    const AttentionProblem cfg = problem_of(s);
    Inputs in = random_inputs(s, 4242);
    auto loss = [&] {
      const Oracle o = oracle(s, cfg.softmax_scale(), in.Q, in.K, in.V, in.dO);
      double L = 0.0;
      for (std::size_t n = 0; n < o.O.size(); ++n) L += o.O[n] * in.dO.data()[n];
      return L;
    };
    const double step = 1e-5;
    auto fd = [&](Tensor<double>& X) {
      std::vector<double> G(X.numel());
      for (std::size_t n = 0; n < X.numel(); ++n) {
        const double x0 = X.data()[n];
        X.data()[n] = x0 + step;
        const double up = loss();
        X.data()[n] = x0 - step;
        const double down = loss();
        X.data()[n] = x0;
        G[n] = (up - down) / (2 * step);
      }
      return G;
    };
    const auto dQ = fd(in.Q), dK = fd(in.K), dV = fd(in.V);
    const auto fwd = flash_forward_fa2(cfg, in.Q, in.K, in.V);
    const auto naive = naive_backward(cfg, in.Q, in.K, in.V, in.dO);
    const auto two = flash_backward_two_kernel(cfg, in.Q, in.K, in.V, fwd.O, fwd.LSE, in.dO);
    const auto atom = flash_backward_atomic(cfg, in.Q, in.K, in.V, fwd.O, fwd.LSE, in.dO);
    for (const auto* g : {&naive, &two, &atom}) {
      CHECK(err(g->dQ, dQ) <= 1e-7);
      CHECK(err(g->dK, dK) <= 1e-7);
      CHECK(err(g->dV, dV) <= 1e-7);
    }
  }
}

TEST_CASE("attention features: rows that see no key get O = 0, LSE = -inf and zero gradients", "[attention][masking]") {
  // Sequence 0: N_q = 6 > N_k = 2 under causal: rows 0–3 see nothing. Sequence 1: no keys at all.
  // Sequence 2: a window (0, 0) on a diagonal shifted left by 3: rows 0–2 see nothing.
  const Spec s = packed({6, 3, 5}, {2, 0, 2}, 2, 1, 4).masked(true, 2, 2, 0, 0);
  const AttentionProblem cfg = problem_of(s);
  const Layout L(s);
  const Inputs in = random_inputs(s, 99);
  std::vector<std::pair<std::size_t, std::size_t>> blind;  // (sequence, row)
  for (std::size_t i = 0; i < 4; ++i) blind.push_back({0, i});
  for (std::size_t i = 0; i < 3; ++i) blind.push_back({1, i});
  for (std::size_t i = 0; i < 3; ++i) blind.push_back({2, i});
  for (Algorithm v : {Algorithm::naive_fwd, Algorithm::fa1_fwd, Algorithm::fa2_fwd}) {
    INFO(algorithm_name(v));
    const auto f = attention_forward(v, cfg, in.Q, in.K, in.V);
    REQUIRE_FALSE(has_nan(f.O.data(), f.O.numel()));
    for (auto [b, i] : blind) {
      for (std::size_t h = 0; h < s.H; ++h) {
        CHECK(f.LSE[L.stat(b, h, i)] == -kInf);
        for (std::size_t c = 0; c < s.d; ++c) CHECK(f.O.data()[L.q(b, i, h) + c] == 0.0);
      }
    }
    for (std::size_t h = 0; h < s.H; ++h) CHECK(std::isfinite(f.LSE[L.stat(0, h, 5)]));  // the last row sees both keys
  }
  const auto fwd = flash_forward_fa2(cfg, in.Q, in.K, in.V);
  const auto naive = naive_backward(cfg, in.Q, in.K, in.V, in.dO);
  const auto two = flash_backward_two_kernel(cfg, in.Q, in.K, in.V, fwd.O, fwd.LSE, in.dO);
  const auto atom = flash_backward_atomic(cfg, in.Q, in.K, in.V, fwd.O, fwd.LSE, in.dO);
  for (const auto* g : {&naive, &two, &atom}) {
    REQUIRE_FALSE(has_nan(g->dQ.data(), g->dQ.numel()));
    REQUIRE_FALSE(has_nan(g->dK.data(), g->dK.numel()));
    REQUIRE_FALSE(has_nan(g->dV.data(), g->dV.numel()));
    for (auto [b, i] : blind)
      for (std::size_t h = 0; h < s.H; ++h)
        for (std::size_t c = 0; c < s.d; ++c) CHECK(g->dQ.data()[L.q(b, i, h) + c] == 0.0);
  }
}

TEST_CASE("attention features: ±800 inputs (ties, huge logits) stay finite and exact", "[attention][adversarial]") {
  // Every Q and K entry ±800: scores are multiples of 2·800²·scale with exact ties, up to
  // 800²·d·scale = 2.56e6 at d = 16, far beyond exp's range; the max subtraction must keep every
  // exp finite, and the float32 products of integers below 2^24 are exact.
  const Spec s = packed({9, 1, 16}, {12, 5, 16}, 4, 2, 16).masked(true, 4, 3, 7);
  const Spec g = dense(1, 11, 11, 8, 2, 16);
  for (const Spec& spec : {s, g}) {
    INFO(describe(spec));
    const AttentionProblem cfg = problem_of(spec);
    Inputs in = random_inputs(spec, 800);
    for (Tensor<double>* t : {&in.Q, &in.K})
      for (std::size_t n = 0; n < t->numel(); ++n) t->data()[n] = t->data()[n] < 0 ? -800.0 : 800.0;
    const Oracle ref = oracle(spec, cfg.softmax_scale(), in.Q, in.K, in.V, in.dO);
    // A score of magnitude L carries a rounding of about L·eps into the exponent: scale the
    // float64 tolerance by the logit bound over the 64 the fixed tolerance is calibrated for.
    const double logit_bound = cfg.softmax_scale() * 800.0 * 800.0 * double(spec.d);
    const double tol = 1e-12 * logit_bound / 64.0;
    for (Algorithm v : {Algorithm::naive_fwd, Algorithm::fa1_fwd, Algorithm::fa2_fwd}) {
      INFO(algorithm_name(v));
      const auto f = attention_forward(v, cfg, in.Q, in.K, in.V);
      CHECK_FALSE(has_nan(f.O.data(), f.O.numel()));
      CHECK(err(f.O, ref.O) <= tol);
      CHECK(err(f.LSE, ref.LSE) <= tol);
      const auto f32 = attention_forward(v, cfg, in.Q.cast<float>(), in.K.cast<float>(), in.V.cast<float>());
      CHECK(err(f32.O, ref.O) <= 1e-5);
      CHECK(err(f32.LSE, ref.LSE) <= 1e-5);
    }
    const auto fwd = flash_forward_fa2(cfg, in.Q, in.K, in.V);
    const auto two = flash_backward_two_kernel(cfg, in.Q, in.K, in.V, fwd.O, fwd.LSE, in.dO);
    const auto atom = flash_backward_atomic(cfg, in.Q, in.K, in.V, fwd.O, fwd.LSE, in.dO);
    for (const auto* gr : {&two, &atom}) {
      CHECK_FALSE(has_nan(gr->dQ.data(), gr->dQ.numel()));
      CHECK(err(gr->dV, ref.dV) <= tol);
      CHECK(err(gr->dQ, ref.dQ) <= tol);
      CHECK(err(gr->dK, ref.dK) <= tol);
    }
  }
}

TEST_CASE("attention features: a NaN input reaches the outputs it should and never passes", "[attention][nan]") {
  // Packed, grouped: a NaN in V of sequence 1 at key 2, column 1; a NaN in Q of sequence 2.
  const Spec s = packed({5, 6, 4}, {7, 6, 4}, 4, 2, 4).masked(true, 2, 3);
  const AttentionProblem cfg = problem_of(s);
  const Layout L(s);
  const Inputs clean = random_inputs(s, 31);
  const Oracle ref = oracle(s, cfg.softmax_scale(), clean.Q, clean.K, clean.V, clean.dO);
  Inputs in = clean;
  const std::size_t key = 2, col = 1, hk = 1;  // K/V head 1 serves query heads 2 and 3
  in.V.data()[L.k(1, key, hk) + col] = std::nan("");
  const std::size_t row = 3, qh = 0;
  in.Q.data()[L.q(2, row, qh)] = std::nan("");
  for (Algorithm v : {Algorithm::naive_fwd, Algorithm::fa1_fwd, Algorithm::fa2_fwd}) {
    INFO(algorithm_name(v));
    const auto f = attention_forward(v, cfg, in.Q, in.K, in.V);
    // Every row of sequence 1 that sees key 2 (i ≥ 2 under causal, N_q = N_k) has NaN in column 1
    // for the query heads of K/V head 1.
    for (std::size_t i = key; i < 6; ++i)
      for (std::size_t h : {2u, 3u}) CHECK(std::isnan(f.O.data()[L.q(1, i, h) + col]));
    // The NaN query row: O and LSE NaN (not mistaken for a row that sees no key).
    CHECK(std::isnan(f.LSE[L.stat(2, qh, row)]));
    CHECK(std::isnan(f.O.data()[L.q(2, row, qh)]));
    // Sequence 0 is untouched.
    for (std::size_t i = 0; i < 5; ++i)
      for (std::size_t h = 0; h < s.H; ++h)
        for (std::size_t c = 0; c < s.d; ++c) CHECK(std::isfinite(f.O.data()[L.q(0, i, h) + c]));
    CHECK(std::isinf(err(f.O, ref.O)));
    CHECK(std::isinf(err(f.LSE, ref.LSE)));
  }
  const auto fwd = flash_forward_fa2(cfg, in.Q, in.K, in.V);
  const auto naive = naive_backward(cfg, in.Q, in.K, in.V, in.dO);
  const auto two = flash_backward_two_kernel(cfg, in.Q, in.K, in.V, fwd.O, fwd.LSE, in.dO);
  const auto atom = flash_backward_atomic(cfg, in.Q, in.K, in.V, fwd.O, fwd.LSE, in.dO);
  for (const auto* g : {&naive, &two, &atom}) {
    CHECK(has_nan(g->dQ.data(), g->dQ.numel()));
    CHECK(has_nan(g->dV.data(), g->dV.numel()));
    CHECK(std::isinf(err(g->dQ, ref.dQ)));
    CHECK(std::isinf(err(g->dV, ref.dV)));
  }
}

TEST_CASE("attention features: loading K/V once per group changes the traffic, not the result", "[attention][gqa]") {
  const Spec s = packed({9, 0, 14}, {9, 3, 20}, 8, 2, 8).masked(true, 4, 5, 6);
  const AttentionProblem cfg = problem_of(s);
  const Inputs in = random_inputs(s, 555);
  const auto per_head = flash_forward_fa2(cfg, in.Q, in.K, in.V);
  const auto per_group = flash_forward_fa2(cfg, in.Q, in.K, in.V, ForwardOptions{KvLoads::per_group});
  CHECK(per_group.O.storage() == per_head.O.storage());  // bit for bit: the same operations per head
  CHECK(per_group.LSE == per_head.LSE);
  require_counts(per_group.traffic, attention_traffic_formula(Algorithm::fa2_fwd, cfg, KvLoads::per_group), "fa2");
  // K and V are read H/H_kv = 4 times less; everything else is equal.
  CHECK(per_head.traffic.read_bytes("K") == 4 * per_group.traffic.read_bytes("K"));
  CHECK(per_head.traffic.read_bytes("V") == 4 * per_group.traffic.read_bytes("V"));
  CHECK(per_head.traffic.read_bytes("Q") == per_group.traffic.read_bytes("Q"));
  CHECK(per_head.traffic.flops() == per_group.traffic.flops());

  BackwardOptions grouped;
  grouped.kv_loads = KvLoads::per_group;
  const auto two = flash_backward_two_kernel(cfg, in.Q, in.K, in.V, per_head.O, per_head.LSE, in.dO);
  const auto two_g = flash_backward_two_kernel(cfg, in.Q, in.K, in.V, per_head.O, per_head.LSE, in.dO, grouped);
  CHECK(two_g.dQ.storage() == two.dQ.storage());
  CHECK(two_g.dK.storage() == two.dK.storage());
  require_counts(two_g.traffic, attention_traffic_formula(Algorithm::bwd_two_kernel, cfg, KvLoads::per_group),
                 "two-kernel per group");
  const auto kernels = attention_traffic_kernels(Algorithm::bwd_two_kernel, cfg, KvLoads::per_group);
  REQUIRE(kernels.size() == 3);
  require_counts(two_g.kernels[1].traffic, kernels[1].traffic, "dQ kernel per group");
  CHECK(two.kernels[1].traffic.read_bytes("K") == 4 * two_g.kernels[1].traffic.read_bytes("K"));
}

TEST_CASE("attention features: bad problems are refused naming the field", "[attention][errors]") {
  auto field_of = [](const auto& build) {
    try {
      build();
    } catch (const ProblemError& e) {
      return e.field() + ": " + e.what();
    }
    return std::string("no error");
  };
  AttentionProblem base;
  base.seq = 8;
  base.head_dim = 4;
  base.heads = 8;
  auto with = [&](auto change) {
    return field_of([&] {
      AttentionProblem p = base;
      change(p);
      p.validate();
    });
  };
  CHECK_THAT(with([](AttentionProblem& p) { p.heads_kv = 3; }),
             Catch::StartsWith("heads_kv: ") && Catch::Contains("does not divide heads (H) = 8") && Catch::Contains("hint:"));
  CHECK_THAT(with([](AttentionProblem& p) { p.heads_kv = 16; }), Catch::StartsWith("heads_kv: "));
  CHECK_THAT(with([](AttentionProblem& p) { p.window_left = -2; }),
             Catch::StartsWith("window_left: ") && Catch::Contains("-1 means unbounded"));
  CHECK_THAT(with([](AttentionProblem& p) { p.window_right = kMaxWindow + 1; }), Catch::StartsWith("window_right: "));
  CHECK(with([](AttentionProblem& p) { p.heads_kv = 2; p.window_left = 0; p.window_right = kMaxWindow; }) == "no error");

  auto packed_error = [&](std::vector<std::int32_t> q, std::vector<std::int32_t> k) {
    return field_of([&] { PackedSequences p(q, k); });
  };
  CHECK_THAT(packed_error({0}, {0}), Catch::StartsWith("cu_seqlens_q: ") && Catch::Contains("fewer than 2"));
  CHECK_THAT(packed_error({1, 4}, {0, 4}), Catch::StartsWith("cu_seqlens_q: ") && Catch::Contains("cu_seqlens_q[0] = 1 is not 0"));
  CHECK_THAT(packed_error({0, 4, 3, 9}, {0, 4, 4, 9}),
             Catch::StartsWith("cu_seqlens_q: ") && Catch::Contains("cu_seqlens_q[2] = 3 is below cu_seqlens_q[1] = 4") &&
                 Catch::Contains("length -1"));
  CHECK_THAT(packed_error({0, 4, 9}, {0, 4}), Catch::StartsWith("cu_seqlens_k: ") && Catch::Contains("2 entries but cu_seqlens_q has 3"));
  CHECK_THAT(packed_error({0, 4, 9}, {0, 5, -1}), Catch::StartsWith("cu_seqlens_k: ") && Catch::Contains("is below"));
  CHECK_THAT(packed_error({0, 0, 0}, {0, 1, 2}), Catch::StartsWith("cu_seqlens_q: ") && Catch::Contains("holds no query"));
  CHECK_THAT(packed_error({0, 1, 2}, {0, 0, 0}), Catch::StartsWith("cu_seqlens_k: ") && Catch::Contains("holds no key"));
  CHECK(packed_error({0, 0, 1, 1}, {0, 2, 2, 3}) == "no error");  // length-0 and length-1 sequences

  // A packed problem whose B, N, N_k disagree with its lists (built by hand, not by set_packed).
  CHECK_THAT(with([](AttentionProblem& p) { p.set_packed(PackedSequences({0, 3, 8})); p.batch = 3; }),
             Catch::StartsWith("batch: ") && Catch::Contains("differs from the 2 sequences"));
  CHECK_THAT(with([](AttentionProblem& p) { p.set_packed(PackedSequences({0, 3, 8})); p.seq = 8; }),
             Catch::StartsWith("seq: ") && Catch::Contains("longest query sequence, 5"));
  CHECK_THAT(with([](AttentionProblem& p) { p.set_packed(PackedSequences({0, 3, 8}, {0, 9, 10})); p.seq_k = 0; }),
             Catch::StartsWith("seq_k: ") && Catch::Contains("longest key sequence, 9"));

  // Operands shaped for another problem are refused naming the operand.
  AttentionProblem gqa = base;
  gqa.heads_kv = 2;
  Tensor<double> Q(gqa.q_shape()), K(Shape{1, 8, 8, 4}), V(gqa.kv_shape());
  REQUIRE_THROWS_WITH(flash_forward_fa2(gqa, Q, K, V), Catch::Contains("K has shape [1, 8, 8, 4], expected [1, 8, 2, 4]"));
  AttentionProblem pk = base;
  pk.set_packed(PackedSequences({0, 3, 8}, {0, 2, 6}));
  Tensor<double> Qp(pk.q_shape()), Kp(Shape{2, 4, 8, 4}), Vp(pk.kv_shape());
  REQUIRE_THROWS_WITH(naive_forward(pk, Qp, Kp, Vp), Catch::Contains("K has shape [2, 4, 8, 4], expected [1, 6, 8, 4]"));
}

TEST_CASE("attention features: the problem's layout, masks and description", "[attention][problem]") {
  AttentionProblem p;
  p.heads = 6;
  p.heads_kv = 2;
  p.head_dim = 4;
  p.set_packed(PackedSequences({0, 3, 3, 10}, {0, 5, 6, 6}));
  p.validate();
  CHECK(p.batch == 3);
  CHECK(p.seq == 7);
  CHECK(p.n_k() == 5);
  CHECK(p.group_size() == 3);
  CHECK(p.kv_head(5) == 1);
  CHECK(p.q_shape() == Shape{1, 10, 6, 4});
  CHECK(p.kv_shape() == Shape{1, 6, 2, 4});
  CHECK(p.stat_numel() == 60);
  const SequenceSpan s2 = p.sequence(2);
  CHECK(s2.q_start == 3);
  CHECK(s2.q_len == 7);
  CHECK(s2.k_start == 6);
  CHECK(s2.k_len == 0);
  CHECK(p.stat_offset(2, 4) == 4 * 10 + 3);
  CHECK(p.visible_keys(s2, 0).empty());
  CHECK(p.str() == "B=3 N=7 N_k=5 packed total_q=10 total_k=6 H=6 H_kv=2 d=4 Br=64 Bc=64 fp32");
  CHECK(p.extended_feature() == "heads_kv (grouped-query attention, H_kv = 2 of H = 6)");

  AttentionProblem d;
  d.seq = 4;
  d.seq_k = 10;
  d.head_dim = 2;
  d.causal = true;
  d.window_left = 2;
  CHECK(d.extended_feature() == "window (2,-1)");
  CHECK(d.str() == "B=1 N=4 N_k=10 H=1 d=2 Br=64 Bc=64 causal window=2,-1 fp32");
  const SequenceSpan s = d.sequence(0);
  // Bottom-right: query 0's diagonal key is 6; the window adds keys 4 and 5.
  CHECK(p.visible_keys(s, 0).first == 0);  // p has no mask: every key
  CHECK(d.visible_keys(s, 0).first == 4);
  CHECK(d.visible_keys(s, 0).end == 7);
  CHECK(d.visible_keys(s, 3).end == 10);
  d.window_right = 5;  // causal caps the right side at the diagonal
  CHECK(d.visible_keys(s, 0).end == 7);
  d.causal = false;
  CHECK(d.visible_keys(s, 0).end == 10);  // 6 + 5 = 11, clamped to N_k
  AttentionProblem plain;
  plain.seq = 4;
  plain.head_dim = 2;
  CHECK(plain.extended_feature().empty());
  AttentionProblem varlen = plain;
  varlen.set_packed(PackedSequences({0, 1, 4}));
  CHECK(varlen.extended_feature() == "cu_seqlens (2 packed sequences)");
}
