/// @file stream.hpp
/// @brief STREAM sparse tracing, the reference specification (the STREAM paper, §2, §3, §6, §8, App. A/B).
///
/// Three phases, each a pure function of its inputs, parallel over query blocks q only:
/// 1. **Mask estimation** `stream_estimate`: for every query block q, hierarchical top-k selection
///    of key blocks — k branches over the admissible key-block range, n_it = ⌈log2 n_k⌉ bisection
///    rounds, each candidate represented by its *first valid* key block under C_blk, scored by the
///    blockwise maximum of ⟨q, k⟩ over token-valid pairs, top-k by the total order τ (App. B).
///    Output: the index tensor I[n_q][k] (0-based block indices, −1 = empty entry).
/// 2. **Mask application** `stream_apply`: sparse attention over the selected blocks with online
///    softmax (§6), token-level causal mask inside each block; optional edge records (q, r, w).
/// 3. **Checks**: `validate_indices` (the validity invariant of §3), `stream_dense_reference` and
///    `stream_check_dense` (sparse with every valid block kept == dense causal attention).
///
/// Every decision the paper leaves open (indexing base, remainder convention, one-block branches,
/// k larger than the number of valid blocks, padding, output order) is stated in docs/stream.md
/// and at the code that implements it. Nothing here allocates anything of size T × T: the only
/// per-run state is O(T·d) inputs, O(n_q·k) outputs and a b_q × b_k tile per thread.
#pragma once

#include "flashlab/reference/tensor.hpp"
#include "flashlab/reference/traffic.hpp"

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace flashlab::ref::stream {

/// Bad STREAM parameters or a malformed mask file; the message names the parameter or the file
/// and position.
class StreamError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// ⌈log2 n⌉ for n ≥ 1 (0 for n ≤ 1): the paper's refinement depth n_it = ⌈log2(T/b_k)⌉ (§8).
std::size_t ceil_log2(std::size_t n);

/// Block geometry of one head: T tokens cut into query blocks of b_q and key blocks of b_k.
///
/// Padding decision (docs/stream.md): when T is not a multiple of b_q (or b_k) the last block is
/// partial and its missing tokens are *invalid* both as queries and as keys. Blocks made only of
/// padding are not created, so n_q = ⌈T/b_q⌉ and n_k = ⌈T/b_k⌉ (the paper's lcm padding would add
/// all-invalid key blocks that change n_it and the initial partition but can never be selected).
struct Geometry {
  std::size_t T = 0;   ///< sequence length (tokens)
  std::size_t bq = 0;  ///< b_q, query-block size
  std::size_t bk = 0;  ///< b_k, key-block size

  /// n_q = ⌈T/b_q⌉, the number of query blocks (rows of I).
  [[nodiscard]] std::size_t n_q() const { return (T + bq - 1) / bq; }
  /// n_k = ⌈T/b_k⌉, the number of key blocks.
  [[nodiscard]] std::size_t n_k() const { return (T + bk - 1) / bk; }
  /// n_it = ⌈log2 n_k⌉, the number of bisection rounds (§8).
  [[nodiscard]] std::size_t n_it() const { return ceil_log2(n_k()); }
  /// Tokens of query block q that exist (b_q except for a partial last block).
  [[nodiscard]] std::size_t q_rows(std::size_t q) const;
  /// Tokens of key block r that exist (b_k except for a partial last block).
  [[nodiscard]] std::size_t k_rows(std::size_t r) const;
  /// Throws StreamError unless T ≥ 1, b_q ≥ 1, b_k ≥ 1.
  void check() const;
};

/// The block-level validity mask C_blk ∈ {0,1}^{n_q × n_k} (§2), bit-packed.
///
/// C_blk[q, r] = causal(q, r) ∧ user[q, r], where causal(q, r) holds iff some token pair (t, s)
/// with t in block q, s in block r, t, s < T has s ≤ t. The causal part is computed, never
/// stored (so a causal-only mask costs O(1) memory); the optional user mask is stored one bit
/// per block pair, 64 per word, row-major — the paper's "bit-packed in HBM" layout (§5). Inside
/// a valid block, token validity is the causal rule s ≤ t (the user mask is block-level).
class BlockMask {
 public:
  /// Causal-only mask for the geometry.
  explicit BlockMask(Geometry g);
  /// Causal ∧ user mask; `user` holds n_q·n_k bytes, row-major, each 0 or 1 (else StreamError).
  BlockMask(Geometry g, const std::vector<std::uint8_t>& user);

  /// The geometry the mask was built for.
  [[nodiscard]] const Geometry& geometry() const { return g_; }
  /// True when a user mask was given.
  [[nodiscard]] bool has_user_mask() const { return !bits_.empty(); }
  /// Last key block with a causally valid token pair for query block q: ⌊min(T−1, (q+1)b_q−1)/b_k⌋.
  [[nodiscard]] std::size_t causal_last(std::size_t q) const;
  /// C_blk[q, r].
  [[nodiscard]] bool valid(std::size_t q, std::size_t r) const;
  /// The smallest r in [a, b] with C_blk[q, r] = 1, or −1 if none (the representative rule of
  /// §2/App. A). `words`, if given, is increased by the number of 64-bit mask words scanned.
  [[nodiscard]] std::int64_t first_valid(std::size_t q, std::size_t a, std::size_t b,
                                         std::uint64_t* words = nullptr) const;
  /// The largest r in [a, b] with C_blk[q, r] = 1, or −1 if none.
  [[nodiscard]] std::int64_t last_valid(std::size_t q, std::size_t a, std::size_t b,
                                        std::uint64_t* words = nullptr) const;
  /// Number of r with C_blk[q, r] = 1.
  [[nodiscard]] std::size_t count_valid(std::size_t q) const;
  /// Token-level validity C[t, s]: t, s < T, s ≤ t and C_blk[q(t), r(s)] = 1.
  [[nodiscard]] bool token_valid(std::size_t t, std::size_t s) const;
  /// 64-bit words per packed row, ⌈n_k/64⌉ (0 for a causal-only mask).
  [[nodiscard]] std::size_t words_per_row() const { return words_per_row_; }

 private:
  [[nodiscard]] bool user_bit(std::size_t q, std::size_t r) const;
  Geometry g_;
  std::size_t words_per_row_ = 0;
  std::vector<std::uint64_t> bits_;  // empty: causal only
};

/// Reads a user block mask for `g` and combines it with causality.
///
/// Formats (chosen by extension, docs/stream.md): `.npy` of dtype uint8 or bool (`|u1`, `|b1`),
/// int32 or int64, shape [n_q, n_k], values 0 or 1; or a text file (any other extension) of n_q
/// lines, each n_k characters '0'/'1' (blank lines and lines starting with '#' are skipped).
/// Errors name the file and the position (row, column or line:col) and say what was expected.
/// The memory limit (memory_budget.hpp) is checked against n_q·n_k and the file size before
/// anything of that size is allocated.
BlockMask load_block_mask(const std::filesystem::path& path, Geometry g);
/// Same, under an explicit memory limit in bytes.
BlockMask load_block_mask(const std::filesystem::path& path, Geometry g, std::uint64_t max_bytes);
/// Same checks on a mask file already in memory: `npy` picks the format, `name` is for messages.
BlockMask parse_block_mask(std::string_view bytes, const std::string& name, bool npy, Geometry g,
                           std::uint64_t max_bytes);

/// Parameters of mask estimation.
struct EstimateParams {
  std::size_t k = 8;        ///< branches kept per query block (columns of I)
  std::size_t threads = 1;  ///< std::threads over query blocks; results do not depend on it
};

/// One candidate of a refinement round, with the fields of τ (App. B).
struct Candidate {
  double score = -std::numeric_limits<double>::infinity();  ///< representative score (NaN stored as −inf)
  std::int64_t r = -1;             ///< representative key block, −1 when the range has no valid block
  std::uint64_t branch_id = 0;     ///< initial branch i, child of b is 2b + split_bit
  std::uint8_t split_bit = 0;      ///< 0 = left half, 1 = right half (0 for initial branches)
  std::size_t lo = 0;              ///< first key block of the range
  std::size_t hi = 0;              ///< last key block of the range (inclusive)
};

/// The total order τ of App. B: true when `a` comes before `b`. Valid candidates precede
/// invalid ones; then score descending (NaN ≡ −inf, −inf below every finite value), then r,
/// branch_id, split_bit ascending. A strict total order on candidates with distinct fields.
bool tau_before(const Candidate& a, const Candidate& b);

/// The estimated sparse mask and what it cost.
struct EstimateResult {
  Geometry geometry;                 ///< block geometry of the run
  std::size_t k = 0;                 ///< columns of I
  std::vector<std::int64_t> indices; ///< I, n_q × k row-major, 0-based block indices, −1 = empty
  std::vector<double> scores;        ///< score(q, I[q, j]) beside each entry (NaN for empty)
  Traffic traffic;                   ///< Q, K, C_blk reads and I writes as the loops moved them
  std::uint64_t blocks_scored = 0;   ///< representative K blocks streamed (score evaluations)
  std::uint64_t max_blocks_scored_per_q = 0;  ///< the largest such count of one query block

  /// I[q, j].
  [[nodiscard]] std::int64_t at(std::size_t q, std::size_t j) const { return indices[q * k + j]; }
};

/// The paper's reference STREAM mask estimation (§2, §5, App. A/B), I = stream_estimate(Q, K,
/// C_blk, b_q, b_k, k, τ). Q and K are T × d (rows are tokens). Bitwise identical for any
/// `threads`. Throws StreamError on inconsistent shapes or parameters.
template <typename S>
EstimateResult stream_estimate(const Mat<S>& Q, const Mat<S>& K, const BlockMask& mask,
                               const EstimateParams& params);

/// score(q, r) of App. A computed on its own: max over token-valid (t, s) in blocks (q, r) of
/// ⟨Q_t, K_s⟩, NaN ≡ −inf, max ∅ = −inf. The same tile code the estimator uses.
template <typename S>
double stream_block_score(const Mat<S>& Q, const Mat<S>& K, const Geometry& g, std::size_t q,
                          std::size_t r);

/// The validity invariant of §3 as this reference guarantees it; returns "" when it holds,
/// else a description of the first violation (q, j, value). Checked: every entry is −1 or a
/// block r < n_k with C_blk[q, r] = 1; no duplicates within a row; empties only after all
/// non-empty entries; the number of non-empty entries is min(k, number of valid blocks of row q)
/// (so a row is empty iff it has no valid block, §9).
std::string validate_indices(const std::vector<std::int64_t>& indices, std::size_t k,
                             const BlockMask& mask);

/// One streamed edge record (q, r, w) of §3/§6 with all three weights of §3 side by side.
struct Edge {
  std::int64_t q = 0;         ///< query block
  std::int64_t r = 0;         ///< key block, = I[q, slot]
  std::int64_t slot = 0;      ///< position j in I[q, :] (records follow q, then j: §6's order)
  double score = 0;           ///< w (i): the representative score, max token-valid ⟨q, k⟩
  double mass = 0;            ///< w (ii): Σ_{t∈q} Σ_{s∈r} p_{t,s} under the sparse softmax
  double value_norm = 0;      ///< w (iii): ‖Σ_{t∈q} Σ_{s∈r} p_{t,s} V_s‖₂, the value summary's norm
};

/// Result of mask application.
template <typename S>
struct ApplyResult {
  Mat<S> O;                ///< T × d_v output; rows whose sparse support is empty are 0
  std::vector<Edge> edges; ///< edge records in (q, slot) order; empty unless requested
  Traffic traffic;         ///< Q, K, V, I reads and O (and E) writes
};

/// Sparse attention over the blocks in I (§6): for each query token t of block q, online softmax
/// (μ, λ, o) over the selected blocks in slot order, ℓ = ⟨Q_t, K_s⟩ (the paper's unscaled logit;
/// scale Q beforehand for 1/√d), ℓ = −inf for token-invalid pairs; O_t = o/λ. `indices` is an
/// n_q × k index tensor (−1 entries skipped). With `edges`, also the records of §3/§6.
template <typename S>
ApplyResult<S> stream_apply(const Mat<S>& Q, const Mat<S>& K, const Mat<S>& V, const BlockMask& mask,
                            const std::vector<std::int64_t>& indices, std::size_t k, std::size_t threads,
                            bool edges);

/// Dense masked attention in float64, the higher-precision reference: every token-valid pair
/// (causal ∧ user mask), a two-pass softmax per row (not online), rows with no valid key → 0.
/// O(T²·d) time, O(T) extra memory: for checks at small T only.
Mat<double> stream_dense_reference(const Mat<double>& Q, const Mat<double>& K, const Mat<double>& V,
                                   const BlockMask& mask);

/// Row-wise relative error max_{t,c} |got − ref| / max_c |ref_{t,c}| (each output row is a convex
/// combination of V rows, so its scale is its largest entry). +inf on NaN, on a shape mismatch,
/// or where a reference row that is exactly 0 (no valid key) is not exactly 0 in `got`.
double row_rel_error(const Mat<double>& got, const Mat<double>& ref);

/// Outcome of the built-in dense check.
struct DenseCheck {
  double max_rel_error = 0;     ///< row_rel_error(O_sparse, O_dense); +inf if NaN
  double tolerance = 1e-12;     ///< the float64 tolerance
  bool every_valid_block_kept = false;  ///< I covered every valid block of every row
  /// True when every valid block was kept and the error is within the tolerance (NaN fails).
  [[nodiscard]] bool passed() const { return every_valid_block_kept && max_rel_error <= tolerance; }
};

/// The built-in check of §6: estimate with k = n_k, so every valid block is kept, apply
/// in float64, and compare with `stream_dense_reference`.
DenseCheck stream_check_dense(const Mat<double>& Q, const Mat<double>& K, const Mat<double>& V,
                              const BlockMask& mask, std::size_t threads);

/// The paper's cost expressions for one run (§8), in elements (multiply by the dtype size).
struct Bounds {
  std::size_t n_q = 0;             ///< query blocks
  std::size_t n_k = 0;             ///< key blocks
  std::size_t n_it = 0;            ///< bisection rounds
  double io_upper_paper = 0;        ///< Td + n_q·k·n_it·b_k·d (Theorem 3, constant 1)
  double io_upper_exact = 0;       ///< Td + n_q·k·(n_it+1)·b_k·d: what this reference can read at most
  double io_lower = 0;             ///< Td + n_q·k·b_k·d (Theorem 4, constant 1)
  double work_paper = 0;            ///< 2·n_q·k·n_it·b_q·b_k·d flops (Work_est, a multiply-add = 2)
  double work_upper_exact = 0;     ///< 2·n_q·k·(n_it+1)·b_q·b_k·d flops
};

/// The bound expressions for geometry `g`, head dim `d` and sparsity `k`.
Bounds stream_bounds(const Geometry& g, std::size_t d, std::size_t k);

/// FNV-1a 64 of the index tensor (a checksum for logs and determinism checks, App. D (v)).
std::uint64_t indices_checksum(const std::vector<std::int64_t>& indices);

}  // namespace flashlab::ref::stream
