// bwd_band.cuh — which tiles of a backward meet the band of the mask, and which key tile a block of
// a packed launch owns (internal, device code; the mma backwards attention_bwd_tc.cu and
// attention_bwd_tc_atomic.cu share it).
//
// The band (Problem::window_lo(), window_hi()): query i sees key j iff 0 ≤ j < N_k and
// lo ≤ j − i ≤ hi, with causal and the bottom-right offset N_k − N folded in and an unbounded side
// at ∓2^30 (past every key; |N_k − N| and the capped sides stay below 2^26, so no sum here overflows).
// A key block loops over the query tiles of its band, a query block over the key tiles of its band.
#pragma once

#include "attention/packed.cuh"
#include "core/common.hpp"

#include <cstddef>

namespace flashlab::cuda::detail {

/// A range of tiles [begin, end) (empty when begin == end).
struct TileRange {
  int begin, end;
};

/// The band seen from keys start_n … key_last: the query tiles of `rows` rows, among the N queries,
/// that some of those keys are visible to (queries key − hi … key − lo, clamped). Empty when no
/// query sees them (N_k ≠ N or a window: the block then runs no step and writes dK_j = dV_j = 0).
__device__ __forceinline__ TileRange band_query_tiles(int start_n, int key_last, int N, int lo, int hi, int rows) {
  const int q_first = max(0, start_n - hi), q_last = min(N - 1, key_last - lo);
  const int begin = q_first / rows;
  return {begin, q_last < q_first ? begin : q_last / rows + 1};
}

/// The band seen from queries row0 … row_last: the key tiles of `cols` keys, among the N_k keys,
/// that some of those queries see (the rows' bands shift by one key per row, so their union is one
/// interval: the first row's left edge to the last row's right edge). Empty ({0, 0}) when the rows
/// see no key (causal with N > N_k, a band past every key: the block then writes dQ_i = 0).
__device__ __forceinline__ TileRange band_key_tiles(int row0, int row_last, int Nk, int lo, int hi, int cols) {
  const int first = max(0, row0 + lo), last = min(Nk - 1, row_last + hi);
  return last < first ? TileRange{0, 0} : TileRange{first / cols, last / cols + 1};
}

/// Whether query `row` sees key `key` (both inside their sequences' bounds N, N_k).
__device__ __forceinline__ bool band_visible(int row, int key, int N, int Nk, int lo, int hi) {
  return row < N && key < Nk && key - row >= lo && key - row <= hi;
}

/// Where query head hq's rows start: in Q, O, dO, dQ ([B, N, H, d]) and in LSE, D ([B, H, N]) of
/// batch entry b, or, packed ([1, total_q, H, d], [1, H, total_q]), at the sequence's first query
/// q_start.
__device__ __forceinline__ std::size_t query_rows(const Problem& p, bool packed, int b, int q_start, int hq) {
  return packed ? std::size_t(q_start) * p.row_stride() + std::size_t(hq) * p.head_dim : p.head_offset(b, hq);
}
__device__ __forceinline__ std::size_t query_stats(const Problem& p, bool packed, int b, int q_start, int hq) {
  return packed ? std::size_t(hq) * std::size_t(p.total_q) + std::size_t(q_start) : p.stat_offset(b, hq);
}

/// Where K/V head hk's rows start in K, V, dK, dV ([B, N_k, H_kv, d] at batch entry b; packed
/// [1, total_k, H_kv, d] at the sequence's first key k_start).
__device__ __forceinline__ std::size_t key_rows(const Problem& p, bool packed, int b, int k_start, int hk) {
  return packed ? std::size_t(k_start) * p.kv_row_stride() + std::size_t(hk) * p.head_dim : p.kv_head_offset(b, hk);
}

/// Key tile `u` of a packed launch whose blocks own key tiles (packed.cuh's numbering over the
/// keys' prefix sums, ⌊total_k / rows⌋ + B tiles): packed_tile() with the lists swapped, the
/// fields then named for what they hold (`row0` the tile's first KEY row inside its sequence).
__device__ __forceinline__ PackedTile packed_key_tile(const Problem& p, const PackedLists& lists, int u, int rows) {
  PackedTile t = packed_tile(lists.cu_seqlens_k, lists.cu_seqlens_q, p.batch, u, rows);
  const int k_start = t.q_start, len_k = t.len_q;  // the search ran over the keys' sums
  t.q_start = t.k_start;
  t.len_q = t.len_k;
  t.k_start = k_start;
  t.len_k = len_k;
  return t;
}

}  // namespace flashlab::cuda::detail
