// .npy round trips and the errors for malformed files.
#include <catch2/catch.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>

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
  REQUIRE_THROWS_WITH(read_npy(temp_file("missing.npy")), Catch::Contains("cannot open"));
  // Truncated data: header says 4 float64 but only 3 are present.
  const std::vector<double> g = {1, 2, 3, 4};
  write_npy(temp_file("trunc.npy"), {4}, g.data());
  fs::resize_file(temp_file("trunc.npy"), fs::file_size(temp_file("trunc.npy")) - 8);
  REQUIRE_THROWS_WITH(read_npy(temp_file("trunc.npy")), Catch::Contains("data shorter"));
}
