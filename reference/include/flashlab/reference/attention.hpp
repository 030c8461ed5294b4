/// @file attention.hpp
/// @brief Attention forward and backward on the CPU (Eigen): naive, FA1, FA2 forward; naive,
///        two-kernel and atomic backward. Every tiled loop counts the HBM traffic it causes.
///
/// What each function is (the Triton walkthrough "Forward Pass" / "Backward Pass", the toy-machine lesson "Inner Product
/// vs. Outer Product in Attention" and "The D_i Trick"):
/// - naive_forward: S = scale·QKᵀ, P = softmax(S), O = PV, whole matrices (S, P in "HBM").
/// - flash_forward_fa2: FA2 loop order — Q_i resident, stream K_j, V_j, online softmax in base 2
///   (scores pre-scaled by scale·log2 e, exp2), LSE saved in base 2.
/// - flash_forward_fa1: FA1 loop order — K_j, V_j resident, stream Q_i, with O_i, m_i, l_i
///   read-modify-written in HBM once per visited tile.
/// - naive_backward: dV = Pᵀ dO, dP = dO Vᵀ, D = rowsum(dP∘P) (and rowsum(dO∘O) for the
///   identity), dS = P∘(dP − D), dQ = scale·dS K, dK = scale·dSᵀ Q.
/// - flash_backward_two_kernel: D preprocessing, dQ kernel, dK/dV kernel (12N²d by the Triton walkthrough's
///   count; 14N²d when dP = dO Vᵀ is counted in both kernels too — see docs/attention.md).
/// - flash_backward_atomic: D preprocessing, one KV-outer kernel with dQ read-modify-written (10N²d).
///
/// Every function takes the whole AttentionProblem: grouped K/V (`heads_kv`), N_k ≠ N, packed
/// sequences (`packed`), the causal mask and the window, all bottom-right aligned per sequence
/// (attention_problem.hpp). Tiles never cross a sequence's end.
///
/// Tiles are loaded zero-padded to full Br × d and Bc × d buffers as Triton's boundary_check
/// does; out-of-sequence key columns are masked to −inf (the KV mask), padded query rows are
/// masked only implicitly (zero Q, dO, LSE, D), exactly as in the Triton walkthrough. Fully
/// masked tile pairs (causal, window) are skipped and not counted. A row that sees no key gets
/// O = 0, LSE = −inf, and P = 0 in the backward pass (so its dQ row is 0 and it adds nothing to
/// dK, dV): no NaN. A NaN in an input is never hidden: it reaches every output the tile
/// arithmetic carries it to (a NaN in V_j reaches the O rows of every query tile that loads V_j,
/// since a masked P_ij = 0 times NaN is NaN), and no output of another sequence.
///
/// Grouped-query attention: query head h reads K/V head cfg.kv_head(h); dK and dV sum over the
/// query heads of the group. Which loops load a K/V tile once per query head and which once per
/// group: attention_traffic.hpp.
///
/// Instantiated for `float` and `double` only.
#pragma once

#include "flashlab/reference/attention_traffic.hpp"
#include "flashlab/reference/tensor.hpp"
#include "flashlab/reference/traffic.hpp"

#include <cstddef>
#include <vector>

namespace flashlab::ref {

/// Output of a forward pass.
template <typename T>
struct AttentionForward {
  Tensor<T> O;                   ///< cfg.q_shape(): `[B, N_q, H, d]` (packed `[1, total_q, H, d]`)
  std::vector<T> LSE;            ///< `[B, H, N_q]` (packed `[H, total_q]`), base 2 of the base-2 scores; −inf for a fully masked row
  Traffic traffic;               ///< all kernels together (what the loops counted)
  std::vector<KernelTraffic> kernels;  ///< the same counts split per kernel (or naive step)
};

/// Output of a backward pass.
template <typename T>
struct AttentionGradients {
  Tensor<T> dQ;                  ///< cfg.q_shape(): `[B, N_q, H, d]`
  Tensor<T> dK;                  ///< cfg.kv_shape(): `[B, N_k, H_kv, d]`, summed over each group of query heads
  Tensor<T> dV;                  ///< cfg.kv_shape(): `[B, N_k, H_kv, d]`, summed over each group of query heads
  std::vector<T> D;              ///< like LSE: the D_i the pass used
  std::vector<T> D_from_O;       ///< naive only: rowsum(dO∘O), to show D = rowsum(dP∘P) = rowsum(dO∘O)
  Traffic traffic;               ///< all kernels together (what the loops counted)
  std::vector<KernelTraffic> kernels;  ///< the same counts split per kernel
};

/// Switches of the FA2 forward.
struct ForwardOptions {
  /// How K_j, V_j are loaded under grouped-query attention (results are the same; the counted
  /// traffic differs): once per query head, or once per group of query heads.
  KvLoads kv_loads = KvLoads::per_query_head;
  /// When set, every P_ij is rounded by it before P_ij·V_j, while l_i sums the unrounded P_ij: what
  /// a kernel that feeds 16-bit P to its tensor cores computes (P relative to the running maximum
  /// of its key tiles of Bc). With O then rounded to 16 bits, the error floor of such a kernel, which
  /// can exceed that of rounding O alone where a row has few keys (the fast kernels' tests use it).
  double (*round_p)(double) = nullptr;
};

/// Switches of the flash backward passes (defaults: the correct kernel in T arithmetic).
struct BackwardOptions {
  /// Mask out-of-sequence keys (padded K_j rows) to −inf when recomputing S_ij. Dropping it is
  /// the Triton walkthrough's NaN hazard: harmless in fp32, NaN in fp16 arithmetic (see `fp16_arithmetic`).
  bool mask_kv = true;
  /// Round every tile operation's result to IEEE half precision (overflow → ±inf), emulating
  /// fp16 arithmetic on the CPU so the Triton walkthrough's Inf × 0 = NaN can be shown.
  bool fp16_arithmetic = false;
  /// How the two-kernel design's dQ kernel loads K_j, V_j under grouped-query attention (the
  /// dK/dV and atomic kernels load them once per K/V head whatever this says).
  KvLoads kv_loads = KvLoads::per_query_head;
};

/// Rounds `x` to the nearest IEEE binary16 value (ties to even), overflowing to ±inf beyond
/// 65504 and keeping subnormals; NaN and infinities pass through.
double round_to_half(double x);

/// Naive forward: S and P materialised (per head). Traffic per docs/attention.md ("naive").
template <typename T>
AttentionForward<T> naive_forward(const AttentionProblem& cfg, const Tensor<T>& Q, const Tensor<T>& K,
                                  const Tensor<T>& V);

/// Flash forward, FA2 loop order (query tiles outer, key tiles inner).
template <typename T>
AttentionForward<T> flash_forward_fa2(const AttentionProblem& cfg, const Tensor<T>& Q, const Tensor<T>& K,
                                      const Tensor<T>& V, ForwardOptions opt = {});

/// Flash forward, FA1 loop order (key tiles outer, query tiles inner, O/m/l read-modify-written).
template <typename T>
AttentionForward<T> flash_forward_fa1(const AttentionProblem& cfg, const Tensor<T>& Q, const Tensor<T>& K,
                                      const Tensor<T>& V);

/// Forward of `v` (naive_fwd, fa1_fwd or fa2_fwd); throws std::invalid_argument for a backward variant.
template <typename T>
AttentionForward<T> attention_forward(Algorithm v, const AttentionProblem& cfg, const Tensor<T>& Q,
                                      const Tensor<T>& K, const Tensor<T>& V);

/// Naive backward for the loss L = Σ O∘dO: recomputes O and P from Q, K, V (the counted
/// traffic assumes P was saved by the naive forward) and returns D both ways.
template <typename T>
AttentionGradients<T> naive_backward(const AttentionProblem& cfg, const Tensor<T>& Q, const Tensor<T>& K,
                                     const Tensor<T>& V, const Tensor<T>& dO);

/// Flash backward, two kernels: D preprocessing, dQ kernel, dK/dV kernel. `O` and `LSE` come
/// from a forward pass with the same configuration.
template <typename T>
AttentionGradients<T> flash_backward_two_kernel(const AttentionProblem& cfg, const Tensor<T>& Q,
                                                const Tensor<T>& K, const Tensor<T>& V, const Tensor<T>& O,
                                                const std::vector<T>& LSE, const Tensor<T>& dO,
                                                BackwardOptions opt = {});

/// Flash backward, one KV-outer kernel with dQ accumulated in HBM (the "atomic" design).
template <typename T>
AttentionGradients<T> flash_backward_atomic(const AttentionProblem& cfg, const Tensor<T>& Q, const Tensor<T>& K,
                                            const Tensor<T>& V, const Tensor<T>& O, const std::vector<T>& LSE,
                                            const Tensor<T>& dO, BackwardOptions opt = {});

/// Error metric used everywhere for attention results: max |got − ref| / max |ref| over the
/// whole tensor (a tensor-wide relative error that tiny entries cannot inflate). Entries where
/// both are the same infinity (LSE of a fully masked row) agree; NaN anywhere or a mismatched
/// infinity gives +inf, so NaN never passes. All-zero `ref` divides by 1 instead.
double max_error_vs_max(const double* got, const double* ref, std::size_t n);
/// Same, for a float result against a double reference.
double max_error_vs_max(const float* got, const double* ref, std::size_t n);

/// True if any element is NaN.
bool has_nan(const double* p, std::size_t n);
/// True if any element is NaN.
bool has_nan(const float* p, std::size_t n);

}  // namespace flashlab::ref
