#include "flashlab/reference/npy.hpp"

#include <bit>
#include <cstring>
#include <fstream>
#include <sstream>

namespace flashlab::ref {

static_assert(std::endian::native == std::endian::little, "flashlab's .npy I/O assumes a little-endian host");

namespace {

constexpr char kMagic[] = "\x93NUMPY";

[[noreturn]] void fail(const std::filesystem::path& path, const std::string& what) {
  throw NpyError(path.string() + ": " + what);
}

std::size_t item_size(const std::string& descr) {
  if (descr == "<f4" || descr == "<i4") return 4;
  if (descr == "<f8" || descr == "<i8") return 8;
  if (descr == "|u1" || descr == "|b1") return 1;
  return 0;
}

// Pulls the value of `'key':` out of the header dict (a Python literal).
std::string dict_value(const std::string& header, const std::string& key, const std::filesystem::path& path) {
  const std::string needle = "'" + key + "'";
  auto pos = header.find(needle);
  if (pos == std::string::npos) fail(path, "header has no '" + key + "' entry");
  pos = header.find(':', pos + needle.size());
  if (pos == std::string::npos) fail(path, "header entry '" + key + "' has no value");
  ++pos;
  while (pos < header.size() && header[pos] == ' ') ++pos;
  if (pos >= header.size()) fail(path, "header entry '" + key + "' is truncated");
  const char open = header[pos];
  char close = 0;
  if (open == '\'') close = '\'';
  if (open == '(') close = ')';
  if (close) {
    auto end = header.find(close, pos + 1);
    if (end == std::string::npos) fail(path, "header entry '" + key + "' is not closed");
    return header.substr(pos, end - pos + 1);
  }
  auto end = header.find_first_of(",}", pos);
  return header.substr(pos, end - pos);
}

std::vector<std::size_t> parse_shape(const std::string& tuple, const std::filesystem::path& path) {
  std::vector<std::size_t> shape;
  std::string inner = tuple.substr(1, tuple.size() - 2);
  std::stringstream ss(inner);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto first = item.find_first_not_of(' ');
    if (first == std::string::npos) continue;
    const auto last = item.find_last_not_of(' ');
    const std::string digits = item.substr(first, last - first + 1);
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos)
      fail(path, "shape entry '" + digits + "' is not a non-negative integer");
    shape.push_back(std::stoull(digits));
  }
  return shape;
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
  std::size_t n = 1;
  for (auto s : shape) n *= s;
  return n;
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
  const std::size_t n = numel();
  std::vector<std::int64_t> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (descr == "<i4") { std::int32_t v; std::memcpy(&v, bytes.data() + 4 * i, 4); out[i] = v; }
    else if (descr == "<i8") { std::memcpy(&out[i], bytes.data() + 8 * i, 8); }
    else { out[i] = bytes[i]; }
  }
  return out;
}

NpyArray read_npy(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open (no such file?)");
  char magic[6];
  if (!in.read(magic, 6) || std::memcmp(magic, kMagic, 6) != 0) fail(path, "not a .npy file (bad magic)");
  unsigned char version[2];
  if (!in.read(reinterpret_cast<char*>(version), 2)) fail(path, "truncated header");
  std::size_t header_len = 0;
  if (version[0] == 1) {
    unsigned char b[2];
    if (!in.read(reinterpret_cast<char*>(b), 2)) fail(path, "truncated header");
    header_len = b[0] | (std::size_t(b[1]) << 8);
  } else if (version[0] == 2 || version[0] == 3) {
    unsigned char b[4];
    if (!in.read(reinterpret_cast<char*>(b), 4)) fail(path, "truncated header");
    header_len = b[0] | (std::size_t(b[1]) << 8) | (std::size_t(b[2]) << 16) | (std::size_t(b[3]) << 24);
  } else {
    fail(path, "unsupported .npy version " + std::to_string(version[0]));
  }
  if (header_len > (1u << 20)) fail(path, "implausible header length");
  std::string header(header_len, '\0');
  if (!in.read(header.data(), static_cast<std::streamsize>(header_len))) fail(path, "truncated header");

  NpyArray arr;
  std::string descr = dict_value(header, "descr", path);
  if (descr.size() < 2 || descr.front() != '\'') fail(path, "structured dtypes are not supported for reading");
  arr.descr = descr.substr(1, descr.size() - 2);
  if (item_size(arr.descr) == 0)
    fail(path, "dtype '" + arr.descr + "' not supported (hint: save as float32, float64, int32 or int64)");
  const std::string fortran = dict_value(header, "fortran_order", path);
  if (fortran.find("True") != std::string::npos)
    fail(path, "Fortran-ordered arrays are not supported (hint: np.ascontiguousarray before np.save)");
  arr.shape = parse_shape(dict_value(header, "shape", path), path);
  const std::size_t nbytes = arr.numel() * item_size(arr.descr);
  arr.bytes.resize(nbytes);
  if (nbytes && !in.read(reinterpret_cast<char*>(arr.bytes.data()), static_cast<std::streamsize>(nbytes)))
    fail(path, "data shorter than the header's shape " + shape_str(arr.shape) + " says");
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
