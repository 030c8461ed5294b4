/// @file traffic_probe.hpp
/// @brief Measures the memory traffic of the attention kernels on the GPU, kernel by kernel.
///
/// For one variant and shape: fills Q, K, V (and dO) with seeded random values on the device,
/// prepares what the variant needs (a backward variant first runs the fa2 forward, unmeasured,
/// for O and LSE), then launches the variant's kernels inside one RangeProfiler session, writing
/// and then reading a flush buffer (≫ the 50 MB L2) before each measured kernel so that every
/// kernel starts with an L2 holding nothing of its operands. The flush kernels are ranges of
/// their own and are not reported.
#pragma once

#include "flashlab/cuda/options.hpp"
#include "flashlab/cuda/profiler.hpp"

#include <cstddef>
#include <string>
#include <vector>

namespace flashlab::cuda {

/// The algorithms the probe can measure (forward and backward variants).
enum class ProbeVariant {
  naive,           ///< naive forward: naive_scores, naive_softmax, naive_pv
  fa1,             ///< FA1 loop-order forward: fa1_fwd_kernel
  fa2,             ///< FA2 loop-order forward: flash_fwd_kernel
  bwd_two_kernel,  ///< bwd_preprocess, bwd_dq, bwd_dkdv
  bwd_atomic       ///< bwd_preprocess, zero_fill, bwd_atomic
};

/// Shape, tiles and measurement settings.
struct ProbeConfig {
  int batch = 1;                                  ///< B
  int seq = 4096;                                 ///< N
  int heads = 16;                                 ///< H
  int head_dim = 64;                              ///< d
  Options options;                                ///< tiles, causal, scale, FA1 split
  unsigned long long seed = 1;                    ///< seed of the random inputs
  std::size_t flush_bytes = std::size_t(256) << 20;  ///< size of the L2 flush buffer (≫ 50 MB)
};

/// One measured kernel of a variant.
struct MeasuredKernel {
  std::string kernel;       ///< our kernel name, e.g. "flash_fwd_kernel"
  KernelCounters counters;  ///< what CUPTI measured for it
};

/// All kernels of one measured variant, in launch order.
struct ProbeResult {
  std::vector<MeasuredKernel> kernels;    ///< the variant's kernels (flush kernels left out)
  int fa1_query_split = 1;                ///< FA1 only: blocks per head actually used
  std::size_t passes = 0;                 ///< CUPTI replay passes per kernel
  std::vector<std::string> unavailable;   ///< metrics the device did not accept
};

/// Runs and measures one variant; throws CudaError / std::invalid_argument with a message.
ProbeResult measure_attention(ProbeVariant variant, const ProbeConfig& cfg);

/// The FA1 query split the kernels would use for these settings (resolves Options' 0 = auto).
int fa1_query_split_for(const ProbeConfig& cfg);

}  // namespace flashlab::cuda
