// .npy round trips and the errors for malformed files.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "flashlab/reference/memory_budget.hpp"
#include "flashlab/reference/npy.hpp"

namespace fs = std::filesystem;
using namespace flashlab::ref;

namespace {
fs::path temp_file(const std::string& name) {
  auto dir = fs::temp_directory_path() / "flashlab_test_npy";
  fs::create_directories(dir);
  return dir / name;
}
}  // namespace

TEST_CASE("npy: float32 and float64 round trip with shape", "[npy]") {
  const std::vector<float> f = {1.5f, -2.0f, 3.25f, 0.0f, 1e-30f, -7.0f};
  write_npy(temp_file("f.npy"), {2, 3}, f.data());
  auto a = read_npy(temp_file("f.npy"));
  CHECK(a.descr == "<f4");
  CHECK(a.shape == std::vector<std::size_t>{2, 3});
  auto d = a.as_double();
  for (std::size_t i = 0; i < f.size(); ++i) CHECK(d[i] == double(f[i]));

  const std::vector<double> g = {0.1, -0.2, 1e300};
  write_npy(temp_file("g.npy"), {3}, g.data());
  auto b = read_npy(temp_file("g.npy"));
  CHECK(b.descr == "<f8");
  CHECK(b.shape == std::vector<std::size_t>{3});
  CHECK(b.as_double() == g);
}

TEST_CASE("npy: int64 round trip and header alignment", "[npy]") {
  const std::vector<std::int64_t> v = {-1, 0, 5, 1LL << 40};
  write_npy(temp_file("i.npy"), {2, 2}, v.data());
  auto a = read_npy(temp_file("i.npy"));
  CHECK(a.as_int64() == v);
  // The data must start at a multiple of 64 bytes (NumPy's alignment rule).
  CHECK(fs::file_size(temp_file("i.npy")) % 64 == (4 * 8) % 64);
}

TEST_CASE("npy: malformed files give errors naming the file", "[npy][errors]") {
  {
    std::ofstream(temp_file("bad.npy")) << "not numpy";
  }
  REQUIRE_THROWS_WITH(read_npy(temp_file("bad.npy")), Catch::Contains("bad.npy") && Catch::Contains("bad magic"));
  REQUIRE_THROWS_WITH(read_npy(temp_file("missing.npy")), Catch::Contains("no such file"));
  // Truncated data: header says 4 float64 but only 3 are present.
  const std::vector<double> g = {1, 2, 3, 4};
  write_npy(temp_file("trunc.npy"), {4}, g.data());
  fs::resize_file(temp_file("trunc.npy"), fs::file_size(temp_file("trunc.npy")) - 8);
  REQUIRE_THROWS_WITH(read_npy(temp_file("trunc.npy")), Catch::Contains("data shorter"));
}

namespace {
// A whole .npy file in memory from a literal header dict, for headers np.save never writes.
std::string npy_bytes(const std::string& dict, std::size_t payload, unsigned char major = 1) {
  std::string header = dict;
  const std::size_t len_bytes = major == 1 ? 2 : 4;
  while ((8 + len_bytes + header.size() + 1) % 64) header += ' ';
  header += '\n';
  std::string out = std::string("\x93NUMPY", 6) + char(major) + '\0';
  for (std::size_t i = 0; i < len_bytes; ++i) out += char((header.size() >> (8 * i)) & 0xff);
  return out + header + std::string(payload, '\0');
}
std::string dict(const std::string& descr, const std::string& shape) {
  return "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
}
constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;
}  // namespace

TEST_CASE("npy: sizes are multiplied with overflow checks and compared with the payload", "[npy][errors]") {
  // Each dimension 2^62: the element count wraps 2^64 (it once slipped past as a small number).
  REQUIRE_THROWS_WITH(parse_npy(npy_bytes(dict("<f4", "(4611686018427387904, 4611686018427387904, 4)"), 200), "w.npy", kMiB),
                      Catch::Contains("w.npy: shape (4611686018427387904, 4611686018427387904, 4) of '<f4' declares more than 2^64 bytes"));
  REQUIRE_THROWS_WITH(parse_npy(npy_bytes(dict("<f8", "(2305843009213693952,)"), 8), "x.npy", kMiB),
                      Catch::Contains("declares more than 2^64 bytes"));
  REQUIRE_THROWS_WITH(parse_npy(npy_bytes(dict("<f4", "(1024, 1024, 1024)"), 200), "g.npy", kMiB),
                      Catch::Contains("it needs 4.00 GiB (4294967296 bytes), the file holds 200 bytes after the header"));
  REQUIRE_THROWS_WITH(parse_npy(npy_bytes(dict("<f4", "(99999999999999999999,)"), 0), "e.npy", kMiB),
                      Catch::Contains("shape entry 0 does not fit 64 bits"));
  REQUIRE_THROWS_WITH(parse_npy(npy_bytes(dict("<f4", "(4,)"), 20), "t.npy", kMiB),
                      Catch::Contains("the file holds 20 bytes after the header, but shape (4,) of '<f4' declares 16 bytes"));
}

TEST_CASE("npy: the memory limit is checked before the payload is allocated", "[npy][errors]") {
  const std::string ok = npy_bytes(dict("<f8", "(16, 8)"), 16 * 8 * 8);
  CHECK(parse_npy(ok, "ok.npy", 1024).numel() == 128);
  REQUIRE_THROWS_WITH(parse_npy(ok, "ok.npy", 1023),
                      Catch::Contains("ok.npy: shape (16, 8) of '<f8' needs 1.00 KiB (1024 bytes), above the memory limit of 1023 bytes"));
  // The same through the file reader, and the limit from the environment.
  std::ofstream(temp_file("limit.npy"), std::ios::binary) << ok;
  REQUIRE_THROWS_WITH(read_npy(temp_file("limit.npy"), 100), Catch::Contains("above the memory limit of 100 bytes"));
  ::setenv("FLASHLAB_MEMORY_LIMIT", "512", 1);
  REQUIRE_THROWS_WITH(read_npy(temp_file("limit.npy")), Catch::Contains("above the memory limit of 512 bytes"));
  ::setenv("FLASHLAB_MEMORY_LIMIT", "many", 1);
  REQUIRE_THROWS_WITH(read_npy(temp_file("limit.npy")), Catch::Contains("FLASHLAB_MEMORY_LIMIT='many' is not a size"));
  ::unsetenv("FLASHLAB_MEMORY_LIMIT");
  CHECK(read_npy(temp_file("limit.npy")).numel() == 128);
}

TEST_CASE("npy: every unsupported header field is named", "[npy][errors]") {
  const struct {
    std::string bytes, message;
  } cases[] = {
      {npy_bytes(dict(">f8", "(1,)"), 8), "byte order '>' (big-endian) of dtype '>f8' is not supported (hint: arr.astype('<f8')"},
      {npy_bytes("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", 16), "Fortran-ordered arrays are not supported"},
      {npy_bytes(dict("<f2", "(1,)"), 2), "dtype '<f2' is not supported"},
      {npy_bytes(dict("|O", "(1,)"), 8), "dtype '|O' is not supported"},
      {npy_bytes("{'descr': [('a', '<f8')], 'fortran_order': False, 'shape': (1,), }", 8), "structured dtypes"},
      {npy_bytes("{'descr': '<f4', 'fortran_order': Maybe, 'shape': (1,), }", 4), "'fortran_order' is 'Maybe'"},
      {npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 0}", 4), "unexpected header key 'x'"},
      {npy_bytes("{'descr': '<f4', 'shape': (1,), 'shape': (1,), 'fortran_order': False}", 4), "header key 'shape' appears twice"},
      {npy_bytes("{'descr': '<f4', 'fortran_order': False}", 4), "header has no 'shape' entry"},
      {npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }", 4), "shape entry 0 is not a non-negative integer"},
      {npy_bytes("{'descr': '<f4", 4), "header dict: unterminated dtype"},
      {npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1,)} trailing", 4), "unexpected text after the header dict"},
      {npy_bytes(dict("<f4", "(1,)"), 4, 4), "unsupported .npy format version 4.0 (supported: 1.0, 2.0, 3.0)"},
      {std::string("\x93NUMPY\x01\x00\xff\xff{", 11), "truncated header: it declares 65535 bytes"},
      {std::string("\x93NUMPY\x02\x00\xff\xff\xff\x7f", 12), "header length 2147483647 is implausible"},
      {std::string("\x93NUMPY", 6), "truncated header (no version)"},
      {std::string(), "not a .npy file (bad magic)"},
  };
  for (const auto& c : cases) {
    INFO(c.message);
    REQUIRE_THROWS_WITH(parse_npy(c.bytes, "h.npy", kMiB), Catch::StartsWith("h.npy: ") && Catch::Contains(c.message));
  }
  // What NumPy writes in versions 2.0 and 3.0, with double quotes, '=' and a 0-d array, is read.
  CHECK(parse_npy(npy_bytes(dict("<f4", "(2,)"), 8, 2), "v2.npy", kMiB).numel() == 2);
  CHECK(parse_npy(npy_bytes(dict("<f8", "()"), 8, 3), "v3.npy", kMiB).numel() == 1);
  CHECK(parse_npy(npy_bytes("{\"descr\": \"=f8\", \"fortran_order\": False, \"shape\": (1,)}", 8), "q.npy", kMiB).descr == "<f8");
}

TEST_CASE("memory budget: checked arithmetic and byte sizes", "[npy][budget]") {
  CHECK(checked_mul(std::uint64_t{1} << 32, std::uint64_t{1} << 31) == std::uint64_t{1} << 63);
  CHECK_FALSE(checked_mul(std::uint64_t{1} << 32, std::uint64_t{1} << 32));
  CHECK_FALSE(checked_add(UINT64_MAX, 1));
  CHECK_FALSE(checked_product({std::size_t{1} << 62, std::size_t{1} << 62, 4}));
  CHECK(checked_product({}) == 1u);
  CHECK(parse_byte_size("8G") == std::uint64_t{8} << 30);
  CHECK(parse_byte_size("512MiB") == std::uint64_t{512} << 20);
  CHECK(parse_byte_size("1000") == 1000u);
  CHECK_FALSE(parse_byte_size("0"));
  CHECK_FALSE(parse_byte_size("-1"));
  CHECK_FALSE(parse_byte_size("8X"));
  CHECK_FALSE(parse_byte_size("99999999999T"));
  CHECK(bytes_str(1536) == "1.50 KiB (1536 bytes)");
  CHECK(default_memory_limit() > 0);
}
