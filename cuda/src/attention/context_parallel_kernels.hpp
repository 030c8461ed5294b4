// Launchers of the GPU ring's small kernels (internal; context_parallel_kernels.cu). Device
// pointers, layouts as the fast kernels: rows [B, c, H, d], LSE [B, H, c] fp32 base 2. Each
// launches on `stream` and checks the launch; `bf16` picks bf16 or fp16 for 16-bit operands.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace flashlab::cuda::detail {

/// O[0 … o_elements) = 0 and LSE[0 … rows) = −inf: a running result that has seen no key.
void ring_init(float* O, std::size_t o_elements, float* LSE, std::size_t rows, cudaStream_t stream);

/// Merges a block's partial (O_s fp32 [B, c, H, d], unrounded; LSE_s [B, H, c]) into the running
/// fp32 O and LSE of the same query chunk, by LSE in base 2 (context_parallel.hpp, merge_partial).
void ring_merge(float* O, float* LSE, const float* O_s, const float* LSE_s, int B, int c, int H, int d,
                cudaStream_t stream);

/// dst[i] = src[i] rounded to 16 bits (nearest even), n elements.
void ring_round(bool bf16, const float* src, void* dst, std::size_t n, cudaStream_t stream);

/// dst[i] += src[i], n fp32 elements.
void add_into(float* dst, const float* src, std::size_t n, cudaStream_t stream);

}  // namespace flashlab::cuda::detail

namespace flashlab::cuda::detail {

/// Fills rows [first_row, first_row + rows) of a global `[B, N, heads, d]` tensor into `dst`
/// (`[B, rows, heads, d]`, 16 bits) with seeded values in [−scale, scale): element (b, n, h, k)
/// gets the value of global element ((b·N + n)·(heads / group) + h / group)·d + k, so a K/V
/// tensor expanded to H heads (group = H / H_kv) holds the same values as the H_kv-head one,
/// and a rank's chunk holds the same values as the rows of the whole tensor (benchmarks).
void fill_rows_random(bool bf16, void* dst, std::size_t B, std::size_t rows, std::size_t heads, std::size_t group,
                      std::size_t d, std::size_t first_row, std::size_t N, unsigned long long seed, float scale,
                      cudaStream_t stream);

}  // namespace flashlab::cuda::detail
