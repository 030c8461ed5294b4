/// @file options.hpp
/// @brief Tile options, variants and errors of the CUDA attention kernels (no CUDA types here,
/// so CPU-only code may include it).
#pragma once

#include <stdexcept>
#include <string>

namespace flashlab::cuda {

/// Tile parameters and masking, the same names as the reference (seed 001).
struct Options {
  int block_m = 64;     ///< BLOCK_M = Br: query rows per tile (1..128)
  int block_n = 32;     ///< BLOCK_N = Bc: key rows per tile (1..128)
  bool causal = false;  ///< causal mask: query i sees keys j <= i
  double scale = 0.0;   ///< softmax scale; 0 means 1/sqrt(HEAD_DIM)
  /// FA1 only: how many thread blocks share one head's query tiles. 1 is FA1 as published (one
  /// block per head and batch, K_j/V_j read once); s > 1 runs s blocks per head, each reading
  /// K and V once, so K/V traffic grows s-fold. 0 picks enough blocks to fill the GPU.
  int fa1_query_split = 0;
};

/// Forward algorithms.
enum class ForwardVariant {
  naive,  ///< S = QKᵀ, P = softmax(S), O = PV, with S and P materialised in HBM (3 kernels)
  fa1,    ///< FlashAttention-1 loop order: outer loop over K_j/V_j, inner over Q_i; O, m, l in HBM
  fa2     ///< FlashAttention-2 loop order: one block per Q_i, inner loop over K_j/V_j; LSE base 2
};

/// Backward algorithms (both start with the D preprocessing kernel).
enum class BackwardVariant {
  two_kernel,  ///< D preprocessing, dQ kernel, dK/dV kernel (seed 001, 12N²d FLOPs)
  atomic       ///< D preprocessing, dQ zero-fill, one dK/dV kernel that adds into dQ atomically
};

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
