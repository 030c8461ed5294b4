// traffic_probe.cu — runs one attention algorithm's clear kernels under the CUPTI Range Profiler with L2 flushed
// before each measured kernel (traffic_probe.hpp). Inputs are generated on the device from a
// seeded hash (no host upload of hundreds of MB); the values are standard-normal-like.
#include "flashlab/cuda/traffic_probe.hpp"

#include "common.hpp"
#include "launchers.hpp"

#include <algorithm>
#include <cstring>
#include <functional>

namespace flashlab::cuda {

using detail::DeviceBuffer;

namespace {

/// x[i] = sum of 4 uniforms in [-1, 1) scaled to unit variance, from a 64-bit hash of (seed, i).
__global__ void random_fill_kernel(float* __restrict__ x, std::size_t n, unsigned long long seed) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    unsigned long long z = seed * 0x9E3779B97F4A7C15ull + i;
    float s = 0.f;
    for (int k = 0; k < 4; ++k) {
      z += 0x9E3779B97F4A7C15ull;
      unsigned long long y = z;
      y = (y ^ (y >> 30)) * 0xBF58476D1CE4E5B9ull;
      y = (y ^ (y >> 27)) * 0x94D049BB133111EBull;
      y ^= y >> 31;
      s += float(y >> 40) * (2.f / 16777216.f) - 1.f;
    }
    x[i] = s * 0.8660254f;  // 4 uniforms of variance 1/3 → variance 4/3; scale to 1
  }
}

/// L2 flush, step 1: write every byte of a buffer larger than L2 (evicts all earlier lines).
__global__ void l2_flush_write_kernel(float* __restrict__ buf, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x)
    buf[i] = float(i & 1023);
}

/// L2 flush, step 2: read it back, so the dirty lines of step 1 are written back here and not
/// during the measured kernel (which would add to its DRAM write bytes).
__global__ void l2_flush_read_kernel(const float* __restrict__ buf, std::size_t n, float* __restrict__ sink) {
  float acc = 0.f;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x)
    acc += __ldcg(buf + i);
  if (acc == -1.f) sink[0] = acc;  // never true (all values ≥ 0): keeps the loads alive
}

constexpr unsigned kFillBlocks = 1024;

void random_fill(DeviceBuffer<float>& b, unsigned long long seed) {
  random_fill_kernel<<<kFillBlocks, 256>>>(b.get(), b.size(), seed);
  FLASHLAB_CUDA_CHECK(cudaGetLastError());
}

/// The hook: before each kernel the variant launches, flush L2 and remember the kernel's name.
struct FlushHook : detail::LaunchHook {
  DeviceBuffer<float>* flush = nullptr;
  DeviceBuffer<float>* sink = nullptr;
  std::vector<std::string> launched;  // every kernel in launch order, flush kernels included
  void before(const char* name) override {
    l2_flush_write_kernel<<<kFillBlocks, 256>>>(flush->get(), flush->size());
    FLASHLAB_CUDA_CHECK(cudaGetLastError());
    l2_flush_read_kernel<<<kFillBlocks, 256>>>(flush->get(), flush->size(), sink->get());
    FLASHLAB_CUDA_CHECK(cudaGetLastError());
    launched.emplace_back("l2_flush_write_kernel");
    launched.emplace_back("l2_flush_read_kernel");
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
      if (hook.launched[r].rfind("l2_flush_", 0) == 0) continue;
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
