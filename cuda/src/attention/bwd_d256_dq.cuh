// cuda/src/attention/bwd_d256_dq.cuh — the dQ accumulator's two ends, shared by the two backwards at
// head dim d = 256 (attention_bwd_d256.cu: mma, Br = 32; attention_bwd_d256_ws.cu: wgmma, Br = 64).
// Both add each step's dQ_i partial into an fp32 accumulator TILED per (b, h, query tile i), BLOCK_M
// rows × 256 columns each, in the fragment order of the kernel's own warps; they differ only in that
// order. Here: the zeroed accumulator and D preprocessing before the main kernel
// (begin_d256_backward), and after it dQ = scale · accumulator → 16 bits in [B, N, H, d]
// (d256_dq_convert_kernel, launch_d256_dq_convert), the fragment order given by the kernel's
// Layout:
//   Layout::BLOCK_M                             the tile's query rows;
//   Layout::place(f, row, col) (device)         float4 number f of a tile holds the accumulator's
//                                               elements (row, col), (row, col + 1), (row + 8, col),
//                                               (row + 8, col + 1), row counted in the tile.
// Internal to cuda/src; included by exactly those two .cu files (each gets its own copy: unnamed
// namespace, as attention_bwd_tc.cuh).
#pragma once

#include "attention/attention_bwd_tc.cuh"
#include "attention/launchers.hpp"
#include "core/common.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace flashlab::cuda::detail {
namespace {

constexpr int kD256HeadDim = 256;

/// Floats of the tiled accumulator: B·H·⌈N / BLOCK_M⌉ tiles of BLOCK_M·256.
template <class Layout>
std::size_t d256_dq_accum_numel(const Problem& p) {
  const std::size_t tiles = std::size_t(p.batch) * p.heads * ((p.seq + Layout::BLOCK_M - 1) / Layout::BLOCK_M);
  return tiles * Layout::BLOCK_M * kD256HeadDim;
}

/// Before the main kernel: the accumulator zeroed (it is only ever added into) and D_i =
/// rowsum(dO_i ∘ O_i) (the Triton walkthrough, "Backward Pass").
template <class Layout, bool kBf16>
void begin_d256_backward(const Problem& p, const BwdPointers& a, cudaStream_t stream) {
  FLASHLAB_CUDA_CHECK(cudaMemsetAsync(a.dQaccum, 0, d256_dq_accum_numel<Layout>(p) * sizeof(float), stream));
  launch_fast_bwd_preprocess<kD256HeadDim, kBf16>(p, a, stream);
}

/// dQ = scale · dQaccum → 16 bits, [B, N, H, d], from Layout's tiled order. One thread per float4
/// (grid-stride); rows ≥ N (the last tile's padding) are skipped.
template <class Layout, bool kBf16>
__global__ void __launch_bounds__(256) d256_dq_convert_kernel(Problem p, const float4* __restrict__ acc,
                                                              uint16_t* __restrict__ dQ, std::size_t n4) {
  constexpr int BM = Layout::BLOCK_M, kTile4 = BM * kD256HeadDim / 4;
  const int Tr = (p.seq + BM - 1) / BM;
  for (std::size_t k = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; k < n4;
       k += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t tile = k / kTile4;
    int r = 0, col = 0;
    Layout::place(int(k % kTile4), r, col);
    const int i = int(tile % Tr), h = int(tile / Tr % p.heads), b = int(tile / Tr / p.heads);
    const int row = i * BM + r;
    const float4 v = acc[k];
    uint16_t* out = dQ + p.head_offset(b, h) + col;
    if (row < p.seq)
      *reinterpret_cast<uint32_t*>(out + std::size_t(row) * p.row_stride()) = pack2<kBf16>(v.x * p.scale, v.y * p.scale);
    if (row + 8 < p.seq)
      *reinterpret_cast<uint32_t*>(out + std::size_t(row + 8) * p.row_stride()) =
          pack2<kBf16>(v.z * p.scale, v.w * p.scale);
  }
}

/// After the main kernel: the convert kernel over the whole accumulator (announced and checked).
template <class Layout, bool kBf16>
void launch_d256_dq_convert(const Problem& p, const BwdPointers& a, cudaStream_t stream) {
  const std::size_t n4 = d256_dq_accum_numel<Layout>(p) / 4;
  const unsigned blocks = unsigned(std::min<std::size_t>((n4 + 255) / 256, 4096));
  announce("d256_dq_convert_kernel");
  d256_dq_convert_kernel<Layout, kBf16><<<blocks, 256, 0, stream>>>(p, reinterpret_cast<const float4*>(a.dQaccum),
                                                                    static_cast<uint16_t*>(a.dQ), n4);
  FLASHLAB_CUDA_CHECK_LAUNCH("d256_dq_convert_kernel");
}

}  // namespace
}  // namespace flashlab::cuda::detail
