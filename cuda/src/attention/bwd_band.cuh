// bwd_band.cuh — which tiles of a backward meet the band of the mask (internal, device code; the
// mma backwards attention_bwd_tc.cu and attention_bwd_tc_atomic.cu share it).
//
// The band (Problem::window_lo(), window_hi()): query i sees key j iff 0 ≤ j < N_k and
// lo ≤ j − i ≤ hi, with causal and the bottom-right offset N_k − N folded in and an unbounded side
// at ∓2^30 (past every key; |N_k − N| and the capped sides stay below 2^26, so no sum here overflows).
// A key block loops over the query tiles of its band, a query block over the key tiles of its band.
#pragma once

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

}  // namespace flashlab::cuda::detail
