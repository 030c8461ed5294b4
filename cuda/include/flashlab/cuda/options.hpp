/// @file options.hpp
/// @brief Errors, device queries and the clear kernels' limits (no CUDA types and no Eigen here,
/// so CPU-only code and CUDA sources may include it). The problem a kernel solves is a
/// ref::AttentionProblem (flashlab/reference/attention_problem.hpp), its algorithm a
/// ref::Algorithm; the fast kernels' limits are in fast_attention.hpp.
#pragma once

#include "flashlab/reference/attention_problem.hpp"

#include <cstddef>
#include <stdexcept>
#include <string>

namespace flashlab::cuda {

/// Largest Br and Bc of the clear kernels: a block of 128 threads gives each tile row a thread.
inline constexpr std::size_t kClearMaxTileRows = 128;
/// Largest d of the clear kernels: they keep whole rows of d in SRAM.
inline constexpr std::size_t kClearMaxHeadDim = 256;

/// The clear kernels' limits beyond ref::AttentionProblem::validate(), checked here and nowhere
/// else: `algorithm` is naive_fwd, fa1_fwd, fa2_fwd, bwd_two_kernel or bwd_atomic; dtype fp32;
/// no grouped K/V, packed sequences or window (ref::AttentionProblem::extended_feature());
/// N_k = N (self-attention); B·N·H·d below 2³¹; d ≤ kClearMaxHeadDim; Br, Bc ≤ kClearMaxTileRows; naive_fwd:
/// N ≤ the row its softmax holds in SRAM. Validates the problem first. Throws
/// std::invalid_argument naming the field, the value, the limit and a hint.
void check_clear_problem(ref::Algorithm algorithm, const ref::AttentionProblem& problem);

/// A CUDA runtime, driver or CUPTI failure; the message names the call and file:line.
class CudaError : public std::runtime_error {
 public:
  /// Wraps a formatted message.
  explicit CudaError(const std::string& what) : std::runtime_error(what) {}
};

/// True when a CUDA device can be used; otherwise false and, if `why` is given, the reason.
bool device_available(std::string* why = nullptr);

/// Name of device 0 with its SM count and L2 size, e.g. "NVIDIA H100 80GB HBM3 (132 SMs, L2 50 MiB)".
std::string device_description();

}  // namespace flashlab::cuda
