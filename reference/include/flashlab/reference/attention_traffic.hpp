/// @file attention_traffic.hpp
/// @brief The closed-form HBM traffic of every attention algorithm (naive, FA1, FA2 forward;
///        naive, two-kernel, atomic backward) for an AttentionProblem.
///
/// This header is the *model* side of the traffic comparison: the tile loops in attention.hpp
/// count bytes as they run, the formulas here state the same numbers in closed form (O(Tr) work
/// per sequence, cheap at N = 16384), and the CUDA side measures them. Tests assert count ==
/// formula for every algorithm, with and without causal, windows, grouped K/V, packed sequences,
/// ragged tails and Br ≠ Bc. The exact assumptions behind each count are written down in
/// docs/attention.md; shapes and tiles as attention_problem.hpp.
///
/// Grouped-query attention: the loops with query tiles outside (FA2 forward, the dQ kernel) load
/// each K_j, V_j once per query head (KvLoads::per_query_head: H/H_kv loads of every tile, as
/// FA2 written for multi-head attention does); KvLoads::per_group models a kernel that loads it
/// once for the H/H_kv query heads that share it. The loops with key tiles outside (FA1, the
/// dK/dV kernel, the atomic kernel) always run per K/V head with the group's query heads inside:
/// K_j, V_j once per K/V head, dK_j, dV_j summed over the group in SRAM and written once.
#pragma once

#include "flashlab/reference/attention_problem.hpp"
#include "flashlab/reference/tensor.hpp"
#include "flashlab/reference/traffic.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace flashlab::ref {

/// How a loop with query tiles outside loads K_j, V_j under grouped-query attention (H_kv < H).
enum class KvLoads {
  per_query_head,  ///< once per query head: each K/V tile is read H/H_kv times (FA2 as written for H_kv = H)
  per_group        ///< once per K/V head: the H/H_kv query heads of a group share each load
};

/// The traffic of one kernel (one launch) of a variant, e.g. "dQ kernel".
struct KernelTraffic {
  std::string name;  ///< "forward", "D preprocessing", "dQ kernel", "dK/dV kernel", "dQ+dK/dV kernel", or a naive step
  Traffic traffic;   ///< per-tensor elements read and written, and FLOPs, of this kernel
};

/// Key tiles `first … end − 1` of one sequence (j counted from the sequence's first key).
struct KeyTileRange {
  std::size_t first = 0;  ///< first key tile visited
  std::size_t end = 0;    ///< one past the last key tile visited
  /// The number of key tiles visited, end − first.
  [[nodiscard]] std::size_t count() const { return end - first; }
};

/// The key tiles that query tile `i` of sequence `s` visits (the loops skip fully masked tile
/// pairs): those holding a key some valid row of the tile sees. The visited tiles are always
/// one contiguous range: all Tc without a mask; fewer on the right under causal masking or
/// window_right, fewer on the left under window_left; none for a tile whose rows see no key.
KeyTileRange visible_key_tile_range(const AttentionProblem& cfg, const SequenceSpan& s, std::size_t i);

/// Number of key tiles c_i that query tile `i` of the first sequence visits:
/// visible_key_tile_range(cfg, cfg.sequence(0), i).count(). Without window_left they are
/// j = 0 … c_i − 1.
std::size_t visible_key_tiles(const AttentionProblem& cfg, std::size_t i);

/// Closed-form traffic of a variant, split per kernel (see docs/attention.md for what each
/// count assumes). Counts are elements; bytes follow `cfg.dtype` (statistics stay fp32).
/// `kv_loads` chooses the model of the FA2 forward and the dQ kernel under grouped-query attention.
std::vector<KernelTraffic> attention_traffic_kernels(Algorithm v, const AttentionProblem& cfg,
                                                     KvLoads kv_loads = KvLoads::per_query_head);

/// Closed-form traffic of a variant: the per-kernel counts of attention_traffic_kernels merged.
Traffic attention_traffic_formula(Algorithm v, const AttentionProblem& cfg,
                                  KvLoads kv_loads = KvLoads::per_query_head);

/// True when `a` and `b` name the same tensors with equal read and write element counts and
/// equal FLOPs (order of tensors ignored). `why`, if given, receives the first difference.
bool same_counts(const Traffic& a, const Traffic& b, std::string* why = nullptr);

}  // namespace flashlab::ref
