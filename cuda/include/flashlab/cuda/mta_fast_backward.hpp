/// @file mta_fast_backward.hpp
/// @brief Host API of the fast Multi-Token Attention backward and split-K decode: bf16 or fp16
/// Q, K, V, O, dO; fp32 convolution kernels W and gradient dW; products on tensor cores
/// (`mma.sync` m16n8k16, fp32 accumulation); the convolution, its transpose and dW on chip.
///
/// Semantics are the reference's (flashlab/reference/mta.hpp): S = scale·Q Kᵀ with causal zeros,
/// Ŝ = Conv2D(S, W) (Pq = cq − 1 past queries, Pk = (ck − 1)/2 keys each side), causal −∞, P =
/// softmax(Ŝ), O = P V, loss ⟨O, dO⟩. Layouts: Q, K, V, O, dO, dQ, dK, dV `[B, N, H, d]`
/// row-major in the dtype's 16-bit bit patterns (uint16_t: no CUDA types here, CPU code may
/// include this header); W and dW `[H, cq, ck]` fp32; LSE and D `[B, H, N]` fp32, LSE the fast
/// forward's (mta_fast.hpp): base 2, LSE_i = log2 Σ_j 2^(Ŝ_ij·log2 e).
///
/// Shapes, kernel sizes, dtype and scale are a FastShape, whose limits check_fast_shape() states
/// for the forward, the backward and the decode alike (the tiles are fixed:
/// cuda/src/mta/mta_fast_bwd.cu and mta_fast_decode.cu state them).
#pragma once

#include "flashlab/cuda/mta_fast.hpp"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace flashlab::cuda::mta {

// ---------------------------------------------------------------------------------- backward

/// Gradients of the fast backward copied back to the host.
struct FastBackwardGrads {
  std::vector<std::uint16_t> dQ;  ///< ∂L/∂Q `[B, N, H, d]`, bit patterns of the dtype
  std::vector<std::uint16_t> dK;  ///< ∂L/∂K `[B, N, H, d]`
  std::vector<std::uint16_t> dV;  ///< ∂L/∂V `[B, N, H, d]`
  std::vector<float> dW;          ///< ∂L/∂W `[H, cq, ck]`, summed over the batch
  std::vector<float> D;           ///< D_i = rowsum(dO_i ∘ O_i) `[B, H, N]`
};

/// Device pointers of one fast backward call (layouts in the file comment).
struct FastBackwardPointers {
  const void* Q;     ///< `[B, N, H, d]` 16-bit
  const void* K;     ///< `[B, N, H, d]` 16-bit
  const void* V;     ///< `[B, N, H, d]` 16-bit
  const float* W;    ///< `[H, cq, ck]` fp32
  const void* O;     ///< the forward's output, `[B, N, H, d]` 16-bit
  const void* dO;    ///< `[B, N, H, d]` 16-bit
  const float* LSE;  ///< the forward's base-2 LSE, `[B, H, N]`
  void* dQ;          ///< out, `[B, N, H, d]` 16-bit
  void* dK;          ///< out, `[B, N, H, d]` 16-bit
  void* dV;          ///< out, `[B, N, H, d]` 16-bit
  float* dW;         ///< out, `[H, cq, ck]` fp32 (overwritten, not added to)
};

/// Bytes of device scratch fast_backward_device() needs: D (fp32, B·H·N) and the fp32 dQ
/// accumulator (B·N·H·d floats), each at a 256-byte aligned offset. No N × N buffer: the
/// scratch grows as O(N·H·d).
std::size_t fast_backward_workspace_bytes(const FastShape& shape);

/// The backward on the caller's device memory: zero dW and the dQ accumulator (cudaMemsetAsync),
/// D preprocessing, the gradient kernel (one block per key tile K_j, V_j; loop over query tiles),
/// the dQ conversion, all on `stream` (a cudaStream_t passed as void*; nullptr: the legacy
/// default stream). No host copy, no allocation, no synchronisation: safe from several host
/// threads on several streams at once and under CUDA graph capture. `workspace` holds
/// fast_backward_workspace_bytes(shape) bytes of device memory, 256-byte aligned, used by this
/// call alone until it completes; its contents need no initialisation and its first B·H·N floats
/// hold D on completion. Layouts as the file comment states (every pointer checked: non-null,
/// 16-byte aligned for 16-bit tensors, 4-byte for fp32). Throws std::invalid_argument for a bad
/// shape or pointer, CudaError if a launch fails.
void fast_backward_device(const FastShape& shape, const FastBackwardPointers& ptrs, void* workspace,
                          void* stream = nullptr);

/// Uploads the inputs (16-bit bit patterns; W fp32 `[H, cq, ck]`; LSE base 2 `[B, H, N]`),
/// poisons the outputs and the workspace with NaN, runs fast_backward_device(), checks every CUDA
/// call and downloads dQ, dK, dV, dW and D. Throws std::invalid_argument for a bad problem or a
/// wrong input size, CudaError for a CUDA failure.
FastBackwardGrads fast_backward(const FastShape& shape, const std::vector<std::uint16_t>& Q, const std::vector<std::uint16_t>& K,
                                const std::vector<std::uint16_t>& V, const std::vector<float>& W,
                                const std::vector<std::uint16_t>& O, const std::vector<std::uint16_t>& dO,
                                const std::vector<float>& LSE);

// ---------------------------------------------------------------------------------- decode

/// Query rows of the split-K decode: the last 16 tokens N − 16 … N − 1 (fewer when N < 16).
inline constexpr int kDecodeRows = 16;

/// Device pointers of one split-K decode call.
struct FastDecodePointers {
  const void* Q;   ///< `[B, N, H, d]` 16-bit (only the last rows and the Pq rows above are read)
  const void* K;   ///< `[B, N, H, d]` 16-bit
  const void* V;   ///< `[B, N, H, d]` 16-bit
  const float* W;  ///< `[H, cq, ck]` fp32
  void* O;         ///< out, `[B, R, H, d]` 16-bit, R = min(16, N): rows N − R … N − 1
  float* LSE = nullptr;  ///< out unless null, `[B, H, R]` fp32, base 2 as the forward's: log2 Σ_j 2^(Ŝ_ij·log2 e)
};

/// Outputs of the decode copied back to the host.
struct FastDecodeOutput {
  std::vector<std::uint16_t> O;  ///< `[B, R, H, d]` bit patterns of the dtype, rows N − R … N − 1
  std::vector<float> LSE;        ///< `[B, H, R]` base 2
};

/// The number of key splits the decode uses for `shape` and kernel size `p` on the current
/// device: one wave of resident blocks when B·H allows, no split empty. Throws CudaError when no device can
/// be queried.
int fast_decode_splits(const FastShape& shape);

/// Bytes of device scratch fast_decode_device() needs: the per-split partials O_s (fp32,
/// B·H·splits·16·d), m_s and ℓ_s (fp32, B·H·splits·16 each), 256-byte aligned.
std::size_t fast_decode_workspace_bytes(const FastShape& shape);

/// The split-K decode on the caller's device memory: the split kernel (each block one range of
/// key tiles for one (b, h): scores of the 16 rows on tensor cores, the convolution on chip,
/// online softmax, partial O_s, m_s, ℓ_s into `workspace`) and the combine kernel (O, and LSE
/// unless `ptrs.LSE` is null), on `stream`. No host copy, no allocation, no synchronisation:
/// safe from several host threads and streams and under graph capture. `workspace` holds
/// fast_decode_workspace_bytes(shape) bytes (256-byte aligned; the split count, and so the size,
/// depends on the current device's SM count: query it on the device that runs the call).
/// Pointers checked as fast_backward_device(). Throws std::invalid_argument for a bad shape or
/// pointer, CudaError if a launch fails.
void fast_decode_device(const FastShape& shape, const FastDecodePointers& ptrs, void* workspace,
                        void* stream = nullptr);

/// Uploads, poisons, runs fast_decode_device(), checks and downloads O and LSE of the last
/// R = min(16, N) rows. Throws std::invalid_argument for a bad problem or a wrong input size,
/// CudaError for a CUDA failure.
FastDecodeOutput fast_decode(const FastShape& shape, const std::vector<std::uint16_t>& Q, const std::vector<std::uint16_t>& K,
                                       const std::vector<std::uint16_t>& V, const std::vector<float>& W);

}  // namespace flashlab::cuda::mta
