// Internal launch interface of the fast MTA backward and decode (mta_fast_bwd.cu,
// mta_fast_decode.cu), called by the front door (front_door.cpp). Plain types only: the .cu files
// do not include the reference's Eigen headers.
#pragma once

#include "core/common.hpp"

#include <cstddef>
#include <cstdint>

namespace flashlab::cuda::detail::mta_fast {

/// Sizes of one fast MTA call (checked by check_fast_shape before they get here).
struct Geometry {
  int batch = 1, seq = 0, heads = 1, head_dim = 0;  ///< B, N, H, d
  int cq = 1, ck = 1;                               ///< kernel size
  int pq = 0, pk = 0;                               ///< Pq = cq − 1, Pk = (ck − 1)/2
  int br = 0, bc = 0;                               ///< effective strides Br, Bc of the backward tiles
  int tr = 0, tc = 0;                               ///< Tr = ⌈N/Br⌉, Tc = ⌈N/Bc⌉
  int splits = 1;                                   ///< decode: key splits
  int keys_per_split = 0;                           ///< decode: effective keys per split (multiple of its Bc)
  float scale = 1.f;                                ///< softmax scale (natural units)

  /// Elements between two tokens of one head (H·d).
  FLASHLAB_HD std::size_t row_stride() const { return std::size_t(heads) * head_dim; }
  /// Offset of element (b, token 0, h, 0) in a [B, N, H, d] tensor.
  FLASHLAB_HD std::size_t head_offset(int b, int h) const {
    return std::size_t(b) * seq * row_stride() + std::size_t(h) * head_dim;
  }
  /// Offset of row 0 of head (b, h) in a [B, H, N] statistics vector (LSE, D).
  FLASHLAB_HD std::size_t stat_offset(int b, int h) const { return (std::size_t(b) * heads + h) * std::size_t(seq); }
  /// Taps of one kernel W.
  FLASHLAB_HD int taps() const { return cq * ck; }
};

/// Loaded tile sizes of the backward kernel: BLOCK_M query rows per step (Br = BLOCK_M − 2Pq
/// effective), BLOCK_N keys per block (Bc = BLOCK_N − 4Pk effective).
inline constexpr int kBwdBlockM = 64;
inline constexpr int kBwdBlockN = 128;
/// Owned keys per tile of the decode kernel (Bc, whatever the kernel size: a tile loads a halo of
/// 8 ≥ Pk keys each side besides them).
inline constexpr int kDecodeBlockN = 64;
/// Resident blocks per SM of the decode split kernel (its __launch_bounds__ and SRAM allow two).
inline constexpr int kDecodeBlocksPerSm = 2;
/// The largest kernel the fast paths take (cq ≤ 16, ck ≤ 15).
inline constexpr int kMaxCq = 16;
inline constexpr int kMaxCk = 15;

/// Device pointers of the backward (16-bit tensors as uint16_t).
struct BwdArgs {
  const std::uint16_t *Q, *K, *V, *O, *dO;
  const float *W, *LSE;
  float* D;        ///< workspace: D_i, [B, H, N]
  float* dQaccum;  ///< workspace: fp32 dQ, [B, N, H, d]
  std::uint16_t *dQ, *dK, *dV;
  float* dW;  ///< [H, cq, ck]
};

/// Zero dW and dQaccum, D preprocessing, the gradient kernel, the dQ conversion.
void launch_backward(const Geometry& g, bool bf16, const BwdArgs& a, cudaStream_t stream);

/// Device pointers of the decode.
struct DecodeArgs {
  const std::uint16_t *Q, *K, *V;
  const float* W;
  float *O_s, *m_s, *l_s;  ///< workspace: per-split partials [B, H, splits, 16, d] and [B, H, splits, 16]
  std::uint16_t* O;        ///< [B, R, H, d]
  float* LSE;              ///< [B, H, R] base 2, or null
};

/// The split kernel and the combine kernel.
void launch_decode(const Geometry& g, bool bf16, const DecodeArgs& a, cudaStream_t stream);

}  // namespace flashlab::cuda::detail::mta_fast
