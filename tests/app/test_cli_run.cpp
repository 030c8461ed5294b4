// `flashlab run` and `flashlab machines` end to end: the real binary, its output and exit codes
// (0 ran, 2 usage or does not assemble, 3 runtime fault).
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "run_cli.hpp"

using flashlab::test::run_cli;

namespace {

const std::string kTraces = std::string(FLASHLAB_SOURCE_DIR) + "/toymachine/traces/";

// Writes `text` to a fresh file and returns its path.
std::string write_temp(const std::string& name, const std::string& text) {
  const std::string path = flashlab::test::fresh_temp_dir("run") + "/" + name;
  std::ofstream(path) << text;
  return path;
}

}  // namespace

TEST_CASE("run --table prints the lesson's Problem 1 table and the counters", "[cli][run]") {
  auto r = run_cli("run '" + kTraces + "p1_c00.trace' --machine matmul3 --table");
  CHECK(r.exit_code == 0);
  CHECK(r.err.empty());
  CHECK_THAT(r.out, Catch::Contains("Step | Instruction        | R0  | R1  | R2\n"
                                    "-----+--------------------+-----+-----+--------\n"
                                    "   1 | LOAD a[0][0], R0   | a00 |     |\n"));
  CHECK_THAT(r.out, Catch::Contains("   6 | MAC R0, R1, R2, R2 | a01 | b10 | c00\n"));
  CHECK_THAT(r.out, Catch::Contains("cycles        7\n"
                                    "instructions  7 (LOAD 4, STORE 1, MAC_Z 1, MAC 1)\n"
                                    "DRAM reads    4 (a 2, b 2)\n"
                                    "DRAM writes   1 (c 1)\n"));
  CHECK_THAT(r.out, Catch::Contains("c[0][1] = (never written)"));
}

TEST_CASE("run --json: counts, nested outputs equal to A·B for given inputs", "[cli][run]") {
  auto r = run_cli("run '" + kTraces + "p2_inner_matmul3.trace' --machine matmul3 --inputs a=1,2,3,4 --inputs b=5,6,7,8 --json");
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("\"machine\": \"matmul3\""));
  CHECK_THAT(r.out, Catch::Contains("\"cycles\": 25,"));
  CHECK_THAT(r.out, Catch::Contains("\"LOAD\": 13,"));
  CHECK_THAT(r.out, Catch::Contains("\"dram_reads\": 13,"));
  CHECK_THAT(r.out, Catch::Contains("\"dram_writes\": 4,"));
  // [[1,2],[3,4]]·[[5,6],[7,8]] = [[19,22],[43,50]]
  CHECK_THAT(r.out, Catch::Contains("\"outputs\": {\n    \"c\": [\n      [\n        19,\n        22\n      ],\n      [\n        43,\n        50\n      ]\n    ]\n  }"));
  CHECK_THAT(r.out, Catch::Contains("\"inputs\": {\n    \"a\": [\n      [\n        1,\n        2\n      ],"));
  CHECK_THAT(r.out, Catch::Contains("\"symbolic_outputs\": {\n    \"c\": [\n      [\n        \"c00\",\n        \"c01\"\n      ],"));
  CHECK_THAT(r.out, Catch::Contains("\"fault\": null"));
}

TEST_CASE("run --json: a cell never written is null", "[cli][run]") {
  auto r = run_cli("run '" + kTraces + "p1_c00.trace' --machine matmul3 --json --inputs a=1,2,3,4 --inputs b=5,6,7,8");
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("\"c\": [\n      [\n        19,\n        null\n      ],\n      [\n        null,\n        null\n      ]"));
}

TEST_CASE("run: softmax with --n, numeric and symbolic", "[cli][run]") {
  auto r = run_cli("run '" + kTraces + "p5_online_softmax4.trace' --machine softmax4 --n 3 --inputs x=1,2,3 --json");
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("\"dram_reads\": 6,"));
  CHECK_THAT(r.out, Catch::Contains("\"dram_writes\": 3,"));
  CHECK_THAT(r.out, Catch::Contains("\"e^(x2 − m)/S\""));
  CHECK_THAT(r.out, Catch::Contains("0.66524095"));  // softmax(1,2,3)[2] = 0.665240955…
  auto num = run_cli("run '" + kTraces + "p4_safe_softmax3.trace' --machine softmax3 --n 3 --inputs x=1,2,3 --numeric --json");
  CHECK(num.exit_code == 0);
  CHECK_THAT(num.out, Catch::Contains("\"dram_reads\": 9,"));
  CHECK_THAT(num.out, Catch::Contains("0.66524095"));
  CHECK_THAT(num.out, Catch::Contains("\"symbolic_outputs\": {}"));
}

TEST_CASE("run: large runs go numeric-only with a note, and --table refuses them", "[cli][run]") {
  auto r = run_cli("run '" + kTraces + "p5_online_softmax4.trace' --machine softmax4 --n 5000");
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.err, Catch::Contains("note: 69996 instructions over 10000 DRAM cells: running numeric-only"));
  CHECK_THAT(r.out, Catch::Contains("DRAM reads    10000 (x 10000)"));
  auto t = run_cli("run '" + kTraces + "p5_online_softmax4.trace' --machine softmax4 --n 5000 --table");
  CHECK(t.exit_code == 2);
  CHECK_THAT(t.err, Catch::Contains("error: --table: 69996 instructions over 10000 DRAM cells is too large to tabulate"));
}

TEST_CASE("run: a runtime fault exits 3 with step, message and hint", "[cli][run][errors]") {
  const auto path = write_temp("fault.trace", "LOAD a[0][0], R0\nMAC_Z R0, R1, R2\n");
  auto r = run_cli("run '" + path + "' --machine matmul3");
  CHECK(r.exit_code == 3);
  CHECK(r.err == path + ":2: step 2: error: MAC_Z R0, R1, R2: reads R1, which was never written\n"
                        "hint: give R1 a value first: LOAD it from DRAM or make it the destination of an earlier instruction\n");
  CHECK_THAT(r.out, Catch::Contains("1 of 2 instructions ran"));
  auto j = run_cli("run '" + path + "' --machine matmul3 --json");
  CHECK(j.exit_code == 3);
  CHECK_THAT(j.out, Catch::Contains("\"fault\": {\n    \"step\": 2,\n    \"line\": 2,"));
  auto cap = run_cli("run '" + kTraces + "p1_c00.trace' --machine matmul3 --max-cycles 3");
  CHECK(cap.exit_code == 3);
  CHECK_THAT(cap.err, Catch::Contains("step 4: error: LOAD a[0][1], R0: the cycle cap of 3 would be exceeded"));
}

TEST_CASE("run: a trace that does not assemble exits 2 with every diagnostic", "[cli][run][errors]") {
  const auto path = write_temp("bad.trace", "MAC R0, R1, R2\nLOAD a[0][0], R9\n");
  auto r = run_cli("run '" + path + "' --machine matmul3");
  CHECK(r.exit_code == 2);
  CHECK(r.out.empty());
  CHECK(r.err == path + ":1:1: error: MAC takes 4 operands, got 3\n"
                        "  MAC R0, R1, R2\n"
                        "  ^^^^^^^^^^^^^^\n"
                        "hint: MAC takes 4 registers: MAC Ra, Rb, Rc, Rd\n" +
                    path + ":2:15: error: machine matmul3 has no register R9\n"
                           "  LOAD a[0][0], R9\n"
                           "                ^^\n"
                           "hint: machine matmul3 has R0..R2\n"
                           "2 errors; the trace does not assemble for machine matmul3\n");
  auto s3 = run_cli("run '" + kTraces + "p5_online_softmax4.trace' --machine softmax3");
  CHECK(s3.exit_code == 2);
  CHECK_THAT(s3.err, Catch::Contains("error: machine softmax3 has no register r3"));
}

TEST_CASE("run: usage errors name the flag", "[cli][run][errors]") {
  const std::string p1 = "'" + kTraces + "p1_c00.trace'";
  struct Case {
    std::string args, err;
  };
  for (const auto& c : std::vector<Case>{
           {"run --machine matmul3", "error: missing TRACE file\n"},
           {"run nope.trace --machine matmul3", "error: TRACE: 'nope.trace': no such file\n"},
           {"run " + p1, "error: --machine is required\n"},
           {"run " + p1 + " --machine matmul9", "error: --machine: unknown machine 'matmul9'\n"},
           {"run " + p1 + " --machine softmax3 --n 0", "error: --n 0 is out of range\n"},
           {"run " + p1 + " --machine softmax3 --n 9999999", "error: --n 9999999 is out of range\n"},
           {"run " + p1 + " --machine matmul3 --machine-file m.txt", "error: --machine and --machine-file are exclusive\n"},
           {"run " + p1 + " --machine-file /nonexistent.machine", "error: --machine-file: '/nonexistent.machine': no such file\n"},
           {"run " + p1 + " --machine matmul3 --inputs q=1", "error: --inputs: machine matmul3 has no input array 'q'\n"},
           {"run " + p1 + " --machine matmul3 --inputs a=1,2", "error: --inputs: a[2][2] needs 4 values, got 2\n"},
           {"run " + p1 + " --machine matmul3 --inputs a=1,x,3,4", "error: --inputs: 'x' is not a number (in a)\n"},
           {"run " + p1 + " --machine matmul3 --table --json", "error: --table and --json are exclusive\n"},
           {"run " + p1 + " --machine matmul3 --bogus", "error: unrecognised option '--bogus'\n"},
       }) {
    INFO(c.args);
    auto r = run_cli(c.args);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Catch::StartsWith(c.err));
    CHECK_THAT(r.err, Catch::Contains("\nhint: "));
  }
}

TEST_CASE("run --machine-file: a user machine with its own cycle costs", "[cli][run]") {
  const auto machine = write_temp("slow.machine",
                                  "machine slowexp\nregisters R0 r1 r2\nisa LOAD STORE MAX SUB EXP ADD MUL DIV MOV\n"
                                  "cycles EXP 4\ninput x[n]\noutput out[n]\n");
  auto r = run_cli("run '" + kTraces + "p4_safe_softmax3.trace' --machine-file '" + machine + "' --n 2 --json");
  CHECK(r.exit_code == 0);
  // 2 passes with EXP (2n EXPs at 4 cycles) + the rest at 1: n=2 → 21 instructions, 4 EXPs.
  CHECK_THAT(r.out, Catch::Contains("\"machine\": \"slowexp\""));
  CHECK_THAT(r.out, Catch::Contains("\"EXP\": 4,"));
  CHECK_THAT(r.out, Catch::Contains("\"cycles\": 33,"));
  const auto bad = write_temp("bad.machine", "registers R0\nisa LOAD FMA\n");
  auto b = run_cli("run '" + kTraces + "p1_c00.trace' --machine-file '" + bad + "'");
  CHECK(b.exit_code == 2);
  CHECK(b.err == bad + ":2:10: error: unknown instruction 'FMA'\n"
                       "  isa LOAD FMA\n"
                       "           ^^^\n"
                       "hint: the instructions are LOAD STORE MAC_Z MAC MAX SUB EXP ADD MUL DIV MOV\n");
}

TEST_CASE("machines lists the profiles, and --help works on run and machines", "[cli][machines]") {
  auto r = run_cli("machines --n 4");
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("matmul3  ") && Catch::Contains("  registers     R0..R2\n") &&
                        Catch::Contains("  instructions  LOAD STORE MAC_Z MAC\n") &&
                        Catch::Contains("  DRAM          a[2][2] (input), b[2][2] (input), c[2][2] (output)\n"));
  CHECK_THAT(r.out, Catch::Contains("softmax4  ") && Catch::Contains("  registers     R0, r1, r2, r3\n") &&
                        Catch::Contains("  DRAM          x[4] (input), out[4] (output)\n"));
  CHECK_THAT(r.out, Catch::Contains("MAC Ra, Rb, Rc, Rd") && Catch::Contains("Rd = Ra × Rb + Rc"));
  auto h = run_cli("run --help");
  CHECK(h.exit_code == 0);
  CHECK_THAT(h.out, Catch::Contains("Usage: flashlab run TRACE --machine NAME") && Catch::Contains("--machine-file") &&
                        Catch::Contains("MAC_Z Ra, Rb, Rd") && Catch::Contains("Exit codes: 0 ran, 2"));
  auto hm = run_cli("machines --help");
  CHECK(hm.exit_code == 0);
  CHECK_THAT(hm.out, Catch::Contains("Usage: flashlab machines"));
  auto bad = run_cli("machines --n -1");
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.err, Catch::Contains("error: --n -1 is out of range"));
}

TEST_CASE("cli run: a squaring chain finishes and prints a placeholder", "[run]") {
  const std::string dir = flashlab::test::fresh_temp_dir("sq");
  {
    std::ofstream f(dir + "/sq.trace");
    f << "LOAD x[0], R0\n";
    for (int k = 0; k < 80; ++k) f << "MUL R0, R0, R0\n";
    f << "STORE R0, out[0]\n";
  }
  auto r = flashlab::test::run_cli("run sq.trace --machine softmax3 --n 1 --table", dir);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("expression of more than 2000 terms"));
}

namespace {

std::string repeat(const std::string& s, std::size_t n) {
  std::string out;
  out.reserve(s.size() * n);
  for (std::size_t i = 0; i < n; ++i) out += s;
  return out;
}

// What one command must answer to one hostile trace.
struct Expect {
  int exit_code;
  std::string err;  // a substring of stderr (or of stdout for lesson check's report)
};

// Text that must never reach a user: a signal's effects, or a library's internals.
void check_clean(const flashlab::test::CliResult& r) {
  CHECK(r.exit_code >= 0);
  CHECK(r.exit_code <= 3);
  for (const char* leak : {"bad_alloc", "stoull", "stoi", "stol", "terminate", "Sanitizer", "runtime error"}) {
    CHECK_THAT(r.err, !Catch::Contains(leak));
    CHECK_THAT(r.out, !Catch::Contains(leak));
  }
}

}  // namespace

TEST_CASE("run, step and lesson check share one front end and its limits on hostile traces", "[cli][run][hostile]") {
  const std::string dir = flashlab::test::fresh_temp_dir("hostile");
  std::string deep_loops;
  for (int k = 0; k < 100000; ++k) deep_loops += "for v" + std::to_string(k) + " in 0..1\n";
  deep_loops += "LOAD a[0][0], R0\n" + repeat("end\n", 100000);
  struct Case {
    std::string name, text;
    Expect run, step, check;
  };
  const std::string nested = "error: index expression nested deeper than 32 levels";
  const std::string ovf = ":1:18: error: index arithmetic overflows in index '3037000500*3037000500' (with n = ";
  const std::vector<Case> cases{
      {"parens.trace", "LOAD a[" + repeat("(", 100000) + "0" + repeat(")", 100000) + "][0], R0\n",
       {2, "parens.trace:1:40: " + nested}, {2, "parens.trace:1:40: " + nested}, {2, "parens.trace:1:40: " + nested}},
      {"minus.trace", "LOAD a[" + repeat("-", 100000) + "1][0], R0\n",
       {2, "minus.trace:1:40: " + nested}, {2, "minus.trace:1:40: " + nested}, {2, "minus.trace:1:40: " + nested}},
      {"loops.trace", deep_loops, {2, "loops.trace:33:1: error: loops nested deeper than 32 levels"},
       {2, "loops.trace:33:1: error: loops nested deeper than 32 levels"},
       {2, "loops.trace:33:1: error: loops nested deeper than 32 levels"}},
      {"empty.trace", "for i in 0..1000000000\nend\n", {0, ""}, {0, ""}, {1, "c[0][0] was never written"}},
      {"spin.trace", "for i in 0..1000000000\n  for j in 1..0\n    LOAD a[0][0], R0\n  end\nend\n",
       {2, "spin.trace:1:1: error: the loops iterate more than 1000000 times"},
       {2, "spin.trace:1:1: error: the loops iterate more than 1000000 times"},
       {2, "spin.trace:1:1: error: the loops iterate more than 1000000 times"}},
      {"big.trace", "for i in 0..9223372036854775807\n  LOAD a[0][0], R0\nend\n",
       {2, "big.trace:1:1: error: the loops expand to more than 1000000 instructions"},
       {2, "big.trace:1:1: error: the loops expand to more than 1000000 instructions"},
       {2, "big.trace:1:1: error: the loops expand to more than 1000000 instructions"}},
      {"ovf.trace", "LOAD a[3037000500*3037000500][0], R0\n", {2, "ovf.trace" + ovf}, {2, "ovf.trace" + ovf},
       {2, "ovf.trace" + ovf}},
      {"neg.trace", "LOAD a[-(-9223372036854775807-1)][0], R0\n",
       {2, "neg.trace:1:8: error: index arithmetic overflows"}, {2, "neg.trace:1:8: error: index arithmetic overflows"},
       {2, "neg.trace:1:8: error: index arithmetic overflows"}},
  };
  for (const auto& c : cases) {
    const std::string path = dir + "/" + c.name;
    std::ofstream(path) << c.text;
    INFO(c.name);
    const auto run = run_cli("run '" + path + "' --machine matmul3");
    check_clean(run);
    CHECK(run.exit_code == c.run.exit_code);
    CHECK_THAT(run.err, Catch::Contains(c.run.err));
    const auto step = run_cli("step '" + path + "' --machine matmul3");
    check_clean(step);
    CHECK(step.exit_code == c.step.exit_code);
    CHECK_THAT(step.err, Catch::Contains(c.step.err));
    const auto check = run_cli("lesson check 1 '" + path + "'", dir);
    check_clean(check);
    CHECK(check.exit_code == c.check.exit_code);
    CHECK_THAT(check.out + check.err, Catch::Contains(c.check.err));
  }
  // A directory is not a trace.
  const auto run = run_cli("run '" + dir + "' --machine matmul3");
  CHECK(run.exit_code == 2);
  CHECK(run.err.rfind("error: TRACE: '" + dir + "': is a directory\nhint: ", 0) == 0);
  const auto step = run_cli("step '" + dir + "' --machine matmul3");
  CHECK(step.exit_code == 2);
  CHECK(step.err.rfind("error: TRACE: '" + dir + "': is a directory\nhint: ", 0) == 0);
  const auto check = run_cli("lesson check 1 '" + dir + "'", dir);
  CHECK(check.exit_code == 2);
  CHECK_THAT(check.err, Catch::Contains("'" + dir + "'"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("run and step validate --n, --seed and --max-cycles the same way", "[cli][run][hostile]") {
  const std::string p1 = "'" + kTraces + "p1_c00.trace' --machine matmul3 ";
  struct Case {
    std::string flags, err, hint;
  };
  for (const auto& c : std::vector<Case>{
           {"--max-cycles -1", "error: --max-cycles -1 is out of range\n", "hint: --max-cycles takes a value from 0 to 4611686018427387904\n"},
           {"--seed -1", "error: --seed -1 is out of range\n", "hint: --seed takes a value from 0 to 4611686018427387904\n"},
           {"--seed 4611686018427387905", "error: --seed 4611686018427387905 is out of range\n", "hint: --seed takes"},
           {"--n 0", "error: --n 0 is out of range\n", "hint: --n takes a value from 1 to 1048576\n"},
           {"--n 1048577", "error: --n 1048577 is out of range\n", "hint: --n takes a value from 1 to 1048576\n"},
           {"--seed 18446744073709551615", "error: the argument ('18446744073709551615') for option '--seed' is invalid", "hint: "},
       }) {
    for (const std::string command : {"run ", "step "}) {
      INFO(command + c.flags);
      const auto r = run_cli(command + p1 + c.flags);
      CHECK(r.exit_code == 2);
      CHECK_THAT(r.err, Catch::StartsWith(c.err));
      CHECK_THAT(r.err, Catch::Contains(c.hint));
    }
  }
  // The same values are accepted by both.
  for (const std::string command : {"run ", "step "}) {
    const auto r = run_cli(command + p1 + "--seed 4611686018427387904 --max-cycles 0 --n 1048576");
    INFO(command << r.err);
    CHECK(r.exit_code == 0);
  }
  // The cycle cap applies to both.
  const auto capped_run = run_cli("run " + p1 + "--max-cycles 3");
  CHECK(capped_run.exit_code == 3);
  CHECK_THAT(capped_run.err, Catch::Contains("the cycle cap of 3 would be exceeded"));
  const auto capped_step = run_cli("step " + p1 + "--max-cycles 3");
  CHECK(capped_step.exit_code == 3);
  CHECK_THAT(capped_step.err, Catch::Contains("the cycle cap of 3 would be exceeded"));
}
