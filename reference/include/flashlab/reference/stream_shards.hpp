/// @file stream_shards.hpp
/// @brief STREAM with the sequence sharded over G GPUs, simulated in one process: which rank holds
/// which query and key blocks, which rank scores which block pair, and the bytes that each way of
/// sharing the key blocks moves between GPUs.
///
/// The estimate of one query block is a search (stream.hpp): each refinement round scores the
/// representatives of the surviving branches, anywhere in the admissible range, so a rank that
/// holds query block q needs scores against key blocks other ranks hold. Three ways to get them,
/// each exact — the scores are pure functions of (q, r) and τ is a total order, so every way
/// yields the single-GPU I bit for bit as long as the scores are computed alike:
/// - **keys_visible**: before the estimate each rank receives every remote key block that C_blk
///   lets any of its query blocks see (one exchange, like an all-gather of K restricted by the
///   mask); the search then runs locally.
/// - **keys_scored**: each rank receives a remote key block the first time one of its query
///   blocks scores it — only the representatives, but one request round per refinement round.
/// - **queries_to_keys**: the two-level scheme the STREAM paper sketches, in an exact form: a
///   query block travels to the owner of each remote representative once, the owner scores it
///   and returns (score, r), and the query block's owner keeps the top k by τ; one round per
///   refinement round.
/// The application then needs K and V of the kept remote blocks; what the estimate already
/// brought is not sent again. Bytes count what crosses the links: `link_elem_bytes` per element
/// of Q, K, V (2: bf16 as the fast kernels hold them), 4 per block index and 4 per score sent.
#pragma once

#include "flashlab/reference/stream.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace flashlab::ref::stream {

/// The ways a rank obtains scores against key blocks another rank holds (file comment).
enum class ShardScheme { keys_visible, keys_scored, queries_to_keys };

/// "keys_visible", "keys_scored" or "queries_to_keys".
const char* shard_scheme_name(ShardScheme s);

/// The blocks one rank holds: tokens [token_begin, token_end), query blocks [q_begin, q_end) and
/// key blocks [r_begin, r_end) — those whose first token falls in its tokens.
struct RankShard {
  std::size_t token_begin = 0;  ///< first token
  std::size_t token_end = 0;    ///< one past the last token
  std::size_t q_begin = 0;      ///< first query block
  std::size_t q_end = 0;        ///< one past the last query block
  std::size_t r_begin = 0;      ///< first key block
  std::size_t r_end = 0;        ///< one past the last key block
  /// Field by field.
  bool operator==(const RankShard&) const = default;
};

/// The contiguous sharding of `g` over `gpus` ranks: shard boundaries at multiples of
/// lcm(b_q, b_k) tokens (so that no block straddles two ranks), as even as that allows; a rank
/// may hold nothing when T is short. Throws StreamError for gpus = 0 or a geometry that fails
/// Geometry::check().
std::vector<RankShard> shard_sequence(const Geometry& g, std::size_t gpus);

/// How the query blocks are dealt to the ranks. Causal attention makes a late query block's
/// estimate dearer (more refinement rounds, log2 of its admissible range) and makes its rank wait
/// for more key rows, so the contiguous layout leaves the last rank both the most work and the
/// longest wait.
enum class ShardLayout {
  contiguous,  ///< rank g holds the g-th of G contiguous shards (shard_sequence)
  zigzag,      ///< the sequence in 2G contiguous chunks; rank g holds chunks g and 2G − 1 − g
};

/// "contiguous" or "zigzag".
const char* shard_layout_name(ShardLayout layout);

/// The layout named `name` ("contiguous" or "zigzag"). Throws StreamError naming it otherwise.
ShardLayout parse_shard_layout(const std::string& name);

/// The query ranges of every rank under `layout`: element g lists rank g's chunks in token order
/// (one for contiguous, 2·folds for zigzag), empty chunks left out, so a rank may hold none when T
/// is short. `folds` (zigzag only) cuts the sequence into 2·folds·G chunks and deals each run of 2G
/// of them as zigzag deals its 2G: rank g holds chunks 2G·p + g and 2G·p + 2G − 1 − g of every
/// pass p < folds. More folds even out the ranks' estimate work (each pass is balanced on its
/// own, and the passes' costs differ less than zigzag's two halves) and shorten the key rows a
/// rank's first chunk waits for, at the price of more chunks and transfers. Chunk boundaries as
/// shard_sequence's (multiples of lcm(b_q, b_k)); with one rank the whole sequence is one chunk
/// whatever the layout. Throws as shard_sequence, and StreamError for folds = 0 or folds > 1
/// under the contiguous layout.
std::vector<std::vector<RankShard>> shard_layout(const Geometry& g, std::size_t gpus, ShardLayout layout,
                                                 std::size_t folds = 1);

/// The key rows one rank of a layout receives and sends when it takes every remote key row before
/// the end of its last chunk (keys_visible for a causal-only mask), and what its first chunk waits for.
struct LayoutRows {
  std::size_t chunks = 0;          ///< query ranges the rank holds
  std::size_t q_blocks = 0;        ///< query blocks it holds
  std::uint64_t rows_in = 0;       ///< remote key rows it receives (tokens before its last chunk's end)
  std::uint64_t rows_out = 0;      ///< its own key rows sent, summed over the ranks receiving them
  std::uint64_t rows_first = 0;    ///< remote key rows before its first chunk: all its first range waits for
};

/// LayoutRows of every rank under `layout` and `folds` (shard_layout; a rank without query blocks
/// receives nothing). Bytes of one exchange are rows × H·d·element bytes. Throws as shard_layout.
std::vector<LayoutRows> layout_exchange_rows(const Geometry& g, std::size_t gpus, ShardLayout layout,
                                             std::size_t folds = 1);

/// One chunk's key (or value) rows moved from the rank holding them to a rank that needs them.
struct ChunkTransfer {
  std::size_t src = 0;  ///< the rank holding the chunk
  std::size_t dst = 0;  ///< the rank receiving it
  RankShard chunk;      ///< the rows: one chunk of src (shard_layout)
  /// The index of dst's first chunk that needs these rows (the first that starts at or after the
  /// chunk's end): an exchange in tiers sends tier 0 first, so dst's chunk i can start once the
  /// tiers 0 … i have landed.
  std::size_t tier = 0;
  /// Field by field.
  bool operator==(const ChunkTransfer&) const = default;
};

/// Every transfer of the keys_visible exchange under `layout` and `folds`: each chunk to every
/// other rank whose last chunk ends after it (causal: that rank's later chunks see all of it).
/// One order for all ranks — chunks in token order, each to its receivers in rank order — so
/// that ranks issuing their sends and receives in it match them pairwise. Per receiving rank the
/// rows add up to LayoutRows::rows_in, and those of tier 0 to rows_first. Throws as shard_layout.
std::vector<ChunkTransfer> layout_transfers(const Geometry& g, std::size_t gpus, ShardLayout layout,
                                            std::size_t folds = 1);

/// What one rank sends and receives under one scheme, and the score evaluations of its query
/// blocks.
struct RankLinkBytes {
  std::uint64_t estimate_in = 0;    ///< bytes received for the estimate
  std::uint64_t estimate_out = 0;   ///< bytes sent for the estimate
  std::uint64_t apply_in = 0;       ///< bytes received for the application (K, V of kept remote blocks)
  std::uint64_t apply_out = 0;      ///< bytes sent for the application
  std::uint64_t scores_local = 0;   ///< scores of its query blocks against key blocks it holds
  std::uint64_t scores_remote = 0;  ///< scores of its query blocks against key blocks others hold
  std::uint64_t scores_computed = 0;///< score evaluations this rank's GPU performs (queries_to_keys: for others too)
};

/// The link traffic of one scheme over all ranks.
struct SchemeTraffic {
  ShardScheme scheme = ShardScheme::keys_visible;  ///< which scheme
  std::size_t rounds = 0;                          ///< exchange rounds of the estimate
  std::vector<RankLinkBytes> ranks;                ///< one per rank
  /// The largest estimate_in + apply_in of any rank (the slowest rank's received bytes).
  [[nodiscard]] std::uint64_t max_in() const;
  /// Σ over ranks of the bytes received (= sent), estimate and application.
  [[nodiscard]] std::uint64_t total() const;
};

/// A sharded estimate: I as the single-GPU estimate computes it, the sharding and each scheme's
/// traffic.
struct ShardedEstimate {
  EstimateResult result;               ///< I, scores and the estimate's HBM traffic summed over ranks
  std::vector<RankShard> shards;       ///< one per rank
  std::vector<SchemeTraffic> schemes;  ///< keys_visible, keys_scored, queries_to_keys
};

/// Runs the estimate of every query block on its owner rank with the refinement stream_estimate
/// runs (the same code), records where each representative lives, and counts the three schemes'
/// link bytes; then the bytes of the application of the resulting I. `params.threads` as in
/// stream_estimate (the result does not depend on it). Throws StreamError as stream_estimate, and
/// for gpus = 0 or link_elem_bytes ∉ {1, 2, 4, 8}.
template <typename S>
ShardedEstimate stream_estimate_sharded(const Mat<S>& Q, const Mat<S>& K, const BlockMask& mask,
                                        const EstimateParams& params, std::size_t gpus,
                                        std::size_t link_elem_bytes = 2);

/// keys_visible's received bytes in closed form for a causal-only mask: rank s receives every key
/// row before its first token, token_begin(s)·d·link_elem_bytes (the test holds the count to it).
std::uint64_t keys_visible_causal_bytes(const RankShard& shard, std::size_t d, std::size_t link_elem_bytes);

/// keys_visible's link bytes for a causal-only mask from a finished I (`indices`, [n_q, k] of one
/// head, −1 = empty, as stream_estimate returns it): the estimate's K of every key block before a
/// rank's first (sent by the block's owner to each later rank that holds query blocks) and the
/// application's V of the remote blocks the rank's rows of I kept, once per block and receiving
/// rank. The score fields stay 0. Equal to stream_estimate_sharded's keys_visible traffic for the
/// same I (the test holds it to that), so a caller that has I without the simulation — the
/// sharded GPU run — can state the model's bytes. Under `layout` zigzag (and any `folds`) a rank
/// receives every remote key block before the end of its last chunk, and V of the remote blocks it
/// kept. Throws as shard_layout, and StreamError for an I of the wrong size or an entry outside
/// [−1, n_k).
std::vector<RankLinkBytes> keys_visible_causal_traffic(const Geometry& g, std::size_t gpus,
                                                       const std::vector<std::int64_t>& indices, std::size_t k,
                                                       std::size_t d, std::size_t link_elem_bytes,
                                                       ShardLayout layout = ShardLayout::contiguous,
                                                       std::size_t folds = 1);

}  // namespace flashlab::ref::stream
