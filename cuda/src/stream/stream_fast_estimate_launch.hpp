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
/// With q_count > 0 only query blocks q_first … q_first + q_count − 1 are estimated (a shard of the
/// sequence): Q then holds their tokens from its row 0 ([T − 64·q_first rows, H, d], the tail past the
/// shard never read), K is still indexed by global token (rows 0 … of every block they may see), and
/// I, scores, margins hold [head_count, q_count, ·]; each row bitwise that of a whole-sequence launch.
void launch_fast_estimate(const StreamProblem& p, int head0, int head_count, const void* Q, const void* K,
                          const std::uint64_t* mask, long long* I, float* scores, float* margins, void* stream,
                          int q_first = 0, int q_count = 0);

}  // namespace flashlab::cuda::stream::detail
