// Sibling commands on two devices: `attention`, `mta` and `stream` with --device cpu (the CPU
// reference) and --device cuda (the CUDA kernels) check their flags and input files by the same
// rules and in the same words, before any CUDA call. Each case gives both devices the same bad
// input and requires the same exit code and the same error text, so these run in a build with or
// without CUDA and on a machine without a GPU. Both take --json and --csv; where a GPU runs, the
// GPU's report carries the CPU report's keys.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "flashlab/reference/npy.hpp"
#include "flashlab/reference/stream_json.hpp"
#include "flashlab/reference/tensor.hpp"
#include "run_cli.hpp"

namespace fs = std::filesystem;
namespace ref = flashlab::ref;
using flashlab::test::expect_usage_error;
using flashlab::test::fresh_temp_dir;
using flashlab::test::run_cli;

namespace {

// `args` run with --device cpu and with --device cuda: both refuse it with exit 2 and the same
// message, which contains `message`.
void same_error_on_both_devices(const std::string& args, const std::string& message) {
  INFO("flashlab " << args << " --device cpu|cuda");
  const auto cpu = run_cli(args + " --device cpu");
  const auto gpu = run_cli(args + " --device cuda");
  CHECK(cpu.exit_code == 2);
  CHECK(gpu.exit_code == 2);
  CHECK_THAT(cpu.err, Catch::Contains("error: " + message) && Catch::Contains("hint:"));
  CHECK(gpu.err == cpu.err);
  CHECK(cpu.out.empty());
  CHECK(gpu.out.empty());
}

void write_values(const fs::path& file, const std::vector<std::size_t>& shape, std::uint64_t seed) {
  std::size_t n = 1;
  for (auto d : shape) n *= d;
  ref::Tensor<double> t(ref::Shape{1, n, 1, 1});
  ref::fill_normal(t, seed);
  ref::write_npy(file, shape, t.data());
}

// q k v do (and w for MTA) of the given token shape, all finite.
fs::path inputs(const std::string& tag, const std::vector<std::size_t>& shape, bool with_w) {
  const fs::path dir = fresh_temp_dir(tag);
  const char* names[] = {"q.npy", "k.npy", "v.npy", "do.npy"};
  for (std::uint64_t i = 0; i < 4; ++i) write_values(dir / names[i], shape, i + 1);
  if (with_w) write_values(dir / "w.npy", {shape.size() == 3 ? shape[1] : 1, 2, 3}, 9);
  return dir;
}

void write_with(const fs::path& file, const std::vector<std::size_t>& shape, std::size_t flat, double value) {
  std::size_t n = 1;
  for (auto d : shape) n *= d;
  std::vector<double> v(n, 0.25);
  v[flat] = value;
  ref::write_npy(file, shape, v.data());
}

}  // namespace

TEST_CASE("mta on cpu and cuda: the same flags are refused with the same message", "[cli][mta][device]") {
  same_error_on_both_devices("mta fwd --seq 0", "--seq 0 is out of range");
  same_error_on_both_devices("mta fwd --dim 2000", "--dim 2000 is out of range");
  same_error_on_both_devices("mta fwd --ck 2", "--ck 2 is even");
  same_error_on_both_devices("mta fwd --scale -0.5", "--scale must be a positive finite number");
  same_error_on_both_devices("mta fwd --seed -1", "--seed -1 is out of range");
  same_error_on_both_devices("mta fwd --memory-limit 0", "--memory-limit '0' is not a size");
  same_error_on_both_devices("mta bwd --seq 4096 --heads 256 --dim 1024 --batch 256 --memory-limit 8G", "mta bwd on [B, N, H, D]");
  same_error_on_both_devices("mta bwd --block 4", "--block 4 leaves no effective tile for mta bwd");
  same_error_on_both_devices("mta infer --cq 17 --block 64", "--cq 17 is too large for mta infer");
  same_error_on_both_devices("mta both", "unknown mode 'both'");
}

TEST_CASE("mta on cpu and cuda: one dtype, non-finite and shape rule for the input files", "[cli][mta][device]") {
  const std::vector<std::size_t> shape{16, 1, 4};
  const fs::path dir = inputs("siblings_mta", shape, true);
  const std::string cmd = "mta fwd --inputs '" + dir.string() + "'";
  SECTION("NaN and Inf are named with the file and the first index") {
    write_with(dir / "k.npy", shape, 13, std::numeric_limits<double>::quiet_NaN());
    same_error_on_both_devices(cmd, (dir / "k.npy").string() + ": element [3, 0, 1] (flat index 13) is NaN");
    write_values(dir / "k.npy", shape, 2);
    write_with(dir / "w.npy", {1, 2, 3}, 4, -std::numeric_limits<double>::infinity());
    same_error_on_both_devices(cmd, (dir / "w.npy").string() + ": element [0, 1, 1] (flat index 4) is -Inf");
  }
  SECTION("integer inputs are refused by the one dtype rule") {
    const std::vector<std::int32_t> ints(16 * 4, 1);
    ref::write_npy(dir / "v.npy", shape, ints.data());
    same_error_on_both_devices(cmd, (dir / "v.npy").string() + ": dtype <i4 is not float32 (<f4) or float64 (<f8)");
  }
  SECTION("a flag that disagrees with the files, and a missing file") {
    same_error_on_both_devices(cmd + " --seq 8", "--seq 8 disagrees with");
    fs::remove(dir / "do.npy");
    same_error_on_both_devices("mta bwd --inputs '" + dir.string() + "'", (dir / "do.npy").string() + ": no such file");
  }
  fs::remove_all(dir);
}

TEST_CASE("stream on cpu and cuda: the same flags are refused with the same message", "[cli][stream][device]") {
  const std::string ok = " --block-m 4 --block-n 4 --k 2";
  same_error_on_both_devices("stream estimate --seq 0 --dim 4" + ok, "--seq 0 is out of range");
  same_error_on_both_devices("stream estimate --seq 16 --dim 0" + ok, "--dim 0 is out of range");
  same_error_on_both_devices("stream estimate --seq 16 --dim 4 --block-n 4 --k 2", "--block-m is required");
  same_error_on_both_devices("stream estimate --seq 16 --dim 4 --seed -1" + ok, "--seed -1 is out of range");
  same_error_on_both_devices("stream estimate --seq 16 --dim 4 --threads 0" + ok, "--threads 0 is out of range");
  same_error_on_both_devices("stream estimate --seq 16 --dim 4 --memory-limit 12X" + ok, "--memory-limit '12X' is not a size");
  same_error_on_both_devices("stream apply --seq 16 --dim 4 --format csv" + ok, "--format applies to 'stream trace' only");
  same_error_on_both_devices("stream trace --seq 16 --dim 4 --format xml" + ok, "--format 'xml' is not supported");
  same_error_on_both_devices("stream estimate --seq 16 --dim 4 --mask nowhere.txt" + ok, "--mask nowhere.txt: no such file");
  same_error_on_both_devices("stream search --seq 16 --dim 4" + ok, "unknown stream subcommand 'search'");
}

TEST_CASE("stream on cpu and cuda: one dtype and non-finite rule for the input files", "[cli][stream][device]") {
  const std::vector<std::size_t> shape{16, 4};
  const fs::path dir = inputs("siblings_stream", shape, false);
  const std::string cmd = "stream apply --block-m 4 --block-n 4 --k 2 --inputs '" + dir.string() + "'";
  SECTION("NaN and Inf are named with the file and the first index") {
    write_with(dir / "q.npy", shape, 13, std::numeric_limits<double>::quiet_NaN());
    same_error_on_both_devices(cmd, (dir / "q.npy").string() + ": element [3, 1] (flat index 13) is NaN");
    write_values(dir / "q.npy", shape, 1);
    write_with(dir / "v.npy", shape, 6, std::numeric_limits<double>::infinity());
    same_error_on_both_devices(cmd, (dir / "v.npy").string() + ": element [1, 2] (flat index 6) is +Inf");
  }
  SECTION("integer inputs are refused by the one dtype rule") {
    const std::vector<std::int32_t> ints(16 * 4, 1);
    ref::write_npy(dir / "k.npy", shape, ints.data());
    same_error_on_both_devices(cmd, (dir / "k.npy").string() + ": dtype <i4 is not float32 (<f4) or float64 (<f8)");
  }
  SECTION("an input larger than the memory limit is refused before it is read") {
    // Each device states what it would hold (the GPU path keeps float32 copies and margins).
    for (const char* device : {" --device cpu", " --device cuda"}) {
      const auto r = run_cli(cmd + " --memory-limit 1000" + device);
      CHECK(r.exit_code == 2);
      CHECK_THAT(r.err, Catch::Contains("above the memory limit of 1000 bytes (--memory-limit)"));
    }
  }
  fs::remove_all(dir);
}

TEST_CASE("mta and stream: help names every subcommand and --device, and --device cpu is accepted", "[cli][device]") {
  for (const char* args : {"mta --help", "mta fwd --device cuda --help", "stream --help",
                           "stream estimate --device cuda --help", "traffic mta --help", "traffic stream --help"}) {
    INFO(args);
    const auto r = run_cli(args);
    CHECK(r.exit_code == 0);
    CHECK_THAT(r.out, Catch::Contains("--device"));
  }
  const auto mta = run_cli("mta --help");
  for (const char* word : {"fwd", "bwd", "infer", "--device cpu|cuda", "--allow-nonfinite"}) CHECK_THAT(mta.out, Catch::Contains(word));
  const auto stream = run_cli("stream --help");
  for (const char* word : {"estimate", "apply", "trace", "needles", "--device cpu|cuda", "--allow-nonfinite"})
    CHECK_THAT(stream.out, Catch::Contains(word));
  const auto cpu = run_cli("stream estimate --seq 16 --dim 4 --block-m 4 --block-n 4 --k 2 --device cpu");
  CHECK(cpu.exit_code == 0);
  CHECK_THAT(cpu.out, Catch::Contains("stream estimate  T=16"));
  const auto eq = run_cli("stream estimate --seq 16 --dim 4 --block-m 4 --block-n 4 --k 2 --device=cpu");
  CHECK(eq.exit_code == 0);
  const auto tpu = run_cli("stream estimate --seq 16 --dim 4 --block-m 4 --block-n 4 --k 2 --device tpu");
  CHECK(tpu.exit_code == 2);
  CHECK_THAT(tpu.err, Catch::Contains("--device 'tpu' is unknown"));
}

TEST_CASE("attention on cpu and cuda: the same flags are refused with the same message", "[cli][attention][device]") {
  same_error_on_both_devices("attention fwd --seq 0 --dim 64", "--seq 0 is out of range");
  same_error_on_both_devices("attention fwd --seq 16 --dim 2000", "--dim 2000 is out of range");
  same_error_on_both_devices("attention fwd --seq 16 --dim 64 --heads 0", "--heads 0 is out of range");
  same_error_on_both_devices("attention bwd --seq 16 --dim 64 --batch 5000", "--batch 5000 is out of range");
  same_error_on_both_devices("attention fwd --seq 16 --dim 64 --scale -0.5", "--scale must be a positive finite number");
  same_error_on_both_devices("attention fwd --seq 16 --dim 64 --seed -1", "--seed -1 is out of range");
  same_error_on_both_devices("attention fwd --seq 16 --dim 64 --memory-limit 0", "--memory-limit '0' is not a size");
  same_error_on_both_devices("attention fwd --seq 16 --dim 0", "--dim 0 is out of range");
  same_error_on_both_devices("attention bwd --dim 64", "--seq is required");
  same_error_on_both_devices("attention both --seq 16 --dim 64", "unknown mode 'both'");
  same_error_on_both_devices("attention --seq 16 --dim 64", "missing the mode: fwd or bwd");
  same_error_on_both_devices("attention fwd --inputs /nonexistent-dir", "--inputs /nonexistent-dir is not a directory");
}

TEST_CASE("attention on cpu and cuda: one dtype, non-finite and shape rule for the input files",
          "[cli][attention][device]") {
  const std::vector<std::size_t> shape{16, 1, 64};
  const fs::path dir = inputs("siblings_attention", shape, false);
  const std::string cmd = "attention bwd --inputs '" + dir.string() + "'";
  SECTION("NaN and Inf are named with the file and the first index") {
    write_with(dir / "k.npy", shape, 70, std::numeric_limits<double>::quiet_NaN());
    same_error_on_both_devices(cmd, (dir / "k.npy").string() + ": element [1, 0, 6] (flat index 70) is NaN");
    write_values(dir / "k.npy", shape, 2);
    write_with(dir / "do.npy", shape, 3, -std::numeric_limits<double>::infinity());
    same_error_on_both_devices(cmd, (dir / "do.npy").string() + ": element [0, 0, 3] (flat index 3) is -Inf");
  }
  SECTION("integer inputs are refused by the one dtype rule") {
    const std::vector<std::int32_t> ints(16 * 64, 1);
    ref::write_npy(dir / "v.npy", shape, ints.data());
    same_error_on_both_devices(cmd, (dir / "v.npy").string() + ": dtype <i4 is not float32 (<f4) or float64 (<f8)");
  }
  SECTION("a shape that is no attention operand, a flag that disagrees, a missing file") {
    write_values(dir / "q.npy", {16, 64}, 1);
    same_error_on_both_devices(cmd, (dir / "q.npy").string() + ": shape (16, 64) is not [N, H, D] or [B, N, H, D]");
    write_values(dir / "q.npy", shape, 1);
    write_values(dir / "k.npy", {1, 16, 1, 64}, 2);
    same_error_on_both_devices(cmd, "k.npy is 4-D but q.npy is 3-D");
    write_values(dir / "k.npy", shape, 2);
    same_error_on_both_devices(cmd + " --seq 8", "--seq 8 disagrees with");
    fs::remove(dir / "v.npy");
    same_error_on_both_devices(cmd, (dir / "v.npy").string() + ": no such file");
  }
  fs::remove_all(dir);
}

TEST_CASE("attention --device cuda: the kernels' limits, the build, and --device cpu", "[cli][attention][device]") {
  const std::string ok = " --seq 16 --dim 64";
  expect_usage_error("attention fwd --device cuda --kernel quick" + ok, "--kernel 'quick' is unknown");
  expect_usage_error("attention fwd --device cuda --kernel fast --dtype fp32" + ok, "--dtype 'fp32' is unknown");
  expect_usage_error("attention fwd --device cuda --dtype fp16" + ok, "--dtype applies to --kernel fast");
  expect_usage_error("attention fwd --device cuda --kernel fast --seq 16 --dim 96", "--dim 96 is not 64, 128 or 256");
  expect_usage_error("attention bwd --device cuda --seq 16 --dim 512", "--dim 512 is above 256");
  expect_usage_error("attention fwd --device cuda --seq-k 20" + ok, "--seq-k 20 differs from N = 16: the clear kernels take N_k = N");
  expect_usage_error("attention bwd --device cuda --seq-k 20" + ok,
                     "--seq-k 20 differs from N = 16: the clear kernels take N_k = N");
  expect_usage_error("attention fwd --device cuda --heads 4 --heads-kv 2" + ok,
                     "--heads-kv 2 differs from H = 4: the clear kernels take H_kv = H");
  expect_usage_error("attention fwd --device cuda --kernel fast --heads 4 --heads-kv 3" + ok,
                     "--heads-kv: heads_kv (H_kv) = 3 does not divide");
  // Windows: the fast kernels take them (the CPU command's --window, one spelling; the fast
  // backward's front door names the kernels that refuse one), the clear kernels refuse them naming
  // the flag.
  expect_usage_error("attention fwd --device cuda --window 8,0" + ok, "--window 8,0: the clear kernels take no window");
  expect_usage_error("attention bwd --device cuda --causal --window 8,0" + ok,
                     "--window 8,0: the clear kernels take no window");
  expect_usage_error("attention fwd --device cuda --kernel fast --window 8" + ok, "--window takes two numbers");
  expect_usage_error("attention fwd --device cuda --kernel fast --window 3,-2" + ok, "--window: '-2'");
  expect_usage_error("attention fwd --device tpu" + ok, "--device 'tpu' is unknown");
  expect_usage_error("attention fwd --device" + ok, "--device '--seq' is unknown");
  // A valid command line: refused by a build without CUDA (exit 2, with the hint), or run.
  for (const char* args : {"attention fwd --device cuda --kernel fast --causal --seq 17 --dim 64",
                           "attention bwd --device=cuda --kernel fast --dtype fp16 --seq 1 --dim 128",
                           "attention fwd --device cuda --kernel fast --causal --seq 40 --seq-k 17 --heads 4 --heads-kv 1 --dim 128",
                           "attention bwd --device cuda --kernel fast --causal --seq 40 --seq-k 17 --heads 4 --heads-kv 1 --dim 128",
                           "attention fwd --device cuda --kernel fast --seq 200 --seq-k 300 --heads 4 --heads-kv 2 --window 40,8 --dim 64",
                           "attention fwd --device cuda --seq 33 --dim 16"}) {
    const auto r = flashlab::test::run_gpu_command(args);
    if (r.exit_code == 0) CHECK_THAT(r.out, Catch::Contains("max error vs naive float64"));
  }
  const auto cpu = run_cli("attention fwd --device cpu --seq 20 --dim 8");
  CHECK(cpu.exit_code == 0);
  CHECK_THAT(cpu.out, Catch::Contains("flashlab attention fwd  variant fa2_fwd"));
  const auto help = run_cli("attention fwd --device cuda --help");
  CHECK(help.exit_code == 0);
  for (const char* word : {"--kernel", "--dtype", "--inputs", "--save", "--window", "2x the rounding floor"})
    CHECK_THAT(help.out, Catch::Contains(word));
  // The CPU command's help names its GPU sibling, as mta's and stream's do.
  const auto cpu_help = run_cli("attention --help");
  CHECK(cpu_help.exit_code == 0);
  CHECK_THAT(cpu_help.out, Catch::Contains("[--device cpu|cuda]") &&
                               Catch::Contains("(flashlab attention fwd --device cuda --help)"));
}

namespace {

// Command lines valid on both devices (small, so that a GPU run is quick).
const char* const kSiblingCommands[] = {
    "attention fwd --seq 33 --dim 64",
    "attention bwd --seq 33 --dim 64 --causal",
    "mta fwd --seq 20 --heads 2 --dim 16",
    "mta bwd --seq 20 --heads 2 --dim 16",
    "mta infer --seq 20 --heads 2 --dim 16",
    "stream estimate --seq 64 --dim 8 --block-m 8 --block-n 8 --k 2",
    "stream apply --seq 64 --dim 8 --block-m 8 --block-n 8 --k 2",
    "stream trace --seq 64 --dim 8 --block-m 8 --block-n 8 --k 2",
};

// Command lines of the GPU kernels alone (--kernel fast), valid in every build.
const char* const kFastCommands[] = {
    "attention fwd --device cuda --kernel fast --causal --seq 65 --dim 64",
    "attention bwd --device cuda --kernel fast --dtype fp16 --seq 65 --dim 128",
    "mta fwd --device cuda --kernel fast --seq 40 --heads 2 --dim 64",
    "mta bwd --device cuda --kernel fast --dtype fp16 --seq 40 --heads 2 --dim 64",
    "stream estimate --device cuda --kernel fast --seq 256 --dim 64 --block-m 64 --block-n 64 --k 2 --heads 2",
    "stream apply --device cuda --kernel fast --seq 256 --dim 64 --block-m 64 --block-n 64 --k 2",
};

}  // namespace

TEST_CASE("attention, mta and stream on cpu and cuda: --json and --csv together are refused alike, before any run",
          "[cli][device][output]") {
  for (const char* args : kSiblingCommands)
    same_error_on_both_devices(std::string(args) + " --json --csv", "--json and --csv exclude each other");
  for (const char* args : kFastCommands)
    expect_usage_error(std::string(args) + " --json --csv", "--json and --csv exclude each other");
  // Before the inputs are looked at: a directory that does not exist is not reached.
  expect_usage_error("mta fwd --device cuda --inputs /nonexistent-dir --json --csv", "--json and --csv exclude each other");
  expect_usage_error("attention fwd --device cuda --inputs /nonexistent-dir --json --csv",
                     "--json and --csv exclude each other");
  // The --device cuda help lists both, as the CPU commands' help does.
  for (const char* args : {"attention bwd --device cuda --help", "mta infer --device cuda --help",
                           "stream trace --device cuda --help"}) {
    INFO(args);
    const auto r = run_cli(args);
    CHECK(r.exit_code == 0);
    CHECK_THAT(r.out, Catch::Contains("--json") && Catch::Contains("--csv") && Catch::Contains("[--json|--csv]"));
  }
}

#ifndef FLASHLAB_TEST_HAVE_CUDA
TEST_CASE("attention, mta and stream --device cuda: a build without CUDA refuses them whatever the output",
          "[cli][device][output]") {
  for (const char* output : {"", " --json", " --csv"}) {
    for (const char* args : kSiblingCommands)
      expect_usage_error(std::string(args) + " --device cuda" + output, "this flashlab was built without CUDA");
    for (const char* args : kFastCommands)
      expect_usage_error(std::string(args) + output, "this flashlab was built without CUDA");
  }
}
#else
namespace {

// The keys of a --json report: every member name, nested ones dotted (config.seq).
void collect_keys(const ref::json::Value& v, const std::string& prefix, std::vector<std::string>& out) {
  if (v.kind() != ref::json::Value::Kind::object) return;
  for (const auto& k : v.keys()) {
    const std::string name = prefix.empty() ? k : prefix + "." + k;
    out.push_back(name);
    collect_keys(v.at(k), name, out);
  }
}

}  // namespace

TEST_CASE("attention, mta and stream --device cuda: --json carries the CPU command's keys, --csv a header and rows",
          "[cli][device][output]") {
  // The CPU report's keys that are the same quantity on the GPU (cmd_*_cuda.cpp).
  const std::vector<std::pair<std::string, std::vector<std::string>>> shared = {
      {"attention", {"command", "variant", "precision", "config.seq", "config.heads", "config.head_dim", "config.causal",
                     "config.scale", "config.dtype", "error_metric", "errors", "tolerance", "nan", "within_tolerance", "ok"}},
      {"mta", {"command", "shape.seq", "shape.dim", "cq", "ck", "block", "splits", "scale", "tiling", "errors",
               "tolerances", "dtype", "passed"}},
      {"stream", {"command", "T", "d", "block_m", "block_n", "k", "n_q", "n_k", "n_it", "mask", "indices_checksum",
                  "empty_entries", "validity_invariant", "saved"}},
  };
  for (const char* args : kSiblingCommands) {
    INFO(args);
    const auto gpu = run_cli(std::string(args) + " --device cuda --json");
    if (gpu.exit_code != 0) {  // no usable GPU here
      CHECK(gpu.exit_code == 1);
      CHECK(gpu.out.empty());
      continue;
    }
    const auto cpu = run_cli(std::string(args) + " --device cpu --json");
    REQUIRE(cpu.exit_code == 0);
    std::vector<std::string> gpu_keys, cpu_keys;
    collect_keys(ref::json::parse(gpu.out, "gpu report"), "", gpu_keys);
    collect_keys(ref::json::parse(cpu.out, "cpu report"), "", cpu_keys);
    const std::string family = std::string(args).substr(0, std::string(args).find(' '));
    for (const auto& [name, keys] : shared) {
      if (name != family) continue;
      for (const auto& key : keys) {
        INFO(key);
        CHECK(std::find(cpu_keys.begin(), cpu_keys.end(), key) != cpu_keys.end());
        CHECK(std::find(gpu_keys.begin(), gpu_keys.end(), key) != gpu_keys.end());
      }
    }
    for (const char* key : {"device", "device_name", "kernel"})
      CHECK(std::find(gpu_keys.begin(), gpu_keys.end(), key) != gpu_keys.end());
    const auto csv = run_cli(std::string(args) + " --device cuda --csv");
    REQUIRE(csv.exit_code == 0);
    CHECK_THAT(csv.out, Catch::StartsWith("command,"));
    CHECK(std::count(csv.out.begin(), csv.out.end(), '\n') >= 2);
  }
}
#endif
