/// @file stream.hpp
/// @brief Host API of the clear fp32 STREAM kernels: estimate, apply, trace on the GPU.
///
/// The GPU level of "Real-Time Sparse Tracing at Million-Token Context" (docs/stream.md): the same
/// procedure as `flashlab::ref::stream` (reference/include/flashlab/reference/stream.hpp), in the
/// same names — b_q, b_k, n_q, n_k, n_it, C_blk, branch, representative, τ — one CUDA thread block
/// per (query block q, head). Inputs are float32 arrays of shape `[T, H, d]` (row-major, tokens
/// outermost; H = 1 is the reference's `T × d` matrix); every head uses the same block mask. The
/// index tensor I is `[H, n_q, k]`, 0-based key blocks, −1 = empty, in τ order (best first).
///
/// Guarantees (tested in tests/cuda/test_cuda_stream.cpp): I is bitwise identical run to run (no
/// atomics, fixed-order dot products and reductions); it equals the reference's I wherever every
/// score is exact in fp32 (small-integer inputs), ties included; on other inputs it can differ
/// only where two candidate scores lie within fp32 rounding of each other, which `margins` lets
/// a caller detect. Each call uploads its inputs, poisons its outputs, checks every CUDA call and
/// downloads the results; errors throw ref::stream::StreamError (parameters) or CudaError.
#pragma once

#include "flashlab/cuda/options.hpp"
#include "flashlab/cuda/profiler.hpp"
#include "flashlab/reference/stream.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace flashlab::cuda::stream {

/// A float32 `[T, H, d]` array on the host (not owned).
struct HostHeads {
  const float* data = nullptr;  ///< T·H·d floats, row-major
  std::size_t heads = 1;        ///< H
  std::size_t dim = 0;          ///< d (d_v for V)
};

/// Largest head dim and block sizes of the clear kernels (one Q_q and one K_r tile in shared
/// memory, fp32, with a one-float row pad).
inline constexpr std::size_t kMaxHeadDim = 256;
/// Largest b_q or b_k of the clear kernels.
inline constexpr std::size_t kMaxBlock = 128;

/// What the estimate returns.
struct EstimateOutput {
  std::size_t k = 0;                  ///< columns of I
  std::vector<std::int64_t> indices;  ///< I, [H, n_q, k]
  std::vector<float> scores;          ///< score(q, I[q, j]) beside each entry (NaN for empty; NaN inputs give −inf)
  /// Per (head, query block): the smallest score gap at a decision τ made by score — between the
  /// k-th kept and the best dropped candidate of every round, and between neighbours of the final
  /// list. +inf when no decision compared two scores. A gap within the fp32 rounding bound of a
  /// score means another summation order could decide differently.
  std::vector<float> margins;
};

/// C_blk packed as the GPU kernels read it: n_q rows of ⌈n_k/64⌉ 64-bit words, bit r % 64 of word
/// r / 64 = C_blk[q, r] with causality ANDed in. Empty for a causal-only mask (nothing is stored).
std::vector<std::uint64_t> pack_block_mask(const ref::stream::BlockMask& mask);

/// Mask estimation on the GPU (the reference's `stream_estimate`, fp32 scores): I = top-k key
/// blocks per query block by hierarchical branch refinement under τ. Q and K are `[T, H, d]` with
/// T = mask.geometry().T.
EstimateOutput stream_estimate(const HostHeads& Q, const HostHeads& K, const ref::stream::BlockMask& mask,
                               std::size_t k);

/// Mask application on the GPU (the reference's `stream_apply`): sparse attention over the
/// blocks of I ([H, n_q, k]) with online softmax, unscaled logits ⟨Q_t, K_s⟩, token-level
/// causality inside a block. Returns O, `[T, H, d_v]`; rows with no valid kept key are 0, a NaN
/// logit makes its row NaN. Indices that break the validity invariant are refused.
std::vector<float> stream_apply(const HostHeads& Q, const HostHeads& K, const HostHeads& V,
                                const ref::stream::BlockMask& mask, const std::vector<std::int64_t>& indices,
                                std::size_t k);

/// One edge record of a head: the reference's `Edge` (q, r, slot, score, mass, value_norm) and
/// the head it belongs to.
struct HeadEdge {
  std::size_t head = 0;         ///< head h
  ref::stream::Edge edge;       ///< the record, fields as in the reference
};

/// Trace emission on the GPU: runs the application, then recomputes each kept block's weights
/// with the final softmax statistics (μ, λ) of its rows and streams the records to the host in
/// chunks of at most `chunk_query_blocks` query blocks (so device memory for records is bounded by
/// chunk_query_blocks·k records). `sink` receives each chunk in (head, q, slot) order; the
/// concatenation is the reference's edge list per head. Returns O like stream_apply.
std::vector<float> stream_trace(const HostHeads& Q, const HostHeads& K, const HostHeads& V,
                                const ref::stream::BlockMask& mask, const std::vector<std::int64_t>& indices,
                                std::size_t k, std::size_t chunk_query_blocks,
                                const std::function<void(const std::vector<HeadEdge>&)>& sink);

/// One measured STREAM kernel: its name and what CUPTI counted for its single launch.
struct MeasuredStreamKernel {
  std::string kernel;       ///< "stream_estimate_kernel" or "stream_apply_kernel"
  KernelCounters counters;  ///< L2 / DRAM bytes and duration (profiler.hpp)
};

/// Measures the memory traffic of the clear estimate and apply kernels on these inputs with the
/// CUPTI Range Profiler: one metric per session, each session one launch of the kernel right
/// after an L2 flush (a cudaMemset of `flush_bytes`, outside the measured range). The apply uses
/// the estimate's I. Requires permission to read the performance counters. `indices`, if given,
/// receives I ([H, n_q, k]).
std::vector<MeasuredStreamKernel> measure_stream_traffic(const HostHeads& Q, const HostHeads& K, const HostHeads& V,
                                                         const ref::stream::BlockMask& mask, std::size_t k,
                                                         std::vector<std::int64_t>* indices = nullptr,
                                                         std::size_t flush_bytes = std::size_t(256) << 20);

}  // namespace flashlab::cuda::stream
