// A strict JSON reader (stream_json.hpp): recursive descent over the text, with line:col in
// every error, a depth limit (so a hostile manifest cannot exhaust the stack) and numbers kept
// as text (so 64-bit counts read back exactly).
#include "flashlab/reference/stream_json.hpp"

#include <charconv>
#include <cmath>
#include <cstdlib>

namespace flashlab::ref::json {

namespace {
constexpr int kMaxDepth = 64;

const char* kind_name(Value::Kind k) {
  switch (k) {
    case Value::Kind::null: return "null";
    case Value::Kind::boolean: return "a boolean";
    case Value::Kind::number: return "a number";
    case Value::Kind::string: return "a string";
    case Value::Kind::array: return "an array";
    case Value::Kind::object: return "an object";
  }
  return "?";
}

[[noreturn]] void wrong_kind(Value::Kind got, const char* want) {
  throw JsonError(std::string("expected ") + want + ", found " + kind_name(got));
}

void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}
}  // namespace

class Parser {
 public:
  Parser(std::string_view text, const std::string& name) : s_(text), name_(name) {}

  Value document() {
    skip_ws();
    Value v = value(0);
    skip_ws();
    if (i_ != s_.size()) fail("unexpected text after the document");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    std::size_t line = 1, col = 1;
    for (std::size_t j = 0; j < i_ && j < s_.size(); ++j) {
      if (s_[j] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    throw JsonError(name_ + ":" + std::to_string(line) + ":" + std::to_string(col) + ": " + what);
  }

  void skip_ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }

  bool literal(std::string_view word) {
    if (s_.substr(i_, word.size()) != word) return false;
    i_ += word.size();
    return true;
  }

  Value value(int depth) {
    if (depth >= kMaxDepth) fail("nesting deeper than 64 levels");
    if (i_ >= s_.size()) fail("unexpected end of the document, expected a value");
    Value v;
    const char c = s_[i_];
    if (c == '{') {
      v.kind_ = Value::Kind::object;
      ++i_;
      skip_ws();
      if (i_ < s_.size() && s_[i_] == '}') {
        ++i_;
        return v;
      }
      for (;;) {
        skip_ws();
        if (i_ >= s_.size() || s_[i_] != '"') fail("expected a member name in double quotes");
        std::string key = string_body();
        for (const auto& k : v.names_)
          if (k == key) fail("duplicate member \"" + key + "\"");
        skip_ws();
        if (i_ >= s_.size() || s_[i_] != ':') fail("expected ':' after the member name");
        ++i_;
        skip_ws();
        v.names_.push_back(std::move(key));
        v.items_.push_back(value(depth + 1));
        skip_ws();
        if (i_ < s_.size() && s_[i_] == ',') {
          ++i_;
          continue;
        }
        if (i_ < s_.size() && s_[i_] == '}') {
          ++i_;
          return v;
        }
        fail("expected ',' or '}' in an object");
      }
    }
    if (c == '[') {
      v.kind_ = Value::Kind::array;
      ++i_;
      skip_ws();
      if (i_ < s_.size() && s_[i_] == ']') {
        ++i_;
        return v;
      }
      for (;;) {
        skip_ws();
        v.items_.push_back(value(depth + 1));
        skip_ws();
        if (i_ < s_.size() && s_[i_] == ',') {
          ++i_;
          continue;
        }
        if (i_ < s_.size() && s_[i_] == ']') {
          ++i_;
          return v;
        }
        fail("expected ',' or ']' in an array");
      }
    }
    if (c == '"') {
      v.kind_ = Value::Kind::string;
      v.text_ = string_body();
      return v;
    }
    if (literal("true")) {
      v.kind_ = Value::Kind::boolean;
      v.bool_ = true;
      return v;
    }
    if (literal("false")) {
      v.kind_ = Value::Kind::boolean;
      return v;
    }
    if (literal("null")) return v;
    if (c == '-' || (c >= '0' && c <= '9')) {
      v.kind_ = Value::Kind::number;
      v.text_ = number();
      return v;
    }
    fail(std::string("unexpected character '") + c + "'");
  }

  std::string number() {
    const std::size_t start = i_;
    auto digits = [&] {
      const std::size_t from = i_;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
      return i_ - from;
    };
    if (s_[i_] == '-') ++i_;
    if (i_ < s_.size() && s_[i_] == '0') {
      ++i_;
    } else if (digits() == 0) {
      fail("a number needs digits");
    }
    if (i_ < s_.size() && s_[i_] == '.') {
      ++i_;
      if (digits() == 0) fail("a number needs digits after '.'");
    }
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      if (digits() == 0) fail("a number needs digits in its exponent");
    }
    return std::string(s_.substr(start, i_ - start));
  }

  std::uint32_t hex4() {
    if (i_ + 4 > s_.size()) fail("a \\u escape needs four hex digits");
    std::uint32_t cp = 0;
    for (int n = 0; n < 4; ++n) {
      const char h = s_[i_++];
      cp <<= 4;
      if (h >= '0' && h <= '9') cp |= std::uint32_t(h - '0');
      else if (h >= 'a' && h <= 'f') cp |= std::uint32_t(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') cp |= std::uint32_t(h - 'A' + 10);
      else fail("a \\u escape needs four hex digits");
    }
    return cp;
  }

  std::string string_body() {
    ++i_;  // the opening quote
    std::string out;
    for (;;) {
      if (i_ >= s_.size()) fail("unterminated string");
      const char c = s_[i_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("a control character inside a string (escape it)");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= s_.size()) fail("unterminated escape");
      const char e = s_[i_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          std::uint32_t cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00) {  // a surrogate pair encodes one code point above U+FFFF
            if (!literal("\\u")) fail("a high surrogate must be followed by a \\u low surrogate");
            const std::uint32_t lo = hex4();
            if (lo < 0xDC00 || lo >= 0xE000) fail("a high surrogate must be followed by a low surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp < 0xE000) {
            fail("a lone low surrogate");
          }
          append_utf8(out, cp);
          break;
        }
        default: fail(std::string("unknown escape '\\") + e + "'");
      }
    }
  }

  std::string_view s_;
  const std::string& name_;
  std::size_t i_ = 0;
};

bool Value::as_bool() const {
  if (kind_ != Kind::boolean) wrong_kind(kind_, "a boolean");
  return bool_;
}

double Value::as_double() const {
  if (kind_ != Kind::number) wrong_kind(kind_, "a number");
  return std::strtod(text_.c_str(), nullptr);
}

std::uint64_t Value::as_uint() const {
  if (kind_ != Kind::number) wrong_kind(kind_, "a number");
  std::uint64_t v = 0;
  const auto res = std::from_chars(text_.data(), text_.data() + text_.size(), v);
  if (res.ec != std::errc() || res.ptr != text_.data() + text_.size())
    throw JsonError("expected a non-negative integer below 2^64, found " + text_);
  return v;
}

std::int64_t Value::as_int() const {
  if (kind_ != Kind::number) wrong_kind(kind_, "a number");
  std::int64_t v = 0;
  const auto res = std::from_chars(text_.data(), text_.data() + text_.size(), v);
  if (res.ec != std::errc() || res.ptr != text_.data() + text_.size())
    throw JsonError("expected an integer of 64 bits, found " + text_);
  return v;
}

const std::string& Value::as_string() const {
  if (kind_ != Kind::string) wrong_kind(kind_, "a string");
  return text_;
}

const std::vector<Value>& Value::as_array() const {
  if (kind_ != Kind::array) wrong_kind(kind_, "an array");
  return items_;
}

const Value* Value::find(std::string_view key) const {
  if (kind_ != Kind::object) wrong_kind(kind_, "an object");
  for (std::size_t i = 0; i < names_.size(); ++i)
    if (names_[i] == key) return &items_[i];
  return nullptr;
}

const Value& Value::at(std::string_view key) const {
  const Value* v = find(key);
  if (!v) throw JsonError("missing member \"" + std::string(key) + "\"");
  return *v;
}

const std::vector<std::string>& Value::keys() const {
  if (kind_ != Kind::object) wrong_kind(kind_, "an object");
  return names_;
}

Value parse(std::string_view text, const std::string& name, std::size_t max_bytes) {
  if (text.size() > max_bytes)
    throw JsonError(name + ": " + std::to_string(text.size()) + " bytes, more than the " + std::to_string(max_bytes) +
                    " this reader accepts");
  return Parser(text, name).document();
}

}  // namespace flashlab::ref::json
