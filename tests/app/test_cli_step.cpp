// `flashlab step` end to end: the plain table (stdout not a TTY), its errors, and one smoke test
// that drives the real full-screen program inside a private tmux server (80×24).
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>
#include <unistd.h>

#include "run_cli.hpp"

using flashlab::test::fresh_temp_dir;
using flashlab::test::run_cli;

namespace {

std::string write(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string path = dir + "/" + name;
  std::ofstream(path) << text;
  return path;
}

std::string sh(const std::string& cmd) {
  const std::string out = fresh_temp_dir("sh") + "/out";
  const int rc = std::system((cmd + " >'" + out + "' 2>&1").c_str());
  (void)rc;
  std::ifstream in(out);
  std::stringstream ss;
  ss << in.rdbuf();
  std::filesystem::remove_all(std::filesystem::path(out).parent_path());
  return ss.str();
}

const char* kProblem1 =
    "LOAD a[0][0], R0\nLOAD b[0][0], R1\nMAC_Z R0, R1, R2\nLOAD a[0][1], R0\nLOAD b[1][0], R1\n"
    "MAC R0, R1, R2, R2\nSTORE R2, c[0][0]\n";

}  // namespace

TEST_CASE("cli step: without a TTY it prints the lesson's table for lesson 1's worked trace", "[cli][step]") {
  auto r = run_cli("step");
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("MAC R0, R1, R2, R2") && Catch::Contains("c00") && Catch::Contains("cycles"));
}

TEST_CASE("cli step: --plain on a trace, a lesson machine, and the errors", "[cli][step][errors]") {
  const auto dir = fresh_temp_dir("step");
  const auto p1 = write(dir, "p1.trace", kProblem1);
  auto ok = run_cli("step '" + p1 + "' --machine matmul3 --plain --numeric");
  CHECK(ok.exit_code == 0);
  CHECK_THAT(ok.out, Catch::Contains("Step") && Catch::Contains("DRAM reads"));
  auto lesson = run_cli("step --lesson 6 --plain");  // the lesson's starter on its machine file
  CHECK(lesson.exit_code == 0);
  CHECK_THAT(lesson.out, Catch::Contains("LOAD one, r3"));
  auto nomachine = run_cli("step '" + p1 + "'");
  CHECK(nomachine.exit_code == 2);
  CHECK_THAT(nomachine.err, Catch::Contains("--machine is required") && Catch::Contains("hint:"));
  auto bad = run_cli("step '" + write(dir, "bad.trace", "LOAD a[0][0], R9\n") + "' --machine matmul3");
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.err, Catch::Contains("bad.trace:1:") && Catch::Contains("R9"));
  auto fault = run_cli("step '" + write(dir, "f.trace", "MAC_Z R0, R1, R2\n") + "' --machine matmul3");
  CHECK(fault.exit_code == 3);
  CHECK_THAT(fault.err, Catch::Contains("never written"));
  auto lessonbad = run_cli("step --lesson zz");
  CHECK(lessonbad.exit_code == 2);
  CHECK_THAT(lessonbad.err, Catch::Contains("no lesson 'zz'"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("cli step: the full-screen stepper under tmux (80x24): next, back, toggle, goto, end, quit",
          "[cli][step][tmux]") {
  if (std::system("command -v tmux >/dev/null 2>&1") != 0) {
    // Not a silent pass: `make deps` installs tmux, so its absence is a broken environment.
    FAIL("tmux is not installed, so the full-screen smoke test cannot run (apt-get install tmux)");
  }
  const auto dir = fresh_temp_dir("tmux");
  const auto p1 = write(dir, "p1.trace", kProblem1);
  const std::string rcfile = dir + "/rc";
  // A private tmux server (-L): never touches the user's own tmux; killed at the end.
  // (Built with += : GCC 12 warns falsely on long chains of string temporaries, PR105329.)
  std::string tm = "tmux -L flashlab_test_";
  tm += std::to_string(::getpid());
  tm += " ";
  std::string cmd = "'";
  cmd += FLASHLAB_BIN;
  cmd += "' step '";
  cmd += p1;
  cmd += "' --machine matmul3; echo $? > '";
  cmd += rcfile;
  cmd += "'";
  // A known TERM inside the pane (screen's terminfo ships with ncurses-base everywhere).
  const std::string conf = write(dir, "tmux.conf", "set -g default-terminal screen\n");
  REQUIRE(std::system((tm + "-f '" + conf + "' new-session -d -s s -x 80 -y 24 \"" + cmd + "\"").c_str()) == 0);
  auto screen = [&] { return sh(tm + "capture-pane -p -t s"); };
  // Polls the pane until every string in `want` shows up: the program needs a moment to draw,
  // and a capture can catch a frame half redrawn, so waiting for one marker is not enough.
  auto wait_for = [&](const std::vector<std::string>& want) {
    std::string s;
    for (int i = 0; i < 100; ++i) {
      s = screen();
      bool all = true;
      for (const auto& w : want) all = all && s.find(w) != std::string::npos;
      if (all) return s;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return s;
  };
  auto keys = [&](const std::string& k) { REQUIRE(std::system((tm + "send-keys -t s " + k).c_str()) == 0); };
  auto expect = [&](const std::vector<std::string>& want) {
    const std::string s = wait_for(want);
    INFO("screen:\n" << s);
    for (const auto& w : want) CHECK_THAT(s, Catch::Contains(w));
  };

  expect({"step 0/7", "> 1  LOAD a[0][0], R0", "Registers"});
  keys("n n n");
  expect({"step 3/7", "R2  a00", "> 4  LOAD a[0][1], R0"});
  keys("b");
  expect({"step 2/7", "> 3  MAC_Z R0, R1, R2"});
  keys("s");
  expect({"Registers (numeric)", "step 2/7  numeric"});
  keys("g 6 Enter");
  expect({"step 6/7", "> 7  STORE R2, c[0][0]"});
  keys("e");
  expect({"end of trace", "step 7/7", "DRAM reads 4, writes 1"});
  keys("?");
  expect({"Keys", "true reverse step"});
  keys("x");  // any key leaves the help
  expect({"step 7/7", "Registers (numeric)"});
  keys("q");
  bool ended = false;
  for (int i = 0; i < 100 && !ended; ++i) {
    ended = std::filesystem::exists(rcfile) && std::filesystem::file_size(rcfile) > 0;
    if (!ended) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  CHECK(ended);
  if (ended) {
    std::ifstream in(rcfile);
    int rc = -1;
    in >> rc;
    CHECK(rc == 0);
  }
  (void)std::system((tm + "kill-server >/dev/null 2>&1").c_str());
  std::filesystem::remove_all(dir);
}

TEST_CASE("cli step: a trace whose expression explodes still prints at once (numbers instead)", "[cli][step]") {
  const auto dir = fresh_temp_dir("step");
  std::string text = "LOAD a[0][0], R0\nMAC_Z R0, R0, R1\n";
  for (int i = 0; i < 70; ++i) text += "MAC_Z R1, R1, R1\n";  // 2^70 factors if printed
  auto r = run_cli("step '" + write(dir, "big.trace", text) + "' --machine matmul3 --plain");
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.err, Catch::Contains("too large to print"));
  CHECK_THAT(r.out, Catch::Contains("cycles        72"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("cli step: a long trace without a terminal prints the counters, not a table of every state",
          "[cli][step][hostile]") {
  const auto dir = fresh_temp_dir("steplong");
  std::string text;
  for (int k = 0; k < 200000; ++k) text += "LOAD a[0][0], R0\n";
  const auto path = write(dir, "long.trace", text);
  auto r = run_cli("step '" + path + "' --machine matmul3");
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.err, Catch::Contains("note: 200000 instructions over 12 DRAM cells: too long for the step table"));
  CHECK_THAT(r.out, Catch::Contains("DRAM reads    200000 (a 200000)"));
  CHECK_THAT(r.out, !Catch::Contains("Step |"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("cli step: full screen on a long trace, end, back, goto a line ahead and behind",
          "[cli][step][tmux][hostile]") {
  if (std::system("command -v tmux >/dev/null 2>&1") != 0) {
    FAIL("tmux is not installed, so the full-screen test cannot run (apt-get install tmux)");
  }
  const auto dir = fresh_temp_dir("tmuxlong");
  // 30,000 steps: past the symbolic budget, so the stepper runs numeric-only with checkpoints.
  const auto path = write(dir, "long.trace", "for i in 0..9999\n  LOAD a[0][0], R0\n  LOAD b[0][0], R1\n  MAC_Z R0, R1, R2\nend\n");
  const std::string rcfile = dir + "/rc";
  std::string tm = "tmux -L flashlab_long_";
  tm += std::to_string(::getpid());
  tm += " ";
  std::string cmd = "'";
  cmd += FLASHLAB_BIN;
  cmd += "' step '";
  cmd += path;
  cmd += "' --machine matmul3; echo $? > '";
  cmd += rcfile;
  cmd += "'";
  const std::string conf = write(dir, "tmux.conf", "set -g default-terminal screen\n");
  REQUIRE(std::system((tm + "-f '" + conf + "' new-session -d -s s -x 100 -y 30 \"" + cmd + "\"").c_str()) == 0);
  auto wait_for = [&](const std::vector<std::string>& want) {
    std::string s;
    for (int i = 0; i < 200; ++i) {
      s = sh(tm + "capture-pane -p -t s");
      bool all = true;
      for (const auto& w : want) all = all && s.find(w) != std::string::npos;
      if (all) return s;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return s;
  };
  auto keys = [&](const std::string& k) { REQUIRE(std::system((tm + "send-keys -t s " + k).c_str()) == 0); };
  auto expect = [&](const std::vector<std::string>& want) {
    const std::string s = wait_for(want);
    INFO("screen:\n" << s);
    for (const auto& w : want) CHECK_THAT(s, Catch::Contains(w));
  };
  expect({"step 0/30000", "numeric only: the trace is too long to carry expressions"});
  keys("e");
  expect({"step 30000/30000", "end of trace", "DRAM reads 20000"});
  keys("b");
  expect({"step 29999/30000", "> 30000  MAC_Z R0, R1, R2", "DRAM reads 20000"});
  keys("g : 3 Enter");  // line 3 does not run after step 29999: back to its first execution
  expect({"line 3 does not run again: back at its first execution, step 1", "step 1/30000"});
  keys("g : 3 Enter");
  expect({"line 3: its next execution, step 4", "step 4/30000"});
  keys("g 15000 Enter");
  expect({"step 15000/30000", "DRAM reads 10000"});
  keys("b");
  expect({"step 14999/30000", "DRAM reads 10000"});
  keys("g : 9 Enter");
  expect({"line 9 runs no instruction", "step 14999/30000"});
  keys("q");
  bool ended = false;
  for (int i = 0; i < 100 && !ended; ++i) {
    ended = std::filesystem::exists(rcfile) && std::filesystem::file_size(rcfile) > 0;
    if (!ended) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  CHECK(ended);
  (void)std::system((tm + "kill-server >/dev/null 2>&1").c_str());
  std::filesystem::remove_all(dir);
}
