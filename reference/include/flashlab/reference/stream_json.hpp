/// @file stream_json.hpp
/// @brief A small strict JSON reader: the trace store's manifest, token files and the viewer's tests.
///
/// The trace store keeps its metadata in `manifest.json` so that Python reads it with `json.load`;
/// this reader is the C++ side. It accepts RFC 8259 JSON only (no comments, no trailing commas,
/// no NaN), limits nesting depth and document size, and reports errors as `name:line:col: what`.
/// Numbers keep their text, so integers up to 2^64 − 1 read back exactly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace flashlab::ref::json {

/// A malformed document, or a value of the wrong kind; the message names the document and the place.
class JsonError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;  ///< constructs from the message
};

/// One JSON value: null, bool, number (kept as text), string, array or object.
class Value {
 public:
  /// The kind of a value.
  enum class Kind { null, boolean, number, string, array, object };

  Value() = default;  ///< null

  /// The kind of this value.
  [[nodiscard]] Kind kind() const { return kind_; }
  /// True for null.
  [[nodiscard]] bool is_null() const { return kind_ == Kind::null; }
  /// The boolean; JsonError unless a boolean.
  [[nodiscard]] bool as_bool() const;
  /// The number as double; JsonError unless a number.
  [[nodiscard]] double as_double() const;
  /// The number as an unsigned integer; JsonError unless a number with no fraction, exponent or
  /// sign that fits in 64 bits.
  [[nodiscard]] std::uint64_t as_uint() const;
  /// The number as a signed integer; JsonError unless an integer that fits in 64 bits.
  [[nodiscard]] std::int64_t as_int() const;
  /// The string; JsonError unless a string.
  [[nodiscard]] const std::string& as_string() const;
  /// The elements; JsonError unless an array.
  [[nodiscard]] const std::vector<Value>& as_array() const;
  /// The member `key`, or nullptr when absent; JsonError unless an object.
  [[nodiscard]] const Value* find(std::string_view key) const;
  /// The member `key`; JsonError (naming the key) when absent or not an object.
  [[nodiscard]] const Value& at(std::string_view key) const;
  /// Member names in document order; JsonError unless an object.
  [[nodiscard]] const std::vector<std::string>& keys() const;

 private:
  friend class Parser;
  Kind kind_ = Kind::null;
  bool bool_ = false;
  std::string text_;  // number text or string value
  std::vector<Value> items_;        // array elements, or object values in key order
  std::vector<std::string> names_;  // object keys
};

/// Parses a whole document. `name` prefixes every message (a file name, "response of /api/meta").
/// Throws JsonError on anything malformed: the message is `name:line:col: what`. Documents above
/// `max_bytes` and nesting deeper than 64 are refused before any work.
Value parse(std::string_view text, const std::string& name, std::size_t max_bytes = std::size_t(64) << 20);

}  // namespace flashlab::ref::json
