// Internal: how long an expression would print, without printing it. Expressions are shared
// DAGs, so a trace that squares a register 60 times has a tiny tree whose printed form is
// astronomically long; the checker and the stepper ask first and show the number instead.
#pragma once

#include <cstddef>
#include <unordered_map>

#include "flashlab/toymachine/value.hpp"

namespace flashlab::lessons::detail {

/// Nodes of the fully expanded tree of `e`, saturating at `cap` (memoised per shared node).
inline std::size_t expanded_size(const toy::Expr& e, std::size_t cap,
                                 std::unordered_map<const toy::Expr*, std::size_t>& memo) {
  if (auto it = memo.find(&e); it != memo.end()) return it->second;
  std::size_t n = 1;
  for (const auto& a : e.args) {
    if (!a) continue;
    n += expanded_size(*a, cap, memo);
    if (n >= cap) {
      n = cap;
      break;
    }
  }
  memo[&e] = n;
  return n;
}

/// True when `e` prints short enough to show (at most `cap` nodes when expanded).
inline bool printable(const toy::Expr& e, std::size_t cap = 400) {
  std::unordered_map<const toy::Expr*, std::size_t> memo;
  return expanded_size(e, cap + 1, memo) <= cap;
}

}  // namespace flashlab::lessons::detail
