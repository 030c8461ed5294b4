// cuda/src/attention/attention_bwd_tc.cuh — pieces shared by the two fast tensor-core backward designs:
// attention_bwd_tc.cu (two kernels: dQ kernel, dK/dV kernel) and
// attention_bwd_tc_atomic.cu (one kernel over K_j/V_j blocks, dQ accumulated in fp32 by bulk
// asynchronous reductions in L2), and the Hopper version of the latter, attention_bwd_ws.cu.
// The Triton walkthrough, "Backward Pass": D_i = rowsum(dO_i ∘ O_i) is computed once, before either design.
// Internal to cuda/src; included by exactly those three .cu files. The device helpers and the
// preprocess kernel sit in an unnamed namespace (each translation unit gets its own copy, as
// they had before being shared); the host-side declarations are in detail proper.
#pragma once

#include "attention/launchers.hpp"
#include "core/common.hpp"
#include "core/tensor_core.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace flashlab::cuda::detail {

// BwdPointers, the workspace constants and the launchers are declared in launchers.hpp.

namespace {

/// Two 16-bit values in one register → two floats (exact).
template <bool kBf16>
__device__ __forceinline__ float2 unpack2(uint32_t r) {
  if constexpr (kBf16) {
    __nv_bfloat162 v;
    memcpy(&v, &r, 4);
    return __bfloat1622float2(v);
  } else {
    __half2 v;
    memcpy(&v, &r, 4);
    return __half22float2(v);
  }
}

/// Issue cp.async for rows [row0, row0 + ROWS) of one head into a swizzled SRAM tile
/// ([ROWS][HEAD_DIM], 16-bit), THREADS threads sharing the 16-byte chunks; rows ≥ N are
/// zero-filled (src-size 0), so no stale SRAM ever reaches an mma.
template <int HEAD_DIM, int ROWS, int THREADS>
__device__ __forceinline__ void load_tile_async(uint32_t smem, const uint16_t* head, std::size_t stride, int row0,
                                                int N) {
  constexpr int kChunks = HEAD_DIM / 8;
  static_assert(ROWS * kChunks % THREADS == 0, "tile chunks must divide among the threads");
#pragma unroll
  for (int it = 0; it < ROWS * kChunks / THREADS; ++it) {
    const int idx = int(threadIdx.x) + it * THREADS;
    const int r = idx / kChunks, c = idx % kChunks;
    const int row = row0 + r;
    const bool ok = row < N;
    const uint16_t* src = head + std::size_t(ok ? row : 0) * stride + c * 8;
    cp_async16(smem + swz<HEAD_DIM>(r, c), src, ok);
  }
}

/// Rows r and r + 8 of a warp's 16 × 8·NT fp32 accumulator (mma C fragments), times `scale`,
/// registers → HBM in the input dtype (4-byte stores) at out_head[row][0 .. 8·NT) (out_head
/// already points at the first column); rows ≥ N are not written.
template <int NT, bool kBf16>
__device__ __forceinline__ void store_rows16(uint16_t* out_head, std::size_t stride, int warp_row0, int N,
                                             const float (&acc)[NT][4], float scale, int g, int t) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = warp_row0 + g + 8 * r;
    if (row < N) {
      uint16_t* out = out_head + std::size_t(row) * stride + 2 * t;
#pragma unroll
      for (int n = 0; n < NT; ++n)
        *reinterpret_cast<uint32_t*>(out + 8 * n) =
            pack2<kBf16>(acc[n][2 * r] * scale, acc[n][2 * r + 1] * scale);
    }
  }
}

/// D preprocessing (the Triton walkthrough, "Backward Pass"). Grid (ceil(N / 64), H, B), 128 threads: one warp
/// per row (16 rows per warp), each lane reads two adjacent elements of O and dO per 64 columns.
/// D_i = rowsum(dO_i ∘ O_i) in fp32. HBM traffic: O and dO read once, D written once.
template <int HEAD_DIM, bool kBf16>
__global__ void __launch_bounds__(128) fast_bwd_preprocess_kernel(Problem p, const uint16_t* __restrict__ O,
                                                                  const uint16_t* __restrict__ dO,
                                                                  float* __restrict__ D) {
  const int h = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const std::size_t stride = p.row_stride(), base = p.head_offset(b, h), stat = p.stat_offset(b, h);
  for (int r = 0; r < 16; ++r) {
    const int row = int(blockIdx.x) * 64 + warp * 16 + r;
    if (row >= p.seq) break;
    float sum = 0.f;
#pragma unroll
    for (int k = 2 * lane; k < HEAD_DIM; k += 64) {  // O[row, k:k+2], dO[row, k:k+2]: HBM → registers
      const float2 o = unpack2<kBf16>(*reinterpret_cast<const uint32_t*>(O + base + std::size_t(row) * stride + k));
      const float2 g = unpack2<kBf16>(*reinterpret_cast<const uint32_t*>(dO + base + std::size_t(row) * stride + k));
      sum = fmaf(o.x, g.x, fmaf(o.y, g.y, sum));
    }
    for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);  // warp sum
    if (lane == 0) D[stat + row] = sum;
  }
}

/// Host side: launch the preprocess kernel (announced and checked).
template <int HEAD_DIM, bool kBf16>
void launch_fast_bwd_preprocess(const Problem& p, const BwdPointers& a, cudaStream_t stream) {
  announce("fast_bwd_preprocess_kernel");
  fast_bwd_preprocess_kernel<HEAD_DIM, kBf16><<<dim3((p.seq + 63) / 64, p.heads, p.batch), 128, 0, stream>>>(
      p, static_cast<const uint16_t*>(a.O), static_cast<const uint16_t*>(a.dO), a.D);
  FLASHLAB_CUDA_CHECK_LAUNCH("fast_bwd_preprocess_kernel");
}

}  // namespace
}  // namespace flashlab::cuda::detail
