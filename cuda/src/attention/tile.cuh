// Tile helpers shared by the kernels (internal, device code only).
//
// Every HBM → SRAM tile load goes through load_rows(): a whole tile of `rows` tokens × d floats,
// consecutive threads reading consecutive floats of one row (coalesced: a row of d fp32 is
// d·4 bytes = whole 32-byte sectors for d = 48, 64, 128), rows past N filled with 0.
// Loads use __ldcg ("cache global": L2 only, not L1) so that every tile load the model counts
// reaches L2 and is seen by the profiler; with L1 caching two blocks on one SM could share a
// K_j load and L2 would see less than the algorithm requests.
#pragma once

#include "core/common.hpp"

#include <cmath>

namespace flashlab::cuda::detail {

/// -inf as a float constant usable in device code.
__device__ __forceinline__ float neg_inf() { return -INFINITY; }

/// Loads rows [row0, row0 + rows) of one head (d floats each, `stride` floats apart) into a
/// shared tile with pitch `ld`; rows at or past `seq` become zeros. HBM → SRAM.
__device__ __forceinline__ void load_rows(float* __restrict__ tile, int ld, const float* __restrict__ head_base,
                                          std::size_t stride, int row0, int rows, int seq, int d) {
  for (int idx = threadIdx.x; idx < rows * d; idx += blockDim.x) {
    const int r = idx / d;
    const int k = idx % d;
    const int row = row0 + r;
    tile[r * ld + k] = row < seq ? __ldcg(head_base + std::size_t(row) * stride + k) : 0.f;
  }
}

/// Loads `rows` statistics (LSE_i or D_i) starting at row0; rows past N become 0. HBM → SRAM.
__device__ __forceinline__ void load_stats(float* __restrict__ dst, const float* __restrict__ src, int row0, int rows,
                                           int seq) {
  for (int r = threadIdx.x; r < rows; r += blockDim.x) dst[r] = row0 + r < seq ? __ldcg(src + row0 + r) : 0.f;
}

/// Loads `rows` values of LSE_i starting at row0 like load_stats(), but reads LSE_i = −inf (a row
/// that saw no key: l_i = 0 in the forward) as +inf, so P_ij = 2^(S_ij − LSE_i) = 0 for that row
/// instead of 2^(+inf) — the same guard as the reference's backward. HBM → SRAM.
__device__ __forceinline__ void load_lse(float* __restrict__ dst, const float* __restrict__ src, int row0, int rows,
                                         int seq) {
  for (int r = threadIdx.x; r < rows; r += blockDim.x) {
    const float v = row0 + r < seq ? __ldcg(src + row0 + r) : 0.f;
    dst[r] = v == neg_inf() ? INFINITY : v;
  }
}

/// Stores rows [row0, row0 + rows) of a shared tile to one head, skipping rows past N, each
/// element multiplied by row_scale[r] (pass nullptr for 1). SRAM → HBM.
__device__ __forceinline__ void store_rows(float* __restrict__ head_base, std::size_t stride, const float* __restrict__ tile,
                                           int ld, const float* __restrict__ row_scale, int row0, int rows, int seq,
                                           int d) {
  for (int idx = threadIdx.x; idx < rows * d; idx += blockDim.x) {
    const int r = idx / d;
    const int k = idx % d;
    const int row = row0 + r;
    if (row < seq) head_base[std::size_t(row) * stride + k] = tile[r * ld + k] * (row_scale ? row_scale[r] : 1.f);
  }
}

/// Fills a shared tile with `value` (no HBM traffic).
__device__ __forceinline__ void fill_tile(float* tile, int count, float value) {
  for (int idx = threadIdx.x; idx < count; idx += blockDim.x) tile[idx] = value;
}

/// Dot product of two rows of length d held in shared memory (fp32, fused multiply-adds).
__device__ __forceinline__ float dot_row(const float* __restrict__ a, const float* __restrict__ b, int d) {
  float acc = 0.f;
  for (int k = 0; k < d; ++k) acc = fmaf(a[k], b[k], acc);
  return acc;
}

/// Is score (row, col) visible? Out of sequence → no; causal and col > row → no.
__device__ __forceinline__ bool visible(const Problem& p, int row, int col) {
  return row < p.seq && col < p.seq && (!p.causal || col <= row);
}

}  // namespace flashlab::cuda::detail
