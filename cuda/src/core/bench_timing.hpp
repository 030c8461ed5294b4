// bench_timing.hpp — the one launch timer of the GPU benchmarks (bench.cpp, stream_bench.cpp,
// the fast estimate's timer): each launch alone between two CUDA events on the default stream,
// after an L2 flush outside the timed range that leaves L2 clean; median, minimum and maximum of
// the timed launches.
#pragma once

#include "core/common.hpp"

#include <cstddef>
#include <functional>
#include <vector>

namespace flashlab::cuda::detail {

/// Median, minimum and maximum of the timed launches of one pass, in milliseconds.
struct LaunchTimes {
  double median_ms = 0.0;
  double min_ms = 0.0;
  double max_ms = 0.0;
};

/// The statistics of `times` (ms, at least one; the median of an even count is the mean of the
/// two middle values).
LaunchTimes launch_statistics(std::vector<double> times);

/// How the timer empties L2 before each launch, outside the timed range.
enum class L2Flush {
  /// A memset of the flush buffer, then a read of all of it: L2 holds clean lines only when the
  /// timed launch starts, so the launch writes back nothing but its own output. The default.
  clean,
  /// The memset alone: up to L2's size of its dirty lines (~50 MB on an H100) stay, and the timed
  /// launch writes them back as its reads evict them (~17 µs at 3 TB/s). That charge falls in full
  /// on a kernel that reads much and writes little (a decoding step), while a copy leaves about
  /// as many dirty lines of its own behind at its stop event. For comparing with timings taken so.
  dirty,
};

/// Owns the L2 flush buffer and the event pair of a sweep; time() times one pass.
class LaunchTimer {
 public:
  /// `flush_bytes` = 0: no flush (the launches may then find their inputs in L2).
  explicit LaunchTimer(std::size_t flush_bytes, L2Flush flush = L2Flush::clean);
  ~LaunchTimer();
  LaunchTimer(const LaunchTimer&) = delete;
  LaunchTimer& operator=(const LaunchTimer&) = delete;

  /// `warmup` untimed launches, then `reps` timed ones: launch r (0 … warmup + reps − 1) is
  /// `launch(r)`, after the flush (a memset of the flush buffer, value r & 0xff, and with
  /// L2Flush::clean a read of it) and alone between the
  /// events, synchronised before the next; `after(r)`, if given, runs after launch r's stop event,
  /// outside the timed range (a download, a check). Checks every CUDA call.
  LaunchTimes time(int warmup, int reps, const std::function<void(int)>& launch,
                   const std::function<void(int)>& after = {});

 private:
  DeviceBuffer<float> flush_;  // flush_bytes rounded up to whole floats
  DeviceBuffer<float> sink_;   // keeps the read's loads alive (never written in practice)
  L2Flush mode_;
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
};

}  // namespace flashlab::cuda::detail
