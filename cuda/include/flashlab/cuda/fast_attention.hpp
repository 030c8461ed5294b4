/// @file fast_attention.hpp
/// @brief The attention family's front door for the fast tensor-core kernels: bf16 or fp16
/// inputs, fp32 accumulation, `mma.sync` m16n8k16 or (sm_90a) Hopper's `wgmma.mma_async`. Entry
/// points on the caller's device memory and stream (fast_attention_forward_device(),
/// fast_attention_backward_device()) and host-vector wrappers over them for tests and tools. No
/// CUDA types here: 16-bit values travel as `uint16_t` storage (their bit patterns), so CPU-only
/// code may include this header.
///
/// The problem is a ref::AttentionProblem; the fast kernels' own limits are checked in one
/// place, check_fast_problem(): d ∈ {64, 128, 256} (256: the mma_sync and tma_ws forwards and the
/// bwd_atomic design's three kernels; the wgmma and split_kv forwards and the bwd_two_kernel design
/// refuse it by name), dtype bf16 or fp16, 32-bit element counts. Their tiles are
/// fixed at compile time per kernel configuration and chosen per problem and device
/// (fast_forward_tiles(); the backward kernels' tiles are stated in
/// cuda/src/attention/attention_bwd_tc.cu), so the problem's Br and Bc are not read.
/// Layout as the clear kernels: Q, O are `[B, N, H, d]` row-major, K, V `[B, N_k, H_kv, d]`; LSE
/// is `[B, H, N]` fp32, base 2 of the base-2 scores: LSE_i = m_i + log2(l_i) with scores
/// S·scale·log2(e). Any N ≥ 1; causal or not.
///
/// The forward (mma_sync, tma_ws and split_kv) takes grouped K/V (`heads_kv` = H_kv dividing H: query head h
/// reads K/V head h / (H / H_kv), by indexing, K and V never expanded) and N_k ≠ N (`seq_k`), the
/// causal diagonal bottom-right aligned as the reference's: key j visible to query i iff
/// j ≤ i + N_k − N; a query that sees no key (causal, N > N_k) gets O = 0 and LSE = −inf. The
/// mma_sync and tma_ws forwards also take sliding windows (`window_left`, `window_right`), the reference's rule: query i sees key j
/// iff i + off − window_left ≤ j ≤ i + off + window_right with off = N_k − N, −1 leaving a side
/// unbounded and causal capping the right side at 0; key tiles outside the band on either side
/// are never loaded, and a query whose band misses every key gets O = 0 and LSE = −inf. The
/// atomic backward's mma_sync and wgmma_ws kernels take all three (grouped K/V: one block per K/V
/// head and key tile loops over the group's query heads, dK and dV summed in registers and written
/// once; a query that sees no key gets dQ = 0), and so does the two-kernel backward, bit-reproducible (its dK/dV kernel
/// sums the group's query heads in one fixed order). The wgmma forward, and the deterministic wgmma-ws backward at
/// d = 64 and 128, take H_kv = H, N_k = N only, those and the split_kv forward no window, and they refuse the
/// others by name (at d = 256 the deterministic kernel takes all three).
///
/// Packed sequences (FlashAttention's varlen call): the mma_sync and tma_ws forwards take B
/// sequences of their own lengths concatenated along the token axis, Q and O `[1, total_q, H, d]`,
/// K and V `[1, total_k, H_kv, d]`, LSE `[1, H, total_q]` (ref::AttentionProblem::stat_offset), with
/// the prefix sums cu_seqlens_q and cu_seqlens_k in device memory (FastPackedSequences). Every
/// sequence has its own mask, the diagonal bottom-right aligned at offset len_k − len_q, its window
/// and grouped K/V as a dense problem's; the work is one unit per (sequence, head, query tile),
/// found from the device lists by the kernels (no host copy, no pass over them before the launch),
/// so no tile is spent on padding. The atomic backward's mma_sync and wgmma_ws kernels and the two-kernel backward
/// take them too: one block
/// per (sequence, K/V head, key tile) loops over its sequence's query tiles (per query head of the
/// group), dQ, dK, dV `[1, total_q, H, d]` and `[1, total_k, H_kv, d]`, D `[1, H, total_q]`; every
/// row belongs to a sequence (the totals are the lists' last sums), and a key no query of its
/// sequence sees gets dK = dV = 0, a query that sees no key dQ = 0. The split_kv and wgmma
/// forwards and the deterministic wgmma-ws backward kernel refuse packed sequences by
/// name (cu_seqlens).
///
/// Backward, two designs (ref::Algorithm): bwd_two_kernel (D preprocessing, dQ kernel, dK/dV
/// kernel: cuda/src/attention/attention_bwd_tc.cu) and bwd_atomic (D preprocessing, one kernel over K_j/V_j
/// blocks with dQ accumulated in fp32 by atomics, dQ conversion:
/// cuda/src/attention/attention_bwd_tc_atomic.cu). fast_attention_backward() takes Q, K, V, O, dO and the
/// forward's LSE and returns dQ, dK, dV in the same dtype.
#pragma once

#include "flashlab/cuda/dtype16.hpp"
#include "flashlab/reference/attention_problem.hpp"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace flashlab::cuda {

/// Which instruction the fast FA2 forward is built on. Both kernels compute the same O and LSE
/// (same algorithm, tiles aside) from the same inputs.
enum class FastForwardKernel {
  /// `mma.sync` m16n8k16 (cuda/src/attention/attention_fwd_tc.cu): the default, sm_90 build.
  mma_sync,
  /// Hopper's warpgroup MMA, `wgmma.mma_async` (cuda/src/attention/attention_fwd_wgmma.cu): compiled for
  /// sm_90a, so it runs on compute capability 9.0 GPUs only (H100/H200), and only in builds whose
  /// CMAKE_CUDA_ARCHITECTURES include 90 (fast_forward_wgmma_built()).
  wgmma,
  /// wgmma fed by TMA loads from a producer warpgroup, two consumer warpgroups taking turns at the
  /// tensor cores (cuda/src/attention/attention_fwd_ws.cu): sm_90a, built and usable as wgmma.
  tma_ws,
  /// Split-KV for few query rows against many keys (cuda/src/attention/attention_fwd_splitkv.cu):
  /// the query rows of the H/H_kv heads sharing a K/V head packed into one row tile, the keys cut
  /// into ranges over the SMs, fp32 partials merged by LSE in a second kernel; `mma.sync`, any
  /// device from sm_80 on. fastest_forward_kernel(problem) chooses it where it pays.
  split_kv
};

/// "mma", "wgmma", "tma-ws" or "splitkv" (the names the `flashlab bench attention --fwd-kernel`
/// flag takes).
const char* to_string(FastForwardKernel kernel);

/// Whether this build contains the wgmma forward (CMAKE_CUDA_ARCHITECTURES included 90).
bool fast_forward_wgmma_built();

/// The fastest forward kernel this build can run on the current device: tma_ws where the sm_90a
/// kernels are built and the device is compute capability 9.0 (H100, H200), else mma_sync (any
/// device from sm_80 on). Measured order on the H100: tma_ws > wgmma > mma_sync at every timed
/// shape (docs/optimisation.md). Throws CudaError when no device can be queried.
FastForwardKernel fastest_forward_kernel();

/// The forward kernel fast_attention_forward_device() should run for `problem` on the current
/// device: split_kv where the others would leave most of the GPU idle, else
/// fastest_forward_kernel(). The one rule (measured on the H100: docs/cuda.md, the split-KV
/// forward): split_kv when N ≤ 16, or when the regular forwards' blocks, B·H·⌈N/128⌉, fill at most
/// a quarter of the SMs; never for a window (split_kv masks none), at d = 256 or for packed
/// sequences (split_kv is compiled for dense d = 64 and 128). Validates the problem
/// (check_fast_problem()); throws CudaError when no device can be queried.
FastForwardKernel fastest_forward_kernel(const ref::AttentionProblem& problem);

/// Results of a fast forward pass copied back to the host.
struct FastForwardResult {
  std::vector<std::uint16_t> O;  ///< output, [B, N, H, d], bit patterns of the problem's dtype
  std::vector<float> LSE;        ///< base-2 log-sum-exp, [B, H, N]
};

/// Tile sizes of a fast forward kernel for one head dim (fixed at compile time).
struct FastTiles {
  int Br;  ///< query rows per thread block
  int Bc;  ///< key rows per pipeline stage
};

/// The tiles of the fast forward `kernel` for `head_dim` on a short work list (of N_k = N); throws
/// std::invalid_argument for d ∉ {64, 128, 256} and for d = 256 on wgmma or split_kv. mma_sync and
/// wgmma have one tile shape per head dim; tma_ws chooses its configuration per problem and device
/// (longer lists run Br = 192 at d = 64, Bc = 192 at d = 128; d = 256 runs Bc = 80), split_kv its Br per problem (16 packed rows for at most 16 rows per K/V
/// head, else 64; Bc = 64): the overload below reports the tiles that run.
FastTiles fast_forward_tiles(int head_dim, FastForwardKernel kernel = FastForwardKernel::mma_sync);

/// The tiles fast_attention_forward_device() runs for `problem` with `kernel` on the current
/// device: for tma_ws the configuration its launcher chooses from B, N, N_k, H, d, the mask and
/// the SM count (cuda/src/attention/fwd_ws_config.hpp); for split_kv Br counts packed rows (query
/// rows of the H/H_kv heads that share a K/V head). Throws std::invalid_argument for a problem
/// the kernel refuses (check_fast_problem(), and the kernel's own refusals of the file comment: the
/// wgmma forward H_kv ≠ H, N_k ≠ N, a window and packed sequences, split_kv a window and packed
/// sequences), CudaError when no device can be queried (tma_ws only).
FastTiles fast_forward_tiles(const ref::AttentionProblem& problem, FastForwardKernel kernel);

/// The fast kernels' limits beyond ref::AttentionProblem::validate(), checked here and nowhere
/// else: d ∈ {64, 128, 256}; dtype bf16 or fp16; B·N·H·d and B·N_k·H_kv·d below 2³¹ (32-bit
/// indices; packed: total_q·H·d and total_k·H_kv·d). Grouped K/V, N_k ≠ N, windows, d = 256 and
/// packed sequences pass here; the kernels that do not take them refuse them by name: the wgmma
/// forward the first three, the split-KV forward a window, the deterministic wgmma-ws kernel the
/// first three at d = 64 and 128 (it takes them at d = 256); the two-kernel design, the wgmma and
/// the split-KV forwards d = 256. Packed sequences run on the mma_sync and tma_ws forwards and on
/// the backward's two-kernel design and bwd_atomic mma_sync and wgmma_ws kernels (with their device
/// lists: the overloads that take FastPackedSequences), at d = 64 and 128 only (this check and
/// check_fast_packed() refuse d = 256); the split_kv and wgmma forwards and the deterministic
/// wgmma-ws kernel refuse them. Validates the problem first. Throws std::invalid_argument naming
/// the field, the value, the limit and a hint.
void check_fast_problem(const ref::AttentionProblem& problem);

/// Uploads Q (`[B, N, H, d]`), K and V (`[B, N_k, H_kv, d]`), 16-bit bit patterns of `problem.dtype`, poisons O
/// and LSE with NaN, runs the fast forward `kernel`, checks every CUDA call and downloads O and
/// LSE. A packed problem: Q `[1, total_q, H, d]`, K and V `[1, total_k, H_kv, d]`, LSE `[1, H,
/// total_q]`, its lists uploaded too. Throws std::invalid_argument for a bad problem or size, CudaError for a CUDA failure.
FastForwardResult fast_attention_forward(const ref::AttentionProblem& problem, FastForwardKernel kernel,
                                         const std::vector<std::uint16_t>& Q, const std::vector<std::uint16_t>& K,
                                         const std::vector<std::uint16_t>& V);

/// The forward on the caller's device memory: launches the fast forward `kernel` on `stream` (a
/// cudaStream_t passed as void*; nullptr is the legacy default stream) and returns; no host copy,
/// no synchronisation, no allocation beyond the partial slots of the tma_ws split tail and of
/// split_kv with more than one key range (B·H·N·splits·(d + 2) floats; both taken from one
/// stream-ordered pool of the library's own per device and freed on the stream; under stream
/// capture they become graph allocation nodes), so it may be called from several host threads on
/// several streams at once and captured in a CUDA graph.
///
/// Layout (checked as far as a pointer shows it: non-null, 16-byte aligned; LSE 4-byte): Q and O
/// are contiguous `[B, N, H, d]` row-major 16-bit values of `problem.dtype` (row stride H·d
/// elements, batch stride N·H·d), K and V contiguous `[B, N_k, H_kv, d]` (row stride H_kv·d);
/// LSE is contiguous fp32 `[B, H, N]`, base 2 (file comment).
/// O and LSE are written in full. Throws std::invalid_argument for a bad problem, pointer or a
/// kernel not in this build, and for a packed problem (its lists go to the overload below),
/// CudaError if a launch fails.
void fast_attention_forward_device(const ref::AttentionProblem& problem, FastForwardKernel kernel, const void* Q,
                                   const void* K, const void* V, void* O, float* LSE, void* stream = nullptr);

/// Packed sequences as the device holds them, FlashAttention's varlen arguments: the B + 1 int32
/// prefix sums of the query and key lengths in device memory and the packed tensors' rows.
/// Sequence b owns query rows cu_seqlens_q[b] … cu_seqlens_q[b+1] − 1 and key rows
/// cu_seqlens_k[b] … cu_seqlens_k[b+1] − 1. The lists are not read on the host: each must start
/// at 0, never decrease and end at its total (ref::PackedSequences checks that where the host has
/// them); lists that do not are not detected and give undefined results.
struct FastPackedSequences {
  const std::int32_t* cu_seqlens_q = nullptr;  ///< B + 1 query prefix sums, device memory
  const std::int32_t* cu_seqlens_k = nullptr;  ///< B + 1 key prefix sums, device memory (may equal cu_seqlens_q)
  std::size_t total_q = 0;                     ///< rows of Q and O: cu_seqlens_q[B], at least 1
  std::size_t total_k = 0;                     ///< rows of K and V: cu_seqlens_k[B], at least 1
};

/// check_fast_problem() for a packed call whose lists are on the device: `problem` gives B
/// (`batch`), the longest query and key lengths or more (`seq`, `seq_k`: FlashAttention's
/// max_seqlen_q, max_seqlen_k, used only to choose tiles), H, H_kv, d, the mask and the dtype; it
/// may be packed itself (the host's copy of the same lists: its totals must then equal `packed`'s).
/// Checks the totals (1 … 2³¹ − 1; total_q·H·d and total_k·H_kv·d below 2³¹). Throws
/// std::invalid_argument naming the field.
void check_fast_packed(const ref::AttentionProblem& problem, const FastPackedSequences& packed);

/// The forward over packed sequences on the caller's device memory (check_fast_packed()), `kernel`
/// mma_sync or tma_ws: Q and O contiguous `[total_q, H, d]`, K and V `[total_k, H_kv, d]` (16-byte
/// aligned), LSE contiguous fp32 `[H, total_q]`; `packed`'s lists 4-byte aligned device memory,
/// read by the kernels only. Launches on `stream` and returns, as the dense overload: no host copy
/// of the lists, no allocation, no synchronisation. O and LSE are written in full (a sequence
/// without keys, and every row that sees none, gets O = 0 and LSE = −inf). Throws
/// std::invalid_argument for a bad problem, total or pointer, or a kernel that takes no packed
/// sequences (split_kv, wgmma), CudaError if a launch fails.
void fast_attention_forward_device(const ref::AttentionProblem& problem, const FastPackedSequences& packed,
                                   FastForwardKernel kernel, const void* Q, const void* K, const void* V, void* O,
                                   float* LSE, void* stream = nullptr);

/// The fast backward designs: ref::Algorithm::bwd_two_kernel (D preprocessing, a dQ kernel with
/// one block per Q_i and a dK/dV kernel with one block per K_j: no atomics, bit-reproducible,
/// but S and dP are recomputed in both kernels, 14·N²·d FLOPs of products; workspace: D only)
/// and ref::Algorithm::bwd_atomic (D preprocessing, one kernel per K_j/V_j block looping over
/// Q_i that adds dQ_i's partial sums into an fp32 accumulator with atomics, FlashAttention-2's
/// design with 10·N²·d FLOPs, then dQ = scale · accumulator; workspace: D and the fp32
/// accumulator; the summation order of dQ varies run to run). Any other algorithm is refused
/// with std::invalid_argument.

/// Which kernel runs the bwd_atomic design (the two-kernel design has the mma_sync kernels only).
/// All compute the same dQ, dK, dV (same algorithm and rounding points); dQ's fp32 summation order
/// varies run to run except in wgmma_ws_deterministic.
enum class FastBackwardKernel {
  /// `mma.sync` m16n8k16, cp.async loads (cuda/src/attention/attention_bwd_tc_atomic.cu): any device from
  /// sm_80 on; the portable kernel.
  mma_sync,
  /// Hopper: TMA loads from a producer warpgroup, two consumer warpgroups on `wgmma.mma_async`
  /// for all five products (cuda/src/attention/attention_bwd_ws.cu): sm_90a, built and usable as the
  /// wgmma forward (fast_forward_wgmma_built(), compute capability 9.0).
  wgmma_ws,
  /// wgmma_ws with dQ summed in a fixed order (key block 0, 1, 2, … into each query tile, a
  /// counter per tile in the workspace): bit-reproducible dQ, at some speed. d = 64 and 128: dense,
  /// H_kv = H, N_k = N, no window; d = 256 (cuda/src/attention/attention_bwd_d256_ws.cu): grouped
  /// K/V, N_k ≠ N and windows too. No packed sequences.
  wgmma_ws_deterministic
};

/// "mma", "wgmma-ws" or "wgmma-ws-det" (the names the `flashlab bench attention --bwd-kernel` flag takes).
const char* to_string(FastBackwardKernel kernel);

/// The fastest backward kernel this build can run on the current device: wgmma_ws where the
/// sm_90a kernels are built and the device is compute capability 9.0, else mma_sync (measured on
/// the H100: docs/optimisation.md). Throws CudaError when no device can be queried.
FastBackwardKernel fastest_backward_kernel();

/// The fastest backward kernel for `problem`: fastest_backward_kernel() for every problem now
/// (packed sequences and d = 256 included: wgmma-ws has kernels for them where it runs).
FastBackwardKernel fastest_backward_kernel(const ref::AttentionProblem& problem);

/// Gradients of a fast backward pass copied back to the host (loss L = Σ O∘dO). Packed sequences:
/// [1, total_q, H, d], [1, total_k, H_kv, d] and [1, H, total_q].
struct FastBackwardResult {
  std::vector<std::uint16_t> dQ;  ///< ∂L/∂Q, [B, N, H, d], bit patterns of the problem's dtype
  std::vector<std::uint16_t> dK;  ///< ∂L/∂K, [B, N_k, H_kv, d], bit patterns of the problem's dtype
  std::vector<std::uint16_t> dV;  ///< ∂L/∂V, [B, N_k, H_kv, d], bit patterns of the problem's dtype
  std::vector<float> D;           ///< D_i = rowsum(dO_i ∘ O_i) in fp32, [B, H, N]
};

/// Fast backward of `design` (bwd_two_kernel or bwd_atomic; `kernel` picks the atomic design's
/// kernel, the two-kernel design takes mma_sync only; grouped K/V, N_k ≠ N and windows on bwd_atomic's
/// mma_sync and wgmma_ws kernels, on bwd_two_kernel, and at d = 256 on wgmma_ws_deterministic): uploads Q, O, dO (`[B, N, H, d]`), K, V (`[B, N_k, H_kv, d]`),
/// 16-bit bit patterns, and the forward's base-2 LSE (`[B, H, N]`), poisons the
/// outputs and the workspace with NaN, runs the design's kernels, checks every CUDA call and
/// downloads dQ, dK, dV and D. A packed problem (its lists on the host: uploaded) runs `design` on
/// `kernel` as the packed overload of fast_attention_backward_device() does, the tensors in the
/// packed layout. Throws std::invalid_argument for a bad problem, design or size,
/// CudaError for a CUDA failure.
FastBackwardResult fast_attention_backward(ref::Algorithm design, const ref::AttentionProblem& problem,
                                           const std::vector<std::uint16_t>& Q,
                                           const std::vector<std::uint16_t>& K, const std::vector<std::uint16_t>& V,
                                           const std::vector<std::uint16_t>& O, const std::vector<std::uint16_t>& dO,
                                           const std::vector<float>& LSE,
                                           FastBackwardKernel kernel = FastBackwardKernel::mma_sync);

/// Bytes of device scratch fast_attention_backward_device() needs for `design` and `problem`:
/// D (fp32, B·H·N) at offset 0, then, for bwd_atomic, the fp32 dQ accumulator
/// (B·H·⌈N/128⌉·128·d floats: whole query tiles) at the next multiple of 256 bytes, then the
/// deterministic kernel's dQ order counters (B·H·⌈N/64⌉ int32). Throws
/// std::invalid_argument for a bad problem or design (d = 256 with bwd_two_kernel), naming the
/// field. A packed problem (its lists on the host) gets the packed overload's size. The workspace depends on Q's shape only.
std::size_t fast_attention_backward_workspace_bytes(ref::Algorithm design, const ref::AttentionProblem& problem);

/// Bytes of device scratch of the packed backward (bwd_atomic): D (fp32, H·total_q), then at the
/// next multiple of 256 bytes the fp32 dQ accumulator, (total_q + 128·B)·H·d floats (whole query
/// tiles of each sequence), then one int (the wgmma_ws kernel's work counter); bwd_two_kernel: D alone. Throws std::invalid_argument as
/// check_fast_packed(), or for a bad design.
std::size_t fast_attention_backward_workspace_bytes(ref::Algorithm design, const ref::AttentionProblem& problem,
                                                    const FastPackedSequences& packed);

/// The backward on the caller's device memory: launches the kernels of `design` on `stream` (a
/// cudaStream_t passed as void*; nullptr is the legacy default stream) and returns; no host copy,
/// no allocation, no synchronisation: safe from several host threads on several streams at once
/// and under CUDA graph capture. `workspace` is device memory of at least
/// fast_attention_backward_workspace_bytes(design, problem) bytes, 256-byte aligned (cudaMalloc's
/// pointers are), used only by this call until it completes on `stream`; its contents need no
/// initialisation, and on completion its first B·H·N floats hold D = rowsum(dO ∘ O) ([B, H, N]).
/// Layout: Q, O, dO, dQ contiguous `[B, N, H, d]`, K, V, dK, dV `[B, N_k, H_kv, d]`, 16-bit (16-byte aligned), LSE
/// the forward's contiguous fp32 `[B, H, N]`. `kernel` as fast_attention_backward(). Throws
/// std::invalid_argument for a bad problem, design, pointer, kernel (wgmma_ws with
/// bwd_two_kernel, or not in this build) or a null workspace, and for a packed problem (its lists
/// go to the overload below), CudaError if a launch fails.
void fast_attention_backward_device(ref::Algorithm design, const ref::AttentionProblem& problem, const void* Q,
                                    const void* K, const void* V, const void* O, const void* dO, const float* LSE,
                                    void* dQ, void* dK, void* dV, void* workspace, void* stream = nullptr,
                                    FastBackwardKernel kernel = FastBackwardKernel::mma_sync);

/// The backward over packed sequences on the caller's device memory (check_fast_packed()): design
/// bwd_two_kernel, or bwd_atomic on mma_sync or wgmma_ws (wgmma_ws_deterministic is refused by name). Q, O, dO, dQ contiguous
/// `[total_q, H, d]`, K, V, dK, dV `[total_k, H_kv, d]` (16-byte aligned), LSE the packed forward's
/// fp32 `[H, total_q]`; `packed`'s lists 4-byte aligned device memory, read by the kernels only;
/// `workspace` of fast_attention_backward_workspace_bytes(design, problem, packed) bytes, its first
/// H·total_q floats holding D on completion. Launches on `stream` and returns, as the dense
/// overload. dQ, dK and dV are written in full. Throws std::invalid_argument for a bad problem,
/// total, pointer or design, or for wgmma_ws_deterministic, CudaError if a launch fails.
void fast_attention_backward_device(ref::Algorithm design, const ref::AttentionProblem& problem,
                                    const FastPackedSequences& packed, const void* Q, const void* K, const void* V,
                                    const void* O, const void* dO, const float* LSE, void* dQ, void* dK, void* dV,
                                    void* workspace, void* stream = nullptr,
                                    FastBackwardKernel kernel = FastBackwardKernel::mma_sync);

}  // namespace flashlab::cuda
