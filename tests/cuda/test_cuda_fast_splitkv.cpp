// The split-KV forward (FastForwardKernel::split_kv, attention_fwd_splitkv.cu) against the float64
// reference flashlab::ref::naive_forward<double>: few query rows against short and long key lists,
// grouped K/V, the causal diagonal bottom-right aligned (query i sees key j iff j ≤ i + N_k − N).
//
// Inputs and metric as test_cuda_fast_gqa.cpp (fast_forward_check.hpp): fresh normal random inputs
// rounded to the dtype, O within 1e-2 and 2× the rounding floor against float64, LSE within 1e-4;
// O and LSE are poisoned with NaN before the launch, so a row nobody writes fails; rows that see no
// key (causal, N > N_k) must be O = 0 exactly and LSE = −inf.
// Shapes: N = 1, 2, 16, 128 (and 300); N_k = 1, 63, 4097, 65536; H/H_kv = 1, 4, 32; causal and
// not; d = 64 and 128; bf16 and fp16; one key range (the block writes O itself) and several (the
// combine kernel); rows without a key on both paths. Tags: [fast][fast-splitkv]; a few small shapes
// also [fast-splitkv-sanitize] for compute-sanitizer.
#include <catch2/catch.hpp>

#include "fast_forward_check.hpp"

#include <string>

namespace fc = flashlab::cuda;
namespace fr = flashlab::ref;

namespace {

constexpr fr::Dtype kBf16 = fr::Dtype::bf16, kFp16 = fr::Dtype::fp16;
constexpr fc::FastForwardKernel kSplitKv = fc::FastForwardKernel::split_kv;

using SplitCase = flashlab::test::ForwardCase;

void check_split(const SplitCase& c) { flashlab::test::check_forward(c, kSplitKv); }
void report(const char* name) { flashlab::test::report_worst_ratio(name); }
fr::AttentionProblem problem_of(const SplitCase& c) { return flashlab::test::forward_problem(c); }

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
