// The MTA traffic probe (mta.hpp, measure): one pass of the clear MTA kernels on seeded device
// inputs under the CUPTI Range Profiler, L2 flushed before every measured kernel, one metric per
// profiling session (a single pass each, so no replay starts with a warm L2) — the recipe every
// probe shares (probe_kernels.hpp), applied to the MTA launch sequences.
#include "core/common.hpp"
// GCC 12 at -O2/-O3 reports a false -Wrestrict inside std::string operator+ (GCC bug 105329).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wrestrict"
#endif
#include "flashlab/cuda/mta.hpp"
#include "flashlab/cuda/profiler.hpp"
#include "mta/mta_api.hpp"
#include "core/probe_kernels.hpp"

#include <algorithm>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace flashlab::cuda::mta {

namespace dm = detail::mta;
using detail::DeviceBuffer;

namespace {

/// Before each kernel a pass launches: flush L2 and remember the kernel's name.
struct FlushHook : detail::LaunchHook {
  DeviceBuffer<float>* flush = nullptr;
  DeviceBuffer<float>* sink = nullptr;
  std::vector<std::string> launched;  // every kernel in launch order, the two flush kernels included
  void before(const char* name) override {
    detail::launch_l2_flush(flush->get(), flush->size(), sink->get());
    launched.emplace_back(detail::kL2FlushWriteKernel);
    launched.emplace_back(detail::kL2FlushReadKernel);
    launched.emplace_back(name);
  }
};

/// Installs a hook for the lifetime of the object (removed on every exit path).
struct HookScope {
  explicit HookScope(detail::LaunchHook* h) { detail::launch_hook() = h; }
  ~HookScope() { detail::launch_hook() = nullptr; }
  HookScope(const HookScope&) = delete;
  HookScope& operator=(const HookScope&) = delete;
};

/// Runs `launches` once per metric and pairs CUPTI's ranges with the launched kernels.
ProbeResult profile_each_metric(const std::function<void()>& launches, FlushHook& hook) {
  ProbeResult result;
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
    if (ranges.size() != hook.launched.size())
      throw CudaError("CUPTI returned " + std::to_string(ranges.size()) + " ranges for " +
                      std::to_string(hook.launched.size()) + " launches");
    std::size_t k = 0;
    for (std::size_t r = 0; r < ranges.size(); ++r) {
      if (ranges[r].range_name.find(hook.launched[r]) == std::string::npos &&
          ranges[r].range_name.find("mta_") != std::string::npos)
        throw CudaError("CUPTI range " + std::to_string(r) + " is '" + ranges[r].range_name + "', expected kernel " +
                        hook.launched[r]);
      if (hook.launched[r].rfind(detail::kL2FlushPrefix, 0) == 0) continue;
      if (k == result.kernels.size()) result.kernels.push_back({hook.launched[r], KernelCounters{}});
      RangeProfiler::accumulate(result.kernels[k].counters, ranges[r]);
      ++k;
    }
  }
  return result;
}

}  // namespace

ProbeResult measure(Pass pass, const ProbeConfig& cfg) {
  const ref::Shape& sh = cfg.shape;
  const ref::mta::Params& p = cfg.params;
  if (pass == Pass::infer && p.cq > ref::mta::kInferQueryRows)
    throw std::invalid_argument("flashlab::cuda::mta: inference needs cq <= 16 (the 16-row query tile)");
  if (cfg.flush_bytes < (std::size_t(64) << 20))
    throw std::invalid_argument("flashlab::cuda::mta: a flush buffer of " + std::to_string(cfg.flush_bytes) +
                                " bytes cannot flush a 50 MB L2 (hint: use >= 128 MiB)");
  if (sh.batch < 1 || sh.seq < 1 || sh.heads < 1 || sh.head_dim < 1)
    throw std::invalid_argument("flashlab::cuda::mta: empty shape " + sh.str());
  const dm::Launch F = dm::make_launch(sh, p, false);
  const dm::Launch Bw = pass == Pass::backward ? dm::make_launch(sh, p, true) : F;
  const std::size_t numel = sh.numel(), stats = sh.batch * sh.heads * sh.seq, taps = sh.heads * p.cq * p.ck;

  DeviceBuffer<float> Q(numel), K(numel), V(numel), W(taps), O(numel), M(stats), L(stats);
  detail::launch_random_fill(Q.get(), numel, cfg.seed * 8 + 0);
  detail::launch_random_fill(K.get(), numel, cfg.seed * 8 + 1);
  detail::launch_random_fill(V.get(), numel, cfg.seed * 8 + 2);
  detail::launch_random_fill(W.get(), taps, cfg.seed * 8 + 3);
  DeviceBuffer<float> flush(cfg.flush_bytes / sizeof(float)), sink(1);
  FlushHook hook;
  hook.flush = &flush;
  hook.sink = &sink;

  DeviceBuffer<float> dO, D, dQ, dK, dV, dW, O_s, M_s, L_s;
  std::function<void()> launches;
  switch (pass) {
    case Pass::forward:
      launches = [&] {
        dm::launch_zero_fill(O.get(), numel);
        dm::launch_forward(F, Q.get(), K.get(), V.get(), W.get(), O.get(), M.get(), L.get());
      };
      break;
    case Pass::backward:
      dO = DeviceBuffer<float>(numel);
      D = DeviceBuffer<float>(stats);
      dQ = DeviceBuffer<float>(numel);
      dK = DeviceBuffer<float>(numel);
      dV = DeviceBuffer<float>(numel);
      dW = DeviceBuffer<float>(taps);
      detail::launch_random_fill(dO.get(), numel, cfg.seed * 8 + 4);
      dm::launch_zero_fill(O.get(), numel);  // the forward for O, M, L (not measured)
      dm::launch_forward(F, Q.get(), K.get(), V.get(), W.get(), O.get(), M.get(), L.get());
      launches = [&] {
        dm::launch_bwd_preprocess(Bw, O.get(), dO.get(), D.get());
        dm::launch_zero_fill(dW.get(), taps);
        dm::launch_bwd_dq_dw(Bw, Q.get(), K.get(), V.get(), W.get(), dO.get(), M.get(), L.get(), D.get(), dQ.get(),
                             dW.get());
        dm::launch_bwd_dk_dv(Bw, Q.get(), K.get(), V.get(), W.get(), dO.get(), M.get(), L.get(), D.get(), dK.get(),
                             dV.get());
      };
      break;
    case Pass::infer: {
      const std::size_t parts = sh.batch * sh.heads * p.splits;
      if (p.splits > 1) {
        O_s = DeviceBuffer<float>(parts * sh.head_dim);
        M_s = DeviceBuffer<float>(parts);
        L_s = DeviceBuffer<float>(parts);
      }
      launches = [&] {
        dm::launch_infer_split(F, Q.get(), K.get(), V.get(), W.get(), O.get(), O_s.get(), M_s.get(), L_s.get());
        if (p.splits > 1) dm::launch_infer_combine(F, O_s.get(), M_s.get(), L_s.get(), O.get());
      };
      break;
    }
  }
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  // Every launch sequence is idempotent (each output is rewritten; O and dW are zeroed first).
  return profile_each_metric(launches, hook);
}

}  // namespace flashlab::cuda::mta
