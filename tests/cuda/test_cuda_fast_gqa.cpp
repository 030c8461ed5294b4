// The fast forwards with grouped K/V (H_kv dividing H) and N_k ≠ N (the causal diagonal bottom-right
// aligned: query i sees key j iff j ≤ i + N_k − N) against the float64 reference
// flashlab::ref::naive_forward<double>, on both kernels that take them: mma_sync
// (attention_fwd_tc.cu) and tma_ws (attention_fwd_ws.cu).
//
// Inputs and metric as test_cuda_fast.cpp: fresh normal random Q [B, N, H, d], K and V
// [B, N_k, H_kv, d], rounded to the dtype first (the reference gets the rounded values); O within
// 1e-2 and within 2× the rounding floor (the float64 O merely rounded to the dtype), LSE within
// 1e-4 (ref::max_error_vs_max; NaN fails, −inf agrees only with −inf). Rows that see no key (causal,
// N > N_k) must be O = 0 exactly and LSE = −inf, as the reference says.
// Shapes: H/H_kv = 1, 4, 8, 32; N = 1; N < N_k; N > N_k (causal: rows and whole query tiles without a
// key); N_k = 1; N_k not a multiple of any tile; d = 64 and 128; bf16 and fp16; batch > 1; the tma-ws
// split tail with groups. Tags: [fast][fast-gqa]; a few small shapes also [fast-gqa-sanitize] for
// compute-sanitizer.
#include <catch2/catch.hpp>

#include "flashlab/cuda/fast_attention.hpp"
#include "gpu_test_util.hpp"
#include "flashlab/reference/attention.hpp"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace fc = flashlab::cuda;
namespace fr = flashlab::ref;

using flashlab::test::fresh_seed;
using flashlab::test::round_to_16;

namespace {

constexpr double kTolO = 1e-2;
constexpr double kTolLSE = 1e-4;
constexpr fr::Dtype kBf16 = fr::Dtype::bf16, kFp16 = fr::Dtype::fp16;
constexpr fc::FastForwardKernel kMma = fc::FastForwardKernel::mma_sync, kTmaWs = fc::FastForwardKernel::tma_ws;

struct GqaCase {
  int batch, seq, seq_k, heads, heads_kv, head_dim;
  bool causal;
  fr::Dtype dtype = kBf16;
};

double g_worst_ratio = 0.0;  // worst O error / rounding floor seen

void check_gqa(const GqaCase& c, fc::FastForwardKernel kernel) {
  const unsigned long long seed = fresh_seed();
  const bool bf16 = c.dtype == kBf16;
  const std::string label = std::string(fc::to_string(kernel)) + " " + (bf16 ? "bf16" : "fp16") +
                            " B=" + std::to_string(c.batch) + " N=" + std::to_string(c.seq) +
                            " N_k=" + std::to_string(c.seq_k) + " H=" + std::to_string(c.heads) +
                            " H_kv=" + std::to_string(c.heads_kv) + " d=" + std::to_string(c.head_dim) +
                            (c.causal ? " causal" : "");
  INFO(label << " seed=" << seed << " (rerun with FLASHLAB_TEST_SEED)");
  fr::AttentionProblem cfg;
  cfg.batch = std::size_t(c.batch);
  cfg.seq = std::size_t(c.seq);
  cfg.seq_k = c.seq_k == c.seq ? 0 : std::size_t(c.seq_k);
  cfg.heads = std::size_t(c.heads);
  cfg.heads_kv = c.heads_kv == c.heads ? 0 : std::size_t(c.heads_kv);
  cfg.head_dim = std::size_t(c.head_dim);
  cfg.causal = c.causal;
  cfg.dtype = c.dtype;
  const fr::Shape qs = cfg.q_shape(), kvs = cfg.kv_shape();
  fr::Tensor<double> q0(qs), k0(kvs), v0(kvs), Qd(qs), Kd(kvs), Vd(kvs);
  fr::fill_normal(q0, seed);
  fr::fill_normal(k0, seed + 1);
  fr::fill_normal(v0, seed + 2);
  const auto Qb = round_to_16(q0, c.dtype, Qd), Kb = round_to_16(k0, c.dtype, Kd), Vb = round_to_16(v0, c.dtype, Vd);
  const auto ref = fr::naive_forward<double>(cfg, Qd, Kd, Vd);
  const double e_floor = flashlab::test::rounding_floor(ref.O.data(), ref.O.numel(), c.dtype);

  const auto got = fc::fast_attention_forward(cfg, kernel, Qb, Kb, Vb);
  REQUIRE(got.O.size() == ref.O.numel());
  REQUIRE(got.LSE.size() == ref.LSE.size());
  const double eO = flashlab::test::error_16(got.O, ref.O.data(), c.dtype);
  const double eL = fr::max_error_vs_max(got.LSE.data(), ref.LSE.data(), got.LSE.size());
  // Rows without a key: the reference's LSE is −inf there; the kernel's O row must be zero exactly.
  std::size_t empty_rows = 0, empty_wrong = 0;
  const std::size_t d = cfg.head_dim;
  for (std::size_t b = 0; b < cfg.batch; ++b)
    for (std::size_t h = 0; h < cfg.heads; ++h)
      for (std::size_t i = 0; i < cfg.seq; ++i) {
        const std::size_t stat = (b * cfg.heads + h) * cfg.seq + i;
        if (!std::isinf(ref.LSE[stat])) continue;
        ++empty_rows;
        bool ok = std::isinf(got.LSE[stat]) && got.LSE[stat] < 0;
        const std::size_t o = ((b * cfg.seq + i) * cfg.heads + h) * d;
        for (std::size_t e = 0; e < d; ++e) ok = ok && flashlab::test::to_float(got.O[o + e], c.dtype) == 0.0f;
        empty_wrong += !ok;
      }
  std::printf("  %-58s O error %.3e (rounding floor %.3e, %.2fx)  LSE error %.3e  rows without keys %zu\n",
              label.c_str(), eO, e_floor, e_floor > 0 ? eO / e_floor : 0.0, eL, empty_rows);
  if (e_floor > 0 && !(eO / e_floor <= g_worst_ratio)) g_worst_ratio = eO / e_floor;
  INFO("O error " << eO << " (floor " << e_floor << "), LSE error " << eL << ", rows without keys " << empty_rows
                  << " of which wrong " << empty_wrong);
  CHECK(eO <= kTolO);
  CHECK(eO <= 2.0 * e_floor + 1e-7);
  CHECK(eL <= kTolLSE);
  CHECK(empty_wrong == 0);
  if (c.causal && c.seq > c.seq_k) CHECK(empty_rows == std::size_t(c.batch) * c.heads * (c.seq - c.seq_k));
}

/// The kernels to check: mma_sync everywhere, tma_ws where it is built and the device runs it.
std::vector<fc::FastForwardKernel> kernels() {
  std::vector<fc::FastForwardKernel> k = {kMma};
  if (fc::fastest_forward_kernel() == kTmaWs) k.push_back(kTmaWs);
  else WARN("tma-ws forward not in this build or not on this device: mma_sync only");
  return k;
}

void report(const char* name) {
  std::printf("[%s] worst O error / rounding floor %.2f (bound 2)\n", name, g_worst_ratio);
  g_worst_ratio = 0.0;
}

}  // namespace

// A few small shapes for compute-sanitizer (memcheck, racecheck): grouped K/V with N > N_k causal
// (units and rows without keys), N < N_k with a ragged key tile, both head dims.
TEST_CASE("fast forward, grouped K/V and N_k != N, sanitizer shapes", "[fast][fast-gqa][fast-gqa-sanitize]") {
  for (const auto kernel : kernels()) {
    check_gqa({1, 300, 77, 4, 1, 64, true}, kernel);
    check_gqa({2, 33, 150, 8, 2, 128, false}, kernel);
    check_gqa({1, 100, 333, 4, 2, 128, true}, kernel);
  }
  report("gqa sanitizer shapes");
}

TEST_CASE("fast forward, grouped K/V and N_k != N, small shapes, equal the float64 reference",
          "[fast][fast-gqa]") {
  for (const auto kernel : kernels()) {
    for (bool causal : {false, true})
      for (int d : {64, 128}) {
        check_gqa({1, 70, 70, 4, 1, d, causal}, kernel);    // H/H_kv = 4 (multi-query), N_k = N
        check_gqa({2, 33, 150, 8, 2, d, causal}, kernel);   // N < N_k, batch > 1, a ragged key tile
        check_gqa({1, 150, 40, 4, 2, d, causal}, kernel);   // N > N_k: causal rows 0 .. 109 see no key
        check_gqa({1, 1, 77, 4, 4, d, causal}, kernel);     // N = 1 (decoding), H_kv = H
        check_gqa({1, 20, 1, 2, 1, d, causal}, kernel);     // N_k = 1: causal, the last row alone sees it
      }
    check_gqa({1, 33, 150, 8, 2, 128, true, kFp16}, kernel);
    check_gqa({1, 150, 40, 4, 1, 64, true, kFp16}, kernel);
  }
  report("gqa small");
}

TEST_CASE("fast forward, H = 32 with H_kv = 1 and 8, equals the float64 reference", "[fast][fast-gqa]") {
  for (const auto kernel : kernels()) {
    for (int hkv : {1, 8})
      for (bool causal : {false, true}) {
        check_gqa({1, 300, 300, 32, hkv, 128, causal}, kernel);
        check_gqa({1, 200, 517, 32, hkv, 64, causal}, kernel);
      }
    check_gqa({1, 517, 200, 32, 8, 128, true, kFp16}, kernel);  // 317 rows without a key, several query tiles
    check_gqa({1, 1, 1000, 32, 8, 128, false}, kernel);         // one query against 1000 keys
    check_gqa({1, 1, 1000, 32, 1, 64, true, kFp16}, kernel);
  }
  report("gqa H = 32");
}

TEST_CASE("fast forward, many query tiles without keys and long key lists", "[fast][fast-gqa]") {
  for (const auto kernel : kernels()) {
    // Causal N ≫ N_k: every block's work list ends in units without keys (tma-ws), for both tiles.
    for (int d : {64, 128}) check_gqa({2, 2000, 100, 8, 1, d, true}, kernel);
    check_gqa({1, 1500, 1499, 4, 2, 128, true}, kernel);  // offset −1: the diagonal one key left
    check_gqa({1, 600, 1800, 8, 2, 64, true}, kernel);    // offset +1200: long causal rows
    check_gqa({1, 600, 1800, 8, 2, 128, false, kFp16}, kernel);
    // tma-ws d = 64 without a mask, 560 units of 192 rows on an H100's 132 SMs: the last round is cut
    // along the 4 key tiles of N_k = 450 and combined by a second kernel (ws_unit with groups of 4).
    check_gqa({1, 600, 450, 140, 35, 64, false}, kernel);
    // d = 128, N_k where the tma-ws wide key tiles (Bc = 192) run: 1152 = 6 × 192.
    check_gqa({1, 300, 1152, 8, 2, 128, false}, kernel);
  }
  report("gqa long");
}
