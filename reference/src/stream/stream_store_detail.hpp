// Private to the trace store (stream_store_*.cpp): the manifest, the column files and their
// headers, shared by the writer and the reader so both read and write one format.
#pragma once

#include "flashlab/reference/stream_store.hpp"

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace flashlab::ref::stream::detail {

/// What manifest.json says.
struct Manifest {
  StoreLayout layout;
  std::size_t segments = 0;    ///< committed segments
  std::uint64_t records = 0;   ///< committed records
  std::uint64_t checksum = kFnvOffset;
  bool complete = false;
};

/// What a column's length counts.
enum class Counts { records, row_pointers, reverse_pointers, segments };

/// One column file of the store.
struct Column {
  const char* file;   ///< file name in the store directory
  const char* descr;  ///< NumPy dtype
  std::size_t item;   ///< bytes per element
  Counts counts;      ///< what its length is
};

/// The column files of a layout, in the order they are written.
std::vector<Column> columns(const StoreLayout& layout);

/// The element count a column has when `segments` heads with `records` records are committed.
std::uint64_t column_length(const Column& c, const StoreLayout& layout, std::size_t segments, std::uint64_t records);

/// The 128-byte `.npy` v1.0 header of a 1-D column of `length` elements.
std::string column_header(const char* descr, std::uint64_t length);

/// Reads and validates manifest.json of `dir` (fields, types, limits, internal consistency).
Manifest read_manifest(const std::filesystem::path& dir);

/// Writes manifest.json of `dir` atomically (a temporary file renamed over it).
void write_manifest(const std::filesystem::path& dir, const Manifest& m);

/// The last causally valid key block of query block q: ⌊min(T − 1, (q+1)·b_q − 1) / b_k⌋.
inline std::size_t causal_last_block(const Geometry& g, std::size_t q) {
  const std::size_t last_token = std::min(g.T - 1, (q + 1) * g.bq - 1);
  return last_token / g.bk;
}

/// "0x" and 16 hex digits.
std::string hex64(std::uint64_t v);

}  // namespace flashlab::ref::stream::detail
