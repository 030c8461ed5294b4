/// @file stream_fast_estimate.hpp
/// @brief Host API of the fast bf16 STREAM mask estimate: tile scores Q_q·K_rᵀ on tensor cores
/// (`mma.sync` m16n8k16, bf16 in, fp32 accumulate), the branch bookkeeping and τ on chip.
///
/// The same procedure, names and outputs as the clear estimate (stream.hpp) and the reference
/// (`flashlab::ref::stream::stream_estimate`): b_q, b_k, n_q, n_k, n_it, C_blk, branch,
/// representative (first valid block of a branch, score inherited by the half that holds it),
/// τ. Differences: Q and K are bf16 (`uint16_t` bit patterns; no CUDA types here, so CPU-only
/// code may include this header), and the kernel's limits are b_q = b_k = 64 and d ∈ {64, 128}
/// (check_fast_estimate()). Code: cuda/src/stream/stream_fast_estimate.cu; docs/stream.md, section
/// "The fast bf16 estimate".
///
/// Guarantees (tests/cuda/test_cuda_stream_fast.cpp, tag `[stream-fast]`): I is bitwise the same
/// in every run (fixed summation order inside each tile product, order-free max, rank sort under
/// τ, no atomics); it equals the reference's I on inputs whose scores are exact (small integers:
/// exact in bf16, their products and sums exact in fp32), ties included; on other inputs it can
/// differ only where two candidate scores lie within the rounding of a bf16-input,
/// fp32-accumulated score, which `margins` lets a caller detect.
#pragma once

#include "flashlab/cuda/bench_row.hpp"
#include "flashlab/cuda/profiler.hpp"
#include "flashlab/cuda/stream.hpp"
#include "flashlab/cuda/stream_fast.hpp"
#include "flashlab/reference/stream.hpp"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace flashlab::cuda::stream {

/// A bf16 `[T, H, d]` array on the host (bit patterns, not owned): the one 16-bit host view.
using HostHeadsBf16 = HostHeads16;

/// The only b_q and b_k of the fast estimate (four warps of 16 query rows, 64-key tiles): the one
/// block size of the fast kernels, kFastStreamBlock (stream_fast.hpp).
inline constexpr std::size_t kFastEstimateBlock = kFastStreamBlock;
/// Largest k of the fast estimate (one thread per kept branch in the on-chip τ bookkeeping).
inline constexpr std::size_t kFastEstimateMaxK = 128;

/// The fast estimate's limits, checked here and nowhere else: the geometry's own rules, b_q = b_k
/// = 64, d ∈ {64, 128}, 1 ≤ k ≤ kFastEstimateMaxK, 1 ≤ H ≤ 65535 (one grid row per head), T·H and
/// n_q·H·k within 32-bit indices.
/// Throws ref::stream::StreamError naming the parameter, its value and a hint.
void check_fast_estimate(const ref::stream::Geometry& g, std::size_t heads, std::size_t d, std::size_t k);

/// Device memory the fast estimate needs besides Q and K, in bytes: I (int64), its scores (fp32),
/// one margin per (head, query block) (fp32) and, for a user mask, the packed C_blk (n_q rows of
/// ⌈n_k/64⌉ words). No candidate workspace: the branches live in shared memory.
std::size_t fast_estimate_extra_bytes(const ref::stream::Geometry& g, std::size_t heads, std::size_t k,
                                      bool user_mask);

/// Mask estimation with the fast kernel: uploads Q and K (`[T, H, d]` bf16, T =
/// mask.geometry().T) and the packed C_blk, poisons the outputs, launches, checks every CUDA
/// call and downloads I ([H, n_q, k], τ order, −1 = empty), the scores and the margins (as
/// stream_estimate()). Throws ref::stream::StreamError for bad parameters, CudaError for CUDA
/// failures.
EstimateOutput stream_fast_estimate(const HostHeadsBf16& Q, const HostHeadsBf16& K,
                                    const ref::stream::BlockMask& mask, std::size_t k);

/// Launches the fast estimate on device pointers, no copies, no allocation, no synchronisation,
/// on `stream` (a cudaStream_t passed as void*; nullptr is the default stream). Q and K are bf16
/// `[T, H, d]`; `packed_mask` is pack_block_mask(mask) (stream.hpp) on the device, or nullptr for a
/// causal-only mask (then mask.has_user_mask() must be false); I, scores and margins hold
/// H·n_q·k, H·n_q·k and H·n_q entries (`scores` and `margins` may be nullptr when not wanted).
/// With a head range only those heads are estimated: Q and K are still the whole `[T, H, d]`
/// inputs, while I, scores and margins hold the range's heads only (`range.count·n_q·k`,
/// `range.count·n_q·k`, `range.count·n_q` entries, in head order), each head's rows bitwise those
/// of an all-heads launch. For benchmarks and pipelines. Throws StreamError for bad parameters
/// (the range included), CudaError if the launch fails.
void stream_fast_estimate_device(const ref::stream::BlockMask& mask, std::size_t heads, std::size_t d, std::size_t k,
                                 const void* Q, const void* K, const std::uint64_t* packed_mask, long long* I,
                                 float* scores, float* margins, void* stream = nullptr, HeadRange range = {});

/// One timed shape of the fast estimate (time_stream_fast_estimate()): the one row type of every
/// family (bench_row.hpp): seq = T, heads, head_dim = d, stream.k, the timing, extra_bytes
/// (fast_estimate_extra_bytes() of the run), stream.indices_checksum and stream.same_every_launch.
using FastEstimateTiming = BenchRow;

/// Times the fast estimate at one shape on seeded N(0, 1) bf16 inputs made on the device
/// (`[T, H, d]`, the generator of `flashlab bench stream`), causal mask: `warmup` untimed launches, then `reps` launches,
/// each timed alone with a pair of CUDA events on the default stream after an L2 flush (a
/// cudaMemset of `flush_bytes` and a read of it, outside the timed range). I is downloaded after every launch and
/// compared. Throws StreamError for a shape the kernel refuses or reps < 1, CudaError on failure.
FastEstimateTiming time_stream_fast_estimate(std::size_t T, std::size_t heads, std::size_t d, std::size_t k, int reps,
                                             int warmup, std::uint64_t seed,
                                             std::size_t flush_bytes = std::size_t(256) << 20);

/// Memory traffic of one fast-estimate launch at one shape, on the inputs of
/// time_stream_fast_estimate() (same seed, same values), measured with the CUPTI Range Profiler:
/// one metric per session, each session one launch right after an L2 flush (a cudaMemset of
/// `flush_bytes` outside the measured range). Requires permission to read the performance
/// counters. Throws StreamError for a shape the kernel refuses, CudaError on failure.
KernelCounters measure_fast_estimate_traffic(std::size_t T, std::size_t heads, std::size_t d, std::size_t k,
                                             std::uint64_t seed, std::size_t flush_bytes = std::size_t(256) << 20);

}  // namespace flashlab::cuda::stream
