// Internal text helpers shared by the assembler, the machine-file parser and the renderer.
#pragma once

#include <cctype>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace flashlab::toy::text {

inline bool is_ident_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
inline bool is_ident_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
inline bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r'; }

inline std::string upper(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

inline bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::toupper(static_cast<unsigned char>(a[i])) != std::toupper(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

/// Code points in s[0, bytes): byte offsets → character columns for carets.
inline int chars_before(std::string_view s, std::size_t bytes) {
  int n = 0;
  for (std::size_t i = 0; i < bytes && i < s.size(); ++i)
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) ++n;
  return n;
}

/// The whole UTF-8 character starting at byte p (so messages never print half a character).
inline std::string char_at(std::string_view s, std::size_t p) {
  std::size_t q = p + 1;
  while (q < s.size() && (static_cast<unsigned char>(s[q]) & 0xC0) == 0x80) ++q;
  return std::string(s.substr(p, q - p));
}

/// Splits text into lines (without the newline; a trailing newline gives no extra line).
/// A leading UTF-8 byte-order mark is dropped.
inline std::vector<std::string> split_lines(std::string_view textv) {
  std::vector<std::string> lines;
  std::size_t start = textv.substr(0, 3) == "\xEF\xBB\xBF" ? 3 : 0;
  while (start < textv.size()) {
    std::size_t nl = textv.find('\n', start);
    if (nl == std::string_view::npos) nl = textv.size();
    std::string line(textv.substr(start, nl - start));
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::move(line));
    start = nl + 1;
  }
  return lines;
}

/// Byte offset where a `#` comment starts, or the line's size.
inline std::size_t comment_start(std::string_view line) {
  std::size_t p = line.find('#');
  return p == std::string_view::npos ? line.size() : p;
}

}  // namespace flashlab::toy::text

namespace flashlab::toy::text {

/// "[" + i + "]" built by appending: GCC 12 gives a false -Wrestrict on `"[" + std::to_string(i)`
/// (GCC bug 105329), so the bracket helpers avoid that pattern.
inline std::string bracket(long long i) {
  std::string s(1, '[');
  s += std::to_string(i);
  s += ']';
  return s;
}

/// prefix + number, by appending (same GCC 12 false positive).
inline std::string join(std::string prefix, long long i) {
  prefix += std::to_string(i);
  return prefix;
}

}  // namespace flashlab::toy::text
