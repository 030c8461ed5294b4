// The launcher of the fast bf16 STREAM estimate kernel (internal; stream_fast_estimate.cu).
#pragma once

#include "stream/stream_common.hpp"

#include <cstddef>
#include <cstdint>

namespace flashlab::cuda::stream::detail {

/// Grid (n_q, head_count), 128 threads: one thread block per (query block, head) for heads head0 …
/// head0 + head_count − 1 of Q and K (bf16 [T, p.heads, d]; d = 64 or 128, b_q = b_k = 64, k ≤ 128
/// and the range: checked by the host API); I, scores and margins hold those heads only
/// ([head_count, n_q, k], [head_count, n_q]). `mask` is the packed C_blk or nullptr; `scores` and
/// `margins` may be nullptr. Asynchronous on `stream` (a cudaStream_t); throws CudaError if the
/// launch fails.
void launch_fast_estimate(const StreamProblem& p, int head0, int head_count, const void* Q, const void* K,
                          const std::uint64_t* mask, long long* I, float* scores, float* margins, void* stream);

/// The same for query blocks q_first … q_first + q_count − 1 only (a shard of the sequence), every
/// head: Q holds their tokens from its row 0 ([T − 64·q_first rows, H, d], rows past the range
/// never read), K is indexed by global token (it must hold every row the range may see), and I,
/// scores, margins hold [H, q_count, ·]. Each row is bitwise launch_fast_estimate's: the same code,
/// instantiated apart so that the whole-sequence kernel stays as it was.
void launch_fast_estimate_range(const StreamProblem& p, int q_first, int q_count, const void* Q, const void* K,
                                long long* I, float* scores, float* margins, void* stream);

}  // namespace flashlab::cuda::stream::detail
