// The fast tensor-core forward (cuda/src/attention/attention_fwd_tc.cu) against the float64
// reference flashlab::ref::naive_forward<double>.
//
// Inputs: fresh normal random Q, K, V, rounded to bf16 (or fp16) first; the reference gets exactly
// those rounded values in float64, so the error measured is the kernel's own (16-bit P, fp32
// accumulation, 16-bit O), not the input rounding. Metric: ref::max_error_vs_max (max|got − ref| /
// max|ref| over the whole tensor; NaN anywhere → +inf, which fails). Outputs are poisoned with NaN
// by the host API before each run. Tolerances: O ≤ 1e-2 (the bar set for the fast kernels); LSE ≤ 1e-4 (it is computed
// from fp32 scores, only the output O is rounded to 16 bits). For context each case also prints the
// error of the same computation done in float32 (naive_forward<float> on the same rounded inputs)
// and the floor of any 16-bit output (the float64 O rounded to the dtype).
// Shapes: N ∈ {1, 17, 128, 1000, 4096}, d ∈ {64, 128}, causal and not, batch > 1 once, fp16 once;
// N = 80 non-causal (a full key tile, then a ragged one of 16 keys);
// plus N = 300 with key rows scaled up along the sequence (maxima that keep growing: late rescales).
// Tag [fast-sanitize]: the small shapes, for compute-sanitizer. [fast-wgmma]: the same checks on the
// wgmma forward (FastForwardKernel::wgmma, cuda/src/attention/attention_fwd_wgmma.cu); [fast-ws]: on the TMA +
// warp-specialised forward (FastForwardKernel::tma_ws, cuda/src/attention/attention_fwd_ws.cu).
#include <catch2/catch.hpp>

#include "flashlab/cuda/fast_attention.hpp"
#include "gpu_test_util.hpp"
#include "flashlab/cuda/options.hpp"
#include "flashlab/reference/attention.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace fc = flashlab::cuda;
namespace fr = flashlab::ref;

using flashlab::test::fresh_seed;
using flashlab::test::round_to_16;

namespace {

constexpr double kTolO = 1e-2;    // 16-bit O vs float64 reference
constexpr double kTolLSE = 1e-4;  // fp32 LSE vs float64 reference

struct FastCase {
  int batch, seq, heads, head_dim;
  bool causal;
  fr::Dtype dtype = fr::Dtype::bf16;
  // > 0: key row n is scaled by 1 + k_ramp·n/N, so row maxima keep growing from key tile to key
  // tile (by more than the kernel's rescale slack of 2^8), exercising the late rescale of acc.
  double k_ramp = 0.0;
  fc::FastForwardKernel kernel = fc::FastForwardKernel::mma_sync;  // which forward runs
  // large: every Q entry ±800 and the K entries of the second half of the keys ±800 (scores of
  // ~1e5, then ~1e7 in exact ties: one-hot rows whose maximum jumps by far more than 2^8 mid-row).
  bool large = false;
};

double g_worst_O = 0.0, g_worst_LSE = 0.0;

void check_fast(const FastCase& c) {
  const unsigned long long seed = fresh_seed();
  const bool bf16 = c.dtype == fr::Dtype::bf16;
  const std::string label = std::string(bf16 ? "bf16" : "fp16") + " B=" + std::to_string(c.batch) +
                            " N=" + std::to_string(c.seq) + " H=" + std::to_string(c.heads) +
                            " d=" + std::to_string(c.head_dim) + (c.causal ? " causal" : "") +
                            (c.k_ramp > 0.0 ? " k-ramp" : "") + (c.large ? " ±800" : "") +
                            (c.kernel == fc::FastForwardKernel::mma_sync ? "" : std::string(" ") + fc::to_string(c.kernel));
  INFO(label << " seed=" << seed << " (rerun with FLASHLAB_TEST_SEED)");
  const fr::Shape shape{std::size_t(c.batch), std::size_t(c.seq), std::size_t(c.heads), std::size_t(c.head_dim)};
  fr::Tensor<double> q0(shape), k0(shape), v0(shape), Qd(shape), Kd(shape), Vd(shape);
  fr::fill_normal(q0, seed);
  fr::fill_normal(k0, seed + 1);
  fr::fill_normal(v0, seed + 2);
  if (c.large) {
    const std::size_t row = shape.heads * shape.head_dim;  // elements per token ([B, N, H, d])
    for (std::size_t i = 0; i < q0.numel(); ++i) q0.data()[i] = q0.data()[i] < 0 ? -800.0 : 800.0;
    for (std::size_t b = 0; b < shape.batch; ++b)
      for (std::size_t n = shape.seq / 2; n < shape.seq; ++n)
        for (std::size_t e = 0; e < row; ++e) {
          double& x = k0.data()[(b * shape.seq + n) * row + e];
          x = x < 0 ? -800.0 : 800.0;
        }
  }
  if (c.k_ramp > 0.0) {
    const std::size_t row = shape.heads * shape.head_dim;  // elements per token ([B, N, H, d])
    for (std::size_t b = 0; b < shape.batch; ++b)
      for (std::size_t n = 0; n < shape.seq; ++n) {
        const double f = 1.0 + c.k_ramp * double(n) / double(shape.seq);
        double* x = k0.data() + (b * shape.seq + n) * row;
        for (std::size_t e = 0; e < row; ++e) x[e] *= f;
      }
  }
  const auto Qb = round_to_16(q0, c.dtype, Qd), Kb = round_to_16(k0, c.dtype, Kd), Vb = round_to_16(v0, c.dtype, Vd);

  const fr::AttentionProblem cfg = flashlab::test::attention_problem(shape, c.causal, c.dtype);
  const auto ref = fr::naive_forward<double>(cfg, Qd, Kd, Vd);
  // Context: the same computation in float32 on the same rounded inputs.
  const auto ref32 = fr::naive_forward<float>(cfg, Qd.cast<float>(), Kd.cast<float>(), Vd.cast<float>());
  const double e32 = fr::max_error_vs_max(ref32.O.data(), ref.O.data(), ref.O.numel());
  // The floor of any 16-bit output: the float64 O itself rounded to the dtype.
  const double e_floor = flashlab::test::rounding_floor(ref.O.data(), ref.O.numel(), c.dtype);

  const auto got = fc::fast_attention_forward(cfg, c.kernel, Qb, Kb, Vb);
  REQUIRE(got.O.size() == ref.O.numel());
  REQUIRE(got.LSE.size() == ref.LSE.size());
  const double eO = flashlab::test::error_16(got.O, ref.O.data(), c.dtype);
  const double eL = fr::max_error_vs_max(got.LSE.data(), ref.LSE.data(), got.LSE.size());
  std::printf("  %-34s O error %.3e (float32 naive: %.3e, O rounded to 16 bits: %.3e)  LSE error %.3e\n",
              label.c_str(), eO, e32, e_floor, eL);
  if (!(eO <= g_worst_O)) g_worst_O = eO;  // NaN/inf propagate as worst
  if (!(eL <= g_worst_LSE)) g_worst_LSE = eL;
  INFO("O error " << eO << " (float32: " << e32 << "), LSE error " << eL);
  CHECK(eO <= kTolO);
  // Tighter: within 2× the error of merely rounding the exact answer to 16 bits (measured
  // 1.0–1.4×), so a subtle bug that stays under 1e-2 still fails. ±800 values: rows of one or a
  // few tied keys, whose P (2^δ, δ the fp32 rounding of m_i at scores of ~1e7) is rounded to 16
  // bits while l_i is not, and O_i then rounded again: two unit roundoffs of the dtype more (2^-7
  // bf16, where kTolO then binds; 2^-10 fp16; measured up to 4.0× the floor, 0.62× this bound).
  const double p_rounding = c.large ? (bf16 ? 0x1p-7 : 0x1p-10) : 0.0;
  // Beyond that, the floor of rounding P_ij for P·V too (rows with few keys: gpu_test_util.hpp).
  const double e_floor_p = eO <= 2.0 * e_floor + p_rounding + 1e-7
                               ? 0.0
                               : flashlab::test::rounded_p_floor(cfg, c.kernel, Qd, Kd, Vd, ref.O.data());
  INFO("floor with P rounded too " << e_floor_p);
  CHECK(eO <= 2.0 * std::max(e_floor, e_floor_p) + p_rounding + 1e-7);
  CHECK(eL <= kTolLSE);
}

// One NaN in V (key `nan_key`, head 0, column 5) must come out as NaN in O wherever the float64
// reference has NaN (that column of every row of head 0 that sees the key) and nowhere else; the
// finite entries still match the reference.
void check_nan_in_v(const FastCase& c, int nan_key) {
  const unsigned long long seed = fresh_seed();
  INFO("NaN in V: N=" << c.seq << " H=" << c.heads << " d=" << c.head_dim << (c.causal ? " causal" : "")
                      << " seed=" << seed);
  const fr::Shape shape{std::size_t(c.batch), std::size_t(c.seq), std::size_t(c.heads), std::size_t(c.head_dim)};
  fr::Tensor<double> q0(shape), k0(shape), v0(shape), Qd(shape), Kd(shape), Vd(shape);
  fr::fill_normal(q0, seed);
  fr::fill_normal(k0, seed + 1);
  fr::fill_normal(v0, seed + 2);
  v0.data()[std::size_t(nan_key) * shape.heads * shape.head_dim + 5] = std::nan("");
  const auto Qb = round_to_16(q0, c.dtype, Qd), Kb = round_to_16(k0, c.dtype, Kd), Vb = round_to_16(v0, c.dtype, Vd);
  const fr::AttentionProblem cfg = flashlab::test::attention_problem(shape, c.causal, c.dtype);
  const auto ref = fr::naive_forward<double>(cfg, Qd, Kd, Vd);
  const auto got = fc::fast_attention_forward(cfg, c.kernel, Qb, Kb, Vb);
  REQUIRE(got.O.size() == ref.O.numel());
  std::size_t nan_ref = 0, nan_missing = 0, nan_extra = 0;
  double ref_max = 0.0, worst = 0.0;
  for (std::size_t i = 0; i < ref.O.numel(); ++i)
    if (!std::isnan(ref.O.data()[i])) ref_max = std::max(ref_max, std::abs(ref.O.data()[i]));
  for (std::size_t i = 0; i < ref.O.numel(); ++i) {
    const double r = ref.O.data()[i], g = flashlab::test::to_float(got.O[i], c.dtype);
    if (std::isnan(r)) {
      ++nan_ref;
      nan_missing += !std::isnan(g);
    } else if (std::isnan(g)) {
      ++nan_extra;
    } else {
      worst = std::max(worst, std::abs(g - r) / ref_max);
    }
  }
  std::printf("  NaN in V, N=%d d=%d%s: %zu NaN expected, %zu missing, %zu extra, finite O error %.3e\n", c.seq,
              c.head_dim, c.causal ? " causal" : "", nan_ref, nan_missing, nan_extra, worst);
  CHECK(nan_ref > 0);
  CHECK(nan_missing == 0);
  CHECK(nan_extra == 0);
  CHECK(worst <= kTolO);
}

void report(const char* name) {
  std::printf("[%s] worst O error %.3e (tolerance %.0e), worst LSE error %.3e (tolerance %.0e)\n", name, g_worst_O,
              kTolO, g_worst_LSE, kTolLSE);
  g_worst_O = g_worst_LSE = 0.0;
}

}  // namespace

TEST_CASE("fast forward, small shapes, equals the float64 reference", "[fast][fast-sanitize]") {
  for (int seq : {1, 17, 128})
    for (int d : {64, 128})
      for (bool causal : {false, true}) check_fast({1, seq, 2, d, causal});
  check_fast({2, 70, 3, 64, true});                            // batch > 1, ragged
  check_fast({1, 200, 2, 128, true, fr::Dtype::fp16});     // fp16 instantiation
  check_fast({1, 200, 2, 64, false, fr::Dtype::fp16});
  // One full key tile, then a tile with 16 keys: 48 masked keys after real maxima exist (the
  // lazy rescale must keep alpha = 1 and P = 0 there).
  for (int d : {64, 128}) check_fast({1, 80, 2, d, false});
  check_fast({1, 80, 2, 128, false, fr::Dtype::fp16});
  report("fast small");
}

TEST_CASE("fast forward, N = 1000 and 4096", "[fast][fast-large]") {
  for (int d : {64, 128})
    for (bool causal : {false, true}) {
      check_fast({1, 1000, 2, d, causal});
      check_fast({1, 4096, 1, d, causal});
    }
  report("fast large");
}

TEST_CASE("fast forward, row maxima growing along the keys (late rescales)", "[fast][fast-sanitize]") {
  // Scores grow ~20× from the first key to the last: maxima jump by more than 2^8 between key
  // tiles, so acc = diag(alpha)·acc runs with alpha < 1 long after the first tile (the lazy and the
  // slack rescale of attention_fwd_tc.cu), and P stays ≤ 2^8 in between.
  for (int d : {64, 128})
    for (bool causal : {false, true}) check_fast({1, 300, 2, d, causal, fr::Dtype::bf16, 19.0});
  check_fast({1, 300, 2, 128, false, fr::Dtype::fp16, 19.0});
  report("fast k-ramp");
}

// The wgmma forward (cuda/src/attention/attention_fwd_wgmma.cu, sm_90a; Br = Bc = 128): the same checks.
// Shapes mirror the mma.sync cases, plus N = 130 and 200 (a full 128-key tile, then a ragged one)
// and N = 300 k-ramp (three key tiles, late rescales; this kernel always rescales).
bool wgmma_in_build() {
  if (fc::fast_forward_wgmma_built()) return true;
  WARN("wgmma forward not in this build (CMAKE_CUDA_ARCHITECTURES without 90): skipped");
  return false;
}
constexpr fr::Dtype kBf16 = fr::Dtype::bf16, kFp16 = fr::Dtype::fp16;
constexpr fc::FastForwardKernel kWgmma = fc::FastForwardKernel::wgmma;

TEST_CASE("wgmma forward, small shapes, equals the float64 reference", "[fast][fast-wgmma][fast-sanitize]") {
  if (!wgmma_in_build()) return;
  for (int seq : {1, 17, 128, 130})
    for (int d : {64, 128})
      for (bool causal : {false, true}) check_fast({1, seq, 2, d, causal, kBf16, 0.0, kWgmma});
  check_fast({2, 70, 3, 64, true, kBf16, 0.0, kWgmma});  // batch > 1, ragged
  check_fast({3, 200, 2, 128, false, kBf16, 0.0, kWgmma});
  for (int d : {64, 128})
    for (bool causal : {false, true}) check_fast({1, 200, 2, d, causal, kFp16, 0.0, kWgmma});  // fp16
  for (int d : {64, 128})
    for (bool causal : {false, true}) check_fast({1, 300, 2, d, causal, kBf16, 19.0, kWgmma});  // k-ramp
  check_fast({1, 300, 2, 128, false, kFp16, 19.0, kWgmma});
  report("wgmma small");
}

TEST_CASE("wgmma forward, N = 1000 and 4096", "[fast][fast-wgmma][fast-large]") {
  if (!wgmma_in_build()) return;
  for (int d : {64, 128})
    for (bool causal : {false, true}) {
      check_fast({1, 1000, 2, d, causal, kBf16, 0.0, kWgmma});
      check_fast({1, 4096, 1, d, causal, kBf16, 0.0, kWgmma});
    }
  check_fast({2, 1000, 2, 128, true, kFp16, 0.0, kWgmma});
  report("wgmma large");
}

// The TMA + warp-specialised forward (cuda/src/attention/attention_fwd_ws.cu, sm_90a; Bc = 128, Br = 128, or
// 192 at d = 64 on long work lists): the
// same shapes as the wgmma ones, plus N = 80 (one ragged tile), 300 (three tiles: the stage ring
// wraps) and 4096 / 1000 with batch > 1 (many blocks, both pipeline phases).
constexpr fc::FastForwardKernel kTmaWs = fc::FastForwardKernel::tma_ws;

TEST_CASE("tma-ws forward, small shapes, equals the float64 reference", "[fast][fast-ws][fast-sanitize]") {
  if (!wgmma_in_build()) return;
  for (int seq : {1, 17, 80, 128, 130, 300})
    for (int d : {64, 128})
      for (bool causal : {false, true}) check_fast({1, seq, 2, d, causal, kBf16, 0.0, kTmaWs});
  check_fast({2, 70, 3, 64, true, kBf16, 0.0, kTmaWs});  // batch > 1, ragged
  check_fast({3, 200, 2, 128, false, kBf16, 0.0, kTmaWs});
  for (int d : {64, 128})
    for (bool causal : {false, true}) check_fast({1, 200, 2, d, causal, kFp16, 0.0, kTmaWs});  // fp16
  for (int d : {64, 128})
    for (bool causal : {false, true}) check_fast({1, 300, 2, d, causal, kBf16, 19.0, kTmaWs});  // k-ramp: late rescales
  check_fast({1, 300, 2, 128, false, kFp16, 19.0, kTmaWs});
  // Lengths around 192 and 384 (the query tile of the three-warpgroup configuration; with 2 heads
  // the work list is short, so these run Br = 128: 1½ and 3 tiles).
  for (int seq : {191, 192, 193, 385})
    for (bool causal : {false, true}) check_fast({1, seq, 2, 64, causal, kBf16, 0.0, kTmaWs});
  report("tma-ws small");
}

// The launch has at most one block per SM and each block walks a list of (query tile, head)
// units: more units than SMs (an H100 has 132) make blocks run several, carrying the K/V stage
// ring and the mbarrier phases from one unit to the next (and Q_i reloaded while P·V finishes).
TEST_CASE("tma-ws forward, more query tiles than SMs, equals the float64 reference",
          "[fast][fast-ws][fast-sanitize]") {
  if (!wgmma_in_build()) return;
  for (bool causal : {false, true}) {
    check_fast({1, 300, 48, 64, causal, kBf16, 0.0, kTmaWs});   // 3 query tiles × 48 heads
    check_fast({2, 200, 40, 128, causal, kBf16, 0.0, kTmaWs});  // 2 × 40 heads × 2 batches, ragged
  }
  // 300 units of one key tile: at d = 128 each unit's O_i leaves through its K_j stage, held from
  // the producer until the store has read it, the stages of consecutive units in turn.
  check_fast({1, 100, 300, 128, false, kBf16, 0.0, kTmaWs});
  check_fast({1, 1, 300, 128, true, kFp16, 0.0, kTmaWs});  // N = 1: 300 one-row units
  report("tma-ws many tiles");
}

// d = 64 takes three consumer warpgroups (Br = 192) once the work list gives every SM 2.5 rounds
// of units (5 when causal; attention_fwd_ws.cu, ws_three_consumers): 2 query tiles × 400 heads =
// 800 units is past both bars on a GPU of up to 160 SMs. N = 193: one full tile, then one row.
TEST_CASE("tma-ws forward, d = 64 with Br = 192, equals the float64 reference", "[fast][fast-ws][fast-sanitize]") {
  if (!wgmma_in_build()) return;
  // Causal: warpgroup 0 (rows 0..63) meets key tile 1 (keys 128..192) masked for all its rows.
  for (bool causal : {false, true}) check_fast({1, 193, 400, 64, causal, kBf16, 0.0, kTmaWs});
  check_fast({1, 193, 400, 64, true, kBf16, 19.0, kTmaWs});  // late rescales
  check_fast({2, 193, 200, 64, true, kFp16, 0.0, kTmaWs});   // fp16, batch 2
  check_fast({1, 1, 800, 64, false, kBf16, 0.0, kTmaWs});  // N = 1: 800 one-row units
  report("tma-ws Br 192");
}

// Odd numbers of query tiles over several rounds of the work list, non-causal (the configurations
// with the short reduction chains): Br = 128 and 192, late rescales.
TEST_CASE("tma-ws forward, odd query tile counts over several rounds, equals the float64 reference",
          "[fast][fast-ws][fast-sanitize]") {
  if (!wgmma_in_build()) return;
  check_fast({1, 300, 3, 128, false, kBf16, 0.0, kTmaWs});    // Tr = 3, one round
  check_fast({2, 330, 70, 128, false, kFp16, 0.0, kTmaWs});   // 2 × 70 heads × 3 tiles: 420 units, 4 rounds
  check_fast({1, 400, 150, 64, false, kBf16, 0.0, kTmaWs});   // Br = 192, Tr = 3, 450 units
  check_fast({1, 400, 150, 64, false, kBf16, 19.0, kTmaWs});  // late rescales
  report("tma-ws odd tiles");
}

// A gentle ramp of the keys (K_n scaled by 1 + n/(2N)): every row meets its largest scores late,
// a little above the maxima of its first key tiles. A row maximum that lagged behind them (as
// FlashAttention-4's, by up to 2^8) rounds the largest P of a row to 16 bits too and took O past 2×
// its rounding floor in about half of these cases; the running maximum stays at 1.0–1.5×.
TEST_CASE("tma-ws forward, keys growing gently along the sequence", "[fast][fast-ws]") {
  if (!wgmma_in_build()) return;
  check_fast({1, 300, 4, 64, false, kBf16, 0.5, kTmaWs});    // Br = 128
  check_fast({1, 300, 4, 64, false, kFp16, 0.5, kTmaWs});
  check_fast({1, 400, 150, 64, false, kBf16, 0.5, kTmaWs});  // Br = 192
  check_fast({1, 575, 4, 128, false, kBf16, 0.5, kTmaWs});   // Bc = 192
  check_fast({1, 300, 4, 128, false, kFp16, 0.5, kTmaWs});   // Bc = 128
  check_fast({1, 575, 4, 128, true, kBf16, 0.5, kTmaWs});
  report("tma-ws gentle ramp");
}

// Adversarial values on every configuration of the tma-ws forward (d = 64 with Br = 128 and 192,
// d = 128 with Bc = 128 and 192; the warp's vote of online_softmax_vote must still let m_i move
// when a score jumps far above it): ±800 entries, and a NaN in V that must reach O.
TEST_CASE("tma-ws forward, ±800 values and a NaN in V", "[fast][fast-ws][fast-sanitize]") {
  if (!wgmma_in_build()) return;
  for (bool causal : {false, true}) {
    check_fast({1, 300, 2, 64, causal, kBf16, 0.0, kTmaWs, true});     // Br = 128
    check_fast({1, 400, 150, 64, causal, kBf16, 0.0, kTmaWs, true});   // Br = 192 (non-causal; causal 128)
    check_fast({1, 384, 2, 128, causal, kBf16, 0.0, kTmaWs, true});    // non-causal: Bc = 192
    check_fast({1, 300, 2, 128, causal, kFp16, 0.0, kTmaWs, true});    // Bc = 128
  }
  check_fast({1, 193, 400, 64, true, kBf16, 0.0, kTmaWs, true});  // causal Br = 192
  for (bool causal : {false, true}) {
    check_nan_in_v({1, 400, 150, 64, causal, kBf16, 0.0, kTmaWs}, 0);
    // Causal: a NaN under the mask would reach the masked rows as 0·NaN in P·V; key 0 is seen by all.
    check_nan_in_v({1, 300, 2, 64, causal, kBf16, 0.0, kTmaWs}, causal ? 0 : 250);
    check_nan_in_v({1, 384, 2, 128, causal, kBf16, 0.0, kTmaWs}, 0);
  }
  report("tma-ws ±800");
}

// The split tail (d = 64, three consumers, non-causal; attention_fwd_ws.cu, ws_split_tail): on an
// H100's 132 SMs, N = 600, H = 140 is 560 units of 192 rows, 4 whole rounds and 32 units cut along
// their 5 key tiles (the last ragged: 88 keys) into pieces of 1–2 tiles that cross units;
// N = 400, H = 180 is 540 units, 12 cut along 4 key tiles, most blocks' shares empty or one tile.
// The pieces' partial O, m_i, l_i are combined by a second kernel; late rescales and ±800 values
// make the pieces' maxima differ.
TEST_CASE("tma-ws forward, the last round cut along the keys, equals the float64 reference",
          "[fast][fast-ws][fast-sanitize]") {
  if (!wgmma_in_build()) return;
  check_fast({1, 400, 180, 64, false, kFp16, 0.0, kTmaWs});
  check_fast({1, 400, 180, 64, false, kBf16, 0.0, kTmaWs, true});
  check_fast({1, 600, 140, 64, false, kBf16, 0.0, kTmaWs});
  check_fast({1, 600, 140, 64, false, kBf16, 19.0, kTmaWs});
  report("tma-ws split tail");
}

// Non-causal lengths around the wider key tiles (Bc = 192 at d = 128 where the last tile pads N by
// at most 1 %: 191, 192, 383, 384, 575 and 4031 here; attention_fwd_ws.cu, ws_wide_keys): a tile
// less one, a full tile, a tile and one key; several rounds of the work list, late rescales, fp16.
TEST_CASE("tma-ws forward, wide key tiles, equals the float64 reference",
          "[fast][fast-ws][fast-sanitize]") {
  if (!wgmma_in_build()) return;
  for (int seq : {1, 191, 192, 193, 383, 384, 385, 575})
    for (int d : {64, 128}) check_fast({1, seq, 2, d, false, kBf16, 0.0, kTmaWs});
  check_fast({2, 383, 40, 128, false, kBf16, 0.0, kTmaWs});   // 2 × 40 heads × 3 tiles: 240 units
  check_fast({1, 385, 100, 64, false, kBf16, 19.0, kTmaWs});  // late rescales over 4 key tiles
  check_fast({1, 575, 2, 128, false, kBf16, 19.0, kTmaWs});
  check_fast({1, 383, 2, 128, false, kFp16, 0.0, kTmaWs});
  check_fast({1, 4031, 1, 128, false, kBf16, 0.0, kTmaWs});  // 21 tiles of 192, the last one key short
  // 8 query tiles × 17 heads = 136 units: a last round of 4 units on an H100's 132 SMs.
  for (int d : {64, 128}) check_fast({1, 1000, 17, d, false, kBf16, 0.0, kTmaWs});
  check_fast({1, 1000, 17, 128, false, kBf16, 19.0, kTmaWs});
  report("tma-ws wide key tiles");
}

TEST_CASE("tma-ws forward, N = 1000 and 4096", "[fast][fast-ws][fast-large]") {
  if (!wgmma_in_build()) return;
  for (int d : {64, 128})
    for (bool causal : {false, true}) {
      check_fast({1, 1000, 2, d, causal, kBf16, 0.0, kTmaWs});
      check_fast({1, 4096, 1, d, causal, kBf16, 0.0, kTmaWs});
    }
  check_fast({2, 1000, 2, 128, true, kFp16, 0.0, kTmaWs});
  check_fast({2, 4096, 2, 64, false, kFp16, 0.0, kTmaWs});
  report("tma-ws large");
}

// Causal lists where fewer than S units in flight would read each K/V head run in stripes of W
// query tiles, W units of one head side by side (attention_fwd_ws.cu, ws_causal_stripe; S = 8 at
// Br = 128, 2 at Br = 192, on a GPU of 132 SMs): d = 128, B·H = 32 → W = 8 over Tr = 11 tiles
// (stripes of 8 and 3); grouped 32:16 → W = 4 (4, 4, 3); d = 64 with Br = 192, B·H = 256 → W = 2
// over 7 tiles (2, 2, 2, 1). O is poisoned with NaN before the launch: every unit must be written.
// A unit's numbers do not depend on where it sits in the list, so each batch entry must come out
// bit for bit as when it runs alone (B = 1: another list, the same tiles), and sampled rows (both
// ends, a tile's edges, random ones) must equal a float64 softmax within 2× their rounding floor.
TEST_CASE("tma-ws forward, causal list in stripes of query tiles, each batch entry as when alone", "[fast][fast-ws]") {
  if (!wgmma_in_build()) return;
  constexpr std::array<std::array<int, 4>, 3> kShapes{{{2, 16, 16, 128}, {2, 32, 16, 128}, {2, 128, 128, 64}}};
  for (const auto [B, H, Hk, d] : kShapes) {
    const int N = 1300, G = H / Hk;
    const unsigned long long seed = fresh_seed();
    INFO("B=" << B << " H=" << H << " H_kv=" << Hk << " N=" << N << " d=" << d << " causal seed=" << seed);
    const fr::Shape qs{std::size_t(B), std::size_t(N), std::size_t(H), std::size_t(d)};
    const fr::Shape ks{std::size_t(B), std::size_t(N), std::size_t(Hk), std::size_t(d)};
    const auto in = flashlab::test::bwd_inputs(qs, ks, seed, kBf16);
    fr::AttentionProblem cfg = flashlab::test::attention_problem(qs, true, kBf16);
    cfg.heads_kv = std::size_t(Hk);
    const auto got = fc::fast_attention_forward(cfg, kTmaWs, in.Q, in.K, in.V);
    std::size_t nan_count = 0, unequal = 0;
    for (const std::uint16_t x : got.O) nan_count += std::isnan(flashlab::test::to_float(x, kBf16));
    CHECK(nan_count == 0);
    const std::size_t q_entry = std::size_t(N) * H * d, k_entry = std::size_t(N) * Hk * d;  // per batch entry
    for (int b = 0; b < B; ++b) {
      auto part = [b](const std::vector<std::uint16_t>& x, std::size_t n) {
        return std::vector<std::uint16_t>(x.begin() + std::ptrdiff_t(b * n), x.begin() + std::ptrdiff_t((b + 1) * n));
      };
      fr::AttentionProblem one = cfg;
      one.batch = 1;
      const auto alone =
          fc::fast_attention_forward(one, kTmaWs, part(in.Q, q_entry), part(in.K, k_entry), part(in.V, k_entry));
      for (std::size_t k = 0; k < q_entry; ++k) unequal += got.O[b * q_entry + k] != alone.O[k];
      unequal += std::memcmp(got.LSE.data() + std::size_t(b) * H * N, alone.LSE.data(), sizeof(float) * H * N) != 0;
    }
    CHECK(unequal == 0);
    // Sampled rows against float64 ([B, N, H, d] and [B, N, H_kv, d]).
    auto q_at = [&](int b, int n, int h) { return (std::size_t(b) * N + n) * H * d + std::size_t(h) * d; };
    auto k_at = [&](int b, int n, int h) { return (std::size_t(b) * N + n) * Hk * d + std::size_t(h / G) * d; };
    std::mt19937 pick{unsigned(seed)};
    std::vector<int> rows = {0, 1, 127, 128, 191, 192, N / 2, N - 2, N - 1};
    for (int r = 0; r < 6; ++r) rows.push_back(int(pick() % unsigned(N)));
    const double scale = cfg.softmax_scale();
    double err = 0.0, floor16 = 0.0, ref_max = 0.0, lse_err = 0.0, lse_max = 0.0;
    std::vector<double> s(N), o(d);
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h)
        for (const int i : rows) {
          double m = -INFINITY;
          for (int j = 0; j <= i; ++j) {
            double dot = 0.0;
            for (int e = 0; e < d; ++e) dot += in.Qd.data()[q_at(b, i, h) + e] * in.Kd.data()[k_at(b, j, h) + e];
            s[j] = dot * scale;
            m = std::max(m, s[j]);
          }
          double l = 0.0;
          std::fill(o.begin(), o.end(), 0.0);
          for (int j = 0; j <= i; ++j) {
            const double p = std::exp(s[j] - m);
            l += p;
            for (int e = 0; e < d; ++e) o[e] += p * in.Vd.data()[k_at(b, j, h) + e];
          }
          for (int e = 0; e < d; ++e) {
            const double ref = o[e] / l, g = flashlab::test::to_float(got.O[q_at(b, i, h) + e], kBf16);
            ref_max = std::max(ref_max, std::abs(ref));
            err = std::isnan(g) ? INFINITY : std::max(err, std::abs(g - ref));
            floor16 = std::max(floor16, std::abs(double(flashlab::test::round_float_to_16(float(ref), kBf16)) - ref));
          }
          const double lse = (m + std::log(l)) / std::log(2.0), g = got.LSE[(std::size_t(b) * H + h) * N + i];
          lse_err = std::isnan(g) ? INFINITY : std::max(lse_err, std::abs(g - lse));
          lse_max = std::max(lse_max, std::abs(lse));
        }
    std::printf("  striped causal B=%d H=%d H_kv=%d N=%d d=%d: %zu values unequal to each batch entry alone; sampled"
                " rows: O error %.3e (rounding floor %.3e), LSE error %.3e\n",
                B, H, Hk, N, d, unequal, err / ref_max, floor16 / ref_max, lse_err / lse_max);
    CHECK(err / ref_max <= 2.0 * floor16 / ref_max + 1e-7);
    CHECK(lse_err / lse_max <= kTolLSE);
  }
}

TEST_CASE("fast forward refuses what it does not support", "[fast][errors]") {
  fr::AttentionProblem cfg;
  cfg.seq = 8;
  cfg.head_dim = 48;
  cfg.dtype = fr::Dtype::bf16;
  const auto mma = fc::FastForwardKernel::mma_sync, wgmma = fc::FastForwardKernel::wgmma;
  const std::vector<std::uint16_t> x(8 * 48);
  CHECK_THROWS_WITH(fc::fast_attention_forward(cfg, mma, x, x, x), Catch::Contains("head_dim (d) = 48 is not 64, 128 or 256"));
  CHECK_THROWS_WITH(fc::fast_attention_forward(cfg, wgmma, x, x, x), Catch::Contains("head_dim (d) = 48"));
  CHECK_THROWS_WITH(fc::fast_attention_forward(cfg, fc::FastForwardKernel::tma_ws, x, x, x),
                    Catch::Contains("head_dim (d) = 48"));
  cfg.head_dim = 64;
  CHECK_THROWS_WITH(fc::fast_attention_forward(cfg, mma, x, x, x), Catch::Contains("Q has 384 elements"));
  cfg.dtype = fr::Dtype::fp32;
  CHECK_THROWS_WITH(fc::fast_attention_forward(cfg, mma, x, x, x), Catch::Contains("dtype = fp32 is not bf16 or fp16"));
  cfg.dtype = fr::Dtype::bf16;
  cfg.seq = 0;
  CHECK_THROWS_WITH(fc::fast_attention_forward(cfg, mma, x, x, x), Catch::Contains("seq (N) = 0 must be at least 1"));
}

TEST_CASE("bf16 and fp16 conversions round to nearest even", "[fast][errors]") {
  CHECK(fc::float_to_bf16(1.0f) == 0x3F80);
  CHECK(fc::bf16_to_float(0x3F80) == 1.0f);
  CHECK(fc::float_to_bf16(1.0f + 1.0f / 256) == 0x3F80);  // halfway below: ties to even
  CHECK(fc::float_to_fp16(1.0f) == 0x3C00);
  CHECK(fc::fp16_to_float(0xC000) == -2.0f);
}
