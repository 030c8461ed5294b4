// cuda/src/attention/bwd_d256_dq.cuh — the dQ accumulator's two ends, shared by the two backwards at
// head dim d = 256 (attention_bwd_d256.cu: mma, Br = 32; attention_bwd_d256_ws.cu: wgmma, Br = 64).
// Both add each step's dQ_i partial into an fp32 accumulator TILED per (b, h, query tile i), BLOCK_M
// rows × 256 columns each, in the fragment order of the kernel's own warps; they differ only in that
// order. Here: the zeroed accumulator and D preprocessing before the main kernel
// (begin_d256_backward), and after it dQ = scale · accumulator → 16 bits in [B, N, H, d]
// (launch_d256_dq_convert: the shared convert of attention_bwd_tc.cuh), the fragment order given
// by the kernel's Layout:
//   Layout::BLOCK_M, Layout::kHeadDim (256)     the tile's query rows and columns;
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

/// Before the main kernel: D_i = rowsum(dO_i ∘ O_i) (the Triton walkthrough, "Backward Pass") and,
/// in the same launch, the accumulator zeroed (it is only ever added into).
template <class Layout, bool kBf16>
void begin_d256_backward(const Problem& p, const BwdPointers& a, cudaStream_t stream) {
  launch_fast_bwd_preprocess<kD256HeadDim, kBf16>(p, a, stream, a.dQaccum, d256_dq_accum_numel<Layout>(p));
}

/// After the main kernel: dQ = scale · dQaccum → 16 bits, [B, N, H, d], the shared convert
/// (attention_bwd_tc.cuh) in Layout's order.
template <class Layout, bool kBf16>
void launch_d256_dq_convert(const Problem& p, const BwdPointers& a, cudaStream_t stream) {
  static_assert(Layout::kHeadDim == kD256HeadDim, "a d = 256 layout");
  launch_dq_convert<Layout, kBf16>(p, a, stream);
}

}  // namespace
}  // namespace flashlab::cuda::detail
