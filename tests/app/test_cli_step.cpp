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

/// `flashlab step TRACE --machine matmul3` running full screen inside a private tmux server
/// (-L: never touches the user's own tmux), killed when the object goes. `make deps` installs
/// tmux, so its absence fails the test rather than passing silently.
class TmuxStepper {
 public:
  TmuxStepper(const std::string& dir, const std::string& trace, int cols, int rows) : rcfile_(dir + "/rc") {
    if (std::system("command -v tmux >/dev/null 2>&1") != 0)
      FAIL("tmux is not installed, so the full-screen test cannot run (apt-get install tmux)");
    // (Built with += : GCC 12 warns falsely on long chains of string temporaries, PR105329.)
    tm_ = "tmux -L flashlab_test_";
    tm_ += std::to_string(::getpid());
    tm_ += " ";
    std::string cmd = "'";
    cmd += FLASHLAB_BIN;
    cmd += "' step '";
    cmd += trace;
    cmd += "' --machine matmul3; echo $? > '";
    cmd += rcfile_;
    cmd += "'";
    // A known TERM inside the pane (screen's terminfo ships with ncurses-base everywhere).
    const std::string conf = write(dir, "tmux.conf", "set -g default-terminal screen\n");
    const std::string size = "-x " + std::to_string(cols) + " -y " + std::to_string(rows);
    REQUIRE(std::system((tm_ + "-f '" + conf + "' new-session -d -s s " + size + " \"" + cmd + "\"").c_str()) == 0);
  }
  TmuxStepper(const TmuxStepper&) = delete;
  TmuxStepper& operator=(const TmuxStepper&) = delete;
  ~TmuxStepper() { (void)std::system((tm_ + "kill-server >/dev/null 2>&1").c_str()); }

  void keys(const std::string& k) { REQUIRE(std::system((tm_ + "send-keys -t s " + k).c_str()) == 0); }

  /// Polls the pane until every string in `want` shows up (up to `polls` × 50 ms): the program
  /// needs a moment to draw, and a capture can catch a frame half redrawn, so waiting for one
  /// marker is not enough. Then checks each, with the screen in the failure message.
  void expect(const std::vector<std::string>& want, int polls = 100) {
    std::string s;
    for (int i = 0; i < polls; ++i) {
      s = sh(tm_ + "capture-pane -p -t s");
      bool all = true;
      for (const auto& w : want) all = all && s.find(w) != std::string::npos;
      if (all) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    INFO("screen:\n" << s);
    for (const auto& w : want) CHECK_THAT(s, Catch::Contains(w));
  }

  /// The exit code the program left after `q`, or -1 when it did not end within 5 s.
  int exit_code() {
    for (int i = 0; i < 100; ++i) {
      if (std::filesystem::exists(rcfile_) && std::filesystem::file_size(rcfile_) > 0) {
        std::ifstream in(rcfile_);
        int rc = -1;
        in >> rc;
        return rc;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return -1;
  }

 private:
  std::string tm_, rcfile_;
};

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
  const auto dir = fresh_temp_dir("tmux");
  {
    TmuxStepper tmux(dir, write(dir, "p1.trace", kProblem1), 80, 24);
    tmux.expect({"step 0/7", "> 1  LOAD a[0][0], R0", "Registers"});
    tmux.keys("n n n");
    tmux.expect({"step 3/7", "R2  a00", "> 4  LOAD a[0][1], R0"});
    tmux.keys("b");
    tmux.expect({"step 2/7", "> 3  MAC_Z R0, R1, R2"});
    tmux.keys("s");
    tmux.expect({"Registers (numeric)", "step 2/7  numeric"});
    tmux.keys("g 6 Enter");
    tmux.expect({"step 6/7", "> 7  STORE R2, c[0][0]"});
    tmux.keys("e");
    tmux.expect({"end of trace", "step 7/7", "DRAM reads 4, writes 1"});
    tmux.keys("?");
    tmux.expect({"Keys", "true reverse step"});
    tmux.keys("x");  // any key leaves the help
    tmux.expect({"step 7/7", "Registers (numeric)"});
    tmux.keys("q");
    CHECK(tmux.exit_code() == 0);
  }
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
  const auto dir = fresh_temp_dir("tmuxlong");
  {
    // 30,000 steps: past the symbolic budget, so the stepper runs numeric-only with checkpoints.
    const auto path =
        write(dir, "long.trace", "for i in 0..9999\n  LOAD a[0][0], R0\n  LOAD b[0][0], R1\n  MAC_Z R0, R1, R2\nend\n");
    TmuxStepper tmux(dir, path, 100, 30);
    tmux.expect({"step 0/30000", "numeric only: the trace is too long to carry expressions"}, 200);
    tmux.keys("e");
    tmux.expect({"step 30000/30000", "end of trace", "DRAM reads 20000"}, 200);
    tmux.keys("b");
    tmux.expect({"step 29999/30000", "> 30000  MAC_Z R0, R1, R2", "DRAM reads 20000"}, 200);
    tmux.keys("g : 3 Enter");  // line 3 does not run after step 29999: back to its first execution
    tmux.expect({"line 3 does not run again: back at its first execution, step 1", "step 1/30000"}, 200);
    tmux.keys("g : 3 Enter");
    tmux.expect({"line 3: its next execution, step 4", "step 4/30000"}, 200);
    tmux.keys("g 15000 Enter");
    tmux.expect({"step 15000/30000", "DRAM reads 10000"}, 200);
    tmux.keys("b");
    tmux.expect({"step 14999/30000", "DRAM reads 10000"}, 200);
    tmux.keys("g : 9 Enter");
    tmux.expect({"line 9 runs no instruction", "step 14999/30000"}, 200);
    tmux.keys("q");
    CHECK(tmux.exit_code() == 0);
  }
  std::filesystem::remove_all(dir);
}
