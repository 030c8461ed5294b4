/// @file stream_query.hpp
/// @brief Questions a researcher asks a trace store: what a token reads, who reads a block, which
/// routes carry mass from a source span to a target span across layers, how each head splits its
/// mass by distance, and the binned overview the viewer draws at any zoom.
///
/// Weights. A record's `mass` is Σ_{t∈q} Σ_{s∈r} p_{t,s}, summed over the query block's rows, so a
/// row of a query block with b rows sums to at most b. The queries report it beside its **share**
/// `mass / rows(q)`: the fraction of the query block's attention that goes to key block r (a row
/// of shares sums to 1 where every row has a valid key). Orders are total (mass descending, NaN
/// last, then layer, head, q, r ascending), so every answer is reproducible.
///
/// Distances. An edge (q, r) spans `distance = max(0, q·b_q − r·b_k)` tokens (block start to block
/// start, 0 on the diagonal). Distance class c = 0 for distance 0, else ⌊log2 distance⌋ + 1, so
/// class c ≥ 1 holds distances in [2^(c−1), 2^c). Bands for summaries: local < `local`, far ≥ `far`
/// tokens, mid between.
#pragma once

#include "flashlab/reference/stream_store.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace flashlab::ref::stream {

/// Which heads a query looks at: a layer or all, a head or all.
struct HeadSelection {
  std::optional<std::size_t> layer;  ///< nothing = every layer
  std::optional<std::size_t> head;   ///< nothing = every head
  /// True when (layer, head) is selected.
  [[nodiscard]] bool contains(std::size_t l, std::size_t h) const {
    return (!layer || *layer == l) && (!head || *head == h);
  }
};

/// Throws StoreError unless the selection names layers and heads the store has committed.
void check_selection(const Store& store, const HeadSelection& sel);

/// How long an answer may get: at most `top` edges, and only the shortest prefix (in the answer's
/// order) whose mass reaches `cumulative` of the total (1 = no such pruning).
struct Pruning {
  std::size_t top = 20;     ///< at most this many edges (≥ 1)
  double cumulative = 1.0;  ///< in (0, 1]
};

/// One record of the store, located and weighted.
struct StoreEdge {
  std::size_t layer = 0;  ///< layer
  std::size_t head = 0;   ///< head
  std::size_t q = 0;      ///< query block
  std::size_t r = 0;      ///< key block
  std::size_t slot = 0;   ///< position in the row (the estimate's τ order)
  double mass = 0;        ///< w (ii)
  double share = 0;       ///< mass / rows(q)
  double score = 0;       ///< w (i), NaN when the store keeps no scores
};

/// An answer: the kept edges and what they were chosen from.
struct EdgeList {
  std::vector<StoreEdge> edges;  ///< in order, pruned
  double total_mass = 0;         ///< Σ mass over every candidate (before pruning)
  std::size_t candidates = 0;    ///< edges considered
};

/// The order of every answer: mass descending (NaN last), then layer, head, q, r ascending.
bool edge_before(const StoreEdge& a, const StoreEdge& b);

/// Sorts `edges` by edge_before and keeps the pruned prefix; fills total_mass and candidates.
EdgeList prune_edges(std::vector<StoreEdge> edges, const Pruning& pruning);

/// Top reads of query block q: the records of row q in every selected head.
EdgeList top_reads(const Store& store, std::size_t q, const HeadSelection& sel, const Pruning& pruning);

/// Top readers of key block r: every selected head's records whose key block is r.
EdgeList top_readers(const Store& store, std::size_t r, const HeadSelection& sel, const Pruning& pruning);

/// Token span [begin, end).
struct TokenSpan {
  std::size_t begin = 0;  ///< first token
  std::size_t end = 0;    ///< one past the last token
};

/// Parameters of a route query.
struct RouteParams {
  std::optional<std::size_t> head;  ///< one head in every layer, or all heads averaged
  double residual = 0.5;            ///< weight of the residual stream ("stay at this block") per layer, in [0, 1)
  Pruning pruning{16, 0.9};         ///< per layer
};

/// One edge on a route: a record (head set) or the residual step at block q (head unset, r = q).
struct RouteEdge {
  std::size_t layer = 0;            ///< layer
  std::optional<std::size_t> head;  ///< the record's head; nothing for a residual step
  std::size_t q = 0;                ///< query block (node at the layer's output)
  std::size_t r = 0;                ///< key block (node at the layer's input); = q for a residual step
  double weight = 0;                ///< route mass through this edge, as a share of the route's total
};

/// What a layer carries on the route.
struct RouteLayer {
  std::size_t layer = 0;           ///< layer
  double attention = 0;            ///< share of the route through attention records of this layer
  double residual = 0;             ///< share through residual steps (attention + residual = 1)
  std::vector<RouteEdge> edges;    ///< pruned, heaviest first
};

/// A route answer.
struct Route {
  double total = 0;                ///< mass that flows from the target span down to the source span
  std::vector<RouteLayer> layers;  ///< top layer first
};

/// Mass-weighted routes from `target` (a later span: where the answer is read) down through the
/// layers to `source` (an earlier span: what it reads). Nodes are query blocks; layer ℓ moves
/// mass from node q at its output to node n at its input with weight
/// `(1 − residual)·A_ℓ(q, n) + residual·[q = n]`, where A_ℓ(q, n) is the selected heads' mean
/// share of q on key blocks overlapping node n (split by token overlap when b_q ≠ b_k). Forward
/// flow f from the target and backward flow g to the source give each edge the mass of the paths
/// through it, f_{ℓ+1}(q)·weight·g_ℓ(n); a layer's edges sum to the route's total. Needs every
/// layer committed. StoreError on an empty or out-of-range span.
Route route(const Store& store, TokenSpan source, TokenSpan target, const RouteParams& params);

/// Distance of edge (q, r) in tokens: max(0, q·b_q − r·b_k).
std::size_t edge_distance(const Geometry& g, std::size_t q, std::size_t r);
/// The distance class of a distance (0 for 0, else ⌊log2 d⌋ + 1).
std::size_t distance_class(std::size_t distance);
/// Distance classes a geometry can produce: distance_class(T) + 1.
std::size_t distance_classes(const Geometry& g);

/// Band limits of the per-head summary, in tokens.
struct DistanceBands {
  std::size_t local = 512;  ///< local: distance < local
  std::size_t far = 8192;   ///< far: distance ≥ far (mid between)
};

/// One head's mass by distance.
struct HeadSummary {
  std::size_t layer = 0;            ///< layer of the head
  std::size_t head = 0;             ///< head within the layer
  std::uint64_t records = 0;        ///< records of the head
  std::size_t empty_rows = 0;       ///< query blocks with no record
  double mass = 0;                  ///< Σ mass
  double local = 0;                 ///< share of the mass at distance < local
  double mid = 0;                   ///< share of the mass between the bands
  double far = 0;                   ///< share of the mass at distance ≥ far (local + mid + far = 1 when mass > 0)
  double mean_distance = 0;         ///< mass-weighted mean distance in tokens
};

/// One summary per committed head, in segment order.
std::vector<HeadSummary> summarize(const Store& store, const DistanceBands& bands);

/// Edge mass binned by query position and distance class over tokens [t0, t1).
struct DensityView {
  std::size_t t0 = 0;                    ///< first token covered (a query block's first)
  std::size_t t1 = 0;                    ///< one past the last token covered
  std::vector<std::size_t> bin_start;    ///< first token of each bin, then t1 (bins + 1 entries)
  std::size_t classes = 0;               ///< distance classes (rows of the grid)
  std::vector<double> mass;              ///< classes × bins, row-major by class: Σ mass
  std::vector<std::uint64_t> edges;      ///< classes × bins: record count
  /// Bins (columns).
  [[nodiscard]] std::size_t bins() const { return bin_start.empty() ? 0 : bin_start.size() - 1; }
};

/// Answers density views at any zoom in time independent of the store's size for the
/// aggregated selections: per query block and distance class, the mass and record count of
/// every layer (all heads) and of the whole store are summed once at construction
/// ((layers + 1)·n_q·classes·8 bytes). A single head, or one head over all layers, is read from
/// the records of the rows in view.
class DensityIndex {
 public:
  /// Builds the sums; StoreError when they would exceed `max_bytes`.
  DensityIndex(const Store& store, std::uint64_t max_bytes);
  /// The binned view of tokens [t0, t1) (clamped to [0, T), whole query blocks) in at most
  /// `bins` columns (bins align with query blocks). StoreError on an empty range or bins = 0.
  [[nodiscard]] DensityView view(const HeadSelection& sel, std::size_t t0, std::size_t t1, std::size_t bins) const;
  /// Bytes the sums take.
  [[nodiscard]] std::uint64_t bytes() const;

 private:
  const Store* store_;
  std::size_t classes_ = 0;
  std::vector<float> mass_;              // (layers + 1) × n_q × classes; the last slice is all layers
  std::vector<std::uint32_t> edges_;     // same layout
};

}  // namespace flashlab::ref::stream
