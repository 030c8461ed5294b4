/// @file attention.hpp
/// @brief Host API of the CUDA attention kernels: the same tensors as the CPU reference.
///
/// Inputs are `flashlab::ref::Tensor<float>` of shape `[B, N, H, d]` (B = 1 for the seed's
/// `[SEQ, HEAD_NUM, HEAD_DIM]`), the statistics LSE and D are `[B, H, N]` vectors, LSE in base 2
/// (seed 001). Each call copies the inputs to the GPU, poisons the outputs with NaN, runs the
/// kernels, checks every CUDA call and copies the results back. Errors throw CudaError (CUDA) or
/// std::invalid_argument (shapes, tiles) with a message that names the argument.
#pragma once

#include "flashlab/cuda/options.hpp"
#include "flashlab/reference/tensor.hpp"

#include <vector>

namespace flashlab::cuda {

/// Results of a forward pass.
struct ForwardResult {
  ref::Tensor<float> O;    ///< output, [B, N, H, d]
  std::vector<float> LSE;  ///< base-2 log-sum-exp of the scaled scores, [B, H, N] (every variant)
};

/// Results of a backward pass.
struct BackwardResult {
  ref::Tensor<float> dQ;  ///< gradient of Q, [B, N, H, d]
  ref::Tensor<float> dK;  ///< gradient of K, [B, N, H, d]
  ref::Tensor<float> dV;  ///< gradient of V, [B, N, H, d]
  std::vector<float> D;   ///< D_i = rowsum(dO_i ∘ O_i), [B, H, N]
};

/// Runs one forward variant on the GPU.
ForwardResult attention_forward(ForwardVariant variant, const ref::Tensor<float>& Q, const ref::Tensor<float>& K,
                                const ref::Tensor<float>& V, const Options& opt);

/// Runs one backward variant on the GPU; `LSE` is the base-2 LSE of the fa2 forward ([B, H, N]).
BackwardResult attention_backward(BackwardVariant variant, const ref::Tensor<float>& Q,
                                  const ref::Tensor<float>& K, const ref::Tensor<float>& V,
                                  const ref::Tensor<float>& O, const ref::Tensor<float>& dO,
                                  const std::vector<float>& LSE, const Options& opt);

}  // namespace flashlab::cuda
