// cuda/src/attention/bwd_ws_split.hpp — the wgmma-ws backward's split group (attention_bwd_ws.cu):
// the grouped causal kernel at d = 128 runs each K/V head's query heads over two blocks per key
// tile, whose dK, dV meet in the workspace. Internal to cuda/src: the front door sizes the workspace
// and calls the launcher.
#pragma once

#include "attention/launchers.hpp"

#include <cstddef>

namespace flashlab::cuda::detail {

/// fp32 per slot of the split group's workspace: one consumer warp's dK_c, dV_c (d = 128).
constexpr int kSplitSlotFloats = 4096;

/// The problems the split group runs: dense, causal, d = 128, an even number G = H/H_kv ≥ 2 of
/// query heads per K/V head, no window. Two blocks per key tile of a K/V head, each running G/2 of
/// its query heads; their dK, dV meet in the workspace: a slot per (b, K/V head, key tile of 128,
/// consumer warp), kSplitSlotFloats floats each, then an int ticket each. Returns the slots; 0
/// when the problem is not split.
inline std::size_t bwd_ws_split_slots(const Problem& p) {
  const bool split = p.causal && p.head_dim == 128 && p.heads_kv < p.heads && (p.heads / p.heads_kv) % 2 == 0 &&
                     !p.windowed() && !p.packed();
  return split ? std::size_t(p.batch) * p.heads_kv * std::size_t((p.seq_k + 127) / 128) * 8 : 0;
}

/// launch_fast_bwd_ws() on a problem with bwd_ws_split_slots(p) > 0 (the atomic order): `kv_part`
/// the workspace's bwd_ws_split_slots(p) slots and tickets (16-byte aligned).
void launch_fast_bwd_ws_split_group(const Problem& p, bool bf16, const BwdPointers& a, float* kv_part,
                                    cudaStream_t stream);

}  // namespace flashlab::cuda::detail
