// `flashlab attention fwd|bwd` and `flashlab traffic attention`, end to end: output, saved .npy
// files, exit codes, and the errors for bad flags and bad input files.
#include <catch2/catch.hpp>

#include "flashlab/reference/npy.hpp"
#include "run_cli.hpp"

#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

using flashlab::test::fresh_temp_dir;
using flashlab::test::expect_usage_error;
using flashlab::test::run_cli;
namespace fs = std::filesystem;
namespace ref = flashlab::ref;

namespace {


// A [N, H, D] float64 array with values f(n, h, k).
template <typename F>
void write3(const fs::path& file, std::size_t N, std::size_t H, std::size_t D, F f) {
  std::vector<double> v(N * H * D);
  for (std::size_t n = 0; n < N; ++n)
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t k = 0; k < D; ++k) v[(n * H + h) * D + k] = f(n, h, k);
  ref::write_npy(file, {N, H, D}, v.data());
}

}  // namespace

TEST_CASE("cli attention: fwd prints errors and a traffic table equal to the formula", "[cli][attention]") {
  for (const char* variant : {"fa2", "fa1", "naive"}) {
    INFO(variant);
    const auto r = run_cli(std::string("attention fwd --seq 37 --dim 16 --heads 2 --block-m 8 --block-n 5 --causal --variant ") +
                           variant);
    CHECK(r.exit_code == 0);
    CHECK_THAT(r.out, Catch::Contains("max error vs naive float64") && Catch::Contains("tolerance 1e-05: ok") &&
                          Catch::Contains("counted == formula: yes") && Catch::Contains("LSE"));
    CHECK_FALSE(Catch::Contains("MISMATCH").match(r.out));
  }
  const auto d = run_cli("attention fwd --seq 20 --dim 8 --block-m 8 --block-n 3 --precision double");
  CHECK(d.exit_code == 0);
  CHECK_THAT(d.out, Catch::Contains("tolerance 1e-12: ok"));
}

TEST_CASE("cli attention: bwd variants print per-kernel traffic and the D identity", "[cli][attention]") {
  const auto two = run_cli("attention bwd --seq 29 --dim 8 --heads 2 --batch 2 --block-m 8 --block-n 6 --causal");
  CHECK(two.exit_code == 0);
  CHECK_THAT(two.out, Catch::Contains("D preprocessing") && Catch::Contains("dQ kernel") &&
                          Catch::Contains("dK/dV kernel") && Catch::Contains("D identity") &&
                          Catch::Contains("counted == formula: yes"));
  const auto atomic = run_cli("attention bwd --seq 29 --dim 8 --block-m 8 --block-n 6 --variant atomic --precision double");
  CHECK(atomic.exit_code == 0);
  CHECK_THAT(atomic.out, Catch::Contains("dQ+dK/dV kernel") && Catch::Contains("tolerance 1e-12: ok"));
  const auto naive = run_cli("attention bwd --seq 9 --dim 4 --variant naive");
  CHECK(naive.exit_code == 0);
  CHECK_THAT(naive.out, Catch::Contains("dS") && Catch::Contains("dP"));
}

TEST_CASE("cli attention: --json is one object with errors and traffic", "[cli][attention]") {
  const auto r = run_cli("attention fwd --seq 16 --dim 8 --block-m 4 --block-n 8 --json --dtype bf16");
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::StartsWith("{") && Catch::Contains("\"counts_equal_formula\": true") &&
                        Catch::Contains("\"ok\": true") && Catch::Contains("\"dtype\": \"bf16\"") &&
                        Catch::Contains("\"tensor\": \"K\""));
}

TEST_CASE("cli attention: --inputs and --save round-trip through .npy files", "[cli][attention][npy]") {
  // Q = 0 makes every score equal, so O row i is the mean of the V rows it may see: all of them,
  // or V[0..i] with causal. That pins the result without a second implementation.
  const std::size_t N = 7, H = 2, D = 3;
  const std::string in = fresh_temp_dir("attn_in"), out = fresh_temp_dir("attn_out");
  write3(fs::path(in) / "q.npy", N, H, D, [](auto, auto, auto) { return 0.0; });
  write3(fs::path(in) / "k.npy", N, H, D, [](auto n, auto h, auto k) { return std::sin(double(n + 3 * h + 7 * k)); });
  write3(fs::path(in) / "v.npy", N, H, D, [](auto n, auto h, auto k) { return double(n) + 10.0 * double(h) + 0.5 * double(k); });
  const auto r = run_cli("attention bwd --causal --block-m 3 --block-n 2 --precision double --inputs '" + in + "' --save '" + out + "'");
  REQUIRE(r.exit_code == 0);
  for (const char* f : {"o.npy", "lse.npy", "dq.npy", "dk.npy", "dv.npy"}) CHECK(fs::exists(fs::path(out) / f));
  const auto o = ref::read_npy(fs::path(out) / "o.npy");
  REQUIRE(o.shape == std::vector<std::size_t>{N, H, D});
  CHECK(o.descr == "<f8");
  const auto ov = o.as_double();
  for (std::size_t n = 0; n < N; ++n)
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t k = 0; k < D; ++k) {
        const double mean_v = double(n) / 2.0 + 10.0 * double(h) + 0.5 * double(k);  // mean of 0..n
        CHECK(ov[(n * H + h) * D + k] == Approx(mean_v).epsilon(1e-12));
      }
  const auto lse = ref::read_npy(fs::path(out) / "lse.npy");
  REQUIRE(lse.shape == std::vector<std::size_t>{H, N});
  CHECK(lse.as_double()[3] == Approx(std::log2(4.0)).epsilon(1e-12));  // row 3 sees 4 equal scores of 0
  const auto dq = ref::read_npy(fs::path(out) / "dq.npy");
  CHECK(dq.shape == std::vector<std::size_t>{N, H, D});

  // float precision saves float32
  const auto rf = run_cli("attention fwd --inputs '" + in + "' --save '" + out + "'");
  CHECK(rf.exit_code == 0);
  CHECK(ref::read_npy(fs::path(out) / "o.npy").descr == "<f4");
}

TEST_CASE("cli attention: the Triton walkthrough's NaN hazard shows without the KV mask in fp16 arithmetic", "[cli][attention][fp16]") {
  // Scores near −20 (base 2) make LSE ≈ −18; the padded keys of the last Bc = 4 tile (N_k = 5)
  // then give 2^18 > 65504 → Inf in fp16, and Inf·0 = NaN in dQ when they are not masked.
  const std::string in = fresh_temp_dir("attn_nan");
  write3(fs::path(in) / "q.npy", 6, 1, 16, [](auto n, auto, auto k) { return -3.5 + 0.01 * double((n + k) % 3); });
  write3(fs::path(in) / "k.npy", 5, 1, 16, [](auto n, auto, auto k) { return 1.0 + 0.01 * double((n * k) % 5); });
  write3(fs::path(in) / "v.npy", 5, 1, 16, [](auto n, auto, auto k) { return std::cos(double(n + k)); });
  write3(fs::path(in) / "do.npy", 6, 1, 16, [](auto n, auto, auto k) { return std::sin(double(n * 16 + k)); });
  const std::string base = "attention bwd --precision double --block-m 4 --block-n 4 --fp16-arithmetic --inputs '" + in + "'";
  const auto bad = run_cli(base + " --drop-kv-mask");
  CHECK(bad.exit_code == 1);
  CHECK_THAT(bad.out, Catch::Contains("NaN in the result") && Catch::Contains("KV mask DROPPED") &&
                         Catch::Contains("NaN: yes (FAILED)"));
  const auto good = run_cli(base);
  CHECK(good.exit_code == 0);
  CHECK_THAT(good.out, Catch::Contains("NaN: none"));
}

TEST_CASE("cli attention: bad flags are usage errors naming the flag", "[cli][attention][errors]") {
  expect_usage_error("attention", "missing the mode");
  expect_usage_error("attention sideways --seq 4 --dim 4", "unknown mode 'sideways'");
  expect_usage_error("attention fwd --dim 4", "--seq is required");
  // --dim defaults to 64, as in every command (docs/cli-flags.md)
  CHECK(run_cli("attention fwd --seq 4").exit_code == 0);
  expect_usage_error("attention fwd --seq 0 --dim 4", "--seq 0 is out of range");
  expect_usage_error("attention fwd --seq -4 --dim 4", "--seq");
  expect_usage_error("attention fwd --seq 4 --dim abc", "--dim");
  expect_usage_error("attention fwd --seq 4 --dim 4 --block-n 0", "--block-n: Bc = 0 must be at least 1");
  expect_usage_error("attention fwd --seq 4 --dim 4 --block-m -2", "--block-m");
  expect_usage_error("attention fwd --seq 4 --dim 4 --heads 0", "--heads 0");
  expect_usage_error("attention bwd --seq 4 --dim 4 --variant fa1", "--variant 'fa1' is a forward loop order");
  expect_usage_error("attention fwd --seq 4 --dim 4 --variant atomic", "--variant 'atomic' is a backward design");
  expect_usage_error("attention fwd --seq 4 --dim 4 --variant fa3", "--variant 'fa3'");
  expect_usage_error("attention fwd --seq 4 --dim 4 --dtype fp8", "--dtype 'fp8'");
  expect_usage_error("attention fwd --seq 4 --dim 4 --precision half", "--precision 'half'");
  expect_usage_error("attention fwd --seq 4 --dim 4 --drop-kv-mask", "apply to bwd only");
  expect_usage_error("attention fwd --seq 4 --dim 4 --frobnicate", "frobnicate");
}

TEST_CASE("cli attention: bad input files are errors naming the file", "[cli][attention][errors][npy]") {
  const std::string dir = fresh_temp_dir("attn_bad");
  const fs::path p(dir);
  expect_usage_error("attention fwd --inputs '" + dir + "/nope'", "is not a directory");
  expect_usage_error("attention fwd --inputs '" + dir + "'", "q.npy");  // missing q.npy
  const double two_d[4] = {1, 2, 3, 4};
  ref::write_npy(p / "q.npy", {2, 2}, two_d);
  expect_usage_error("attention fwd --inputs '" + dir + "'", "q.npy: shape (2, 2) is not [N, H, D]");
  write3(p / "q.npy", 4, 1, 8, [](auto, auto, auto) { return 0.5; });
  expect_usage_error("attention fwd --inputs '" + dir + "'", "k.npy");  // missing k.npy
  write3(p / "k.npy", 4, 1, 6, [](auto, auto, auto) { return 0.5; });
  write3(p / "v.npy", 4, 1, 6, [](auto, auto, auto) { return 0.5; });
  expect_usage_error("attention fwd --inputs '" + dir + "'", "k.npy: head dim is 6 but q.npy has 8");
  write3(p / "k.npy", 4, 1, 8, [](auto, auto, auto) { return 0.5; });
  write3(p / "v.npy", 3, 1, 8, [](auto, auto, auto) { return 0.5; });
  expect_usage_error("attention fwd --inputs '" + dir + "'", "v.npy: sequence length is 3 but k.npy has 4");
  const std::int32_t ints[4 * 8] = {};
  ref::write_npy(p / "v.npy", {4, 1, 8}, ints);
  expect_usage_error("attention fwd --inputs '" + dir + "'", "v.npy: dtype <i4 is not float32");
  write3(p / "v.npy", 4, 1, 8, [](auto, auto, auto) { return 0.5; });
  expect_usage_error("attention fwd --inputs '" + dir + "' --seq 5", "--seq 5 disagrees with");
  CHECK(run_cli("attention fwd --inputs '" + dir + "'").exit_code == 0);
}

TEST_CASE("cli traffic attention: naive vs FA1 vs FA2 side by side, table and CSV", "[cli][traffic]") {
  // N = 64, d = 16, Br = 16, Bc = 32, fp32 (elements × 4):
  //   naive 20544 elements (Q, K, V, O 1024 each; S, P written and read 4096 each; LSE 64) = 82176 B
  //   FA1    7488 elements (K, V 1024; Q 2048; O read 1024, written 2048; m, l 64 each way; LSE 64) = 29952 B
  //   FA2   10304 elements (Q, O 1024; K, V 4 query tiles × 1024; LSE 64) = 41216 B
  const auto csv = run_cli("traffic attention --seq 64,128 --dim 16 --block-m 16 --block-n 32 --csv");
  CHECK(csv.exit_code == 0);
  CHECK_THAT(csv.out, Catch::StartsWith("seq,heads,head_dim,block_m,block_n,causal,dtype,naive_bytes,fa1_bytes,fa2_bytes"));
  CHECK_THAT(csv.out, Catch::Contains("\n64,1,16,16,32,0,fp32,82176,29952,41216,"));
  CHECK_THAT(csv.out, Catch::Contains("\n128,1,16,16,32,0,fp32,"));
  const auto table = run_cli("traffic attention --seq 64 --dim 16 --block-m 16 --block-n 32");
  CHECK(table.exit_code == 0);
  CHECK_THAT(table.out, Catch::Contains("82176") && Catch::Contains("29952") && Catch::Contains("41216") &&
                            Catch::Contains("naive/fa2"));
  const auto per = run_cli("traffic attention --seq 64 --dim 16 --block-m 16 --block-n 32 --variant atomic --csv");
  CHECK(per.exit_code == 0);
  CHECK_THAT(per.out, Catch::Contains("bwd_atomic,64,dQ+dK/dV kernel,dQ,"));
  const auto bwd = run_cli("traffic attention --seq 64 --variant bwd --causal");
  CHECK(bwd.exit_code == 0);
  CHECK_THAT(bwd.out, Catch::Contains("two_kernel") && Catch::Contains("atomic"));
}

TEST_CASE("cli traffic attention: bad flags are usage errors naming the flag", "[cli][traffic][errors]") {
  expect_usage_error("traffic", "missing what to model");
  expect_usage_error("traffic softmax --seq 4", "unknown traffic subject 'softmax'");
  expect_usage_error("traffic attention", "--seq is required");
  expect_usage_error("traffic attention --seq 1024,x", "--seq: 'x'");
  expect_usage_error("traffic attention --seq 0", "--seq: '0'");
  expect_usage_error("traffic attention --seq 1024,,2048", "--seq: ''");
  expect_usage_error("traffic attention --seq 64 --dim 0", "--dim 0 is out of range");
  expect_usage_error("traffic attention --seq 64 --block-m 0", "--block-m: Br = 0 must be at least 1");
  expect_usage_error("traffic attention --seq 64 --heads -1", "--heads");
  expect_usage_error("traffic attention --seq 64 --dtype fp64x", "--dtype 'fp64x'");
  expect_usage_error("traffic attention --seq 64 --variant fa9", "--variant 'fa9'");
  expect_usage_error("traffic attention --seq 64 --device tpu", "--device 'tpu'");
#ifndef FLASHLAB_TEST_HAVE_CUDA
  expect_usage_error("traffic attention --seq 64 --device cuda", "built without CUDA");
#endif
}
