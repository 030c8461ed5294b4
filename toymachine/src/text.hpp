// Internal text helpers shared by the assembler, the machine-file parser and the renderer.
#pragma once

#include <cctype>
#include <cstddef>
#include <cstdio>
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

/// The code point of the UTF-8 sequence at s[p] (U+FFFD for a malformed one).
inline char32_t code_point_at(std::string_view s, std::size_t p) {
  const auto b = [&](std::size_t i) { return i < s.size() ? static_cast<unsigned char>(s[i]) : 0u; };
  const unsigned c = b(p);
  if (c < 0x80) return c;
  if ((c & 0xE0) == 0xC0 && (b(p + 1) & 0xC0) == 0x80) return ((c & 0x1F) << 6) | (b(p + 1) & 0x3F);
  if ((c & 0xF0) == 0xE0 && (b(p + 1) & 0xC0) == 0x80 && (b(p + 2) & 0xC0) == 0x80)
    return ((c & 0x0F) << 12) | ((b(p + 1) & 0x3F) << 6) | (b(p + 2) & 0x3F);
  if ((c & 0xF8) == 0xF0 && (b(p + 1) & 0xC0) == 0x80 && (b(p + 2) & 0xC0) == 0x80 && (b(p + 3) & 0xC0) == 0x80)
    return ((c & 0x07) << 18) | ((b(p + 1) & 0x3F) << 12) | ((b(p + 2) & 0x3F) << 6) | (b(p + 3) & 0x3F);
  return 0xFFFD;
}

/// "U+00A0".
inline std::string code_point_name(char32_t cp) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "U+%04X", static_cast<unsigned>(cp));
  return buf;
}

/// The character at s[p] as a message shows it: "'@'" for a visible one; characters that look
/// like nothing or like something else are named, so a message never says "unexpected ' '":
/// a carriage return (a file with bare-CR line endings), a non-breaking or other unusual space,
/// an invisible format character, a control character (never echoed raw to the terminal).
inline std::string describe_char(std::string_view s, std::size_t p) {
  const char32_t cp = code_point_at(s, p);
  if (cp == U'\r')
    return "carriage return (U+000D): the file has bare-CR line endings; save it with \\n line endings";
  if (cp == 0xA0) return "non-breaking space (U+00A0)";
  if (cp == 0x3000 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x202F || cp == 0x205F || cp == 0x1680)
    return "unusual space (" + code_point_name(cp) + ")";
  if ((cp >= 0x200B && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202E) || (cp >= 0x2060 && cp <= 0x2064) ||
      cp == 0xFEFF)
    return "invisible character (" + code_point_name(cp) + ")";
  if (cp < 0x20 || cp == 0x7F || (cp >= 0x80 && cp <= 0x9F)) return "control character (" + code_point_name(cp) + ")";
  if (cp == 0xFFFD) return "byte that is not UTF-8";
  std::string quoted(1, '\'');  // built by appending: GCC 12 warns falsely on "'" + string (bug 105329)
  quoted += char_at(s, p);
  quoted += '\'';
  return quoted;
}

/// `s` with every control character (C0 except tab, DEL, C1) shown as a visible picture of one
/// column (U+2400 + c for C0, U+2421 for DEL, U+FFFD for C1), so echoing user text can neither
/// move the cursor nor change the terminal's colours, and carets below it still line up.
inline std::string visible(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 && c != '\t') {
      const char32_t pic = 0x2400 + c;  // 3-byte UTF-8
      out += static_cast<char>(0xE0 | (pic >> 12));
      out += static_cast<char>(0x80 | ((pic >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (pic & 0x3F));
    } else if (c == 0x7F) {
      out += "\xE2\x90\xA1";
    } else if (c == 0xC2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) >= 0x80 &&
               static_cast<unsigned char>(s[i + 1]) <= 0x9F) {
      out += "\xEF\xBF\xBD";  // a C1 control (e.g. CSI) is two bytes, one column
      ++i;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
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
