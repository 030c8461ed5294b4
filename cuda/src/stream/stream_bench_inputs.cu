// stream_bench_inputs.cu — the benchmark's random inputs made on the device (stream_bench.cpp):
// a [T, H, d] tensor at T = 4M is half a billion values, too many to draw on the host per shape.
// Each value is a pure function of (seed, index): a counter hash gives two uniforms, Box–Muller
// one N(0, 1) value, rounded to the timed kernels' dtype where asked. The layer pipeline's inputs
// (stream_layer.cpp) are made the same way straight into 16 bits: a layer's Q, K, V at T = 1M,
// H = 32, d = 128 are 24 GiB, with no room for fp32 staging beside them.
#include "stream/stream_fast_common.hpp"

#include "core/common.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace flashlab::cuda::stream::detail {
namespace {

/// SplitMix64 finaliser: a well-mixed 64-bit value per counter.
__device__ std::uint64_t mix(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__global__ void fill_normal_kernel(float* __restrict__ x, std::size_t n, std::uint64_t seed, int rounding) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    const std::uint64_t h = mix(seed ^ mix(i));
    const float u1 = (float(h >> 40) + 1.f) * (1.f / 16777216.f);  // (0, 1]
    const float u2 = float((h >> 16) & 0xffffff) * (1.f / 16777216.f);
    float v = sqrtf(-2.f * logf(u1)) * cospif(2.f * u2);
    if (rounding == 1) v = __bfloat162float(__float2bfloat16_rn(v));
    if (rounding == 2) v = __half2float(__float2half_rn(v));
    x[i] = v;
  }
}

__global__ void to_16bit_kernel(const float* __restrict__ x, std::uint16_t* __restrict__ y, std::size_t n, bool bf16) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    if (bf16) y[i] = __bfloat16_as_ushort(__float2bfloat16_rn(x[i]));
    else y[i] = __half_as_ushort(__float2half_rn(x[i]));
  }
}

__global__ void normal_16bit_kernel(std::uint16_t* __restrict__ y, std::size_t n, std::uint64_t seed, float scale,
                                    bool bf16, std::size_t first) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    const std::uint64_t h = mix(seed ^ mix(first + i));
    const float u1 = (float(h >> 40) + 1.f) * (1.f / 16777216.f);  // (0, 1]
    const float u2 = float((h >> 16) & 0xffffff) * (1.f / 16777216.f);
    const float v = scale * sqrtf(-2.f * logf(u1)) * cospif(2.f * u2);
    y[i] = bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(v)) : __half_as_ushort(__float2half_rn(v));
  }
}

}  // namespace

void fill_normal_16bit(std::uint16_t* y, std::size_t n, std::uint64_t seed, float scale, bool bf16, cudaStream_t stream,
                       std::size_t first) {
  normal_16bit_kernel<<<1024, 256, 0, stream>>>(y, n, seed, scale, bf16, first);
  FLASHLAB_CUDA_CHECK_LAUNCH("normal_16bit_kernel");
}

void fill_normal(float* x, std::size_t n, std::uint64_t seed, int rounding) {
  fill_normal_kernel<<<1024, 256>>>(x, n, seed, rounding);
  FLASHLAB_CUDA_CHECK_LAUNCH("fill_normal_kernel");
}

void convert_to_16bit(const float* x, std::uint16_t* y, std::size_t n, bool bf16) {
  to_16bit_kernel<<<1024, 256>>>(x, y, n, bf16);
  FLASHLAB_CUDA_CHECK_LAUNCH("to_16bit_kernel");
}

}  // namespace flashlab::cuda::stream::detail
