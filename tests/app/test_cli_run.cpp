// `flashlab run` and `flashlab machines` end to end: the real binary, its output and exit codes
// (0 ran, 2 usage or does not assemble, 3 runtime fault).
#include <catch2/catch.hpp>

#include <fstream>
#include <string>

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

TEST_CASE("run --table prints the seed's Problem 1 table and the counters", "[cli][run]") {
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

TEST_CASE("run: large runs go numeric-only with a note; --table refuses them", "[cli][run]") {
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
           {"run nope.trace --machine matmul3", "error: TRACE: no such file 'nope.trace'\n"},
           {"run " + p1, "error: --machine is required\n"},
           {"run " + p1 + " --machine matmul9", "error: --machine: unknown machine 'matmul9'\n"},
           {"run " + p1 + " --machine softmax3 --n 0", "error: --n 0 is out of range\n"},
           {"run " + p1 + " --machine softmax3 --n 9999999", "error: --n 9999999 is out of range\n"},
           {"run " + p1 + " --machine matmul3 --machine-file m.txt", "error: --machine and --machine-file are exclusive\n"},
           {"run " + p1 + " --machine-file /nonexistent.machine", "error: --machine-file: cannot read '/nonexistent.machine'\n"},
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

TEST_CASE("machines lists the profiles; --help works on run and machines", "[cli][machines]") {
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
