// The shared trace front end under hostile input: deep nesting, loops that would run for ever or
// expand past the cap, integer overflow, floods of errors and very long lines. Every input is
// generated here; each case must end in a located diagnostic (or a correct program) in well under
// a second, without recursion deep enough to matter and without building what it then refuses.
#include <catch2/catch.hpp>

#include <string>

#include "flashlab/toymachine/assembler.hpp"
#include "flashlab/toymachine/frontend.hpp"
#include "flashlab/toymachine/machine.hpp"
#include "toy_test_util.hpp"

using namespace flashlab::toy;

namespace {

std::string repeat(const std::string& s, std::size_t n) {
  std::string out;
  out.reserve(s.size() * n);
  for (std::size_t i = 0; i < n; ++i) out += s;
  return out;
}

// `depth` nested loops with distinct variables around one instruction.
std::string nested_loops(std::size_t depth, const std::string& body = "LOAD a[0][0], R0\n") {
  std::string t;
  for (std::size_t k = 0; k < depth; ++k) t += "for v" + std::to_string(k) + " in 0..1\n";
  return t + body + repeat("end\n", depth);
}

// The only diagnostic of a trace that must not assemble.
Diagnostic only_error(const std::string& text, const Machine& m) {
  const auto r = assemble(text, m, "h.trace");
  REQUIRE(r.diagnostics.size() == 1);
  CHECK(r.program.code.empty());
  return r.diagnostics[0];
}

}  // namespace

TEST_CASE("front end: 100000 nested parentheses or minus signs are a located error, not a stack overflow",
          "[frontend][hostile]") {
  const Machine m = builtin_machine("matmul3");
  const auto parens = only_error("LOAD a[" + repeat("(", 100000) + "0" + repeat(")", 100000) + "][0], R0\n", m);
  CHECK(parens.line == 1);
  CHECK(parens.col == 8 + kMaxNesting);  // the first '(' past the limit
  CHECK(parens.message.rfind("index expression nested deeper than 32 levels in index '(((", 0) == 0);
  CHECK_THAT(parens.hint, Catch::Contains("at most 32 parentheses"));
  const std::string shown = format_diagnostic(parens);
  CHECK(shown.size() < 600);  // the echoed line is a window around the caret
  CHECK_THAT(shown, Catch::Contains("h.trace:1:40: error:") && Catch::Contains("…\n"));

  const auto minus = only_error("LOAD a[" + repeat("-", 100000) + "1][0], R0\n", m);
  CHECK(minus.col == 8 + kMaxNesting);
  CHECK(minus.message.rfind("index expression nested deeper than 32 levels", 0) == 0);

  // Exactly at the limit still evaluates.
  long long v = 0;
  std::string err;
  std::size_t col = 0;
  CHECK(eval_index_expression(repeat("(", kMaxNesting) + "7" + repeat(")", kMaxNesting), {}, v, err, col));
  CHECK(v == 7);
  CHECK(eval_index_expression(repeat("-", kMaxNesting) + "7", {}, v, err, col));
  CHECK(v == 7);
  CHECK_FALSE(eval_index_expression(repeat("(", kMaxNesting + 1) + "7" + repeat(")", kMaxNesting + 1), {}, v, err, col));
  CHECK(col == static_cast<std::size_t>(kMaxNesting));
}

TEST_CASE("front end: 100000 nested loops are one located error", "[frontend][hostile]") {
  const Machine m = builtin_machine("matmul3");
  const auto deep = only_error(nested_loops(100000), m);
  CHECK(deep.line == kMaxNesting + 1);
  CHECK(deep.col == 1);
  CHECK(deep.message == "loops nested deeper than 32 levels");
  CHECK(deep.hint == "flatten the trace: at most 32 loops may be open at once");
  // 32 levels are fine: 2^32 iterations would not be, so the innermost loops run once.
  std::string ok;
  for (int k = 0; k < kMaxNesting; ++k) ok += "for v" + std::to_string(k) + " in 0..0\n";
  const auto r = assemble(ok + "LOAD a[0][0], R0\n" + repeat("end\n", kMaxNesting), m, "ok.trace");
  REQUIRE(r.ok());
  CHECK(r.program.code.size() == 1);
  // The same variable reused at every level: one error per line, capped.
  const auto same = assemble(repeat("for i in 0..1\n", 100000) + repeat("end\n", 100000), m, "same.trace");
  REQUIRE(same.diagnostics.size() == kMaxDiagnostics);
  CHECK(same.diagnostics[0].message == "loop variable 'i' is already in use");
}

TEST_CASE("front end: loops are counted before they are built", "[frontend][hostile][loops]") {
  const Machine m = builtin_machine("matmul3");
  // An empty body a billion times expands to nothing, at once.
  const auto empty = assemble("for i in 0..1000000000\nend\nLOAD a[0][0], R0\n", m, "e.trace");
  REQUIRE(empty.ok());
  CHECK(empty.program.code.size() == 1);
  // Bounds at the ends of the 64-bit range: no signed overflow in the loop counter.
  const auto top = assemble("for i in 9223372036854775806..9223372036854775807\nend\n", m, "top.trace");
  CHECK(top.ok());
  // Over the cap in closed form: refused without building a million instructions first.
  const auto big = only_error("for i in 0..1000000000000\n  LOAD a[0][0], R0\nend\n", m);
  CHECK(big.message == "the loops expand to more than 1000000 instructions");
  const auto max = only_error("for i in 0..9223372036854775807\n  LOAD a[0][0], R0\nend\n", m);
  CHECK(max.message == "the loops expand to more than 1000000 instructions");
  const auto all = only_error("for i in -9223372036854775807-1..9223372036854775807\nend\n", m);
  CHECK(all.message == "the loops iterate 2^64 times");
  // A loop that only spins (its inner loop never runs) is refused by its iteration count.
  const auto spin = only_error("for i in 0..1000000000\n  for j in 0..-1\n    LOAD a[0][0], R0\n  end\nend\n", m);
  CHECK(spin.line == 1);
  CHECK(spin.message == "the loops iterate more than 1000000 times");
  CHECK_THAT(spin.hint, Catch::Contains("check the loop bounds"));
  // Inner bounds that depend on the outer variable are counted exactly.
  const auto tri = assemble("for i in 0..299\n  for j in 0..i\n    LOAD a[0][0], R0\n  end\nend\n", m, "tri.trace");
  REQUIRE(tri.ok());
  CHECK(tri.program.code.size() == 300 * 301 / 2);
}

TEST_CASE("front end: index arithmetic is checked, never wrapped", "[frontend][hostile]") {
  const Machine m = builtin_machine("matmul3");
  CHECK(toytest::diagnostics_of("LOAD a[3037000500*3037000500][0], R0\n", m) ==
        "t.trace:1:18: error: index arithmetic overflows in index '3037000500*3037000500' (with n = 8)\n"
        "  LOAD a[3037000500*3037000500][0], R0\n"
        "                   ^\n"
        "hint: an index is a 64-bit integer: check the expression and the loop bounds\n");
  // Negating the most negative integer.
  const auto neg = only_error("LOAD a[-(-9223372036854775807-1)][0], R0\n", m);
  CHECK(neg.col == 8);
  CHECK(neg.message == "index arithmetic overflows in index '-(-9223372036854775807-1)' (with n = 8)");
  const auto sub = only_error("LOAD a[0-(-9223372036854775807-1)][0], R0\n", m);
  CHECK(sub.message.rfind("index arithmetic overflows", 0) == 0);
  // An overflow that depends on a loop variable names its value.
  const auto loop = only_error("for i in 0..3\n  LOAD a[i*4611686018427387904][0], R0\nend\n", m);
  CHECK(loop.line == 2);
  CHECK(loop.message == "index arithmetic overflows in index 'i*4611686018427387904' (with n = 8, i = 2)");
  const auto lit = only_error("LOAD a[99999999999999999999][0], R0\n", m);
  CHECK(lit.message == "number too large in index '99999999999999999999'");
}

TEST_CASE("front end: a flood of errors is capped and stays cheap", "[frontend][hostile]") {
  const Machine m = builtin_machine("matmul3");
  const auto r = assemble(repeat("FROB R0\n", 50000), m, "flood.trace");
  REQUIRE(r.diagnostics.size() == kMaxDiagnostics);
  CHECK(r.diagnostics.back().message == "49981 more errors not shown");
}
