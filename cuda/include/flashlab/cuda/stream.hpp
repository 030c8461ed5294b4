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

/// A `[T, H, d]` array on the host (not owned): the one host view of every STREAM entry, fp32
/// (HostHeads) or 16-bit bit patterns (HostHeads16, stream_fast.hpp).
template <typename T>
struct HostHeadsOf {
  const T* data = nullptr;  ///< T·H·d values, row-major (tokens outermost)
  std::size_t heads = 1;    ///< H
  std::size_t dim = 0;      ///< d (d_v for V)
};

/// A float32 `[T, H, d]` array on the host (not owned).
using HostHeads = HostHeadsOf<float>;

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

/// One measured STREAM kernel: its name and what CUPTI counted for its single launch (the probe's
/// one result type, profiler.hpp).
using MeasuredStreamKernel = MeasuredKernel;

/// Measures the memory traffic of the clear estimate and apply kernels on these inputs with the
/// one CUPTI probe of every family: one metric per session, each kernel launched once per
/// session right after an L2 flush of `flush_bytes` (written, then read back). The apply uses
/// the estimate's I. Requires permission to read the performance counters. `indices`, if given,
/// receives I ([H, n_q, k]).
std::vector<MeasuredStreamKernel> measure_stream_traffic(const HostHeads& Q, const HostHeads& K, const HostHeads& V,
                                                         const ref::stream::BlockMask& mask, std::size_t k,
                                                         std::vector<std::int64_t>* indices = nullptr,
                                                         std::size_t flush_bytes = std::size_t(256) << 20);

/// Edge records on the caller's device memory: the clear application on `stream` (a cudaStream_t
/// passed as void*; nullptr: the legacy default stream) for the final softmax statistics (μ, λ)
/// of every row, then one record per entry of I — `[H, n_q, k]` in row-major order (head, q,
/// slot), an empty entry (−1) as r = −1 with zero weights — in the reference's Edge layout
/// (48 bytes: q, r, slot int64; score, mass, value_norm double). No host copy, no allocation, no
/// synchronisation: safe from several host threads on several streams at once and under CUDA
/// graph capture. Q, K are fp32 `[T, H, d]`, V fp32 `[T, H, d_v]`, I int64 `[H, n_q, k]` (it must
/// satisfy the reference's validity invariant under `mask`: the host entries check it, this one
/// cannot); O, fp32 `[T, H, d_v]`, receives the application's output, or may be nullptr (it then
/// goes to the workspace). `workspace`: stream_trace_workspace_bytes() bytes, 4-byte aligned. The
/// limits are the clear kernels' (stream_trace()'s), and k, H ≤ 65535. Throws
/// ref::stream::StreamError for bad parameters or pointers, CudaError if a launch fails.
void stream_trace_device(const ref::stream::BlockMask& mask, std::size_t heads, std::size_t d, std::size_t dv,
                         std::size_t k, const float* Q, const float* K, const float* V, const std::int64_t* I, float* O,
                         ref::stream::Edge* edges, void* workspace, void* stream = nullptr);

/// Bytes of device scratch stream_trace_device() needs for T = g.T tokens of `heads` heads: μ and
/// λ of every row (2·T·H floats) and room for O when the caller passes none (T·H·d_v floats).
std::size_t stream_trace_workspace_bytes(const ref::stream::Geometry& g, std::size_t heads, std::size_t dv);

/// One edge record in 24 bytes (the C ABI's flashlab_stream_edge): the reference's Edge with
/// 32-bit indices and float weights.
struct CompactEdge {
  std::int32_t q;      ///< query block
  std::int32_t r;      ///< key block (−1: an empty entry of I)
  std::int32_t slot;   ///< position in I[q, :]
  float score;         ///< representative score
  float mass;          ///< Σ p over the block pair
  float value_norm;    ///< ‖Σ p·V‖₂ over the block pair
};

/// Narrows `count` records written by stream_trace_device() (device memory) into CompactEdge
/// records at `out` (device memory, 4-byte aligned), on `stream`: indices as they are (they fit
/// 32 bits wherever n_q and n_k do), weights rounded to float. No host copy, no allocation, no
/// synchronisation. Throws ref::stream::StreamError for a bad pointer, CudaError if the launch fails.
void narrow_edges_device(const ref::stream::Edge* edges, CompactEdge* out, std::size_t count, void* stream = nullptr);

}  // namespace flashlab::cuda::stream

namespace flashlab::cuda {

/// Which implementation of the STREAM kernels runs.
enum class StreamKernel {
  clear,  ///< the clear fp32 kernels (flashlab/cuda/stream.hpp)
  fast    ///< the fast 16-bit tensor-core kernels (flashlab/cuda/stream_fast.hpp, stream_fast_estimate.hpp)
};

/// "clear" or "fast" (the names the `--kernel` flags take).
const char* to_string(StreamKernel kernel);

}  // namespace flashlab::cuda

namespace flashlab::cuda::stream {

/// Mask estimation with the kernel of `kernel` on float inputs: the clear fp32 estimate, or the
/// fast bf16 estimate on Q and K rounded to bf16 (round_to(x, bf16) of every value: compare the
/// result with a reference run on those rounded values). Limits as each kernel states them.
EstimateOutput stream_estimate(StreamKernel kernel, const HostHeads& Q, const HostHeads& K,
                               const ref::stream::BlockMask& mask, std::size_t k);

/// Mask application with the kernel of `kernel` on float inputs: the clear fp32 apply, or the
/// fast bf16 apply on Q, K, V rounded to bf16, its bf16 output widened to float (exact).
std::vector<float> stream_apply(StreamKernel kernel, const HostHeads& Q, const HostHeads& K, const HostHeads& V,
                                const ref::stream::BlockMask& mask, const std::vector<std::int64_t>& indices,
                                std::size_t k);

}  // namespace flashlab::cuda::stream
