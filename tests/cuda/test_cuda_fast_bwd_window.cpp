// The fast backward with a sliding window (window_left L, window_right R: query i sees key j iff i − L ≤ j
// ≤ i + R, N_k = N in the backward, −1 leaving a side unbounded, causal capping R at 0) against the float64
// reference flashlab::ref::naive_backward<double>, which implements that rule (attention_problem.hpp), on
// both kernels of the atomic design that take windows: mma_sync (attention_bwd_tc_atomic.cu) and wgmma-ws
// (attention_bwd_ws.cu, where built and the device runs it), and on the two-kernel design
// (attention_bwd_tc.cu), whose dQ, dK, dV must also equal a rerun's bit for bit; the deterministic
// wgmma-ws kernel refuses them by name.
//
// Inputs, metric and the check: fast_backward_check.hpp (fresh normal inputs rounded to the dtype, O and
// LSE from the fast mma forward with the same window, each gradient within max(1e-2, 2 × its rounding
// floor)). Every case runs each kernel on the same inputs and reference. Shapes: windows wider than N (either side,
// and both); L = R = 0 (the diagonal key alone, each block's tiles masked on both edges); L = 0 alone; R =
// 0 without causal; causal with a window (and causal capping R); left edges on, before and after the tile
// edges (Br = 64, 128; Bc = 128); narrow two-sided bands far from key 0 (query tiles skipped on both sides
// of a block's keys); N = 1, N = 17 and N not a multiple of any tile; batch > 1; d = 64 and 128; bf16 and
// fp16. With N_k = N every query sees its own key, so no row is fully masked (the query tiles a block skips
// get no contribution from it; rows past N are padding and masked). Tags: [fast-bwd-window]; small shapes
// also [fast-bwd-window-sanitize] for compute-sanitizer.
#include <catch2/catch.hpp>

#include "fast_backward_check.hpp"
#include "flashlab/cuda/fast_attention.hpp"

#include <cstdint>
#include <vector>

namespace fc = flashlab::cuda;
namespace fr = flashlab::ref;

namespace {

constexpr fr::Dtype kBf16 = fr::Dtype::bf16, kFp16 = fr::Dtype::fp16;

struct WinCase {
  int batch, seq, heads, head_dim;
  bool causal;
  long long left, right;
  fr::Dtype dtype = kBf16;
};

void check_window_bwd(const WinCase& c) {
  flashlab::test::check_backward_every_design(
      {c.batch, c.seq, c.seq, c.heads, c.heads, c.head_dim, c.causal, c.left, c.right, c.dtype});
}

void report(const char* name) { flashlab::test::report_backward_ratio(name); }

}  // namespace

// Small shapes for compute-sanitizer (memcheck, racecheck): both edges inside the sequence, a ragged
// last tile, causal with a window, both head dims.
TEST_CASE("fast backward, windows, sanitizer shapes", "[fast-bwd][fast-bwd-window][fast-bwd-window-sanitize]") {
  check_window_bwd({1, 200, 2, 64, false, 50, 30});
  check_window_bwd({1, 150, 2, 128, true, 64, 0});
  check_window_bwd({1, 77, 2, 128, false, 0, 0, kFp16});
  report("bwd window sanitizer shapes");
}

TEST_CASE(
    "fast backward, windows at the edges of their range, equal the float64 reference",
    "[fast-bwd][fast-bwd-window]") {
  for (int d : {64, 128}) {
    // Wider than the sequence: the unbounded band, through the window instantiation.
    check_window_bwd({1, 200, 2, d, false, 1000, 1000});
    check_window_bwd({1, 200, 2, d, true, 2147483647, -1});
    check_window_bwd({1, 200, 2, d, false, -1, 5000});
    // L = R = 0: each query sees its diagonal key alone.
    check_window_bwd({1, 150, 2, d, false, 0, 0});
    // L = 0 alone, R = 0 alone (the causal band by window).
    check_window_bwd({1, 150, 2, d, false, 0, -1});
    check_window_bwd({1, 333, 2, d, false, -1, 0});
    // Causal with a window; causal caps R = 40 at 0.
    check_window_bwd({1, 333, 2, d, true, 64, 0});
    check_window_bwd({1, 333, 2, d, true, 100, 40});
    // N = 1 and N = 17 (one ragged tile).
    check_window_bwd({1, 1, 2, d, false, 3, 7});
    check_window_bwd({1, 17, 2, d, true, 5, 0});
  }
  check_window_bwd({1, 150, 2, 64, false, 0, 0, kFp16});
  check_window_bwd({1, 333, 2, 128, true, 64, 0, kFp16});
  check_window_bwd({1, 200, 2, 64, false, 1000, 1000, kFp16});
  report("bwd window edges");
}

TEST_CASE(
    "fast backward, windows on and beside tile edges, query tiles skipped on both sides",
    "[fast-bwd][fast-bwd-window]") {
  for (int d : {64, 128}) {
    // Left edges 63 … 129 keys back: the band starts on, before and after the edges of Br = 64
    // (d = 128), Br = 128 (d = 64) and Bc = 128 tiles.
    for (long long left : {63, 64, 65, 127, 128, 129}) check_window_bwd({1, 400, 1, d, true, left, 0});
    // Narrow two-sided bands far from key 0: most query tiles skipped above and below each block.
    check_window_bwd({1, 1000, 1, d, false, 30, 17});
    check_window_bwd({2, 700, 2, d, false, 200, 300});
    // Right side alone, 1 and 129 keys past the diagonal.
    check_window_bwd({1, 500, 2, d, false, -1, 1});
    check_window_bwd({1, 500, 2, d, false, -1, 129});
  }
  check_window_bwd({1, 1000, 1, 128, false, 30, 17, kFp16});
  check_window_bwd({2, 700, 2, 64, false, 200, 300, kFp16});
  report("bwd window tiles");
}

TEST_CASE("the backward kernel without windows refuses them before any launch", "[fast-bwd][fast-bwd-window]") {
  fr::AttentionProblem cfg;
  cfg.seq = 64;
  cfg.heads = 2;
  cfg.head_dim = 64;
  cfg.dtype = kBf16;
  cfg.window_left = 8;
  cfg.window_right = 0;
  const std::vector<std::uint16_t> x(64 * 2 * 64);
  const std::vector<float> lse(2 * 64);
  CHECK_THROWS_WITH(fc::fast_attention_backward(fr::Algorithm::bwd_atomic, cfg, x, x, x, x, x, lse,
                                                fc::FastBackwardKernel::wgmma_ws_deterministic),
                    Catch::Contains("window (8,0) is not supported by the wgmma-ws-det kernel") &&
                        Catch::Contains("hint: design bwd_two_kernel for bit-reproducible gradients"));
}
