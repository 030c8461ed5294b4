// One check of the fast backward against the float64 reference, shared by the backward tests that
// take windows, grouped K/V and N_k ≠ N (test_cuda_fast_bwd_window.cpp, test_cuda_fast_bwd_gqa.cpp,
// test_cuda_fast_bwd_det.cpp; the packed one, test_cuda_fast_bwd_varlen.cpp, checks each gradient
// with check_gradient()). With `bitwise` (a deterministic backward) each run is repeated and its
// dQ, dK, dV must equal the first run's bit for bit.
//
// Fresh normal Q, dO [B, N, H, d] and K, V [B, N_k, H_kv, d] rounded to the dtype, the reference
// (ref::naive_backward<double>) gets the rounded values; O and LSE from the fast mma forward of the
// same problem. Metric: max|got − ref| / max|ref| per gradient (NaN → +inf, fails); the bound is the
// project's backward bound, max(1e-2, 2 × the rounding floor of the float64 gradient), and each case
// prints its error as a multiple of that floor; D within 1e-2. Rows that see no key by the mask's
// rule (ref::AttentionProblem::visible_keys: causal with N > N_k, a band past every key) must get
// dQ exactly 0, and keys no query sees dK = dV exactly 0 (no NaN from their LSE = −inf); they are
// found from the rule, not from the reference's zeros (a row that sees one key has dQ = 0 by
// cancellation, up to rounding). The host wrapper poisons every output with NaN first.
#pragma once

#include <catch2/catch.hpp>

#include "flashlab/cuda/fast_attention.hpp"
#include "flashlab/reference/attention.hpp"
#include "gpu_test_util.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace flashlab::test {

/// One shape of a backward check (heads_kv = heads and seq_k = seq: plain multi-head; a window side
/// −1: unbounded).
struct BackwardCase {
  int batch, seq, seq_k, heads, heads_kv, head_dim;
  bool causal;
  long long window_left = -1, window_right = -1;
  ref::Dtype dtype = ref::Dtype::bf16;
  /// V and dO entries ±800 (their signs kept): dP_ij and D_i near 1e8, dQ and dK near 1e5.
  bool large = false;
};

/// The worst gradient error / rounding floor seen since the last report_backward_ratio().
inline double& backward_worst_ratio() {
  static double worst = 0.0;
  return worst;
}

/// The kernels of the atomic design that take windows, grouped K/V and N_k ≠ N: mma_sync
/// everywhere, wgmma-ws where built and the device runs it.
inline const std::vector<cuda::FastBackwardKernel>& general_backward_kernels() {
  static const std::vector<cuda::FastBackwardKernel> kernels = [] {
    std::vector<cuda::FastBackwardKernel> k = {cuda::FastBackwardKernel::mma_sync};
    if (cuda::fastest_backward_kernel() == cuda::FastBackwardKernel::wgmma_ws)
      k.push_back(cuda::FastBackwardKernel::wgmma_ws);
    else
      WARN("wgmma-ws backward not in this build or not on this device: mma_sync only");
    return k;
  }();
  return kernels;
}

/// Elements of a 16-bit [B, rows, heads, d] gradient that are not exactly 0 in the rows for which
/// `outside(r)` holds; the first one's index in `first`.
template <class Outside>
std::size_t nonzero_rows(const std::vector<std::uint16_t>& got, int batch, int rows, std::size_t row_elems,
                         ref::Dtype dt, Outside outside, std::size_t& first) {
  std::size_t bad = 0;
  for (int b = 0; b < batch; ++b)
    for (int r = 0; r < rows; ++r) {
      if (!outside(r)) continue;
      const std::size_t base = (std::size_t(b) * rows + r) * row_elems;
      for (std::size_t k = base; k < base + row_elems; ++k)
        if (!(to_float(got[k], dt) == 0.0f) && bad++ == 0) first = k;
    }
  return bad;
}

/// One gradient against its float64 reference: prints its error and the error over the rounding
/// floor, keeps the worst of those, checks the bound max(1e-2, 2 × the floor) and that the rows
/// `outside` marks (indexed by row within a batch entry of `rows` rows of `row_elems` elements) are
/// exactly 0.
inline void check_gradient(const char* name, const std::vector<std::uint16_t>& got, const ref::Tensor<double>& want,
                           ref::Dtype dt, int batch, int rows, std::size_t row_elems, const std::vector<char>& outside) {
  REQUIRE(got.size() == want.numel());
  const double err = error_16(got, want.data(), dt);
  const double floor = rounding_floor(want.data(), want.numel(), dt);
  const double ratio = floor > 0 ? err / floor : (err > 0 ? 1e30 : 0.0);
  std::printf("  %s %.3e (x%.2f)", name, err, ratio);
  if (!(ratio <= backward_worst_ratio())) backward_worst_ratio() = ratio;  // NaN propagates as worst
  INFO(name << " error " << err << ", rounding floor " << floor);
  CHECK(err <= std::max(1e-2, 2 * floor));
  std::size_t first = 0;
  const std::size_t bad =
      nonzero_rows(got, batch, rows, row_elems, dt, [&](int r) { return outside[std::size_t(r)] != 0; }, first);
  INFO(name << ": " << bad << " elements not 0 in rows outside every band (first at " << first << ")");
  CHECK(bad == 0);
}

/// Elements of two 16-bit gradients whose bits differ.
inline std::size_t differing_bits(const std::vector<std::uint16_t>& a, const std::vector<std::uint16_t>& b) {
  std::size_t n = a.size() == b.size() ? 0 : std::max(a.size(), b.size());
  for (std::size_t k = 0; k < std::min(a.size(), b.size()); ++k) n += a[k] != b[k];
  return n;
}

/// A backward too large for the float64 reference: `fixed` (a fixed summation order) run four
/// times must give the same bits, and agree with `other` (the same sums in another order) within
/// the backward tolerance 1e-2. Prints `label` with the count of differing elements and the errors.
template <class Run, class Other>
void check_reruns_and_against(const std::string& label, ref::Dtype dt, Run fixed, Other other) {
  const cuda::FastBackwardResult first = fixed();
  std::size_t diff = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const cuda::FastBackwardResult again = fixed();
    diff += differing_bits(first.dQ, again.dQ) + differing_bits(first.dK, again.dK) +
            differing_bits(first.dV, again.dV);
  }
  const cuda::FastBackwardResult theirs = other();
  auto to_double = [&](const std::vector<std::uint16_t>& x) {
    std::vector<double> y(x.size());
    for (std::size_t k = 0; k < x.size(); ++k) y[k] = to_float(x[k], dt);
    return y;
  };
  const double eQ = error_16(first.dQ, to_double(theirs.dQ).data(), dt);
  const double eK = error_16(first.dK, to_double(theirs.dK).data(), dt);
  const double eV = error_16(first.dV, to_double(theirs.dV).data(), dt);
  std::printf("  %s: elements differing over 3 reruns: %zu; against the other order dQ %.2e dK %.2e dV %.2e\n",
              label.c_str(), diff, eQ, eK, eV);
  CHECK(diff == 0);
  CHECK(eQ <= 1e-2);
  CHECK(eK <= 1e-2);
  CHECK(eV <= 1e-2);
}

/// Runs each of `kernels` of `design` (bwd_two_kernel: mma_sync alone) on fresh inputs of shape `c`
/// against one float64 reference and checks dQ, dK, dV and D (file comment); `bitwise`: runs each
/// a second time and checks that dQ, dK, dV are the same bits.
inline void check_backward(const BackwardCase& c,
                           const std::vector<cuda::FastBackwardKernel>& kernels = general_backward_kernels(),
                           ref::Algorithm design = ref::Algorithm::bwd_atomic, bool bitwise = false) {
  namespace fc = flashlab::cuda;
  namespace fr = flashlab::ref;
  const unsigned long long seed = fresh_seed();
  const bool window = c.window_left >= 0 || c.window_right >= 0;
  const std::string label = std::string(c.dtype == fr::Dtype::bf16 ? "bf16" : "fp16") +
                            " B=" + std::to_string(c.batch) + " N=" + std::to_string(c.seq) +
                            " N_k=" + std::to_string(c.seq_k) + " H=" + std::to_string(c.heads) +
                            " H_kv=" + std::to_string(c.heads_kv) + " d=" + std::to_string(c.head_dim) +
                            (c.causal ? " causal" : "") +
                            (window ? " window=" + std::to_string(c.window_left) + "," + std::to_string(c.window_right)
                                    : std::string()) +
                            (c.large ? " ±800" : "");
  INFO(label << " seed=" << seed << " (rerun with FLASHLAB_TEST_SEED)");
  const fr::Shape q{std::size_t(c.batch), std::size_t(c.seq), std::size_t(c.heads), std::size_t(c.head_dim)};
  const fr::Shape kv{std::size_t(c.batch), std::size_t(c.seq_k), std::size_t(c.heads_kv), std::size_t(c.head_dim)};
  BwdInputs in = bwd_inputs(q, kv, seed, c.dtype);
  if (c.large) {
    const std::pair<ref::Tensor<double>*, std::vector<std::uint16_t>*> big[] = {{&in.Vd, &in.V}, {&in.dOd, &in.dO}};
    for (const auto& [d, bits] : big) {
      ref::Tensor<double> x(d->shape());
      for (std::size_t k = 0; k < x.numel(); ++k) x.data()[k] = d->data()[k] < 0 ? -800.0 : 800.0;
      *bits = round_to_16(x, c.dtype, *d);
    }
  }
  fr::AttentionProblem cfg = attention_problem(q, c.causal, c.dtype);
  cfg.seq_k = c.seq_k == c.seq ? 0 : std::size_t(c.seq_k);
  cfg.heads_kv = c.heads_kv == c.heads ? 0 : std::size_t(c.heads_kv);
  cfg.window_left = c.window_left;
  cfg.window_right = c.window_right;
  const auto ref = fr::naive_backward<double>(cfg, in.Qd, in.Kd, in.Vd, in.dOd);
  const auto fwd = fc::fast_attention_forward(cfg, fc::FastForwardKernel::mma_sync, in.Q, in.K, in.V);
  // The rows without a key and the keys without a query, by the mask's rule (the same for every
  // sequence of a dense batch).
  std::vector<char> row_keyless(std::size_t(c.seq)), key_unseen(std::size_t(c.seq_k), 1);
  for (int i = 0; i < c.seq; ++i) {
    const fr::KeyRange r = cfg.visible_keys(cfg.sequence(0), i);
    row_keyless[std::size_t(i)] = r.empty();
    for (long long j = r.first; j < r.end; ++j) key_unseen[std::size_t(j)] = 0;
  }
  const bool two_kernel = design == fr::Algorithm::bwd_two_kernel;
  for (const fc::FastBackwardKernel kernel : kernels) {
    INFO("design " << fr::algorithm_name(design) << ", kernel " << fc::to_string(kernel));
    const auto got = fc::fast_attention_backward(design, cfg, in.Q, in.K, in.V, fwd.O, in.dO, fwd.LSE, kernel);
    std::printf("  %-62s %-8s", label.c_str(), two_kernel ? "two-kern" : fc::to_string(kernel));
    const std::size_t q_row = std::size_t(c.heads) * c.head_dim, kv_row = std::size_t(c.heads_kv) * c.head_dim;
    check_gradient("dQ", got.dQ, ref.dQ, c.dtype, c.batch, c.seq, q_row, row_keyless);
    check_gradient("dK", got.dK, ref.dK, c.dtype, c.batch, c.seq_k, kv_row, key_unseen);
    check_gradient("dV", got.dV, ref.dV, c.dtype, c.batch, c.seq_k, kv_row, key_unseen);
    const double eD = fr::max_error_vs_max(got.D.data(), ref.D_from_O.data(), got.D.size());
    std::printf("  D %.2e", eD);
    CHECK(eD <= 1e-2);
    if (bitwise) {  // the outputs are poisoned with NaN again before the rerun
      const auto again = fc::fast_attention_backward(design, cfg, in.Q, in.K, in.V, fwd.O, in.dO, fwd.LSE, kernel);
      const std::size_t diff =
          differing_bits(got.dQ, again.dQ) + differing_bits(got.dK, again.dK) + differing_bits(got.dV, again.dV);
      std::printf("  rerun: %zu bits differ", diff);
      INFO("dQ, dK, dV elements differing between two runs: " << diff);
      CHECK(diff == 0);
    }
    std::printf("\n");
  }
}

/// check_backward() on every design that takes windows, grouped K/V and N_k ≠ N: the atomic design's
/// kernels (general_backward_kernels()), then the two-kernel design, run twice and compared bit for
/// bit (it has no atomics: its gradients must be reproducible).
inline void check_backward_every_design(const BackwardCase& c) {
  check_backward(c);
  check_backward(c, {cuda::FastBackwardKernel::mma_sync}, ref::Algorithm::bwd_two_kernel, true);
}

/// Prints the worst gradient error / rounding floor of the checks since the last report, and resets it.
inline void report_backward_ratio(const char* name) {
  std::printf("[%s] worst gradient error %.2f x its rounding floor\n", name, backward_worst_ratio());
  backward_worst_ratio() = 0.0;
}

}  // namespace flashlab::test
