// `flashlab lesson …` end to end: the real binary, a private XDG_STATE_HOME per test so that
// progress never touches the user's own state.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "run_cli.hpp"

using flashlab::test::fresh_temp_dir;
using flashlab::test::run_cli;

namespace {

// Points XDG_STATE_HOME at a fresh directory for the duration of one test.
struct PrivateState {
  std::string dir = fresh_temp_dir("xdg");
  PrivateState() { ::setenv("XDG_STATE_HOME", dir.c_str(), 1); }
  ~PrivateState() { std::filesystem::remove_all(dir); }
};

std::string write(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string path = dir + "/" + name;
  std::ofstream(path) << text;
  return path;
}

const char* kProblem1 =
    "LOAD a[0][0], R0\nLOAD b[0][0], R1\nMAC_Z R0, R1, R2\nLOAD a[0][1], R0\nLOAD b[1][0], R1\n"
    "MAC R0, R1, R2, R2\nSTORE R2, c[0][0]\n";

}  // namespace

TEST_CASE("cli lesson: list shows every lesson and where to start", "[cli][lesson]") {
  PrivateState st;
  auto r = run_cli("lesson list");
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("[ ] 1 ") && Catch::Contains("welford") && Catch::Contains("fa1-order") &&
                        Catch::Contains("Next: flashlab lesson show 1"));
}

TEST_CASE("cli lesson: a correct Problem 1 passes, exit 0, and is remembered", "[cli][lesson]") {
  PrivateState st;
  const auto dir = fresh_temp_dir("lesson");
  const auto file = write(dir, "p1.trace", kProblem1);
  auto r = run_cli("lesson check 1 '" + file + "'");
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("PASSED") && Catch::Contains("cycles") && Catch::Contains("target 7"));
  CHECK(std::filesystem::exists(st.dir + "/flashlab/progress"));
  auto l = run_cli("lesson list");
  CHECK_THAT(l.out, Catch::Contains("[x] 1 ") && Catch::Contains("Next: flashlab lesson show 2"));
  auto s = run_cli("lesson solution 1");
  CHECK(s.exit_code == 0);
  CHECK_THAT(s.out, Catch::Contains("MAC R0, R1, R2, R2"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("cli lesson: wrong, over budget and not assembling give exit 1, 1, 2", "[cli][lesson][errors]") {
  PrivateState st;
  const auto dir = fresh_temp_dir("lesson");
  auto wrong = run_cli("lesson check 1 '" + write(dir, "w.trace", "LOAD a[0][0], R0\nLOAD b[0][0], R1\nMAC_Z R0, R1, R2\nSTORE R2, c[0][0]\n") + "'");
  CHECK(wrong.exit_code == 1);
  CHECK_THAT(wrong.out, Catch::Contains("c[0][0] is wrong") && Catch::Contains("got a00·b00"));
  auto over = run_cli("lesson check 1 '" + write(dir, "o.trace", std::string("LOAD a[0][0], R0\n") + kProblem1) + "'");
  CHECK(over.exit_code == 1);
  CHECK_THAT(over.out, Catch::Contains("OVER BUDGET") && Catch::Contains("reads a00 again, but R0 already holds it"));
  auto bad = run_cli("lesson check 1 '" + write(dir, "b.trace", "LOAD a[0][0], R7\n") + "'");
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.err, Catch::Contains("b.trace:1:") && Catch::Contains("R7") && Catch::Contains("hint:"));
  // Not passed: nothing remembered, and the solution stays hidden.
  CHECK_THAT(run_cli("lesson list").out, Catch::Contains("[ ] 1 "));
  auto sol = run_cli("lesson solution 1");
  CHECK(sol.exit_code == 2);
  CHECK_THAT(sol.err, Catch::Contains("--spoil"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("cli lesson: formula answers are checked by value", "[cli][lesson]") {
  PrivateState st;
  auto ok = run_cli("lesson answer 4 'writes = n; reads = n + 2n'");
  CHECK(ok.exit_code == 0);
  CHECK_THAT(ok.out, Catch::Contains("PASSED"));
  auto wrong = run_cli("lesson answer 5 '3n; n'");
  CHECK(wrong.exit_code == 1);
  CHECK_THAT(wrong.out, Catch::Contains("reads: wrong") && Catch::Contains("at n=5: expected 10, got 15"));
  auto bad = run_cli("lesson answer 5 'reads=2m'");
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.err, Catch::Contains("unknown name 'm'") && Catch::Contains("hint:"));
  auto flash = run_cli("lesson answer ai-flash 'flops=4dn^2; kv=2n*n*d/Br; ai=2Br'");
  CHECK(flash.exit_code == 0);
  auto choice = run_cli("lesson answer why-dw '(b)'");
  CHECK(choice.exit_code == 0);
  auto kw = run_cli("lesson answer contraction the contraction with V");
  CHECK(kw.exit_code == 0);
}

TEST_CASE("cli lesson: hints come one at a time, and bad ids and actions are usage errors", "[cli][lesson][errors]") {
  PrivateState st;
  auto h1 = run_cli("lesson hint 1");
  CHECK(h1.exit_code == 0);
  CHECK_THAT(h1.out, Catch::Contains("hint 1 of 3") && !Catch::Contains("hint 2 of 3"));
  auto h2 = run_cli("lesson hint 1");
  CHECK_THAT(h2.out, Catch::Contains("hint 2 of 3") && !Catch::Contains("hint 1 of 3") &&
                        Catch::Contains("--level 2"));
  auto both = run_cli("lesson hint 1 --level 2");
  CHECK_THAT(both.out, Catch::Contains("hint 1 of 3") && Catch::Contains("hint 2 of 3"));
  auto lv = run_cli("lesson hint 1 --level 9");
  CHECK(lv.exit_code == 2);
  CHECK_THAT(lv.err, Catch::Contains("--level"));
  auto id = run_cli("lesson show 99");
  CHECK(id.exit_code == 2);
  CHECK_THAT(id.err, Catch::Contains("no lesson '99'") && Catch::Contains("hint:"));
  auto act = run_cli("lesson frob");
  CHECK(act.exit_code == 2);
  CHECK_THAT(act.err, Catch::Contains("unknown action 'frob'"));
  auto missing = run_cli("lesson check 1 /nonexistent/x.trace");
  CHECK(missing.exit_code == 2);
  CHECK_THAT(missing.err, Catch::Contains("FILE: '/nonexistent/x.trace': no such file"));
  auto help = run_cli("lesson --help");
  CHECK(help.exit_code == 0);
  CHECK_THAT(help.out, Catch::Contains("check ID FILE"));
}

TEST_CASE("cli lesson: a budget that is a quiz answer stays hidden until answered", "[cli][lesson]") {
  PrivateState st;
  auto before = run_cli("lesson show 2");
  REQUIRE(before.exit_code == 0);
  CHECK_THAT(before.out, Catch::Contains("budget: fewer than four times Problem 1"));
  CHECK_THAT(before.out, !Catch::Contains("25"));
  CHECK_THAT(before.out, !Catch::Contains("13 LOADs"));
  // Over the budget: said, but not by how much.
  const auto dir = fresh_temp_dir("lesson");
  std::string four_times;
  for (const char* c : {"c[0][0]", "c[0][1]", "c[1][0]", "c[1][1]"}) {
    const std::string i(1, c[2]), j(1, c[5]);
    four_times += "LOAD a[" + i + "][0], R0\nLOAD b[0][" + j + "], R1\nMAC_Z R0, R1, R2\nLOAD a[" + i +
                  "][1], R0\nLOAD b[1][" + j + "], R1\nMAC R0, R1, R2, R2\nSTORE R2, " + c + "\n";
  }
  auto over = run_cli("lesson check 2 '" + write(dir, "p2.trace", four_times) + "'");
  CHECK(over.exit_code == 1);
  CHECK_THAT(over.out, Catch::Contains("over the budget") && !Catch::Contains("25"));
  REQUIRE(run_cli("lesson answer 2 25").exit_code == 0);
  CHECK_THAT(run_cli("lesson show 2").out, Catch::Contains("target: 25 cycles, 13 LOADs"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("cli lesson: the traffic chapter is listed and its table runs without a GPU", "[cli][lesson][traffic]") {
  PrivateState st;
  auto list = run_cli("lesson list");
  CHECK_THAT(list.out, Catch::Contains("traffic-fwd") && Catch::Contains("traffic-bwd") &&
                           Catch::Contains("traffic-levels"));
  auto table = run_cli("traffic levels");
  REQUIRE(table.exit_code == 0);
  CHECK_THAT(table.out, Catch::Contains("B=1 N=4096 H=16 d=64 Br=64 Bc=32 fp32") && Catch::Contains("fa2_fwd") &&
                            Catch::Contains("bwd_atomic") && Catch::Contains("measured: 20") &&
                            Catch::Contains("H100"));
  // The other families' rows, at their own shapes.
  CHECK_THAT(table.out, Catch::Contains("mta at B=1 N=2048") && Catch::Contains("mta bwd") &&
                            Catch::Contains("stream at T=32768") && Catch::Contains("stream apply"));
  // The why is the quiz: shown only after it is answered.
  CHECK_THAT(table.out, !Catch::Contains("served from L2"));
  REQUIRE(run_cli("lesson answer traffic-levels 'rereads=64; why=the re-reads hit in the L2 cache'").exit_code == 0);
  CHECK_THAT(run_cli("traffic levels").out, Catch::Contains("served from L2"));
  auto csv = run_cli("traffic levels --measured-csv out.csv");
  CHECK(csv.exit_code == 2);
  CHECK_THAT(csv.err, Catch::Contains("--measured-csv needs --device cuda"));
  auto families = run_cli("traffic levels --families-csv out.csv");
  CHECK(families.exit_code == 2);
  CHECK_THAT(families.err, Catch::Contains("--families-csv needs --device cuda"));
}

TEST_CASE("cli run: an output that is NaN or inf is warned about", "[cli][run]") {
  const auto dir = fresh_temp_dir("run");
  auto r = run_cli("run '" + write(dir, "e.trace", "LOAD x[0], R0\nEXP R0, R0\nSTORE R0, out[0]\n") +
                   "' --machine softmax3 --n 1 --inputs x=800");
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.err, Catch::Contains("warning: out[0] is inf"));
  auto fine = run_cli("run '" + write(dir, "f.trace", "LOAD x[0], R0\nSTORE R0, out[0]\n") + "' --machine softmax3 --n 1");
  CHECK_THAT(fine.err, !Catch::Contains("warning"));
  std::filesystem::remove_all(dir);
}
