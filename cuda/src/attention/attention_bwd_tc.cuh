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

#include <algorithm>
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

/// D preprocessing (the Triton walkthrough, "Backward Pass"): D_i = rowsum(dO_i ∘ O_i) in fp32,
/// into D [B, H, N] (LSE's layout). O and dO are [B, N, H, d]: row R = (b·N + n)·H + h starts at
/// element R·d, so the rows are taken in that memory order, d / 8 lanes per row each reading 16
/// bytes of O and of dO (a warp reads whole 128-byte lines), kPreprocessUnroll rows per thread in
/// flight before any sum, the lanes of a row summed by shuffles. With `zero4` > 0 the same launch
/// also writes zeros into the zero4 float4s at `zero` (the atomic designs' fp32 dQ accumulator,
/// only ever added into): its writes go out beside the reads of O and dO, with one launch fewer.
/// HBM traffic: O and dO read once, D written once (and the zeros).
constexpr int kPreprocessThreads = 256;
constexpr int kPreprocessUnroll = 4;
template <int HEAD_DIM, bool kBf16>
__global__ void __launch_bounds__(kPreprocessThreads)
    fast_bwd_preprocess_kernel(Problem p, const uint16_t* __restrict__ O, const uint16_t* __restrict__ dO,
                               float* __restrict__ D, float4* __restrict__ zero, std::size_t zero4) {
  constexpr int kLanes = HEAD_DIM / 8;  // lanes per row, 16 bytes each
  static_assert(HEAD_DIM % 8 == 0 && 32 % kLanes == 0, "a row's lanes must tile a warp");
  constexpr int kRowsPerPass = kPreprocessThreads / kLanes;
  const std::size_t threads = std::size_t(gridDim.x) * kPreprocessThreads;
  for (std::size_t k = blockIdx.x * std::size_t(kPreprocessThreads) + threadIdx.x; k < zero4; k += threads)
    zero[k] = make_float4(0.f, 0.f, 0.f, 0.f);
  const std::size_t rows = std::size_t(p.batch) * p.seq * p.heads;
  const int lane = int(threadIdx.x) % kLanes;
  // The block's first row of each pass is the same for all its threads, so every warp runs the
  // loop (and its shuffles) the same number of times; rows past the end sum nothing.
  for (std::size_t first = std::size_t(blockIdx.x) * kRowsPerPass * kPreprocessUnroll; first < rows;
       first += std::size_t(gridDim.x) * kRowsPerPass * kPreprocessUnroll) {
    uint4 o[kPreprocessUnroll], g[kPreprocessUnroll];
#pragma unroll
    for (int u = 0; u < kPreprocessUnroll; ++u) {
      const std::size_t row = first + std::size_t(u) * kRowsPerPass + threadIdx.x / kLanes;
      o[u] = g[u] = make_uint4(0u, 0u, 0u, 0u);
      if (row < rows) {
        o[u] = *reinterpret_cast<const uint4*>(O + row * HEAD_DIM + 8 * lane);
        g[u] = *reinterpret_cast<const uint4*>(dO + row * HEAD_DIM + 8 * lane);
      }
    }
#pragma unroll
    for (int u = 0; u < kPreprocessUnroll; ++u) {
      const uint32_t ow[4] = {o[u].x, o[u].y, o[u].z, o[u].w}, gw[4] = {g[u].x, g[u].y, g[u].z, g[u].w};
      float sum = 0.f;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 a = unpack2<kBf16>(ow[e]), b = unpack2<kBf16>(gw[e]);
        sum = fmaf(a.x, b.x, fmaf(a.y, b.y, sum));
      }
#pragma unroll
      for (int off = kLanes / 2; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
      const std::size_t row = first + std::size_t(u) * kRowsPerPass + threadIdx.x / kLanes;
      if (lane == 0 && row < rows) {
        const std::size_t h = row % std::size_t(p.heads), token = row / std::size_t(p.heads);
        const std::size_t n = token % std::size_t(p.seq), b = token / std::size_t(p.seq);
        D[(b * std::size_t(p.heads) + h) * std::size_t(p.seq) + n] = sum;
      }
    }
  }
}

/// Host side: launch the preprocess kernel (announced and checked); with `zero` and `zero_floats`
/// (a multiple of 4, 16-byte aligned) it also zeroes those floats.
template <int HEAD_DIM, bool kBf16>
void launch_fast_bwd_preprocess(const Problem& p, const BwdPointers& a, cudaStream_t stream, float* zero = nullptr,
                                std::size_t zero_floats = 0) {
  const std::size_t rows = std::size_t(p.batch) * p.seq * p.heads;
  constexpr std::size_t kRowsPerBlock = std::size_t(kPreprocessThreads) / (HEAD_DIM / 8) * kPreprocessUnroll;
  // One pass per block where that is a grid of at most 2^20 blocks, else a grid-stride loop; at least
  // enough blocks that the zeros take 16 float4s a thread or fewer.
  const std::size_t for_rows = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  const std::size_t for_zeros = (zero_floats / 4 + 16 * kPreprocessThreads - 1) / (16 * kPreprocessThreads);
  const unsigned blocks = unsigned(std::max<std::size_t>(1, std::min<std::size_t>(std::max(for_rows, for_zeros), 1u << 20)));
  announce("fast_bwd_preprocess_kernel");
  fast_bwd_preprocess_kernel<HEAD_DIM, kBf16><<<blocks, kPreprocessThreads, 0, stream>>>(
      p, static_cast<const uint16_t*>(a.O), static_cast<const uint16_t*>(a.dO), a.D, reinterpret_cast<float4*>(zero),
      zero_floats / 4);
  FLASHLAB_CUDA_CHECK_LAUNCH("fast_bwd_preprocess_kernel");
}

}  // namespace
}  // namespace flashlab::cuda::detail
