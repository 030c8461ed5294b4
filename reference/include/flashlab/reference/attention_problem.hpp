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
/// **Dense problems** (the default): B sequences of N queries and N_k keys each. Q is
/// `[B, N, H, d]`, K and V are `[B, N_k, H_kv, d]` (N_k = N unless `seq_k` is set, H_kv = H
/// unless `heads_kv` is set), LSE and D are `[B, H, N]` in fp32.
///
/// **Grouped-query attention**: `heads_kv` = H_kv divides H; query head h reads K/V head
/// h / (H / H_kv) (kv_head()), so each K/V head serves a group of H / H_kv query heads
/// (H_kv = 1 is multi-query attention). dK and dV are `[…, H_kv, d]`: sums over the group.
///
/// **Packed sequences** (`packed`, set with set_packed()): B sequences of different lengths,
/// concatenated along the token axis as FlashAttention's varlen interface does: Q is
/// `[1, total_q, H, d]`, K and V `[1, total_k, H_kv, d]`, LSE and D `[1, H, total_q]`.
/// Sequence b owns query rows cu_seqlens_q[b] … cu_seqlens_q[b+1] − 1 and key rows
/// cu_seqlens_k[b] … cu_seqlens_k[b+1] − 1 (PackedSequences). `batch` is then B, `seq` the
/// longest query sequence and `seq_k` the longest key sequence, so Tr() and Tc() are the most
/// tiles one sequence has. sequence() gives every sequence's rows in both layouts.
///
/// **The mask** is applied per sequence, with i and j counted from the sequence's first query
/// and first key, and the diagonal bottom-right aligned: offset = len_k − len_q (N_k − N when
/// dense). Query i sees key j iff 0 ≤ j < len_k and
/// - causal: j ≤ i + offset (the usual j ≤ i when len_k = len_q);
/// - window_left ≥ 0: j ≥ i + offset − window_left;
/// - window_right ≥ 0: j ≤ i + offset + window_right (causal caps it at 0);
/// −1 leaves a side of the window unbounded. A query that sees no key (causal with
/// len_q > len_k, a window that misses every key, a sequence without keys) gets O = 0,
/// LSE = −inf and zero gradients.
///
/// Query tiles have Br rows, key tiles Bc rows, both counted inside one sequence:
/// Tr = ⌈N/Br⌉, Tc = ⌈N_k/Bc⌉ (per sequence: ⌈len_q/Br⌉, ⌈len_k/Bc⌉).
#pragma once

#include "flashlab/reference/traffic.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace flashlab::ref {

struct Shape;  // tensor.hpp; this header stays free of Eigen and C++20 so that CUDA sources may include it

/// Default query rows per tile (Br) wherever a problem is built without one.
inline constexpr std::size_t kDefaultBr = 64;
/// Default key rows per tile (Bc) wherever a problem is built without one.
inline constexpr std::size_t kDefaultBc = 64;
/// Largest Br or Bc validate() accepts: a tile buffer holds Br × d (or Bc × d) elements.
inline constexpr std::size_t kMaxTileRows = 65536;
/// Largest window side validate() accepts (FlashAttention's int32 window; −1 is unbounded).
inline constexpr long long kMaxWindow = 2147483647;

/// The error AttentionProblem::validate() (and PackedSequences' constructor) throws: a
/// std::invalid_argument that also names the field ("batch", "seq", "seq_k", "heads",
/// "heads_kv", "head_dim", "Br", "Bc", "scale", "window_left", "window_right", "cu_seqlens_q",
/// "cu_seqlens_k"), so a command line can name its flag.
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

/// Packed variable-length sequences: the prefix sums of the query and key lengths of B
/// sequences (FlashAttention's `cu_seqlens_q`, `cu_seqlens_k`), B + 1 int32 entries each.
///
/// Checked once, by the constructor, so every PackedSequences that exists is valid: both lists
/// have the same number B + 1 ≥ 2 of entries, start at 0 and never decrease (length-0 sequences
/// repeat an entry), at least one query and one key in all; the last entries are the totals.
/// A bad list throws ProblemError naming "cu_seqlens_q" or "cu_seqlens_k", the entry and a hint.
class PackedSequences {
 public:
  /// Queries and keys with their own lengths (cross-attention, chunked prefill).
  PackedSequences(std::vector<std::int32_t> cu_seqlens_q, std::vector<std::int32_t> cu_seqlens_k);
  /// Self-attention: the keys have the queries' lengths (cu_seqlens_k = cu_seqlens_q).
  explicit PackedSequences(std::vector<std::int32_t> cu_seqlens);

  /// B, the number of sequences.
  [[nodiscard]] std::size_t count() const { return cu_q_.size() - 1; }
  /// The query prefix sums, B + 1 entries.
  [[nodiscard]] const std::vector<std::int32_t>& cu_seqlens_q() const { return cu_q_; }
  /// The key prefix sums, B + 1 entries.
  [[nodiscard]] const std::vector<std::int32_t>& cu_seqlens_k() const { return cu_k_; }
  /// Queries of sequence b.
  [[nodiscard]] std::size_t len_q(std::size_t b) const { return std::size_t(cu_q_[b + 1] - cu_q_[b]); }
  /// Keys of sequence b.
  [[nodiscard]] std::size_t len_k(std::size_t b) const { return std::size_t(cu_k_[b + 1] - cu_k_[b]); }
  /// All queries, cu_seqlens_q[B].
  [[nodiscard]] std::size_t total_q() const { return std::size_t(cu_q_.back()); }
  /// All keys, cu_seqlens_k[B].
  [[nodiscard]] std::size_t total_k() const { return std::size_t(cu_k_.back()); }
  /// The longest query sequence.
  [[nodiscard]] std::size_t max_len_q() const { return max_q_; }
  /// The longest key sequence.
  [[nodiscard]] std::size_t max_len_k() const { return max_k_; }
  /// Equal when both lists are.
  friend bool operator==(const PackedSequences& a, const PackedSequences& b) {
    return a.cu_q_ == b.cu_q_ && a.cu_k_ == b.cu_k_;
  }

 private:
  std::vector<std::int32_t> cu_q_, cu_k_;
  std::size_t max_q_ = 0, max_k_ = 0;
};

/// Where one sequence lives in the tensors: the tensor batch index (b when dense, 0 when packed)
/// and its rows along the token axis of Q (O, dO, dQ) and of K (V, dK, dV).
struct SequenceSpan {
  std::size_t batch_index = 0;  ///< index into the tensors' first dimension
  std::size_t q_start = 0;      ///< first query row (0 when dense, cu_seqlens_q[b] when packed)
  std::size_t q_len = 0;        ///< queries of the sequence (N when dense)
  std::size_t k_start = 0;      ///< first key row (0 when dense, cu_seqlens_k[b] when packed)
  std::size_t k_len = 0;        ///< keys of the sequence (N_k when dense)
  /// The bottom-right diagonal's offset len_k − len_q: query i's diagonal key is i + offset.
  [[nodiscard]] long long offset() const { return static_cast<long long>(k_len) - static_cast<long long>(q_len); }
};

/// Keys `first … end − 1` of a sequence (counted from its first key); empty when first ≥ end.
struct KeyRange {
  long long first = 0;  ///< first visible key
  long long end = 0;    ///< one past the last visible key
  /// No key at all.
  [[nodiscard]] bool empty() const { return first >= end; }
};

/// One attention problem and its tiling.
struct AttentionProblem {
  std::size_t batch = 1;      ///< B, the number of sequences
  std::size_t seq = 0;        ///< N, the number of queries (packed: of the longest sequence)
  std::size_t heads = 1;      ///< H, query heads
  std::size_t head_dim = 0;   ///< d
  std::size_t Br = kDefaultBr;  ///< query rows per tile (BLOCK_M in Triton's terms)
  std::size_t Bc = kDefaultBc;  ///< key rows per tile (BLOCK_N in Triton's terms)
  bool causal = false;        ///< causal mask (bottom-right aligned, see the file comment)
  double scale = 0.0;         ///< softmax scale; 0 means the default 1/√d
  Dtype dtype = Dtype::fp32;  ///< element type of Q, K, V, O and their gradients (LSE, D, m, l stay fp32)
  std::size_t seq_k = 0;      ///< N_k, keys/values (packed: of the longest sequence); 0 means N_k = N
  std::size_t heads_kv = 0;   ///< H_kv, heads of K and V, dividing H; 0 means H_kv = H
  long long window_left = -1;   ///< keys seen left of the diagonal; −1 unbounded
  long long window_right = -1;  ///< keys seen right of the diagonal; −1 unbounded (causal: 0)
  std::optional<PackedSequences> packed;  ///< the sequences' lengths when packed; empty when dense

  /// N, the number of queries (packed: of the longest sequence).
  [[nodiscard]] std::size_t n_q() const { return seq; }
  /// N_k (`seq_k`, or `seq` when `seq_k` is 0).
  [[nodiscard]] std::size_t n_k() const { return seq_k ? seq_k : seq; }
  /// H_kv (`heads_kv`, or `heads` when `heads_kv` is 0).
  [[nodiscard]] std::size_t h_kv() const { return heads_kv ? heads_kv : heads; }
  /// Query heads per K/V head, H / H_kv (1: multi-head attention).
  [[nodiscard]] std::size_t group_size() const { return heads / h_kv(); }
  /// The K/V head query head `h` reads: h / (H / H_kv).
  [[nodiscard]] std::size_t kv_head(std::size_t h) const { return h / group_size(); }
  /// True when the sequences are packed (`packed` set).
  [[nodiscard]] bool is_packed() const { return packed.has_value(); }
  /// True when either side of the window is bounded.
  [[nodiscard]] bool has_window() const { return window_left >= 0 || window_right >= 0; }
  /// The softmax scale actually used: `scale`, or 1/√d when `scale` is 0.
  [[nodiscard]] double softmax_scale() const;
  /// Tr = ⌈N / Br⌉, the number of query tiles (packed: of the longest sequence).
  [[nodiscard]] std::size_t Tr() const { return (n_q() + Br - 1) / Br; }
  /// Tc = ⌈N_k / Bc⌉, the number of key tiles (packed: of the longest sequence).
  [[nodiscard]] std::size_t Tc() const { return (n_k() + Bc - 1) / Bc; }
  /// Causal offset N_k − N of a dense problem: query i sees key j iff j ≤ i + offset (when
  /// `causal`). Packed sequences have one offset each (SequenceSpan::offset()).
  [[nodiscard]] long long causal_offset() const {
    return static_cast<long long>(n_k()) - static_cast<long long>(n_q());
  }
  /// Shape of Q, O, dO, dQ: `[B, N, H, d]`, packed `[1, total_q, H, d]` (include tensor.hpp to use it).
  [[nodiscard]] Shape q_shape() const;
  /// Shape of K, V, dK, dV: `[B, N_k, H_kv, d]`, packed `[1, total_k, H_kv, d]` (include tensor.hpp to use it).
  [[nodiscard]] Shape kv_shape() const;
  /// Number of elements of LSE or D: `B·H·N`, packed `H·total_q`.
  [[nodiscard]] std::size_t stat_numel() const;
  /// Where sequence `b` (0 ≤ b < B) lives in the tensors.
  [[nodiscard]] SequenceSpan sequence(std::size_t b) const;
  /// Index in LSE or D of the first query of sequence `b`, head `h` (its rows follow contiguously).
  [[nodiscard]] std::size_t stat_offset(std::size_t b, std::size_t h) const;
  /// The keys query `i` of sequence `s` sees (the mask of the file comment), clamped to
  /// 0 … len_k − 1; `i` counts from the sequence's first query.
  [[nodiscard]] KeyRange visible_keys(const SequenceSpan& s, long long i) const;
  /// The first feature beyond one dense multi-head shape with full windows, for kernels that
  /// take only that: "heads_kv (grouped-query attention, H_kv = …)", "cu_seqlens (packed
  /// sequences)" or "window (…)"; empty when there is none. N_k ≠ N is not listed here.
  [[nodiscard]] std::string extended_feature() const;
  /// The limits every level shares: B, N, H, d, Br, Bc at least 1; Br and Bc at most
  /// kMaxTileRows; the scale finite and not negative; H_kv dividing H; each window side −1 or
  /// 0 … kMaxWindow; when packed, B, N and N_k equal to the sequences' count and longest query
  /// and key lengths. Throws ProblemError whose message names the field, its value, the limit
  /// and a hint.
  void validate() const;
  /// Makes the problem packed: `packed` = `p`, and B, N, N_k from it (count, longest query and
  /// key sequence), as validate() wants them.
  void set_packed(PackedSequences p);
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
