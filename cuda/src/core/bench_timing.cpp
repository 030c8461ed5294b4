// bench_timing.cpp — the launch timer of the GPU benchmarks (bench_timing.hpp).
#include "core/bench_timing.hpp"

#include "core/probe_kernels.hpp"

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace flashlab::cuda::detail {

LaunchTimes launch_statistics(std::vector<double> times) {
  if (times.empty()) throw std::invalid_argument("launch_statistics: no timed launch");
  std::sort(times.begin(), times.end());
  const std::size_t m = times.size();
  LaunchTimes out;
  out.median_ms = m % 2 ? times[m / 2] : 0.5 * (times[m / 2 - 1] + times[m / 2]);
  out.min_ms = times.front();
  out.max_ms = times.back();
  return out;
}

LaunchTimer::LaunchTimer(std::size_t flush_bytes, L2Flush flush)
    : flush_((flush_bytes + sizeof(float) - 1) / sizeof(float)), sink_(flush_bytes ? 1 : 0), mode_(flush) {
  FLASHLAB_CUDA_CHECK(cudaEventCreate(&start_));
  const cudaError_t stop_created = cudaEventCreate(&stop_);
  if (stop_created != cudaSuccess) cudaEventDestroy(start_);  // the destructor will not run
  FLASHLAB_CUDA_CHECK(stop_created);
}

LaunchTimer::~LaunchTimer() {
  cudaEventDestroy(start_);  // destructor: nothing useful to do with an error here
  cudaEventDestroy(stop_);
}

LaunchTimes LaunchTimer::time(int warmup, int reps, const std::function<void(int)>& launch,
                              const std::function<void(int)>& after) {
  if (reps < 1 || warmup < 0) throw std::invalid_argument("LaunchTimer: reps must be >= 1 and warmup >= 0");
  std::vector<double> times;
  times.reserve(std::size_t(reps));
  for (int r = 0; r < warmup + reps; ++r) {
    // Evict L2 outside the timed range (before the start event). The memset leaves L2 full of its
    // own dirty lines; reading the buffer back evicts them, written back here, so the launch
    // starts on a clean L2 and its time holds no write-back it did not cause.
    if (flush_.size()) {
      FLASHLAB_CUDA_CHECK(cudaMemsetAsync(flush_.get(), r & 0xff, flush_.bytes()));
      if (mode_ == L2Flush::clean) launch_l2_write_back(flush_.get(), flush_.size(), sink_.get());
    }
    FLASHLAB_CUDA_CHECK(cudaEventRecord(start_));
    launch(r);
    FLASHLAB_CUDA_CHECK(cudaEventRecord(stop_));
    FLASHLAB_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0.f;
    FLASHLAB_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    if (r >= warmup) times.push_back(ms);
    if (after) after(r);
  }
  FLASHLAB_CUDA_CHECK(cudaGetLastError());
  return launch_statistics(std::move(times));
}

}  // namespace flashlab::cuda::detail
