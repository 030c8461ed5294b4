// The traffic probes' shared kernels (probe_kernels.hpp): device-side seeded fill and L2 flush.
#include "core/probe_kernels.hpp"

#include "core/common.hpp"

namespace flashlab::cuda::detail {

namespace {
constexpr unsigned kFillBlocks = 1024;
}  // namespace

/// x[i] = sum of 4 uniforms in [−1, 1) scaled to unit variance, from a 64-bit hash of (seed, i).
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
    x[i] = s * 0.8660254f;  // 4 uniforms of variance 1/3 → variance 4/3; scaled to 1
  }
}

/// Flush step 1: write every byte of a buffer larger than L2 (evicts everything earlier).
__global__ void l2_flush_write_kernel(float* __restrict__ buf, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x)
    buf[i] = float(i & 1023);
}

/// Flush step 2: read it back, so step 1's dirty lines are written back now, not during the
/// measured kernel (which would add to its DRAM write bytes).
__global__ void l2_flush_read_kernel(const float* __restrict__ buf, std::size_t n, float* __restrict__ sink) {
  float acc = 0.f;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x)
    acc += __ldcg(buf + i);
  if (acc == -1.f) sink[0] = acc;  // keeps the loads alive; never true after step 1 (values ≥ 0), harmless else
}

void launch_random_fill(float* x, std::size_t count, unsigned long long seed) {
  random_fill_kernel<<<kFillBlocks, 256>>>(x, count, seed);
  FLASHLAB_CUDA_CHECK_LAUNCH("random_fill_kernel");
}

void launch_l2_flush(float* buf, std::size_t count, float* sink) {
  l2_flush_write_kernel<<<kFillBlocks, 256>>>(buf, count);
  FLASHLAB_CUDA_CHECK_LAUNCH("l2_flush_write_kernel");
  launch_l2_write_back(buf, count, sink);
}

void launch_l2_write_back(const float* buf, std::size_t count, float* sink) {
  l2_flush_read_kernel<<<kFillBlocks, 256>>>(buf, count, sink);
  FLASHLAB_CUDA_CHECK_LAUNCH("l2_flush_read_kernel");
}

}  // namespace flashlab::cuda::detail
