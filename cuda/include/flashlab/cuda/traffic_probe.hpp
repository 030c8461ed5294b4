/// @file traffic_probe.hpp
/// @brief Measures the memory traffic of the attention kernels on the GPU, kernel by kernel.
///
/// For one algorithm and problem: fills Q, K, V (and dO) with seeded random values on the device,
/// prepares what the algorithm needs (a backward first runs the fa2 forward, unmeasured, for O
/// and LSE), then launches the algorithm's clear kernels inside one RangeProfiler session, writing
/// and then reading a flush buffer (≫ the 50 MB L2) before each measured kernel so that every
/// kernel starts with an L2 holding nothing of its operands. The flush kernels are ranges of
/// their own and are not reported.
#pragma once

#include "flashlab/cuda/options.hpp"
#include "flashlab/cuda/profiler.hpp"
#include "flashlab/reference/attention_problem.hpp"

#include <cstddef>
#include <string>
#include <vector>

namespace flashlab::cuda {

/// The problem and measurement settings (the result, ProbeResult, is the one type of every
/// family's probe: profiler.hpp).
struct ProbeConfig {
  ref::AttentionProblem problem;                     ///< shape, tiles, causal, scale (fp32: the clear kernels)
  int fa1_query_split = 0;                           ///< fa1_fwd only: blocks per head (0: fill the GPU)
  unsigned long long seed = 1;                       ///< seed of the random inputs
  std::size_t flush_bytes = std::size_t(256) << 20;  ///< size of the L2 flush buffer (≫ 50 MB)
};

/// Runs and measures one algorithm (naive_fwd, fa1_fwd, fa2_fwd, bwd_two_kernel or bwd_atomic;
/// the problem passes check_clear_problem()); throws CudaError / std::invalid_argument with a
/// message.
ProbeResult measure_attention(ref::Algorithm algorithm, const ProbeConfig& cfg);

/// The FA1 query split the kernels would use for these settings (resolves 0 = fill the GPU).
int fa1_query_split_for(const ProbeConfig& cfg);

/// Runs and measures the fast forward the front door chooses for `problem` on this device
/// (fast_attention_forward_device() with fastest_forward_kernel(problem): grouped K/V, N_k ≠ N,
/// and the split-key kernel for short query counts), on seeded random 16-bit inputs of `problem.dtype` made on the
/// device, one launch sequence after an L2 flush of `flush_bytes`. Returns every kernel it
/// launched (a split-key decode has two). Throws std::invalid_argument for a problem the fast
/// forward refuses (check_fast_problem()), CudaError on a CUDA or CUPTI failure.
ProbeResult measure_fast_forward(const ref::AttentionProblem& problem, unsigned long long seed = 1,
                                 std::size_t flush_bytes = std::size_t(256) << 20);

}  // namespace flashlab::cuda
