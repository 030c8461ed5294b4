// What the attention front door (front_door.cpp) shares with its host-vector wrappers (host.cpp)
// (internal): the fast backward's limits, so that a wrapper refuses a bad design or kernel before
// it looks at the sizes of its inputs, with the front door's own messages.
#pragma once

#include "core/common.hpp"
#include "flashlab/cuda/fast_attention.hpp"

namespace flashlab::cuda::detail {

/// The fast backward's limits, checked here and nowhere else: the problem (check_fast_problem),
/// the design (bwd_two_kernel or bwd_atomic) and the kernel (wgmma_ws runs bwd_atomic only, and
/// only where it was built). Returns the launch description; throws std::invalid_argument.
Problem check_fast_backward(ref::Algorithm design, const ref::AttentionProblem& problem, FastBackwardKernel kernel);

}  // namespace flashlab::cuda::detail
