// `flashlab stream estimate|apply|trace` end to end: files written, determinism across
// thread counts, the dense check, mask files, and the errors for bad flags and inputs.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "flashlab/reference/npy.hpp"
#include "run_cli.hpp"

namespace fs = std::filesystem;
using flashlab::test::fresh_temp_dir;
using flashlab::test::read_text;
using flashlab::test::run_cli;

namespace {

void write_inputs(const fs::path& dir, std::size_t T, std::size_t D, std::size_t k_rows) {
  std::vector<double> q(T * D), k(k_rows * D), v(T * D);
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = 0.1 * double((i * 7) % 13) - 0.6;
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = 0.1 * double((i * 5) % 11) - 0.5;
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = double((i * 3) % 7) - 3.0;
  flashlab::ref::write_npy(dir / "q.npy", {T, D}, q.data());
  flashlab::ref::write_npy(dir / "k.npy", {k_rows, D}, k.data());
  flashlab::ref::write_npy(dir / "v.npy", {T, D}, v.data());
}

}  // namespace

TEST_CASE("cli stream: --help names the subcommands and the flags", "[cli][stream]") {
  auto r = run_cli("stream --help");
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("estimate") && Catch::Contains("apply") && Catch::Contains("trace") &&
                        Catch::Contains("--mask") && Catch::Contains("--threads"));
}

TEST_CASE("cli stream: estimate writes indices.npy [n_q, k], valid under causality", "[cli][stream]") {
  const auto dir = fresh_temp_dir("stream_est");
  auto r = run_cli("stream estimate --seq 203 --dim 8 --block-m 8 --block-n 6 --k 4 --seed 3 --save " + dir);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("validity invariant holds"));
  const auto a = flashlab::ref::read_npy(fs::path(dir) / "indices.npy");
  CHECK(a.descr == "<i8");
  REQUIRE(a.shape == std::vector<std::size_t>{26, 4});  // n_q = ⌈203/8⌉
  const auto I = a.as_int64();
  for (std::size_t q = 0; q < 26; ++q) {
    const std::int64_t causal_last = std::int64_t(std::min<std::size_t>(202, (q + 1) * 8 - 1) / 6);
    bool empty_seen = false;
    for (std::size_t j = 0; j < 4; ++j) {
      const std::int64_t v = I[q * 4 + j];
      INFO("q=" << q << " j=" << j << " v=" << v);
      if (v < 0) {
        CHECK(v == -1);
        empty_seen = true;
        continue;
      }
      CHECK_FALSE(empty_seen);
      CHECK(v <= causal_last);
    }
  }
}

TEST_CASE("cli stream: identical outputs for 1, 2 and 4 threads", "[cli][stream][determinism]") {
  std::string est_ref, o_ref, e_ref;
  for (int threads : {1, 2, 4}) {
    const auto dir = fresh_temp_dir("stream_thr");
    const std::string common = " --seq 300 --dim 16 --block-m 12 --block-n 10 --k 3 --seed 9 --threads " + std::to_string(threads) + " --save " + dir;
    REQUIRE(run_cli("stream estimate" + common).exit_code == 0);
    REQUIRE(run_cli("stream apply" + common).exit_code == 0);
    REQUIRE(run_cli("stream trace" + common).exit_code == 0);
    const auto est = read_text(fs::path(dir) / "indices.npy"), o = read_text(fs::path(dir) / "o.npy"),
               e = read_text(fs::path(dir) / "edges.npy");
    REQUIRE(!est.empty());
    REQUIRE(!o.empty());
    REQUIRE(!e.empty());
    if (threads == 1) {
      est_ref = est;
      o_ref = o;
      e_ref = e;
    } else {
      INFO("threads=" << threads);
      CHECK(est == est_ref);
      CHECK(o == o_ref);
      CHECK(e == e_ref);
    }
  }
}

TEST_CASE("cli stream: apply from --inputs writes o.npy and passes the dense check", "[cli][stream]") {
  const auto dir = fresh_temp_dir("stream_in");
  write_inputs(dir, 45, 5, 45);
  auto r = run_cli("stream apply --block-m 4 --block-n 3 --k 2 --precision double --check --inputs " + dir + " --save " + dir);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("T=45 d=5") && Catch::Contains("PASS"));
  const auto o = flashlab::ref::read_npy(fs::path(dir) / "o.npy");
  CHECK(o.descr == "<f8");
  CHECK(o.shape == std::vector<std::size_t>{45, 5});
  // --json reports the same check as data.
  auto j = run_cli("stream apply --block-m 4 --block-n 3 --k 2 --precision double --check --json --inputs " + dir);
  REQUIRE(j.exit_code == 0);
  CHECK_THAT(j.out, Catch::Contains("\"passed\": true") && Catch::Contains("\"validity_invariant\": true") &&
                        Catch::Contains("\"indices_checksum\""));
}

TEST_CASE("cli stream: trace writes a structured .npy or a CSV edge list", "[cli][stream]") {
  const auto dir = fresh_temp_dir("stream_trace");
  REQUIRE(run_cli("stream trace --seq 40 --dim 4 --block-m 4 --block-n 4 --k 2 --save " + dir).exit_code == 0);
  const std::string npy = read_text(fs::path(dir) / "edges.npy");
  CHECK_THAT(npy, Catch::Contains("('q', '<i8')") && Catch::Contains("('mass', '<f8')") &&
                      Catch::Contains("('value_norm', '<f8')"));
  // n_q = 10; block 0 has one valid block, the others ≥ 2 → 1 + 9·2 = 19 records of 48 bytes.
  CHECK_THAT(npy, Catch::Contains("(19,)"));
  CHECK(npy.size() % 64 == (19 * 48) % 64);
  REQUIRE(run_cli("stream trace --seq 40 --dim 4 --block-m 4 --block-n 4 --k 2 --format csv --save " + dir).exit_code == 0);
  std::ifstream csv(fs::path(dir) / "edges.csv");
  std::string line;
  std::getline(csv, line);
  CHECK(line == "q,r,slot,score,mass,value_norm");
  std::size_t rows = 0;
  while (std::getline(csv, line)) ++rows;
  CHECK(rows == 19);
}

TEST_CASE("cli stream: a text mask with an all-zero row gives an all-empty row of I", "[cli][stream]") {
  const auto dir = fresh_temp_dir("stream_mask");
  // T = 16, b = 4: n_q = n_k = 4. Row 2 masks everything.
  std::ofstream(fs::path(dir) / "mask.txt") << "1111\n1111\n0000\n1011\n";
  auto r = run_cli("stream estimate --seq 16 --dim 4 --block-m 4 --block-n 4 --k 2 --mask " + dir + "/mask.txt --json");
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("[\n      -1,\n      -1\n    ]"));
  CHECK_THAT(r.out, Catch::Contains("\"validity_invariant\": true"));
}

TEST_CASE("cli stream: bad flags and inputs are usage errors naming the flag or file", "[cli][stream][errors]") {
  struct Bad {
    std::string args, expect;
  };
  const auto dir = fresh_temp_dir("stream_err");
  write_inputs(dir, 20, 3, 19);  // k.npy has one row too few
  std::ofstream(fs::path(dir) / "bad.txt") << "1111\n1z11\n1111\n1111\n";
  const std::string ok = " --seq 16 --dim 4 --block-m 4 --block-n 4 --k 2";
  const Bad bad[] = {
      {"stream", "missing subcommand"},
      {"stream frob" + ok, "unknown stream subcommand 'frob'"},
      {"stream estimate --seq 16 --dim 4 --block-n 4 --k 2", "--block-m is required"},
      {"stream estimate --dim 4 --block-m 4 --block-n 4 --k 2", "--seq is required"},
      {"stream estimate --seq 16 --dim 4 --block-m 4 --block-n 4 --k 0", "--k 0 is out of range"},
      {"stream estimate --seq 16 --dim 4 --block-m -3 --block-n 4 --k 2", "--block-m -3 is out of range"},
      {"stream estimate --seq abc --dim 4 --block-m 4 --block-n 4 --k 2", "seq"},
      {"stream estimate" + ok + " --threads 0", "--threads 0 is out of range"},
      {"stream estimate" + ok + " --precision half", "--precision 'half'"},
      {"stream estimate" + ok + " --dtype fp64", "--dtype is not a flag of this command; use --precision"},
      {"stream estimate" + ok + " --format csv", "--format applies to 'stream trace' only"},
      {"stream trace" + ok + " --format xml", "--format 'xml'"},
      {"stream estimate" + ok + " --mask " + dir + "/none.npy", "none.npy: no such file"},
      {"stream estimate" + ok + " --mask " + dir + "/bad.txt", "bad.txt:2:2"},
      {"stream estimate --block-m 4 --block-n 4 --k 2 --inputs " + dir, "k.npy: has 19 rows, expected T = 20"},
      {"stream estimate --block-m 4 --block-n 4 --k 2 --seq 21 --inputs " + dir, "q.npy: has 20 rows, expected T = 21"},
      {"stream estimate --block-m 4 --block-n 4 --k 2 --inputs " + dir + "/nowhere", "--inputs"},
      {"stream apply --seq 20000 --dim 4 --block-m 64 --block-n 64 --k 2 --check", "--check computes dense attention"},
      {"stream estimate" + ok + " --bogus 1", "bogus"},
  };
  for (const auto& b : bad) {
    auto r = run_cli(b.args);
    INFO(b.args << "\n" << r.err);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Catch::Contains(b.expect) && Catch::Contains("hint:"));
  }
  // A q.npy without its v.npy: apply names the missing file.
  const auto dir2 = fresh_temp_dir("stream_err2");
  write_inputs(dir2, 20, 3, 20);
  fs::remove(fs::path(dir2) / "v.npy");
  auto r = run_cli("stream apply --block-m 4 --block-n 4 --k 2 --inputs " + dir2);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Catch::Contains("v.npy"));
  CHECK(run_cli("stream estimate --block-m 4 --block-n 4 --k 2 --inputs " + dir2).exit_code == 0);  // estimate needs no V
}

TEST_CASE("cli stream: --kernel chooses clear or fast, and fast runs on the GPU (the trace into a store only)", "[cli][stream][errors]") {
  struct Bad {
    std::string args, expect;
  };
  const std::string ok = " --seq 256 --dim 64 --block-m 64 --block-n 64 --k 2";
  const Bad bad[] = {
      {"stream estimate --device cuda --kernel turbo" + ok, "--kernel 'turbo' is unknown"},
      {"stream trace --device cuda --kernel fast" + ok, "the fast trace writes a trace store"},
      {"stream needles --kernel fast --seq 16384 --dim 128 --block-m 64 --block-n 64 --k 16", "--kernel fast runs on the GPU"},
      {"stream needles --device cuda --kernel slow --seq 16384 --dim 128 --block-m 64 --block-n 64 --k 16", "--kernel 'slow'"},
  };
  for (const auto& b : bad) {
    auto r = run_cli(b.args);
    INFO(b.args << "\n" << r.err);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Catch::Contains(b.expect) && Catch::Contains("hint:"));
  }
  // The fast trace exists, but writes a trace store: the refusal of an edge list says where it is.
  CHECK_THAT(run_cli("stream trace --device cuda --kernel fast" + ok).err, Catch::Contains("hint: add --store DIR"));
}
