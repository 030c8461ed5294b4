// The split-KV forward (attention_fwd_splitkv.cu) as the front door sees it (internal): its tiles,
// its plan for a problem (how many key splits) and its launcher.
#pragma once

#include "core/common.hpp"

namespace flashlab::cuda::detail {

/// Keys per K_j/V_j tile (Bc) of the split-KV forward, at both head dims.
constexpr int kSplitKvBlockN = 64;

/// Packed query rows per block (Br) of the split-KV forward for `p`: the rows of the H/H_kv query
/// heads that share one K/V head, N rows each (H/H_kv·N rows per (batch, K/V head)), cut into
/// tiles of 16 (one warp's m16 tile, four warps splitting each K/V tile's keys: short lists,
/// decoding) or 64 (four warps of 16 rows, each over the whole K/V tile: longer lists).
int split_kv_block_m(const Problem& p);

/// How one launch divides the work: grid (splits, H_kv · row tiles, B).
struct SplitKvPlan {
  int block_m = 0;          ///< Br, packed query rows per block (split_kv_block_m)
  int row_tiles = 0;        ///< ⌈(H/H_kv)·N / Br⌉ per (batch, K/V head)
  int splits = 1;           ///< key ranges per row tile (1: the blocks write O and LSE themselves)
  int tiles_per_split = 0;  ///< K/V tiles of Bc keys per range (the last range may hold fewer)
};

/// The plan for `p` on a device with `sms` SMs where `resident` blocks of the kernel fit per SM:
/// as many key ranges as keep every row tile's blocks within one wave of sms·resident blocks
/// (at least one range, at most one per K/V tile), each of whole K/V tiles.
SplitKvPlan plan_split_kv(const Problem& p, int sms, int resident);

/// The split-KV forward on `stream`: 16-bit Q, O [B, N, H, d], K, V [B, N_k, H_kv, d], LSE
/// [B, H, N] base 2; d ∈ {64, 128}; causal bottom-right aligned. With more than one key range its
/// partials (fp32 O, m_i, l_i per packed row and range) come from the forwards' pool
/// (partial_pool.hpp) and a second kernel merges them.
void launch_fast_split_kv(const Problem& p, bool bf16, const void* Q, const void* K, const void* V, void* O,
                          float* LSE, cudaStream_t stream);

}  // namespace flashlab::cuda::detail
