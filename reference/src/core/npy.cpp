#include "flashlab/reference/npy.hpp"
#include "flashlab/reference/input_file.hpp"

#include "flashlab/reference/memory_budget.hpp"

#include <algorithm>
#include <bit>
#include <cctype>
#include <charconv>
#include <cstring>
#include <fstream>
#include <sstream>

namespace flashlab::ref {

static_assert(std::endian::native == std::endian::little, "flashlab's .npy I/O assumes a little-endian host");

namespace {

constexpr char kMagic[] = "\x93NUMPY";

[[noreturn]] void fail(const std::string& name, const std::string& what) {
  throw NpyError(name + ": " + what);
}
[[noreturn]] void fail(const std::filesystem::path& path, const std::string& what) { fail(path.string(), what); }

constexpr std::size_t kMaxHeaderBytes = std::size_t{1} << 20;  // NumPy itself writes < 64 KiB
constexpr std::size_t kMaxRank = 32;                             // NumPy's own limit is 64

std::size_t item_size(const std::string& descr) {
  if (descr == "<f4" || descr == "<i4") return 4;
  if (descr == "<f8" || descr == "<i8") return 8;
  if (descr == "|u1" || descr == "|b1") return 1;
  return 0;
}

// '=' (native) is little-endian here, and one-byte types carry no byte order at all.
std::string normalise_descr(std::string d) {
  if (d.size() >= 2 && d[0] == '=') d[0] = '<';
  if (d == "<u1" || d == "<b1" || d == "=u1" || d == "=b1") d[0] = '|';
  return d;
}

void check_descr(const std::string& descr, const std::string& name) {
  if (item_size(descr) != 0) return;
  // Built with a stream: GCC 12 warns (-Wrestrict, a false positive) on chained operator+.
  std::ostringstream m;
  std::string little = descr;
  if (!little.empty()) little[0] = '<';
  if (descr.size() >= 2 && descr[0] == '>' && item_size(little) != 0)
    m << "byte order '>' (big-endian) of dtype '" << descr << "' is not supported (hint: arr.astype('" << little
      << "') before np.save)";
  else
    m << "dtype '" << descr << "' is not supported; supported: <f4 <f8 <i4 <i8 |u1 |b1 (hint: save as float32 or float64)";
  fail(name, m.str());
}

// A cursor over the header dict, a Python literal such as
// {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
class DictParser {
 public:
  DictParser(std::string_view text, const std::string& name) : s_(text), name_(name) {}

  void skip_space() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  [[nodiscard]] bool at(char c) {
    skip_space();
    return pos_ < s_.size() && s_[pos_] == c;
  }
  void expect(char c, const std::string& where) {
    if (!at(c)) fail(name_, std::string("header dict: expected '") + c + "' " + where + " at byte " + std::to_string(pos_));
    ++pos_;
  }
  std::string string_literal(const char* what) {
    skip_space();
    if (pos_ >= s_.size() || (s_[pos_] != '\'' && s_[pos_] != '"'))
      fail(name_, std::string("header dict: expected a quoted ") + what + " at byte " + std::to_string(pos_));
    const char quote = s_[pos_++];
    const auto end = s_.find(quote, pos_);
    if (end == std::string_view::npos) fail(name_, std::string("header dict: unterminated ") + what);
    std::string out(s_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return out;
  }
  std::string word() {
    skip_space();
    const std::size_t start = pos_;
    while (pos_ < s_.size() && std::isalpha(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    return std::string(s_.substr(start, pos_ - start));
  }
  // The raw text of the value at the cursor, up to the next ',' or '}' (at most 40 characters,
  // non-printable bytes as '?'), for messages about a value of the wrong kind. Does not move.
  std::string value_text() {
    skip_space();
    std::string out;
    for (std::size_t i = pos_; i < s_.size() && s_[i] != ',' && s_[i] != '}' && out.size() < 40; ++i)
      out += std::isprint(static_cast<unsigned char>(s_[i])) ? s_[i] : '?';
    while (!out.empty() && out.back() == ' ') out.pop_back();
    return out;
  }
  std::vector<std::size_t> shape_tuple() {
    expect('(', "to open 'shape'");
    std::vector<std::size_t> shape;
    while (!at(')')) {
      skip_space();
      const char* first = s_.data() + pos_;
      std::uint64_t v = 0;
      const auto [end, ec] = std::from_chars(first, s_.data() + s_.size(), v);
      if (ec == std::errc::result_out_of_range) fail(name_, "shape entry " + std::to_string(shape.size()) + " does not fit 64 bits");
      if (ec != std::errc() || end == first)
        fail(name_, "shape entry " + std::to_string(shape.size()) + " is not a non-negative integer");
      pos_ += std::size_t(end - first);
      shape.push_back(std::size_t(v));
      if (shape.size() > kMaxRank) fail(name_, "shape has more than " + std::to_string(kMaxRank) + " dimensions");
      if (!at(',')) break;
      ++pos_;
    }
    expect(')', "to close 'shape'");
    return shape;
  }
  [[nodiscard]] bool only_space_left() {
    skip_space();
    return pos_ == s_.size();
  }
  [[nodiscard]] const std::string& name() const { return name_; }

 private:
  std::string_view s_;
  std::size_t pos_ = 0;
  const std::string& name_;
};

// Fills descr, shape and the Fortran flag from the dict; every key must appear exactly once.
void parse_dict(std::string_view text, const std::string& name, NpyHeader& h) {
  DictParser p(text, name);
  bool have_descr = false, have_fortran = false, have_shape = false;
  p.expect('{', "at the start of the header dict");
  while (!p.at('}')) {
    const std::string key = p.string_literal("key");
    p.expect(':', "after key '" + key + "'");
    bool* seen = nullptr;
    if (key == "descr") {
      seen = &have_descr;
      if (p.at('[')) fail(name, "structured dtypes (a list as 'descr') are not supported for reading");
      h.descr = normalise_descr(p.string_literal("dtype"));
      check_descr(h.descr, name);
    } else if (key == "fortran_order") {
      seen = &have_fortran;
      const std::string raw = p.value_text();
      const std::string v = p.word();
      if (v.empty()) fail(name, "header 'fortran_order' is " + raw + ", expected True or False");
      if (v == "True") fail(name, "Fortran-ordered arrays are not supported (hint: np.ascontiguousarray before np.save)");
      if (v != "False") fail(name, "header 'fortran_order' is '" + v + "', expected True or False");
    } else if (key == "shape") {
      seen = &have_shape;
      h.shape = p.shape_tuple();
    } else {
      fail(name, "unexpected header key '" + key + "' (a .npy header has descr, fortran_order and shape)");
    }
    if (*seen) fail(name, "header key '" + key + "' appears twice");
    *seen = true;
    if (!p.at(',')) break;
    p.expect(',', "between entries");
  }
  p.expect('}', "at the end of the header dict");
  if (!p.only_space_left()) fail(name, "unexpected text after the header dict");
  if (!have_descr) fail(name, "header has no 'descr' entry");
  if (!have_fortran) fail(name, "header has no 'fortran_order' entry");
  if (!have_shape) fail(name, "header has no 'shape' entry");
}

std::uint32_t little_endian(std::string_view b, std::size_t at, std::size_t n) {
  std::uint32_t v = 0;
  for (std::size_t i = 0; i < n; ++i) v |= std::uint32_t(static_cast<unsigned char>(b[at + i])) << (8 * i);
  return v;
}

// Payload bytes after the header: exactly what the header declares, before anything is allocated.
void check_payload(const NpyHeader& h, std::uint64_t available, const std::string& name) {
  if (available < h.nbytes)
    fail(name, "data shorter than the header's shape " + shape_str(h.shape) + " of '" + h.descr + "' says: it needs " +
                   bytes_str(h.nbytes) + ", the file holds " + bytes_str(available) + " after the header");
  if (available > h.nbytes)
    fail(name, "the file holds " + bytes_str(available) + " after the header, but shape " + shape_str(h.shape) +
                   " of '" + h.descr + "' declares " + bytes_str(h.nbytes) + " (several arrays in one file?)");
}

void check_limit(const NpyHeader& h, std::uint64_t max_bytes, const std::string& name) {
  try {
    require_within_limit("shape " + shape_str(h.shape) + " of '" + h.descr + "'", h.nbytes, max_bytes);
  } catch (const MemoryLimitError& e) {
    fail(name, e.what());
  }
}

void write_impl(const std::filesystem::path& path, const std::vector<std::size_t>& shape, const std::string& descr,
                const void* data, std::size_t nbytes) {
  std::string dict = "{'descr': " + (descr.front() == '[' ? descr : "'" + descr + "'") +
                     ", 'fortran_order': False, 'shape': " + shape_str(shape) + ", }";
  // Header (magic 6 + version 2 + length 2 + dict + '\n') padded to a multiple of 64 bytes.
  std::size_t total = 10 + dict.size() + 1;
  const std::size_t pad = (64 - total % 64) % 64;
  dict.append(pad, ' ');
  dict.push_back('\n');
  if (dict.size() > 0xFFFF) fail(path, "header too long for .npy version 1.0");
  std::ofstream out(path, std::ios::binary);
  if (!out) fail(path, "cannot open for writing (does the directory exist?)");
  out.write(kMagic, 6);
  const unsigned char version[2] = {1, 0};
  out.write(reinterpret_cast<const char*>(version), 2);
  const std::uint16_t len = static_cast<std::uint16_t>(dict.size());
  out.write(reinterpret_cast<const char*>(&len), 2);
  out.write(dict.data(), static_cast<std::streamsize>(dict.size()));
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(nbytes));
  if (!out) fail(path, "write failed (disk full?)");
}

std::size_t product(const std::vector<std::size_t>& shape) {
  const auto n = checked_product(shape);
  if (!n) throw NpyError("shape " + shape_str(shape) + " has more than 2^64 elements");
  return std::size_t(*n);
}

// as_double/as_int64 index bytes by the shape: refuse an array whose two disagree.
void check_consistent(const NpyArray& a) {
  const auto n = checked_product(a.shape);
  const std::size_t item = item_size(a.descr);
  const auto bytes = n ? checked_mul(*n, item) : std::nullopt;
  if (item == 0 || !bytes || *bytes != a.bytes.size())
    throw NpyError("array of shape " + shape_str(a.shape) + " and dtype '" + a.descr + "' holds " +
                   std::to_string(a.bytes.size()) + " bytes, which does not match");
}

}  // namespace

std::string shape_str(const std::vector<std::size_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

std::size_t NpyArray::numel() const { return product(shape); }

std::vector<double> NpyArray::as_double() const {
  check_consistent(*this);
  const std::size_t n = numel();
  std::vector<double> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (descr == "<f4") { float v; std::memcpy(&v, bytes.data() + 4 * i, 4); out[i] = v; }
    else if (descr == "<f8") { std::memcpy(&out[i], bytes.data() + 8 * i, 8); }
    else if (descr == "<i4") { std::int32_t v; std::memcpy(&v, bytes.data() + 4 * i, 4); out[i] = v; }
    else if (descr == "<i8") { std::int64_t v; std::memcpy(&v, bytes.data() + 8 * i, 8); out[i] = double(v); }
    else { out[i] = bytes[i]; }
  }
  return out;
}

std::vector<std::int64_t> NpyArray::as_int64() const {
  if (descr == "<f4" || descr == "<f8")
    throw NpyError("array of dtype " + descr + " where an integer array was expected");
  check_consistent(*this);
  const std::size_t n = numel();
  std::vector<std::int64_t> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (descr == "<i4") { std::int32_t v; std::memcpy(&v, bytes.data() + 4 * i, 4); out[i] = v; }
    else if (descr == "<i8") { std::memcpy(&out[i], bytes.data() + 8 * i, 8); }
    else { out[i] = bytes[i]; }
  }
  return out;
}

NpyHeader parse_npy_header(std::string_view b, const std::string& name) {
  if (b.size() < 6 || b.substr(0, 6) != std::string_view(kMagic, 6)) fail(name, "not a .npy file (bad magic)");
  if (b.size() < 8) fail(name, "truncated header (no version)");
  const unsigned major = static_cast<unsigned char>(b[6]), minor = static_cast<unsigned char>(b[7]);
  if (major < 1 || major > 3 || minor != 0)
    fail(name, "unsupported .npy format version " + std::to_string(major) + "." + std::to_string(minor) +
                   " (supported: 1.0, 2.0, 3.0)");
  const std::size_t len_bytes = major == 1 ? 2 : 4;
  if (b.size() < 8 + len_bytes) fail(name, "truncated header (no header length)");
  const std::size_t header_len = little_endian(b, 8, len_bytes);
  if (header_len > kMaxHeaderBytes)
    fail(name, "header length " + std::to_string(header_len) + " is implausible (over 1 MiB)");
  NpyHeader h;
  h.data_offset = 8 + len_bytes + header_len;
  if (b.size() < h.data_offset)
    fail(name, "truncated header: it declares " + std::to_string(header_len) + " bytes, the file holds " +
                   std::to_string(b.size() - 8 - len_bytes));
  const std::string_view dict = b.substr(8 + len_bytes, header_len);
  if (major < 3)
    for (const char c : dict)
      if (static_cast<unsigned char>(c) >= 0x80) fail(name, "header of a version 1.0/2.0 file is not ASCII");
  parse_dict(dict, name, h);
  h.item_size = item_size(h.descr);
  const auto numel = checked_product(h.shape);
  const auto nbytes = numel ? checked_mul(*numel, h.item_size) : std::nullopt;
  if (!nbytes)
    fail(name, "shape " + shape_str(h.shape) + " of '" + h.descr + "' declares more than 2^64 bytes");
  h.numel = *numel;
  h.nbytes = *nbytes;
  return h;
}

NpyHeader read_npy_header(const std::filesystem::path& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) fail(path, "is a directory, not a .npy file");
  try {
    require_regular_file(path.string(), ".npy file");
  } catch (const InputFileError& e) {
    fail(path, e.reason());
  }
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) fail(path, "cannot read its size (" + ec.message() + ")");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open (permission?)");
  std::string prefix(std::min<std::uintmax_t>(size, 12 + kMaxHeaderBytes), '\0');
  in.read(prefix.data(), static_cast<std::streamsize>(prefix.size()));
  prefix.resize(static_cast<std::size_t>(in.gcount()));
  const NpyHeader h = parse_npy_header(prefix, path.string());
  check_payload(h, std::uint64_t(size) - h.data_offset, path.string());
  return h;
}

NpyArray read_npy(const std::filesystem::path& path, std::uint64_t max_bytes) {
  const NpyHeader h = read_npy_header(path);
  check_limit(h, max_bytes, path.string());
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open (removed while read?)");
  NpyArray arr;
  arr.shape = h.shape;
  arr.descr = h.descr;
  arr.bytes.resize(std::size_t(h.nbytes));
  in.seekg(static_cast<std::streamoff>(h.data_offset));
  if (h.nbytes && !in.read(reinterpret_cast<char*>(arr.bytes.data()), static_cast<std::streamsize>(h.nbytes)))
    fail(path, "data shorter than the header's shape " + shape_str(arr.shape) + " says (file changed while read?)");
  return arr;
}

NpyArray read_npy(const std::filesystem::path& path) {
  std::uint64_t limit = 0;
  try {
    limit = memory_limit_from_env();
  } catch (const MemoryLimitError& e) {
    fail(path, e.what());
  }
  return read_npy(path, limit);
}

NpyArray parse_npy(std::string_view bytes, const std::string& name, std::uint64_t max_bytes) {
  const NpyHeader h = parse_npy_header(bytes, name);
  check_payload(h, bytes.size() - h.data_offset, name);
  check_limit(h, max_bytes, name);
  NpyArray arr;
  arr.shape = h.shape;
  arr.descr = h.descr;
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data()) + h.data_offset;
  arr.bytes.assign(data, data + h.nbytes);
  return arr;
}

void write_npy(const std::filesystem::path& path, const std::vector<std::size_t>& shape, const double* data) {
  write_impl(path, shape, "<f8", data, product(shape) * 8);
}
void write_npy(const std::filesystem::path& path, const std::vector<std::size_t>& shape, const float* data) {
  write_impl(path, shape, "<f4", data, product(shape) * 4);
}
void write_npy(const std::filesystem::path& path, const std::vector<std::size_t>& shape, const std::int64_t* data) {
  write_impl(path, shape, "<i8", data, product(shape) * 8);
}
void write_npy(const std::filesystem::path& path, const std::vector<std::size_t>& shape, const std::int32_t* data) {
  write_impl(path, shape, "<i4", data, product(shape) * 4);
}
void write_npy_raw(const std::filesystem::path& path, const std::vector<std::size_t>& shape, const std::string& descr,
                   const void* data, std::size_t nbytes) {
  write_impl(path, shape, descr, data, nbytes);
}

}  // namespace flashlab::ref
