/// @file mta_fast.hpp
/// @brief The fast Multi-Token Attention forward (bf16 or fp16 in, fp32 accumulation) on tensor
/// cores: a host-level entry on reference tensors (tests, `flashlab mta fwd --kernel fast`) and a
/// device-pointer entry (benchmarks, the backward). No CUDA types here.
///
/// Semantics: exactly the reference's (flashlab/reference/mta.hpp): S = scale·QKᵀ, zeros where
/// j > i, the cq × ck cross-correlation over (query, key) with Pq = cq − 1 zero rows above and
/// Pk = (ck − 1)/2 zero columns each side, −∞ where j > i, softmax over j, O = P V. Causal by
/// definition.
///
/// Algorithm (cuda/src/mta/mta_fast_fwd.cu): one thread block per query tile of Br = kFastBr effective
/// rows of one (batch, head), in the FlashAttention-2 order: O_i, m_i, ℓ_i stay on chip across the
/// key tiles (no read-modify-write of O in HBM) and O is written once at the end. Per key tile of
/// Bc = kFastBc effective keys: S on tensor cores (mma.sync m16n8k16) for the tile *with its halo*
/// (16 query rows above, 8 key columns each side: Pq ≤ 15, Pk ≤ 7) into shared memory in fp32,
/// causal zeros, the convolution on chip in fp32, −∞ where j > i, online softmax in base 2, P
/// rounded to the input dtype and P V on tensor cores. Key tiles entirely right of the block's
/// last row are skipped (their Ŝ is all −∞ whatever the halo holds). The linear path (bf16,
/// fast_uses_linear_path) replaces the first three steps on the key tiles left of the diagonal
/// band, where the causal zeros before the convolution change nothing: Ŝ = Σ_b Q̃_b K_bᵀ, one
/// tensor-core product with Q̃ built once per block (kFastLinearMaxCk).
///
/// LSE convention (the same as fast_attention.hpp's, which the backward consumes): LSE is fp32
/// `[B, H, N]`, **base 2 of base-2 scores**: with Ŝ the convolved, scaled scores (natural units),
/// LSE_i = log2 Σ_{j ≤ i} 2^(Ŝ_ij·log2 e), so that P_ij = 2^(Ŝ_ij·log2 e − LSE_i) and
/// LSE_i = ln Σ_j e^(Ŝ_ij) · log2 e. A row with no finite score (not reachable for rows < N:
/// key 0 is always visible) would get LSE = −∞ and O = 0.
///
/// Extra device memory: none beyond the outputs. The kernel writes O (B·N·H·d 16-bit values) and
/// LSE (4·B·H·N bytes, the only O(N·H) state); W is read in fp32 (4·H·cq·ck bytes). No N × N
/// buffer, no workspace (only the source-order variant for measurement, FastOOrder::source, has
/// one: fast_source_order_workspace_bytes()).
#pragma once

#include "flashlab/reference/mta.hpp"
#include "flashlab/reference/tensor.hpp"
#include "flashlab/reference/traffic.hpp"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace flashlab::cuda::mta {

/// Effective query rows per thread block of the fast forward (Br).
inline constexpr int kFastBr = 64;
/// Effective keys per key tile of the fast forward (Bc).
inline constexpr int kFastBc = 64;
/// Largest kernel height the fast forward takes (cq ≤ 16: the 16-row halo holds Pq ≤ 15).
inline constexpr int kFastMaxCq = 16;
/// Largest kernel width the fast forward takes (odd ck ≤ 15: the 8-column halos hold Pk ≤ 7).
inline constexpr int kFastMaxCk = 15;
/// Widest kernel the forward's linear path takes (bf16 only): off the diagonal, Ŝ = Σ_b Q̃_b K_bᵀ
/// with Q̃_b = Σ_a W[a, b]·Q shifted by a rows, one tensor-core product of inner dimension
/// 2·ck·d per key tile (Q̃ as two bf16 terms: its rounding and the remainder) instead of S in SRAM
/// and the convolution on CUDA cores.
inline constexpr int kFastLinearMaxCk = 3;

/// Shape and parameters of one fast forward on device pointers.
struct FastShape {
  int batch = 1;     ///< B
  int seq = 0;       ///< N (≥ 1)
  int heads = 1;     ///< H
  int head_dim = 64; ///< d (64 or 128)
  int cq = 1;        ///< kernel rows, 1 ≤ cq ≤ kFastMaxCq
  int ck = 1;        ///< kernel columns, odd, 1 ≤ ck ≤ kFastMaxCk
  ref::Dtype dtype = ref::Dtype::bf16;  ///< bf16 or fp16 (Q, K, V, O)
  float scale = 0.f;  ///< softmax scale (natural units); 0 means 1/√d
  /// The linear path on the key tiles left of the diagonal band (kFastLinearMaxCk): 1 on, 0 off
  /// (the masked path — S in SRAM, the convolution on CUDA cores — on every tile), −1:
  /// fast_uses_linear_path() decides. On, a block still leaves it for the masked path at the first
  /// key tile where max|Q̃|·max|K_j| exceeds its accuracy guard (inputs far from unit scale).
  int linear_path = -1;
};

/// The linear-path policy, stated here only: shape.linear_path when ≥ 0, else on for bf16 at
/// d = 64 with ck ≤ min(cq, kFastLinearMaxCk) — where it measured faster (at d = 128 its Q̃ tiles
/// halve the blocks per SM; at 1 × 3 the masked path is faster) — else off.
bool fast_uses_linear_path(const FastShape& shape);

/// The fast forward's limits, checked here and nowhere else: B, N, H ≥ 1, grid limits
/// (H, B ≤ 65535), d ∈ {64, 128}, 1 ≤ cq ≤ kFastMaxCq, ck odd in [1, kFastMaxCk], dtype bf16 or
/// fp16, B·N·H·d < 2³¹, linear_path ∈ {−1, 0, 1} and 1 only for bf16 with ck ≤ kFastLinearMaxCk.
/// Throws std::invalid_argument naming the field, its value and a hint.
void check_fast_shape(const FastShape& shape);

/// The forward on the caller's device memory: launches on `stream` (a cudaStream_t passed as
/// void*; nullptr is the legacy default stream) and returns; no host copy, no allocation, no
/// synchronisation, so it may run from several host threads on several streams at once and under
/// CUDA graph capture. Layout (the pointers checked: non-null, 16-byte aligned for the 16-bit
/// tensors, 4-byte for the fp32 ones): Q, K, V, O contiguous `[B, N, H, d]` 16-bit values of
/// `shape.dtype`; W contiguous `[H, cq, ck]` fp32; LSE contiguous `[B, H, N]` fp32, base 2 (see
/// the file comment), written in full. No workspace. Throws std::invalid_argument for a bad shape
/// or pointer, CudaError if the launch fails.
void fast_forward_device(const FastShape& shape, const void* Q, const void* K, const void* V, const float* W, void* O,
                         float* LSE, void* stream = nullptr);

/// Where the fast forward keeps O_i, m_i and ℓ_i between key tiles.
enum class FastOOrder {
  on_chip,  ///< in registers, O written once at the end (the FlashAttention-2 order; the default)
  /// to an fp32 workspace after each key tile and back before the next, as the source's
  /// read-modify-write order; for measuring what the on-chip order saves (bf16, d = 64 only)
  source,
};

/// Refuses a shape the source-order variant is not compiled for (check_fast_shape() first, then
/// bf16 and d = 64, the shape it is measured at); std::invalid_argument with a hint.
void check_fast_source_order(const FastShape& shape);

/// Bytes of the source-order workspace: fp32 O, m, ℓ for every row padded to whole query tiles,
/// 4·B·H·⌈N/kFastBr⌉·kFastBr·(d + 2).
std::size_t fast_source_order_workspace_bytes(const FastShape& shape);

/// fast_forward_device() in the source's order (FastOOrder::source), same results up to fp32
/// rounding order (none: the values make the trip exactly). `workspace`: device memory of
/// fast_source_order_workspace_bytes(); its contents need no initialisation.
void fast_forward_source_order_device(const FastShape& shape, const void* Q, const void* K, const void* V,
                                      const float* W, void* O, float* LSE, void* workspace, void* stream = nullptr);

/// Result of the host-level fast forward.
struct FastForwardOutput {
  ref::Tensor<float> o;   ///< O `[B, N, H, d]`: the kernel's 16-bit outputs, widened exactly
  std::vector<float> lse; ///< LSE `[B, H, N]`, base 2 (file comment)
};

/// Rounds Q, K, V to `dtype` (bf16 or fp16, to nearest even), uploads them and W (fp32),
/// poisons O and LSE with NaN, runs fast_forward_device() and downloads the results. Validates
/// as the reference does (ref::mta::validate) and then check_fast_shape(); `p.block` and
/// `p.splits` are not used (the tiles are fixed), `p.scale` is. Throws std::invalid_argument for
/// bad arguments, CudaError for a CUDA failure. `linear_path` as FastShape::linear_path; `order`
/// FastOOrder::source runs fast_forward_source_order_device() instead.
FastForwardOutput fast_forward(const ref::Tensor<float>& q, const ref::Tensor<float>& k, const ref::Tensor<float>& v,
                               const ref::mta::Weights<float>& w, const ref::mta::Params& p,
                               ref::Dtype dtype = ref::Dtype::bf16, int linear_path = -1,
                               FastOOrder order = FastOOrder::on_chip);

}  // namespace flashlab::cuda::mta
