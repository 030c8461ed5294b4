// The fast forwards with a sliding window (window_left L, window_right R: query i sees key j iff
// i + off − L ≤ j ≤ i + off + R, off = N_k − N, −1 leaving a side unbounded, causal capping R at 0)
// against the float64 reference flashlab::ref::naive_forward<double>, which implements that rule
// (attention_problem.hpp), on both kernels that take windows: mma_sync (attention_fwd_tc.cu) and
// tma_ws (attention_fwd_ws.cu).
//
// Inputs, metric and the check: fast_forward_check.hpp (O within 2× the rounding floor, LSE within
// 1e-4; rows that see no key O = 0 exactly and LSE = −inf, their number also counted from the rule).
// Shapes: windows wider than N (either side, and both); L = R = 0 (the diagonal key alone); L = 0
// alone; R = 0 with causal, and without (the causal band by window); bands that start and end on,
// just before and just after a tile edge (Bc = 64 and 128); narrow bands far from key 0 (key tiles
// skipped on both sides); N_k ≠ N with grouped K/V; N = 1; N not a multiple of any tile; rows and
// whole query tiles that see no key (the band right of every key, N > N_k); longer work lists than
// the SMs (tma-ws blocks walking several units, units without keys last); d = 64 and 128; bf16 and
// fp16; batch > 1. Tags: [fast][fast-window]; small shapes also [fast-window-sanitize] for
// compute-sanitizer.
#include <catch2/catch.hpp>

#include "fast_forward_check.hpp"

#include <vector>

namespace fc = flashlab::cuda;
namespace fr = flashlab::ref;

namespace {

constexpr fr::Dtype kBf16 = fr::Dtype::bf16, kFp16 = fr::Dtype::fp16;

/// A case with a window: B, N, N_k, H, H_kv, d, causal, L, R, dtype.
flashlab::test::ForwardCase win(int batch, int seq, int seq_k, int heads, int heads_kv, int d, bool causal,
                                long long left, long long right, fr::Dtype dtype = kBf16) {
  return {batch, seq, seq_k, heads, heads_kv, d, causal, dtype, left, right};
}

/// The kernels that take windows: mma_sync everywhere, tma_ws where it is built and the device runs it.
std::vector<fc::FastForwardKernel> kernels() {
  std::vector<fc::FastForwardKernel> k = {fc::FastForwardKernel::mma_sync};
  if (fc::fastest_forward_kernel() == fc::FastForwardKernel::tma_ws) k.push_back(fc::FastForwardKernel::tma_ws);
  else WARN("tma-ws forward not in this build or not on this device: mma_sync only");
  return k;
}

void check_window(const flashlab::test::ForwardCase& c, const std::vector<fc::FastForwardKernel>& on) {
  flashlab::test::check_forward(c, on);
}

void report(const char* name) { flashlab::test::report_worst_ratio(name); }

}  // namespace

// Small shapes for compute-sanitizer (memcheck, racecheck): both edges inside the sequence, rows
// without keys (N > N_k), a ragged last key tile, both head dims and kernels.
TEST_CASE("fast forward, windows, sanitizer shapes", "[fast][fast-window][fast-window-sanitize]") {
  const auto on = kernels();  // each case on every kernel, against one reference
  check_window(win(1, 300, 77, 4, 1, 64, true, 20, 0), on);     // 223 rows without a key
  check_window(win(1, 200, 200, 2, 2, 128, false, 50, 30), on);  // both edges, tiles skipped left
  check_window(win(2, 100, 333, 4, 2, 128, false, 10, 0), on);  // N < N_k: only the last keys
  report("window sanitizer shapes");
}

TEST_CASE("fast forward, windows at the edges of their range, equal the float64 reference", "[fast][fast-window]") {
  const auto on = kernels();  // each case on every kernel, against one reference
  for (int d : {64, 128}) {
    // Wider than the sequence: the unbounded band, through the window instantiations.
    check_window(win(1, 200, 200, 2, 2, d, false, 1000, 1000), on);
    check_window(win(1, 200, 200, 2, 2, d, true, 2147483647, -1), on);
    check_window(win(1, 150, 300, 2, 1, d, false, -1, 5000), on);
    // L = R = 0: each query sees its diagonal key alone (O = that key's V row).
    check_window(win(1, 150, 150, 2, 2, d, false, 0, 0), on);
    check_window(win(1, 150, 260, 2, 1, d, false, 0, 0), on);
    // L = 0 alone: the diagonal key and everything right of it.
    check_window(win(1, 150, 150, 2, 2, d, false, 0, -1), on);
    // R = 0: with causal (a causal sliding window) and without (the causal band by window).
    check_window(win(1, 333, 333, 2, 2, d, true, 64, 0), on);
    check_window(win(1, 333, 333, 2, 2, d, false, -1, 0), on);
    check_window(win(1, 333, 333, 2, 2, d, true, 100, 40), on);  // causal caps R = 40 at 0
    // N = 1 (decoding) against a band of the last keys.
    check_window(win(1, 1, 1000, 4, 1, d, true, 100, 0), on);
    check_window(win(1, 1, 77, 4, 2, d, false, 3, 7), on);
  }
  check_window(win(1, 150, 150, 2, 2, 64, false, 0, 0, kFp16), on);
  check_window(win(1, 333, 333, 2, 2, 128, true, 64, 0, kFp16), on);
  report("window edges");
}

TEST_CASE("fast forward, windows on and beside tile edges, keys skipped on both sides", "[fast][fast-window]") {
  const auto on = kernels();  // each case on every kernel, against one reference
  for (int d : {64, 128}) {
    // Left edges 63, 64, 65, 127, 128, 129 keys back: the band starts on, before and after the
    // edges of Bc = 64 (mma) and 128 (tma-ws) tiles.
    for (long long left : {63, 64, 65, 127, 128, 129}) check_window(win(1, 700, 700, 2, 2, d, true, left, 0), on);
    // Narrow two-sided bands far from key 0: most key tiles skipped left and right of every unit.
    check_window(win(1, 1000, 1000, 2, 1, d, false, 30, 17), on);
    check_window(win(1, 1000, 1000, 2, 2, d, false, 200, 300), on);
    // Right side alone, 1 and 129 keys past the diagonal.
    check_window(win(1, 500, 500, 2, 2, d, false, -1, 1), on);
    check_window(win(1, 500, 500, 2, 2, d, false, -1, 129), on);
  }
  check_window(win(1, 1000, 1000, 2, 2, 128, false, 30, 17, kFp16), on);
  report("window tiles");
}

TEST_CASE("fast forward, windows with N_k != N, grouped K/V and rows without keys", "[fast][fast-window]") {
  const auto on = kernels();  // each case on every kernel, against one reference
  for (int d : {64, 128}) {
    check_window(win(2, 300, 517, 8, 2, d, false, 100, 20), on);  // N < N_k, both edges
    check_window(win(1, 300, 517, 8, 4, d, true, 128, 0), on);    // causal sliding window, offset +217
    check_window(win(1, 500, 200, 4, 1, d, true, 50, 0), on);     // N > N_k: rows 0 .. 299 see no key
    check_window(win(1, 500, 100, 4, 2, d, false, 10, 5), on);    // rows 0 .. 394 see no key
    check_window(win(1, 333, 333, 4, 1, d, false, 7, -1), on);    // left only, N_k = N not a tile multiple
  }
  check_window(win(1, 500, 200, 4, 1, 128, true, 50, 0, kFp16), on);
  check_window(win(2, 300, 517, 8, 2, 64, false, 100, 20, kFp16), on);
  report("window gqa");
}

TEST_CASE("fast forward, windows on work lists longer than the GPU", "[fast][fast-window]") {
  const auto on = kernels();  // each case on every kernel, against one reference
  // 16 query tiles × 16 heads = 256 units (tma-ws, Br = 128): blocks walk several units each.
  check_window(win(1, 2000, 2000, 16, 4, 64, true, 300, 0), on);
  check_window(win(1, 2000, 2000, 16, 16, 128, false, 150, 150), on);
  // N > N_k: the top query tiles of every head have no key and come last in each block's list.
  check_window(win(1, 2600, 600, 16, 2, 128, true, 200, 0), on);
  check_window(win(2, 1500, 700, 8, 8, 64, false, 64, 64), on);
  report("window long");
}
