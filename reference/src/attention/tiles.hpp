// Internal helpers shared by the attention tile loops (not a public header).
//
// Everything here works on whole tiles with Eigen block operations; the only per-element
// loops touch the boundary tiles (causal diagonal, ragged tail), never the interior.
#pragma once

#include "flashlab/reference/attention.hpp"

#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>

namespace flashlab::ref::detail {

inline constexpr double kLog2e = 1.4426950408889634073599246810018921;
inline constexpr double kLn2 = 0.69314718055994530941723212145817657;

template <typename T>
constexpr T neg_inf() {
  return -std::numeric_limits<T>::infinity();
}

/// "[B, N, H, d]" (an ostream twin of Shape::str, which trips GCC 12's -Wrestrict false positive).
inline std::string shape_text(const Shape& s) {
  std::ostringstream o;
  o << "[" << s.batch << ", " << s.seq << ", " << s.heads << ", " << s.head_dim << "]";
  return o.str();
}

/// Checks that a tensor has the shape the configuration expects; names the operand otherwise.
inline void require_shape(const char* name, const Shape& got, const Shape& want) {
  if (!(got == want))
    throw std::invalid_argument(std::string("attention: ") + name + " has shape " + shape_text(got) +
                                ", expected " + shape_text(want));
}

template <typename T>
void require_stats(const char* name, const std::vector<T>& v, std::size_t want) {
  if (v.size() != want)
    throw std::invalid_argument(std::string("attention: ") + name + " has " + std::to_string(v.size()) +
                                " elements, expected B*H*N_q = " + std::to_string(want));
}

/// Loads rows [start, start + rows) of one head into a zero-padded `pad × d` tile (boundary_check).
template <typename T>
void load_tile(const ConstHeadMap<T>& src, std::size_t start, std::size_t rows, std::size_t pad, Mat<T>& tile) {
  tile.setZero(Eigen::Index(pad), src.cols());
  tile.topRows(Eigen::Index(rows)) = src.middleRows(Eigen::Index(start), Eigen::Index(rows));
}

/// In place: X ← 2^X, with exact zeros where X = −inf (Eigen's vectorised exp clamps −inf to a
/// tiny positive number, which would make a fully masked row's l_i non-zero).
template <typename T>
void exp2_inplace(Mat<T>& X) {
  X = (X.array() == neg_inf<T>()).select(T(0), (X.array() * T(kLn2)).exp());
}
template <typename T>
void exp2_inplace(Vec<T>& x) {
  x = (x.array() == neg_inf<T>()).select(T(0), (x.array() * T(kLn2)).exp());
}

/// Is the causal tile (query rows [row0, row_end), keys from start_n on) entirely masked?
inline bool tile_fully_masked(const AttentionProblem& cfg, std::size_t /*row0*/, std::size_t row_end, std::size_t start_n) {
  // The last row row_end − 1 sees the most keys (masks only cut off to the right).
  if (!cfg.causal) return false;
  const long long last_row = static_cast<long long>(std::min(row_end, cfg.n_q())) - 1;
  return static_cast<long long>(start_n) > last_row + cfg.causal_offset();
}

/// Applies the masks to a score tile S (rows = query positions row0…, cols = key positions start_n…):
/// the KV out-of-sequence mask (columns ≥ `valid_cols`) when `mask_kv`, and the causal mask.
/// Only boundary tiles do any per-element work.
template <typename T>
void apply_masks(const AttentionProblem& cfg, Mat<T>& S, std::size_t row0, std::size_t start_n, std::size_t valid_cols,
                 bool mask_kv) {
  const Eigen::Index cols = S.cols();
  if (mask_kv && Eigen::Index(valid_cols) < cols)
    S.rightCols(cols - Eigen::Index(valid_cols)).setConstant(neg_inf<T>());
  if (!cfg.causal) return;
  const long long off = cfg.causal_offset();
  // Row r sees columns c with start_n + c ≤ row0 + r + off; everything right of that is masked.
  if (static_cast<long long>(start_n + std::size_t(cols)) - 1 <= static_cast<long long>(row0) + off) return;  // tile fully visible
  for (Eigen::Index r = 0; r < S.rows(); ++r) {
    const long long first_masked = static_cast<long long>(row0) + r + off + 1 - static_cast<long long>(start_n);
    if (first_masked >= cols) continue;
    const Eigen::Index from = first_masked < 0 ? 0 : Eigen::Index(first_masked);
    S.row(r).tail(cols - from).setConstant(neg_inf<T>());
  }
}

/// Rounds every element to half precision when `on` (fp16-arithmetic emulation).
template <typename T>
void maybe_half(bool on, Mat<T>& X) {
  if (!on) return;
  X = X.unaryExpr([](T v) { return static_cast<T>(round_to_half(static_cast<double>(v))); });
}
template <typename T>
void maybe_half(bool on, Vec<T>& x) {
  if (!on) return;
  x = x.unaryExpr([](T v) { return static_cast<T>(round_to_half(static_cast<double>(v))); });
}

}  // namespace flashlab::ref::detail
