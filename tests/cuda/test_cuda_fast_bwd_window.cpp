// The fast backward with a sliding window (window_left L, window_right R: query i sees key j iff i − L ≤ j
// ≤ i + R, N_k = N in the backward, −1 leaving a side unbounded, causal capping R at 0) against the float64
// reference flashlab::ref::naive_backward<double>, which implements that rule (attention_problem.hpp), on
// both kernels of the atomic design that take windows: mma_sync (attention_bwd_tc_atomic.cu) and wgmma-ws
// (attention_bwd_ws.cu, where built and the device runs it); the two-kernel design and the deterministic
// wgmma-ws kernel refuse them by name.
//
// Inputs as test_cuda_fast_bwd.cpp: fresh normal Q, K, V, dO rounded to the dtype, the reference gets the
// rounded values; O and LSE from the fast mma forward with the same window. Metric: max|got − ref| /
// max|ref| per gradient (NaN → +inf, fails); the bound is the project's backward bound, max(1e-2, 2 × the
// rounding floor of the float64 gradient), and each case prints its error as a multiple of that floor.
// Every case runs each kernel on the same inputs and reference. Shapes: windows wider than N (either side,
// and both); L = R = 0 (the diagonal key alone, each block's tiles masked on both edges); L = 0 alone; R =
// 0 without causal; causal with a window (and causal capping R); left edges on, before and after the tile
// edges (Br = 64, 128; Bc = 128); narrow two-sided bands far from key 0 (query tiles skipped on both sides
// of a block's keys); N = 1, N = 17 and N not a multiple of any tile; batch > 1; d = 64 and 128; bf16 and
// fp16. With N_k = N every query sees its own key, so no row is fully masked (the query tiles a block skips
// get no contribution from it; rows past N are padding and masked). Tags: [fast-bwd-window]; small shapes
// also [fast-bwd-window-sanitize] for compute-sanitizer.
#include <catch2/catch.hpp>

#include "flashlab/cuda/fast_attention.hpp"
#include "flashlab/reference/attention.hpp"
#include "gpu_test_util.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
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

double g_worst_ratio = 0.0;  // worst error / rounding floor of the test case

/// The kernels that take windows: mma_sync everywhere, wgmma-ws where built and
/// the device runs it.
std::vector<fc::FastBackwardKernel> window_kernels() {
  std::vector<fc::FastBackwardKernel> k = {fc::FastBackwardKernel::mma_sync};
  if (fc::fastest_backward_kernel() == fc::FastBackwardKernel::wgmma_ws)
    k.push_back(fc::FastBackwardKernel::wgmma_ws);
  else
    WARN("wgmma-ws backward not in this build or not on this device: mma_sync only");
  return k;
}

void check_window_bwd(const WinCase& c) {
  const unsigned long long seed = flashlab::test::fresh_seed();
  const std::string label = std::string(c.dtype == kBf16 ? "bf16" : "fp16") + " B=" + std::to_string(c.batch) +
                            " N=" + std::to_string(c.seq) + " H=" + std::to_string(c.heads) +
                            " d=" + std::to_string(c.head_dim) + (c.causal ? " causal" : "") +
                            " window=" + std::to_string(c.left) + "," + std::to_string(c.right);
  INFO(label << " seed=" << seed << " (rerun with FLASHLAB_TEST_SEED)");
  const fr::Shape shape{std::size_t(c.batch), std::size_t(c.seq), std::size_t(c.heads), std::size_t(c.head_dim)};
  const flashlab::test::BwdInputs in = flashlab::test::bwd_inputs(shape, seed, c.dtype);
  const auto &Qd = in.Qd, &Kd = in.Kd, &Vd = in.Vd, &dOd = in.dOd;
  const auto &Qb = in.Q, &Kb = in.K, &Vb = in.V, &dOb = in.dO;
  fr::AttentionProblem cfg = flashlab::test::attention_problem(shape, c.causal, c.dtype);
  cfg.window_left = c.left;
  cfg.window_right = c.right;
  const auto ref = fr::naive_backward<double>(cfg, Qd, Kd, Vd, dOd);
  const auto fwd = fc::fast_attention_forward(cfg, fc::FastForwardKernel::mma_sync, Qb, Kb, Vb);
  static const std::vector<fc::FastBackwardKernel> kernels = window_kernels();
  for (const fc::FastBackwardKernel kernel : kernels) {
    INFO("kernel " << fc::to_string(kernel));
    const auto got =
        fc::fast_attention_backward(fr::Algorithm::bwd_atomic, cfg, Qb, Kb, Vb, fwd.O, dOb, fwd.LSE, kernel);
    REQUIRE(got.dQ.size() == ref.dQ.numel());
    REQUIRE(got.dK.size() == ref.dK.numel());
    REQUIRE(got.dV.size() == ref.dV.numel());
    const std::pair<const char*, const std::vector<std::uint16_t>*> grads[] = {
        {"dQ", &got.dQ}, {"dK", &got.dK}, {"dV", &got.dV}};
    const fr::Tensor<double>* wants[] = {&ref.dQ, &ref.dK, &ref.dV};
    std::printf("  %-50s %-8s", label.c_str(), fc::to_string(kernel));
    for (int t = 0; t < 3; ++t) {
      const double err = flashlab::test::error_16(*grads[t].second, wants[t]->data(), c.dtype);
      const double floor = flashlab::test::rounding_floor(wants[t]->data(), wants[t]->numel(), c.dtype);
      const double ratio = floor > 0 ? err / floor : (err > 0 ? 1e30 : 0.0);
      std::printf("  %s %.3e (x%.2f)", grads[t].first, err, ratio);
      if (!(ratio <= g_worst_ratio)) g_worst_ratio = ratio;  // NaN propagates as worst
      INFO(grads[t].first << " error " << err << ", rounding floor " << floor);
      CHECK(err <= std::max(1e-2, 2 * floor));
    }
    const double eD = fr::max_error_vs_max(got.D.data(), ref.D_from_O.data(), got.D.size());
    std::printf("  D %.2e\n", eD);
    CHECK(eD <= 1e-2);
  }
}

void report(const char* name) {
  std::printf("[%s] worst gradient error %.2f x its rounding floor\n", name, g_worst_ratio);
  g_worst_ratio = 0.0;
}

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

TEST_CASE("the backward kernels without windows refuse them before any launch", "[fast-bwd][fast-bwd-window]") {
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
                    Catch::Contains("window (8,0) is not supported by the wgmma-ws-det kernel"));
  CHECK_THROWS_WITH(fc::fast_attention_backward(fr::Algorithm::bwd_two_kernel, cfg, x, x, x, x, x, lse),
                    Catch::Contains("window (8,0) is not supported by the bwd_two_kernel design"));
}
