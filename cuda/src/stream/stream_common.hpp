// Shared pieces of the STREAM kernels (internal): the launch-time description StreamProblem (the
// fast estimate's too), the block geometry as device functions, the clear kernels' launchers, the
// download of an estimate's outputs.
//
// Names follow reference/src/stream: b_q, b_k, n_q, n_k, n_it, C_blk, branch, representative, τ.
// Layout: Q, K are [T, H, d], V and O [T, H, d_v] (tokens outermost, one head's rows H·d apart);
// I is [H, n_q, k]; the packed C_blk is n_q rows of words_per_row 64-bit words, bit r % 64 of word
// r / 64 = C_blk[q, r] (causality already ANDed in), or absent for a causal-only mask.
#pragma once

#include "core/common.hpp"

#include <cstdint>

namespace flashlab::ref::stream {
class BlockMask;
}

namespace flashlab::cuda::stream {
struct EstimateOutput;  // flashlab/cuda/stream.hpp
}

namespace flashlab::cuda::stream::detail {

using ::flashlab::cuda::detail::kThreads;

/// Everything the STREAM kernels need besides pointers (passed by value).
struct StreamProblem {
  int T = 0;              ///< tokens
  int bq = 0;             ///< b_q, query-block size
  int bk = 0;             ///< b_k, key-block size
  int n_q = 0;            ///< ⌈T/b_q⌉
  int n_k = 0;            ///< ⌈T/b_k⌉
  int n_it = 0;           ///< ⌈log2 n_k⌉ bisection rounds
  int heads = 1;          ///< H
  int d = 0;              ///< head dim of Q and K
  int dv = 0;             ///< head dim of V and O
  int k = 0;              ///< branches kept per query block (columns of I)
  int words_per_row = 0;  ///< 64-bit words per packed C_blk row; 0 = causal only (nothing stored)

  /// Tokens of query block q that exist (b_q except for a partial last block).
  FLASHLAB_HD int q_rows(int q) const { return q * bq + bq <= T ? bq : T - q * bq; }
  /// Tokens of key block r that exist.
  FLASHLAB_HD int k_rows(int r) const { return r * bk + bk <= T ? bk : T - r * bk; }
  /// Last key block with a causally valid token pair for query block q.
  FLASHLAB_HD int causal_last(int q) const {
    const int t_last = q * bq + bq - 1 < T - 1 ? q * bq + bq - 1 : T - 1;
    return t_last / bk;
  }
  /// Columns of tile row m (token q·b_q + m) that are token-valid in key block r: s ≤ t, s < T.
  FLASHLAB_HD int valid_cols(int q, int r, int m) const {
    const int t = q * bq + m, s0 = r * bk;
    if (t < s0) return 0;
    return t - s0 + 1 < k_rows(r) ? t - s0 + 1 : k_rows(r);
  }
  /// Offset of (token t, head h, 0) in a [T, H, width] array.
  FLASHLAB_HD std::size_t at(int t, int h, int width) const {
    return (std::size_t(t) * heads + h) * std::size_t(width);
  }
  /// Row pitch in shared memory of a tile whose rows hold `width` floats (one float of pad, as
  /// the attention kernels: column reads of consecutive rows hit different banks).
  FLASHLAB_HD static int pitch(int width) { return width + 1; }
};

/// The launch description of a causal (∧ user) mask for `heads` heads, head dims d and d_v, k
/// kept blocks (front_door.cpp): the reference's parameter rules and the clear kernels' limits,
/// StreamError naming the parameter otherwise.
StreamProblem make_stream_problem(const ref::stream::BlockMask& mask, std::size_t heads, std::size_t d, std::size_t dv,
                                  std::size_t k);

/// The fields of that launch description alone, no limit checked: for a caller that has checked
/// its own kernel's limits (the fast kernels: check_fast_estimate, fast_apply checks), which keep
/// T·H and n_q·H·k within 32-bit indices.
StreamProblem describe_stream_problem(const ref::stream::BlockMask& mask, std::size_t heads, std::size_t d,
                                      std::size_t dv, std::size_t k);

/// Downloads an estimate's outputs (I: H·n_q·k entries, the scores beside it, one margin per
/// (head, query block)) into the host API's EstimateOutput.
EstimateOutput download_estimate(const ::flashlab::cuda::detail::DeviceBuffer<long long>& I,
                                 const ::flashlab::cuda::detail::DeviceBuffer<float>& scores,
                                 const ::flashlab::cuda::detail::DeviceBuffer<float>& margins, std::size_t k);

/// Device memory a launch needs besides the inputs and outputs, in bytes, and the shared memory
/// per thread block; the host API checks both before launching.
std::size_t estimate_smem_bytes(const StreamProblem& p);
std::size_t apply_smem_bytes(const StreamProblem& p);
std::size_t trace_smem_bytes(const StreamProblem& p);

/// One edge record as the trace kernel writes it (the reference's Edge, 48 bytes, r = −1 for an
/// empty slot that the host squeezes out).
struct EdgeRecord {
  long long q, r, slot;
  double score, mass, value_norm;
};

/// One record narrowed as the C ABI returns it (CompactEdge of flashlab/cuda/stream.hpp, field for
/// field, 24 bytes).
struct CompactEdgeRecord {
  int q, r, slot;
  float score, mass, value_norm;
};

/// stream_estimate.cu: grid (n_q, H). `work` holds 3·k candidates per (head, query block).
/// `mask` is the packed C_blk or nullptr (causal only).
void launch_estimate(const StreamProblem& p, const float* Q, const float* K, const std::uint64_t* mask,
                     void* work, long long* I, float* scores, float* margins);
/// Bytes of the estimate's candidate workspace.
std::size_t estimate_work_bytes(const StreamProblem& p);

/// stream_apply.cu: grid (n_q, H). row_mu / row_lam ([H, T]) receive the final softmax statistics
/// (μ, λ) of every query row when not nullptr (the trace reads them). On `stream`, asynchronous.
void launch_apply(const StreamProblem& p, const float* Q, const float* K, const float* V, const long long* I,
                  float* O, float* row_mu, float* row_lam, cudaStream_t stream = nullptr);
/// stream_apply.cu: grid (query blocks q0 .. q0 + count − 1, k, H); one record per (h, q, slot)
/// into `edges` ([H, count, k]); an empty slot of I gets r = −1. On `stream`, asynchronous.
void launch_trace(const StreamProblem& p, int q0, int count, const float* Q, const float* K, const float* V,
                  const long long* I, const float* row_mu, const float* row_lam, EdgeRecord* edges,
                  cudaStream_t stream = nullptr);
/// stream_apply.cu: `count` records narrowed to 32-bit indices and float weights. On `stream`,
/// asynchronous.
void launch_narrow_edges(const EdgeRecord* edges, CompactEdgeRecord* out, std::size_t count, cudaStream_t stream);

}  // namespace flashlab::cuda::stream::detail
