/// @file profiler.hpp
/// @brief A small wrapper of the CUPTI Range Profiler (CUDA 13): per-kernel DRAM and L2 bytes and
/// duration, measured in-process.
///
/// Every kernel launched inside `profile()` becomes one range (auto range, kernel replay). The
/// counters are read per range:
/// - DRAM bytes read / written (`dram__bytes_read.sum`, `dram__bytes_write.sum`): what reached HBM.
/// - L2 → SM and SM → L2 bytes over the crossbar (`l1tex__m_xbar2l1tex_read_bytes.sum`,
///   `l1tex__m_l1tex2xbar_write_bytes.sum`): what the SMs received from / sent to L2, the level
///   a tile-load model describes.
/// - L2-slice sectors from the SMs (`lts__t_sectors_srcunit_tex_op_{read,write}.sum` × 32):
///   on the H100 these can be fewer than the crossbar bytes when many blocks load the same
///   sector at the same moment (observed; see cuda/RESULTS.md).
/// - reductions and atomics performed in L2 (`lts__t_sectors_srcunit_tex_op_{red,atom}.sum` × 32).
/// - duration (`gpu__time_duration.sum`), in nanoseconds.
/// A configuration of several metrics may need several replay passes of each kernel, and a
/// replayed kernel no longer starts with a cold L2; measure_attention() therefore profiles one
/// metric per session (one pass each) and repeats the launches. Requires permission to use the
/// performance counters (root on the H100 machine). Errors throw CudaError naming the CUPTI call
/// and file:line.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace flashlab::cuda {

/// Counters of one profiled kernel launch (one CUPTI range).
struct KernelCounters {
  std::string range_name;        ///< CUPTI's name of the range (the kernel's name)
  double dram_read_bytes = 0;    ///< bytes read from DRAM (HBM)
  double dram_write_bytes = 0;   ///< bytes written to DRAM (HBM)
  double l2_read_bytes = 0;      ///< bytes L2 delivered to the SMs (crossbar, L2 → L1TEX)
  double l2_write_bytes = 0;     ///< bytes the SMs sent to L2 (crossbar, L1TEX → L2)
  double lts_read_bytes = 0;     ///< read sectors × 32 counted at the L2 slices (requests from the SMs)
  double lts_write_bytes = 0;    ///< write sectors × 32 counted at the L2 slices
  double l2_atomic_bytes = 0;    ///< bytes of reductions and atomics performed in L2 (sectors × 32)
  double duration_ns = 0;        ///< kernel duration in nanoseconds
};

/// One measured kernel of a launch sequence (every family's probe reports these).
struct MeasuredKernel {
  std::string kernel;       ///< our kernel name, e.g. "flash_fwd_kernel"
  KernelCounters counters;  ///< what CUPTI measured for it
};

/// What a traffic probe measured: the kernels of one launch sequence, in launch order. The one
/// result type of every family (attention: measure_attention; MTA: mta::measure; STREAM:
/// measure_stream_traffic's kernels).
struct ProbeResult {
  std::vector<MeasuredKernel> kernels;    ///< the algorithm's kernels (flush kernels left out)
  int fa1_query_split = 1;                ///< FA1 only: blocks per head actually used
  std::size_t passes = 0;                 ///< CUPTI replay passes per kernel
  std::vector<std::string> unavailable;   ///< metrics the device did not accept
};

/// The CUPTI Range Profiler on device 0, configured once for the counters of KernelCounters.
class RangeProfiler {
 public:
  /// Initialises CUPTI and builds the configuration for `metrics` (empty: all_metrics()); a metric
  /// the device rejects is listed in unavailable_metrics(). Throws CudaError on failure.
  explicit RangeProfiler(const std::vector<std::string>& metrics = {});
  /// Releases the CUPTI host object.
  ~RangeProfiler();
  RangeProfiler(const RangeProfiler&) = delete;             ///< not copyable
  RangeProfiler& operator=(const RangeProfiler&) = delete;  ///< not copyable

  /// Runs `launches` inside one profiling session and returns one entry per kernel it launched,
  /// in launch order. `launches` must synchronise nothing itself; at most `max_ranges` kernels.
  std::vector<KernelCounters> profile(const std::function<void()>& launches, std::size_t max_ranges = 64);

  /// Replay passes the configuration needs (1 means every kernel ran exactly once).
  [[nodiscard]] std::size_t passes() const;
  /// Metrics the device did not accept (their counters read 0).
  [[nodiscard]] const std::vector<std::string>& unavailable_metrics() const;
  /// Every metric this wrapper knows, in KernelCounters order.
  static std::vector<std::string> all_metrics();
  /// Adds the values of the metrics that `from` holds into `to` (fields of other metrics untouched).
  static void accumulate(KernelCounters& to, const KernelCounters& from);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace flashlab::cuda
