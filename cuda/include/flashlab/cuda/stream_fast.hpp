/// @file stream_fast.hpp
/// @brief The fast STREAM mask application on tensor cores: bf16 or fp16 inputs, fp32
/// accumulation, `mma.sync` m16n8k16 (cuda/src/stream/stream_fast_apply.cu). No CUDA types here:
/// 16-bit values travel as `uint16_t` bit patterns, so CPU-only code may include this header.
///
/// The same semantics as the reference's `stream_apply` (reference/include/flashlab/reference/
/// stream.hpp) and the clear kernel (flashlab/cuda/stream.hpp): for every query block q,
/// attention over the key blocks of I[q, :] only, unscaled logits ⟨Q_t, K_s⟩ with natural
/// exponentials (pre-scale Q by 1/√d for the usual softmax scale), token-level causality s ≤ t
/// inside a block, rows with no valid kept key → 0, a NaN logit of a valid pair → a NaN row.
/// Computed in FA2 order (one pass over the kept K_r, V_r with online softmax, O_q normalised
/// once at the end); S = Q_q K_rᵀ and O += P V_r on tensor cores, P rounded to the input dtype,
/// the softmax statistics in fp32. The order in which a query block visits its kept blocks is
/// ascending r, not I's τ order: results differ from the reference by rounding only.
///
/// Layout: Q, K, V, O are `[T, H, d]` (tokens outermost), d ∈ {64, 128}; every head h uses its
/// own row I[h, q, :] of the index tensor I, `[H, n_q, k]` int64, −1 = empty. b_q = b_k =
/// kFastStreamBlock. Neighbouring query blocks are processed together by one thread block
/// (`group` of them), which loads each K_r, V_r of the union of their rows of I once.
#pragma once

#include "flashlab/cuda/stream.hpp"
#include "flashlab/reference/stream.hpp"
#include "flashlab/reference/traffic.hpp"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace flashlab::cuda::stream {

/// b_q = b_k of the fast kernels (compile-time tiles: four warps of 16 query rows per block).
inline constexpr std::size_t kFastStreamBlock = 64;
/// Largest k the fast apply takes (its per-thread-block schedule of kept blocks lives in SRAM).
inline constexpr std::size_t kFastStreamMaxK = 1024;

/// A 16-bit `[T, H, d]` array on the host (not owned), bit patterns of the call's dtype.
using HostHeads16 = HostHeadsOf<std::uint16_t>;

/// What a fast apply launch works on.
struct FastApplyShape {
  std::size_t T = 0;                    ///< tokens
  std::size_t heads = 1;                ///< H
  std::size_t dim = 0;                  ///< d of Q, K, V and O (64 or 128)
  std::size_t k = 0;                    ///< columns of I (1 … kFastStreamMaxK)
  ref::Dtype dtype = ref::Dtype::bf16;  ///< bf16 or fp16
  /// Query blocks per thread block (1 or 2); 0 = the default, fast_apply_default_group().
  int group = 0;
};

/// The query blocks per thread block the fast apply uses when FastApplyShape::group is 0.
int fast_apply_default_group();

/// Checks a shape against the fast apply's limits: T ≥ 1, 1 ≤ H ≤ 65535, d ∈ {64, 128}, 1 ≤ k ≤
/// kFastStreamMaxK, dtype bf16 or fp16, group ∈ {0, 1, 2}, T·H within 32-bit indices. Throws
/// ref::stream::StreamError naming the parameter, the limit and a hint.
void check_fast_apply(const FastApplyShape& shape);

/// Device memory the fast apply needs besides Q, K, V, O and I, in bytes: none (its schedule
/// lives in SRAM). Stated as a function so that benchmarks report it, not assume it.
std::size_t fast_apply_workspace_bytes(const FastApplyShape& shape);

/// The fast apply on device pointers (for benchmarks): Q, K, V, O of `shape` (16-bit), I
/// `[H, n_q, k]` int64 on the device, launched on `stream` (a cudaStream_t; nullptr = the default
/// stream), asynchronous. I must satisfy the reference's validity invariant (every entry −1 or
/// a causally valid block of its row, no duplicates in a row): the host entry checks it, this
/// one does not. Throws StreamError for a bad shape and CudaError for a failed launch.
void stream_fast_apply_device(const FastApplyShape& shape, const void* Q, const void* K, const void* V,
                              const std::int64_t* I, void* O, void* stream = nullptr);

/// The fast apply on host arrays: checks the shape (b_q = b_k = kFastStreamBlock, T from the
/// mask's geometry) and I with the reference's validate_indices (under `mask`, so a user mask's
/// zero blocks are refused in I), uploads, poisons O, runs and returns O, `[T, H, d]` 16-bit.
/// Throws ref::stream::StreamError for bad parameters or indices, CudaError for CUDA failures.
std::vector<std::uint16_t> stream_fast_apply(ref::Dtype dtype, const HostHeads16& Q, const HostHeads16& K,
                                             const HostHeads16& V, const ref::stream::BlockMask& mask,
                                             const std::vector<std::int64_t>& indices, std::size_t k, int group = 0);

/// The heads one launch of a fast STREAM kernel works on: heads `first` … `first + count − 1` of the
/// `[T, H, d]` inputs. The launch's index tensor and records hold those heads only, in head order
/// (`[count, n_q, k]`), so a pipeline can launch one head (or a few) at a time and get, for each
/// head, the rows and records an all-heads launch gives it, bit for bit.
struct HeadRange {
  std::size_t first = 0;  ///< first head of the launch
  std::size_t count = 0;  ///< heads in the launch; 0 = every head from `first` on
};

/// `range` resolved against H heads (count 0 → H − first); throws ref::stream::StreamError when
/// it is empty or runs past H.
HeadRange resolve_head_range(HeadRange range, std::size_t heads);

/// One edge record of the fast trace (24 bytes; the C ABI's flashlab_stream_edge field for field):
/// the reference's Edge (reference/…/stream.hpp) in 32-bit fields.
struct FastEdge {
  std::int32_t q = 0;       ///< query block
  std::int32_t r = -1;      ///< key block, −1 for an empty entry of I (then the weights are 0)
  std::int32_t slot = 0;    ///< position in I[h, q, :]
  float score = 0.f;        ///< the largest logit ⟨Q_t, K_s⟩ of a valid pair of the block pair
  float mass = 0.f;         ///< Σ p_{t,s} over the block pair under the sparse softmax
  float value_norm = 0.f;   ///< ‖Σ_t Σ_s p_{t,s} V_s‖₂ over the block pair
};

/// The fast trace on device pointers: one FastEdge per entry of I, `edges` holding H·n_q·k
/// records in I's order (head, query block, slot) whatever the schedule. With a head range,
/// Q, K, V are still the whole `[T, H, d]` inputs, while I and `edges` hold the range's heads only
/// (`range.count·n_q·k` entries each, in head order). Computes the same
/// quantities as the clear trace (stream_trace_device) on tensor cores: per (query block, head)
/// a first pass over the kept K_r for each row's softmax statistics, a second over K_r and V_r
/// for the records (P V_r with P rounded to the input dtype, as the fast apply's); no O is
/// written, no workspace, no allocation, no synchronisation. Shape limits as
/// check_fast_apply() (`group` is not read). I must satisfy the reference's validity
/// invariant, unchecked here (the host entry checks it). With `q_count` > 0 only query blocks
/// q_first … q_first + q_count − 1 of each head are traced (q_count = 0: from q_first to the last),
/// their records written where a whole launch writes them, the others untouched: a pipeline can
/// copy the first records out while the rest are traced. With `value_norm` false V is not read
/// (it may be null) and every record's value_norm is NaN: the second pass reads K only, and score
/// and mass are the same bits as with it (for a store that keeps key blocks and mass only).
/// Throws StreamError for a bad shape or query-block range, CudaError for a failed launch.
void stream_fast_trace_device(const FastApplyShape& shape, const void* Q, const void* K, const void* V,
                              const std::int64_t* I, FastEdge* edges, void* stream = nullptr, HeadRange range = {},
                              std::size_t q_first = 0, std::size_t q_count = 0, bool value_norm = true);

/// The fast trace on host arrays, with the fast apply's checks (shape, b_q = b_k =
/// kFastStreamBlock, I validated under `mask` per head): uploads, runs, and returns the H·n_q·k
/// records. Throws ref::stream::StreamError for bad parameters or indices, CudaError for CUDA
/// failures.
std::vector<FastEdge> stream_fast_trace(ref::Dtype dtype, const HostHeads16& Q, const HostHeads16& K,
                                        const HostHeads16& V, const ref::stream::BlockMask& mask,
                                        const std::vector<std::int64_t>& indices, std::size_t k);

}  // namespace flashlab::cuda::stream
