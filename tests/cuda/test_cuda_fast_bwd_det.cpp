// The two-kernel backward design (attention_bwd_tc.cu: a dQ kernel, one block per query tile, and a
// dK/dV kernel, one block per K/V head and key tile; no atomics) with grouped K/V (H_kv dividing H),
// N_k ≠ N (the causal diagonal bottom-right aligned: query i sees key j iff j ≤ i + N_k − N) and
// windows, against the float64 reference flashlab::ref::naive_backward<double>, and BIT FOR BIT
// against a second run of itself: the design's point is that dQ, dK and dV are reproducible (each
// sum, over key tiles for dQ and over the group's query heads and query tiles for dK, dV, runs in
// one fixed order in registers).
//
// The shapes of test_cuda_fast_bwd_gqa.cpp and test_cuda_fast_bwd_window.cpp run on this design too
// (check_backward_every_design: N = 1, N_k = 1, N < N_k and N > N_k causal and not, H/H_kv = 1, 4
// and 32, windows wider than N, one-sided, L = R = 0, key tiles no query sees, bf16 and fp16, d = 64
// and 128), and so do the packed ones of test_cuda_fast_bwd_varlen.cpp (ragged, lengths 0 and 1). Here: one small shape of each feature for compute-sanitizer ([fast-bwd-det-sanitize]),
// the plain kernels' reproducibility, and a larger grouped causal shape with N_k > N run four times
// (the same bits) and against the atomic design (no float64 reference at that size). Inputs, metric
// and the check: fast_backward_check.hpp (each gradient within max(1e-2, 2 × its rounding floor);
// rows that see no key get dQ exactly 0, keys no query sees dK = dV exactly 0). Tags: [fast-bwd-det].
#include <catch2/catch.hpp>

#include "fast_backward_check.hpp"
#include "flashlab/cuda/fast_attention.hpp"

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace fc = flashlab::cuda;
namespace fr = flashlab::ref;

namespace {

constexpr fr::Dtype kBf16 = fr::Dtype::bf16, kFp16 = fr::Dtype::fp16;

/// {B, N, N_k, H, H_kv, d, causal[, window_left, window_right[, dtype]]} on the two-kernel design, rerun bitwise.
void check_two_kernel(const flashlab::test::BackwardCase& c) {
  flashlab::test::check_backward(c, {fc::FastBackwardKernel::mma_sync}, fr::Algorithm::bwd_two_kernel, true);
}

void report(const char* name) { flashlab::test::report_backward_ratio(name); }

}  // namespace

// Small shapes for compute-sanitizer (memcheck, racecheck): one of each feature.
TEST_CASE("two-kernel backward, grouped K/V, N_k != N and windows, sanitizer shapes",
          "[fast-bwd][fast-bwd-det][fast-bwd-det-sanitize]") {
  check_two_kernel({1, 150, 40, 4, 2, 64, true});                 // N > N_k causal: rows 0 .. 109 see no key
  check_two_kernel({1, 33, 150, 4, 1, 128, false});               // N < N_k, H/H_kv = 4
  check_two_kernel({1, 1, 77, 32, 1, 64, true});                  // N = 1, 32:1
  check_two_kernel({1, 100, 100, 2, 2, 128, false, 7, -1});       // a left-only window, H_kv = H, N_k = N
  check_two_kernel({1, 100, 230, 4, 2, 128, true, 50, 0, kFp16}); // a causal window over grouped K/V, N_k > N
  report("two-kernel bwd sanitizer shapes");
}

// Without grouped K/V, N_k ≠ N or a window the plain kernels run: reproducible as well.
TEST_CASE("two-kernel backward, the plain kernels, equal the float64 reference and themselves",
          "[fast-bwd][fast-bwd-det]") {
  check_two_kernel({2, 300, 300, 4, 4, 128, true});
  check_two_kernel({1, 257, 257, 2, 2, 64, false, -1, -1, kFp16});
  report("two-kernel bwd plain");
}

// Bit-reproducibility on a larger grouped causal shape with N_k > N (many key tiles per query tile,
// many query heads and tiles per key tile): four runs give the same bits, and they agree with the
// atomic design (whose dQ order varies) within the backward tolerance.
TEST_CASE("two-kernel backward, grouped K/V, is bit-reproducible at N = 1500, N_k = 2100", "[fast-bwd][fast-bwd-det]") {
  for (int d : {64, 128}) {
    const unsigned long long seed = flashlab::test::fresh_seed();
    INFO("d=" << d << " seed=" << seed);
    const fr::Shape q{2, 1500, 16, std::size_t(d)}, kv{2, 2100, 4, std::size_t(d)};
    fr::AttentionProblem cfg = flashlab::test::attention_problem(q, true, kBf16);
    cfg.seq_k = kv.seq;
    cfg.heads_kv = kv.heads;
    const flashlab::test::BwdInputs in = flashlab::test::bwd_inputs(q, kv, seed, kBf16);
    const auto &Q = in.Q, &K = in.K, &V = in.V, &dO = in.dO;
    const auto fwd = fc::fast_attention_forward(cfg, fc::FastForwardKernel::mma_sync, Q, K, V);
    auto run = [&](fr::Algorithm design) {
      return [&, design] { return fc::fast_attention_backward(design, cfg, Q, K, V, fwd.O, dO, fwd.LSE); };
    };
    flashlab::test::check_reruns_and_against("bf16 B=2 N=1500 N_k=2100 H=16 H_kv=4 d=" + std::to_string(d) +
                                                 " causal: two-kernel (the other order: the atomic design)",
                                             cfg.dtype, run(fr::Algorithm::bwd_two_kernel),
                                             run(fr::Algorithm::bwd_atomic));
  }
}
