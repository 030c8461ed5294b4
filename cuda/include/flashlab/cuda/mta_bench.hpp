/// @file mta_bench.hpp
/// @brief Timing of the Multi-Token Attention kernels: the one implementation behind
/// `flashlab bench mta`. No CUDA types here, so CPU-only code may include this header.
///
/// Method, per shape, as bench.hpp states it for attention: `warmup` untimed launches, then
/// `reps` launches each timed alone with a pair of CUDA events on the default stream; before
/// every launch (warm-up and timed) L2 is flushed by a `flush_bytes` memset and a read of it
/// outside the timed range (L2 left clean), and the inputs rotate over `input_sets` independent sets (launch r uses set r mod
/// `input_sets`), so no launch finds its inputs in L2. A launch is one *pass* (MtaBenchPass) of
/// one *kernel family* (MtaBenchKernel): every kernel the pass needs, inside the timed range
/// (the clear forward: O = 0 fill, then the forward kernel; the fast forward: its one kernel).
/// Scratch a pass needs is allocated once per shape, outside the timing. Reported: median,
/// minimum and maximum time and the TFLOP/s of the median (mta_forward_flops() for the forward,
/// mta_backward_flops() for the backward, their sum for fwd+bwd); the decode reports the rate at
/// which it reads K and V beside the rate of a device-to-device copy of the same bytes.
///
/// MTA is causal by definition (the reference's semantics), so every shape is causal.
#pragma once

#include "flashlab/cuda/bench_row.hpp"
#include "flashlab/cuda/mta_fast.hpp"
#include "flashlab/reference/traffic.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace flashlab::cuda::mta {

// MtaBenchKernel and MtaBenchPass: bench_row.hpp (the row's MTA extras name them).

/// The name of a pass on the command line and in CSV rows ("fwd", "bwd", "fwd+bwd", "decode").
const char* to_string(MtaBenchPass pass);
/// The name of a kernel family ("clear", "fast").
const char* to_string(MtaBenchKernel kernel);

/// A sweep: every (head dim, N) combination of the lists (head dim outer, N inner) for one
/// kernel size cq × ck, one pass and one kernel family.
struct MtaBenchConfig {
  std::vector<int> seqs = {4096};         ///< N values (each ≥ 1)
  std::vector<int> head_dims = {64};      ///< d values
  int cq = 3;                             ///< kernel rows (query direction), ≥ 1
  int ck = 3;                             ///< kernel columns (key direction), odd
  int heads = 16;                         ///< H
  int batch = 1;                          ///< B
  MtaBenchKernel kernel = MtaBenchKernel::fast;  ///< kernel family timed
  MtaBenchPass pass = MtaBenchPass::fwd;         ///< pass timed
  ref::Dtype dtype = ref::Dtype::bf16;    ///< storage type of Q, K, V, O for the fast kernels (bf16 or fp16; clear: fp32)
  int block = 64;                         ///< B, the clear kernels' loaded tile (the fast kernels' tiles are fixed)
  int splits = 16;                        ///< N_splits of the decode pass
  int linear_path = -1;                   ///< the fast forward's FastShape::linear_path (−1: its policy)
  /// the fast forward's order (FastOOrder::source: O_i, m_i, ℓ_i through HBM between key tiles,
  /// for measuring what the on-chip order saves; bf16, d = 64, pass fwd only)
  FastOOrder o_order = FastOOrder::on_chip;
  /// after the timing, one more launch per shape (input set 0, L2 flushed before each counter's
  /// pass) under the CUPTI Range Profiler: MtaBenchRow's byte counters (pass fwd of the fast kernels)
  bool traffic = false;
  int reps = 30;                          ///< timed launches per shape (≥ 1)
  int warmup = 3;                         ///< untimed launches per shape (≥ 0)
  int input_sets = 3;                     ///< input sets rotated over (≥ 1)
  std::size_t flush_bytes = std::size_t(256) << 20;  ///< L2 flush buffer (256 MiB; H100 L2 is 50 MiB)
  std::uint32_t seed = 1234;              ///< seed of the N(0, 1) inputs and of W (N(0, 0.5²))
};

/// One timed shape of a sweep: the one row type of every family (bench_row.hpp), its MTA extras
/// filled (kernel, pass, cq, ck, the decode's rates, the O order); `traffic` and `counters` when
/// MtaBenchConfig::traffic.
using MtaBenchRow = BenchRow;

/// The name of an O order on the command line and in CSV rows ("on-chip", "source").
const char* to_string(FastOOrder order);

/// FLOPs of the attention products of one causal forward, 2·N²·d·H·B (QKᵀ and PV at 2 FLOPs
/// per multiply-add, halved for causality), plus the convolution's cq·ck multiply-adds per
/// visible score, N²/2·H·B·2·cq·ck. Halo recomputation and softmax are not counted, so the
/// figure is work done per second of useful work, comparable across kernels of the same shape.
double mta_forward_flops(int seq, int head_dim, int heads, int batch, int cq, int ck);

/// FLOPs of the products of one causal backward, 5·N²·d·H·B (S recomputed, dP, dV, dK, dQ at
/// 2 FLOPs per multiply-add, halved for causality), plus three convolution-sized passes per
/// visible score (Ŝ recomputed, its transpose, dW), 3·N²·H·B·cq·ck. Halo recomputation not counted.
double mta_backward_flops(int seq, int head_dim, int heads, int batch, int cq, int ck);

/// Times the kernels of `bench` on every shape on device 0 and returns the rows in sweep order;
/// `on_row`, if given, is called with each row as soon as it is measured. Device memory is
/// allocated per shape and freed before the next. Throws std::invalid_argument for an empty list,
/// a bad count, a kernel size or head dim the kernel family refuses or a pass it does not have
/// (before any timing), and CudaError when no device is usable or a CUDA call fails.
std::vector<MtaBenchRow> bench_mta(const MtaBenchConfig& bench,
                                   const std::function<void(const MtaBenchRow&)>& on_row = {});

}  // namespace flashlab::cuda::mta
