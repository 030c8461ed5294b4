/// @file npy.hpp
/// @brief Reading and writing NumPy `.npy` files (format versions 1.0–3.0, C order).
///
/// `.npy` is the field's interchange format: every tensor the CLI reads or saves uses it, so
/// inputs can come from PyTorch/NumPy and results can be checked there. Supported element
/// types: `<f4`, `<f8`, `<i4`, `<i8`, `|u1`, `|b1` (little-endian only; Fortran order is
/// refused with a clear error rather than silently transposed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace flashlab::ref {

/// Error reading or writing a `.npy` file; the message names the file and the problem.
class NpyError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;  ///< constructs from the message
};

/// A raw array as stored in a `.npy` file.
struct NpyArray {
  std::vector<std::size_t> shape;    ///< dimensions, outermost first
  std::string descr;               ///< NumPy dtype string, e.g. "<f4"
  std::vector<unsigned char> bytes;  ///< raw little-endian element bytes, C order

  /// Number of elements (product of the shape; 1 for a 0-d array).
  [[nodiscard]] std::size_t numel() const;
  /// The elements converted to double (any supported dtype).
  [[nodiscard]] std::vector<double> as_double() const;
  /// The elements converted to int64 (integer and bool dtypes only).
  [[nodiscard]] std::vector<std::int64_t> as_int64() const;
};

/// Reads a `.npy` file. Throws NpyError naming the file on any malformed or unsupported input.
NpyArray read_npy(const std::filesystem::path& path);

/// Writes float64 data with the given shape.
void write_npy(const std::filesystem::path& path, const std::vector<std::size_t>& shape, const double* data);
/// Writes float32 data with the given shape.
void write_npy(const std::filesystem::path& path, const std::vector<std::size_t>& shape, const float* data);
/// Writes int64 data with the given shape.
void write_npy(const std::filesystem::path& path, const std::vector<std::size_t>& shape, const std::int64_t* data);
/// Writes int32 data with the given shape.
void write_npy(const std::filesystem::path& path, const std::vector<std::size_t>& shape, const std::int32_t* data);
/// Writes raw bytes with an explicit NumPy descr (e.g. a structured dtype for edge records).
void write_npy_raw(const std::filesystem::path& path, const std::vector<std::size_t>& shape,
                   const std::string& descr, const void* data, std::size_t nbytes);

/// Shape as "(a, b, c)" for error messages.
std::string shape_str(const std::vector<std::size_t>& shape);

}  // namespace flashlab::ref
