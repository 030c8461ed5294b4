// The split-KV forward (FastForwardKernel::split_kv, attention_fwd_splitkv.cu) against the float64
// reference flashlab::ref::naive_forward<double>: few query rows against short and long key lists,
// grouped K/V, the causal diagonal bottom-right aligned (query i sees key j iff j ≤ i + N_k − N).
//
// Inputs and metric as test_cuda_fast_gqa.cpp: fresh normal random Q [B, N, H, d], K and V
// [B, N_k, H_kv, d], rounded to the dtype first (the reference gets the rounded values); O within
// 1e-2 and within 2× the rounding floor (the float64 O merely rounded to the dtype), LSE within
// 1e-4 (ref::max_error_vs_max; NaN fails, −inf agrees only with −inf); O and LSE are poisoned with
// NaN before the launch, so a row nobody writes fails. Rows that see no key (causal, N > N_k) must
// be O = 0 exactly and LSE = −inf.
// Shapes: N = 1, 2, 16, 128 (and 300); N_k = 1, 63, 4097, 65536; H/H_kv = 1, 4, 32; causal and
// not; d = 64 and 128; bf16 and fp16; one key range (the block writes O itself) and several (the
// combine kernel); rows without a key on both paths. Tags: [fast][fast-splitkv]; a few small shapes
// also [fast-splitkv-sanitize] for compute-sanitizer.
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
constexpr fc::FastForwardKernel kSplitKv = fc::FastForwardKernel::split_kv;

struct SplitCase {
  int batch, seq, seq_k, heads, heads_kv, head_dim;
  bool causal;
  fr::Dtype dtype = kBf16;
};

double g_worst_ratio = 0.0;  // worst O error / rounding floor seen

fr::AttentionProblem problem_of(const SplitCase& c) {
  fr::AttentionProblem cfg;
  cfg.batch = std::size_t(c.batch);
  cfg.seq = std::size_t(c.seq);
  cfg.seq_k = c.seq_k == c.seq ? 0 : std::size_t(c.seq_k);
  cfg.heads = std::size_t(c.heads);
  cfg.heads_kv = c.heads_kv == c.heads ? 0 : std::size_t(c.heads_kv);
  cfg.head_dim = std::size_t(c.head_dim);
  cfg.causal = c.causal;
  cfg.dtype = c.dtype;
  return cfg;
}

void check_split(const SplitCase& c) {
  const unsigned long long seed = fresh_seed();
  const bool bf16 = c.dtype == kBf16;
  const std::string label = std::string(bf16 ? "bf16" : "fp16") + " B=" + std::to_string(c.batch) +
                            " N=" + std::to_string(c.seq) + " N_k=" + std::to_string(c.seq_k) +
                            " H=" + std::to_string(c.heads) + " H_kv=" + std::to_string(c.heads_kv) +
                            " d=" + std::to_string(c.head_dim) + (c.causal ? " causal" : "");
  INFO(label << " seed=" << seed << " (rerun with FLASHLAB_TEST_SEED)");
  const fr::AttentionProblem cfg = problem_of(c);
  const fr::Shape qs = cfg.q_shape(), kvs = cfg.kv_shape();
  fr::Tensor<double> q0(qs), k0(kvs), v0(kvs), Qd(qs), Kd(kvs), Vd(kvs);
  fr::fill_normal(q0, seed);
  fr::fill_normal(k0, seed + 1);
  fr::fill_normal(v0, seed + 2);
  const auto Qb = round_to_16(q0, c.dtype, Qd), Kb = round_to_16(k0, c.dtype, Kd), Vb = round_to_16(v0, c.dtype, Vd);
  const auto ref = fr::naive_forward<double>(cfg, Qd, Kd, Vd);
  const double e_floor = flashlab::test::rounding_floor(ref.O.data(), ref.O.numel(), c.dtype);

  const auto got = fc::fast_attention_forward(cfg, kSplitKv, Qb, Kb, Vb);
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
  const fc::FastTiles tiles = fc::fast_forward_tiles(cfg, kSplitKv);
  std::printf("  %-52s Br=%-3d O error %.3e (rounding floor %.3e, %.2fx)  LSE error %.3e  rows without keys %zu\n",
              label.c_str(), tiles.Br, eO, e_floor, e_floor > 0 ? eO / e_floor : 0.0, eL, empty_rows);
  if (e_floor > 0 && !(eO / e_floor <= g_worst_ratio)) g_worst_ratio = eO / e_floor;
  INFO("O error " << eO << " (floor " << e_floor << "), LSE error " << eL << ", rows without keys " << empty_rows
                  << " of which wrong " << empty_wrong);
  CHECK(eO <= kTolO);
  CHECK(eO <= 2.0 * e_floor + 1e-7);
  CHECK(eL <= kTolLSE);
  CHECK(empty_wrong == 0);
  if (c.causal && c.seq > c.seq_k) CHECK(empty_rows == std::size_t(c.batch) * c.heads * (c.seq - c.seq_k));
}

void report(const char* name) {
  std::printf("[%s] worst O error / rounding floor %.2f (bound 2)\n", name, g_worst_ratio);
  g_worst_ratio = 0.0;
}

}  // namespace

// Small shapes for compute-sanitizer (memcheck, racecheck): a decode step over several key ranges
// (the combine kernel), packed rows of 4 heads with rows without keys on one range (the block
// writes O itself) and on several.
TEST_CASE("split-KV forward, sanitizer shapes", "[fast][fast-splitkv][fast-splitkv-sanitize]") {
  check_split({1, 1, 700, 8, 2, 128, false});   // 4 packed rows, 11 key tiles over several ranges
  check_split({1, 16, 1, 4, 1, 64, true});      // Br = 64 rows of 4 heads; rows 0 .. 14 see no key
  check_split({1, 300, 200, 4, 1, 64, true});   // several ranges; rows 0 .. 99 see no key
  check_split({2, 2, 130, 4, 4, 128, true, kFp16});
  report("splitkv sanitizer shapes");
}

TEST_CASE("split-KV forward, N = 1, 2, 16, 128 against N_k = 1, 63, 4097, equals the float64 reference",
          "[fast][fast-splitkv]") {
  struct Group {
    int heads, heads_kv;
  };
  int k = 0;
  for (int n : {1, 2, 16, 128})
    for (int nk : {1, 63, 4097})
      for (const Group gr : {Group{4, 4}, Group{8, 2}, Group{32, 1}})
        for (bool causal : {false, true}) {
          // The float64 reference costs B·H·N·N_k·d: H = 32 with N = 128 against 4097 keys only once.
          if (n == 128 && nk == 4097 && gr.heads == 32 && !causal) continue;
          const int d = (k % 2) ? 64 : 128;
          const fr::Dtype dt = (k / 2) % 2 ? kFp16 : kBf16;
          ++k;
          check_split({1, n, nk, gr.heads, gr.heads_kv, d, causal, dt});
        }
  report("splitkv sweep");
}

TEST_CASE("split-KV forward, N_k = 65536 and batches, equals the float64 reference", "[fast][fast-splitkv]") {
  check_split({1, 1, 65536, 32, 8, 128, false});          // a decode step, GQA 32:8
  check_split({1, 1, 65536, 32, 1, 64, true, kFp16});     // multi-query
  check_split({1, 2, 65536, 4, 1, 128, true});            // two rows, causal offset 65534
  check_split({1, 16, 65536, 2, 2, 64, false, kFp16});    // Br = 16, one head per K/V head
  check_split({3, 1, 4097, 8, 2, 128, true});             // batch > 1
  check_split({2, 128, 1000, 4, 4, 64, true, kFp16});     // Br = 64, several row tiles and ranges
  report("splitkv long");
}

TEST_CASE("split-KV forward: the automatic choice and its tiles", "[fast][fast-splitkv]") {
  const fc::FastTiles decode = fc::fast_forward_tiles(problem_of({1, 1, 4096, 32, 8, 128, false}), kSplitKv);
  CHECK(decode.Br == 16);
  CHECK(decode.Bc == 64);
  CHECK(fc::fast_forward_tiles(problem_of({1, 128, 4096, 16, 16, 128, false}), kSplitKv).Br == 64);
  // At most 16 query rows: always split-KV, whatever B·H.
  CHECK(fc::fastest_forward_kernel(problem_of({1, 1, 4096, 32, 8, 128, false})) == kSplitKv);
  CHECK(fc::fastest_forward_kernel(problem_of({64, 16, 4096, 32, 8, 64, true})) == kSplitKv);
  // Long self-attention fills the GPU: the regular forward.
  CHECK(fc::fastest_forward_kernel(problem_of({4, 4096, 4096, 16, 16, 128, true})) == fc::fastest_forward_kernel());
  CHECK(std::string(fc::to_string(kSplitKv)) == "splitkv");
}
