// The executor: runtime faults (golden messages), the pure step, true back-steps, history, and
// numeric-only mode agreeing with the symbolic mode.
#include <catch2/catch.hpp>

#include "flashlab/toymachine/executor.hpp"
#include "flashlab/toymachine/machine.hpp"
#include "toy_test_util.hpp"

using namespace flashlab::toy;

namespace {

// Runs `text` on `m` and returns the formatted fault ("" when it ran to the end).
std::string fault_of(const std::string& text, const Machine& m, Options opt = {}) {
  const Program p = toytest::assemble_ok(text, m);
  Executor ex(p, m, random_inputs(m, 1), opt);
  const auto f = ex.run();
  if (!f) return "";
  CHECK(ex.done());
  CHECK(ex.fault().has_value());
  CHECK(ex.steps_taken() + 1 == f->step);  // the faulting instruction did not execute
  return format_fault(*f, "t.trace");
}

}  // namespace

TEST_CASE("fault: read of a register never written", "[executor][faults]") {
  CHECK(fault_of("LOAD a[0][0], R0\nMAC_Z R0, R1, R2\n", builtin_machine("matmul3")) ==
        "t.trace:2: step 2: error: MAC_Z R0, R1, R2: reads R1, which was never written\n"
        "hint: give R1 a value first: LOAD it from DRAM or make it the destination of an earlier instruction\n");
  // STORE of an empty register, too.
  CHECK(fault_of("STORE r2, out[0]\n", builtin_machine("softmax3")) ==
        "t.trace:1: step 1: error: STORE r2, out[0]: reads r2, which was never written\n"
        "hint: give r2 a value first: LOAD it from DRAM or make it the destination of an earlier instruction\n");
}

TEST_CASE("fault: DRAM index out of range", "[executor][faults]") {
  CHECK(fault_of("for i in 0..n\n  LOAD x[i], R0\nend\n", builtin_machine("softmax3", 8)) ==
        "t.trace:2: step 9: error: LOAD x[8], R0: x[8] is out of range\n"
        "hint: x has 8 elements: x[0]..x[7] (the last is x[n-1], n = 8)\n");
  CHECK(fault_of("LOAD a[2][0], R0\n", builtin_machine("matmul3")) ==
        "t.trace:1: step 1: error: LOAD a[2][0], R0: a[2][0] is out of range\n"
        "hint: a[2][2]: rows 0..1, columns 0..1\n");
  CHECK(fault_of("LOAD x[0-1], R0\n", builtin_machine("softmax3", 4)) ==
        "t.trace:1: step 1: error: LOAD x[-1], R0: x[-1] is out of range\n"
        "hint: x has 4 elements: x[0]..x[3] (the last is x[n-1], n = 4)\n");
}

TEST_CASE("fault: undeclared array", "[executor][faults]") {
  CHECK(fault_of("LOAD x[0], R0\nSTORE R0, y[0]\n", builtin_machine("softmax3", 8)) ==
        "t.trace:2: step 2: error: STORE R0, y[0]: machine softmax3 has no DRAM array 'y'\n"
        "hint: its DRAM arrays are x[8] (input), out[8] (output)\n");
}

TEST_CASE("fault: STORE into an input array", "[executor][faults]") {
  CHECK(fault_of("LOAD a[0][0], R0\nSTORE R0, b[1][1]\n", builtin_machine("matmul3")) ==
        "t.trace:2: step 2: error: STORE R0, b[1][1]: stores into input array b, which is read-only\n"
        "hint: results go to the output array: c[2][2]\n");
}

TEST_CASE("fault: read of an output cell never written", "[executor][faults]") {
  CHECK(fault_of("LOAD x[0], R0\nSTORE R0, out[0]\nLOAD out[0], r1\nLOAD out[2], r2\n", builtin_machine("softmax3", 4)) ==
        "t.trace:4: step 4: error: LOAD out[2], r2: reads out[2], which was never written\n"
        "hint: output cells start empty: STORE a value into out[2] before loading it\n");
}

TEST_CASE("fault: cycle cap exceeded", "[executor][faults]") {
  const Machine m = builtin_machine("matmul3");
  CHECK(fault_of(toytest::read_trace("p1_c00.trace"), m, Options{true, 5}) ==
        "t.trace:9: step 6: error: MAC R0, R1, R2, R2: the cycle cap of 5 would be exceeded (5 cycles so far)\n"
        "hint: the trace runs longer than allowed: check the loop bounds, or raise the cap (--max-cycles)\n");
  // Exactly at the cap is fine.
  CHECK(fault_of(toytest::read_trace("p1_c00.trace"), m, Options{true, 7}).empty());
  // The numeric-only fast path enforces the same cap.
  CHECK(fault_of(toytest::read_trace("p1_c00.trace"), m, Options{false, 5}).find("step 6: error") != std::string::npos);
}

TEST_CASE("machine-file cycle costs count", "[executor]") {
  const Machine m = parse_machine_file(
      "registers R0 r1\nisa LOAD STORE EXP\ncycles EXP 10\ninput x[n]\noutput out[n]\n", "m.machine", 2);
  const Program p = toytest::assemble_ok("LOAD x[1], R0\nEXP R0, r1\nSTORE r1, out[0]\n", m);
  Executor ex(p, m, Inputs{{"x", {0.5, 2.0}}});
  REQUIRE_FALSE(ex.run());
  CHECK(ex.state().counters.cycles == 12);
  CHECK(ex.state().dram[1][0]->num == Approx(std::exp(2.0)));
  CHECK(ex.state().counters.element_reads[0] == std::vector<std::uint32_t>{0, 1});
  CHECK(ex.state().counters.element_writes[1] == std::vector<std::uint32_t>{1, 0});
}

TEST_CASE("constants: LOAD from a constant array, STORE into it faults", "[executor]") {
  const Machine m = parse_machine_file(
      "registers R0 r1\nisa LOAD STORE ADD\ninput x[n]\noutput out[n]\nconstant one = 1\n", "m.machine", 1);
  const Program p = toytest::assemble_ok("LOAD x[0], R0\nLOAD one, r1\nADD R0, r1, R0\nSTORE R0, out[0]\n", m);
  Executor ex(p, m, Inputs{{"x", {2.5}}});
  REQUIRE_FALSE(ex.run());
  CHECK(ex.state().dram[1][0]->num == 3.5);
  CHECK(to_string(*ex.state().dram[1][0]->sym) == "x0 + 1");
  CHECK(fault_of("LOAD x[0], R0\nSTORE R0, one\n", m) ==
        "t.trace:2: step 2: error: STORE R0, one: stores into constant array one, which is read-only\n"
        "hint: results go to the output array: out[1]\n");
}

TEST_CASE("back() restores the previous state exactly, and step after back replays identically", "[executor]") {
  const Machine m = builtin_machine("softmax4", 5);
  const Program p = toytest::assemble_ok(toytest::read_trace("p5_online_softmax4.trace"), m);
  Executor ex(p, m, random_inputs(m, 3));
  REQUIRE_FALSE(ex.run());
  const std::size_t total = ex.steps_taken();
  REQUIRE(ex.history().size() == total);
  const auto final_cycles = ex.state().counters.cycles;
  const auto final_out = ex.state().dram[1][4]->num;
  // Walk all the way back, checking each state against the recorded history.
  for (std::size_t k = total; k > 0; --k) {
    const State expected = ex.history()[k - 1];
    REQUIRE(ex.back());
    CHECK(ex.state().pc == k - 1);
    CHECK(ex.state().counters.cycles == expected.counters.cycles);
    CHECK(ex.state().counters.dram_reads == expected.counters.dram_reads);
    for (std::size_t r = 0; r < expected.registers.size(); ++r) {
      REQUIRE(ex.state().registers[r].has_value() == expected.registers[r].has_value());
      if (expected.registers[r]) CHECK(ex.state().registers[r]->sym == expected.registers[r]->sym);
    }
  }
  CHECK_FALSE(ex.back());
  CHECK(ex.state().counters.cycles == 0);
  CHECK_FALSE(ex.state().registers[0].has_value());
  REQUIRE_FALSE(ex.run());
  CHECK(ex.state().counters.cycles == final_cycles);
  CHECK(ex.state().dram[1][4]->num == final_out);
}

TEST_CASE("back() after a fault clears it", "[executor]") {
  const Machine m = builtin_machine("matmul3");
  const Program p = toytest::assemble_ok("LOAD a[0][0], R0\nMAC_Z R0, R1, R2\n", m);
  Executor ex(p, m, random_inputs(m, 1));
  CHECK_FALSE(ex.step());
  CHECK(ex.step().has_value());
  CHECK(ex.done());
  CHECK(ex.steps_taken() == 1);
  REQUIRE(ex.back());
  CHECK_FALSE(ex.fault().has_value());
  CHECK(ex.steps_taken() == 0);
  CHECK_FALSE(ex.done());
}

TEST_CASE("next_state is pure: the input state is unchanged", "[executor]") {
  const Machine m = builtin_machine("matmul3");
  const Program p = toytest::assemble_ok(toytest::read_trace("p1_c00.trace"), m);
  const State s0 = initial_state(m, random_inputs(m, 1), true);
  State s1;
  REQUIRE_FALSE(next_state(p, m, s0, s1, 0));
  CHECK(s0.pc == 0);
  CHECK_FALSE(s0.registers[0].has_value());
  CHECK(s1.pc == 1);
  REQUIRE(s1.registers[0].has_value());
  CHECK(to_string(*s1.registers[0]->sym) == "a00");
  REQUIRE(s1.last_access.has_value());
  CHECK(s1.last_access->kind == AccessKind::Read);
  CHECK(s1.counters.element_reads[0][0] == 1);
}

TEST_CASE("numeric-only mode gives the same numbers and counters as the symbolic mode", "[executor]") {
  for (const auto& [file, machine, n] : {std::tuple{"p3_outer_matmul6.trace", "matmul6", 8},
                                         std::tuple{"p4_safe_softmax3.trace", "softmax3", 17},
                                         std::tuple{"p5_online_softmax4.trace", "softmax4", 17}}) {
    const Machine m = builtin_machine(machine, n);
    const Program p = toytest::assemble_ok(toytest::read_trace(file), m);
    const Inputs in = random_inputs(m, 9);
    Executor sym(p, m, in, Options{true, 0});
    Executor num(p, m, in, Options{false, 0});
    REQUIRE_FALSE(sym.run());
    REQUIRE_FALSE(num.run());
    CHECK(num.history().empty());
    CHECK_FALSE(num.back());
    CHECK(num.state().counters.cycles == sym.state().counters.cycles);
    CHECK(num.state().counters.instructions == sym.state().counters.instructions);
    CHECK(num.state().counters.element_reads == sym.state().counters.element_reads);
    for (std::size_t a = 0; a < m.arrays.size(); ++a)
      for (std::size_t k = 0; k < m.arrays[a].size(); ++k) {
        REQUIRE(num.state().dram[a][k].has_value() == sym.state().dram[a][k].has_value());
        if (num.state().dram[a][k]) {
          CHECK(num.state().dram[a][k]->num == sym.state().dram[a][k]->num);
          CHECK(num.state().dram[a][k]->sym == nullptr);
        }
      }
  }
}

TEST_CASE("random_inputs is deterministic per seed, and bad inputs are rejected", "[executor]") {
  const Machine m = builtin_machine("softmax3", 16);
  CHECK(random_inputs(m, 5) == random_inputs(m, 5));
  CHECK(random_inputs(m, 5) != random_inputs(m, 6));
  const Inputs in = random_inputs(m, 5);
  for (double v : in.at("x")) CHECK((v >= -2.0 && v <= 2.0));
  CHECK_THROWS_WITH(initial_state(m, Inputs{{"x", {1.0}}}, true), "x[16] needs 16 values, got 1");
  CHECK_THROWS_WITH(initial_state(m, Inputs{{"y", {1.0}}}, true),
                    "machine softmax3 has no input array 'y' (its inputs: x[16])");
  CHECK_THROWS_WITH(initial_state(m, Inputs{}, true), "no values for input array x[16]");
}
