/// @file mta_traffic.hpp
/// @brief Closed-form HBM traffic and work of the flash MTA paths (the MTA kernels), per tensor.
///
/// The tile loops of mta.hpp count what they move as they run; these functions state the same
/// numbers from the shape alone, so a test can hold the loops to the formulas (and the CUDA
/// kernels, later, to both). Conventions (docs/mta.md gives the derivation):
///
/// - Only rows inside [0, N) move: a tile row (or column) that falls into the zero padding
///   above the first token or past the last is synthesised on chip, not read. The count of
///   rows a pass loads is therefore `tile_coverage`, the sum over its tiles of each tile's
///   overlap with [0, N) — this is where the *halo recompute* shows up (overlapping tiles read
///   the halo rows again).
/// - Read-modify-write accumulators (O in the forward, dQ, dK, dV in the backward) read the
///   whole loaded tile and write back the effective region only.
/// - Statistics (M, L, D, M_s, L_s) are fp32 whatever the dtype (as in traffic.hpp).
/// - Work counts the tile products only, 2 flops per multiply-add, on full B × B tiles (a
///   kernel computes padded tiles too): QKᵀ, PV, dO Vᵀ, Pᵀ dO, dS K, dSᵀ Q are 2B²d each; the
///   convolution, its transpose and GradW are 2B²·cq·ck each.
#pragma once

#include "flashlab/reference/mta.hpp"
#include "flashlab/reference/tensor.hpp"
#include "flashlab/reference/traffic.hpp"

#include <cstdint>

namespace flashlab::ref::mta {

/// Σ over the T = ⌈n / stride⌉ tiles t of |[t·stride − above, t·stride + stride + below) ∩ [0, n)|:
/// the number of rows that tiles with effective size `stride` and halos `above`/`below` load.
/// Closed form (no loop): T·(stride + above + below) minus what the padding above cuts from the
/// first tiles and what the padding past n cuts from the last ones.
std::uint64_t tile_coverage(std::uint64_t n, std::uint64_t stride, std::uint64_t above, std::uint64_t below);

/// Traffic and work of `flash_forward` for Q/K/V of `shape` (B·H heads of N × d).
Traffic forward_traffic(const Shape& shape, const Params& p, Dtype dtype = Dtype::fp32);
/// Traffic and work of `flash_backward` (D preprocessing, dQ + dW loop, dK/dV loop).
Traffic backward_traffic(const Shape& shape, const Params& p, Dtype dtype = Dtype::fp32);
/// Traffic and work of `flash_infer` (split kernels and, when splits > 1, the combine step).
Traffic infer_traffic(const Shape& shape, const Params& p, Dtype dtype = Dtype::fp32);

}  // namespace flashlab::ref::mta
