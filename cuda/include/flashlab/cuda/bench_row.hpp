/// @file bench_row.hpp
/// @brief The one row type of every family's timing harness (bench_attention, bench_mta,
/// bench_stream, time_stream_fast_estimate): what was timed, the timing, the traffic of one launch
/// when measured, and each family's own fields as extras. No CUDA types here.
///
/// Every harness times with the same method (each launch alone between two CUDA events, L2
/// flushed before it outside the timed range: the one launch timer of cuda/src/core) and fills
/// the common fields; a family's extras are left at their defaults by the others.
#pragma once

#include "flashlab/cuda/fast_attention.hpp"
#include "flashlab/cuda/mta_fast.hpp"
#include "flashlab/cuda/profiler.hpp"
#include "flashlab/cuda/stream.hpp"
#include "flashlab/reference/attention_problem.hpp"
#include "flashlab/reference/traffic.hpp"

#include <cstddef>
#include <cstdint>

namespace flashlab::cuda {

namespace mta {

/// Which MTA kernels a sweep times.
enum class MtaBenchKernel {
  clear,  ///< the clear fp32 kernels (mta.hpp): the source's order, O read-modify-written per key tile
  fast    ///< the fast tensor-core kernels (mta_fast.hpp), bf16 or fp16
};

/// Which MTA pass a sweep times. Each pass is one small function in cuda/src/mta/mta_bench.cpp
/// (plan_pass() dispatches); a pass a kernel family does not have is refused before any timing.
enum class MtaBenchPass {
  fwd,      ///< the forward
  bwd,      ///< the backward (after one untimed forward per input set, for its O and LSE)
  fwd_bwd,  ///< forward then backward, in one timed range
  decode    ///< the split-K decode of the last 16 query rows (fast only), beside a D2D copy of the same bytes
};

}  // namespace mta

/// The attention family's fields of a BenchRow.
struct AttentionBenchExtras {
  ref::AttentionProblem problem;  ///< the problem that was timed
  bool backward = false;          ///< false: a forward row; true: a backward row
  FastForwardKernel fwd_kernel = FastForwardKernel::mma_sync;    ///< the forward kernel (forward rows)
  ref::Algorithm bwd_design = ref::Algorithm::bwd_atomic;        ///< the backward design (backward rows)
  FastBackwardKernel bwd_kernel = FastBackwardKernel::mma_sync;  ///< the backward kernel (backward rows)
  /// kv_copy forward rows: the bytes of K and V (2·B·N_k·H_kv·d elements) per median time, 10¹² B/s; else 0
  double kv_read_tbps = 0.0;
  /// kv_copy forward rows: a device-to-device copy of K and V's bytes, timed the same way in the same
  /// run, as (bytes read + bytes written) per median time, 10¹² B/s (the copy-bandwidth anchor); else 0
  double copy_tbps = 0.0;
};

/// The Multi-Token Attention family's fields of a BenchRow.
struct MtaBenchExtras {
  mta::MtaBenchKernel kernel = mta::MtaBenchKernel::fast;  ///< kernel family
  mta::MtaBenchPass pass = mta::MtaBenchPass::fwd;         ///< pass
  int cq = 1;                                              ///< kernel rows
  int ck = 1;                                              ///< kernel columns
  /// decode: the bytes of K and V (2·N·H·d·B elements) read per median time, 10¹² B/s; else 0
  double read_tbps = 0.0;
  /// decode: a device-to-device cudaMemcpy of the same bytes, timed the same way in the same run,
  /// as (bytes read + bytes written) per median time, 10¹² B/s (the copy-bandwidth anchor); else 0
  double copy_tbps = 0.0;
  mta::FastOOrder o_order = mta::FastOOrder::on_chip;  ///< the fast forward's order
};

/// The STREAM family's fields of a BenchRow.
struct StreamBenchExtras {
  int k = 0;                                  ///< key blocks kept per query block
  int bq = 0;                                 ///< b_q
  int bk = 0;                                 ///< b_k
  bool apply = false;                         ///< false: an estimate row; true: an apply row
  bool trace = false;                         ///< a fast trace row (edge records, no O)
  bool value_norm = true;                     ///< a trace row: value norms computed (V read)
  StreamKernel kernel = StreamKernel::clear;  ///< implementation timed
  int group = 0;                              ///< fast apply: query blocks per thread block
  std::uint64_t indices_checksum = 0;  ///< time_stream_fast_estimate: ref::stream::indices_checksum of I (all heads)
  bool same_every_launch = false;      ///< time_stream_fast_estimate: I bitwise equal after every launch
};

/// One timed shape and pass of any family's sweep.
struct BenchRow {
  int batch = 1;                        ///< B (STREAM: 1)
  int seq = 0;                          ///< N (STREAM: T, tokens)
  int heads = 0;                        ///< H
  int head_dim = 0;                     ///< d
  ref::Dtype dtype = ref::Dtype::bf16;  ///< storage type of the timed inputs (fp32 for the clear kernels)
  int reps = 0;                         ///< timed launches behind the statistics
  double median_ms = 0.0;               ///< median launch time, milliseconds
  double min_ms = 0.0;                  ///< fastest launch, milliseconds
  double max_ms = 0.0;                  ///< slowest launch, milliseconds
  double tflops = 0.0;  ///< the pass's counted FLOPs / median, 10¹² FLOP/s (0 where the family counts none)
  double gbps = 0.0;    ///< the pass's ideal HBM bytes / median, 10⁹ B/s (attention; else 0)
  std::size_t extra_bytes = 0;  ///< device bytes the pass needs besides its inputs and outputs (STREAM)
  bool traffic = false;         ///< `counters` hold the CUPTI counters of one more launch
  KernelCounters counters;      ///< L2 and DRAM bytes of one launch (when `traffic`)
  AttentionBenchExtras attention;  ///< the attention family's fields
  MtaBenchExtras mta;              ///< the MTA family's fields
  StreamBenchExtras stream;        ///< the STREAM family's fields
};

}  // namespace flashlab::cuda
