// bench_timing.hpp — the one launch timer of the GPU benchmarks (bench.cpp, stream_bench.cpp,
// the fast estimate's timer): each launch alone between two CUDA events on the default stream,
// after an L2 flush outside the timed range; median, minimum and maximum of the timed launches.
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

/// Owns the L2 flush buffer and the event pair of a sweep; time() times one pass.
class LaunchTimer {
 public:
  /// `flush_bytes` = 0: no flush (the launches may then find their inputs in L2).
  explicit LaunchTimer(std::size_t flush_bytes);
  ~LaunchTimer();
  LaunchTimer(const LaunchTimer&) = delete;
  LaunchTimer& operator=(const LaunchTimer&) = delete;

  /// `warmup` untimed launches, then `reps` timed ones: launch r (0 … warmup + reps − 1) is
  /// `launch(r)`, after a memset of the flush buffer (value r & 0xff) and alone between the
  /// events, synchronised before the next; `after(r)`, if given, runs after launch r's stop event,
  /// outside the timed range (a download, a check). Checks every CUDA call.
  LaunchTimes time(int warmup, int reps, const std::function<void(int)>& launch,
                   const std::function<void(int)>& after = {});

 private:
  DeviceBuffer<unsigned char> flush_;
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
};

}  // namespace flashlab::cuda::detail
