// The mask of one sequence as a diagonal band (not a public header): query i sees the keys
// lo(i) ≤ j ≤ hi(i) before the clamp to 0 ≤ j < len_k, with lo(i) = i + lo_off and
// hi(i) = i + hi_off where a side is bounded. attention_problem.hpp states the rule; this is its
// one implementation, used by visible_keys(), the tile loops' masks and skips, and the traffic
// formulas.
#pragma once

#include "flashlab/reference/attention_problem.hpp"

#include <algorithm>

namespace flashlab::ref::detail {

struct Band {
  bool lo_bounded = false;  // window_left ≥ 0
  bool hi_bounded = false;  // causal or window_right ≥ 0
  long long lo_off = 0;     // offset − window_left
  long long hi_off = 0;     // offset + (causal ? min(window_right, 0) : window_right)
  long long len_k = 0;

  Band(const AttentionProblem& cfg, const SequenceSpan& s) : len_k(static_cast<long long>(s.k_len)) {
    const long long off = s.offset();
    lo_bounded = cfg.window_left >= 0;
    lo_off = off - cfg.window_left;
    hi_bounded = cfg.causal || cfg.window_right >= 0;
    long long right = cfg.window_right;
    if (cfg.causal) right = right >= 0 ? std::min(right, 0LL) : 0;
    hi_off = off + right;
  }
  // The first key row i may see and the last, unclamped; an unbounded side is ∓2^62 (every
  // position a tensor can have, padded keys included).
  static constexpr long long kUnbounded = 1LL << 62;
  [[nodiscard]] long long lo(long long i) const { return lo_bounded ? i + lo_off : -kUnbounded; }
  [[nodiscard]] long long hi(long long i) const { return hi_bounded ? i + hi_off : kUnbounded; }
  // The visible keys of row i, clamped to the sequence's keys.
  [[nodiscard]] KeyRange keys(long long i) const {
    const long long first = std::clamp(lo(i), 0LL, len_k);
    const long long end = std::clamp(hi(i) + 1, 0LL, len_k);
    return {first, std::max(first, end)};
  }
  // Do the valid rows [row0, row_end) see any key of [start_n, start_n + rk)? The rows' bands
  // shift by one key per row and are never narrower than one key, so their union is the one
  // interval [lo(row0), hi(row_end − 1)]: a tile pair is visible iff it meets that interval.
  [[nodiscard]] bool sees_any(long long row0, long long row_end, long long start_n, long long rk) const {
    if (row_end <= row0 || rk <= 0) return false;
    const long long first = std::max(lo(row0), start_n);
    const long long last = std::min(hi(row_end - 1), start_n + rk - 1);
    return first <= last;
  }
  // Is every (row, key) of the tile pair visible (no per-element mask needed)? `rows`, `cols`
  // include padding: padded rows and keys are treated by the same band.
  [[nodiscard]] bool all_visible(long long row0, long long rows, long long start_n, long long cols) const {
    return lo(row0 + rows - 1) <= start_n && start_n + cols - 1 <= hi(row0);
  }
};

}  // namespace flashlab::ref::detail
