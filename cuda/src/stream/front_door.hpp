// What the STREAM front door (front_door.cpp) shares with the host-array entries (host.cpp) and
// the benchmark (internal): the clear kernels' limits as a launch description, and their
// shared-memory check.
#pragma once

#include "stream/stream_common.hpp"

#include <cstddef>

namespace flashlab::cuda::stream::detail {

/// Throws ref::stream::StreamError when a clear kernel's `bytes` of shared memory exceed what the
/// current device gives one block (naming the kernel, b_q, b_k, d, d_v and a hint).
void check_smem(std::size_t bytes, const char* kernel, const StreamProblem& p);

}  // namespace flashlab::cuda::stream::detail
