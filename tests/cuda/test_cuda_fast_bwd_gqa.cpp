// The fast backward with grouped K/V (H_kv dividing H: query head h reads K/V head h / (H / H_kv)) and
// N_k ≠ N (the causal diagonal and windows bottom-right aligned: query i sees key j iff j ≤ i + N_k − N)
// against the float64 reference flashlab::ref::naive_backward<double>, which implements that rule
// (attention_problem.hpp), on the atomic design's kernels that take them: mma_sync
// (attention_bwd_tc_atomic.cu) and wgmma-ws (attention_bwd_ws.cu, where built and the device runs it).
// dK and dV are [B, N_k, H_kv, d]: each K/V head's gradient sums over its H / H_kv query heads.
//
// Inputs as test_cuda_fast_bwd.cpp: fresh normal Q, K, V, dO rounded to the dtype, the reference gets the
// rounded values; O and LSE from the fast mma forward of the same problem. Metric: max|got − ref| /
// max|ref| per gradient (NaN → +inf, fails); the bound is the project's backward bound, max(1e-2, 2 × the
// rounding floor of the float64 gradient), and each case prints its error as a multiple of that floor.
// Rows that see no key (causal with N > N_k: rows i < N − N_k; a window whose band misses every key)
// must get dQ exactly 0, and keys no query sees dK = dV exactly 0 (no NaN from their LSE = −inf); the
// rows and keys are found from the band, not from the reference's zeros (a row that sees one key has
// dQ = 0 by cancellation, up to rounding).
// Shapes: H/H_kv = 1 (N_k ≠ N alone), 4 and 32 (multi-query); N = 1; N_k > N (chunked prefill) and
// N_k < N (query tiles without keys); N and N_k not multiples of any tile; causal and not; windows with
// grouped K/V on both sides of N_k = N (key blocks that no query sees); batch > 1; d = 64 and 128; bf16
// and fp16. Tags: [fast-bwd-gqa]; small shapes also [fast-bwd-gqa-sanitize] for compute-sanitizer.
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

struct GqaBwdCase {
  int batch, seq, seq_k, heads, heads_kv, head_dim;
  bool causal;
  long long left = -1, right = -1;
  fr::Dtype dtype = kBf16;
};

double g_worst_ratio = 0.0;  // worst error / rounding floor of the test case

/// The kernels that take grouped K/V and N_k ≠ N: mma_sync everywhere, wgmma-ws where built and the
/// device runs it.
std::vector<fc::FastBackwardKernel> gqa_kernels() {
  std::vector<fc::FastBackwardKernel> k = {fc::FastBackwardKernel::mma_sync};
  if (fc::fastest_backward_kernel() == fc::FastBackwardKernel::wgmma_ws)
    k.push_back(fc::FastBackwardKernel::wgmma_ws);
  else
    WARN("wgmma-ws backward not in this build or not on this device: mma_sync only");
  return k;
}

/// The band of the reference's rule (attention_problem.hpp), with off = N_k − N: query i sees key j
/// iff 0 ≤ j < N_k and i + off − left ≤ j ≤ i + off + right (−1 unbounded; causal caps right at 0).
struct Band {
  long long lo, hi;  // j − i within [lo, hi]
  explicit Band(const GqaBwdCase& c) {
    const long long off = c.seq_k - c.seq, big = 1LL << 40;
    const long long right = c.causal ? (c.right < 0 ? 0 : std::min(c.right, 0LL)) : c.right;
    lo = c.left >= 0 ? off - c.left : -big;
    hi = right >= 0 ? off + right : big;
  }
  bool row_sees_a_key(long long i, long long nk) const { return std::max(0LL, i + lo) <= std::min(nk - 1, i + hi); }
  bool key_seen(long long j, long long n) const { return std::max(0LL, j - hi) <= std::min(n - 1, j - lo); }
};

/// Elements of a 16-bit [B, rows, heads, d] gradient that are not exactly 0 in the rows `outside`
/// says no band reaches (a query that sees no key: dQ; a key no query sees: dK, dV); the first one's
/// index in `first`. Such a row's gradient is 0 by construction, not by cancellation.
template <class Outside>
std::size_t nonzero_outside(const std::vector<std::uint16_t>& got, int batch, int rows, std::size_t row_elems,
                            fr::Dtype dt, Outside outside, std::size_t& first) {
  std::size_t bad = 0;
  for (int b = 0; b < batch; ++b)
    for (int r = 0; r < rows; ++r) {
      if (!outside(r)) continue;
      const std::size_t base = (std::size_t(b) * rows + r) * row_elems;
      for (std::size_t k = base; k < base + row_elems; ++k)
        if (!(flashlab::test::to_float(got[k], dt) == 0.0f) && bad++ == 0) first = k;
    }
  return bad;
}

void check_gqa_bwd(const GqaBwdCase& c) {
  const unsigned long long seed = flashlab::test::fresh_seed();
  const std::string label = std::string(c.dtype == kBf16 ? "bf16" : "fp16") + " B=" + std::to_string(c.batch) +
                            " N=" + std::to_string(c.seq) + " N_k=" + std::to_string(c.seq_k) +
                            " H=" + std::to_string(c.heads) + " H_kv=" + std::to_string(c.heads_kv) +
                            " d=" + std::to_string(c.head_dim) + (c.causal ? " causal" : "") +
                            (c.left >= 0 || c.right >= 0
                                 ? " window=" + std::to_string(c.left) + "," + std::to_string(c.right)
                                 : std::string());
  INFO(label << " seed=" << seed << " (rerun with FLASHLAB_TEST_SEED)");
  const fr::Shape q{std::size_t(c.batch), std::size_t(c.seq), std::size_t(c.heads), std::size_t(c.head_dim)};
  const fr::Shape kv{std::size_t(c.batch), std::size_t(c.seq_k), std::size_t(c.heads_kv), std::size_t(c.head_dim)};
  const flashlab::test::BwdInputs in = flashlab::test::bwd_inputs(q, kv, seed, c.dtype);
  fr::AttentionProblem cfg = flashlab::test::attention_problem(q, c.causal, c.dtype);
  cfg.seq_k = std::size_t(c.seq_k);
  cfg.heads_kv = std::size_t(c.heads_kv);
  cfg.window_left = c.left;
  cfg.window_right = c.right;
  const auto ref = fr::naive_backward<double>(cfg, in.Qd, in.Kd, in.Vd, in.dOd);
  const auto fwd = fc::fast_attention_forward(cfg, fc::FastForwardKernel::mma_sync, in.Q, in.K, in.V);
  static const std::vector<fc::FastBackwardKernel> kernels = gqa_kernels();
  for (const fc::FastBackwardKernel kernel : kernels) {
    INFO("kernel " << fc::to_string(kernel));
    const auto got =
        fc::fast_attention_backward(fr::Algorithm::bwd_atomic, cfg, in.Q, in.K, in.V, fwd.O, in.dO, fwd.LSE, kernel);
    REQUIRE(got.dQ.size() == ref.dQ.numel());
    REQUIRE(got.dK.size() == ref.dK.numel());
    REQUIRE(got.dV.size() == ref.dV.numel());
    const std::pair<const char*, const std::vector<std::uint16_t>*> grads[] = {
        {"dQ", &got.dQ}, {"dK", &got.dK}, {"dV", &got.dV}};
    const fr::Tensor<double>* wants[] = {&ref.dQ, &ref.dK, &ref.dV};
    std::printf("  %-62s %-8s", label.c_str(), fc::to_string(kernel));
    for (int t = 0; t < 3; ++t) {
      const double err = flashlab::test::error_16(*grads[t].second, wants[t]->data(), c.dtype);
      const double floor = flashlab::test::rounding_floor(wants[t]->data(), wants[t]->numel(), c.dtype);
      const double ratio = floor > 0 ? err / floor : (err > 0 ? 1e30 : 0.0);
      std::printf("  %s %.3e (x%.2f)", grads[t].first, err, ratio);
      if (!(ratio <= g_worst_ratio)) g_worst_ratio = ratio;  // NaN propagates as worst
      INFO(grads[t].first << " error " << err << ", rounding floor " << floor);
      CHECK(err <= std::max(1e-2, 2 * floor));
      std::size_t first = 0;
      const Band band(c);
      const std::size_t bad =
          t == 0 ? nonzero_outside(*grads[t].second, c.batch, c.seq, std::size_t(c.heads) * c.head_dim, c.dtype,
                                   [&](int i) { return !band.row_sees_a_key(i, c.seq_k); }, first)
                 : nonzero_outside(*grads[t].second, c.batch, c.seq_k, std::size_t(c.heads_kv) * c.head_dim, c.dtype,
                                   [&](int j) { return !band.key_seen(j, c.seq); }, first);
      INFO(grads[t].first << ": " << bad << " elements not 0 in rows outside every band (first at " << first << ")");
      CHECK(bad == 0);
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

TEST_CASE("grouped K/V and N_k != N: the backward kernels without them refuse them before any launch",
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
                        Catch::Contains("kernel mma or wgmma-ws"));
  CHECK_THROWS_WITH(fc::fast_attention_backward(fr::Algorithm::bwd_two_kernel, cfg, x, kv, kv, x, x, lse),
                    Catch::Contains("heads_kv (H_kv) = 2 (differs from heads (H) = 4) is not supported by the "
                                    "bwd_two_kernel design"));
  cfg.heads_kv = 0;
  cfg.seq_k = 32;
  const std::vector<std::uint16_t> k32(32 * 4 * 64);
  CHECK_THROWS_WITH(fc::fast_attention_backward(fr::Algorithm::bwd_two_kernel, cfg, x, k32, k32, x, x, lse),
                    Catch::Contains("seq_k (N_k) = 32 (differs from seq (N) = 64) is not supported by the "
                                    "bwd_two_kernel design"));
  // The atomic design's kernels take it: K, V and dK, dV have N_k rows (a K of N rows is refused).
  CHECK_THROWS_WITH(fc::fast_attention_backward(fr::Algorithm::bwd_atomic, cfg, x, x, x, x, x, lse),
                    Catch::Contains("K"));
}
