/// @file mta.hpp
/// @brief Multi-Token Attention (MTA): a 2-D convolution over the attention scores, fused with
/// flash tiling (the MTA kernels). Naive float64-grade reference, the flash forward, the flash backward
/// (dQ + dW loop and dK/dV loop) and the split-K inference path with its combine step.
///
/// Semantics (kept exactly; docs/mta.md states them with the conventions below), per
/// (batch, head) with one kernel W of shape cq × ck (ck odd) per head:
///
///     S      = scale · Q Kᵀ                          (N × N), scale defaults to 1/√d
///     S[i,j] = 0                          for j > i  (causal zeroing *before* the convolution)
///     Ŝ[i,j] = Σ_a Σ_b W[a,b] · S[i + a − Pq, j + b − Pk]   Pq = cq − 1, Pk = (ck − 1)/2,
///              with S = 0 outside [0, N) × [0, N)   (PyTorch conv2d cross-correlation: Pq zero
///              rows of padding above — past queries only — and Pk zero columns on both sides)
///     Ŝ[i,j] = −∞                         for j > i  (causal mask *after* the convolution)
///     P      = softmax over j of Ŝ,  O = P V.
///
/// Tensors use the layout of the Triton walkthrough `[BATCH, SEQ, HEAD_NUM, HEAD_DIM]` (tensor.hpp). The convolution
/// kernel W and its gradient dW are `[HEAD_NUM, cq, ck]` (one W per head, shared by the batch).
/// Row statistics (LSE, M, L, D) are `[BATCH, SEQ, HEAD_NUM, 1]` tensors.
///
/// The flash functions count their HBM traffic per tensor into an optional `Traffic` exactly
/// where their loops move a tile; mta_traffic.hpp states the same counts in closed form.
#pragma once

#include "flashlab/reference/tensor.hpp"
#include "flashlab/reference/traffic.hpp"

#include <cstddef>
#include <optional>
#include <vector>

namespace flashlab::ref::mta {

/// Query rows of the split-K inference tile (the MTA kernels, "Query matrix for the last 16 tokens").
inline constexpr std::size_t kInferQueryRows = 16;

/// Per-head convolution kernels `[HEAD_NUM, cq, ck]`, contiguous, last index fastest (the
/// layout of `w.npy` and of PyTorch's `conv2d` weight with one channel per head).
template <typename T>
class Weights {
 public:
  /// An empty set of kernels (no heads).
  Weights() = default;
  /// Zero-filled kernels for `heads` heads of shape `cq × ck`.
  Weights(std::size_t heads, std::size_t cq, std::size_t ck)
      : heads_(heads), cq_(cq), ck_(ck), data_(heads * cq * ck, T(0)) {}

  /// Number of heads (one kernel per head).
  [[nodiscard]] std::size_t heads() const { return heads_; }
  /// Kernel rows cq (query direction).
  [[nodiscard]] std::size_t cq() const { return cq_; }
  /// Kernel columns ck (key direction, odd).
  [[nodiscard]] std::size_t ck() const { return ck_; }
  /// Number of elements `heads · cq · ck`.
  [[nodiscard]] std::size_t numel() const { return data_.size(); }
  /// Raw storage (for `.npy` I/O).
  [[nodiscard]] T* data() { return data_.data(); }
  /// Raw storage (for `.npy` I/O).
  [[nodiscard]] const T* data() const { return data_.data(); }
  /// Element W[h][a][b].
  T& at(std::size_t h, std::size_t a, std::size_t b) { return data_[(h * cq_ + a) * ck_ + b]; }
  /// Element W[h][a][b].
  const T& at(std::size_t h, std::size_t a, std::size_t b) const { return data_[(h * cq_ + a) * ck_ + b]; }
  /// The kernel of head h as a `cq × ck` matrix (a copy: kernels are tiny).
  [[nodiscard]] Mat<T> head(std::size_t h) const {
    Mat<T> m{Eigen::Index(cq_), Eigen::Index(ck_)};
    for (std::size_t a = 0; a < cq_; ++a)
      for (std::size_t b = 0; b < ck_; ++b) m(Eigen::Index(a), Eigen::Index(b)) = at(h, a, b);
    return m;
  }
  /// Same values in another scalar type.
  template <typename U>
  [[nodiscard]] Weights<U> cast() const {
    Weights<U> out(heads_, cq_, ck_);
    for (std::size_t i = 0; i < data_.size(); ++i) out.data()[i] = static_cast<U>(data_[i]);
    return out;
  }

 private:
  std::size_t heads_ = 0, cq_ = 0, ck_ = 0;
  std::vector<T> data_;
};

/// Seeded standard-normal kernels scaled by `stddev` (reproducible across platforms).
Weights<double> random_weights(std::size_t heads, std::size_t cq, std::size_t ck, unsigned long long seed,
                               double stddev = 0.5);

/// Tiling parameters of the flash paths (the MTA kernels' notation).
struct Params {
  std::size_t cq = 1;             ///< kernel rows; Pq = cq − 1 rows of halo (past queries)
  std::size_t ck = 1;             ///< kernel columns, odd; Pk = (ck − 1)/2 columns of halo per side
  std::size_t block = 16;         ///< B, the loaded (overlapping) tile size, square B × B
  std::size_t splits = 1;         ///< N_splits of the split-K inference path
  std::optional<double> scale{};  ///< softmax scale; empty → 1/√d

  /// Pq = cq − 1.
  [[nodiscard]] std::size_t pq() const { return cq - 1; }
  /// Pk = (ck − 1)/2.
  [[nodiscard]] std::size_t pk() const { return (ck - 1) / 2; }
};

/// The softmax scale for head dimension d: `p.scale` if set, else 1/√d.
double resolve_scale(const Params& p, std::size_t head_dim);

/// Effective tile sizes and tile counts of one pass (the MTA kernels: "effective block sizes (strides)").
struct Tiling {
  std::size_t br = 0;  ///< Br, effective query rows per tile (the row stride)
  std::size_t bc = 0;  ///< Bc, effective key columns per tile (the column stride)
  std::size_t tr = 0;  ///< Tr = ⌈N / Br⌉
  std::size_t tc = 0;  ///< Tc = ⌈N / Bc⌉
};

/// Forward tiling: Br = B − Pq, Bc = B − 2Pk. Throws std::invalid_argument if either is < 1.
Tiling forward_tiling(std::size_t n, const Params& p);
/// Backward tiling with the doubled halos: Br = B − 2Pq, Bc = B − 4Pk. Throws if either is < 1.
Tiling backward_tiling(std::size_t n, const Params& p);

/// Checks shapes and parameters shared by every entry point (Q, K, V equal shapes, N ≥ 1,
/// d ≥ 1, W has one cq × ck kernel per head, cq ≥ 1, ck odd, splits ≥ 1, dO/O shapes when
/// given). Throws std::invalid_argument naming the offending argument.
template <typename T>
void validate(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const Weights<T>& w, const Params& p);

/// Result of the naive forward.
template <typename T>
struct NaiveForward {
  Tensor<T> o;    ///< O = P V, `[B, N, H, d]`
  Tensor<T> lse;  ///< natural-log LSE of each softmax row, `[B, N, H, 1]`
};

/// Gradients of a scalar loss with respect to every input.
template <typename T>
struct Grads {
  Tensor<T> dq;   ///< ∂L/∂Q
  Tensor<T> dk;   ///< ∂L/∂K
  Tensor<T> dv;   ///< ∂L/∂V
  Weights<T> dw;  ///< ∂L/∂W, summed over the batch (one W per head)
};

/// Naive MTA forward: materialises S, Ŝ and P (N × N per head) and follows the definition
/// literally, with scalar loops for the convolution so that it shares no code with the tiles.
template <typename T>
NaiveForward<T> naive_forward(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const Weights<T>& w,
                              const Params& p);

/// Naive MTA backward for the loss ⟨O, dO⟩: recomputes P, then dV = Pᵀ dO, dŜ = P ⊙ (dP − D)
/// with D_i = rowsum(dO ⊙ O), dS = transposed convolution of dŜ (zeroed where j > i),
/// dW[a,b] = Σ dŜ[i,j] · S[i + a − Pq, j + b − Pk], dQ = scale · dS K, dK = scale · dSᵀ Q.
template <typename T>
Grads<T> naive_backward(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const Weights<T>& w,
                        const Tensor<T>& d_o, const Params& p);

/// Result of the flash forward (the MTA kernels, forward algorithm).
template <typename T>
struct FlashForward {
  Tensor<T> o;  ///< normalised output O, `[B, N, H, d]`
  Tensor<T> m;  ///< M: the running row max m_i at the end, `[B, N, H, 1]`
  Tensor<T> l;  ///< L: the row sum ℓ_i (relative to M) at the end, `[B, N, H, 1]`
};

/// Flash MTA forward as the MTA kernels state it: overlapping B × B tiles with effective sizes
/// Br = B − Pq, Bc = B − 2Pk; per (i, j): S_ij, Conv2D on chip, online softmax with the α/β
/// rescaling, O[I_s:I_e] read-modify-written (effective rows written back); a final
/// normalisation pass; M and L saved. Traffic is counted into `traffic` when non-null.
template <typename T>
FlashForward<T> flash_forward(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const Weights<T>& w,
                              const Params& p, Traffic* traffic = nullptr);

/// Flash MTA backward (the MTA kernels): D preprocessing, the dQ + dW loop (row tiles outer, key tiles
/// inner; dW_i accumulated per row tile and added into the global dW) and the dK/dV loop (key
/// tiles outer), both with the doubled halos Br = B − 2Pq, Bc = B − 4Pk. `m` and `l` are the
/// flash forward's M and L; `o` its output. Traffic is counted into `traffic` when non-null.
template <typename T>
Grads<T> flash_backward(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const Weights<T>& w,
                        const Tensor<T>& o, const Tensor<T>& m, const Tensor<T>& l, const Tensor<T>& d_o,
                        const Params& p, Traffic* traffic = nullptr);

/// Split-K inference (the MTA kernels): the output of the last query token N − 1 from a 16-row query
/// tile (rows N − 16 … N − 1), key tiles split over `p.splits` splits, each split's partial
/// (O_s, M_s, L_s) combined in a second step. Returns `[B, 1, H, d]`. Requires cq ≤ 16.
template <typename T>
Tensor<T> flash_infer(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const Weights<T>& w,
                      const Params& p, Traffic* traffic = nullptr);

}  // namespace flashlab::ref::mta
