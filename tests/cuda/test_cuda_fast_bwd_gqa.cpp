// The fast backward with grouped K/V (H_kv dividing H: query head h reads K/V head h / (H / H_kv)) and
// N_k ≠ N (the causal diagonal and windows bottom-right aligned: query i sees key j iff j ≤ i + N_k − N)
// against the float64 reference flashlab::ref::naive_backward<double>, which implements that rule
// (attention_problem.hpp), on the atomic design's kernels that take them: mma_sync
// (attention_bwd_tc_atomic.cu) and wgmma-ws (attention_bwd_ws.cu, where built and the device runs it),
// and on the two-kernel design (attention_bwd_tc.cu), whose dQ, dK, dV must also equal a rerun's bit
// for bit. dK and dV are [B, N_k, H_kv, d]: each K/V head's gradient sums over its H / H_kv query heads.
//
// Inputs, metric and the check: fast_backward_check.hpp (each gradient within max(1e-2, 2 × its
// rounding floor); rows that see no key get dQ exactly 0, keys no query sees dK = dV exactly 0).
// Shapes: H/H_kv = 1 (N_k ≠ N alone), 4 and 32 (multi-query); N = 1; N_k > N (chunked prefill) and
// N_k < N (query tiles without keys); N and N_k not multiples of any tile; causal and not; windows with
// grouped K/V on both sides of N_k = N (key blocks that no query sees); batch > 1; d = 64 and 128; bf16
// and fp16; enough K/V heads for the causal grid's chunks of heads. Tags: [fast-bwd-gqa]; small shapes
// also [fast-bwd-gqa-sanitize] for compute-sanitizer.
#include <catch2/catch.hpp>

#include "fast_backward_check.hpp"
#include "flashlab/cuda/fast_attention.hpp"

#include <cstdint>
#include <vector>

namespace fc = flashlab::cuda;
namespace fr = flashlab::ref;

namespace {

constexpr fr::Dtype kBf16 = fr::Dtype::bf16, kFp16 = fr::Dtype::fp16;

/// {B, N, N_k, H, H_kv, d, causal[, window_left, window_right[, dtype]]}.
void check_gqa_bwd(const flashlab::test::BackwardCase& c) { flashlab::test::check_backward_every_design(c); }

void report(const char* name) { flashlab::test::report_backward_ratio(name); }

}  // namespace

// Small shapes for compute-sanitizer (memcheck, racecheck): N > N_k causal (rows without keys), N < N_k
// with a ragged key tile, a window over grouped K/V, both head dims.
TEST_CASE("fast backward, grouped K/V and N_k != N, sanitizer shapes", "[fast-bwd][fast-bwd-gqa][fast-bwd-gqa-sanitize]") {
  check_gqa_bwd({1, 150, 40, 4, 2, 64, true});
  check_gqa_bwd({1, 33, 150, 4, 1, 128, false});
  check_gqa_bwd({1, 100, 230, 4, 2, 128, true, 50, 0, kFp16});
  report("bwd gqa sanitizer shapes");
}

TEST_CASE("fast backward, grouped K/V and N_k != N, small shapes, equal the float64 reference",
          "[fast-bwd][fast-bwd-gqa]") {
  for (int d : {64, 128})
    for (bool causal : {false, true}) {
      check_gqa_bwd({1, 70, 70, 4, 1, d, causal});    // H/H_kv = 4, N_k = N
      check_gqa_bwd({2, 33, 150, 8, 2, d, causal});   // N < N_k, batch > 1, a ragged key tile
      check_gqa_bwd({1, 150, 40, 4, 2, d, causal});   // N > N_k: causal rows 0 .. 109 see no key
      check_gqa_bwd({1, 1, 77, 4, 4, d, causal});     // N = 1 (decoding), H_kv = H
      check_gqa_bwd({1, 20, 1, 2, 1, d, causal});     // N_k = 1: causal, the last row alone sees it
      check_gqa_bwd({1, 200, 333, 2, 2, d, causal});  // H/H_kv = 1, N_k > N, neither a tile multiple
      check_gqa_bwd({1, 333, 200, 2, 2, d, causal});  // H/H_kv = 1, N_k < N
    }
  check_gqa_bwd({1, 33, 150, 8, 2, 128, true, -1, -1, kFp16});
  check_gqa_bwd({1, 150, 40, 4, 1, 64, true, -1, -1, kFp16});
  report("bwd gqa small shapes");
}

TEST_CASE("fast backward, H = 32 with H_kv = 1 and 8, equals the float64 reference", "[fast-bwd][fast-bwd-gqa]") {
  for (int hkv : {1, 8})
    for (bool causal : {false, true}) {
      check_gqa_bwd({1, 300, 300, 32, hkv, 128, causal});
      check_gqa_bwd({1, 200, 517, 32, hkv, 64, causal});
    }
  check_gqa_bwd({1, 517, 200, 32, 8, 128, true, -1, -1, kFp16});  // 317 rows without a key, several query tiles
  check_gqa_bwd({1, 1, 1000, 32, 8, 128, false});                 // one query against 1000 keys
  check_gqa_bwd({1, 1, 1000, 32, 1, 64, true, -1, -1, kFp16});
  report("bwd gqa H = 32");
}

TEST_CASE("fast backward, many query tiles without keys and long key lists", "[fast-bwd][fast-bwd-gqa]") {
  for (int d : {64, 128}) check_gqa_bwd({2, 700, 100, 8, 1, d, true});  // rows 0 .. 599 see no key
  check_gqa_bwd({1, 600, 599, 4, 2, 128, true});  // offset −1: the diagonal one key left
  check_gqa_bwd({1, 300, 900, 8, 2, 64, true});   // offset +600: long causal rows
  check_gqa_bwd({1, 300, 900, 8, 2, 128, false, -1, -1, kFp16});
  report("bwd gqa long and empty");
}

// The causal grid in chunks of K/V heads (on an H100, 150 of these 300 K/V heads: attention_bwd_ws.cu),
// two chunks beside two batches: the grouped instantiation (N_k != N) and the band's (causal in it).
TEST_CASE("fast backward, grouped K/V, the causal grid in chunks of K/V heads",
          "[fast-bwd][fast-bwd-gqa][fast-bwd-gqa-sanitize]") {
  // The atomic design alone: the chunks are its wgmma-ws kernel's grid.
  flashlab::test::check_backward({2, 130, 129, 300, 300, 128, true});
  flashlab::test::check_backward({2, 130, 140, 600, 300, 64, true, 70, 0});
  report("bwd gqa causal chunks");
}

TEST_CASE("fast backward, windows with grouped K/V and N_k != N", "[fast-bwd][fast-bwd-gqa]") {
  for (int d : {64, 128}) {
    check_gqa_bwd({1, 300, 450, 8, 2, d, true, 64, 0});     // causal band, offset +150
    check_gqa_bwd({1, 400, 250, 4, 1, d, false, 30, 17});   // two-sided band, offset −150
    check_gqa_bwd({1, 100, 600, 4, 2, d, true, 20, 0});     // keys 0 .. 479 seen by no query: dK = dV = 0
    check_gqa_bwd({1, 64, 500, 4, 1, d, false, 10, 10});    // the same without causal
    check_gqa_bwd({1, 300, 40, 4, 2, d, false, 5, -1});     // N_k < N: rows past every key's band
    check_gqa_bwd({1, 200, 200, 8, 2, d, false, 0, 0});     // N_k = N, grouped: the diagonal key alone
  }
  check_gqa_bwd({2, 300, 450, 8, 2, 128, true, 64, 0, kFp16});
  report("bwd gqa windows");
}

TEST_CASE("grouped K/V and N_k != N: the backward kernel without them refuses them before any launch",
          "[fast-bwd][fast-bwd-gqa]") {
  fr::AttentionProblem cfg;
  cfg.seq = 64;
  cfg.heads = 4;
  cfg.heads_kv = 2;
  cfg.head_dim = 64;
  cfg.dtype = kBf16;
  const std::vector<std::uint16_t> x(64 * 4 * 64), kv(64 * 2 * 64);
  const std::vector<float> lse(4 * 64);
  CHECK_THROWS_WITH(fc::fast_attention_backward(fr::Algorithm::bwd_atomic, cfg, x, kv, kv, x, x, lse,
                                                fc::FastBackwardKernel::wgmma_ws_deterministic),
                    Catch::Contains("heads_kv (H_kv) = 2 (differs from heads (H) = 4) is not supported by the "
                                    "wgmma-ws-det kernel") &&
                        Catch::Contains("kernel mma or wgmma-ws") && Catch::Contains("design bwd_two_kernel"));
  cfg.heads_kv = 0;
  cfg.seq_k = 32;
  const std::vector<std::uint16_t> k32(32 * 4 * 64);
  CHECK_THROWS_WITH(fc::fast_attention_backward(fr::Algorithm::bwd_atomic, cfg, x, k32, k32, x, x, lse,
                                                fc::FastBackwardKernel::wgmma_ws_deterministic),
                    Catch::Contains("seq_k (N_k) = 32 (differs from seq (N) = 64) is not supported by the "
                                    "wgmma-ws-det kernel"));
  // The atomic design's kernels take it: K, V and dK, dV have N_k rows (a K of N rows is refused).
  CHECK_THROWS_WITH(fc::fast_attention_backward(fr::Algorithm::bwd_atomic, cfg, x, x, x, x, x, lse),
                    Catch::Contains("K"));
}
