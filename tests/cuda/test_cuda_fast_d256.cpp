// The fast forwards at head dim d = 256 against the float64 reference
// flashlab::ref::naive_forward<double>, on both kernels that take it: mma_sync (attention_fwd_tc.cu:
// 8 warps × 16 query rows, Bc = 64) and tma_ws (attention_fwd_ws.cu: Br = 128, Bc = 80 in two
// stages), and the kernels that refuse it, by name.
//
// Inputs, metric and the check: fast_forward_check.hpp (fresh normal random inputs rounded to the
// dtype; O within 1e-2 and 2× the rounding floor, LSE within 1e-4; rows that see no key O = 0
// exactly and LSE = −inf, their number also counted from the mask's rule).
// The refusals of the other fast kernels: test_cuda_fast_limits.cpp.
// Shapes: N = 1; N not a multiple of any tile (Br = 128; Bc = 64 and 80); causal and not; N_k ≠ N
// both ways (causal rows and whole query tiles without a key); grouped K/V (H/H_kv = 4); windows
// whose edges fall inside, on and beside an 80-key tile; work lists longer than the SMs (tma-ws
// blocks walking several units); bf16 and fp16; batch > 1. Tags: [fast][fast-d256]; small shapes
// also [fast-d256-sanitize] for compute-sanitizer.
#include <catch2/catch.hpp>

#include "fast_forward_check.hpp"

#include <vector>

namespace fc = flashlab::cuda;
namespace fr = flashlab::ref;

namespace {

constexpr fr::Dtype kBf16 = fr::Dtype::bf16, kFp16 = fr::Dtype::fp16;
constexpr int kD = 256;

using Case = flashlab::test::ForwardCase;

/// A d = 256 case: B, N, N_k, H, H_kv, causal, dtype, window L, R (−1: unbounded).
Case d256(int batch, int seq, int seq_k, int heads, int heads_kv, bool causal, fr::Dtype dtype = kBf16,
          long long left = -1, long long right = -1) {
  return {batch, seq, seq_k, heads, heads_kv, kD, causal, dtype, left, right};
}

/// The kernels that take d = 256: mma_sync everywhere, tma_ws where it is built and the device runs it.
std::vector<fc::FastForwardKernel> kernels() {
  std::vector<fc::FastForwardKernel> k = {fc::FastForwardKernel::mma_sync};
  if (fc::fastest_forward_kernel() == fc::FastForwardKernel::tma_ws) k.push_back(fc::FastForwardKernel::tma_ws);
  else WARN("tma-ws forward not in this build or not on this device: mma_sync only");
  return k;
}

void check(const Case& c, const std::vector<fc::FastForwardKernel>& on) { flashlab::test::check_forward(c, on); }

void report(const char* name) { flashlab::test::report_worst_ratio(name); }

}  // namespace

// Small shapes for compute-sanitizer (memcheck, racecheck): a ragged query and key tile, causal
// N > N_k with grouped K/V (rows without keys), a window with both edges inside the sequence.
TEST_CASE("fast forward d = 256, sanitizer shapes", "[fast][fast-d256][fast-d256-sanitize]") {
  const auto on = kernels();  // each case on every kernel, against one reference
  check(d256(1, 200, 200, 2, 2, false), on);
  check(d256(1, 150, 77, 4, 1, true), on);  // 73 rows without a key; H/H_kv = 4
  check(d256(1, 200, 200, 2, 2, false, kBf16, 50, 30), on);
  report("d256 sanitizer shapes");
}

TEST_CASE("fast forward d = 256, small and awkward shapes, equal the float64 reference", "[fast][fast-d256]") {
  const auto on = kernels();
  for (bool causal : {false, true}) {
    check(d256(1, 1, 1, 2, 2, causal), on);         // N = N_k = 1
    check(d256(1, 1, 300, 4, 1, causal), on);       // N = 1 (decoding) against 300 keys, H/H_kv = 4
    check(d256(2, 333, 333, 3, 3, causal), on);     // N a multiple of no tile, batch > 1
    check(d256(1, 80, 80, 2, 2, causal), on);       // one 80-key tile exactly
    check(d256(1, 161, 161, 2, 2, causal), on);     // two 80-key tiles and one key
    check(d256(1, 33, 150, 8, 2, causal), on);      // N < N_k, a ragged key tile
    check(d256(1, 150, 40, 4, 2, causal), on);      // N > N_k: causal rows 0 .. 109 see no key
    check(d256(1, 300, 300, 8, 2, causal, kFp16), on);
  }
  check(d256(1, 400, 100, 4, 1, true, kFp16), on);  // 300 rows without a key: whole query tiles
  report("d256 small");
}

TEST_CASE("fast forward d = 256, windows, equal the float64 reference", "[fast][fast-d256]") {
  const auto on = kernels();
  check(d256(1, 333, 333, 2, 2, true, kBf16, 64, 0), on);    // a causal sliding window
  check(d256(1, 300, 300, 2, 2, false, kBf16, 79, 80), on);   // edges beside an 80-key tile's
  check(d256(1, 300, 300, 2, 2, false, kBf16, 80, 79), on);
  check(d256(1, 400, 400, 2, 1, false, kBf16, 5, 5), on);     // a narrow band: tiles skipped on both sides
  check(d256(1, 1, 1000, 4, 1, true, kBf16, 100, 0), on);     // N = 1 against the last keys
  check(d256(1, 150, 40, 4, 2, false, kFp16, 20, 10), on);    // N > N_k: rows right of every key
  check(d256(2, 200, 200, 2, 2, false, kBf16, 0, 0), on);     // the diagonal key alone
  report("d256 windows");
}

TEST_CASE("fast forward d = 256, work lists longer than the SMs", "[fast][fast-d256]") {
  const auto on = kernels();
  // 8 query tiles × 20 heads = 160 units of Br = 128 (an H100 has 132 SMs): tma-ws blocks walk two.
  for (bool causal : {false, true}) check(d256(1, 1024, 1024, 20, 5, causal), on);
  check(d256(2, 700, 900, 10, 10, true, kFp16), on);  // N < N_k causal, batch 2
  report("d256 long");
}

TEST_CASE("fast forward d = 256: the front door's choice never lands on a kernel that refuses it",
          "[fast][fast-d256]") {
  fr::AttentionProblem cfg;
  cfg.seq = 8;  // few rows: split-KV at d = 64 and 128, the regular forward at 256
  cfg.head_dim = 256;
  cfg.dtype = fr::Dtype::bf16;
  CHECK(fc::fastest_forward_kernel(cfg) == fc::fastest_forward_kernel());
  cfg.head_dim = 128;
  CHECK(fc::fastest_forward_kernel(cfg) == fc::FastForwardKernel::split_kv);
  // The refusals (no device needed) are in test_cuda_fast_limits.cpp.
}
