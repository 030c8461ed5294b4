// The launcher of the fast bf16 STREAM estimate kernel (internal; stream_fast_estimate.cu).
#pragma once

#include "stream/stream_common.hpp"

#include <cstddef>
#include <cstdint>

namespace flashlab::cuda::stream::detail {

/// Grid (n_q, H), 128 threads: one thread block per (query block, head). Q and K are bf16
/// [T, H, d] (d = 64 or 128, b_q = b_k = 64, k ≤ 128: checked by the host API); `mask` is the
/// packed C_blk or nullptr; `scores` and `margins` may be nullptr. Asynchronous on `stream` (a
/// cudaStream_t); throws CudaError if the launch fails.
void launch_fast_estimate(const StreamProblem& p, const void* Q, const void* K, const std::uint64_t* mask,
                          long long* I, float* scores, float* margins, void* stream);

}  // namespace flashlab::cuda::stream::detail
