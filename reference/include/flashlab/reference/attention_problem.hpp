/// @file attention_problem.hpp
/// @brief The one description of an attention problem (shape, tiles, mask, scale, element type)
///        and the one list of attention algorithms, shared by the CPU reference, the traffic
///        model, the clear and fast CUDA kernels, the benchmarks and the command line.
///
/// An AttentionProblem is checked once, by validate(), wherever it is built from outside input;
/// the checks there are the limits every level shares. A kernel family with narrower limits (the
/// clear CUDA kernels: fp32, Br, Bc ≤ 128; the fast kernels: d ∈ {64, 128}, bf16/fp16) states
/// them in one function of its own against this type. The names follow docs/glossary.md.
///
/// Conventions: Q is `[B, N, H, d]`, K and V are `[B, N_k, H, d]` (N_k = N unless `seq_k` is
/// set), LSE and D are `[B, H, N]` in fp32. Query tiles have Br rows, key tiles Bc rows;
/// Tr = ⌈N/Br⌉, Tc = ⌈N_k/Bc⌉. Causal masking is bottom-right aligned: query i sees key j iff
/// j ≤ i + (N_k − N), which is the usual j ≤ i when N_k = N; with N > N_k the first N − N_k rows
/// see no key at all.
#pragma once

#include "flashlab/reference/traffic.hpp"

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace flashlab::ref {

struct Shape;  // tensor.hpp; this header stays free of Eigen and C++20 so that CUDA sources may include it

/// Default query rows per tile (Br) wherever a problem is built without one.
inline constexpr std::size_t kDefaultBr = 64;
/// Default key rows per tile (Bc) wherever a problem is built without one.
inline constexpr std::size_t kDefaultBc = 64;
/// Largest Br or Bc validate() accepts: a tile buffer holds Br × d (or Bc × d) elements.
inline constexpr std::size_t kMaxTileRows = 65536;

/// The error AttentionProblem::validate() throws: a std::invalid_argument that also names the
/// field ("batch", "seq", "heads", "head_dim", "Br", "Bc", "scale"), so a command line can name
/// its flag.
class ProblemError : public std::invalid_argument {
 public:
  /// `message` is the whole text (field, value, limit, hint); `field` the member's name.
  ProblemError(std::string field, const std::string& message)
      : std::invalid_argument(message), field_(std::move(field)) {}
  /// The member of AttentionProblem that broke its limit.
  [[nodiscard]] const std::string& field() const { return field_; }

 private:
  std::string field_;
};

/// One attention problem and its tiling.
struct AttentionProblem {
  std::size_t batch = 1;      ///< B
  std::size_t seq = 0;        ///< N, the number of queries
  std::size_t heads = 1;      ///< H
  std::size_t head_dim = 0;   ///< d
  std::size_t Br = kDefaultBr;  ///< query rows per tile (BLOCK_M in Triton's terms)
  std::size_t Bc = kDefaultBc;  ///< key rows per tile (BLOCK_N in Triton's terms)
  bool causal = false;        ///< causal mask (bottom-right aligned, see the file comment)
  double scale = 0.0;         ///< softmax scale; 0 means the default 1/√d
  Dtype dtype = Dtype::fp32;  ///< element type of Q, K, V, O and their gradients (LSE, D, m, l stay fp32)
  std::size_t seq_k = 0;      ///< N_k, keys/values; 0 means N_k = N (self-attention)

  /// N, the number of queries.
  [[nodiscard]] std::size_t n_q() const { return seq; }
  /// N_k (`seq_k`, or `seq` when `seq_k` is 0).
  [[nodiscard]] std::size_t n_k() const { return seq_k ? seq_k : seq; }
  /// The softmax scale actually used: `scale`, or 1/√d when `scale` is 0.
  [[nodiscard]] double softmax_scale() const;
  /// Tr = ⌈N / Br⌉, the number of query tiles.
  [[nodiscard]] std::size_t Tr() const { return (n_q() + Br - 1) / Br; }
  /// Tc = ⌈N_k / Bc⌉, the number of key tiles.
  [[nodiscard]] std::size_t Tc() const { return (n_k() + Bc - 1) / Bc; }
  /// Causal offset N_k − N: query i sees key j iff j ≤ i + offset (when `causal`).
  [[nodiscard]] long long causal_offset() const {
    return static_cast<long long>(n_k()) - static_cast<long long>(n_q());
  }
  /// Shape of Q, O, dO, dQ: `[B, N, H, d]` (include tensor.hpp to use it).
  [[nodiscard]] Shape q_shape() const;
  /// Shape of K, V, dK, dV: `[B, N_k, H, d]` (include tensor.hpp to use it).
  [[nodiscard]] Shape kv_shape() const;
  /// Number of elements of LSE or D: `B·H·N`.
  [[nodiscard]] std::size_t stat_numel() const { return batch * heads * n_q(); }
  /// The limits every level shares: B, N, H, d, Br, Bc at least 1; Br and Bc at most
  /// kMaxTileRows; the scale finite and not negative. Throws ProblemError whose message names
  /// the field, its value, the limit and a hint.
  void validate() const;
  /// One line such as "B=1 N=128 H=2 d=64 Br=64 Bc=32 causal fp32" for reports.
  [[nodiscard]] std::string str() const;
};

/// The attention algorithms: forward loop orders and backward designs.
enum class Algorithm {
  naive_fwd,       ///< S = QKᵀ, P = softmax(S), O = PV, with S and P materialised in HBM
  fa1_fwd,         ///< FA1 loop order: K_j/V_j tiles outer, Q_i tiles inner; O, m, l read-modify-written
  fa2_fwd,         ///< FA2 loop order: Q_i resident, stream K_j, V_j; O and LSE written once
  naive_bwd,       ///< backward with P, dP, dS materialised in HBM (P saved by the naive forward)
  bwd_two_kernel,  ///< D preprocessing + dQ kernel + dK/dV kernel (no atomics)
  bwd_atomic       ///< D preprocessing + one K_j/V_j-outer kernel that accumulates dQ in HBM
};

/// "naive_fwd", "fa1_fwd", "fa2_fwd", "naive_bwd", "bwd_two_kernel", "bwd_atomic".
std::string_view algorithm_name(Algorithm a);
/// The short name the command line uses: "naive", "fa1", "fa2", "naive", "two-kernel", "atomic".
std::string_view algorithm_flag_name(Algorithm a);
/// True for the three backward algorithms.
bool is_backward(Algorithm a);
/// The algorithm a command-line name selects for a forward (`backward` false) or backward pass:
/// forward "naive", "fa1", "fa2"; backward "naive", "two-kernel" (also "fa2", the two-kernel
/// FA2 backward), "atomic"; algorithm_name() values are accepted too. Throws
/// std::invalid_argument naming the value and listing the choices for that pass.
Algorithm parse_algorithm(std::string_view name, bool backward);

}  // namespace flashlab::ref
