// The stepper's timeline: checkpoints plus re-execution give exactly the states a full history
// would, memory stays bounded on long traces, `g :L` finds the next execution of a line, and
// moves stop at a fault. The run policy (symbolic or numeric-only) is checked here too.
#include <catch2/catch.hpp>

#include <string>

#include "flashlab/toymachine/executor.hpp"
#include "flashlab/toymachine/machine.hpp"
#include "flashlab/toymachine/policy.hpp"
#include "flashlab/toymachine/timeline.hpp"
#include "toy_test_util.hpp"

using namespace flashlab::toy;

namespace {

void require_same(const State& a, const State& b) {
  REQUIRE(a.pc == b.pc);
  REQUIRE(a.counters.cycles == b.counters.cycles);
  REQUIRE(a.counters.dram_reads == b.counters.dram_reads);
  REQUIRE(a.registers.size() == b.registers.size());
  for (std::size_t r = 0; r < a.registers.size(); ++r) {
    REQUIRE(a.registers[r].has_value() == b.registers[r].has_value());
    if (a.registers[r]) REQUIRE(a.registers[r]->num == b.registers[r]->num);
  }
  REQUIRE(a.dram.size() == b.dram.size());
  for (std::size_t i = 0; i < a.dram.size(); ++i)
    for (std::size_t e = 0; e < a.dram[i].size(); ++e) {
      REQUIRE(a.dram[i][e].has_value() == b.dram[i][e].has_value());
      if (a.dram[i][e]) REQUIRE(a.dram[i][e]->num == b.dram[i][e]->num);
    }
}

// A long softmax-style trace: n loads and stores repeated `rounds` times (line 2 and line 3).
std::string long_trace(int rounds) {
  return "for r in 0.." + std::to_string(rounds - 1) +
         "\n  for i in 0..n-1\n    LOAD x[i], R0\n    EXP R0, r1\n    STORE r1, out[i]\n  end\nend\n";
}

}  // namespace

TEST_CASE("timeline: back-steps re-execute to exactly the state a full history holds", "[timeline]") {
  const Machine m = builtin_machine("softmax3", 8);
  const Program p = toytest::assemble_ok(long_trace(40), m);  // 960 steps
  const Inputs in = random_inputs(m, 3);
  Executor full(p, m, in, Options{true, kDefaultCycleCap});
  REQUIRE_FALSE(full.run());
  Timeline tl(p, m, in, Options{true, kDefaultCycleCap});
  tl.run_to_end();
  REQUIRE(tl.position() == p.code.size());
  require_same(tl.state(), full.state());
  for (std::size_t k = p.code.size(); k-- > p.code.size() - 50;) {
    REQUIRE(tl.back());
    require_same(tl.state(), full.history()[k]);
    REQUIRE(tl.previous());
    require_same(*tl.previous(), full.history()[k - 1]);
  }
  tl.go_to(0);
  CHECK(tl.previous() == nullptr);
  CHECK_FALSE(tl.back());
  tl.go_to(317);
  require_same(tl.state(), full.history()[317]);
  REQUIRE(tl.step());
  require_same(*tl.previous(), full.history()[317]);
  require_same(tl.state(), full.history()[318]);
}

TEST_CASE("timeline: a long trace keeps few checkpoints and stays exact", "[timeline][hostile]") {
  const Machine m = builtin_machine("softmax3", 8);
  const Program p = toytest::assemble_ok(long_trace(2000), m);  // 48,000 steps
  REQUIRE(p.code.size() == 48000);
  CHECK_FALSE(fits_symbolic(p.code.size(), m));
  const Inputs in = random_inputs(m, 1);
  Timeline tl(p, m, in, Options{false, kDefaultCycleCap});
  tl.run_to_end();
  CHECK(tl.position() == p.code.size());
  CHECK(tl.checkpoint_interval() > 1);
  CHECK(tl.checkpoints() <= p.code.size() / tl.checkpoint_interval() + 1);
  // The last write was out[7] = e^x[7]; one step back undoes exactly that STORE.
  REQUIRE(tl.back());
  CHECK(tl.state().counters.dram_writes == 48000 / 3 - 1);
  CHECK(tl.previous()->pc == p.code.size() - 2);
  // g :L: the next execution of line 4 (EXP) after the current position. Steps 0, 1, 2 run
  // lines 3, 4, 5, so at step 100 line 4 is the instruction about to run: the next one is 103.
  tl.go_to(100);
  const auto next = tl.find_line(4);
  REQUIRE(next);
  CHECK_FALSE(next->wrapped);
  CHECK(next->step == 103);
  tl.go_to(next->step);
  CHECK(tl.position() == 103);
  const auto again = tl.find_line(4);
  REQUIRE(again);
  CHECK(again->step == 106);
  // …and from the end, back to the first one, saying so.
  tl.run_to_end();
  const auto wrapped = tl.find_line(3);
  REQUIRE(wrapped);
  CHECK(wrapped->wrapped);
  CHECK(wrapped->step == 0);
  CHECK_FALSE(tl.find_line(99));
}

TEST_CASE("timeline: moves stop at a fault and step back from it", "[timeline][faults]") {
  const Machine m = builtin_machine("matmul3");
  const Program p = toytest::assemble_ok("LOAD a[0][0], R0\nLOAD a[0][1], R1\nMAC_Z R0, R2, R1\nSTORE R1, c[0][0]\n", m);
  Timeline tl(p, m, random_inputs(m, 1), Options{true, kDefaultCycleCap});
  tl.run_to_end();
  CHECK(tl.position() == 2);
  REQUIRE(tl.fault());
  CHECK(tl.fault()->step == 3);
  CHECK(tl.done());
  CHECK_FALSE(tl.step());
  REQUIRE(tl.back());
  CHECK(tl.position() == 1);
  CHECK_FALSE(tl.fault());
  tl.go_to(4);
  CHECK(tl.position() == 2);
  CHECK(tl.fault());
}

TEST_CASE("run policy: symbolic runs are bounded by steps and by steps x cells", "[timeline][policy]") {
  const Machine small = builtin_machine("matmul3");
  CHECK(fits_symbolic(kMaxSymbolicSteps, small));
  CHECK_FALSE(fits_symbolic(kMaxSymbolicSteps + 1, small));
  const Machine wide = builtin_machine("softmax3", 1 << 20);  // two arrays of 2^20 cells
  CHECK(dram_cells(wide) == 2u << 20);
  CHECK(fits_symbolic(1, wide));
  CHECK_FALSE(fits_symbolic(2, wide));
}
