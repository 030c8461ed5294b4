// The lesson's own traces (toymachine/traces/, typed in as printed) give the lesson's counts, and
// their outputs equal an independent reference (C = A·B; softmax computed here) on several
// random inputs. The toy-machine lesson: Problems 1, 2, 3 (cost table 25/13 vs 22/10), 4 (3n reads, n writes)
// and 5 (2n reads, n writes).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

#include "flashlab/toymachine/executor.hpp"
#include "flashlab/toymachine/machine.hpp"
#include "toy_test_util.hpp"

using namespace flashlab::toy;

namespace {

std::size_t count(const Counters& c, Opcode op) { return c.instructions[static_cast<std::size_t>(op)]; }

// C = A·B computed here from the inputs, not by the machine.
std::vector<double> matmul_ref(const Inputs& in) {
  const auto& a = in.at("a");
  const auto& b = in.at("b");
  std::vector<double> c(4, 0.0);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j)
      for (int k = 0; k < 2; ++k) c[i * 2 + j] += a[i * 2 + k] * b[k * 2 + j];
  return c;
}

// softmax in long double, the textbook way (max-subtracted).
std::vector<double> softmax_ref(const std::vector<double>& x) {
  long double m = *std::max_element(x.begin(), x.end()), s = 0;
  for (double v : x) s += std::exp(static_cast<long double>(v) - m);
  std::vector<double> out;
  for (double v : x) out.push_back(static_cast<double>(std::exp(static_cast<long double>(v) - m) / s));
  return out;
}

std::vector<double> output(const Executor& ex, const std::string& name) {
  const int ai = ex.machine().find_array(name);
  REQUIRE(ai >= 0);
  std::vector<double> v;
  for (const auto& cell : ex.state().dram[static_cast<std::size_t>(ai)]) {
    REQUIRE(cell.has_value());
    v.push_back(cell->num);
  }
  return v;
}

void check_close(const std::vector<double>& got, const std::vector<double>& ref, double tol) {
  REQUIRE(got.size() == ref.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": got " << got[i] << ", reference " << ref[i]);
    CHECK(std::fabs(got[i] - ref[i]) <= tol * std::max(1.0, std::fabs(ref[i])));
  }
}

}  // namespace

TEST_CASE("lesson Problem 1: c00 on matmul3 is 7 cycles = 4 LOAD + 2 MAC + 1 STORE", "[lesson][matmul]") {
  const Machine m = builtin_machine("matmul3");
  const Program p = toytest::assemble_ok(toytest::read_trace("p1_c00.trace"), m);
  for (std::uint64_t seed : {1, 2, 3, 42}) {
    const Inputs in = random_inputs(m, seed);
    Executor ex(p, m, in);
    REQUIRE_FALSE(ex.run());
    const Counters& c = ex.state().counters;
    CHECK(c.cycles == 7);
    CHECK(count(c, Opcode::LOAD) == 4);
    CHECK(count(c, Opcode::MAC_Z) + count(c, Opcode::MAC) == 2);
    CHECK(count(c, Opcode::STORE) == 1);
    CHECK(c.dram_reads == 4);
    CHECK(c.dram_writes == 1);
    const auto& cell = ex.state().dram[2][0];
    REQUIRE(cell);
    CHECK(cell->num == Approx(matmul_ref(in)[0]).epsilon(1e-12));
    CHECK(to_string(*cell->sym) == "a00·b00 + a01·b10");
    CHECK(to_string(*cell->sym, &m.names) == "c00");
    // c01, c10, c11 were never written.
    CHECK_FALSE(ex.state().dram[2][1].has_value());
  }
}

TEST_CASE("lesson Problem 2: inner-product matmul on matmul3 is 25 cycles with 13 LOADs", "[lesson][matmul]") {
  const Machine m = builtin_machine("matmul3");
  const Program p = toytest::assemble_ok(toytest::read_trace("p2_inner_matmul3.trace"), m);
  for (std::uint64_t seed : {1, 7, 99}) {
    const Inputs in = random_inputs(m, seed);
    Executor ex(p, m, in);
    REQUIRE_FALSE(ex.run());
    const Counters& c = ex.state().counters;
    CHECK(c.cycles == 25);
    CHECK(count(c, Opcode::LOAD) == 13);
    CHECK(c.dram_writes == 4);
    check_close(output(ex, "c"), matmul_ref(in), 1e-12);
  }
}

TEST_CASE("lesson Problem 3: outer-product matmul on matmul6 is 22 cycles with 10 LOADs", "[lesson][matmul]") {
  const Machine m = builtin_machine("matmul6");
  const Program p = toytest::assemble_ok(toytest::read_trace("p3_outer_matmul6.trace"), m);
  for (std::uint64_t seed : {1, 5, 123}) {
    const Inputs in = random_inputs(m, seed);
    Executor ex(p, m, in);
    REQUIRE_FALSE(ex.run());
    const Counters& c = ex.state().counters;
    CHECK(c.cycles == 22);
    CHECK(count(c, Opcode::LOAD) == 10);
    CHECK(count(c, Opcode::MAC_Z) + count(c, Opcode::MAC) == 8);
    CHECK(count(c, Opcode::STORE) == 4);
    check_close(output(ex, "c"), matmul_ref(in), 1e-12);
    // Every output register ends as the named definition (the lesson's table, steps 12-18).
    for (int r = 2; r <= 5; ++r) {
      const auto& v = ex.state().registers[static_cast<std::size_t>(r)];
      REQUIRE(v);
      const std::string s = to_string(*v->sym, &m.names);
      CHECK((s == "c00" || s == "c01" || s == "c10" || s == "c11"));
    }
  }
  // The problem is unsolvable on matmul3: the trace uses R3..R5.
  CHECK_FALSE(assemble(toytest::read_trace("p3_outer_matmul6.trace"), builtin_machine("matmul3"), "p3").ok());
}

TEST_CASE("lesson Problem 4: safe softmax on softmax3 reads 3n and writes n, for several n", "[lesson][softmax]") {
  const std::string text = toytest::read_trace("p4_safe_softmax3.trace");
  for (int n : {1, 2, 3, 8, 33}) {
    const Machine m = builtin_machine("softmax3", n);
    const Program p = toytest::assemble_ok(text, m);
    for (std::uint64_t seed : {1, 2, 3}) {
      INFO("n = " << n << ", seed = " << seed);
      const Inputs in = random_inputs(m, seed);
      Executor ex(p, m, in);
      REQUIRE_FALSE(ex.run());
      const Counters& c = ex.state().counters;
      CHECK(c.dram_reads == 3u * static_cast<unsigned>(n));
      CHECK(c.dram_writes == static_cast<unsigned>(n));
      check_close(output(ex, "out"), softmax_ref(in.at("x")), 1e-12);
    }
  }
}

TEST_CASE("lesson Problem 4 typed in as printed for n = 3", "[lesson][softmax]") {
  const Machine m = builtin_machine("softmax3", 3);
  const Program p = toytest::assemble_ok(toytest::read_trace("p4_safe_softmax3_n3.trace"), m);
  const Inputs in = random_inputs(m, 11);
  Executor ex(p, m, in);
  REQUIRE_FALSE(ex.run());
  CHECK(ex.state().counters.dram_reads == 9);
  CHECK(ex.state().counters.dram_writes == 3);
  check_close(output(ex, "out"), softmax_ref(in.at("x")), 1e-12);
  // The lesson's tables: r1 = m after pass 1, r2 = S after pass 2, out[i] = e^(xi − m)/S.
  CHECK(to_string(*ex.state().registers[1]->sym, &m.names) == "m");
  CHECK(to_string(*ex.state().registers[2]->sym, &m.names) == "S");
  CHECK(to_string(*ex.state().dram[1][2]->sym, &m.names) == "e^(x2 − m)/S");
}

TEST_CASE("lesson Problem 5: online softmax on softmax4 reads 2n and writes n, for several n", "[lesson][softmax]") {
  for (const char* file : {"p5_online_softmax4.trace", "p5_online_softmax4_n3.trace"}) {
    const std::string text = toytest::read_trace(file);
    const bool fixed = std::string(file).find("_n3") != std::string::npos;
    for (int n : fixed ? std::vector<int>{3} : std::vector<int>{1, 2, 3, 8, 50}) {
      const Machine m = builtin_machine("softmax4", n);
      const Program p = toytest::assemble_ok(text, m);
      for (std::uint64_t seed : {1, 2, 3}) {
        INFO(file << ", n = " << n << ", seed = " << seed);
        const Inputs in = random_inputs(m, seed);
        Executor ex(p, m, in);
        REQUIRE_FALSE(ex.run());
        CHECK(ex.state().counters.dram_reads == 2u * static_cast<unsigned>(n));
        CHECK(ex.state().counters.dram_writes == static_cast<unsigned>(n));
        check_close(output(ex, "out"), softmax_ref(in.at("x")), 1e-12);
        // "Two paths to the same sum": the running sum folds into the two-pass S exactly.
        if (n > 1) CHECK(to_string(*ex.state().registers[2]->sym, &m.names) == "S");
      }
    }
  }
  // The online trace needs r3: softmax3 rejects it at assembly.
  CHECK_FALSE(assemble(toytest::read_trace("p5_online_softmax4.trace"), builtin_machine("softmax3"), "p5").ok());
}

TEST_CASE("online softmax does not overflow where the naive sum would", "[lesson][softmax]") {
  // The toy-machine lesson, "Numerical safety": every exponent is <= 0, so x = 1000 is fine.
  const Machine m = builtin_machine("softmax4", 4);
  const Program p = toytest::assemble_ok(toytest::read_trace("p5_online_softmax4.trace"), m);
  Inputs in{{"x", {1000.0, 999.0, 1001.0, 998.0}}};
  Executor ex(p, m, in, Options{false, 0});
  REQUIRE_FALSE(ex.run());
  check_close(output(ex, "out"), softmax_ref(in.at("x")), 1e-12);
}
