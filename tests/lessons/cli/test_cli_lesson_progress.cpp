// `flashlab lesson next | reset`, `lesson check --json | --seed | -` and number answers in the
// program's own notations, end to end: the real binary, a private XDG_STATE_HOME per test so
// that progress never touches the user's own state.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <sys/wait.h>

#include "run_cli.hpp"

using flashlab::test::fresh_temp_dir;
using flashlab::test::run_cli;

namespace {

// A private XDG_STATE_HOME (progress never touches the user's own) and a folder for traces.
class Sandbox {
 public:
  Sandbox() { ::setenv("XDG_STATE_HOME", state_.c_str(), 1); }
  ~Sandbox() {
    std::filesystem::remove_all(state_);
    std::filesystem::remove_all(files_);
  }
  Sandbox(const Sandbox&) = delete;
  Sandbox& operator=(const Sandbox&) = delete;
  [[nodiscard]] const std::string& state() const { return state_; }
  [[nodiscard]] const std::string& files() const { return files_; }
  // Writes `text` to a file of the sandbox; returns its path, quoted for the shell.
  std::string trace(const std::string& name, const std::string& text) const {
    std::ofstream(files_ + "/" + name) << text;
    return "'" + files_ + "/" + name + "'";
  }

 private:
  std::string state_ = fresh_temp_dir("xdg");
  std::string files_ = fresh_temp_dir("lesson");
};

// Problem 1's reference trace, as `lesson solution 1 --spoil` prints it.
std::string problem1() { return run_cli("lesson solution 1 --spoil").out; }

// Problem 6 with one DRAM read fewer than the budget: the 1 for counting is e^(x0 − x0).
// `tail` follows the loop: empty for the right trace, a doubling at n = 1 for a wrong one.
std::string cheaper_mean(const std::string& tail) {
  return "LOAD x[0], r1\nSUB r1, r1, r3\nEXP r3, r3\nMOV r3, r2\nfor i in 1..n-1\n  LOAD x[i], R0\n"
         "  ADD r2, r3, r2\n  SUB R0, r1, R0\n  DIV R0, r2, R0\n  ADD r1, R0, r1\nend\n" +
         tail + "STORE r1, mean\n";
}

}  // namespace

TEST_CASE("cli lesson: next is the first lesson not passed, and reset forgets", "[cli][lesson][progress]") {
  Sandbox box;
  auto first = run_cli("lesson next");
  CHECK(first.exit_code == 0);
  CHECK_THAT(first.out, Catch::StartsWith("Problem 1: compute c00"));
  REQUIRE(run_cli("lesson check 1 " + box.trace("p1.trace", problem1())).exit_code == 0);
  CHECK(std::filesystem::exists(box.state() + "/flashlab/progress"));
  CHECK_THAT(run_cli("lesson next").out, Catch::StartsWith("Problem 2: full 2x2 matmul"));
  CHECK_THAT(run_cli("lesson list").out, Catch::Contains("Next: flashlab lesson show 2   (or: flashlab lesson next)"));
  // Forget lesson 1: it is next again.
  auto reset = run_cli("lesson reset 1");
  CHECK(reset.exit_code == 0);
  CHECK_THAT(reset.out, Catch::Contains("forgot your progress on lesson 1"));
  CHECK_THAT(run_cli("lesson next").out, Catch::StartsWith("Problem 1: compute c00"));
  CHECK_THAT(run_cli("lesson reset 1").out, Catch::Contains("nothing to forget on lesson 1"));
  // Hints seen and answers are forgotten too; --all forgets every lesson.
  REQUIRE(run_cli("lesson hint 2").exit_code == 0);
  REQUIRE(run_cli("lesson answer 2 25").exit_code == 0);
  CHECK_THAT(run_cli("lesson show 2").out, Catch::Contains("1 seen"));
  CHECK(run_cli("lesson reset --all").exit_code == 0);
  CHECK_THAT(run_cli("lesson show 2").out, !Catch::Contains("seen") && Catch::Contains("budget: fewer than four"));
  // Usage errors: neither or both, an unknown lesson, a flag of another action.
  flashlab::test::expect_usage_error("lesson reset", "lesson reset needs a lesson ID or --all");
  flashlab::test::expect_usage_error("lesson reset 1 --all", "not both");
  flashlab::test::expect_usage_error("lesson reset 99", "no lesson '99'");
  flashlab::test::expect_usage_error("lesson next 4", "unexpected argument '4'");
  flashlab::test::expect_usage_error("lesson show 4 --seed 3", "--seed is not an option of lesson show");
  flashlab::test::expect_usage_error("lesson list --json", "--json is not an option of lesson list");
}

TEST_CASE("cli lesson: check --json gives the verdict as one object, with the exit code", "[cli][lesson][json]") {
  Sandbox box;
  auto ok = run_cli("lesson check 1 " + box.trace("p1.trace", problem1()) + " --json");
  CHECK(ok.exit_code == 0);
  CHECK_THAT(ok.out, Catch::StartsWith("{") && Catch::Contains("\"verdict\": \"passed\"") &&
                         Catch::Contains("\"exit_code\": 0") && Catch::Contains("\"metric\": \"cycles\"") &&
                         Catch::Contains("\"target\": 7") && Catch::Contains("\"seed\":"));
  CHECK_THAT(ok.out, !Catch::Contains("Three registers"));  // no prose after the object
  auto wrong = run_cli("lesson check 1 " +
                       box.trace("w.trace", "LOAD a[0][0], R0\nLOAD b[0][0], R1\nMAC_Z R0, R1, R2\nSTORE R2, c[0][0]\n") +
                       " --json");
  CHECK(wrong.exit_code == 1);
  CHECK_THAT(wrong.out, Catch::Contains("\"verdict\": \"wrong\"") && Catch::Contains("c[0][0] is wrong"));
  auto bad = run_cli("lesson check 1 " + box.trace("b.trace", "LOAD a[0][0], R7\n") + " --json");
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.out, Catch::Contains("\"verdict\": \"does-not-assemble\"") && Catch::Contains("R7"));
  // A budget that is a quiz answer stays out of the JSON too.
  auto hidden = run_cli("lesson check 2 " + box.trace("p2.trace", problem1()) + " --json");
  CHECK_THAT(hidden.out, Catch::Contains("\"budget_hidden\": true") && !Catch::Contains("\"target\""));
  auto answer = run_cli("lesson answer 4 'reads=3n; writes=2n' --json");
  CHECK(answer.exit_code == 1);
  CHECK_THAT(answer.out, Catch::Contains("\"all_correct\": false") && Catch::Contains("\"key\": \"writes\""));
}

TEST_CASE("cli lesson: --seed repeats a check, and a trace can come from standard input", "[cli][lesson]") {
  Sandbox box;
  const auto solution = run_cli("lesson solution 4 --spoil");
  REQUIRE(solution.exit_code == 0);
  const auto file = box.trace("p4.trace", solution.out);
  auto a = run_cli("lesson check 4 " + file + " --seed 12345");
  auto b = run_cli("lesson check 4 " + file + " --seed 12345");
  CHECK(a.exit_code == 0);
  CHECK(a.out == b.out);
  CHECK_THAT(a.out, Catch::Contains("(--seed 12345 repeats this check)") && Catch::Contains("at n = 1…24"));
  // `-` reads the trace from standard input (run_cli gives its commands /dev/null there).
  const std::string out = box.files() + "/piped.txt";
  const int status = std::system(("NO_COLOR=1 '" + std::string(FLASHLAB_BIN) + "' lesson check 4 - --seed 12345 <" +
                                  file + " >'" + out + "' 2>&1")
                                     .c_str());
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  std::ifstream piped(out);
  const std::string piped_out((std::istreambuf_iterator<char>(piped)), std::istreambuf_iterator<char>());
  CHECK(piped_out == a.out);
  flashlab::test::expect_usage_error("lesson check 4 " + file + " --seed -3", "--seed");
}

TEST_CASE("cli lesson: number answers in the notations the program prints", "[cli][lesson][answers]") {
  Sandbox box;
  CHECK(run_cli("lesson answer 2 2.5e1").exit_code == 0);
  CHECK(run_cli("lesson answer 2 '2.5E+01'").exit_code == 0);
  // The traffic table prints GB to four significant digits, the messages %.6g.
  CHECK(run_cli("lesson answer traffic-fwd 'naive=4.362 GB; fa1=6.593 GB; fa2=2.181 GB'").exit_code == 0);
  CHECK(run_cli("lesson answer traffic-fwd 'naive=4.36234e+09; fa1=6.59266e+09; fa2=2.1813e+09'").exit_code == 0);
  auto coarse = run_cli("lesson answer traffic-fwd 'naive=4.36 GB; fa1=6.593 GB; fa2=2.181 GB'");
  CHECK(coarse.exit_code == 1);
  CHECK_THAT(coarse.out, Catch::Contains("3 significant digits"));
  flashlab::test::expect_usage_error("lesson answer 2 '25 GB'", "a count, not a number of bytes");
  flashlab::test::expect_usage_error("lesson answer traffic-fwd 'naive=4 XB; fa1=1; fa2=1'", "unknown unit 'XB'");
}

TEST_CASE("cli lesson: only a passed trace is praised for beating its budget", "[cli][lesson]") {
  Sandbox box;
  auto good = run_cli("lesson check 6 " + box.trace("good.trace", cheaper_mean("")));
  CHECK(good.exit_code == 0);
  CHECK_THAT(good.out, Catch::Contains("beats the target n + 1 = 5"));
  auto wrong = run_cli("lesson check 6 " + box.trace("wrong.trace", cheaper_mean("for i in n..1\n  ADD r1, r1, r1\nend\n")));
  CHECK(wrong.exit_code == 1);
  CHECK_THAT(wrong.out, Catch::Contains("mean is wrong at n=1") && !Catch::Contains("beats"));
}
