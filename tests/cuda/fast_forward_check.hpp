// One check of a fast forward against the float64 reference, shared by the forward tests that
// take grouped K/V, N_k ≠ N, windows and packed sequences (test_cuda_fast_gqa.cpp,
// test_cuda_fast_splitkv.cpp, test_cuda_fast_window.cpp, test_cuda_fast_varlen.cpp).
//
// Fresh normal random Q [B, N, H, d], K and V [B, N_k, H_kv, d] (packed: [1, total, ·, d]), rounded to the dtype first (the
// reference gets the rounded values); O within 1e-2 and within 2× the rounding floor (the float64
// O merely rounded to the dtype; where that is exceeded, the larger floor of rounding P_ij for P·V
// too, rounded_p_floor: rows with few keys), LSE within 1e-4 (ref::max_error_vs_max; NaN fails, −inf agrees
// only with −inf). Rows that see no key (causal, N > N_k; a window past every key) must be O = 0
// exactly and LSE = −inf, as the reference says, and as many as the mask's rule (visible_keys)
// counts. The host wrapper poisons O and LSE with NaN first, so a row nobody writes fails.
#pragma once

#include <catch2/catch.hpp>

#include "flashlab/cuda/fast_attention.hpp"
#include "gpu_test_util.hpp"
#include "flashlab/reference/attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace flashlab::test {

/// One shape of a forward check (heads_kv = heads and seq_k = seq: plain multi-head; a window side
/// −1: unbounded).
struct ForwardCase {
  int batch, seq, seq_k, heads, heads_kv, head_dim;
  bool causal;
  ref::Dtype dtype = ref::Dtype::bf16;
  long long window_left = -1, window_right = -1;
};

/// The worst O error / rounding floor seen since the last report_worst_ratio().
inline double& worst_ratio() {
  static double worst = 0.0;
  return worst;
}

/// The problem of `c` (seq_k and heads_kv left 0 where they equal seq and heads).
inline ref::AttentionProblem forward_problem(const ForwardCase& c) {
  ref::AttentionProblem cfg;
  cfg.batch = std::size_t(c.batch);
  cfg.seq = std::size_t(c.seq);
  cfg.seq_k = c.seq_k == c.seq ? 0 : std::size_t(c.seq_k);
  cfg.heads = std::size_t(c.heads);
  cfg.heads_kv = c.heads_kv == c.heads ? 0 : std::size_t(c.heads_kv);
  cfg.head_dim = std::size_t(c.head_dim);
  cfg.causal = c.causal;
  cfg.dtype = c.dtype;
  cfg.window_left = c.window_left;
  cfg.window_right = c.window_right;
  return cfg;
}

/// Runs each fast forward of `kernels` on fresh inputs of problem `cfg` (dense or packed; `shape`
/// describes it in messages) against one float64 reference and checks O and LSE (file comment).
inline void check_forward_problem(const ref::AttentionProblem& cfg, const std::string& shape,
                                  const std::vector<cuda::FastForwardKernel>& kernels) {
  namespace fc = flashlab::cuda;
  namespace fr = flashlab::ref;
  constexpr double kTolO = 1e-2;
  constexpr double kTolLSE = 1e-4;
  const unsigned long long seed = fresh_seed();
  const fr::Dtype dt = cfg.dtype;
  INFO(shape << " seed=" << seed << " (rerun with FLASHLAB_TEST_SEED)");
  const fr::Shape qs = cfg.q_shape(), kvs = cfg.kv_shape();
  fr::Tensor<double> q0(qs), k0(kvs), v0(kvs), Qd(qs), Kd(kvs), Vd(kvs);
  fr::fill_normal(q0, seed);
  fr::fill_normal(k0, seed + 1);
  fr::fill_normal(v0, seed + 2);
  const auto Qb = round_to_16(q0, dt, Qd), Kb = round_to_16(k0, dt, Kd), Vb = round_to_16(v0, dt, Vd);
  const auto ref = fr::naive_forward<double>(cfg, Qd, Kd, Vd);
  const double e_floor = rounding_floor(ref.O.data(), ref.O.numel(), dt);
  // The rows without a key by the mask's rule alone, per head (each sequence its own lengths).
  std::size_t keyless = 0;
  for (std::size_t b = 0; b < cfg.batch; ++b) {
    const fr::SequenceSpan sp = cfg.sequence(b);
    for (std::size_t i = 0; i < sp.q_len; ++i) keyless += cfg.visible_keys(sp, (long long)i).empty();
  }

  for (const fc::FastForwardKernel kernel : kernels) {
    const std::string label = std::string(fc::to_string(kernel)) + " " + shape;
    INFO(label);
    const auto got = fc::fast_attention_forward(cfg, kernel, Qb, Kb, Vb);
    REQUIRE(got.O.size() == ref.O.numel());
    REQUIRE(got.LSE.size() == ref.LSE.size());
    const double eO = error_16(got.O, ref.O.data(), dt);
    const double eL = fr::max_error_vs_max(got.LSE.data(), ref.LSE.data(), got.LSE.size());
    // Rows without a key: the reference's LSE is −inf there; the kernel's O row must be zero exactly.
    std::size_t empty_rows = 0, empty_wrong = 0;
    const std::size_t d = cfg.head_dim, rows = qs.seq;  // rows: of one batch entry of Q (packed: total_q)
    for (std::size_t b = 0; b < cfg.batch; ++b) {
      const fr::SequenceSpan sp = cfg.sequence(b);
      for (std::size_t h = 0; h < cfg.heads; ++h)
        for (std::size_t i = 0; i < sp.q_len; ++i) {
          const std::size_t stat = cfg.stat_offset(b, h) + i;
          if (!std::isinf(ref.LSE[stat])) continue;
          ++empty_rows;
          bool ok = std::isinf(got.LSE[stat]) && got.LSE[stat] < 0;
          const std::size_t o = ((sp.batch_index * rows + sp.q_start + i) * cfg.heads + h) * d;
          for (std::size_t e = 0; e < d; ++e) ok = ok && to_float(got.O[o + e], dt) == 0.0f;
          empty_wrong += !ok;
        }
    }
    std::printf("  %-74s O error %.3e (rounding floor %.3e, %.2fx)  LSE error %.3e  rows without keys %zu\n",
                label.c_str(), eO, e_floor, e_floor > 0 ? eO / e_floor : 0.0, eL, empty_rows);
    if (e_floor > 0 && !(eO / e_floor <= worst_ratio())) worst_ratio() = eO / e_floor;
    INFO("O error " << eO << " (floor " << e_floor << "), LSE error " << eL << ", rows without keys " << empty_rows
                    << " of which wrong " << empty_wrong);
    // Beyond twice the rounding floor: compared with the floor of rounding P too (rows with few keys).
    const double e_floor_p = eO <= 2.0 * e_floor + 1e-7 ? 0.0 : rounded_p_floor(cfg, kernel, Qd, Kd, Vd, ref.O.data());
    if (e_floor_p > 0.0)
      std::printf("  %-74s O error %.3e: the floor with P rounded too %.3e (%.2fx)\n", label.c_str(), eO, e_floor_p,
                  eO / e_floor_p);
    INFO("floor with P rounded too " << e_floor_p);
    CHECK(eO <= kTolO);
    CHECK(eO <= 2.0 * std::max(e_floor, e_floor_p) + 1e-7);
    CHECK(eL <= kTolLSE);
    CHECK(empty_wrong == 0);
    CHECK(empty_rows == cfg.heads * keyless);
  }
}

/// Runs each fast forward of `kernels` on fresh inputs of shape `c` against one float64 reference
/// and checks O and LSE (file comment).
inline void check_forward(const ForwardCase& c, const std::vector<cuda::FastForwardKernel>& kernels) {
  const bool bf16 = c.dtype == ref::Dtype::bf16;
  const bool window = c.window_left >= 0 || c.window_right >= 0;
  const std::string shape = std::string(bf16 ? "bf16" : "fp16") + " B=" + std::to_string(c.batch) +
                            " N=" + std::to_string(c.seq) + " N_k=" + std::to_string(c.seq_k) +
                            " H=" + std::to_string(c.heads) + " H_kv=" + std::to_string(c.heads_kv) +
                            " d=" + std::to_string(c.head_dim) + (c.causal ? " causal" : "") +
                            (window ? " window=" + std::to_string(c.window_left) + "," + std::to_string(c.window_right)
                                    : "");
  const ref::AttentionProblem cfg = forward_problem(c);
  // The rows without a key, by the mask's rule: causal alone, N > N_k leaves N − N_k per sequence.
  if (c.causal && !window && c.seq > c.seq_k) {
    std::size_t keyless = 0;
    for (std::size_t i = 0; i < cfg.seq; ++i) keyless += cfg.visible_keys(cfg.sequence(0), (long long)i).empty();
    CHECK(keyless == std::size_t(c.seq - c.seq_k));
  }
  check_forward_problem(cfg, shape, kernels);
}

/// check_forward on one kernel.
inline void check_forward(const ForwardCase& c, cuda::FastForwardKernel kernel) {
  check_forward(c, std::vector<cuda::FastForwardKernel>{kernel});
}

/// Prints the worst O error / rounding floor of the checks since the last report, and resets it.
inline void report_worst_ratio(const char* name) {
  std::printf("[%s] worst O error / rounding floor %.2f (bound 2)\n", name, worst_ratio());
  worst_ratio() = 0.0;
}

}  // namespace flashlab::test
