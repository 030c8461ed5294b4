// Attention traffic: the bytes the tile loops count equal the closed-form formulas, per kernel and
// in total, for every variant, with and without causal, ragged tails, Br ≠ Bc, N_q ≠ N_k, B and
// H > 1, and every dtype; plus hand-computed values and the Triton walkthrough's FLOP counts.
#include <catch2/catch.hpp>

#include "flashlab/reference/attention.hpp"
#include "flashlab/reference/attention_traffic.hpp"

#include <sstream>

using namespace flashlab::ref;

namespace {

AttentionProblem cfg_of(std::size_t B, std::size_t Nq, std::size_t Nk, std::size_t H, std::size_t d, std::size_t Br,
                       std::size_t Bc, bool causal, Dtype dt = Dtype::fp32) {
  AttentionProblem c;
  c.batch = B;
  c.seq = Nq;
  c.seq_k = Nk == Nq ? 0 : Nk;
  c.heads = H;
  c.head_dim = d;
  c.Br = Br;
  c.Bc = Bc;
  c.causal = causal;
  c.dtype = dt;
  return c;
}

void require_same(const Traffic& counted, const Traffic& formula, const std::string& what) {
  std::string why;
  INFO(what);
  const bool same = same_counts(counted, formula, &why);
  INFO(why);
  CHECK(same);
  CHECK(counted.total_read_bytes() == formula.total_read_bytes());
  CHECK(counted.total_write_bytes() == formula.total_write_bytes());
}

void require_same_kernels(const std::vector<KernelTraffic>& counted, const std::vector<KernelTraffic>& formula,
                          const std::string& what) {
  REQUIRE(counted.size() == formula.size());
  for (std::size_t k = 0; k < counted.size(); ++k) {
    CHECK(counted[k].name == formula[k].name);
    require_same(counted[k].traffic, formula[k].traffic, what + " / " + counted[k].name);
  }
}

}  // namespace

TEST_CASE("attention traffic: counted bytes equal the formulas for every variant and shape", "[attention][traffic]") {
  const AttentionProblem configs[] = {
      cfg_of(1, 1, 1, 1, 16, 4, 4, false),        cfg_of(1, 1, 1, 1, 16, 4, 4, true),
      cfg_of(1, 37, 37, 1, 8, 16, 8, false),      cfg_of(1, 37, 37, 1, 8, 16, 8, true),
      cfg_of(1, 37, 37, 1, 8, 8, 16, true),       cfg_of(2, 23, 23, 3, 4, 5, 7, true, Dtype::bf16),
      cfg_of(1, 64, 64, 2, 8, 16, 16, true),      cfg_of(1, 64, 64, 1, 8, 16, 32, false, Dtype::fp16),
      cfg_of(1, 20, 13, 2, 8, 6, 4, true),        cfg_of(1, 9, 30, 1, 8, 4, 7, true),
      cfg_of(1, 9, 30, 1, 8, 4, 7, false),        cfg_of(2, 13, 5, 1, 4, 3, 2, true, Dtype::fp64),
      cfg_of(1, 40, 40, 1, 4, 64, 64, true),      cfg_of(1, 33, 33, 1, 4, 1, 1, true),
  };
  unsigned long long seed = 900;
  for (const auto& cfg : configs) {
    const std::string what = cfg.str();
    Tensor<double> Q(cfg.q_shape()), K(cfg.kv_shape()), V(cfg.kv_shape()), dO(cfg.q_shape());
    fill_normal(Q, seed++);
    fill_normal(K, seed++);
    fill_normal(V, seed++);
    fill_normal(dO, seed++);

    const auto naive = naive_forward(cfg, Q, K, V);
    require_same(naive.traffic, attention_traffic_formula(Algorithm::naive_fwd, cfg), what + " naive_fwd");
    require_same_kernels(naive.kernels, attention_traffic_kernels(Algorithm::naive_fwd, cfg), what + " naive_fwd");

    const auto fa2 = flash_forward_fa2(cfg, Q, K, V);
    require_same(fa2.traffic, attention_traffic_formula(Algorithm::fa2_fwd, cfg), what + " fa2_fwd");

    const auto fa1 = flash_forward_fa1(cfg, Q, K, V);
    require_same(fa1.traffic, attention_traffic_formula(Algorithm::fa1_fwd, cfg), what + " fa1_fwd");

    const auto nb = naive_backward(cfg, Q, K, V, dO);
    require_same(nb.traffic, attention_traffic_formula(Algorithm::naive_bwd, cfg), what + " naive_bwd");
    require_same_kernels(nb.kernels, attention_traffic_kernels(Algorithm::naive_bwd, cfg), what + " naive_bwd");

    const auto two = flash_backward_two_kernel(cfg, Q, K, V, fa2.O, fa2.LSE, dO);
    require_same(two.traffic, attention_traffic_formula(Algorithm::bwd_two_kernel, cfg), what + " two-kernel");
    require_same_kernels(two.kernels, attention_traffic_kernels(Algorithm::bwd_two_kernel, cfg), what + " two-kernel");

    const auto atom = flash_backward_atomic(cfg, Q, K, V, fa2.O, fa2.LSE, dO);
    require_same(atom.traffic, attention_traffic_formula(Algorithm::bwd_atomic, cfg), what + " atomic");
    require_same_kernels(atom.kernels, attention_traffic_kernels(Algorithm::bwd_atomic, cfg), what + " atomic");
  }
}

TEST_CASE("attention traffic: the float loops count the same bytes as the double loops", "[attention][traffic]") {
  const auto cfg = cfg_of(1, 29, 29, 2, 8, 8, 5, true, Dtype::bf16);
  Tensor<float> Q(cfg.q_shape()), K(cfg.kv_shape()), V(cfg.kv_shape());
  fill_normal(Q, 1);
  fill_normal(K, 2);
  fill_normal(V, 3);
  require_same(flash_forward_fa2(cfg, Q, K, V).traffic, attention_traffic_formula(Algorithm::fa2_fwd, cfg), "fa2 float");
  require_same(flash_forward_fa1(cfg, Q, K, V).traffic, attention_traffic_formula(Algorithm::fa1_fwd, cfg), "fa1 float");
}

TEST_CASE("attention traffic: visible key tiles match an element-by-element mask scan", "[attention][traffic]") {
  for (std::size_t nq : {1u, 7u, 16u, 21u}) {
    for (std::size_t nk : {1u, 5u, 16u, 30u}) {
      for (std::size_t br : {1u, 3u, 8u}) {
        for (std::size_t bc : {1u, 4u, 9u}) {
          const auto cfg = cfg_of(1, nq, nk, 1, 4, br, bc, true);
          for (std::size_t i = 0; i < cfg.Tr(); ++i) {
            // Brute force: key tile j is visited iff some (row, key) in the tile pair is visible.
            std::size_t last_visible = 0;
            for (std::size_t j = 0; j < cfg.Tc(); ++j) {
              bool any = false;
              for (std::size_t r = i * br; r < std::min((i + 1) * br, nq); ++r)
                for (std::size_t c = j * bc; c < std::min((j + 1) * bc, nk); ++c)
                  any = any || static_cast<long long>(c) <= static_cast<long long>(r) + cfg.causal_offset();
              if (any) last_visible = j + 1;
            }
            INFO(cfg.str() << " tile " << i);
            CHECK(visible_key_tiles(cfg, i) == last_visible);
          }
        }
      }
    }
  }
}

TEST_CASE("attention traffic: hand-computed counts (N = 8, d = 2, Br = Bc = 4, fp32)", "[attention][traffic]") {
  const auto cfg = cfg_of(1, 8, 8, 1, 2, 4, 4, false);
  // FA2: Q 8·2 once; K, V reloaded for each of Tr = 2 query tiles: 2·8·2 = 32 each; O 16, LSE 8.
  const auto fa2 = attention_traffic_formula(Algorithm::fa2_fwd, cfg);
  CHECK(fa2.read_bytes("Q") == 16 * 4);
  CHECK(fa2.read_bytes("K") == 32 * 4);
  CHECK(fa2.read_bytes("V") == 32 * 4);
  CHECK(fa2.write_bytes("O") == 16 * 4);
  CHECK(fa2.write_bytes("LSE") == 8 * 4);
  CHECK(fa2.flops() == 4 * 8 * 8 * 2);
  // FA1: K, V once (16 each); Q once per (key tile, query tile) pair: 2·16 = 32; O written each of
  // Tc = 2 visits (32), read on the second (16); m, l written on the first (8) and read on the second (8).
  const auto fa1 = attention_traffic_formula(Algorithm::fa1_fwd, cfg);
  CHECK(fa1.read_bytes("K") == 16 * 4);
  CHECK(fa1.read_bytes("Q") == 32 * 4);
  CHECK(fa1.read_bytes("O") == 16 * 4);
  CHECK(fa1.write_bytes("O") == 32 * 4);
  CHECK(fa1.read_bytes("m") == 8 * 4);
  CHECK(fa1.write_bytes("l") == 8 * 4);
  CHECK(fa1.write_bytes("LSE") == 8 * 4);
  // naive: S and P, 8×8 each, written once and read once (P read by O = PV).
  const auto naive = attention_traffic_formula(Algorithm::naive_fwd, cfg);
  CHECK(naive.write_bytes("S") == 64 * 4);
  CHECK(naive.read_bytes("S") == 64 * 4);
  CHECK(naive.write_bytes("P") == 64 * 4);
  CHECK(naive.read_bytes("P") == 64 * 4);
  // causal: query tile 0 sees key tile 0 only, tile 1 sees both: K rows loaded 4 + 8 = 12.
  auto causal = cfg;
  causal.causal = true;
  CHECK(attention_traffic_formula(Algorithm::fa2_fwd, causal).read_bytes("K") == 12 * 2 * 4);
}

TEST_CASE("attention traffic: FLOPs are 4N²d forward, 14N²d two-kernel, 10N²d atomic (plus D)", "[attention][traffic]") {
  const std::uint64_t N = 256, d = 64;
  const auto cfg = cfg_of(1, N, N, 1, d, 64, 32, false);
  CHECK(attention_traffic_formula(Algorithm::fa2_fwd, cfg).flops() == 4 * N * N * d);
  CHECK(attention_traffic_formula(Algorithm::fa1_fwd, cfg).flops() == 4 * N * N * d);
  CHECK(attention_traffic_formula(Algorithm::naive_fwd, cfg).flops() == 4 * N * N * d);
  // The Triton walkthrough says 12N²d for the two kernels, counting the QKᵀ recompute twice; dO·Vᵀ is recomputed
  // in both kernels as well, which the Triton walkthrough's count leaves out: 6N²d + 8N²d = 14N²d.
  const auto two = attention_traffic_kernels(Algorithm::bwd_two_kernel, cfg);
  REQUIRE(two.size() == 3);
  CHECK(two[0].traffic.flops() == 2 * N * d);          // D preprocessing
  CHECK(two[1].traffic.flops() == 6 * N * N * d);      // dQ kernel: S, dP, dQ
  CHECK(two[2].traffic.flops() == 8 * N * N * d);      // dK/dV kernel: S, dV, dP, dK
  CHECK(attention_traffic_formula(Algorithm::bwd_atomic, cfg).flops() == 10 * N * N * d + 2 * N * d);
}

TEST_CASE("attention traffic: formulas are cheap at N = 16384 and FA2 beats FA1 beats naive", "[attention][traffic]") {
  const std::uint64_t N = 16384, d = 64;
  const auto cfg = cfg_of(1, N, N, 1, d, 128, 64, false, Dtype::fp16);
  const auto naive = attention_traffic_formula(Algorithm::naive_fwd, cfg);
  const auto fa1 = attention_traffic_formula(Algorithm::fa1_fwd, cfg);
  const auto fa2 = attention_traffic_formula(Algorithm::fa2_fwd, cfg);
  const auto total = [](const Traffic& t) { return t.total_read_bytes() + t.total_write_bytes(); };
  CHECK(fa2.read_bytes("K") == (N / 128) * N * d * 2);  // K reloaded once per query tile (Tr = 128)
  CHECK(fa1.write_bytes("O") == (N / 64) * N * d * 2);  // O stored once per key tile (Tc = 256)
  CHECK(total(fa2) < total(fa1));
  CHECK(total(fa1) < total(naive));
  auto causal = cfg;
  causal.causal = true;
  CHECK(total(attention_traffic_formula(Algorithm::fa2_fwd, causal)) < total(fa2));
  const auto two = attention_traffic_formula(Algorithm::bwd_two_kernel, cfg);
  const auto atom = attention_traffic_formula(Algorithm::bwd_atomic, cfg);
  CHECK(atom.read_bytes("dQ") > 0);
  CHECK(two.read_bytes("dQ") == 0);
}
