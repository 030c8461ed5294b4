// packed.cuh — where one query tile of a packed launch lies (internal, device code; the fast
// forwards attention_fwd_tc.cu and attention_fwd_ws.cu share it).
//
// Packed sequences (Problem::packed()) arrive as FlashAttention's varlen call gives them: the
// prefix sums cu_seqlens_q and cu_seqlens_k in device memory, the host knowing only B and the
// totals. The launch therefore numbers its query tiles without the lengths: sequence b owns the
// tiles first(b) … first(b + 1) − 1 with first(b) = ⌊cu_seqlens_q[b] / Br⌋ + b. That is at least
// the ⌈len_q / Br⌉ tiles the sequence needs (⌊(c + len) / Br⌋ − ⌊c / Br⌋ + 1 ≥ ⌈len / Br⌉) and at
// most one more, so Problem::packed_tiles(Br) = ⌊total_q / Br⌋ + B tiles per head cover every
// sequence and waste at most one (empty) tile per sequence: no tile of padding, no host copy of
// the lengths, no pass over them before the launch. A tile finds its sequence by a binary search
// over first(b), which grows strictly with b (an empty sequence still owns one tile, empty).
#pragma once

#include "core/common.hpp"

namespace flashlab::cuda::detail {

/// One query tile of a packed launch: its sequence, its first row counted from the sequence's
/// first query, and the sequence's rows in the packed tensors.
struct PackedTile {
  int b;        ///< the sequence
  int row0;     ///< first query row of the tile inside the sequence (≥ len_q: a tile past its end)
  int q_start;  ///< the sequence's first row of Q and O (cu_seqlens_q[b])
  int len_q;    ///< its queries
  int k_start;  ///< its first row of K and V (cu_seqlens_k[b])
  int len_k;    ///< its keys
};

/// Tile `u` (0 ≤ u < Problem::packed_tiles(rows)) of the numbering above, with query tiles of
/// `rows` rows, over the B + 1 prefix sums `cu_q` and `cu_k` (device memory).
__device__ __forceinline__ PackedTile packed_tile(const int* cu_q, const int* cu_k, int batch, int u, int rows) {
  int lo = 0, hi = batch - 1;  // the last b with first(b) ≤ u (first(0) = 0 ≤ u)
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (__ldg(cu_q + mid) / rows + mid <= u) lo = mid;
    else hi = mid - 1;
  }
  PackedTile t;
  t.b = lo;
  t.q_start = __ldg(cu_q + lo);
  t.len_q = __ldg(cu_q + lo + 1) - t.q_start;
  t.row0 = (u - (t.q_start / rows + lo)) * rows;
  t.k_start = __ldg(cu_k + lo);
  t.len_k = __ldg(cu_k + lo + 1) - t.k_start;
  return t;
}

/// packed_tile() of the lists of a launch of problem `p`.
__device__ __forceinline__ PackedTile packed_tile(const Problem& p, const PackedLists& lists, int u, int rows) {
  return packed_tile(lists.cu_seqlens_q, lists.cu_seqlens_k, p.batch, u, rows);
}

/// A sequence's query tile m sees key tiles up to about m + packed_row_shift(): ⌊(len_k − len_q)/rows⌋,
/// the bottom-right causal offset in tiles of `rows` rows (floor: negative where len_k < len_q).
__host__ __device__ __forceinline__ int packed_row_shift(int len_q, int len_k, int rows) {
  const int off = len_k - len_q;
  return off >= 0 ? off / rows : -((-off + rows - 1) / rows);
}

}  // namespace flashlab::cuda::detail
