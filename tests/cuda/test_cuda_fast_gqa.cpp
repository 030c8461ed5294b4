// The fast forwards with grouped K/V (H_kv dividing H) and N_k ≠ N (the causal diagonal bottom-right
// aligned: query i sees key j iff j ≤ i + N_k − N) against the float64 reference
// flashlab::ref::naive_forward<double>, on both kernels that take them: mma_sync
// (attention_fwd_tc.cu) and tma_ws (attention_fwd_ws.cu).
//
// Inputs and metric as test_cuda_fast.cpp (fast_forward_check.hpp): fresh normal random inputs
// rounded to the dtype, O within 1e-2 and 2× the rounding floor, LSE within 1e-4; rows that see no
// key (causal, N > N_k) must be O = 0 exactly and LSE = −inf, as the reference says.
// Shapes: H/H_kv = 1, 4, 8, 32; N = 1; N < N_k; N > N_k (causal: rows and whole query tiles without a
// key); N_k = 1; N_k not a multiple of any tile; d = 64 and 128; bf16 and fp16; batch > 1; the tma-ws
// split tail with groups. Tags: [fast][fast-gqa]; a few small shapes also [fast-gqa-sanitize] for
// compute-sanitizer.
#include <catch2/catch.hpp>

#include "fast_forward_check.hpp"

#include <vector>

namespace fc = flashlab::cuda;
namespace fr = flashlab::ref;

namespace {

constexpr fr::Dtype kBf16 = fr::Dtype::bf16, kFp16 = fr::Dtype::fp16;
constexpr fc::FastForwardKernel kMma = fc::FastForwardKernel::mma_sync, kTmaWs = fc::FastForwardKernel::tma_ws;

using GqaCase = flashlab::test::ForwardCase;

void check_gqa(const GqaCase& c, fc::FastForwardKernel kernel) { flashlab::test::check_forward(c, kernel); }

/// The kernels to check: mma_sync everywhere, tma_ws where it is built and the device runs it.
std::vector<fc::FastForwardKernel> kernels() {
  std::vector<fc::FastForwardKernel> k = {kMma};
  if (fc::fastest_forward_kernel() == kTmaWs) k.push_back(kTmaWs);
  else WARN("tma-ws forward not in this build or not on this device: mma_sync only");
  return k;
}

void report(const char* name) { flashlab::test::report_worst_ratio(name); }

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
