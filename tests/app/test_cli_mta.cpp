// `flashlab mta fwd|bwd|infer`: runs, output, --inputs/--save round trips and usage errors.
#include <catch2/catch.hpp>

#include "flashlab/reference/npy.hpp"
#include "flashlab/reference/tensor.hpp"
#include "run_cli.hpp"

#include <filesystem>
#include <limits>
#include <string>
#include <vector>

using flashlab::test::fresh_temp_dir;
using flashlab::test::run_cli;
namespace ref = flashlab::ref;
namespace fs = std::filesystem;

namespace {

// Writes q, k, v, do ([N, H, D], no batch) and w ([H, cq, ck]) drawn exactly as `flashlab mta`
// draws them for --seed 0 (seed·8 + 1 … + 5; w with stddev 0.5), so a run from the files and a
// run from the same random seed must agree bit for bit.
void write_seeded_inputs(const fs::path& dir, std::size_t n, std::size_t h, std::size_t d, std::size_t cq,
                         std::size_t ck) {
  const ref::Shape s{1, n, h, d};
  const char* names[] = {"q.npy", "k.npy", "v.npy", "do.npy"};
  for (int i = 0; i < 4; ++i) {
    ref::Tensor<double> t(s);
    ref::fill_normal(t, std::uint64_t(i + 1));
    ref::write_npy(dir / names[i], {n, h, d}, t.data());
  }
  ref::Tensor<double> w(ref::Shape{1, h * cq * ck, 1, 1});
  ref::fill_normal(w, 5, 0.5);
  ref::write_npy(dir / "w.npy", {h, cq, ck}, w.data());
}

std::vector<double> values(const fs::path& file) { return ref::read_npy(file).as_double(); }

}  // namespace

TEST_CASE("cli mta: fwd prints the error against naive and the traffic table", "[cli][mta]") {
  auto r = run_cli("mta fwd --seq 37 --heads 2 --dim 8 --cq 3 --ck 5 --block 12");
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("Br=10 Bc=8 Tr=4 Tc=5"));
  CHECK_THAT(r.out, Catch::Contains("ok") && Catch::Contains("closed-form formula (mta_traffic.hpp): equal"));
  CHECK_THAT(r.out, Catch::Contains("  O ") && Catch::Contains("  M ") && Catch::Contains("flops"));
  CHECK(r.err.empty());
}

TEST_CASE("cli mta: bwd --json reports every gradient and passes", "[cli][mta]") {
  auto r = run_cli("mta bwd --seq 21 --heads 1 --dim 4 --cq 2 --ck 3 --block 9 --batch 2 --json");
  CHECK(r.exit_code == 0);
  for (const char* key : {"\"dQ\"", "\"dK\"", "\"dV\"", "\"dW\"", "\"passed\": true", "\"formula_equal\": true"})
    CHECK_THAT(r.out, Catch::Contains(key));
  CHECK_THAT(r.out, !Catch::Contains("null"));  // an error of NaN would be written as null
}

TEST_CASE("cli mta: infer with splits has the partials and the combine step", "[cli][mta]") {
  auto r = run_cli("mta infer --seq 50 --splits 4 --block 8 --dtype bf16");
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("O_s") && Catch::Contains("M_s") && Catch::Contains("bf16"));
  auto one = run_cli("mta infer --seq 50 --splits 1 --block 8");
  CHECK(one.exit_code == 0);
  CHECK_THAT(one.out, !Catch::Contains("O_s"));
}

TEST_CASE("cli mta: --inputs reads the files and --save writes the results", "[cli][mta]") {
  const fs::path in = fresh_temp_dir("mta_in"), a = fresh_temp_dir("mta_a"), b = fresh_temp_dir("mta_b");
  write_seeded_inputs(in, 13, 2, 3, 2, 3);
  auto from_files = run_cli("mta bwd --block 7 --inputs '" + in.string() + "' --save '" + a.string() + "'");
  REQUIRE(from_files.exit_code == 0);
  auto from_seed = run_cli("mta bwd --seq 13 --heads 2 --dim 3 --cq 2 --ck 3 --block 7 --seed 0 --save '" +
                           b.string() + "'");
  REQUIRE(from_seed.exit_code == 0);
  // Same inputs → same outputs; the file run mirrors the 3-D input rank.
  CHECK(ref::read_npy(a / "o.npy").shape == std::vector<std::size_t>{13, 2, 3});
  CHECK(ref::read_npy(b / "o.npy").shape == std::vector<std::size_t>{1, 13, 2, 3});
  CHECK(ref::read_npy(a / "dw.npy").shape == std::vector<std::size_t>{2, 2, 3});
  for (const char* f : {"o.npy", "dq.npy", "dk.npy", "dv.npy", "dw.npy"}) {
    INFO(f);
    CHECK(values(a / f) == values(b / f));
  }
  fs::remove_all(in);
  fs::remove_all(a);
  fs::remove_all(b);
}

TEST_CASE("cli mta: one token with a 1x1 kernel of 1 returns V itself", "[cli][mta]") {
  // N = 1: the only visible key is token 0, so O = V whatever Q, K and the scale are.
  const fs::path in = fresh_temp_dir("mta_one"), out = fresh_temp_dir("mta_one_out");
  const std::vector<double> q = {0.3, -1.0}, k = {2.0, 0.5}, v = {1.25, -7.5}, w = {1.0};
  ref::write_npy(in / "q.npy", {1, 1, 1, 2}, q.data());
  ref::write_npy(in / "k.npy", {1, 1, 1, 2}, k.data());
  ref::write_npy(in / "v.npy", {1, 1, 1, 2}, v.data());
  ref::write_npy(in / "w.npy", {1, 1, 1}, w.data());
  auto r = run_cli("mta fwd --block 1 --inputs '" + in.string() + "' --save '" + out.string() + "'");
  REQUIRE(r.exit_code == 0);
  CHECK(values(out / "o.npy") == v);
  fs::remove_all(in);
  fs::remove_all(out);
}

TEST_CASE("cli mta: usage errors name the flag and hint", "[cli][mta][errors]") {
  struct Bad {
    const char* args;
    const char* message;
  };
  const Bad cases[] = {
      {"mta", "missing mode"},
      {"mta sideways", "unknown mode 'sideways'"},
      {"mta fwd --ck 4", "--ck 4 is even"},
      {"mta fwd --seq 0", "--seq 0 is out of range"},
      {"mta fwd --seq -3", "--seq -3 is out of range"},
      {"mta fwd --dim 0", "--dim 0 is out of range"},
      {"mta fwd --heads 0", "--heads 0 is out of range"},
      {"mta fwd --batch 0", "--batch 0 is out of range"},
      {"mta fwd --splits 0", "--splits 0 is out of range"},
      {"mta fwd --ck 3 --block 2", "--block 2 leaves no effective tile"},
      {"mta fwd --cq 5 --ck 1 --block 4", "--block 4 leaves no effective tile"},
      {"mta bwd --ck 3 --block 4", "--block 4 leaves no effective tile for mta bwd"},
      {"mta infer --cq 17 --block 64", "--cq 17 is too large"},
      {"mta fwd --dtype fp8", "--dtype"},
      {"mta fwd --frobnicate", "frobnicate"},
      {"mta fwd --seq abc", "seq"},
      {"mta fwd --block 2000", "--block 2000 is out of range"},
      {"mta fwd --seq 4096 --heads 256 --dim 1024 --memory-limit 4G", "above the memory limit of 4.00 GiB"},
      {"mta fwd --scale -1", "--scale must be a positive finite number"},
      {"mta fwd --scale 0", "--scale must be a positive finite number"},
      {"mta fwd --seed -1", "--seed -1 is out of range"},
      {"mta fwd --memory-limit lots", "--memory-limit 'lots' is not a size"},
  };
  for (const auto& c : cases) {
    INFO(c.args);
    auto r = run_cli(c.args);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Catch::Contains(c.message) && Catch::Contains("hint:"));
    CHECK(r.out.empty());
  }
  auto bwd = run_cli("mta bwd --ck 3 --block 4");
  CHECK_THAT(bwd.err, Catch::Contains("4*Pk = 4"));
}

TEST_CASE("cli mta: bad input files are named", "[cli][mta][errors]") {
  const fs::path in = fresh_temp_dir("mta_bad");
  write_seeded_inputs(in, 9, 2, 3, 2, 3);
  const std::string dir = " --inputs '" + in.string() + "'";
  SECTION("k.npy of another shape") {
    std::vector<double> k(8 * 2 * 3, 0.5);
    ref::write_npy(in / "k.npy", {8, 2, 3}, k.data());
    auto r = run_cli("mta fwd" + dir);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Catch::Contains("k.npy") && Catch::Contains("differs from q.npy"));
  }
  SECTION("w.npy with the wrong head count") {
    std::vector<double> w(6, 0.1);
    ref::write_npy(in / "w.npy", {1, 2, 3}, w.data());
    auto r = run_cli("mta fwd" + dir);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Catch::Contains("w.npy") && Catch::Contains("HEAD_NUM = 2"));
  }
  SECTION("w.npy with an even ck") {
    std::vector<double> w(2 * 2 * 2, 0.1);
    ref::write_npy(in / "w.npy", {2, 2, 2}, w.data());
    auto r = run_cli("mta fwd" + dir);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Catch::Contains("w.npy") && Catch::Contains("ck = 2 is even"));
  }
  SECTION("a flag that disagrees with the files") {
    auto r = run_cli("mta fwd --seq 99" + dir);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Catch::Contains("--seq 99 disagrees with") && Catch::Contains("q.npy"));
    auto rc = run_cli("mta fwd --ck 5" + dir);
    CHECK_THAT(rc.err, Catch::Contains("--ck 5 disagrees with") && Catch::Contains("w.npy"));
  }
  SECTION("bwd without do.npy") {
    fs::remove(in / "do.npy");
    auto r = run_cli("mta bwd" + dir);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Catch::Contains("do.npy"));
  }
  SECTION("NaN in q.npy") {
    std::vector<double> q(9 * 2 * 3, 0.0);
    q[4] = std::numeric_limits<double>::quiet_NaN();
    ref::write_npy(in / "q.npy", {9, 2, 3}, q.data());
    auto r = run_cli("mta fwd" + dir);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Catch::Contains("q.npy: element [0, 1, 1] (flat index 4) is NaN") &&
                          Catch::Contains("--allow-nonfinite"));
  }
  SECTION("a directory that does not exist") {
    auto r = run_cli("mta fwd --inputs '" + (in / "nope").string() + "'");
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Catch::Contains("--inputs") && Catch::Contains("not a directory"));
  }
  fs::remove_all(in);
}
