// The small kernels of the GPU ring (context_parallel.cpp runs them between the fast attention
// kernels): the running O and LSE set to "nothing seen", the LSE merge of a block's fp32 partial
// into them, the final O, dQ, dK, dV rounded to 16 bits once, the sum of two fp32 buffers, and
// seeded inputs for the benchmarks. The blocks' partials and gradients never pass through 16 bits
// (the fast kernels' fp32 instantiations write or add them unrounded). All are memory-bound and
// touch N_local·H·d elements once per block: next to the block's c²·H·d products they are a
// fraction of a percent at the shapes the ring is for.
//
// Layouts as the fast kernels: a chunk of rows is [B, c, H, d] row-major (fp32 for the partials
// and running sums, 16 bits for inputs and outputs); LSE is [B, H, c] fp32, base 2.
#include "attention/context_parallel_kernels.hpp"

#include "core/common.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

namespace flashlab::cuda::detail {

namespace {

constexpr int kBlock = 256;

template <bool kBf16>
__device__ __forceinline__ std::uint16_t round16(float x) {
  if constexpr (kBf16) return __bfloat16_as_ushort(__float2bfloat16_rn(x));
  else return __half_as_ushort(__float2half_rn(x));
}

unsigned grid_for(std::size_t n, int per_block) {
  const std::size_t blocks = (n + per_block - 1) / per_block;
  return unsigned(blocks < 65535u * 64u ? blocks : 65535u * 64u);
}

__global__ void ring_init_kernel(float* O, std::size_t o_elements, float* LSE, std::size_t rows) {
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < o_elements; i += stride) O[i] = 0.f;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < rows; i += stride) LSE[i] = -INFINITY;
}

// One warp per query row (b, i, h): lane 0 reads the two LSE values and computes the weights,
// the warp shares them and rescales the row's d values, lane 0 writes the new LSE last (no other
// lane reads it after the broadcast, so the write races with nothing).
//   LSE_s = −inf: the partial saw no key, the row is left as it is (O_s is not read).
//   LSE   = −inf: nothing seen yet, the row becomes the partial.
//   else: m = max(LSE, LSE_s), w = 2^(LSE − m), w_s = 2^(LSE_s − m),
//         O = (w·O + w_s·O_s) / (w + w_s), LSE = m + log2(w + w_s)
__global__ void ring_merge_kernel(float* O, float* LSE, const float* O_s, const float* LSE_s, int B, int c, int H,
                                  int d) {
  const int lane = threadIdx.x & 31;
  const long long row = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const long long rows = (long long)B * c * H;
  if (row >= rows) return;
  // row = (b·c + i)·H + h  (the O layout); the LSE index is (b·H + h)·c + i
  const int h = int(row % H);
  const long long bi = row / H;
  const int i = int(bi % c), b = int(bi / c);
  const long long at = ((long long)b * H + h) * c + i;
  float a = 0.f, w = 0.f, lse_new = 0.f;
  int mode = 0;  // 0: keep, 1: take the partial, 2: mix
  if (lane == 0) {
    const float l = LSE[at], ls = LSE_s[at];
    if (ls == -INFINITY) {
      mode = 0;
    } else if (l == -INFINITY) {
      mode = 1;
      lse_new = ls;
    } else {
      mode = 2;
      const float m = fmaxf(l, ls);
      const float wa = exp2f(l - m), wb = exp2f(ls - m), sum = wa + wb;
      a = wa / sum;
      w = wb / sum;
      lse_new = m + log2f(sum);
    }
  }
  mode = __shfl_sync(0xffffffffu, mode, 0);
  if (mode == 0) return;
  a = __shfl_sync(0xffffffffu, a, 0);
  w = __shfl_sync(0xffffffffu, w, 0);
  float* o = O + row * d;
  const float* os = O_s + row * d;
  for (int k = lane; k < d; k += 32) o[k] = mode == 1 ? os[k] : a * o[k] + w * os[k];
  if (lane == 0) LSE[at] = lse_new;
}

template <bool kBf16>
__global__ void ring_round_kernel(const float* src, std::uint16_t* dst, std::size_t n) {
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = round16<kBf16>(src[i]);
}

__global__ void add_kernel(float* dst, const float* src, std::size_t n) {
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) dst[i] += src[i];
}

// SplitMix64: a counter-based value per element, the same whichever rank or kernel makes it.
__device__ __forceinline__ float hashed_uniform(unsigned long long seed, unsigned long long index) {
  unsigned long long z = seed + (index + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return float(z >> 40) * (1.0f / 16777216.0f) * 2.f - 1.f;  // 24 random bits → [−1, 1)
}

template <bool kBf16>
__global__ void fill_rows_kernel(std::uint16_t* dst, std::size_t B, std::size_t rows, std::size_t heads,
                                 std::size_t group, std::size_t d, std::size_t first_row, std::size_t N,
                                 unsigned long long seed, float scale) {
  const std::size_t n = B * rows * heads * d;
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  const std::size_t kv_heads = heads / group;
  for (std::size_t e = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride) {
    const std::size_t k = e % d, h = (e / d) % heads, i = (e / (d * heads)) % rows, b = e / (d * heads * rows);
    const unsigned long long global = ((b * N + first_row + i) * kv_heads + h / group) * d + k;
    dst[e] = round16<kBf16>(scale * hashed_uniform(seed, global));
  }
}

}  // namespace

void fill_rows_random(bool bf16, void* dst, std::size_t B, std::size_t rows, std::size_t heads, std::size_t group,
                      std::size_t d, std::size_t first_row, std::size_t N, unsigned long long seed, float scale,
                      cudaStream_t stream) {
  const std::size_t n = B * rows * heads * d;
  auto* out = static_cast<std::uint16_t*>(dst);
  if (bf16) fill_rows_kernel<true><<<grid_for(n, kBlock), kBlock, 0, stream>>>(out, B, rows, heads, group, d, first_row, N, seed, scale);
  else fill_rows_kernel<false><<<grid_for(n, kBlock), kBlock, 0, stream>>>(out, B, rows, heads, group, d, first_row, N, seed, scale);
  FLASHLAB_CUDA_CHECK_LAUNCH("fill_rows_kernel");
}

void ring_init(float* O, std::size_t o_elements, float* LSE, std::size_t rows, cudaStream_t stream) {
  announce("ring_init_kernel");
  ring_init_kernel<<<grid_for(o_elements > rows ? o_elements : rows, kBlock), kBlock, 0, stream>>>(O, o_elements, LSE,
                                                                                                   rows);
  FLASHLAB_CUDA_CHECK_LAUNCH("ring_init_kernel");
}

void ring_merge(float* O, float* LSE, const float* O_s, const float* LSE_s, int B, int c, int H, int d,
                cudaStream_t stream) {
  const long long rows = (long long)B * c * H;
  const unsigned grid = unsigned((rows + kBlock / 32 - 1) / (kBlock / 32));
  announce("ring_merge_kernel");
  ring_merge_kernel<<<grid, kBlock, 0, stream>>>(O, LSE, O_s, LSE_s, B, c, H, d);
  FLASHLAB_CUDA_CHECK_LAUNCH("ring_merge_kernel");
}

void ring_round(bool bf16, const float* src, void* dst, std::size_t n, cudaStream_t stream) {
  announce("ring_round_kernel");
  if (bf16) ring_round_kernel<true><<<grid_for(n, kBlock), kBlock, 0, stream>>>(src, static_cast<std::uint16_t*>(dst), n);
  else ring_round_kernel<false><<<grid_for(n, kBlock), kBlock, 0, stream>>>(src, static_cast<std::uint16_t*>(dst), n);
  FLASHLAB_CUDA_CHECK_LAUNCH("ring_round_kernel");
}

void add_into(float* dst, const float* src, std::size_t n, cudaStream_t stream) {
  announce("add_kernel");
  add_kernel<<<grid_for(n, kBlock), kBlock, 0, stream>>>(dst, src, n);
  FLASHLAB_CUDA_CHECK_LAUNCH("add_kernel");
}

}  // namespace flashlab::cuda::detail
