/// @file mta.hpp
/// @brief Host API of the clear CUDA Multi-Token Attention kernels: the tensors, parameters and
/// result types of the CPU reference (flashlab/reference/mta.hpp), computed on the GPU in fp32.
///
/// The kernels mirror `reference/src/mta` tile for tile (Multi token attention in CUDA and
/// Triton): overlapping B × B tiles with strides Br = B − Pq, Bc = B − 2Pk (forward, inference)
/// and Br = B − 2Pq, Bc = B − 4Pk (backward), the convolution on chip, O read-modify-written per
/// key tile, the dQ + dW kernel (dW_i per row tile, added atomically), the dK/dV kernel, the
/// split-K inference kernel and its combine kernel. One thread block per row tile (forward,
/// dQ + dW), per key tile (dK/dV) or per key split (inference), for every (batch, head).
///
/// Each call validates its arguments as the reference does (std::invalid_argument naming the
/// argument), uploads the inputs, poisons every output with NaN, runs the kernels, checks every
/// CUDA call (CudaError) and downloads the results. No CUDA types here: host code including this
/// header needs no nvcc.
#pragma once

#include "flashlab/cuda/options.hpp"
#include "flashlab/cuda/traffic_probe.hpp"
#include "flashlab/reference/mta.hpp"
#include "flashlab/reference/tensor.hpp"

#include <cstddef>

namespace flashlab::cuda::mta {

/// Flash MTA forward: O, and the row statistics M (final m_i) and L (final ℓ_i), both
/// `[B, N, H, 1]` as the reference's flash_forward returns them.
ref::mta::FlashForward<float> forward(const ref::Tensor<float>& q, const ref::Tensor<float>& k,
                                      const ref::Tensor<float>& v, const ref::mta::Weights<float>& w,
                                      const ref::mta::Params& p);

/// Flash MTA backward for the loss ⟨O, dO⟩: D preprocessing, the dQ + dW kernel and the dK/dV
/// kernel. `o`, `m`, `l` are the forward's O, M and L (`[B, N, H, 1]` for M and L).
ref::mta::Grads<float> backward(const ref::Tensor<float>& q, const ref::Tensor<float>& k,
                                const ref::Tensor<float>& v, const ref::mta::Weights<float>& w,
                                const ref::Tensor<float>& o, const ref::Tensor<float>& m,
                                const ref::Tensor<float>& l, const ref::Tensor<float>& d_o,
                                const ref::mta::Params& p);

/// Split-K inference: the output of the last token, `[B, 1, H, d]`, from `p.splits` key splits
/// and (when splits > 1) the combine kernel. Requires cq ≤ 16.
ref::Tensor<float> infer(const ref::Tensor<float>& q, const ref::Tensor<float>& k, const ref::Tensor<float>& v,
                         const ref::mta::Weights<float>& w, const ref::mta::Params& p);

/// The pass the traffic probe measures.
enum class Pass {
  forward,   ///< mta_zero_fill (O = 0), mta_fwd_kernel
  backward,  ///< mta_bwd_preprocess, mta_zero_fill (dW = 0), mta_bwd_dq_dw, mta_bwd_dk_dv
  infer      ///< mta_infer_split, then mta_infer_combine when splits > 1
};

/// Shape, MTA parameters and measurement settings of one traffic measurement.
struct ProbeConfig {
  ref::Shape shape{1, 2048, 16, 64};                 ///< [B, N, H, d]
  ref::mta::Params params{};                         ///< cq, ck, B, splits, scale
  unsigned long long seed = 1;                       ///< seed of the random inputs
  std::size_t flush_bytes = std::size_t(256) << 20;  ///< L2 flush buffer (≫ the 50 MB L2)
};

/// Runs one pass on seeded random inputs under the CUPTI Range Profiler, flushing L2 before
/// every measured kernel (the recipe of traffic_probe.hpp), and returns one entry per kernel in
/// launch order. A backward measurement first runs the forward, unmeasured, for O, M and L.
ProbeResult measure(Pass pass, const ProbeConfig& cfg);

}  // namespace flashlab::cuda::mta
