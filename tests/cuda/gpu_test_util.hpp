// Helpers shared by the GPU tests: fresh seeds (replayable) and 16-bit rounding of inputs.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <random>
#include <vector>

#include "flashlab/cuda/dtype16.hpp"
#include "flashlab/cuda/fast_attention.hpp"
#include "flashlab/reference/attention.hpp"
#include "flashlab/reference/tensor.hpp"

namespace flashlab::test {

/// A fresh random seed per check, or FLASHLAB_TEST_SEED to replay a failure.
inline unsigned long long fresh_seed() {
  if (const char* s = std::getenv("FLASHLAB_TEST_SEED")) return std::strtoull(s, nullptr, 10);
  static std::random_device rd;
  return (static_cast<unsigned long long>(rd()) << 32) ^ rd();
}

/// One 16-bit value (bf16 or fp16 bit pattern) as float (exact).
inline float to_float(std::uint16_t bits, ref::Dtype dt) { return cuda::from_bits16(bits, dt); }

/// One float rounded to the 16-bit dtype (nearest even) and back.
inline float round_float_to_16(float f, ref::Dtype dt) { return cuda::round_to(f, dt); }

/// Rounds a float64 tensor to the 16-bit dtype: bit patterns for the GPU, and the rounded values
/// (exact in float64) in `rounded` for the reference, so the measured error is the kernel's own.
inline std::vector<std::uint16_t> round_to_16(const ref::Tensor<double>& x, ref::Dtype dt,
                                              ref::Tensor<double>& rounded) {
  std::vector<std::uint16_t> bits(x.numel());
  for (std::size_t k = 0; k < x.numel(); ++k) {
    const float f = static_cast<float>(x.data()[k]);
    bits[k] = cuda::to_bits16(f, dt);
    rounded.data()[k] = to_float(bits[k], dt);
  }
  return bits;
}

/// Fresh normal Q, dO of the [B, N, H, d] shape `q` and K, V of the [B, N_k, H_kv, d] shape `kv`
/// (seeds seed … seed + 3: Q, K, V, dO) rounded to the 16-bit dtype: the bit patterns for the GPU,
/// and exactly those values in float64 for the reference.
struct BwdInputs {
  ref::Tensor<double> Qd, Kd, Vd, dOd;
  std::vector<std::uint16_t> Q, K, V, dO;
};
inline BwdInputs bwd_inputs(const ref::Shape& q, const ref::Shape& kv, unsigned long long seed, ref::Dtype dt) {
  BwdInputs in{ref::Tensor<double>(q), ref::Tensor<double>(kv), ref::Tensor<double>(kv),
               ref::Tensor<double>(q), {}, {}, {}, {}};
  ref::Tensor<double>* rounded[] = {&in.Qd, &in.Kd, &in.Vd, &in.dOd};
  std::vector<std::uint16_t>* bits[] = {&in.Q, &in.K, &in.V, &in.dO};
  for (int t = 0; t < 4; ++t) {
    ref::Tensor<double> x(rounded[t]->shape());
    ref::fill_normal(x, seed + t);
    *bits[t] = round_to_16(x, dt, *rounded[t]);
  }
  return in;
}
/// bwd_inputs() of one shape for all four (H_kv = H, N_k = N).
inline BwdInputs bwd_inputs(const ref::Shape& shape, unsigned long long seed, ref::Dtype dt) {
  return bwd_inputs(shape, shape, seed, dt);
}

/// The attention problem of a [B, N, H, d] shape (tiles left at their defaults: the fast kernels
/// choose their own).
inline ref::AttentionProblem attention_problem(const ref::Shape& shape, bool causal, ref::Dtype dt) {
  ref::AttentionProblem cfg;
  cfg.batch = shape.batch;
  cfg.seq = shape.seq;
  cfg.heads = shape.heads;
  cfg.head_dim = shape.head_dim;
  cfg.causal = causal;
  cfg.dtype = dt;
  return cfg;
}

/// Error of a 16-bit result (bit patterns) against the float64 reference: max|got − ref| / max|ref|
/// (ref::max_error_vs_max; NaN → +inf).
inline double error_16(const std::vector<std::uint16_t>& got, const double* ref, ref::Dtype dt) {
  std::vector<float> g(got.size());
  for (std::size_t k = 0; k < got.size(); ++k) g[k] = to_float(got[k], dt);
  return ref::max_error_vs_max(g.data(), ref, g.size());
}

/// The floor of any 16-bit output: the error of the float64 reference merely rounded to the dtype.
inline double rounding_floor(const double* ref, std::size_t n, ref::Dtype dt) {
  std::vector<float> r(n);
  for (std::size_t k = 0; k < n; ++k) r[k] = round_float_to_16(static_cast<float>(ref[k]), dt);
  return ref::max_error_vs_max(r.data(), ref, n);
}

/// The floor of a fast forward `kernel`, which rounds P_ij to the dtype for P·V (l_i from the
/// unrounded P_ij) before it rounds O: the FA2 reference on the kernel's tiles with P rounded
/// (ref::ForwardOptions::round_p), its O rounded to the dtype, against the float64 O `ref_O`. Above
/// rounding_floor() where a row has few keys: one P_ij rounded up or down moves the row's O by a
/// fraction of that key's V_j no later key averages out.
inline double rounded_p_floor(ref::AttentionProblem cfg, cuda::FastForwardKernel kernel, const ref::Tensor<double>& Q,
                              const ref::Tensor<double>& K, const ref::Tensor<double>& V, const double* ref_O) {
  const cuda::FastTiles tiles = cuda::fast_forward_tiles(cfg, kernel);
  cfg.Br = std::size_t(tiles.Br);
  cfg.Bc = std::size_t(tiles.Bc);
  ref::ForwardOptions opt;
  opt.round_p = cfg.dtype == ref::Dtype::bf16
                    ? +[](double p) { return double(cuda::round_to(float(p), ref::Dtype::bf16)); }
                    : +[](double p) { return double(cuda::round_to(float(p), ref::Dtype::fp16)); };
  const auto out = ref::flash_forward_fa2(cfg, Q, K, V, opt);
  std::vector<float> r(out.O.numel());
  for (std::size_t k = 0; k < r.size(); ++k) r[k] = round_float_to_16(static_cast<float>(out.O.data()[k]), cfg.dtype);
  return ref::max_error_vs_max(r.data(), ref_O, r.size());
}

}  // namespace flashlab::test
