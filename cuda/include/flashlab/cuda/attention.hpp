/// @file attention.hpp
/// @brief Host API of the clear CUDA attention kernels (fp32 on CUDA cores): the same problem
///        and tensors as the CPU reference.
///
/// Inputs are `flashlab::ref::Tensor<float>` of the problem's shape `[B, N, H, d]`, the
/// statistics LSE and D are `[B, H, N]` vectors, LSE in base 2. Each call checks the problem
/// (check_clear_problem(), options.hpp), copies the inputs to the GPU, poisons the outputs with NaN, runs the
/// kernels, checks every CUDA call and copies the results back. Errors throw CudaError (CUDA) or
/// std::invalid_argument (problem, shapes) with a message that names the field.
#pragma once

#include "flashlab/cuda/options.hpp"
#include "flashlab/reference/attention_problem.hpp"
#include "flashlab/reference/tensor.hpp"

#include <cstddef>
#include <vector>

namespace flashlab::cuda {

/// Results of a forward pass.
struct ForwardResult {
  ref::Tensor<float> O;    ///< output, [B, N, H, d]
  std::vector<float> LSE;  ///< base-2 log-sum-exp of the scaled scores, [B, H, N] (every algorithm)
};

/// Results of a backward pass.
struct BackwardResult {
  ref::Tensor<float> dQ;  ///< gradient of Q, [B, N, H, d]
  ref::Tensor<float> dK;  ///< gradient of K, [B, N, H, d]
  ref::Tensor<float> dV;  ///< gradient of V, [B, N, H, d]
  std::vector<float> D;   ///< D_i = rowsum(dO_i ∘ O_i), [B, H, N]
};

/// Runs the forward `algorithm` (naive_fwd, fa1_fwd or fa2_fwd) of `problem` on the GPU.
/// `fa1_query_split` (fa1_fwd only): how many thread blocks share one head's query tiles. 1 is
/// FA1 as published (one block per head and batch, K_j/V_j read once); s > 1 runs s blocks per
/// head, each reading K and V once, so K/V traffic grows s-fold; 0 picks enough blocks to fill
/// the GPU.
ForwardResult attention_forward(ref::Algorithm algorithm, const ref::AttentionProblem& problem,
                                const ref::Tensor<float>& Q, const ref::Tensor<float>& K,
                                const ref::Tensor<float>& V, int fa1_query_split = 0);

/// Runs the backward `algorithm` (bwd_two_kernel or bwd_atomic) of `problem` on the GPU; `LSE`
/// is the base-2 LSE of the fa2 forward ([B, H, N]).
BackwardResult attention_backward(ref::Algorithm algorithm, const ref::AttentionProblem& problem,
                                  const ref::Tensor<float>& Q, const ref::Tensor<float>& K,
                                  const ref::Tensor<float>& V, const ref::Tensor<float>& O,
                                  const ref::Tensor<float>& dO, const std::vector<float>& LSE);

}  // namespace flashlab::cuda
