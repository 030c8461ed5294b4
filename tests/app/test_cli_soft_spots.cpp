// Inputs that once slipped past the front end: unbounded reads (devices, pipes, FIFOs), odd
// paths, invisible or control characters, counts that wrap, tolerances that could never fail,
// outputs that cannot be written. Each case states the message and exit code a user now gets;
// each finishes in well under a second except the FIFO case, which waits for no writer.
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "flashlab/reference/npy.hpp"
#include "flashlab/reference/tensor.hpp"
#include "run_cli.hpp"

namespace fs = std::filesystem;
namespace ref = flashlab::ref;
using flashlab::test::expect_usage_error;
using flashlab::test::fresh_temp_dir;
using flashlab::test::run_cli;

namespace {

const std::string kTrace = std::string(FLASHLAB_SOURCE_DIR) + "/toymachine/traces/p1_c00.trace";

void write_text(const fs::path& file, const std::string& text) {
  std::ofstream out(file, std::ios::binary);
  out << text;
}

}  // namespace

TEST_CASE("soft spots: a device, a FIFO, a symlink loop or a dangling link as a trace", "[cli][soft]") {
  const fs::path dir = fresh_temp_dir("soft_paths");
  // /dev/zero never ends: refused at the cap, which the message states, not after gigabytes.
  const auto t0 = std::chrono::steady_clock::now();
  expect_usage_error("run /dev/zero --machine matmul3", "more than the cap of 64 MiB");
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
  // A FIFO nobody writes to reads as an empty trace at once (no hang).
  const fs::path fifo = dir / "pipe.trace";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const auto t1 = std::chrono::steady_clock::now();
  const auto f = run_cli("run '" + fifo.string() + "' --machine matmul3");
  CHECK(std::chrono::steady_clock::now() - t1 < std::chrono::seconds(5));
  CHECK(f.exit_code == 0);
  CHECK_THAT(f.out, Catch::Contains("0 of 0 instructions ran"));
  // Links.
  fs::create_symlink(dir / "b", dir / "a");
  fs::create_symlink(dir / "a", dir / "b");
  expect_usage_error("run '" + (dir / "a").string() + "' --machine matmul3", "a loop of symbolic links");
  fs::create_symlink(dir / "nowhere.trace", dir / "dangling.trace");
  expect_usage_error("run '" + (dir / "dangling.trace").string() + "' --machine matmul3",
                     "a symbolic link to a file that does not exist");
  expect_usage_error("run '" + (dir / "missing.trace").string() + "' --machine matmul3", "no such file");
  // The same reader for machine files and lesson answers.
  expect_usage_error("run '" + kTrace + "' --machine-file /dev/zero", "--machine-file: '/dev/zero'");
  expect_usage_error("lesson check 1 '" + (dir / "a").string() + "'", "a loop of symbolic links");
  // .npy inputs are seeked: a FIFO or a device is named, not taken for a missing file.
  const fs::path in = fresh_temp_dir("soft_npy_fifo");
  REQUIRE(::mkfifo((in / "q.npy").c_str(), 0600) == 0);
  const auto n = run_cli("attention fwd --inputs '" + in.string() + "'");
  CHECK(n.exit_code == 2);
  CHECK_THAT(n.err, Catch::Contains("is a pipe (FIFO), not a regular file") && !Catch::Contains("no such file"));
  fs::remove_all(in);
  fs::remove_all(dir);
}

TEST_CASE("soft spots: standard input as '-'", "[cli][soft]") {
  const fs::path dir = fresh_temp_dir("soft_stdin");
  const std::string out = (dir / "out.txt").string();
  const std::string cmd = "cat '" + kTrace + "' | '" + FLASHLAB_BIN + "' run - --machine matmul3 >'" + out + "' 2>&1";
  CHECK(std::system(cmd.c_str()) == 0);
  std::ifstream in(out);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK_THAT(text, Catch::Contains("7 of 7 instructions ran"));
  fs::remove_all(dir);
}

TEST_CASE("soft spots: characters that look like nothing are named, control bytes never echoed", "[cli][soft]") {
  const fs::path dir = fresh_temp_dir("soft_chars");
  write_text(dir / "nbsp.trace", "LOAD a[0][0],\xC2\xA0R0\n");
  auto r = run_cli("run '" + (dir / "nbsp.trace").string() + "' --machine matmul3");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Catch::Contains("it holds a non-breaking space (U+00A0)"));
  write_text(dir / "cr.trace", "LOAD a[0][0], R0\rLOAD b[0][0], R1\rMAC_Z R0, R1, R2\r");
  r = run_cli("run '" + (dir / "cr.trace").string() + "' --machine matmul3");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Catch::Contains("bare-CR line endings"));
  write_text(dir / "esc.trace", "LOAD a[0][0], R0\n\x1b[31mLOAD\x1b[0m b[0][0], R1\n");
  r = run_cli("run '" + (dir / "esc.trace").string() + "' --machine matmul3");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, !Catch::Contains("\x1b"));
  CHECK_THAT(r.err, Catch::Contains("control character (U+001B)"));
  fs::remove_all(dir);
}

TEST_CASE("soft spots: a machine file with a huge register list is refused quickly", "[cli][soft]") {
  const fs::path dir = fresh_temp_dir("soft_regs");
  std::string text = "machine big\nregisters";
  for (int i = 0; i < 200000; ++i) text += " R" + std::to_string(i);
  text += "\nisa LOAD STORE MAC_Z MAC\ninput a[2][2]\ninput b[2][2]\noutput c[2][2]\n";
  write_text(dir / "big.machine", text);
  const auto t0 = std::chrono::steady_clock::now();
  expect_usage_error("run '" + kTrace + "' --machine-file '" + (dir / "big.machine").string() + "'",
                     "more than 4096 registers");
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  fs::remove_all(dir);
}

TEST_CASE("soft spots: model counts that would wrap 64 bits are refused, wide numbers keep their columns",
          "[cli][soft]") {
  expect_usage_error("traffic attention --seq 16777216 --heads 65536 --batch 65536 --dim 4096",
                     "would pass 2^63");
  // 18-digit counts: with the old fixed widths two of them ran together.
  const auto r = run_cli("traffic attention --seq 4194304 --heads 1024 --dim 4");
  CHECK(r.exit_code == 0);
  // Every row has its six columns separated by spaces, however wide the numbers.
  std::istringstream lines(r.out);
  std::string line;
  std::getline(lines, line);  // title
  while (std::getline(lines, line)) {
    std::istringstream cells(line);
    int count = 0;
    for (std::string cell; cells >> cell;) ++count;
    CHECK(count == 6);
  }
}

TEST_CASE("soft spots: a self-check tolerance has a ceiling and says when it cannot judge", "[cli][soft]") {
  const fs::path dir = fresh_temp_dir("soft_tol");
  auto normal = [&](const char* name, double factor, std::uint64_t seed) {
    ref::Tensor<double> t(ref::Shape{1, 40 * 8, 1, 1});
    ref::fill_normal(t, seed, factor);
    ref::write_npy(dir / name, {40, 1, 8}, t.data());
  };
  normal("q.npy", 1e17, 1);
  normal("k.npy", 1e17, 2);
  normal("v.npy", 1.0, 3);
  const auto r = run_cli("attention fwd --inputs '" + dir.string() + "'");
  CHECK_THAT(r.out, Catch::Contains("capped at 0.01") && Catch::Contains("cannot vouch"));
  fs::remove_all(dir);
}

TEST_CASE("soft spots: --save onto a file or an unwritable directory", "[cli][soft]") {
  const fs::path dir = fresh_temp_dir("soft_save");
  write_text(dir / "file", "x");
  expect_usage_error("attention fwd --seq 8 --dim 4 --save '" + (dir / "file").string() + "'",
                     "is a file, not a directory");
  expect_usage_error("attention fwd --seq 8 --dim 4 --save '" + (dir / "file" / "sub").string() + "'",
                     "cannot create the directory");
  expect_usage_error("stream estimate --seq 16 --dim 4 --block-m 4 --block-n 4 --k 2 --save '" + (dir / "file").string() + "'",
                     "is a file, not a directory");
  expect_usage_error("mta fwd --save '" + (dir / "file").string() + "'", "is a file, not a directory");
  fs::remove_all(dir);
}

TEST_CASE("soft spots: flag messages, help of unknown subjects, header values, operand layouts", "[cli][soft]") {
  // A flag's name appears once, whichever way a range check is called.
  expect_usage_error("traffic mta --device cuda --seq 0", "--seq 0 is out of range");
  const auto twice = run_cli("traffic mta --device cuda --seq 0");
  CHECK_THAT(twice.err, !Catch::Contains("----seq"));
  // A flag missing its value names the flag, not "too many positional options".
  expect_usage_error("attention fwd --seq --dim 4", "--seq needs a value, but the next word is the flag --dim");
  // --help beside an unknown subject is an error, never a sibling's help.
  expect_usage_error("traffic nosuch --help", "unknown traffic subject 'nosuch'");
  const auto help = run_cli("traffic stream --help");
  CHECK(help.exit_code == 0);
  CHECK_THAT(help.out, !Catch::Contains("--sub") && !Catch::Contains("(=cpu)"));

  const fs::path dir = fresh_temp_dir("soft_layouts");
  // A string where True/False belongs is quoted as it is.
  {
    std::string header = "{'descr': '<f4', 'fortran_order': 'maybe', 'shape': (8, 1, 4), }";
    while ((10 + header.size() + 1) % 64) header += ' ';
    header += '\n';
    std::ofstream out(dir / "q.npy", std::ios::binary);
    out.write("\x93NUMPY\x01\x00", 8);
    out.put(char(header.size() & 0xff)).put(char(header.size() >> 8));
    out << header << std::string(8 * 4 * 4, '\0');
  }
  auto normal = [&](const fs::path& file, const std::vector<std::size_t>& shape, std::uint64_t seed) {
    std::size_t n = 1;
    for (auto d : shape) n *= d;
    ref::Tensor<double> t(ref::Shape{1, n, 1, 1});
    ref::fill_normal(t, seed, 1.0);
    ref::write_npy(file, shape, t.data());
  };
  normal(dir / "k.npy", {8, 1, 4}, 2);
  normal(dir / "v.npy", {8, 1, 4}, 3);
  expect_usage_error("attention fwd --inputs '" + dir.string() + "'", "header 'fortran_order' is 'maybe'");
  // A 4-D q beside 3-D k and v.
  normal(dir / "q.npy", {1, 8, 1, 4}, 1);
  expect_usage_error("attention fwd --inputs '" + dir.string() + "'", "k.npy is 3-D but q.npy is 4-D");
  fs::remove_all(dir);
}

TEST_CASE("soft spots: a float32 result that overflows says why and how to avoid it", "[cli][soft]") {
  const fs::path dir = fresh_temp_dir("soft_overflow");
  auto write = [&](const char* name, double value) {
    ref::Tensor<double> t(ref::Shape{1, 4 * 2, 1, 1});
    for (std::size_t i = 0; i < t.numel(); ++i) t.data()[i] = value;
    ref::write_npy(dir / name, {4, 1, 2}, t.data());
  };
  write("q.npy", 0.0);
  write("k.npy", 0.0);
  write("v.npy", 3e38);  // each row of O averages values near FLT_MAX: fine in float64, inf in a float32 sum
  const auto r = run_cli("attention fwd --inputs '" + dir.string() + "'");
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.out, Catch::Contains("overflowed float32") && Catch::Contains("--precision double"));
  fs::remove_all(dir);
}
