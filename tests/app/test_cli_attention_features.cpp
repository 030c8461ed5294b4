// `flashlab attention fwd|bwd` with grouped K/V (--heads-kv), N_k ≠ N (--seq-k), sliding windows
// (--window L,R) and packed sequences (--cu-seqlens FILE), end to end: the self-check and the
// traffic table keep working, packed .npy files round-trip, and bad flags and files are usage
// errors naming the flag (and FILE:line:col).
#include <catch2/catch.hpp>

#include "flashlab/reference/npy.hpp"
#include "run_cli.hpp"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

using flashlab::test::expect_usage_error;
using flashlab::test::fresh_temp_dir;
using flashlab::test::run_cli;
namespace fs = std::filesystem;
namespace ref = flashlab::ref;

namespace {

std::string write_text(const std::string& dir, const std::string& name, const std::string& text) {
  const fs::path p = fs::path(dir) / name;
  std::ofstream(p) << text;
  return p.string();
}

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

TEST_CASE("cli attention: grouped K/V, N_k and a window pass the self-check", "[cli][attention]") {
  for (const char* mode : {"fwd", "bwd"}) {
    for (const char* variant : {"naive", "fa2"}) {
      INFO(mode << " " << variant);
      const auto r = run_cli(std::string("attention ") + mode + " --seq 21 --seq-k 30 --dim 8 --heads 8 --heads-kv 2 " +
                             "--causal --window 6,0 --block-m 8 --block-n 5 --variant " + variant);
      CHECK(r.exit_code == 0);
      CHECK_THAT(r.out, Catch::Contains("B=1 N=21 N_k=30 H=8 H_kv=2 d=8 Br=8 Bc=5 causal window=6,0") &&
                            Catch::Contains("tolerance 1e-05: ok") && Catch::Contains("counted == formula: yes"));
      CHECK_FALSE(Catch::Contains("MISMATCH").match(r.out));
    }
  }
  const auto fa1 = run_cli("attention fwd --seq 9 --seq-k 4 --dim 4 --heads 4 --heads-kv 1 --causal --variant fa1 --json");
  CHECK(fa1.exit_code == 0);
  CHECK_THAT(fa1.out, Catch::Contains("\"heads_kv\": 1") && Catch::Contains("\"window_left\": -1") &&
                          Catch::Contains("\"packed\": false") && Catch::Contains("\"ok\": true"));
}

TEST_CASE("cli attention: --cu-seqlens packs sequences of lengths 0 and 1 too", "[cli][attention][varlen]") {
  const std::string dir = fresh_temp_dir("attn_cu");
  const std::string file = write_text(dir, "lens.txt",
                                      "# five sequences: 3, 0, 1, 9, 2 queries\n"
                                      "cu_seqlens_q = 0 3 3 4 13 15\n"
                                      "cu_seqlens_k = 0,5,  6,6, 18 ,20   # keys: 5, 1, 0, 12, 2\n");
  for (const char* mode : {"fwd", "bwd"}) {
    for (const char* variant : {"naive", "fa2", "atomic"}) {
      if (std::string(mode) == "fwd" && std::string(variant) == "atomic") continue;
      INFO(mode << " " << variant);
      const auto r = run_cli(std::string("attention ") + mode + " --cu-seqlens '" + file +
                             "' --dim 8 --heads 4 --heads-kv 2 --causal --window 3,-1 --block-m 4 --block-n 3 --variant " +
                             variant + " --precision double");
      CHECK(r.exit_code == 0);
      CHECK_THAT(r.out, Catch::Contains("B=5 N=9 N_k=12 packed total_q=15 total_k=20 H=4 H_kv=2") &&
                            Catch::Contains("tolerance 1e-12: ok") && Catch::Contains("counted == formula: yes"));
    }
  }
  const auto j = run_cli("attention fwd --cu-seqlens '" + file + "' --dim 4 --json");
  CHECK(j.exit_code == 0);
  CHECK_THAT(j.out, Catch::Contains("\"packed\": true") && Catch::Contains("\"total_q\": 15") &&
                        Catch::Contains("\"total_k\": 20") && Catch::Contains("\"batch\": 5"));
}

TEST_CASE("cli attention: packed grouped .npy inputs round-trip with the sequences kept apart", "[cli][attention][npy]") {
  // Q = 0 makes every score equal, so O row i of a sequence is the mean of that sequence's V rows
  // (no mask): V row n of K/V head g holds n + 10·g, so the mean is k_start + (len_k − 1)/2 + 10·g.
  // A sequence without keys gets O = 0 and LSE = −inf.
  const std::vector<int> cu_q = {0, 2, 3, 3, 7}, cu_k = {0, 4, 4, 5, 11};
  const std::size_t H = 4, Hkv = 2, D = 3, total_q = 7, total_k = 11;
  const std::string in = fresh_temp_dir("attn_pk_in"), out = fresh_temp_dir("attn_pk_out");
  const std::string file = write_text(in, "cu.txt", "cu_seqlens_q = 0 2 3 3 7\ncu_seqlens_k = 0 4 4 5 11\n");
  write3(fs::path(in) / "q.npy", total_q, H, D, [](auto, auto, auto) { return 0.0; });
  write3(fs::path(in) / "k.npy", total_k, Hkv, D, [](auto n, auto h, auto k) { return std::sin(double(n + 3 * h + 7 * k)); });
  write3(fs::path(in) / "v.npy", total_k, Hkv, D, [](auto n, auto h, auto) { return double(n) + 10.0 * double(h); });
  const auto r = run_cli("attention bwd --precision double --block-m 2 --block-n 3 --cu-seqlens '" + file +
                         "' --inputs '" + in + "' --save '" + out + "'");
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("H=4 H_kv=2"));
  const auto o = ref::read_npy(fs::path(out) / "o.npy");
  REQUIRE(o.shape == std::vector<std::size_t>{total_q, H, D});
  const auto lse = ref::read_npy(fs::path(out) / "lse.npy");
  REQUIRE(lse.shape == std::vector<std::size_t>{H, total_q});
  const auto dk = ref::read_npy(fs::path(out) / "dk.npy");
  CHECK(dk.shape == std::vector<std::size_t>{total_k, Hkv, D});
  const auto ov = o.as_double(), lv = lse.as_double();
  for (std::size_t b = 0; b + 1 < cu_q.size(); ++b) {
    const int len_k = cu_k[b + 1] - cu_k[b];
    for (int n = cu_q[b]; n < cu_q[b + 1]; ++n) {
      for (std::size_t h = 0; h < H; ++h) {
        INFO("sequence " << b << " row " << n << " head " << h);
        if (len_k == 0) {
          CHECK(lv[h * total_q + std::size_t(n)] == -std::numeric_limits<double>::infinity());
        } else {
          CHECK(lv[h * total_q + std::size_t(n)] == Approx(std::log2(double(len_k))).epsilon(1e-12));
        }
        const double mean = len_k == 0 ? 0.0 : cu_k[b] + (len_k - 1) / 2.0 + 10.0 * double(h / (H / Hkv));
        for (std::size_t k = 0; k < D; ++k) CHECK(ov[(std::size_t(n) * H + h) * D + k] == Approx(mean).epsilon(1e-12));
      }
    }
  }
}

TEST_CASE("cli attention: bad --heads-kv, --window and --cu-seqlens are usage errors naming the flag",
          "[cli][attention][errors]") {
  expect_usage_error("attention fwd --seq 8 --dim 4 --heads 6 --heads-kv 4", "--heads-kv: heads_kv (H_kv) = 4 does not divide");
  expect_usage_error("attention fwd --seq 8 --dim 4 --heads-kv 0", "--heads-kv 0 is out of range");
  expect_usage_error("attention fwd --seq 8 --dim 4 --window 3", "--window takes two numbers");
  expect_usage_error("attention fwd --seq 8 --dim 4 --window 3,-2", "--window: '-2'");
  expect_usage_error("attention fwd --seq 8 --dim 4 --window 3,x", "--window: 'x'");
  expect_usage_error("attention fwd --seq 8 --dim 4 --window 1,2,3", "--window takes two numbers");

  const std::string dir = fresh_temp_dir("attn_cu_bad");
  const auto cu = [&](const std::string& name, const std::string& text) {
    std::string quoted = "'";  // appended, not "'" + path: GCC 12 reports a false -Wrestrict there
    quoted += write_text(dir, name, text);
    return quoted += "'";
  };
  const std::string ok = cu("ok.txt", "cu_seqlens_q = 0 3 5\n");
  expect_usage_error("attention fwd --dim 4 --seq 3 --cu-seqlens " + ok, "--seq conflicts with --cu-seqlens");
  expect_usage_error("attention fwd --dim 4 --seq-k 3 --cu-seqlens " + ok, "--seq-k conflicts with --cu-seqlens");
  expect_usage_error("attention fwd --dim 4 --batch 2 --cu-seqlens " + ok, "--batch conflicts with --cu-seqlens");
  expect_usage_error("attention fwd --dim 4 --cu-seqlens '" + dir + "/missing.txt'", "--cu-seqlens");
  expect_usage_error("attention fwd --dim 4 --cu-seqlens " + cu("syntax.txt", "# lengths\ncu_seqlens_q = 0 3x 5\n"),
                     "syntax.txt:2:18: '3x' is not an integer");
  expect_usage_error("attention fwd --dim 4 --cu-seqlens " + cu("name.txt", "cu_seqlen_q = 0 3\n"),
                     "name.txt:1:1: unknown name 'cu_seqlen_q'");
  expect_usage_error("attention fwd --dim 4 --cu-seqlens " + cu("eq.txt", "cu_seqlens_q 0 3\n"),
                     "eq.txt:1:14: expected '=' after cu_seqlens_q");
  expect_usage_error("attention fwd --dim 4 --cu-seqlens " + cu("twice.txt", "cu_seqlens_q = 0 3\ncu_seqlens_q = 0 4\n"),
                     "twice.txt:2:1: cu_seqlens_q is given twice (first on line 1)");
  expect_usage_error("attention fwd --dim 4 --cu-seqlens " + cu("empty.txt", "cu_seqlens_q =\n"),
                     "empty.txt:1:15: cu_seqlens_q lists no numbers");
  expect_usage_error("attention fwd --dim 4 --cu-seqlens " + cu("nokeys.txt", "cu_seqlens_k = 0 3\n"),
                     "nokeys.txt has no cu_seqlens_q line");
  expect_usage_error("attention fwd --dim 4 --cu-seqlens " + cu("big.txt", "cu_seqlens_q = 0 99999999999\n"),
                     "big.txt:1:18: 99999999999 does not fit an int32 prefix sum");
  expect_usage_error("attention fwd --dim 4 --cu-seqlens " + cu("down.txt", "cu_seqlens_q = 0 3 5\ncu_seqlens_k = 0 4 2\n"),
                     "down.txt:2: cu_seqlens_k[2] = 2 is below cu_seqlens_k[1] = 4");
  expect_usage_error("attention fwd --dim 4 --cu-seqlens " + cu("start.txt", "cu_seqlens_q = 2 3 5\n"),
                     "start.txt:1: cu_seqlens_q[0] = 2 is not 0");
  expect_usage_error("attention fwd --dim 4 --cu-seqlens " + cu("count.txt", "cu_seqlens_q = 0 3 5\ncu_seqlens_k = 0 4\n"),
                     "count.txt:2: cu_seqlens_k has 2 entries but cu_seqlens_q has 3");
  expect_usage_error("attention fwd --dim 4 --cu-seqlens " + cu("long.txt", "cu_seqlens_q = 0 9000\n"),
                     "--cu-seqlens: the longest sequence has 9000 rows, above 8192");

  // Packed .npy inputs must hold exactly the rows the file gives; K/V heads must divide Q's.
  const std::string in = fresh_temp_dir("attn_cu_inputs");
  write3(fs::path(in) / "q.npy", 6, 4, 2, [](auto, auto, auto) { return 0.5; });
  write3(fs::path(in) / "k.npy", 5, 3, 2, [](auto, auto, auto) { return 0.5; });
  write3(fs::path(in) / "v.npy", 5, 3, 2, [](auto, auto, auto) { return 0.5; });
  expect_usage_error("attention fwd --inputs '" + in + "' --cu-seqlens " + ok, "q.npy: 1 x 6 rows do not hold the 5 rows");
  expect_usage_error("attention fwd --inputs '" + in + "'", "k.npy: heads is 3, which does not divide the 4 heads");
}

TEST_CASE("cli attention --device cuda and bench attention: --cu-seqlens, one file format, its conflicts",
          "[cli][attention][varlen][device]") {
  const std::string dir = fresh_temp_dir("attn_cu_gpu");
  const std::string file = write_text(dir, "lens.txt", "cu_seqlens_q = 0 3 3 4 140\ncu_seqlens_k = 0 5 6 6 200\n");
  const std::string bad = write_text(dir, "bad.txt", "cu_seqlens_q = 0 3 2 7\n");
  const std::string cu = " --cu-seqlens '" + file + "'";
  // The lengths come from the file; the fast kernels alone take packed sequences on the GPU (the
  // backward on the atomic design's mma and wgmma-ws kernels).
  expect_usage_error("attention fwd --device cuda --kernel fast --seq 16" + cu, "--seq conflicts with --cu-seqlens");
  expect_usage_error("attention fwd --device cuda --kernel fast --batch 2" + cu, "--batch conflicts with --cu-seqlens");
  expect_usage_error("attention bwd --device cuda" + cu, "--cu-seqlens: the clear kernels take none");
  expect_usage_error("attention fwd --device cuda" + cu, "--cu-seqlens: the clear kernels take none");
  // A bad list: the CPU command's message, naming the file, its line and the entry.
  expect_usage_error("attention fwd --device cuda --kernel fast --cu-seqlens '" + bad + "'",
                     "cu_seqlens_q[2] = 2 is below cu_seqlens_q[1] = 3");
  expect_usage_error("bench attention --cu-seqlens '" + bad + "'", "cu_seqlens_q[2] = 2 is below cu_seqlens_q[1] = 3");
  expect_usage_error("bench attention --seq 1024" + cu, "--seq conflicts with --cu-seqlens");
  expect_usage_error("bench attention --pass both --bwd-kernel wgmma-ws-det" + cu,
                     "--cu-seqlens: --bwd-kernel wgmma-ws-det takes no packed sequences");
  expect_usage_error("bench attention --pass bwd --bwd-kernel wgmma-ws-det" + cu,
                     "hint: use --bwd-design two-kernel (deterministic too)");
  // d = 256 takes no packed sequences (forward or backward), refused by both commands alike in
  // every build; d = 256 dense and packed d = 128 pass these flags.
  expect_usage_error("attention fwd --device cuda --kernel fast --dim 256" + cu,
                     "--dim 256 with --cu-seqlens: the fast kernels take packed sequences at d = 64 and 128");
  expect_usage_error("attention bwd --device cuda --kernel fast --dim 256" + cu,
                     "hint: pad the sequences into a dense batch, or drop to --dim 128; the CPU reference takes "
                     "them at any d: --device cpu");
  expect_usage_error("bench attention --pass bwd --dim 128,256" + cu,
                     "--dim 256 with --cu-seqlens: the fast kernels take packed sequences at d = 64 and 128");
#ifndef FLASHLAB_TEST_HAVE_CUDA
  expect_usage_error("bench attention --pass both --dim 128" + cu, "built without CUDA");
  expect_usage_error("attention bwd --device cuda --kernel fast --dim 256 --seq 16", "built without CUDA");
#endif
  expect_usage_error("attention bwd --device cuda --kernel fast --bwd-kernel wgmma-ws-det" + cu,
                     "--cu-seqlens: --bwd-kernel wgmma-ws-det takes no packed sequences: the fast backward takes them "
                     "on the two-kernel design and the atomic design's mma and wgmma-ws kernels");
  expect_usage_error("attention bwd --device cuda --kernel fast --bwd-kernel wgmma-ws-det" + cu,
                     "hint: use --bwd-kernel auto, mma or wgmma-ws");
  // The help says which backward kernels take them, and that --seq-k, --heads-kv and --window are
  // the backward's too.
  const auto help = flashlab::test::run_cli("attention --device cuda --help");
  CHECK(help.exit_code == 0);
  CHECK_THAT(help.out, Catch::Contains("bwd on the mma and wgmma-ws backward kernels, wgmma-ws-det refuses them"));
  CHECK_THAT(help.out, !Catch::Contains("fwd --kernel fast only"));
  // Valid: run where there is a GPU, refused with the usual hint elsewhere.
  const auto r = flashlab::test::run_gpu_command("attention fwd --device cuda --kernel fast --causal --heads 4 "
                                                 "--heads-kv 2 --dim 64" + cu);
  if (r.exit_code == 0)
    CHECK_THAT(r.out, Catch::Contains("4 packed sequences (total_q=140 total_k=200)") &&
                          Catch::Contains("max error vs naive float64"));
  const auto g = flashlab::test::run_gpu_command("attention bwd --device cuda --kernel fast --causal --heads 4 "
                                                 "--heads-kv 2 --dim 64" + cu);
  if (g.exit_code == 0)
    CHECK_THAT(g.out, Catch::Contains("4 packed sequences (total_q=140 total_k=200)") &&
                          (Catch::Contains("backward kernel mma") || Catch::Contains("backward kernel wgmma-ws")) &&
                          Catch::Contains("dQ"));
  const auto b = flashlab::test::run_gpu_command("bench attention --dim 64 --causal --reps 20 --warmup 1 --csv" + cu);
  if (b.exit_code == 0) CHECK_THAT(b.out, Catch::Contains("total_q,total_k") && Catch::Contains(",140,200"));
  const auto bb =
      flashlab::test::run_gpu_command("bench attention --pass bwd --dim 64 --causal --reps 20 --warmup 1 --csv" + cu);
  if (bb.exit_code == 0) CHECK_THAT(bb.out, Catch::Contains(",bwd,64,1,") && Catch::Contains(",140,200"));
}

TEST_CASE("cli attention --device cuda: --bwd-kernel wgmma-ws-det's limits at the flags, as bench attention's",
          "[cli][attention][device]") {
  // At d = 64 and 128 the fixed-order kernel takes no window, grouped K/V or N_k != N: refused in
  // every build, in bench attention's words, with this command's way out.
  const std::string det = "attention bwd --device cuda --kernel fast --bwd-kernel wgmma-ws-det --seq 64";
  expect_usage_error(det + " --heads 4 --heads-kv 2",
                     "--heads-kv 2 differs from --heads 4: the fast backward takes grouped K/V on the two-kernel "
                     "design, the atomic design's mma and wgmma-ws kernels, and wgmma-ws-det at --dim 256 "
                     "(--bwd-kernel wgmma-ws-det at --dim 64 and 128 takes H_kv = H)");
  expect_usage_error(det + " --heads 4 --heads-kv 2 --dim 128", "hint: use --bwd-kernel auto, mma or wgmma-ws, or --dim 256");
  expect_usage_error(det + " --seq-k 32", "--seq-k 32 differs from N = 64: the fast backward takes N_k != N");
  expect_usage_error(det + " --window 3,3", "--window 3,3: the fast backward takes a window on");
  const auto bench = flashlab::test::run_cli("bench attention --seq 64 --pass bwd --bwd-kernel wgmma-ws-det --heads 4 "
                                             "--heads-kv 2");
  const auto here = flashlab::test::run_cli(det + " --heads 4 --heads-kv 2");
  CHECK(bench.exit_code == 2);
  CHECK(here.exit_code == 2);
  CHECK(bench.err.substr(0, bench.err.find('\n')) == here.err.substr(0, here.err.find('\n')));
#ifndef FLASHLAB_TEST_HAVE_CUDA
  // At d = 256 it takes all three, and the other kernels take them at any d: past the flags.
  expect_usage_error(det + " --heads 4 --heads-kv 2 --seq-k 32 --window 3,3 --dim 256", "built without CUDA");
  expect_usage_error("attention bwd --device cuda --kernel fast --bwd-kernel mma --seq 64 --heads 4 --heads-kv 2",
                     "built without CUDA");
#endif
}
