// Internal helpers shared by the attention tile loops (not a public header).
//
// Everything here works on whole tiles with Eigen block operations; the only per-element
// loops touch the boundary tiles (the mask's diagonal band, ragged tail), never the interior.
#pragma once

#include "flashlab/reference/attention.hpp"

#include "band.hpp"

#include <algorithm>
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
                                " elements, expected " + std::to_string(want) +
                                " (B*H*N, packed H*total_q)");
}

/// Rows [start, start + rows) of head h of batch entry b: one sequence of one head as an
/// `rows × d` view (outer stride H·d), for dense tensors (start 0, all rows) and packed ones alike.
template <typename T>
ConstHeadMap<T> rows_of(const Tensor<T>& t, std::size_t b, std::size_t h, std::size_t start, std::size_t rows) {
  const Shape& s = t.shape();
  // An empty sequence at the tensor's end would point past it: map nothing at the start instead.
  const std::size_t at = rows == 0 ? 0 : ((b * s.seq + start) * s.heads + h) * s.head_dim;
  return ConstHeadMap<T>(t.data() + at, Eigen::Index(rows),
                         Eigen::Index(s.head_dim), Eigen::OuterStride<>(Eigen::Index(s.row_stride())));
}
template <typename T>
HeadMap<T> rows_of(Tensor<T>& t, std::size_t b, std::size_t h, std::size_t start, std::size_t rows) {
  const Shape& s = t.shape();
  const std::size_t at = rows == 0 ? 0 : ((b * s.seq + start) * s.heads + h) * s.head_dim;
  return HeadMap<T>(t.data() + at, Eigen::Index(rows),
                    Eigen::Index(s.head_dim), Eigen::OuterStride<>(Eigen::Index(s.row_stride())));
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

/// Is the tile pair (valid query rows [row0, row_end), keys [start_n, start_n + rk)) entirely
/// masked? Such pairs are skipped: neither loaded nor computed nor counted.
inline bool tile_fully_masked(const Band& band, std::size_t row0, std::size_t row_end, std::size_t start_n,
                              std::size_t rk) {
  return !band.sees_any(static_cast<long long>(row0), static_cast<long long>(row_end),
                        static_cast<long long>(start_n), static_cast<long long>(rk));
}

/// Applies the masks to a score tile S (rows = query positions row0…, cols = key positions
/// start_n…, both inside one sequence): the KV out-of-sequence mask (columns ≥ `valid_cols`)
/// when `mask_kv`, and the band of the causal mask and the window. Only boundary tiles do any
/// per-element work.
template <typename T>
void apply_masks(const Band& band, Mat<T>& S, std::size_t row0, std::size_t start_n, std::size_t valid_cols,
                 bool mask_kv) {
  const Eigen::Index cols = S.cols();
  if (mask_kv && Eigen::Index(valid_cols) < cols)
    S.rightCols(cols - Eigen::Index(valid_cols)).setConstant(neg_inf<T>());
  const long long r0 = static_cast<long long>(row0), n0 = static_cast<long long>(start_n);
  if (cols == 0 || band.all_visible(r0, S.rows(), n0, cols)) return;
  // Row r sees columns c with lo(row0 + r) ≤ start_n + c ≤ hi(row0 + r); the rest is masked.
  for (Eigen::Index r = 0; r < S.rows(); ++r) {
    const long long from = std::clamp(band.lo(r0 + r) - n0, 0LL, static_cast<long long>(cols));
    const long long to = std::clamp(band.hi(r0 + r) - n0 + 1, from, static_cast<long long>(cols));
    if (from > 0) S.row(r).head(Eigen::Index(from)).setConstant(neg_inf<T>());
    if (to < cols) S.row(r).tail(cols - Eigen::Index(to)).setConstant(neg_inf<T>());
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
