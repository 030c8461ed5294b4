/// @file npy.hpp
/// @brief Reading and writing NumPy `.npy` files (format versions 1.0–3.0, C order).
///
/// `.npy` is the field's interchange format: every tensor the CLI reads or saves uses it, so
/// inputs can come from PyTorch/NumPy and results can be checked there. Supported element
/// types: `<f4`, `<f8`, `<i4`, `<i8`, `|u1`, `|b1` (little-endian only; Fortran order is
/// refused with a clear error rather than silently transposed).
///
/// The reader trusts nothing in a file: the header is parsed as the Python literal it is (every
/// key, dtype, byte order, Fortran flag and version checked and named when unsupported), the
/// element count and byte size are multiplied with overflow checks, the declared payload is
/// compared with the bytes the file holds, and the memory limit (memory_budget.hpp) is checked —
/// all before the payload is allocated.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace flashlab::ref {

/// Error reading or writing a `.npy` file; the message names the file and the problem.
class NpyError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;  ///< constructs from the message
};

/// What a `.npy` header declares, validated: supported dtype, C order, sizes that fit 64 bits.
struct NpyHeader {
  std::vector<std::size_t> shape;  ///< dimensions, outermost first
  std::string descr;               ///< NumPy dtype string, normalised to "<f4", "<f8", "<i4", "<i8", "|u1", "|b1"
  std::size_t item_size = 0;       ///< bytes per element
  std::size_t data_offset = 0;     ///< bytes before the payload (magic, version, length, dict)
  std::uint64_t numel = 0;         ///< product of the shape (1 for a 0-d array)
  std::uint64_t nbytes = 0;        ///< payload bytes the header declares, numel · item_size
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

/// Parses and validates the header at the start of `bytes` (a whole file or its first bytes);
/// `name` prefixes every message. Throws NpyError on anything malformed or unsupported.
NpyHeader parse_npy_header(std::string_view bytes, const std::string& name);

/// Reads and validates the header of a `.npy` file and checks that the file holds exactly the
/// payload it declares; reads no payload (commands size a whole run from headers first).
NpyHeader read_npy_header(const std::filesystem::path& path);

/// Reads a `.npy` file whose payload is at most `max_bytes`. Throws NpyError naming the file on
/// any malformed or unsupported input, and on a payload above the limit (shape, bytes, limit).
NpyArray read_npy(const std::filesystem::path& path, std::uint64_t max_bytes);
/// Reads a `.npy` file under the limit of memory_limit_from_env().
NpyArray read_npy(const std::filesystem::path& path);

/// The same checks on a file already in memory (`bytes` is the whole file; `name` for messages).
NpyArray parse_npy(std::string_view bytes, const std::string& name, std::uint64_t max_bytes);

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
