// The one CUPTI traffic probe (probe.hpp): one metric per session, L2 flushed before every
// announced kernel through the launch hook, CUPTI's ranges paired with the launches.
#include "core/probe.hpp"

#include "core/common.hpp"
#include "core/probe_kernels.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

namespace flashlab::cuda::detail {

namespace {

/// The hook: before each kernel the launches announce, flush L2 and remember the kernel's name.
struct FlushHook : LaunchHook {
  DeviceBuffer<float>* flush = nullptr;
  DeviceBuffer<float>* sink = nullptr;
  std::vector<std::string> launched;  // every kernel in launch order, the flush kernels included
  void before(const char* name) override {
    launch_l2_flush(flush->get(), flush->size(), sink->get());
    launched.emplace_back(kL2FlushWriteKernel);
    launched.emplace_back(kL2FlushReadKernel);
    launched.emplace_back(name);
  }
};

/// Installs a hook on this thread for the lifetime of the object (removed on every exit path).
struct HookScope {
  explicit HookScope(LaunchHook* h) { launch_hook() = h; }
  ~HookScope() { launch_hook() = nullptr; }
  HookScope(const HookScope&) = delete;
  HookScope& operator=(const HookScope&) = delete;
};

}  // namespace

ProbeResult probe_kernels(const std::function<void()>& launches, std::size_t flush_bytes, bool require_every_metric) {
  if (flush_bytes < (std::size_t(64) << 20))
    throw std::invalid_argument("flashlab::cuda: an L2 flush of " + std::to_string(flush_bytes) +
                                " bytes cannot flush a 50 MB L2 (hint: use >= 128 MiB)");
  DeviceBuffer<float> flush(flush_bytes / sizeof(float)), sink(1);
  FlushHook hook;
  hook.flush = &flush;
  hook.sink = &sink;
  ProbeResult result;
  // One metric per session: each session needs a single pass, so every measured kernel runs
  // exactly once right after its L2 flush. Several metrics in one configuration would make CUPTI
  // replay each kernel once per pass, and the replays would start with a warm L2.
  for (const std::string& metric : RangeProfiler::all_metrics()) {
    RangeProfiler profiler({metric});
    if (!profiler.unavailable_metrics().empty()) {
      if (require_every_metric) throw CudaError("CUPTI: the device has no counter " + metric);
      result.unavailable.push_back(metric);
      continue;
    }
    result.passes = std::max(result.passes, profiler.passes());
    hook.launched.clear();
    std::vector<KernelCounters> ranges;
    {
      HookScope scope(&hook);
      ranges = profiler.profile(launches);
    }
    // Ranges and launches must pair up one to one, in order.
    if (ranges.size() != hook.launched.size()) {
      std::string names;
      for (const auto& r : ranges) names += " " + r.range_name;
      throw CudaError("CUPTI returned " + std::to_string(ranges.size()) + " ranges for " +
                      std::to_string(hook.launched.size()) + " launches:" + names);
    }
    // If CUPTI's range names carry the kernel names (they do for auto ranges), every one must
    // match; if none does, the names are not informative and the launch order alone pairs them.
    std::size_t matches = 0;
    for (std::size_t r = 0; r < ranges.size(); ++r)
      if (ranges[r].range_name.find(hook.launched[r]) != std::string::npos) ++matches;
    std::size_t k = 0;
    for (std::size_t r = 0; r < ranges.size(); ++r) {
      if (matches != 0 && ranges[r].range_name.find(hook.launched[r]) == std::string::npos)
        throw CudaError("CUPTI range " + std::to_string(r) + " is '" + ranges[r].range_name + "', expected kernel " +
                        hook.launched[r]);
      if (hook.launched[r].rfind(kL2FlushPrefix, 0) == 0) continue;
      if (k == result.kernels.size()) result.kernels.push_back({hook.launched[r], KernelCounters{}});
      RangeProfiler::accumulate(result.kernels[k].counters, ranges[r]);
      result.kernels[k].counters.range_name = ranges[r].range_name;
      ++k;
    }
  }
  return result;
}

}  // namespace flashlab::cuda::detail
