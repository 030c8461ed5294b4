// `flashlab stream needles` end to end (CPU), and the `--device cuda` dispatch of `stream`.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "flashlab/reference/npy.hpp"
#include "run_cli.hpp"

namespace fs = std::filesystem;
using flashlab::test::fresh_temp_dir;
using flashlab::test::run_cli;

TEST_CASE("cli stream needles: prints the recall and saves the planted inputs", "[cli][stream][needles]") {
  const std::string dir = fresh_temp_dir("needles");
  const auto r = run_cli("stream needles --seq 8192 --dim 32 --block-m 64 --block-n 64 --k 8 --needle-blocks 4 "
                         "--needles 4 --threads 2 --save " + dir);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("recall 16/16 = 1") != std::string::npos);
  const auto q = flashlab::ref::read_npy(fs::path(dir) / "q.npy");
  CHECK(q.shape == std::vector<std::size_t>{8192, 32});
  CHECK(fs::exists(fs::path(dir) / "needles.csv"));
  const auto iso = run_cli("stream needles --seq 8192 --dim 32 --block-m 64 --block-n 64 --k 8 --needle-blocks 4 --needles 4 "
                           "--no-lead-in");
  REQUIRE(iso.exit_code == 0);
  CHECK(iso.out.find("lead-in=no") != std::string::npos);
}

TEST_CASE("cli stream needles: a planting wider than d is spread over input sets, every needle counted",
          "[cli][stream][needles]") {
  // 16 blocks of 4 needles on d = 16: four input sets of 4 blocks, 64 needles in all.
  const auto r = run_cli("stream needles --seq 8192 --dim 16 --block-m 64 --block-n 64 --k 8 --needle-blocks 16 --needles 4 "
                         "--threads 2");
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("input sets=4") != std::string::npos);
  CHECK(r.out.find("recall 64/64 = 1") != std::string::npos);
}

TEST_CASE("cli stream needles: impossible plantings and missing flags are usage errors", "[cli][stream][needles]") {
  const auto wide = run_cli("stream needles --seq 8192 --dim 4 --block-m 64 --block-n 64 --k 8 --needles 8");
  CHECK(wide.exit_code == 2);
  CHECK(wide.err.find("exceeds d = 4") != std::string::npos);
  const auto save = run_cli("stream needles --seq 8192 --dim 8 --block-m 64 --block-n 64 --k 8 --needles 8 --save " +
                            fresh_temp_dir("needles_sets"));
  CHECK(save.exit_code == 2);
  CHECK(save.err.find("--save writes one input set") != std::string::npos);
  const auto missing = run_cli("stream needles --seq 8192 --dim 64 --block-m 64 --block-n 64");
  CHECK(missing.exit_code == 2);
  CHECK(missing.err.find("--k is required") != std::string::npos);
  const auto device = run_cli("stream needles --seq 8192 --dim 64 --block-m 64 --block-n 64 --k 8 --device tpu");
  CHECK(device.exit_code == 2);
  CHECK(device.err.find("--device") != std::string::npos);
}

#ifndef FLASHLAB_TEST_HAVE_CUDA
TEST_CASE("cli stream: --device cuda without CUDA says so", "[cli][stream]") {
  const auto r = run_cli("stream estimate --device cuda --seq 64 --dim 4 --block-m 8 --block-n 8 --k 2");
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("built without CUDA") != std::string::npos);
}
#endif
