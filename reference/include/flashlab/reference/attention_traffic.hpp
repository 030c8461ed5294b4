/// @file attention_traffic.hpp
/// @brief The one attention configuration, the tile geometry, and the closed-form HBM traffic
///        of every attention variant (naive, FA1, FA2 forward; naive, two-kernel, atomic backward).
///
/// This header is the *model* side of the traffic comparison (DESIGN.md, "one vocabulary"):
/// the tile loops in attention.hpp count bytes as they run, the formulas here state the same
/// numbers in closed form (O(Tr) work, cheap at N = 16384), and the CUDA side measures them.
/// Tests assert count == formula for every variant, with and without causal, ragged tails and
/// Br ≠ Bc. The exact assumptions behind each count are written down in docs/attention.md.
///
/// Conventions (seed 001 names): Q is `[B, N_q, H, d]`, K and V are `[B, N_k, H, d]`
/// (N_k = N_q unless `seq_k` is set), LSE and D are `[B, H, N_q]` in fp32. Query tiles have
/// Br = `block_m` rows, key tiles Bc = `block_n` rows; Tr = ⌈N_q/Br⌉, Tc = ⌈N_k/Bc⌉.
/// Causal masking is bottom-right aligned: query i sees key j iff j ≤ i + (N_k − N_q), which
/// is the usual j ≤ i when N_k = N_q; with N_q > N_k the first N_q − N_k rows see no key at all.
#pragma once

#include "flashlab/reference/tensor.hpp"
#include "flashlab/reference/traffic.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace flashlab::ref {

/// One attention problem and its tiling: used by every reference, formula, CLI and kernel.
struct AttentionConfig {
  std::size_t batch = 1;      ///< B
  std::size_t seq = 0;        ///< N_q, the SEQ of seed 001 (queries)
  std::size_t heads = 1;      ///< H, HEAD_NUM
  std::size_t head_dim = 0;   ///< d, HEAD_DIM
  std::size_t block_m = 64;   ///< BLOCK_M = Br, query rows per tile
  std::size_t block_n = 64;   ///< BLOCK_N = Bc, key rows per tile
  bool causal = false;        ///< causal mask (bottom-right aligned, see the file comment)
  double scale = 0.0;         ///< softmax scale; 0 means the default 1/√d
  Dtype dtype = Dtype::fp32;  ///< element type used for the traffic bytes (LSE, D, m, l stay fp32)
  std::size_t seq_k = 0;      ///< N_k, keys/values; 0 means N_k = N_q (self-attention)

  /// N_q.
  [[nodiscard]] std::size_t n_q() const { return seq; }
  /// N_k (`seq_k`, or `seq` when `seq_k` is 0).
  [[nodiscard]] std::size_t n_k() const { return seq_k ? seq_k : seq; }
  /// The softmax scale actually used: `scale`, or 1/√d when `scale` is 0.
  [[nodiscard]] double softmax_scale() const;
  /// Tr = ⌈N_q / Br⌉, the number of query tiles.
  [[nodiscard]] std::size_t Tr() const { return (n_q() + block_m - 1) / block_m; }
  /// Tc = ⌈N_k / Bc⌉, the number of key tiles.
  [[nodiscard]] std::size_t Tc() const { return (n_k() + block_n - 1) / block_n; }
  /// Causal offset N_k − N_q: query i sees key j iff j ≤ i + offset (when `causal`).
  [[nodiscard]] long long causal_offset() const {
    return static_cast<long long>(n_k()) - static_cast<long long>(n_q());
  }
  /// Shape of Q, O, dO, dQ: `[B, N_q, H, d]`.
  [[nodiscard]] Shape q_shape() const { return Shape{batch, n_q(), heads, head_dim}; }
  /// Shape of K, V, dK, dV: `[B, N_k, H, d]`.
  [[nodiscard]] Shape kv_shape() const { return Shape{batch, n_k(), heads, head_dim}; }
  /// Number of elements of LSE or D: `B·H·N_q`.
  [[nodiscard]] std::size_t stat_numel() const { return batch * heads * n_q(); }
  /// Throws std::invalid_argument naming the field if any size is zero or the scale is negative.
  void validate() const;
  /// One line such as "B=1 N=128 H=2 d=64 Br=64 Bc=32 causal fp32" for reports.
  [[nodiscard]] std::string str() const;
};

/// The variants whose traffic is counted (loop orders of seeds 001 and 004).
enum class Variant {
  naive_fwd,       ///< S = QKᵀ, P = softmax(S), O = PV, with S and P materialised in HBM
  fa1_fwd,         ///< FA1 loop order: KV tiles outer, query tiles inner; O, m, l read-modify-written
  fa2_fwd,         ///< FA2 loop order: query tile resident, stream K_j, V_j; O and LSE written once
  naive_bwd,       ///< backward with P, dP, dS materialised in HBM (P saved by the naive forward)
  bwd_two_kernel,  ///< D preprocessing + dQ kernel + dK/dV kernel (seed 001's Triton design)
  bwd_atomic       ///< D preprocessing + one KV-outer kernel that read-modify-writes dQ in HBM
};

/// "naive_fwd", "fa1_fwd", "fa2_fwd", "naive_bwd", "bwd_two_kernel", "bwd_atomic".
std::string_view variant_name(Variant v);
/// True for the three backward variants.
bool is_backward(Variant v);

/// The traffic of one kernel (one launch) of a variant, e.g. "dQ kernel".
struct KernelTraffic {
  std::string name;  ///< "forward", "D preprocessing", "dQ kernel", "dK/dV kernel", "dQ+dK/dV kernel", or a naive step
  Traffic traffic;   ///< per-tensor elements read and written, and FLOPs, of this kernel
};

/// Number of key tiles c_i that query tile `i` visits (the loops skip fully masked tiles):
/// Tc without causal; with causal, the key tiles whose first key some row of tile i can see.
/// Key tiles visited by query tile i are exactly j = 0 … c_i − 1.
std::size_t visible_key_tiles(const AttentionConfig& cfg, std::size_t i);

/// Closed-form traffic of a variant, split per kernel (see docs/attention.md for what each
/// count assumes). Counts are elements; bytes follow `cfg.dtype` (statistics stay fp32).
std::vector<KernelTraffic> attention_traffic_kernels(Variant v, const AttentionConfig& cfg);

/// Closed-form traffic of a variant: the per-kernel counts of attention_traffic_kernels merged.
Traffic attention_traffic_formula(Variant v, const AttentionConfig& cfg);

/// True when `a` and `b` name the same tensors with equal read and write element counts and
/// equal FLOPs (order of tensors ignored). `why`, if given, receives the first difference.
bool same_counts(const Traffic& a, const Traffic& b, std::string* why = nullptr);

}  // namespace flashlab::ref
