// The step table and counters block: golden text for the lesson's Problem 1 table.
#include <catch2/catch.hpp>

#include "flashlab/toymachine/render.hpp"
#include "toy_test_util.hpp"

using namespace flashlab::toy;

namespace {
std::vector<State> all_states(const Executor& ex) {
  std::vector<State> s = ex.history();
  s.push_back(ex.state());
  return s;
}
}  // namespace

TEST_CASE("render: the lesson's Problem 1 table, symbolic", "[render]") {
  const Machine m = builtin_machine("matmul3");
  Executor ex(toytest::assemble_ok(toytest::read_trace("p1_c00.trace"), m), m, random_inputs(m, 1));
  REQUIRE_FALSE(ex.run());
  CHECK(render_table(ex.program(), m, all_states(ex), {}) ==
        "Step | Instruction        | R0  | R1  | R2\n"
        "-----+--------------------+-----+-----+--------\n"
        "   1 | LOAD a[0][0], R0   | a00 |     |\n"
        "   2 | LOAD b[0][0], R1   | a00 | b00 |\n"
        "   3 | MAC_Z R0, R1, R2   | a00 | b00 | a00·b00\n"
        "   4 | LOAD a[0][1], R0   | a01 | b00 | a00·b00\n"
        "   5 | LOAD b[1][0], R1   | a01 | b10 | a00·b00\n"
        "   6 | MAC R0, R1, R2, R2 | a01 | b10 | c00\n"
        "   7 | STORE R2, c[0][0]  | a01 | b10 | c00\n");
  CHECK(render_counters(m, ex.state().counters) ==
        "cycles        7\n"
        "instructions  7 (LOAD 4, STORE 1, MAC_Z 1, MAC 1)\n"
        "DRAM reads    4 (a 2, b 2)\n"
        "DRAM writes   1 (c 1)\n");
}

TEST_CASE("render: ditto marks and numeric cells", "[render]") {
  const Machine m = builtin_machine("matmul3");
  const Inputs in{{"a", {1, 2, 3, 4}}, {"b", {0.5, -1, 2, 0.25}}};
  Executor ex(toytest::assemble_ok(toytest::read_trace("p1_c00.trace"), m), m, in);
  REQUIRE_FALSE(ex.run());
  RenderOptions ditto;
  ditto.ditto = true;
  CHECK(render_table(ex.program(), m, all_states(ex), ditto) ==
        "Step | Instruction        | R0  | R1  | R2\n"
        "-----+--------------------+-----+-----+--------\n"
        "   1 | LOAD a[0][0], R0   | a00 |     |\n"
        "   2 | LOAD b[0][0], R1   | \"   | b00 |\n"
        "   3 | MAC_Z R0, R1, R2   | \"   | \"   | a00·b00\n"
        "   4 | LOAD a[0][1], R0   | a01 | \"   | \"\n"
        "   5 | LOAD b[1][0], R1   | \"   | b10 | \"\n"
        "   6 | MAC R0, R1, R2, R2 | \"   | \"   | c00\n"
        "   7 | STORE R2, c[0][0]  | \"   | \"   | \"\n");
  RenderOptions num;
  num.numeric = true;
  const std::string t = render_table(ex.program(), m, all_states(ex), num);
  CHECK_THAT(t, Catch::Contains("   6 | MAC R0, R1, R2, R2 | 2  | 2   | 4.5\n"));
}

TEST_CASE("render: long cells are cut at max_cell characters", "[render]") {
  const Machine m = builtin_machine("softmax3", 3);
  std::optional<Value> v = Value{1.0, make_add(make_input("x", 0, "x0"), make_input("x", 1, "x1"))};
  RenderOptions o;
  o.max_cell = 4;
  CHECK(render_cell(v, m, o) == "x0 \u2026");
  CHECK(display_width(render_cell(v, m, o)) == 4);
  CHECK(render_cell(std::nullopt, m, o).empty());
}
