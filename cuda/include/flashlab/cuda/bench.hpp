/// @file bench.hpp
/// @brief Timing of the fast tensor-core forward and backward: the one implementation behind `flashlab bench attention` and the `bench_cuda_attention` driver. No CUDA
/// types here, so CPU-only code may include this header.
///
/// Method, per shape and pass: `warmup` untimed launches, then `reps` launches each timed alone
/// with a pair of CUDA events on the default stream; before every launch (warm-up and timed) L2
/// is flushed outside the timed range by a `flush_bytes` memset and a read of the same buffer (so
/// L2 holds no dirty line the launch would have to write back; `flush_dirty`: the memset alone),
/// and the inputs rotate over
/// `input_sets` independent sets (launch r uses set r mod `input_sets`), so no launch finds its
/// inputs in L2. A forward launch is fast_attention_forward_device() on Q/K/V; a backward launch
/// is fast_attention_backward_device() of `bwd_design` (every kernel of the design inside
/// the timed range: two_kernel = D preprocessing, dQ kernel, dK/dV kernel; atomic = dQ-accumulator
/// zeroing, D preprocessing, main kernel, dQ conversion; its workspace is allocated once per shape,
/// outside the timing) on Q/K/V/dO and the O and LSE of a real forward of that set, computed
/// once per set before the backward's warm-up (untimed). Reported: median, minimum and maximum
/// time, TFLOP/s of the median and effective GB/s of the median (see attention_fwd_flops(),
/// attention_bwd_flops(), attention_fwd_bytes() and attention_bwd_bytes()).
#pragma once

#include "flashlab/cuda/bench_row.hpp"
#include "flashlab/cuda/fast_attention.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

namespace flashlab::cuda {

/// Which passes a sweep times.
enum class BenchPass {
  fwd,  ///< the forward only
  bwd,  ///< the backward only (after one untimed forward per input set, for O and LSE)
  both  ///< the forward, then the backward, of each shape
};

/// A sweep of the fast kernels: every (head dim, causal, N) combination of the lists, in that
/// loop order (head dim outermost, N innermost), each shape timed as the file comment states, for
/// the passes `pass` selects (forward row before backward row).
struct AttentionBenchConfig {
  std::vector<int> seqs = {1024, 2048, 4096, 8192, 16384};  ///< N values (each ≥ 1)
  std::vector<int> head_dims = {64, 128};                    ///< d values (64, 128 or 256: check_fast_problem())
  std::vector<bool> causal = {false, true};                  ///< mask settings to time
  int heads = 16;                                            ///< H
  int heads_kv = 0;                                          ///< H_kv, K/V heads dividing H (0: H_kv = H)
  int seq_k = 0;                                             ///< N_k of every shape (0: N_k = N)
  int window_left = -1;   ///< the window of every shape, keys left of the diagonal (−1: unbounded)
  int window_right = -1;  ///< keys right of it (−1: unbounded; causal caps it at 0)
  int batch = 1;                                             ///< B
  ref::Dtype dtype = ref::Dtype::bf16;                       ///< storage type of Q, K, V, O (bf16 or fp16)
  int reps = 30;                                             ///< timed launches per shape (≥ 1)
  int warmup = 3;                                            ///< untimed launches per shape (≥ 0)
  int input_sets = 3;                                        ///< Q/K/V sets rotated over (≥ 1)
  std::size_t flush_bytes = std::size_t(256) << 20;          ///< L2 flush buffer (256 MiB; H100 L2 is 50 MiB)
  /// Flush by the memset alone, leaving its dirty lines in L2 for the timed launch to write back
  /// (~50 MB on an H100, ~17 µs of a launch that reads and hardly writes): to compare with timings
  /// taken that way
  bool flush_dirty = false;
  std::uint32_t seed = 1234;                                 ///< seed of the N(0, 1) inputs
  BenchPass pass = BenchPass::both;                          ///< passes to time (bench_attention())
  ref::Algorithm bwd_design = ref::Algorithm::bwd_atomic;      ///< backward design timed (default: the faster)
  FastForwardKernel fwd_kernel = FastForwardKernel::mma_sync;  ///< forward kernel timed (unless fwd_auto)
  /// Time, per shape, the forward kernel fastest_forward_kernel(problem) chooses (the row names it)
  bool fwd_auto = false;
  /// Beside each forward row, time a device-to-device copy of K and V's bytes the same way (the
  /// copy-bandwidth anchor): the row's kv_read_tbps and copy_tbps
  bool kv_copy = false;
  FastBackwardKernel bwd_kernel = FastBackwardKernel::mma_sync;  ///< kernel of the bwd_atomic design timed
  /// Time, per shape, the backward kernel fastest_backward_kernel(problem) chooses (the row names it)
  bool bwd_auto = false;
  /// Packed sequences: when set, one shape per (d, causal), these sequences packed ([1, total, H,
  /// d], the lists in device memory, FastPackedSequences) in place of `seqs`, `batch` and `seq_k`;
  /// its TFLOP/s count every sequence's own visible pairs. The backward: every design and kernel
  /// but wgmma_ws_deterministic, at d = 64 and 128 (validated before any timing).
  std::optional<ref::PackedSequences> packed;
};

/// One timed shape of a sweep: the one row type of every family (bench_row.hpp), its attention
/// extras filled (problem, backward, the kernels), seq/heads/head_dim/batch/dtype from the problem.
using AttentionBenchRow = BenchRow;

/// FLOPs of one forward: 4·N·N_k·d·H·B (QKᵀ and PV, 2 FLOPs per multiply-add; 4·N²·d·H·B when
/// N_k = N). Packed sequences: the sum over the sequences of their own count (4·len_q·len_k·d·H,
/// and so on), the real work with no padding. Causal: only the visible (query, key) pairs, counted as N·N_k − N²/2 when N ≤ N_k and
/// N_k²/2 when N > N_k (bottom-right aligned), which is the usual halving at N_k = N. A window:
/// the visible pairs counted exactly, Σ over the N queries of the keys each sees (the band's
/// area, clipped to the keys: ref::AttentionProblem::visible_keys()), not the tiles a kernel
/// visits. Softmax work is not counted; H_kv does not change the count.
double attention_fwd_flops(const ref::AttentionProblem& problem);

/// Ideal HBM bytes of one forward: Q read once and O written once (B·N·H·d elements each, 2
/// bytes), K and V read once (B·N_k·H_kv·d each) plus LSE written once (B·H·N fp32). The effective GB/s divides this by the time; at
/// large N the kernel re-reads K and V once per query tile, so the number is a lower bound on
/// the traffic, meaningful as a bandwidth only at small N.
double attention_fwd_bytes(const ref::AttentionProblem& problem);

/// FLOPs of one backward: 2.5 × attention_fwd_flops(), i.e.
/// 2.5 · 4·N²·d·H·B (the five matrix products S = QKᵀ, dP = dO·Vᵀ, dV, dK, dQ against the
/// forward's two), halved for causal. The recomputation of S is counted; softmax work is not.
/// The same count for both designs (the two-kernel design does 14·N²·d of product FLOPs, the
/// atomic one 10·N²·d: only the counted work is credited).
double attention_bwd_flops(const ref::AttentionProblem& problem);

/// Ideal HBM bytes of one backward: Q, O, dO read once and dQ written once (B·N·H·d elements
/// each), K, V read once and dK, dV written once (B·N_k·H_kv·d each), 2 bytes an element, plus LSE
/// read once and D written once and read once (B·H·N fp32 each). A lower bound on the traffic, as
/// attention_fwd_bytes().
double attention_bwd_bytes(const ref::AttentionProblem& problem);

/// Times the fast kernels on every shape of `bench`, for the passes `bench.pass` selects, on
/// device 0 and returns the rows in sweep order (per shape: the forward row, then the backward
/// row); `on_row`, if given, is called with each row as soon as it is measured (for progress
/// output). Device memory is allocated per shape and freed before the next. Throws
/// std::invalid_argument for an empty list or a bad count (reps < 1, warmup < 0, input_sets < 1)
/// or a shape the kernels refuse, and CudaError when no device is usable (the message names
/// cudaGetDeviceCount's error) or a CUDA call fails.
std::vector<AttentionBenchRow> bench_attention(const AttentionBenchConfig& bench,
                                               const std::function<void(const AttentionBenchRow&)>& on_row = {});

/// bench_attention() with the forward only, whatever `bench.pass` says (the `bench_cuda_attention`
/// driver's entry). Times the fast forward on every shape of `bench` on device 0 and returns one row per shape,
/// in sweep order; `on_row`, if given, is called with each row as soon as it is measured (for
/// progress output). Device memory is allocated per shape and freed before the next. Throws
/// std::invalid_argument for an empty list or a bad count (reps < 1, warmup < 0, input_sets < 1)
/// or a shape fast_attention_forward_device() refuses, and CudaError when no device is usable
/// (the message names cudaGetDeviceCount's error) or a CUDA call fails.
std::vector<AttentionBenchRow> bench_attention_forward(
    const AttentionBenchConfig& bench, const std::function<void(const AttentionBenchRow&)>& on_row = {});

}  // namespace flashlab::cuda
