// Context-parallel (ring) attention simulated on G ranks, against the single-process float64
// naive reference: forward and backward for G = 1, 2, 3, 4, 8, causal and not, contiguous and
// zigzag, GQA, d = 64 and 128, N not divisible by the chunks; the ring schedule; the LSE merge
// with fully masked partials and ±800; the bytes the ring copied against the model.
//
// Error metric: max |got − ref| / max |ref| over the tensor (max_error_vs_max); ref is
// naive_forward / naive_backward<double> on K, V expanded to H heads (dK, dV summed back over
// each group). Tolerances: float64 1e-12, float32 1e-5 (as the single-device reference's tests).
#include <catch2/catch.hpp>

#include "flashlab/reference/attention_traffic.hpp"
#include "flashlab/reference/context_parallel.hpp"

#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <sstream>

using namespace flashlab::ref;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Case {
  std::size_t G, B, N, H, H_kv, d;
  bool causal;
  ShardLayout layout;
};

ContextParallelProblem make_problem(const Case& c) {
  ContextParallelProblem p;
  p.attention.batch = c.B;
  p.attention.seq = c.N;
  p.attention.heads = c.H;
  p.attention.head_dim = c.d;
  p.attention.Br = 4;  // small tiles: the blocks' own tile loops have boundaries too
  p.attention.Bc = 3;
  p.attention.causal = c.causal;
  p.heads_kv = c.H_kv;
  p.gpus = c.G;
  p.layout = c.layout;
  return p;
}

std::string name(const Case& c) {
  std::ostringstream s;
  s << make_problem(c).str();
  return s.str();
}

struct Inputs {
  Tensor<double> Q, K, V, dO;
};

Inputs random_inputs(const ContextParallelProblem& p, unsigned long long seed, double stddev = 1.0) {
  const AttentionProblem& a = p.attention;
  Inputs in{Tensor<double>(Shape{a.batch, a.seq, a.heads, a.head_dim}),
            Tensor<double>(Shape{a.batch, a.seq, p.kv_heads(), a.head_dim}),
            Tensor<double>(Shape{a.batch, a.seq, p.kv_heads(), a.head_dim}),
            Tensor<double>(Shape{a.batch, a.seq, a.heads, a.head_dim})};
  fill_normal(in.Q, seed, stddev);
  fill_normal(in.K, seed + 1, stddev);
  fill_normal(in.V, seed + 2);
  fill_normal(in.dO, seed + 3);
  return in;
}

// The single-process float64 reference: the whole sequence on one "device", K/V expanded to H heads.
struct Whole {
  AttentionForward<double> f;
  Tensor<double> dQ, dK, dV;
};

Whole whole(const ContextParallelProblem& p, const Inputs& in) {
  AttentionProblem a = p.attention;
  const auto K = expand_kv_heads(in.K, p.group()), V = expand_kv_heads(in.V, p.group());
  Whole w{naive_forward(a, in.Q, K, V), {}, {}, {}};
  const auto g = naive_backward(a, in.Q, K, V, in.dO);
  w.dQ = g.dQ;
  w.dK = sum_kv_heads(g.dK, p.group());
  w.dV = sum_kv_heads(g.dV, p.group());
  return w;
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

// Runs the ring forward and backward on `p` and checks them against the whole-sequence
// reference (float64 and, when `f32`, float32), and the bytes the ring copied against the model.
// `tol64` is the float64 tolerance (1e-12; scores of size ~1000 carry ~1000× the rounding).
void check_ring(const ContextParallelProblem& p, unsigned long long seed, bool f32 = true, double stddev = 1.0,
                double tol64 = 1e-12) {
  const Inputs in = random_inputs(p, seed, stddev);
  const Whole ref = whole(p, in);
  REQUIRE_FALSE(has_nan(ref.f.O.data(), ref.f.O.numel()));

  const auto f = context_parallel_forward(p, in.Q, in.K, in.V);
  CHECK(err(f.O, ref.f.O) <= tol64);
  CHECK(err(f.LSE, ref.f.LSE) <= tol64);
  std::string why;
  const bool counted_fwd = counted_equals_model(p, RingPass::forward, f.steps, &why);
  INFO("counted bytes, forward: " << why);
  CHECK(counted_fwd);
  INFO("float64 errors: O " << err(f.O, ref.f.O) << ", LSE " << err(f.LSE, ref.f.LSE));
  const auto g = context_parallel_backward(p, in.Q, in.K, in.V, f.O, f.LSE, in.dO);
  INFO("dQ " << err(g.dQ, ref.dQ) << ", dK " << err(g.dK, ref.dK) << ", dV " << err(g.dV, ref.dV));
  CHECK(err(g.dQ, ref.dQ) <= tol64);
  CHECK(err(g.dK, ref.dK) <= tol64);
  CHECK(err(g.dV, ref.dV) <= tol64);
  const bool counted_bwd = counted_equals_model(p, RingPass::backward, g.steps, &why);
  INFO("counted bytes, backward: " << why);
  CHECK(counted_bwd);
  if (!f32) return;
  const auto Qf = in.Q.cast<float>(), Kf = in.K.cast<float>(), Vf = in.V.cast<float>(), dOf = in.dO.cast<float>();
  const auto f1 = context_parallel_forward(p, Qf, Kf, Vf);
  CHECK(err(f1.O, ref.f.O) <= 1e-5);
  CHECK(err(f1.LSE, ref.f.LSE) <= 1e-5);
  const auto g1 = context_parallel_backward(p, Qf, Kf, Vf, f1.O, f1.LSE, dOf);
  CHECK(err(g1.dQ, ref.dQ) <= 1e-5);
  CHECK(err(g1.dK, ref.dK) <= 1e-5);
  CHECK(err(g1.dV, ref.dV) <= 1e-5);
}

}  // namespace

TEST_CASE("context parallel: at step s rank r holds the K/V of rank (r - s) mod G", "[attention][ring]") {
  CHECK(ring_source(4, 0, 0) == 0);
  CHECK(ring_source(4, 0, 1) == 3);
  CHECK(ring_source(4, 2, 3) == 3);
  CHECK(ring_source(4, 1, 4) == 1);  // a whole turn
  for (std::size_t G = 1; G <= 8; ++G)
    for (std::size_t r = 0; r < G; ++r) {
      std::set<std::size_t> seen;
      for (std::size_t s = 0; s < G; ++s) {
        seen.insert(ring_source(G, r, s));
        // what rank r holds at step s + 1 is what rank r − 1 held at step s: one hop around the ring
        CHECK(ring_source(G, r, s + 1) == ring_source(G, (r + G - 1) % G, s));
      }
      CHECK(seen.size() == G);  // every rank's K/V visits every rank once
    }
}

TEST_CASE("context parallel: the blocks cover every visible (query, key) chunk pair once", "[attention][ring]") {
  for (std::size_t G : {1, 2, 3, 4, 5, 8})
    for (ShardLayout layout : {ShardLayout::contiguous, ShardLayout::zigzag})
      for (bool causal : {false, true})
        for (std::size_t N : {G * 8, G * 8 + 3, std::size_t(5)}) {
          ContextParallelProblem p = make_problem({G, 1, N, 2, 2, 8, causal, layout});
          INFO(p.str());
          std::map<std::pair<std::size_t, std::size_t>, int> count;
          for (std::size_t r = 0; r < G; ++r)
            for (std::size_t s = 0; s < G; ++s)
              for (const RingBlock& b : ring_blocks(p, r, s)) {
                CHECK(p.chunk_of(r, b.q_slot) == b.q_chunk);
                CHECK(p.chunk_of(ring_source(G, r, s), b.kv_slot) == b.kv_chunk);
                CHECK(b.valid_keys == p.valid_rows(b.kv_chunk));
                CHECK(b.kind == (causal && b.q_chunk == b.kv_chunk ? BlockKind::diagonal : BlockKind::full));
                ++count[{b.q_chunk, b.kv_chunk}];
              }
          for (std::size_t a = 0; a < p.chunks(); ++a)
            for (std::size_t b = 0; b < p.chunks(); ++b) {
              const bool visible = p.valid_rows(a) > 0 && p.valid_rows(b) > 0 && (!causal || b <= a);
              CHECK(count[{a, b}] == (visible ? 1 : 0));
            }
        }
}

TEST_CASE("context parallel: zigzag balances causal work, contiguous does not", "[attention][ring]") {
  for (std::size_t G : {2, 4, 8}) {
    INFO("G = " << G);
    const auto zig = ring_model(make_problem({G, 1, G * 64, 4, 4, 64, true, ShardLayout::zigzag}), RingPass::forward, 1e9, 1e12);
    for (const auto& m : zig) CHECK(m.flops_max == m.flops_min);  // every rank does the same work every step
    // Each step holds two c×c blocks' worth of work: step 0 two half (diagonal) blocks and a full one.
    CHECK(zig[0].flops_max == zig[1].flops_max);
    const auto con = ring_model(make_problem({G, 1, G * 64, 4, 4, 64, true, ShardLayout::contiguous}),
                                RingPass::forward, 1e9, 1e12);
    for (std::size_t s = 1; s < G; ++s) CHECK(con[s].flops_min == 0);  // rank s − 1 … 0 skip the whole step
  }
}

TEST_CASE("context parallel: the LSE merge of key subsets equals attention over all keys", "[attention][ring][merge]") {
  // One head, N_q = 7 queries, N_k = 12 keys split in three random subsets; each subset's naive
  // forward is a partial (O_s, LSE_s); merged in any order they give the whole.
  AttentionProblem a;
  a.seq = 7;
  a.seq_k = 12;
  a.head_dim = 5;
  a.scale = 0.7;
  Tensor<double> Q(a.q_shape()), K(a.kv_shape()), V(a.kv_shape());
  fill_normal(Q, 11);
  fill_normal(K, 12);
  fill_normal(V, 13);
  const auto all = naive_forward(a, Q, K, V);
  std::mt19937 rng(5);
  std::vector<std::size_t> keys(12);
  for (std::size_t j = 0; j < 12; ++j) keys[j] = j;
  std::shuffle(keys.begin(), keys.end(), rng);
  const std::vector<std::vector<std::size_t>> subsets = {{keys.begin(), keys.begin() + 2},
                                                         {keys.begin() + 2, keys.begin() + 7},
                                                         {keys.begin() + 7, keys.end()}};
  std::vector<AttentionForward<double>> parts;
  for (const auto& sub : subsets) {
    AttentionProblem pa = a;
    pa.seq_k = sub.size();
    Tensor<double> Ks(pa.kv_shape()), Vs(pa.kv_shape());
    for (std::size_t j = 0; j < sub.size(); ++j)
      for (std::size_t k = 0; k < a.head_dim; ++k) {
        Ks.at(0, j, 0, k) = K.at(0, sub[j], 0, k);
        Vs.at(0, j, 0, k) = V.at(0, sub[j], 0, k);
      }
    parts.push_back(naive_forward(pa, Q, Ks, Vs));
  }
  for (const std::vector<int>& order : {std::vector<int>{0, 1, 2}, std::vector<int>{2, 0, 1}}) {
    Tensor<double> O(a.q_shape());
    std::vector<double> LSE(a.seq, -kInf);
    for (int s : order)
      for (std::size_t i = 0; i < a.seq; ++i)
        merge_partial(LSE[i], &O.at(0, i, 0, 0), parts[s].LSE[i], &parts[s].O.at(0, i, 0, 0), a.head_dim);
    CHECK(err(O, all.O) <= 1e-14);
    CHECK(err(LSE, all.LSE) <= 1e-14);
  }
}

TEST_CASE("context parallel: the LSE merge with fully masked partials and ±800", "[attention][ring][merge]") {
  const double nan = std::nan("");
  SECTION("a fully masked partial (LSE_s = -inf) changes nothing, whatever its O_s holds") {
    double LSE = 3.0, O[2] = {1.5, -2.0};
    const double O_s[2] = {nan, kInf};
    merge_partial(LSE, O, -kInf, O_s, 2);
    CHECK(LSE == 3.0);
    CHECK(O[0] == 1.5);
    CHECK(O[1] == -2.0);
  }
  SECTION("two fully masked partials leave O = 0 and LSE = -inf, no NaN") {
    double LSE = -kInf, O[2] = {0.0, 0.0};
    const double O_s[2] = {nan, nan};
    merge_partial(LSE, O, -kInf, O_s, 2);
    merge_partial(LSE, O, -kInf, O_s, 2);
    CHECK(LSE == -kInf);
    CHECK(O[0] == 0.0);
    CHECK(O[1] == 0.0);
  }
  SECTION("the first visible partial is taken as it is") {
    double LSE = -kInf, O[2] = {0.0, 0.0};
    const double O_s[2] = {0.25, -4.0};
    merge_partial(LSE, O, 800.0, O_s, 2);
    CHECK(LSE == 800.0);
    CHECK(O[0] == 0.25);
    CHECK(O[1] == -4.0);
  }
  SECTION("LSE = 800 beside LSE = -800: the small one weighs 2^-1600, exactly nothing in float64") {
    double LSE = 800.0, O[1] = {2.0};
    const double O_s[1] = {-7.0};
    merge_partial(LSE, O, -800.0, O_s, 1);
    CHECK(LSE == 800.0);
    CHECK(O[0] == 2.0);
    float LSEf = -800.f, Of[1] = {-7.f};
    const float Of_s[1] = {2.f};
    merge_partial(LSEf, Of, 800.f, Of_s, 1);  // float: 2^1600 would overflow if exponentiated as it is
    CHECK(LSEf == 800.f);
    CHECK(Of[0] == 2.f);
  }
  SECTION("equal LSE = ±800 halves the weights: LSE + 1, the mean of the outputs") {
    for (double L : {800.0, -800.0}) {
      double LSE = L, O[1] = {1.0};
      const double O_s[1] = {3.0};
      merge_partial(LSE, O, L, O_s, 1);
      CHECK(LSE == L + 1.0);
      CHECK(O[0] == 2.0);
      float LSEf = float(L), Of[1] = {1.f};
      const float Of_s[1] = {3.f};
      merge_partial(LSEf, Of, float(L), Of_s, 1);
      CHECK(LSEf == float(L) + 1.f);
      CHECK(Of[0] == 2.f);
    }
  }
  SECTION("a NaN partial is not hidden") {
    double LSE = 1.0, O[1] = {1.0};
    const double O_s[1] = {1.0};
    merge_partial(LSE, O, nan, O_s, 1);
    CHECK(std::isnan(LSE));
  }
}

TEST_CASE("context parallel: expanding K/V heads and summing gradients over a group are adjoint", "[attention][ring][gqa]") {
  Tensor<double> X(Shape{2, 3, 2, 4}), Y(Shape{2, 3, 6, 4});
  fill_normal(X, 1);
  fill_normal(Y, 2);
  const auto EX = expand_kv_heads(X, 3);
  REQUIRE(EX.shape() == Shape({2, 3, 6, 4}));
  CHECK(EX.at(1, 2, 4, 3) == X.at(1, 2, 1, 3));  // query head 4 reads K/V head 4 / 3 = 1
  CHECK(EX.at(0, 1, 2, 0) == X.at(0, 1, 0, 0));
  const auto SY = sum_kv_heads(Y, 3);
  CHECK(SY.at(1, 0, 1, 2) == Approx(Y.at(1, 0, 3, 2) + Y.at(1, 0, 4, 2) + Y.at(1, 0, 5, 2)).epsilon(1e-15));
  double lhs = 0, rhs = 0;  // <expand X, Y> = <X, sum Y>
  for (std::size_t n = 0; n < EX.numel(); ++n) lhs += EX.data()[n] * Y.data()[n];
  for (std::size_t n = 0; n < X.numel(); ++n) rhs += X.data()[n] * SY.data()[n];
  CHECK(lhs == Approx(rhs).epsilon(1e-13));
  CHECK_THROWS_AS(sum_kv_heads(Y, 4), std::invalid_argument);
}

TEST_CASE("context parallel: GQA reference equals per-head attention with shared K/V heads", "[attention][ring][gqa]") {
  // The test's own reference is built on expand_kv_heads: check it once against heads computed
  // one at a time, each with its own copy of the shared K/V head.
  const ContextParallelProblem p = make_problem({1, 1, 9, 4, 2, 6, true, ShardLayout::zigzag});
  const Inputs in = random_inputs(p, 31);
  const Whole w = whole(p, in);
  for (std::size_t h = 0; h < 4; ++h) {
    AttentionProblem one = p.attention;
    one.heads = 1;
    Tensor<double> Q(one.q_shape()), K(one.kv_shape()), V(one.kv_shape());
    for (std::size_t n = 0; n < 9; ++n)
      for (std::size_t k = 0; k < 6; ++k) {
        Q.at(0, n, 0, k) = in.Q.at(0, n, h, k);
        K.at(0, n, 0, k) = in.K.at(0, n, h / 2, k);
        V.at(0, n, 0, k) = in.V.at(0, n, h / 2, k);
      }
    const auto f = naive_forward(one, Q, K, V);
    for (std::size_t n = 0; n < 9; ++n)
      for (std::size_t k = 0; k < 6; ++k) CHECK(f.O.at(0, n, 0, k) == Approx(w.f.O.at(0, n, h, k)).epsilon(1e-14));
  }
}

TEST_CASE("context parallel: sharding then gathering gives the tensor back, padding zero", "[attention][ring]") {
  for (ShardLayout layout : {ShardLayout::contiguous, ShardLayout::zigzag}) {
    const ContextParallelProblem p = make_problem({3, 2, 13, 2, 1, 4, true, layout});  // 13 rows in 6 (or 3) chunks
    INFO(p.str());
    Tensor<double> X(Shape{2, 13, 2, 4});
    fill_normal(X, 9);
    std::vector<std::vector<Tensor<double>>> parts;
    for (std::size_t r = 0; r < 3; ++r) parts.push_back(shard_rows(p, X, r));
    CHECK(err(unshard_rows(p, parts), X) == 0.0);
    // the last chunk's rows past N are zero (rank 0 holds chunk 5 in zigzag, rank 2 holds chunk 2 contiguous)
    const Tensor<double>& tail = layout == ShardLayout::zigzag ? parts[0][1] : parts[2][0];
    const std::size_t valid = p.valid_rows(p.chunks() - 1);
    REQUIRE(valid < p.chunk_len());
    for (std::size_t n = valid; n < p.chunk_len(); ++n) CHECK(tail.at(1, n, 1, 3) == 0.0);
    std::vector<double> L(2 * 2 * 13);
    for (std::size_t i = 0; i < L.size(); ++i) L[i] = double(i) - 7.5;
    std::vector<std::vector<std::vector<double>>> lp;
    for (std::size_t r = 0; r < 3; ++r) lp.push_back(shard_stats(p, L, r));
    CHECK(unshard_stats(p, lp) == L);
  }
}

TEST_CASE("context parallel: forward and backward equal the single-process reference, G = 1 … 8", "[attention][ring][numerics]") {
  unsigned long long seed = 1000;
  for (std::size_t G : {1, 2, 3, 4, 8})
    for (bool causal : {false, true})
      for (ShardLayout layout : {ShardLayout::zigzag, ShardLayout::contiguous}) {
        const Case c{G, 1, 4 * G, 2, 2, 8, causal, layout};
        INFO(name(c));
        check_ring(make_problem(c), seed += 10, G <= 4);
      }
}

TEST_CASE("context parallel: d = 64 and 128, GQA, batch > 1", "[attention][ring][numerics][gqa]") {
  const Case cases[] = {
      {2, 1, 16, 4, 2, 64, true, ShardLayout::zigzag},   {4, 1, 24, 4, 1, 64, true, ShardLayout::zigzag},
      {3, 2, 18, 2, 1, 128, false, ShardLayout::contiguous}, {2, 1, 12, 4, 4, 128, true, ShardLayout::zigzag},
      {4, 2, 16, 6, 3, 64, false, ShardLayout::zigzag},
  };
  unsigned long long seed = 2000;
  for (const auto& c : cases) {
    INFO(name(c));
    check_ring(make_problem(c), seed += 10);
  }
}

TEST_CASE("context parallel: N not divisible by the chunks is padded at the end (N = 1, 5, 37)", "[attention][ring][padding]") {
  const Case cases[] = {
      {4, 1, 37, 2, 1, 8, true, ShardLayout::zigzag},       {4, 1, 37, 2, 1, 8, false, ShardLayout::zigzag},
      {3, 2, 37, 2, 2, 8, true, ShardLayout::contiguous},   {3, 1, 37, 2, 2, 8, false, ShardLayout::contiguous},
      {4, 1, 5, 2, 1, 8, true, ShardLayout::zigzag},        {4, 1, 5, 2, 1, 8, false, ShardLayout::zigzag},
      {8, 1, 1, 1, 1, 8, true, ShardLayout::zigzag},        {2, 1, 1, 1, 1, 8, false, ShardLayout::contiguous},
  };
  unsigned long long seed = 3000;
  for (const auto& c : cases) {
    INFO(name(c));
    const auto p = make_problem(c);
    INFO("c = " << p.chunk_len() << ", padded to " << p.padded_seq());
    check_ring(p, seed += 10);
  }
}

TEST_CASE("context parallel: scores of ±800 (base 2) merge without overflow or NaN", "[attention][ring][adversarial]") {
  // Entries of Q and K of size 18: scores Q·K·scale·log2(e) reach ±800 and beyond, past what
  // 2^S holds in float (and 2^(2S) in double), so the merge must subtract before exponentiating.
  const ContextParallelProblem p = make_problem({4, 1, 16, 2, 1, 16, true, ShardLayout::zigzag});
  const Inputs in = random_inputs(p, 4000, 18.0);
  const Whole ref = whole(p, in);
  double lse_max = 0;
  for (double v : ref.f.LSE) lse_max = std::max(lse_max, std::abs(v));
  INFO("max |LSE| = " << lse_max);
  CHECK(lse_max > 800.0);
  check_ring(p, 4000, false, 18.0, 1e-9);
  const auto f = context_parallel_forward(p, in.Q.cast<float>(), in.K.cast<float>(), in.V.cast<float>());
  CHECK_FALSE(has_nan(f.O.data(), f.O.numel()));
  CHECK_FALSE(has_nan(f.LSE.data(), f.LSE.size()));
  INFO("float32 O error " << err(f.O, ref.f.O));
  CHECK(err(f.O, ref.f.O) <= 1e-5);
}

TEST_CASE("context parallel: counted bytes equal the model, by hand and per step", "[attention][ring][traffic]") {
  // G = 4, zigzag, B = 1, N = 64 (c = 8, N_local = 16), H = 4, H_kv = 2, d = 16, bf16:
  // K per step = 16 rows × 2 heads × 16 × 2 bytes = 1024 bytes; dK sums in fp32 = 2048 bytes.
  ContextParallelProblem p = make_problem({4, 1, 64, 4, 2, 16, true, ShardLayout::zigzag});
  p.attention.dtype = Dtype::bf16;
  CHECK(ring_steps(p, RingPass::forward) == 4);
  CHECK(ring_steps(p, RingPass::backward) == 5);
  for (std::size_t s = 0; s < 3; ++s) CHECK(ring_link_bytes(p, RingPass::forward, s) == LinkBytes{1024, 1024, 0, 0});
  CHECK(ring_link_bytes(p, RingPass::forward, 3) == LinkBytes{});
  CHECK(ring_link_bytes(p, RingPass::backward, 0) == LinkBytes{1024, 1024, 0, 0});
  CHECK(ring_link_bytes(p, RingPass::backward, 2) == LinkBytes{1024, 1024, 2048, 2048});
  CHECK(ring_link_bytes(p, RingPass::backward, 3) == LinkBytes{0, 0, 2048, 2048});
  CHECK(ring_link_bytes(p, RingPass::backward, 4) == LinkBytes{0, 0, 2048, 2048});
  CHECK_THROWS_AS(ring_link_bytes(p, RingPass::forward, 4), std::invalid_argument);
  // In total K/V travel G − 1 hops and dK/dV G hops.
  std::uint64_t kv = 0, grads = 0;
  for (std::size_t s = 0; s < 5; ++s) {
    const auto b = ring_link_bytes(p, RingPass::backward, s);
    kv += b.K + b.V;
    grads += b.dK + b.dV;
  }
  CHECK(kv == 3 * 2048);
  CHECK(grads == 4 * 4096);

  // The simulation (double arithmetic) counts the same bytes, rank by rank and step by step.
  const Inputs in = random_inputs(p, 77);
  const auto f = context_parallel_forward(p, in.Q, in.K, in.V);
  std::string why;
  CHECK(counted_equals_model(p, RingPass::forward, f.steps, &why));
  CHECK(why.empty());
  const auto g = context_parallel_backward(p, in.Q, in.K, in.V, f.O, f.LSE, in.dO);
  CHECK(counted_equals_model(p, RingPass::backward, g.steps, &why));
  // A count that differs is caught.
  auto broken = g.steps;
  broken[5].sent.dV += 2;
  CHECK_FALSE(counted_equals_model(p, RingPass::backward, broken, &why));
  CHECK(why.find("step 1 rank 1") != std::string::npos);
  // The FLOPs counted by each block's tile loops equal the single-device formula for that block.
  for (const RankStep& rs : f.steps) {
    std::uint64_t want = 0;
    for (const RingBlock& b : ring_blocks(p, rs.rank, rs.step))
      want += attention_traffic_formula(Algorithm::fa2_fwd, block_problem(p, b)).flops();
    CHECK(rs.flops == want);
    CHECK(rs.kv_source == ring_source(4, rs.rank, rs.step));
  }
  // One rank has no ring: nothing is sent.
  p.gpus = 1;
  CHECK(ring_steps(p, RingPass::backward) == 1);
  CHECK(ring_link_bytes(p, RingPass::backward, 0) == LinkBytes{});
}

TEST_CASE("context parallel: the model says when the link hides behind the compute", "[attention][ring][traffic]") {
  // Zigzag causal: each step is 2·B·H·N_local²·d FLOPs against 2·B·N_local·H_kv·d·2 bytes, so
  // the link hides from N_local ≥ H_kv·2·F / (H·W) (F FLOP/s, W bytes/s): 2·700e12/370e9 ≈ 3784.
  auto model = [](std::size_t n_local) {
    ContextParallelProblem p = make_problem({4, 1, 4 * n_local, 16, 16, 128, true, ShardLayout::zigzag});
    p.attention.dtype = Dtype::bf16;
    return ring_model(p, RingPass::forward, 370e9, 700e12);
  };
  const auto small = model(2048), large = model(8192);
  CHECK_FALSE(small[1].hidden());
  CHECK(large[1].hidden());
  CHECK(large[3].hidden());  // the last step sends nothing
  CHECK(large[3].link_s == 0.0);
  CHECK(small[1].step_s() == small[1].link_s);
  CHECK(large[1].compute_s == Approx(2.0 * 16 * 8192.0 * 8192 * 128 / 700e12).epsilon(1e-12));
  CHECK(large[1].link_s == Approx(2.0 * 8192 * 16 * 128 * 2 / 370e9).epsilon(1e-12));
  CHECK_THROWS_AS(ring_model(make_problem({2, 1, 8, 1, 1, 8, false, ShardLayout::zigzag}), RingPass::forward, 0, 1e12),
                  std::invalid_argument);
}

TEST_CASE("context parallel: bad problems and operands are refused with a message", "[attention][ring][errors]") {
  auto field_of = [](const ContextParallelProblem& p) {
    try {
      p.validate();
    } catch (const ProblemError& e) {
      return e.field();
    }
    return std::string("none");
  };
  ContextParallelProblem p = make_problem({2, 1, 8, 4, 3, 8, true, ShardLayout::zigzag});
  CHECK(field_of(p) == "heads_kv");
  p.heads_kv = 8;
  CHECK(field_of(p) == "heads_kv");
  p.heads_kv = 2;
  CHECK(field_of(p) == "none");
  p.gpus = 0;
  CHECK(field_of(p) == "gpus");
  p.gpus = kMaxRanks + 1;
  CHECK(field_of(p) == "gpus");
  p.gpus = 2;
  p.attention.seq_k = 5;
  CHECK(field_of(p) == "seq_k");
  p.attention.seq_k = 0;
  p.attention.seq = 0;
  CHECK(field_of(p) == "seq");
  p.attention.seq = 8;
  const Inputs in = random_inputs(p, 1);
  Tensor<double> wrong(Shape{1, 8, 4, 8});  // K with H heads instead of H_kv = 2
  CHECK_THROWS_WITH(context_parallel_forward(p, in.Q, wrong, in.V), Catch::Contains("K has shape [1, 8, 4, 8]"));
  CHECK_THROWS_AS(parse_layout("ring"), std::invalid_argument);
  CHECK(parse_layout("zigzag") == ShardLayout::zigzag);
}
