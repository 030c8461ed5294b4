// Attention traffic: the bytes the tile loops count equal the closed-form formulas, per kernel and
// in total, for every variant, with and without causal, ragged tails, Br ≠ Bc, N_q ≠ N_k, B and
// H > 1, and every dtype; plus hand-computed values and the Triton walkthrough's FLOP counts.
#include <catch2/catch.hpp>

#include "flashlab/reference/attention.hpp"
#include "flashlab/reference/attention_traffic.hpp"

#include <cstdint>
#include <sstream>
#include <utility>
#include <vector>

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

namespace {

AttentionProblem with_features(AttentionProblem c, std::size_t heads_kv, bool causal, long long left, long long right) {
  c.heads_kv = heads_kv;
  c.causal = causal;
  c.window_left = left;
  c.window_right = right;
  return c;
}

AttentionProblem packed_of(std::vector<std::int32_t> cu_q, std::vector<std::int32_t> cu_k, std::size_t H,
                           std::size_t Hkv, std::size_t d, std::size_t Br, std::size_t Bc, bool causal, long long left,
                           long long right, Dtype dt = Dtype::fp32) {
  AttentionProblem c = cfg_of(1, 1, 1, H, d, Br, Bc, causal, dt);
  c.set_packed(PackedSequences(std::move(cu_q), std::move(cu_k)));
  return with_features(c, Hkv, causal, left, right);
}

}  // namespace

TEST_CASE("attention traffic: counts equal the formulas with grouped K/V, windows and packed sequences",
          "[attention][traffic]") {
  const AttentionProblem configs[] = {
      with_features(cfg_of(2, 23, 23, 4, 4, 5, 7, false), 1, false, -1, -1),
      with_features(cfg_of(1, 23, 23, 8, 4, 5, 7, true, Dtype::bf16), 2, true, -1, -1),
      with_features(cfg_of(1, 30, 30, 2, 4, 4, 4, false), 2, false, 3, 2),
      with_features(cfg_of(1, 30, 30, 2, 4, 4, 6, true), 1, true, 5, -1),
      with_features(cfg_of(1, 9, 40, 4, 4, 4, 7, true, Dtype::fp16), 2, true, 11, 3),
      with_features(cfg_of(2, 40, 9, 2, 4, 8, 3, false), 1, false, 0, 0),
      with_features(cfg_of(1, 17, 17, 1, 4, 3, 5, false), 1, false, 1000, 1000),
      packed_of({0, 3, 3, 4, 21, 26}, {0, 3, 9, 10, 30, 30}, 4, 2, 4, 4, 3, false, -1, -1),
      packed_of({0, 3, 3, 4, 21, 26}, {0, 3, 9, 10, 30, 30}, 4, 2, 4, 4, 3, true, -1, -1, Dtype::bf16),
      packed_of({0, 12, 19, 20}, {0, 5, 12, 60}, 2, 1, 4, 5, 4, true, 6, -1),
      packed_of({0, 1, 2, 3}, {0, 40, 41, 90}, 8, 8, 4, 16, 16, false, 7, 0),
  };
  unsigned long long seed = 1900;
  for (const auto& cfg : configs) {
    const std::string what = cfg.str();
    Tensor<double> Q(cfg.q_shape()), K(cfg.kv_shape()), V(cfg.kv_shape()), dO(cfg.q_shape());
    fill_normal(Q, seed++);
    fill_normal(K, seed++);
    fill_normal(V, seed++);
    fill_normal(dO, seed++);
    const auto naive = naive_forward(cfg, Q, K, V);
    require_same_kernels(naive.kernels, attention_traffic_kernels(Algorithm::naive_fwd, cfg), what + " naive_fwd");
    const auto fa2 = flash_forward_fa2(cfg, Q, K, V);
    require_same(fa2.traffic, attention_traffic_formula(Algorithm::fa2_fwd, cfg), what + " fa2_fwd");
    const auto fa2g = flash_forward_fa2(cfg, Q, K, V, ForwardOptions{KvLoads::per_group});
    require_same(fa2g.traffic, attention_traffic_formula(Algorithm::fa2_fwd, cfg, KvLoads::per_group),
                 what + " fa2_fwd per group");
    const auto fa1 = flash_forward_fa1(cfg, Q, K, V);
    require_same(fa1.traffic, attention_traffic_formula(Algorithm::fa1_fwd, cfg), what + " fa1_fwd");
    const auto nb = naive_backward(cfg, Q, K, V, dO);
    require_same_kernels(nb.kernels, attention_traffic_kernels(Algorithm::naive_bwd, cfg), what + " naive_bwd");
    const auto two = flash_backward_two_kernel(cfg, Q, K, V, fa2.O, fa2.LSE, dO);
    require_same_kernels(two.kernels, attention_traffic_kernels(Algorithm::bwd_two_kernel, cfg), what + " two-kernel");
    BackwardOptions grouped;
    grouped.kv_loads = KvLoads::per_group;
    const auto twog = flash_backward_two_kernel(cfg, Q, K, V, fa2.O, fa2.LSE, dO, grouped);
    require_same_kernels(twog.kernels, attention_traffic_kernels(Algorithm::bwd_two_kernel, cfg, KvLoads::per_group),
                         what + " two-kernel per group");
    const auto atom = flash_backward_atomic(cfg, Q, K, V, fa2.O, fa2.LSE, dO);
    require_same_kernels(atom.kernels, attention_traffic_kernels(Algorithm::bwd_atomic, cfg), what + " atomic");
  }
}

TEST_CASE("attention traffic: visible key tile ranges match an element-by-element mask scan", "[attention][traffic]") {
  // Windows on each side, causal or not, the diagonal shifted both ways, ragged tiles.
  const std::pair<long long, long long> windows[] = {{-1, -1}, {0, 0}, {2, -1}, {-1, 1}, {3, 4}, {30, 30}};
  std::size_t checked = 0;
  for (std::size_t nq : {1u, 7u, 16u}) {
    for (std::size_t nk : {1u, 5u, 21u}) {
      for (std::size_t br : {1u, 3u, 8u}) {
        for (std::size_t bc : {1u, 4u, 9u}) {
          for (bool causal : {false, true}) {
            for (auto [left, right] : windows) {
              const auto cfg = with_features(cfg_of(1, nq, nk, 1, 4, br, bc, causal), 0, causal, left, right);
              const SequenceSpan s = cfg.sequence(0);
              for (std::size_t i = 0; i < cfg.Tr(); ++i) {
                // Brute force: key tile j is visited iff some (row, key) of the pair is visible.
                std::size_t first = SIZE_MAX, end = 0, visited = 0;
                for (std::size_t j = 0; j < cfg.Tc(); ++j) {
                  bool any = false;
                  for (std::size_t r = i * br; r < std::min((i + 1) * br, nq); ++r) {
                    const long long diag = static_cast<long long>(r) + cfg.causal_offset();
                    for (std::size_t c = j * bc; c < std::min((j + 1) * bc, nk); ++c) {
                      const long long k = static_cast<long long>(c);
                      any = any || ((!causal || k <= diag) && (left < 0 || k >= diag - left) &&
                                    (right < 0 || k <= diag + right));
                    }
                  }
                  if (!any) continue;
                  first = std::min(first, j);
                  end = j + 1;
                  ++visited;
                }
                if (end > 0) CHECK(visited == end - first);  // one contiguous range, no gap inside
                const KeyTileRange got = visible_key_tile_range(cfg, s, i);
                INFO(cfg.str() << " tile " << i);
                if (end == 0) {
                  CHECK(got.count() == 0);
                } else {
                  CHECK(got.first == first);
                  CHECK(got.end == end);
                }
                ++checked;
              }
            }
          }
        }
      }
    }
  }
  CHECK(checked > 1000);
}

TEST_CASE("attention traffic: hand-computed counts for grouped K/V, a window and packed sequences",
          "[attention][traffic]") {
  // Grouped: B = 1, N = 8, H = 4 query heads on H_kv = 1 K/V head, d = 2, Br = Bc = 4, fp32.
  const auto gqa = with_features(cfg_of(1, 8, 8, 4, 2, 4, 4, false), 1, false, -1, -1);
  // FA2, once per query head: each of the H = 4 heads reloads K for each of Tr = 2 query tiles:
  // 4·2·8·2 = 128 elements. Once per group: 2·8·2 = 32.
  CHECK(attention_traffic_formula(Algorithm::fa2_fwd, gqa).read_bytes("K") == 128 * 4);
  CHECK(attention_traffic_formula(Algorithm::fa2_fwd, gqa, KvLoads::per_group).read_bytes("K") == 32 * 4);
  CHECK(attention_traffic_formula(Algorithm::fa2_fwd, gqa).read_bytes("Q") == 4 * 8 * 2 * 4);
  // FA1 and the key-tile-outer backward kernels: K once per K/V head (8·2 = 16); dK written once.
  CHECK(attention_traffic_formula(Algorithm::fa1_fwd, gqa).read_bytes("K") == 16 * 4);
  const auto two = attention_traffic_kernels(Algorithm::bwd_two_kernel, gqa);
  CHECK(two[1].traffic.read_bytes("K") == 128 * 4);  // dQ kernel: per query head
  CHECK(two[2].traffic.read_bytes("K") == 16 * 4);   // dK/dV kernel: per K/V head
  CHECK(two[2].traffic.write_bytes("dK") == 16 * 4);
  CHECK(two[2].traffic.read_bytes("Q") == 4 * 2 * 8 * 2 * 4);  // every head's Q, once per key tile
  // naive: S = QKᵀ reads K per query head (4·16), dK = Σ_h dS_hᵀ Q_h written once (16).
  CHECK(attention_traffic_formula(Algorithm::naive_fwd, gqa).read_bytes("K") == 64 * 4);
  CHECK(attention_traffic_formula(Algorithm::naive_bwd, gqa).write_bytes("dK") == 16 * 4);

  // Window (1, 0) without causal, N = 8, Br = Bc = 2, d = 2: query tile i (rows 2i, 2i + 1) sees
  // keys 2i − 1 … 2i + 1, so tile 0 visits key tile 0 (2 rows) and tiles 1–3 visit key tiles
  // i − 1 and i (4 rows): K rows loaded 2 + 3·4 = 14, elements 28; scores 2·2 + 3·2·4 = 28.
  const auto win = with_features(cfg_of(1, 8, 8, 1, 2, 2, 2, false), 0, false, 1, 0);
  CHECK(attention_traffic_formula(Algorithm::fa2_fwd, win).read_bytes("K") == 28 * 4);
  CHECK(attention_traffic_formula(Algorithm::fa2_fwd, win).flops() == 4 * 2 * 28);

  // Packed, query lengths 3, 0, 5 and key lengths 3, 2, 5, H = 1, d = 1, Br = Bc = 4: FA2 loads
  // each sequence's keys once per query tile: 1·3 + 0 + 2·5 = 13; the dK/dV kernel loads every
  // key once (3 + 2 + 5 = 10), the second sequence's too, and writes dK = 0 for it.
  const auto pk = packed_of({0, 3, 3, 8}, {0, 3, 5, 10}, 1, 1, 1, 4, 4, false, -1, -1);
  CHECK(attention_traffic_formula(Algorithm::fa2_fwd, pk).read_bytes("K") == 13 * 4);
  CHECK(attention_traffic_kernels(Algorithm::bwd_two_kernel, pk)[2].traffic.read_bytes("K") == 10 * 4);
  CHECK(attention_traffic_formula(Algorithm::naive_fwd, pk).write_bytes("S") == (3 * 3 + 0 + 5 * 5) * 4);
}

TEST_CASE("attention traffic: B equal packed sequences cost what the dense batch costs", "[attention][traffic]") {
  // Packing B sequences of one length lays Q, O out exactly as the dense [B, N, H, d] (LSE is
  // [H, total] instead of [B, H, N]): the same outputs and the same counts.
  for (bool causal : {false, true}) {
    AttentionProblem dense = with_features(cfg_of(3, 10, 14, 4, 4, 4, 3, causal), 2, causal, 5, -1);
    AttentionProblem pk = packed_of({0, 10, 20, 30}, {0, 14, 28, 42}, 4, 2, 4, 4, 3, causal, 5, -1);
    Tensor<double> Q(dense.q_shape()), K(dense.kv_shape()), V(dense.kv_shape());
    fill_normal(Q, 5);
    fill_normal(K, 6);
    fill_normal(V, 7);
    Tensor<double> Qp(pk.q_shape()), Kp(pk.kv_shape()), Vp(pk.kv_shape());
    Qp.storage() = Q.storage();
    Kp.storage() = K.storage();
    Vp.storage() = V.storage();
    const auto a = flash_forward_fa2(dense, Q, K, V);
    const auto b = flash_forward_fa2(pk, Qp, Kp, Vp);
    CHECK(a.O.storage() == b.O.storage());
    for (std::size_t s = 0; s < 3; ++s)
      for (std::size_t h = 0; h < 4; ++h)
        for (std::size_t i = 0; i < 10; ++i) CHECK(a.LSE[(s * 4 + h) * 10 + i] == b.LSE[h * 30 + s * 10 + i]);
    for (Algorithm v : {Algorithm::naive_fwd, Algorithm::fa1_fwd, Algorithm::fa2_fwd, Algorithm::naive_bwd,
                        Algorithm::bwd_two_kernel, Algorithm::bwd_atomic}) {
      INFO(algorithm_name(v));
      require_same(attention_traffic_formula(v, pk), attention_traffic_formula(v, dense), "packed vs dense");
    }
  }
}
