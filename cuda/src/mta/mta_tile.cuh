// Shared plumbing of the clear MTA kernels (internal): the launch description, tile loads and
// stores that clip at both ends of the sequence, the on-chip convolution and its transpose, and
// the launcher declarations. Names follow reference/src/mta (tile.hpp): B, Pq, Pk, Br, Bc, I_s,
// J_s, m_i, ℓ_i, α, β, D_i, dW_i.
//
// Layouts on the device: Q, K, V, O, dO, dQ, dK, dV are [B, N, H, d] as the reference's Tensor;
// W and dW are [H, cq, ck]; the row statistics M, L, D are [B, H, N] (one head's rows
// contiguous, so a tile of statistics is one contiguous load; the host API transposes them from
// and to the reference's [B, N, H, 1]). Inference partials: O_s [B, H, splits, d], M_s and L_s
// [B, H, splits].
//
// Every HBM → SRAM load uses __ldcg (L2 only, not L1) so that each tile load the reference
// counts reaches L2 and the profiler sees it, as in tile.cuh.
#pragma once

#include "core/common.hpp"

#include <cmath>
#include <cstddef>

namespace flashlab::cuda::detail::mta {

/// Threads per block of every MTA kernel (4 warps, as the attention kernels).
inline constexpr int kThreads = 128;

/// Query rows of the split-K inference tile (ref::mta::kInferQueryRows; front_door.cpp checks
/// that the two agree, since device code does not include the reference's Eigen headers).
inline constexpr int kInferQueryRows = 16;

/// Everything an MTA kernel needs besides its pointers (passed by value).
struct Launch {
  int batch = 1, seq = 0, heads = 1, head_dim = 0;  ///< B, N, H, d
  int cq = 1, ck = 1;                               ///< kernel size
  int pq = 0, pk = 0;                               ///< Pq = cq − 1, Pk = (ck − 1)/2
  int block = 16;                                   ///< B, the loaded (overlapping) tile size
  int br = 16, bc = 16;                             ///< effective strides of this pass
  int tr = 1, tc = 1;                               ///< Tr = ⌈N/Br⌉, Tc = ⌈N/Bc⌉
  int splits = 1, tk = 1;                           ///< inference: N_splits and T_k tiles per split
  float scale = 1.f;                                ///< softmax scale (natural exponent, as the reference)

  /// Elements between two tokens of one head (H·d).
  FLASHLAB_HD std::size_t row_stride() const { return std::size_t(heads) * head_dim; }
  /// Offset of element (b, token 0, h, 0) in a [B, N, H, d] tensor.
  FLASHLAB_HD std::size_t head_offset(int b, int h) const {
    return std::size_t(b) * seq * row_stride() + std::size_t(h) * head_dim;
  }
  /// Offset of row 0 of head (b, h) in a [B, H, N] statistics vector.
  FLASHLAB_HD std::size_t stat_offset(int b, int h) const { return (std::size_t(b) * heads + h) * std::size_t(seq); }
  /// Taps of one kernel W (cq·ck).
  FLASHLAB_HD int taps() const { return cq * ck; }
  /// Shared-memory pitch of a d-wide tile (one float of padding against bank conflicts).
  FLASHLAB_HD int ld() const { return head_dim + 1; }
  /// Shared-memory pitch of a B × B score tile.
  FLASHLAB_HD int sp() const { return block + 1; }
};

/// Opts `kernel` into `bytes` of dynamic shared memory, or throws std::invalid_argument naming
/// the kernel, B and d with a hint when the device has less.
void set_smem(const void* kernel, std::size_t bytes, const char* kernel_name, const Launch& L);

#if defined(__CUDACC__)

/// −∞ in device code.
__device__ __forceinline__ float neg_inf() { return -INFINITY; }

/// "Load X[start : start + rows] from HBM to SRAM (handle boundary indices)": rows outside
/// [0, N) are the convolution's zero padding, made on chip and not read. `start` may be < 0.
__device__ __forceinline__ void load_tile(float* __restrict__ tile, int ld, const float* __restrict__ head,
                                          std::size_t stride, int start, int rows, int n, int d) {
  for (int idx = threadIdx.x; idx < rows * d; idx += blockDim.x) {
    const int r = idx / d, k = idx % d, row = start + r;
    tile[r * ld + k] = row >= 0 && row < n ? __ldcg(head + std::size_t(row) * stride + k) : 0.f;
  }
}

/// Writes tile rows [first, first + rows) to X[start + first …], skipping rows outside [0, N);
/// each element is multiplied by `factor`. SRAM → HBM.
__device__ __forceinline__ void store_tile(float* __restrict__ head, std::size_t stride, const float* __restrict__ tile,
                                           int ld, int start, int first, int rows, int n, int d, float factor = 1.f) {
  for (int idx = threadIdx.x; idx < rows * d; idx += blockDim.x) {
    const int r = first + idx / d, k = idx % d, row = start + r;
    if (row >= 0 && row < n) head[std::size_t(row) * stride + k] = tile[r * ld + k] * factor;
  }
}

/// Loads `rows` statistics starting at `start` (may be < 0); rows outside [0, N) become 0.
__device__ __forceinline__ void load_stat(float* __restrict__ dst, const float* __restrict__ src, int start, int rows,
                                          int n) {
  for (int r = threadIdx.x; r < rows; r += blockDim.x) {
    const int row = start + r;
    dst[r] = row >= 0 && row < n ? __ldcg(src + row) : 0.f;
  }
}

/// Loads the cq·ck taps of one kernel W into shared memory.
__device__ __forceinline__ void load_w(float* __restrict__ dst, const float* __restrict__ w_head, int taps) {
  for (int t = threadIdx.x; t < taps; t += blockDim.x) dst[t] = __ldcg(w_head + t);
}

/// Dot product of two shared rows of length d.
__device__ __forceinline__ float dot_row(const float* __restrict__ a, const float* __restrict__ b, int d) {
  float acc = 0.f;
  for (int k = 0; k < d; ++k) acc = fmaf(a[k], b[k], acc);
  return acc;
}

/// S_ij = scale · Q_i K_jᵀ on the full `rows` × B tile, with the causal zeroing that happens
/// *before* the convolution (S = 0 where the key J_s + c is after the query I_s + r).
__device__ __forceinline__ void scores(float* __restrict__ s, int sp, const float* __restrict__ q_i,
                                       const float* __restrict__ k_j, int ld, int rows, int cols, int d, float scale,
                                       int is, int js) {
  for (int idx = threadIdx.x; idx < rows * cols; idx += blockDim.x) {
    const int r = idx / cols, c = idx % cols;
    s[r * sp + c] = js + c > is + r ? 0.f : scale * dot_row(q_i + r * ld, k_j + c * ld, d);
  }
}

/// One entry of Conv2D(S, W) on a tile (cross-correlation, zero outside the tile):
/// Ŝ[r, c] = Σ_a Σ_b W[a, b] · S[r + a − Pq, c + b − Pk].
__device__ __forceinline__ float conv_at(const float* __restrict__ s, int sp, int rows, int cols,
                                         const float* __restrict__ w, int cq, int ck, int r, int c) {
  const int pq = cq - 1, pk = (ck - 1) / 2;
  float acc = 0.f;
  for (int a = 0; a < cq; ++a) {
    const int sr = r + a - pq;
    if (sr < 0 || sr >= rows) continue;
    for (int b = 0; b < ck; ++b) {
      const int sc = c + b - pk;
      if (sc >= 0 && sc < cols) acc = fmaf(w[a * ck + b], s[sr * sp + sc], acc);
    }
  }
  return acc;
}

/// One entry of TransposedConv2D(dŜ, W), the adjoint of conv_at (gather form):
/// dS[r, c] = Σ_a Σ_b W[a, b] · dŜ[r − a + Pq, c − b + Pk] (zero outside the tile).
__device__ __forceinline__ float conv_transpose_at(const float* __restrict__ ds_hat, int sp, int rows, int cols,
                                                   const float* __restrict__ w, int cq, int ck, int r, int c) {
  const int pq = cq - 1, pk = (ck - 1) / 2;
  float acc = 0.f;
  for (int a = 0; a < cq; ++a) {
    const int sr = r - a + pq;
    if (sr < 0 || sr >= rows) continue;
    for (int b = 0; b < ck; ++b) {
      const int sc = c - b + pk;
      if (sc >= 0 && sc < cols) acc = fmaf(w[a * ck + b], ds_hat[sr * sp + sc], acc);
    }
  }
  return acc;
}

#endif  // __CUDACC__

// ---- launchers (mta_fwd.cu, mta_bwd.cu, mta_infer.cu); device pointers, layouts above ----

/// x[0 : count) = 0 (O before the forward's read-modify-writes, dW before the atomics).
void launch_zero_fill(float* x, std::size_t count);
/// The forward (grid Tr × H × B): O read-modify-written per key tile, then normalised; M, L.
void launch_forward(const Launch& L, const float* Q, const float* K, const float* V, const float* W, float* O,
                    float* M, float* Lsum);
/// D_i = rowsum(dO_i ⊙ O_i) (one thread per row).
void launch_bwd_preprocess(const Launch& L, const float* O, const float* dO, float* D);
/// The dQ + dW kernel (grid Tr × H × B); dW must be zero beforehand.
void launch_bwd_dq_dw(const Launch& L, const float* Q, const float* K, const float* V, const float* W,
                      const float* dO, const float* M, const float* Lsum, const float* D, float* dQ, float* dW);
/// The dK/dV kernel (grid Tc × H × B).
void launch_bwd_dk_dv(const Launch& L, const float* Q, const float* K, const float* V, const float* W,
                      const float* dO, const float* M, const float* Lsum, const float* D, float* dK, float* dV);
/// Split-K inference, part 1 (grid splits × H × B). With one split it writes the final O
/// ([B, 1, H, d]); otherwise the partials O_s, M_s, L_s.
void launch_infer_split(const Launch& L, const float* Q, const float* K, const float* V, const float* W, float* O,
                        float* O_s, float* M_s, float* L_s);
/// Split-K inference, part 2 (grid H × B): combines the partials into O ([B, 1, H, d]).
void launch_infer_combine(const Launch& L, const float* O_s, const float* M_s, const float* L_s, float* O);

}  // namespace flashlab::cuda::detail::mta
