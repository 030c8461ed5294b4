// The fast tensor-core backward, BOTH designs: two-kernel (cuda/src/attention/attention_bwd_tc.cu)
// and atomic (cuda/src/attention/attention_bwd_tc_atomic.cu), each against the float64 reference
// flashlab::ref::naive_backward<double>. Every case runs for both designs on the same inputs.
//
// Inputs: fresh normal random Q, K, V, dO, rounded to bf16 (or fp16) first; the reference gets
// exactly those rounded values in float64. O and LSE come from the fast forward on the GPU (as in
// training: the backward consumes what the forward saved), so the measured error includes the
// 16-bit O feeding D = rowsum(dO∘O). Metric: ref::max_error_vs_max (max|got − ref| / max|ref|;
// NaN anywhere → +inf, which fails). Outputs (dQ, dK, dV) and the workspace (D; atomic: the fp32
// dQ accumulator) are poisoned with NaN by the host API before each run, so a missing zero-fill
// or write shows up. Tolerance: dQ, dK, dV ≤ 1e-2. For context each case prints the
// error of merely rounding the float64 gradient to the dtype (the floor of any 16-bit output).
// Shapes: N ∈ {1, 17, 128, 1000, 4096} (the clear-kernel tests' N), d ∈ {64, 128}, causal and
// not, batch > 1 once, fp16 twice, each for both designs (errors printed per design with their
// ratio to the rounding floor).
// The Hopper kernel of the atomic design (wgmma-ws) has its own cases, tag [fast-bwd-ws].
// Tag [fast-bwd-sanitize]: the small shapes, for compute-sanitizer. Timings live in
// `flashlab bench attention --pass bwd`, not here.
#include <catch2/catch.hpp>

#include "flashlab/cuda/fast_attention.hpp"
#include "gpu_test_util.hpp"
#include "flashlab/reference/attention.hpp"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace fc = flashlab::cuda;
namespace fr = flashlab::ref;

using flashlab::test::fresh_seed;

namespace {

constexpr double kTolGrad = 1e-2;  // 16-bit dQ, dK, dV vs float64 reference

struct BwdCase {
  int batch, seq, heads, head_dim;
  bool causal;
  fr::Dtype dtype = fr::Dtype::bf16;
};

// A backward to check: a design and the kernel that runs it.
struct BwdVariant {
  fr::Algorithm design;
  fc::FastBackwardKernel kernel = fc::FastBackwardKernel::mma_sync;
};
const std::vector<BwdVariant> kMmaDesigns = {{fr::Algorithm::bwd_two_kernel}, {fr::Algorithm::bwd_atomic}};
// The Hopper kernels beside the mma.sync atomic kernel they replace (same design, same inputs).
const std::vector<BwdVariant> kWsAndAtomic = {
    {fr::Algorithm::bwd_atomic},
    {fr::Algorithm::bwd_atomic, fc::FastBackwardKernel::wgmma_ws},
    {fr::Algorithm::bwd_atomic, fc::FastBackwardKernel::wgmma_ws_deterministic}};

double g_worst = 0.0;

// Error of a 16-bit result against the reference, and the error of the reference rounded to 16 bits.
struct GradError {
  double err, floor;
};
GradError grad_error(const std::vector<std::uint16_t>& got, const fr::Tensor<double>& ref, fr::Dtype dt) {
  return {flashlab::test::error_16(got, ref.data(), dt), flashlab::test::rounding_floor(ref.data(), ref.numel(), dt)};
}

void check_bwd(const BwdCase& c, const std::vector<BwdVariant>& variants = kMmaDesigns) {
  const unsigned long long seed = fresh_seed();
  const bool bf16 = c.dtype == fr::Dtype::bf16;
  const std::string label = std::string(bf16 ? "bf16" : "fp16") + " B=" + std::to_string(c.batch) +
                            " N=" + std::to_string(c.seq) + " H=" + std::to_string(c.heads) +
                            " d=" + std::to_string(c.head_dim) + (c.causal ? " causal" : "");
  INFO(label << " seed=" << seed << " (rerun with FLASHLAB_TEST_SEED)");
  const fr::Shape shape{std::size_t(c.batch), std::size_t(c.seq), std::size_t(c.heads), std::size_t(c.head_dim)};
  const flashlab::test::BwdInputs in = flashlab::test::bwd_inputs(shape, seed, c.dtype);
  const auto &Qd = in.Qd, &Kd = in.Kd, &Vd = in.Vd, &dOd = in.dOd;
  const auto &Qb = in.Q, &Kb = in.K, &Vb = in.V, &dOb = in.dO;

  const fr::AttentionProblem cfg = flashlab::test::attention_problem(shape, c.causal, c.dtype);
  const auto ref = fr::naive_backward<double>(cfg, Qd, Kd, Vd, dOd);

  // O, LSE as the forward saves them.
  const auto fwd = fc::fast_attention_forward(cfg, fc::FastForwardKernel::mma_sync, Qb, Kb, Vb);
  std::vector<std::uint16_t> first_dQ;  // the first variant's dQ, to show the variants ran different code
  for (const BwdVariant& v : variants) {
    const fr::Algorithm design = v.design;
    std::string dlabel = label + " " + std::string(fr::algorithm_flag_name(design));
    if (v.kernel != fc::FastBackwardKernel::mma_sync) dlabel.append("/").append(fc::to_string(v.kernel));
    INFO("design " << fr::algorithm_name(design) << ", kernel " << fc::to_string(v.kernel));
    const auto got = fc::fast_attention_backward(design, cfg, Qb, Kb, Vb, fwd.O, dOb, fwd.LSE, v.kernel);
    REQUIRE(got.dQ.size() == ref.dQ.numel());
    REQUIRE(got.dK.size() == ref.dK.numel());
    REQUIRE(got.dV.size() == ref.dV.numel());
    REQUIRE(got.D.size() == ref.D_from_O.size());
    const GradError eQ = grad_error(got.dQ, ref.dQ, c.dtype);
    const GradError eK = grad_error(got.dK, ref.dK, c.dtype);
    const GradError eV = grad_error(got.dV, ref.dV, c.dtype);
    const double eD = fr::max_error_vs_max(got.D.data(), ref.D_from_O.data(), got.D.size());
    auto ratio = [](const GradError& e) { return e.floor > 0 ? e.err / e.floor : 0.0; };
    std::printf("  %-41s dQ %.3e (floor %.1e, x%.2f)  dK %.3e (floor %.1e, x%.2f)  dV %.3e (floor %.1e, x%.2f)"
                "  D %.3e\n",
                dlabel.c_str(), eQ.err, eQ.floor, ratio(eQ), eK.err, eK.floor, ratio(eK), eV.err, eV.floor, ratio(eV),
                eD);
    for (double e : {eQ.err, eK.err, eV.err})
      if (!(e <= g_worst)) g_worst = e;  // NaN/inf propagate as worst
    INFO("dQ error " << eQ.err << ", dK error " << eK.err << ", dV error " << eV.err << ", D error " << eD);
    CHECK(eQ.err <= kTolGrad);
    CHECK(eK.err <= kTolGrad);
    CHECK(eV.err <= kTolGrad);
    CHECK(eD <= kTolGrad);
    if (first_dQ.empty()) {
      first_dQ = got.dQ;
    } else {
      // Information only (0 is legal): the variants sum dQ in other fp32 orders, so a few 16-bit
      // results usually differ from the first variant's.
      std::size_t diff = 0;
      for (std::size_t k = 0; k < first_dQ.size(); ++k) diff += first_dQ[k] != got.dQ[k];
      std::printf("  %-41s dQ elements differing from the first variant: %zu of %zu\n", "", diff, first_dQ.size());
    }
  }
}

void report(const char* name) {
  std::printf("[%s] worst dQ/dK/dV error %.3e (tolerance %.0e)\n", name, g_worst, kTolGrad);
  g_worst = 0.0;
}

}  // namespace

TEST_CASE("fast backward, small shapes, equals the float64 reference", "[fast-bwd][fast-bwd-sanitize]") {
  for (int seq : {1, 17, 128})
    for (int d : {64, 128})
      for (bool causal : {false, true}) check_bwd({1, seq, 2, d, causal});
  check_bwd({2, 70, 3, 64, true});                             // batch > 1, ragged
  check_bwd({1, 100, 2, 128, true, fr::Dtype::fp16});      // fp16 instantiations
  check_bwd({1, 100, 2, 64, false, fr::Dtype::fp16});
  report("fast bwd small");
}

TEST_CASE("fast backward, N = 1000 and 4096", "[fast-bwd][fast-bwd-large]") {
  for (int d : {64, 128})
    for (bool causal : {false, true}) check_bwd({1, 1000, 2, d, causal});
  // N = 4096: many query and key tiles per block (long dQ accumulation chains); one head keeps the
  // float64 reference's time down.
  for (int d : {64, 128})
    for (bool causal : {false, true}) check_bwd({1, 4096, 1, d, causal});
  report("fast bwd large");
}

// The Hopper backward (FastBackwardKernel::wgmma_ws, cuda/src/attention/attention_bwd_ws.cu, sm_90a; Br = 64
// query rows per step at d = 128, 128 at d = 64; Bc = 128 keys per block, 64 per consumer
// warpgroup), each case beside the mma.sync atomic kernel on the same inputs. Shapes: N = 1, 17 (one ragged tile), 64, 100, 128,
// 130, 300 (several query tiles: the stage ring wraps, dSᵀ double buffer alternates), causal (the
// masked diagonal, and consumer 1 fully masked on the first query tile), batch > 1, fp16, and
// more key blocks than SMs (an H100 has 132).
bool ws_in_build() {
  if (fc::fast_forward_wgmma_built()) return true;
  WARN("wgmma-ws backward not in this build (CMAKE_CUDA_ARCHITECTURES without 90): skipped");
  return false;
}

TEST_CASE("wgmma-ws backward, small shapes, equals the float64 reference",
          "[fast-bwd][fast-bwd-ws][fast-bwd-sanitize]") {
  if (!ws_in_build()) return;
  for (int seq : {1, 17, 64, 100, 128, 130, 300})
    for (int d : {64, 128})
      for (bool causal : {false, true}) check_bwd({1, seq, 2, d, causal}, kWsAndAtomic);
  check_bwd({2, 70, 3, 64, true}, kWsAndAtomic);  // batch > 1, ragged
  // d = 64 runs Br = 128, consumer c owning dQ rows [64c, 64c + 64) of a tile: the last tile with
  // consumer 1's rows all past N (192 = 128 + 64), partly (250) and exactly (256) filled.
  for (int seq : {192, 250, 256})
    for (bool causal : {false, true}) check_bwd({1, seq, 2, 64, causal}, kWsAndAtomic);
  check_bwd({3, 200, 2, 128, false}, kWsAndAtomic);
  for (int d : {64, 128})
    for (bool causal : {false, true}) check_bwd({1, 200, 2, d, causal, fr::Dtype::fp16}, kWsAndAtomic);
  report("wgmma-ws bwd small");
}

TEST_CASE("wgmma-ws backward, N = 1000 and 4096, more key blocks than SMs", "[fast-bwd][fast-bwd-ws][fast-bwd-large]") {
  if (!ws_in_build()) return;
  for (int d : {64, 128})
    for (bool causal : {false, true}) {
      check_bwd({1, 1000, 2, d, causal}, kWsAndAtomic);
      check_bwd({1, 4096, 1, d, causal}, kWsAndAtomic);
    }
  // 8 key blocks × 5 heads × 4 batches = 160 blocks: more than one wave on an H100.
  check_bwd({4, 1000, 5, 128, false}, kWsAndAtomic);
  check_bwd({4, 1000, 5, 64, true}, kWsAndAtomic);
  check_bwd({2, 1000, 2, 128, true, fr::Dtype::fp16}, kWsAndAtomic);
  report("wgmma-ws bwd large");
}

// The causal grid runs in chunks of heads, as many as hold their Q, dO and dQ accumulator in two
// thirds of L2 (attention_bwd_ws.cu): on an H100 (50 MiB), 150 of these 300 heads, so two chunks
// beside two batches in blockIdx.z, each chunk's two key tiles in order.
TEST_CASE("wgmma-ws backward, the causal grid in chunks of heads", "[fast-bwd][fast-bwd-ws][fast-bwd-sanitize]") {
  if (!ws_in_build()) return;
  check_bwd({2, 130, 300, 128, true}, kWsAndAtomic);
  report("wgmma-ws bwd causal chunks");
}

// Bit-reproducibility: the deterministic kernel gives the same dQ, dK, dV bits on every run (its
// dQ sums the key blocks in a fixed order); the plain wgmma-ws kernel's dQ is printed for contrast
// (its order varies, so its bits usually do). Many key blocks per query tile (N = 4096: 32) and
// more blocks than SMs (4 heads × 2 batches × 32 = 256), so the adds really contend.
TEST_CASE("wgmma-ws deterministic backward is bit-reproducible", "[fast-bwd][fast-bwd-ws][fast-bwd-large]") {
  if (!ws_in_build()) return;
  for (int d : {64, 128})
    for (bool causal : {false, true}) {
      const unsigned long long seed = fresh_seed();
      INFO("d=" << d << (causal ? " causal" : "") << " seed=" << seed);
      fr::AttentionProblem cfg;
      cfg.batch = 2;
      cfg.seq = 4096;
      cfg.heads = 4;
      cfg.head_dim = std::size_t(d);
      cfg.causal = causal;
      cfg.dtype = fr::Dtype::bf16;
      const std::size_t numel = cfg.batch * cfg.seq * cfg.heads * cfg.head_dim;
      std::mt19937_64 rng(seed);
      std::normal_distribution<float> normal;
      auto fill = [&] {
        std::vector<std::uint16_t> x(numel);
        for (auto& v : x) v = fc::float_to_bf16(normal(rng));
        return x;
      };
      const auto Q = fill(), K = fill(), V = fill(), dO = fill();
      const auto fwd = fc::fast_attention_forward(cfg, fc::FastForwardKernel::mma_sync, Q, K, V);
      auto run = [&](fc::FastBackwardKernel k) {
        return fc::fast_attention_backward(fr::Algorithm::bwd_atomic, cfg, Q, K, V, fwd.O, dO, fwd.LSE, k);
      };
      auto differing = [](const std::vector<std::uint16_t>& a, const std::vector<std::uint16_t>& b) {
        std::size_t n = 0;
        for (std::size_t k = 0; k < a.size(); ++k) n += a[k] != b[k];
        return n;
      };
      const auto first = run(fc::FastBackwardKernel::wgmma_ws_deterministic);
      std::size_t det_diff = 0;
      for (int rep = 0; rep < 3; ++rep) {
        const auto again = run(fc::FastBackwardKernel::wgmma_ws_deterministic);
        det_diff += differing(first.dQ, again.dQ) + differing(first.dK, again.dK) + differing(first.dV, again.dV);
      }
      const auto plain_a = run(fc::FastBackwardKernel::wgmma_ws), plain_b = run(fc::FastBackwardKernel::wgmma_ws);
      std::printf("  bf16 B=2 N=4096 H=4 d=%d%s: deterministic, elements differing over 3 reruns: %zu; "
                  "plain wgmma-ws, dQ elements differing between 2 runs: %zu of %zu\n",
                  d, causal ? " causal" : "", det_diff, differing(plain_a.dQ, plain_b.dQ), numel);
      CHECK(det_diff == 0);
      // The fixed order changes only the rounding of dQ's sum, not its value: against the plain kernel.
      std::vector<double> plain_dQ(numel);
      for (std::size_t k = 0; k < numel; ++k) plain_dQ[k] = flashlab::test::to_float(plain_a.dQ[k], cfg.dtype);
      CHECK(flashlab::test::error_16(first.dQ, plain_dQ.data(), cfg.dtype) <= 1e-2);
    }
}

TEST_CASE("fast backward refuses what it does not support", "[fast-bwd][errors]") {
  fr::AttentionProblem cfg;
  cfg.seq = 8;
  cfg.head_dim = 48;
  cfg.dtype = fr::Dtype::bf16;
  const auto atomic = fr::Algorithm::bwd_atomic, two_kernel = fr::Algorithm::bwd_two_kernel;
  const std::vector<std::uint16_t> x(8 * 48);
  const std::vector<float> lse(8);
  CHECK_THROWS_WITH(fc::fast_attention_backward(atomic, cfg, x, x, x, x, x, lse),
                    Catch::Contains("head_dim (d) = 48 is not 64, 128 or 256"));
  cfg.head_dim = 64;
  CHECK_THROWS_WITH(fc::fast_attention_backward(atomic, cfg, x, x, x, x, x, lse), Catch::Contains("Q has 384 elements"));
  CHECK_THROWS_WITH(fc::fast_attention_backward(fr::Algorithm::naive_bwd, cfg, x, x, x, x, x, lse),
                    Catch::Contains("is not a fast backward design"));
  CHECK_THROWS_WITH(
      fc::fast_attention_backward(two_kernel, cfg, x, x, x, x, x, lse, fc::FastBackwardKernel::wgmma_ws),
      Catch::Contains("runs the bwd_atomic design only"));
  // The device entry point refuses a missing workspace (it never allocates).
  CHECK_THROWS_WITH(fc::fast_attention_backward_device(atomic, cfg, nullptr, nullptr, nullptr, nullptr, nullptr,
                                                       nullptr, nullptr, nullptr, nullptr, nullptr),
                    Catch::Contains("workspace"));
  // Workspace: D (B·H·N floats), and for the atomic design the 256-byte aligned fp32 dQ accumulator
  // and one int32 dQ order counter per 64 query rows (the deterministic wgmma-ws kernel's).
  CHECK(fc::fast_attention_backward_workspace_bytes(two_kernel, cfg) == 8 * sizeof(float));
  // (whole query tiles: N rounded up to 128 rows)
  CHECK(fc::fast_attention_backward_workspace_bytes(atomic, cfg) == 256 + 128 * 64 * sizeof(float) + sizeof(int));
}
