// The forwards' stream-ordered partial slots (partial_pool.hpp).
#include "attention/partial_pool.hpp"

#include "core/common.hpp"

#include <cstdint>
#include <map>
#include <mutex>

namespace flashlab::cuda::detail {

namespace {

/// The pool of device `dev`, created at its first use and kept (release threshold: never).
cudaMemPool_t partial_pool(int dev) {
  static std::mutex mutex;
  static std::map<int, cudaMemPool_t> pools;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto it = pools.find(dev);
  if (it != pools.end()) return it->second;
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = dev;
  cudaMemPool_t pool = nullptr;
  FLASHLAB_CUDA_CHECK(cudaMemPoolCreate(&pool, &props));
  std::uint64_t keep = ~std::uint64_t(0);  // the attribute is a cuuint64_t (64-bit unsigned)
  FLASHLAB_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  pools.emplace(dev, pool);
  return pool;
}

}  // namespace

void* allocate_partials(std::size_t bytes, cudaStream_t stream) {
  void* ptr = nullptr;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  FLASHLAB_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) {
    FLASHLAB_CUDA_CHECK(cudaMallocAsync(&ptr, bytes, stream));
  } else {
    int dev = 0;
    FLASHLAB_CUDA_CHECK(cudaGetDevice(&dev));
    FLASHLAB_CUDA_CHECK(cudaMallocFromPoolAsync(&ptr, bytes, partial_pool(dev), stream));
  }
  return ptr;
}

void free_partials(void* ptr, cudaStream_t stream) { FLASHLAB_CUDA_CHECK(cudaFreeAsync(ptr, stream)); }

}  // namespace flashlab::cuda::detail
