/// @file stream_fidelity.hpp
/// @brief How much of dense attention the trace keeps: the estimate's kept blocks against the dense
/// attention's top-k blocks by mass, and the inputs to measure it on (random, planted needles, and
/// structured: local window + attention sink + retrieval).
///
/// The estimate picks k key blocks per query block by a representative score (the STREAM paper,
/// App. A), not by attention mass; dense attention tells what the best k blocks by mass would have
/// been. For each query block q with V(q) valid blocks, let M(q, r) be dense causal attention's
/// block mass Σ_{t∈q} Σ_{s∈r} p_{t,s} (float64, every token-valid pair) and m_k(q) the k-th largest
/// M(q, ·) (k capped at V(q)). Then, summed over query blocks:
/// - **recall** = #{kept r : M(q, r) ≥ m_k(q)} / Σ_q min(k, V(q)) — ties at the k-th mass count as
///   hits, so equal masses never make the answer depend on an order;
/// - **mass kept** = Σ_{kept r} M(q, r) / Σ_q rows(q): the share of dense attention mass the kept
///   blocks hold (rows with no valid key count 0);
/// - **oracle mass** = the same for the dense top-k blocks, the best any k blocks can do.
#pragma once

#include "flashlab/reference/stream.hpp"
#include "flashlab/reference/stream_needles.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace flashlab::ref::stream {

/// The synthetic inputs a trace and a fidelity run can be made on.
enum class Workload {
  random,      ///< Q, K, V ~ N(0, 1), Q scaled by 1/√d (logits of unit variance)
  needles,     ///< planted needles with lead-in (stream_needles.hpp), V ~ N(0, 1)
  structured,  ///< a local window (ALiBi-like decay), an attention sink on block 0, retrieval pairs
};

/// "random", "needles", "structured".
std::string_view workload_name(Workload w);
/// The workload of a name, or nothing.
std::optional<Workload> workload_from_name(std::string_view name);

/// Parameters of a synthetic workload.
struct WorkloadParams {
  Geometry geometry;         ///< T, b_q, b_k
  std::size_t d = 64;        ///< head dim (structured needs ≥ 8)
  std::uint64_t seed = 1;    ///< everything is a pure function of the parameters and the seed
  std::size_t variant = 0;   ///< another draw of the noise with the same plan (layer·heads + head
                             ///< of a trace: needles and retrieval pairs stay where they are)
  std::size_t needle_blocks = 4;       ///< needles: query blocks with needles; structured: retrieval query blocks
  std::size_t needles_per_block = 4;   ///< needles: planted key blocks per needle block; structured: retrieving tokens per block
  std::size_t window = 0;    ///< structured: local window in tokens (0 = 4·b_k)
};

/// Generated Q, K, V and the planted (query block, key block) pairs (needles or retrievals).
struct WorkloadInputs {
  Mat<float> Q;                 ///< T × d
  Mat<float> K;                 ///< T × d
  Mat<float> V;                 ///< T × d
  std::vector<Needle> planted;  ///< pairs the trace should find (empty for random)
};

/// Builds a workload. Structured inputs (docs/stream.md, "Fidelity"): with β = 4/window,
/// q_t = (−β·t, 1, 1, ρ·u_t, noise) and k_s = (1, β·s + λ, 0, …) give a local logit λ − β(t − s);
/// keys of block 0 (the sink) carry (0, 0, σ) for a constant logit σ; retrieval keys (one far
/// key block per retrieval query block) carry (0, 0, 0, ρ·u) and match the retrieving tokens'
/// ρ·u for a logit ρ² that no distance decays. Throws StreamError when the geometry cannot hold the plan.
WorkloadInputs make_workload(Workload w, const WorkloadParams& p);

/// Dense causal attention's block masses M(q, r), float64, n_q × n_k row-major.
struct BlockMass {
  Geometry geometry;          ///< the blocks
  std::vector<double> mass;   ///< n_q × n_k
  /// M(q, r).
  [[nodiscard]] double at(std::size_t q, std::size_t r) const { return mass[q * geometry.n_k() + r]; }
};

/// M(q, r) of dense masked attention (every token-valid pair, two-pass softmax in float64,
/// unscaled logits as stream_apply). O(T²·d) time, O(n_q·n_k + b_q·T) memory; `threads` over
/// query blocks, results independent of it.
template <typename S>
BlockMass dense_block_mass(const Mat<S>& Q, const Mat<S>& K, const BlockMask& mask, std::size_t threads);

/// One fidelity measurement (see the file comment).
struct Fidelity {
  std::size_t k = 0;            ///< blocks kept per query block
  std::uint64_t hits = 0;       ///< kept blocks with M(q, r) ≥ m_k(q)
  std::uint64_t wanted = 0;     ///< Σ_q min(k, V(q))
  double mass_kept = 0;         ///< Σ kept M / Σ rows
  double mass_oracle = 0;       ///< Σ dense top-k M / Σ rows
  /// hits / wanted (1 when nothing is wanted).
  [[nodiscard]] double recall() const { return wanted ? double(hits) / double(wanted) : 1.0; }
};

/// Compares the index tensor I (n_q × k, as stream_estimate returns) with the dense top-k.
Fidelity compare_with_dense(const BlockMass& dense, const BlockMask& mask, const std::vector<std::int64_t>& indices,
                            std::size_t k);

}  // namespace flashlab::ref::stream
