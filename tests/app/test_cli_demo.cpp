// `flashlab demo` (what `make demo` runs): every level runs and checks itself.
#include <catch2/catch.hpp>

#include "run_cli.hpp"

using flashlab::test::run_cli;

TEST_CASE("cli demo: the three levels run and pass their own checks", "[demo]") {
  auto r = run_cli("demo");
  CHECK(r.exit_code == 0);
  // Level 1: the toy-machine lesson's Problem 1 counts, softmax reads, the loop-order table.
  CHECK_THAT(r.out, Catch::Contains("cycles        7") && Catch::Contains("MAC R0, R1, R2, R2 | a01 | b10 | c00"));
  CHECK_THAT(r.out, Catch::Contains("DRAM reads 12 (3n)") && Catch::Contains("DRAM reads 8 (2n)"));
  CHECK_THAT(r.out, Catch::Contains("KV loads    64 (n²)"));
  // Level 2: flash equals naive and the counted bytes equal the formula.
  CHECK_THAT(r.out, Catch::Contains("(≤ 1e-12: ok)") && Catch::Contains("equal the closed-form formula: yes"));
  CHECK_THAT(r.out, Catch::Contains("Level 3"));
  CHECK(r.err.empty());
}

TEST_CASE("cli demo: --help, and a stray flag is a usage error", "[demo][errors]") {
  CHECK(run_cli("demo --help").exit_code == 0);
  auto r = run_cli("demo --frob");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Catch::Contains("frob"));
}
