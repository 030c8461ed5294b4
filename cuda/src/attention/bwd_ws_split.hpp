// cuda/src/attention/bwd_ws_split.hpp — the workspace of the wgmma-ws backward's split tail
// (attention_bwd_ws.cu, bwd_ws_split_kernel): where it lies after the atomic design's dQ
// accumulator and order counters, and its size, for the front door's workspace and the launcher.
#pragma once

#include "attention/launchers.hpp"
#include "core/common.hpp"

#include <cstddef>

namespace flashlab::cuda::detail {

/// The most key tiles the wgmma-ws backward splits (its last partial wave: fewer tiles than the
/// GPU has SMs), so one workspace size serves every GPU of up to 161 SMs.
constexpr int kBwdSplitTiles = 160;

/// Bytes from the dQ accumulator's start to the split tiles' workspace: the accumulator (whole
/// tiles of kAtomicDqTileRows rows) and the order counters, rounded up to 256 bytes.
inline std::size_t bwd_ws_split_offset(const Problem& p) {
  constexpr std::size_t kTile = kAtomicDqTileRows;
  const std::size_t numel = std::size_t(p.batch) * ((std::size_t(p.seq) + kTile - 1) / kTile * kTile) * p.row_stride();
  const std::size_t counters =
      std::size_t(p.batch) * p.heads * ((std::size_t(p.seq) + kDqOrderTileRows - 1) / kDqOrderTileRows);
  return (numel * sizeof(float) + counters * sizeof(int) + 255) / 256 * 256;
}

/// Bytes of the split tiles' workspace: per tile the fp32 dK, dV partial of 128 keys × d and two
/// counters. Only the plain d = 128 kernel splits (dense, H_kv = H, N_k = N, no mask); 0 otherwise.
inline std::size_t bwd_ws_split_bytes(const Problem& p) {
  if (p.head_dim != 128 || p.packed() || p.heads_kv != p.heads || p.seq_k != p.seq || p.causal || p.windowed())
    return 0;
  const std::size_t tiles = std::size_t(p.batch) * p.heads * ((std::size_t(p.seq) + 127) / 128);
  const std::size_t n = tiles < std::size_t(kBwdSplitTiles) ? tiles : std::size_t(kBwdSplitTiles);
  return n * (2 * 128 * 128 * sizeof(float) + 2 * sizeof(int));
}

}  // namespace flashlab::cuda::detail
