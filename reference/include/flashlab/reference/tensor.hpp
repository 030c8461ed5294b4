/// @file tensor.hpp
/// @brief Dense tensors in the Triton walkthrough's layout `[BATCH, SEQ, HEAD_NUM, HEAD_DIM]`.
///
/// The Triton walkthrough addresses Q, K, V, O as `[SEQ, HEAD_NUM, HEAD_DIM]` with row stride
/// `HEAD_NUM·HEAD_DIM`: one head is an `N × d` matrix whose rows are `H·d` apart. We keep
/// exactly that layout (plus an optional leading batch) so a `.npy` written here can be fed
/// to the CUDA kernels and to PyTorch unchanged, and expose one head as an Eigen map with an
/// outer stride so the tile loops can use Eigen block operations without copying.
#pragma once

#include <Eigen/Dense>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

namespace flashlab::ref {

/// Row-major dynamic matrix (the natural view of one head: rows are tokens).
template <typename T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
/// Column vector (per-row statistics such as m_i, l_i, LSE, D_i).
template <typename T>
using Vec = Eigen::Matrix<T, Eigen::Dynamic, 1>;
/// A mutable view of one head inside a `[B, N, H, d]` tensor (rows `H·d` apart).
template <typename T>
using HeadMap = Eigen::Map<Mat<T>, Eigen::Unaligned, Eigen::OuterStride<>>;
/// A read-only view of one head.
template <typename T>
using ConstHeadMap = Eigen::Map<const Mat<T>, Eigen::Unaligned, Eigen::OuterStride<>>;

/// Shape of an attention operand: batch, sequence length N, heads H, head dim d.
struct Shape {
  std::size_t batch = 1;     ///< B (1 when the tensor has no batch dimension)
  std::size_t seq = 0;       ///< N, the SEQ of the Triton walkthrough
  std::size_t heads = 1;     ///< H, HEAD_NUM
  std::size_t head_dim = 0;  ///< d, HEAD_DIM

  /// Number of elements `B·N·H·d`.
  [[nodiscard]] std::size_t numel() const { return batch * seq * heads * head_dim; }
  /// Distance in elements between two consecutive tokens of one head (`H·d`).
  [[nodiscard]] std::size_t row_stride() const { return heads * head_dim; }
  /// Shapes are equal when every dimension is.
  friend bool operator==(const Shape&, const Shape&) = default;
  /// "[B, N, H, d]" for messages.
  [[nodiscard]] std::string str() const;
};

/// Owning dense tensor `[B, N, H, d]`, contiguous, row-major (last index fastest).
template <typename T>
class Tensor {
 public:
  Tensor() = default;
  /// Allocates a zero-filled tensor of the given shape.
  explicit Tensor(Shape shape) : shape_(shape), data_(shape.numel(), T(0)) {}

  /// The shape `[B, N, H, d]`.
  [[nodiscard]] const Shape& shape() const { return shape_; }
  /// Number of elements.
  [[nodiscard]] std::size_t numel() const { return data_.size(); }
  /// Contiguous element storage (row-major, last index fastest).
  [[nodiscard]] T* data() { return data_.data(); }
  /// Contiguous element storage (row-major, last index fastest).
  [[nodiscard]] const T* data() const { return data_.data(); }
  /// The underlying vector.
  [[nodiscard]] std::vector<T>& storage() { return data_; }
  /// The underlying vector.
  [[nodiscard]] const std::vector<T>& storage() const { return data_; }

  /// Element (b, n, h, k).
  T& at(std::size_t b, std::size_t n, std::size_t h, std::size_t k) { return data_[index(b, n, h, k)]; }
  /// Element (b, n, h, k).
  const T& at(std::size_t b, std::size_t n, std::size_t h, std::size_t k) const {
    return data_[index(b, n, h, k)];
  }

  /// One head (b, h) as an `N × d` matrix view with outer stride `H·d` (no copy).
  HeadMap<T> head(std::size_t b, std::size_t h) {
    return HeadMap<T>(data_.data() + index(b, 0, h, 0), Eigen::Index(shape_.seq),
                      Eigen::Index(shape_.head_dim), Eigen::OuterStride<>(Eigen::Index(shape_.row_stride())));
  }
  /// One head (b, h) as a read-only `N × d` matrix view.
  ConstHeadMap<T> head(std::size_t b, std::size_t h) const {
    return ConstHeadMap<T>(data_.data() + index(b, 0, h, 0), Eigen::Index(shape_.seq),
                           Eigen::Index(shape_.head_dim), Eigen::OuterStride<>(Eigen::Index(shape_.row_stride())));
  }

  /// Same values in another scalar type (e.g. float → double for a float64 reference).
  template <typename U>
  [[nodiscard]] Tensor<U> cast() const {
    Tensor<U> out(shape_);
    for (std::size_t i = 0; i < data_.size(); ++i) out.data()[i] = static_cast<U>(data_[i]);
    return out;
  }

  /// Sets every element to `value` (used to poison outputs before a run).
  void fill(T value) { std::fill(data_.begin(), data_.end(), value); }

 private:
  [[nodiscard]] std::size_t index(std::size_t b, std::size_t n, std::size_t h, std::size_t k) const {
    return ((b * shape_.seq + n) * shape_.heads + h) * shape_.head_dim + k;
  }
  Shape shape_{};
  std::vector<T> data_;
};

/// Fills a tensor with seeded standard-normal values (reproducible across platforms).
void fill_normal(Tensor<double>& t, unsigned long long seed, double stddev = 1.0);
/// Fills a tensor with seeded standard-normal values (reproducible across platforms).
void fill_normal(Tensor<float>& t, unsigned long long seed, float stddev = 1.0f);

/// Largest |a − b| / max(|b|, floor) over all elements; NaN anywhere returns +inf, so NaN
/// never passes a tolerance check. `floor` keeps tiny reference values from inflating the ratio.
double max_rel_error(const double* got, const double* ref, std::size_t n, double floor = 1e-6);
/// Same as above, for a float result against a double reference.
double max_rel_error(const float* got, const double* ref, std::size_t n, double floor = 1e-6);

}  // namespace flashlab::ref
