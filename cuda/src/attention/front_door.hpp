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

/// The fast forward with O stored in fp32, unrounded, [B, N, H, d] (LSE as the 16-bit call): the
/// context-parallel ring's per-block partials, merged by LSE in fp32 and rounded to 16 bits once.
/// `kernel` mma_sync or tma_ws (the other forwards have no fp32 output); a dense problem without a
/// window, d ∈ {64, 128}. Launches on `stream` as fast_attention_forward_device(). Throws
/// std::invalid_argument for a problem, kernel or pointer it refuses, CudaError if a launch fails.
void fast_forward_f32_device(const ref::AttentionProblem& problem, FastForwardKernel kernel, const void* Q,
                             const void* K, const void* V, float* O, float* LSE, void* stream);

/// The bwd_atomic design ADDING its gradients, unrounded, into fp32 sums: dQ += scale ·
/// accumulator ([B, N, H, d]), dK, dV += the block's ([B, N_k, H_kv, d]); the context-parallel
/// ring's per-block gradients, summed across the ring and rounded to 16 bits once. Workspace,
/// kernels and limits as fast_attention_backward_device() with bwd_atomic (the grouped
/// instantiations run, any H_kv; wgmma_ws_deterministic keeps its fixed dQ order where H_kv = H),
/// and a dense problem without a window. Launches on `stream` and returns.
void fast_backward_add_f32_device(const ref::AttentionProblem& problem, const void* Q, const void* K, const void* V,
                                  const void* O, const void* dO, const float* LSE, float* dQ, float* dK, float* dV,
                                  void* workspace, void* stream, FastBackwardKernel kernel);

}  // namespace flashlab::cuda::detail
