/// @file stream_bench.hpp
/// @brief Timing of the STREAM kernels on the GPU (estimate and apply, clear fp32 or fast
/// 16-bit, and the fast trace with or without value norms): the one implementation behind
/// `flashlab bench stream` on one GPU. No CUDA types here, so
/// CPU-only code may include this header.
///
/// Method, per shape (T, d, k) and pass: `warmup` untimed launches, then `reps` launches each
/// timed alone with a pair of CUDA events on the default stream; before every launch (warm-up
/// and timed) L2 is flushed by a `flush_bytes` memset and a read of it outside the timed range
/// (L2 left clean). One input set
/// per shape: Q, K, V are `[T, H, d]` N(0, 1) values (rounded to the dtype for the fast kernels),
/// and from T = 32k on one tensor alone is larger than L2, so the flush is what keeps a launch
/// from finding its inputs on chip. The apply reads the index tensor I of the estimate of the same
/// inputs (the timed one, or one untimed run before its warm-up): the fast bf16 estimate
/// (flashlab/cuda/stream_fast_estimate.hpp) for the fast kernels in bf16, the clear fp32 estimate
/// otherwise (on the fp16-rounded values for the fast fp16 apply), so every apply row times real
/// top-k masks, never a synthetic one.
/// Causal mask only (no user mask). Reported per row: median, minimum and maximum time and the
/// device memory the timed pass needs beyond Q, K, V and O, in bytes.
#pragma once

#include "flashlab/cuda/bench_row.hpp"
#include "flashlab/cuda/stream.hpp"
#include "flashlab/reference/traffic.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace flashlab::cuda {

/// Which STREAM passes a sweep times.
enum class StreamBenchPass {
  estimate,  ///< mask estimation only
  apply,     ///< mask application only (I from one untimed estimate)
  both,      ///< the estimate, then the apply on its I, of each shape
  trace,     ///< the fast trace only: one edge record per entry of I (I from one untimed estimate)
  trace_mass ///< the fast trace without value norms (V not read): what a store of key blocks and mass needs
};

/// A sweep: every (head dim, k, T) of the lists, in that loop order (T innermost).
struct StreamBenchConfig {
  std::vector<int> seqs = {32768, 65536, 131072, 262144, 524288, 1048576};  ///< T values (each ≥ 1)
  std::vector<int> head_dims = {64, 128};                                  ///< d values
  std::vector<int> ks = {8, 16, 32};                                       ///< k values (≥ 1)
  int heads = 1;                                                           ///< H
  int bq = 64;                                                             ///< b_q
  int bk = 64;                                                             ///< b_k
  StreamBenchPass pass = StreamBenchPass::both;                            ///< passes to time
  StreamKernel kernel = StreamKernel::clear;                               ///< implementation timed
  ref::Dtype dtype = ref::Dtype::bf16;  ///< storage of Q, K, V, O for the fast kernels (bf16 or fp16)
  int group = 0;                        ///< fast apply: query blocks per thread block (0 = its default)
  int reps = 20;                        ///< timed launches per shape and pass (≥ 1)
  int warmup = 2;                       ///< untimed launches per shape and pass (≥ 0)
  std::size_t flush_bytes = std::size_t(256) << 20;  ///< L2 flush buffer (256 MiB; H100 L2 is 50 MiB)
  std::uint32_t seed = 1234;                         ///< seed of the N(0, 1) inputs
};

/// One timed shape and pass of a sweep: the one row type of every family (bench_row.hpp), its
/// STREAM extras filled (k, b_q, b_k, apply, kernel, group); seq is T.
using StreamBenchRow = BenchRow;

/// Times the STREAM kernels on every shape of `bench` for the passes `bench.pass` selects, on
/// device 0, and returns the rows in sweep order (per shape: the estimate row, then the apply
/// row); `on_row`, if given, is called with each row as soon as it is measured. Device memory
/// is allocated per shape and freed before the next. Throws std::invalid_argument for an empty
/// list or a bad count, ref::stream::StreamError for a shape the kernels refuse (naming the
/// limit), and CudaError when no device is usable or a CUDA call fails.
std::vector<StreamBenchRow> bench_stream(const StreamBenchConfig& bench,
                                         const std::function<void(const StreamBenchRow&)>& on_row = {});

}  // namespace flashlab::cuda
