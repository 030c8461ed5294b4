// traffic_probe.cu — runs one attention algorithm's clear kernels under the CUPTI Range Profiler with L2 flushed
// before each measured kernel (traffic_probe.hpp). Inputs are generated on the device from a
// seeded hash (no host upload of hundreds of MB); the values are standard-normal-like. The fill and
// the flush are the recipe every probe shares (probe_kernels.hpp).
#include "flashlab/cuda/traffic_probe.hpp"

#include "core/common.hpp"
#include "attention/launchers.hpp"
#include "core/probe_kernels.hpp"

#include <algorithm>
#include <cstring>
#include <functional>

namespace flashlab::cuda {

using detail::DeviceBuffer;

namespace {

void random_fill(DeviceBuffer<float>& b, unsigned long long seed) { detail::launch_random_fill(b.get(), b.size(), seed); }

/// The hook: before each kernel the variant launches, flush L2 and remember the kernel's name.
struct FlushHook : detail::LaunchHook {
  DeviceBuffer<float>* flush = nullptr;
  DeviceBuffer<float>* sink = nullptr;
  std::vector<std::string> launched;  // every kernel in launch order, flush kernels included
  void before(const char* name) override {
    detail::launch_l2_flush(flush->get(), flush->size(), sink->get());
    launched.emplace_back(detail::kL2FlushWriteKernel);
    launched.emplace_back(detail::kL2FlushReadKernel);
    launched.emplace_back(name);
  }
};

/// Installs a hook for the lifetime of the object (and removes it on every exit path).
struct HookScope {
  explicit HookScope(detail::LaunchHook* h) { detail::launch_hook() = h; }
  ~HookScope() { detail::launch_hook() = nullptr; }
  HookScope(const HookScope&) = delete;
  HookScope& operator=(const HookScope&) = delete;
};

/// Runs `launches` once per CUPTI metric and adds what each measured kernel (flush kernels left
/// out) counted to `result.kernels`, in launch order; metrics the device refuses go to
/// `result.unavailable`.
void profile_each_metric(const std::function<void()>& launches, FlushHook& hook, ProbeResult& result) {
  // One metric per session: each session needs a single pass, so every measured kernel runs
  // exactly once right after its L2 flush. Several metrics in one configuration would make CUPTI
  // replay each kernel once per pass, and the replays would start with a warm L2. The launch
  // sequences are idempotent (every output is overwritten; atomic dQ is zeroed first), so they
  // can simply be repeated.
  for (const std::string& metric : RangeProfiler::all_metrics()) {
    RangeProfiler profiler({metric});
    if (!profiler.unavailable_metrics().empty()) {
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
      if (hook.launched[r].rfind(detail::kL2FlushPrefix, 0) == 0) continue;
      if (k == result.kernels.size()) result.kernels.push_back({hook.launched[r], KernelCounters{}});
      RangeProfiler::accumulate(result.kernels[k].counters, ranges[r]);
      ++k;
    }
  }
}

}  // namespace

int fa1_query_split_for(const ProbeConfig& cfg) {
  check_clear_problem(ref::Algorithm::fa1_fwd, cfg.problem);
  const detail::Problem p = detail::make_problem(cfg.problem).with_tiles(int(cfg.problem.Br), int(cfg.problem.Bc));
  const int split = cfg.fa1_query_split > 0 ? cfg.fa1_query_split : detail::fa1_auto_split(p);
  // The launcher rounds to whole query-tile ranges; report the number of blocks it launches.
  const int Tr = p.Tr();
  const int per = (Tr + std::clamp(split, 1, Tr) - 1) / std::clamp(split, 1, Tr);
  return (Tr + per - 1) / per;
}

ProbeResult measure_attention(ref::Algorithm algorithm, const ProbeConfig& cfg) {
  check_clear_problem(algorithm, cfg.problem);
  const detail::Problem p = detail::make_problem(cfg.problem).with_tiles(int(cfg.problem.Br), int(cfg.problem.Bc));
  if (cfg.flush_bytes < (std::size_t(64) << 20))
    throw std::invalid_argument("flashlab::cuda: flush buffer of " + std::to_string(cfg.flush_bytes) +
                                " bytes is too small to flush a 50 MB L2 (hint: use >= 128 MiB)");
  const std::size_t numel = std::size_t(p.batch) * p.seq * p.row_stride();
  const std::size_t stats = std::size_t(p.batch) * p.heads * p.seq;

  DeviceBuffer<float> Q(numel), K(numel), V(numel), O(numel), LSE(stats);
  random_fill(Q, cfg.seed * 4 + 0);
  random_fill(K, cfg.seed * 4 + 1);
  random_fill(V, cfg.seed * 4 + 2);
  DeviceBuffer<float> flush(cfg.flush_bytes / sizeof(float)), sink(1);
  FlushHook hook;
  hook.flush = &flush;
  hook.sink = &sink;

  ProbeResult result;
  // Buffers every algorithm may need (allocated only when used), then the launch sequence.
  DeviceBuffer<float> S, m, l, dO, D, dQ, dK, dV;
  std::function<void()> launches;
  switch (algorithm) {
    case ref::Algorithm::naive_fwd:
      S = DeviceBuffer<float>(std::size_t(p.batch) * p.heads * std::size_t(p.seq) * p.seq);
      launches = [&] {
        detail::launch_naive_scores(p, Q.get(), K.get(), S.get());
        detail::launch_naive_softmax(p, S.get(), S.get(), LSE.get());  // P overwrites S in place
        detail::launch_naive_pv(p, S.get(), V.get(), O.get());
      };
      break;
    case ref::Algorithm::fa1_fwd:
      m = DeviceBuffer<float>(stats);
      l = DeviceBuffer<float>(stats);
      result.fa1_query_split = fa1_query_split_for(cfg);
      launches = [&] {
        detail::launch_fa1_forward(p, result.fa1_query_split, Q.get(), K.get(), V.get(), O.get(), m.get(), l.get(),
                                   LSE.get());
      };
      break;
    case ref::Algorithm::fa2_fwd:
      launches = [&] { detail::launch_flash_forward(p, Q.get(), K.get(), V.get(), O.get(), LSE.get()); };
      break;
    case ref::Algorithm::bwd_two_kernel:
    case ref::Algorithm::bwd_atomic:
      dO = DeviceBuffer<float>(numel);
      D = DeviceBuffer<float>(stats);
      dQ = DeviceBuffer<float>(numel);
      dK = DeviceBuffer<float>(numel);
      dV = DeviceBuffer<float>(numel);
      random_fill(dO, cfg.seed * 4 + 3);
      detail::launch_flash_forward(p, Q.get(), K.get(), V.get(), O.get(), LSE.get());  // O, LSE (not measured)
      FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
      launches = [&] {
        detail::launch_bwd_preprocess(p, O.get(), dO.get(), D.get());
        if (algorithm == ref::Algorithm::bwd_two_kernel) {
          detail::launch_bwd_dq(p, Q.get(), K.get(), V.get(), dO.get(), LSE.get(), D.get(), dQ.get());
          detail::launch_bwd_dkdv(p, Q.get(), K.get(), V.get(), dO.get(), LSE.get(), D.get(), dK.get(), dV.get());
        } else {
          detail::launch_zero_fill(p, dQ.get());  // the atomic kernel only adds into dQ
          detail::launch_bwd_atomic(p, Q.get(), K.get(), V.get(), dO.get(), LSE.get(), D.get(), dQ.get(), dK.get(),
                                    dV.get());
        }
      };
      break;
    case ref::Algorithm::naive_bwd:
      break;  // refused by check_clear_problem
  }
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());

  profile_each_metric(launches, hook, result);
  return result;
}

}  // namespace flashlab::cuda
