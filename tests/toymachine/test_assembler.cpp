// The assembler: the lesson's trace syntax, the loop directive, and every diagnostic class with
// its full formatted text (file:line:col, echoed line, caret, hint).
#include <catch2/catch.hpp>

#include "flashlab/toymachine/assembler.hpp"
#include "flashlab/toymachine/machine.hpp"
#include "toy_test_util.hpp"

using namespace flashlab::toy;

TEST_CASE("lesson syntax: step numbers, comments, spacing, register case", "[assembler]") {
  const Machine m = builtin_machine("softmax3", 4);
  const Program p = toytest::assemble_ok(
      "# a comment line\n"
      "\n"
      "1  LOAD x[0], r1      # trailing comment\n"
      "2.\tload x[ 3 ],R0\n"
      "3\n"  // a bare step number (the lesson's blank template rows) is an empty line
      "  10) MAX R0 , R1, r1\r\n"
      "STORE r1, out[n-1]\n",
      m);
  REQUIRE(p.code.size() == 4);
  CHECK(p.code[0].op == Opcode::LOAD);
  CHECK(p.code[0].text == "LOAD x[0], r1");
  CHECK(p.code[0].source_line == 3);
  CHECK(p.code[0].source_col == 4);
  CHECK(p.code[1].text == "load x[3], R0");
  CHECK(p.code[1].operands[0].index == std::vector<long long>{3});
  CHECK(p.code[1].operands[1].reg == 0);
  CHECK(p.code[2].op == Opcode::MAX);
  CHECK(p.code[2].operands[1].reg == 1);  // R1 is the lesson's r1
  CHECK(p.code[2].source_line == 6);
  CHECK(p.code[3].text == "STORE r1, out[3]");
  CHECK(p.source_lines.size() == 7);
}

TEST_CASE("the lesson's traces assemble as printed", "[assembler][lesson]") {
  CHECK(toytest::assemble_ok(toytest::read_trace("p1_c00.trace"), builtin_machine("matmul3")).code.size() == 7);
  CHECK(toytest::assemble_ok(toytest::read_trace("p2_inner_matmul3.trace"), builtin_machine("matmul3")).code.size() == 25);
  CHECK(toytest::assemble_ok(toytest::read_trace("p3_outer_matmul6.trace"), builtin_machine("matmul6")).code.size() == 22);
  CHECK(toytest::assemble_ok(toytest::read_trace("p4_safe_softmax3_n3.trace"), builtin_machine("softmax3", 3)).code.size() == 32);
  CHECK(toytest::assemble_ok(toytest::read_trace("p5_online_softmax4_n3.trace"), builtin_machine("softmax4", 3)).code.size() == 38);
}

TEST_CASE("loop directive: inclusive bounds, n, nesting, empty ranges", "[assembler][loops]") {
  const Machine m = builtin_machine("softmax3", 5);
  SECTION("one loop over 1..n-1") {
    const Program p = toytest::assemble_ok("for i in 1..n-1\n  LOAD x[i], R0\nend\n", m);
    REQUIRE(p.code.size() == 4);
    for (std::size_t k = 0; k < 4; ++k) {
      CHECK(p.code[k].operands[0].index[0] == static_cast<long long>(k + 1));
      CHECK(p.code[k].source_line == 2);
    }
    CHECK(p.code[3].text == "LOAD x[4], R0");
  }
  SECTION("nested loops and index arithmetic") {
    const Program p = toytest::assemble_ok(
        "for i in 0..1\n for j in i..2*i+1\n  LOAD x[(n - 1) - i*2 - j], R0\n end\nend\n", m);
    // i = 0: j = 0..1 → x[4], x[3]; i = 1: j = 1..3 → x[1], x[0], x[-1]
    REQUIRE(p.code.size() == 5);
    CHECK(p.code[0].operands[0].index[0] == 4);
    CHECK(p.code[1].operands[0].index[0] == 3);
    CHECK(p.code[2].operands[0].index[0] == 1);
    CHECK(p.code[4].operands[0].index[0] == -1);  // range is checked when it runs
  }
  SECTION("an empty range runs zero times (n = 1: for i in 1..n-1)") {
    const Program p = toytest::assemble_ok("LOAD x[0], R0\nfor i in 1..n-1\n  LOAD x[i], R0\nend\n", builtin_machine("softmax3", 1));
    CHECK(p.code.size() == 1);
  }
  SECTION("the lesson's minus sign is accepted in indices") {
    const Program p = toytest::assemble_ok("LOAD x[n\u22121], R0\n", m);
    CHECK(p.code[0].operands[0].index[0] == 4);
  }
  SECTION("step numbers inside loops") {
    const Program p = toytest::assemble_ok("for i in 0..1\n1 LOAD x[i], R0\n2 MOV R0, r1\nend\n", m);
    CHECK(p.code.size() == 4);
  }
}

TEST_CASE("diagnostic: unknown instruction", "[assembler][errors]") {
  CHECK(toytest::diagnostics_of("LOAD a[0][0], R0\nFMA R0, R1, R2\n", builtin_machine("matmul3")) ==
        "t.trace:2:1: error: unknown instruction 'FMA'\n"
        "  FMA R0, R1, R2\n"
        "  ^^^\n"
        "hint: machine matmul3 has LOAD STORE MAC_Z MAC\n");
}

TEST_CASE("diagnostic: instruction the machine does not have", "[assembler][errors]") {
  CHECK(toytest::diagnostics_of("3 MAC R0, r1, r2, r2\n", builtin_machine("softmax3")) ==
        "t.trace:1:3: error: machine softmax3 has no MAC\n"
        "  3 MAC R0, r1, r2, r2\n"
        "    ^^^\n"
        "hint: its instructions are LOAD STORE MAX SUB EXP ADD MUL DIV MOV\n");
}

TEST_CASE("diagnostic: register the machine does not have", "[assembler][errors]") {
  CHECK(toytest::diagnostics_of("MAC_Z R0, R1, R3\n", builtin_machine("matmul3")) ==
        "t.trace:1:15: error: machine matmul3 has no register R3\n"
        "  MAC_Z R0, R1, R3\n"
        "                ^^\n"
        "hint: machine matmul3 has R0..R2\n");
  CHECK(toytest::diagnostics_of("MOV R0, r3\n", builtin_machine("softmax3")) ==
        "t.trace:1:9: error: machine softmax3 has no register r3\n"
        "  MOV R0, r3\n"
        "          ^^\n"
        "hint: machine softmax3 has R0, r1, r2\n");
}

TEST_CASE("diagnostic: wrong operand count", "[assembler][errors]") {
  CHECK(toytest::diagnostics_of("MAC R0, R1, R2\n", builtin_machine("matmul3")) ==
        "t.trace:1:1: error: MAC takes 4 operands, got 3\n"
        "  MAC R0, R1, R2\n"
        "  ^^^^^^^^^^^^^^\n"
        "hint: MAC takes 4 registers: MAC Ra, Rb, Rc, Rd\n");
  CHECK(toytest::diagnostics_of("LOAD a[0][0]\n", builtin_machine("matmul3")) ==
        "t.trace:1:1: error: LOAD takes 2 operands, got 1\n"
        "  LOAD a[0][0]\n"
        "  ^^^^^^^^^^^^\n"
        "hint: LOAD takes 2 operands: LOAD src, Rd\n");
}

TEST_CASE("diagnostic: operand of the wrong kind", "[assembler][errors]") {
  CHECK(toytest::diagnostics_of("LOAD R0, a[0][0]\n", builtin_machine("matmul3")) ==
        "t.trace:1:6: error: LOAD operand 1 must be a DRAM element, not register R0\n"
        "  LOAD R0, a[0][0]\n"
        "       ^^\n"
        "hint: LOAD takes 2 operands: LOAD src, Rd, e.g. LOAD a[0][0], R0\n"
        "t.trace:1:10: error: LOAD operand 2 must be a register, not 'a[0][0]'\n"
        "  LOAD R0, a[0][0]\n"
        "           ^^^^^^^\n"
        "hint: LOAD takes 2 operands: LOAD src, Rd; only LOAD and STORE touch DRAM\n");
  CHECK(toytest::diagnostics_of("MAC_Z a[0][0], R1, R2\n", builtin_machine("matmul3")) ==
        "t.trace:1:7: error: MAC_Z operand 1 must be a register, not 'a[0][0]'\n"
        "  MAC_Z a[0][0], R1, R2\n"
        "        ^^^^^^^\n"
        "hint: MAC_Z takes 3 registers: MAC_Z Ra, Rb, Rd; only LOAD and STORE touch DRAM\n");
}

TEST_CASE("diagnostic: bad index expressions and dimension counts", "[assembler][errors]") {
  CHECK(toytest::diagnostics_of("LOAD x[k], R0\n", builtin_machine("softmax3")) ==
        "t.trace:1:8: error: unknown name 'k' in index 'k'\n"
        "  LOAD x[k], R0\n"
        "         ^\n"
        "hint: indices are integer expressions over n with + - * and parentheses, e.g. x[i], x[n-1]\n");
  CHECK(toytest::diagnostics_of("for i in 0..2\n  LOAD x[i+], R0\nend\n", builtin_machine("softmax3")) ==
        "t.trace:2:12: error: expected a number or a name in index 'i+'\n"
        "    LOAD x[i+], R0\n"
        "             ^\n"
        "hint: indices are integer expressions over n, i with + - * and parentheses, e.g. x[i], x[n-1]\n");
  CHECK(toytest::diagnostics_of("LOAD a[0], R0\n", builtin_machine("matmul3")) ==
        "t.trace:1:6: error: a has 2 dimensions, written with 1 index\n"
        "  LOAD a[0], R0\n"
        "       ^^^^\n"
        "hint: write it as a[0][0] (a[2][2])\n");
}

TEST_CASE("diagnostic: loop structure", "[assembler][errors][loops]") {
  const Machine m = builtin_machine("softmax3");
  CHECK(toytest::diagnostics_of("for i in 0..n-1\n  LOAD x[i], R0\n", m) ==
        "t.trace:1:1: error: 'for' without a matching 'end'\n"
        "  for i in 0..n-1\n"
        "  ^^^\n"
        "hint: close the loop with a line holding just: end\n");
  CHECK(toytest::diagnostics_of("LOAD x[0], R0\nend\n", m) ==
        "t.trace:2:1: error: 'end' without a matching 'for'\n"
        "  end\n"
        "  ^^^\n"
        "hint: each 'end' closes one 'for i in A..B' loop\n");
  CHECK(toytest::diagnostics_of("for i in 0 to 3\nend\n", m) ==
        "t.trace:1:10: error: expected a range A..B\n"
        "  for i in 0 to 3\n"
        "           ^^^^^^\n"
        "hint: write a loop as: for i in 0..n-1  (inclusive bounds, expressions in n), closed by end\n");
  CHECK(toytest::diagnostics_of("for n in 0..3\nend\n", m) ==
        "t.trace:1:5: error: loop variable 'n' is already in use\n"
        "  for n in 0..3\n"
        "      ^\n"
        "hint: pick another name: in scope are n\n");
}

TEST_CASE("diagnostics are all collected, in order, and capped", "[assembler][errors]") {
  const Machine m = builtin_machine("matmul3");
  auto r = assemble("MAC_Z R0, R1, R9\nLOAD a[0][0], R0\nFOO\nMAX R0, R1, R2\n", m, "t.trace");
  REQUIRE(r.diagnostics.size() == 3);
  CHECK(r.diagnostics[0].line == 1);
  CHECK(r.diagnostics[1].line == 3);
  CHECK(r.diagnostics[2].message == "machine matmul3 has no MAX");
  CHECK(r.program.code.empty());

  std::string many;
  for (int k = 0; k < 50; ++k) many += "MAC_Z R0, R1, R7\n";
  r = assemble(many, m, "t.trace");
  REQUIRE(r.diagnostics.size() == kMaxDiagnostics);
  CHECK(r.diagnostics.back().message == "31 more errors not shown");
}

TEST_CASE("loop expansion is capped", "[assembler][errors][loops]") {
  const Machine m = builtin_machine("softmax3", 8);
  auto r = assemble("for i in 0..1000000\n  MOV R0, r1\nend\n", m, "big.trace");
  REQUIRE(r.diagnostics.size() == 1);
  CHECK(format_diagnostic(r.diagnostics[0]) ==
        "big.trace:1:1: error: the loops expand to more than 1000000 instructions\n"
        "  for i in 0..1000000\n"
        "  ^^^\n"
        "hint: check the loop bounds (write them in terms of n); a trace may expand to at most 1000000 instructions\n");
}

TEST_CASE("caret columns count characters, not bytes", "[assembler][errors]") {
  // The lesson's "−" is 3 bytes in UTF-8; the caret must still land under R7.
  CHECK(toytest::diagnostics_of("LOAD x[n\u22121], R7\n", builtin_machine("softmax3")) ==
        "t.trace:1:14: error: machine softmax3 has no register R7\n"
        "  LOAD x[n\u22121], R7\n"
        "               ^^\n"
        "hint: machine softmax3 has R0, r1, r2\n");
}

TEST_CASE("eval_index_expression", "[assembler]") {
  long long v = 0;
  std::string err;
  std::size_t col = 0;
  CHECK(eval_index_expression("2*(n+1) - -3", {{"n", 4}}, v, err, col));
  CHECK(v == 13);
  CHECK_FALSE(eval_index_expression("n +", {{"n", 4}}, v, err, col));
  CHECK(err == "expected a number or a name");
  CHECK(col == 3);
  CHECK_FALSE(eval_index_expression("99999999999*99999999999", {}, v, err, col));
  CHECK(err == "index arithmetic overflows");
}

TEST_CASE("odd input: empty, comments only, BOM, stray characters", "[assembler][errors]") {
  const Machine m = builtin_machine("matmul3");
  CHECK(assemble("", m, "t").ok());
  CHECK(assemble("", m, "t").program.code.empty());
  CHECK(assemble("# nothing\n\n   # here\n", m, "t").program.code.empty());
  CHECK(toytest::assemble_ok("\xEF\xBB\xBFLOAD a[0][0], R0\n", m).code.size() == 1);
  CHECK(toytest::diagnostics_of("é LOAD a[0][0], R0\n", m) ==
        "t.trace:1:1: error: unexpected 'é'\n"
        "  é LOAD a[0][0], R0\n"
        "  ^\n"
        "hint: a line is [step number] INSTRUCTION operands, e.g. 1  LOAD a[0][0], R0\n");
  CHECK(toytest::diagnostics_of("LOAD a[0][0, R0\n", m) ==
        "t.trace:1:10: error: unclosed '['\n"
        "  LOAD a[0][0, R0\n"
        "           ^^\n"
        "hint: DRAM operands are written a[0][1], x[i] or out[n-1]\n");
}
