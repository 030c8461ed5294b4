/// @file stream_needles.hpp
/// @brief Planted needles for STREAM: Q/K with known key blocks that the estimate should find.
///
/// Fidelity without model weights ("Real-Time Sparse Tracing at Million-Token Context" asks for
/// representative workloads; docs/stream.md, "Planted needles"). Chosen query blocks ("needle
/// blocks") each get `needles_per_block` planted key blocks far in their past. Needle i of needle
/// block q owns one coordinate c of the head dim: query token q·b_q + i carries 1 at c, and every
/// key of the planted block r carries h(0) at c. The other coordinates of Q and K are uniform
/// noise; the planted coordinates carry no noise, so needles never leak into each other's scores.
///
/// The representative rule scores a branch by its *first* valid block only, so an isolated
/// needle is invisible to the estimate until a branch happens to start on it (recall near chance
/// at large T; printed with `lead_in = false`). With `lead_in = true` the keys before a needle
/// carry a trace of it that grows towards it: key block s ≤ r gets h(r − s) = slope·(n_k + 1 −
/// (r − s)) at c — the locality the hierarchical search assumes (a passage that builds up to the
/// needle). A candidate's score is then set by its distance to the next needle, the branch that
/// holds a needle starts closer to it than all but at most one other candidate per needle, and
/// k ≥ 2·needles_per_block branches keep every needle's branch through all rounds.
#pragma once

#include "flashlab/reference/stream.hpp"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace flashlab::ref::stream {

/// Parameters of the planted-needle generator.
struct NeedleParams {
  Geometry geometry;                 ///< T, b_q, b_k
  std::size_t d = 128;               ///< head dim; needle_blocks·needles_per_block ≤ d
  std::size_t needle_blocks = 16;    ///< query blocks that get needles (spread over the second half)
  std::size_t needles_per_block = 8; ///< planted key blocks per needle block (≤ b_q)
  double noise = 0.02;               ///< standard deviation of the uniform noise (unplanted coordinates)
  double slope = 0.25;               ///< lead-in growth per key block (≫ the noise part of a score)
  bool lead_in = true;               ///< keys before a needle carry its fading trace
  /// Store each needle's key values as a bf16 pair on two coordinates (2c: the value rounded to
  /// bf16, 2c + 1: the remainder, exact in bf16; the needle's query token carries 1 on both), so
  /// that inputs rounded to bf16 keep the lead-in exact and every fp32 score is unchanged. With one
  /// coordinate, bf16's 8-bit significand rounds h (up to slope·(n_k + 1)) in steps of many
  /// blocks and flattens the lead-in. Needs 2·needle_blocks·needles_per_block ≤ d.
  bool bf16_pairs = false;
  std::uint64_t seed = 1;            ///< everything is a pure function of the parameters and the seed
  /// A planting larger than one input set's d coordinates is spread over `sets` input sets (each
  /// its own Q, K and seed): this set plants the needle blocks g = set, set + sets, … <
  /// needle_blocks, at the query blocks the whole planting spreads over the second half. Only this
  /// set's blocks need coordinates: set_blocks()·needles_per_block (twice that with bf16_pairs) ≤ d.
  std::size_t sets = 1;
  std::size_t set = 0;  ///< this input set, 0 ≤ set < sets
  /// Needle blocks this set plants.
  [[nodiscard]] std::size_t set_blocks() const {
    return set < needle_blocks ? (needle_blocks - set + sets - 1) / sets : 0;
  }
};

/// The fewest input sets that hold `needle_blocks` needle blocks of `needles_per_block` needles
/// each on d coordinates (one per needle, two with bf16 pairs); 0 when one block's needles alone
/// exceed d.
std::size_t needle_sets_needed(std::size_t d, std::size_t needle_blocks, std::size_t needles_per_block, bool bf16_pairs);

/// One planted (query block, key block) pair.
struct Needle {
  std::size_t q = 0;  ///< query block
  std::size_t r = 0;  ///< planted key block (far in q's past: in the first half of [0, causal_last(q)])
};

/// Generated inputs and the truth.
struct NeedleSet {
  Mat<float> Q;                 ///< T × d
  Mat<float> K;                 ///< T × d
  std::vector<Needle> needles;  ///< the planted pairs, by q then r
};

/// Generates Q, K and the planted needles of input set `params.set`; throws StreamError (naming
/// the parameter) when the geometry cannot hold them: set_blocks()·needles_per_block (twice that
/// with bf16_pairs) > d, needles_per_block > b_q, set ≥ sets, needle_blocks > the query blocks of
/// the second half, or
/// a needle block with fewer than needles_per_block blocks in the first half of its past.
NeedleSet make_needles(const NeedleParams& params);

/// How many planted pairs (q, r) have r among I[q, ·].
struct NeedleRecall {
  std::size_t found = 0;    ///< planted pairs selected by the estimate
  std::size_t planted = 0;  ///< all planted pairs
  /// found / planted (1 when nothing is planted).
  [[nodiscard]] double recall() const { return planted ? double(found) / double(planted) : 1.0; }
};

/// Recall of the planted needles by an index tensor I (n_q × k, as stream_estimate returns).
NeedleRecall needle_recall(const std::vector<Needle>& needles, const std::vector<std::int64_t>& indices,
                           std::size_t k);

}  // namespace flashlab::ref::stream
