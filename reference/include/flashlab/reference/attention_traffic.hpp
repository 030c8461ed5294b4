/// @file attention_traffic.hpp
/// @brief The closed-form HBM traffic of every attention algorithm (naive, FA1, FA2 forward;
///        naive, two-kernel, atomic backward) for an AttentionProblem.
///
/// This header is the *model* side of the traffic comparison: the tile loops in attention.hpp
/// count bytes as they run, the formulas here state the same numbers in closed form (O(Tr) work,
/// cheap at N = 16384), and the CUDA side measures them. Tests assert count == formula for every
/// algorithm, with and without causal, ragged tails and Br ≠ Bc. The exact assumptions behind
/// each count are written down in docs/attention.md; shapes and tiles as attention_problem.hpp.
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

/// The traffic of one kernel (one launch) of a variant, e.g. "dQ kernel".
struct KernelTraffic {
  std::string name;  ///< "forward", "D preprocessing", "dQ kernel", "dK/dV kernel", "dQ+dK/dV kernel", or a naive step
  Traffic traffic;   ///< per-tensor elements read and written, and FLOPs, of this kernel
};

/// Number of key tiles c_i that query tile `i` visits (the loops skip fully masked tiles):
/// Tc without causal; with causal, the key tiles whose first key some row of tile i can see.
/// Key tiles visited by query tile i are exactly j = 0 … c_i − 1.
std::size_t visible_key_tiles(const AttentionProblem& cfg, std::size_t i);

/// Closed-form traffic of a variant, split per kernel (see docs/attention.md for what each
/// count assumes). Counts are elements; bytes follow `cfg.dtype` (statistics stay fp32).
std::vector<KernelTraffic> attention_traffic_kernels(Algorithm v, const AttentionProblem& cfg);

/// Closed-form traffic of a variant: the per-kernel counts of attention_traffic_kernels merged.
Traffic attention_traffic_formula(Algorithm v, const AttentionProblem& cfg);

/// True when `a` and `b` name the same tensors with equal read and write element counts and
/// equal FLOPs (order of tensors ignored). `why`, if given, receives the first difference.
bool same_counts(const Traffic& a, const Traffic& b, std::string* why = nullptr);

}  // namespace flashlab::ref
