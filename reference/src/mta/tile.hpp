// Tile helpers shared by the flash MTA paths (private to reference/src/mta). The naive path does
// not use them on purpose: it follows the definition with scalar loops so that a mistake here
// cannot hide in both sides of the comparison.
#pragma once

#include "flashlab/reference/mta.hpp"
#include "flashlab/reference/traffic.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string_view>

namespace flashlab::ref::mta::detail {

using Index = Eigen::Index;

/// Number of indices of [start, start + len) that lie inside [0, n).
inline std::uint64_t clipped(long long start, long long len, long long n) {
  const long long lo = std::max(start, 0LL), hi = std::min(start + len, n);
  return hi > lo ? std::uint64_t(hi - lo) : 0;
}

/// "Load X[start : start + rows] from HBM to SRAM (handle boundary indices)": rows outside
/// [0, N) are the zero padding of the convolution, made on chip, so they are not counted.
template <typename T, typename Map>
Mat<T> load_rows(const Map& x, long long start, long long rows, Traffic* tr, std::string_view name) {
  const long long n = x.rows();
  Mat<T> tile = Mat<T>::Zero(rows, x.cols());
  const long long lo = std::max(start, 0LL), hi = std::min(start + rows, n);
  if (hi > lo) tile.middleRows(lo - start, hi - lo) = x.middleRows(lo, hi - lo);
  if (tr) tr->read(name, clipped(start, rows, n) * std::uint64_t(x.cols()));
  return tile;
}

/// Writes tile rows [first, first + rows) back to X[start + first …], skipping rows past [0, N).
template <typename T, typename Map>
void store_rows(Map& x, const Mat<T>& tile, long long start, long long first, long long rows, Traffic* tr,
                std::string_view name) {
  const long long n = x.rows();
  const long long lo = std::max(start + first, 0LL), hi = std::min(start + first + rows, n);
  if (hi > lo) x.middleRows(lo, hi - lo) = tile.middleRows(lo - start, hi - lo);
  if (tr) tr->write(name, clipped(start + first, rows, n) * std::uint64_t(x.cols()));
}

/// On-chip Conv2D of a score tile (cross-correlation, zero padding outside the tile):
/// out[r, c] = Σ_a Σ_b W[a, b] · S[r + a − Pq, c + b − Pk]. Each (a, b) is one shifted block
/// update, so the tile math stays in Eigen block operations.
template <typename T>
Mat<T> conv(const Mat<T>& s, const Mat<T>& w) {
  const Index rows = s.rows(), cols = s.cols(), pq = w.rows() - 1, pk = (w.cols() - 1) / 2;
  Mat<T> out = Mat<T>::Zero(rows, cols);
  for (Index a = 0; a <= pq; ++a) {
    const Index r0 = std::max<Index>(0, pq - a), nr = rows - r0;  // out rows whose source row ≥ 0
    if (nr <= 0) continue;
    for (Index b = 0; b < w.cols(); ++b) {
      const Index c0 = std::max<Index>(0, pk - b), c1 = std::min<Index>(cols, cols + pk - b);
      if (c1 <= c0) continue;
      out.block(r0, c0, nr, c1 - c0) += w(a, b) * s.block(r0 + a - pq, c0 + b - pk, nr, c1 - c0);
    }
  }
  return out;
}

/// The adjoint of `conv` ("TransposedConv2D" of the MTA kernels): scatters each output gradient back
/// to the scores it read, dS[r + a − Pq, c + b − Pk] += W[a, b] · dŜ[r, c] — the same blocks as
/// `conv` with source and destination swapped.
template <typename T>
Mat<T> conv_transpose(const Mat<T>& ds_hat, const Mat<T>& w) {
  const Index rows = ds_hat.rows(), cols = ds_hat.cols(), pq = w.rows() - 1, pk = (w.cols() - 1) / 2;
  Mat<T> out = Mat<T>::Zero(rows, cols);
  for (Index a = 0; a <= pq; ++a) {
    const Index r0 = std::max<Index>(0, pq - a), nr = rows - r0;
    if (nr <= 0) continue;
    for (Index b = 0; b < w.cols(); ++b) {
      const Index c0 = std::max<Index>(0, pk - b), c1 = std::min<Index>(cols, cols + pk - b);
      if (c1 <= c0) continue;
      out.block(r0 + a - pq, c0 + b - pk, nr, c1 - c0) += w(a, b) * ds_hat.block(r0, c0, nr, c1 - c0);
    }
  }
  return out;
}

/// "GradW(S_ij, dS^conv)": dW[a, b] = Σ_{r,c} dŜ[r, c] · S[r + a − Pq, c + b − Pk] over the tile.
template <typename T>
Mat<T> grad_w(const Mat<T>& s, const Mat<T>& ds_hat, Index cq, Index ck) {
  const Index rows = s.rows(), cols = s.cols(), pq = cq - 1, pk = (ck - 1) / 2;
  Mat<T> dw = Mat<T>::Zero(cq, ck);
  for (Index a = 0; a <= pq; ++a) {
    const Index r0 = std::max<Index>(0, pq - a), nr = rows - r0;
    if (nr <= 0) continue;
    for (Index b = 0; b < ck; ++b) {
      const Index c0 = std::max<Index>(0, pk - b), c1 = std::min<Index>(cols, cols + pk - b);
      if (c1 <= c0) continue;
      dw(a, b) = (ds_hat.block(r0, c0, nr, c1 - c0).array() *
                  s.block(r0 + a - pq, c0 + b - pk, nr, c1 - c0).array())
                     .sum();
    }
  }
  return dw;
}

/// Zeroes S[r, c] where the key is in the future of the query (global c > global r): the
/// causal zeroing that happens *before* the convolution.
template <typename T>
void causal_zero(Mat<T>& s, long long row0, long long col0) {
  for (Index r = 0; r < s.rows(); ++r) {
    // keys with global index > row0 + r are future: local c > row0 + r − col0
    const long long first_future = row0 + r - col0 + 1;
    if (first_future < s.cols()) {
      const Index c = Index(std::max(first_future, 0LL));
      s.row(r).tail(s.cols() - c).setZero();
    }
  }
}

/// −∞ in the scalar type.
template <typename T>
constexpr T neg_inf() {
  return -std::numeric_limits<T>::infinity();
}

}  // namespace flashlab::ref::mta::detail
