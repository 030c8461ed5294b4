// The dispatcher: help, version, unknown commands.
#include <catch2/catch.hpp>

#include "run_cli.hpp"

using flashlab::test::run_cli;

TEST_CASE("cli: --help lists the commands and exits 0", "[cli]") {
  auto r = run_cli("--help");
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("Commands:") && Catch::Contains("run"));
}

TEST_CASE("cli: no command is a usage error", "[cli][errors]") {
  auto r = run_cli("");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Catch::Contains("Usage: flashlab"));
}

TEST_CASE("cli: unknown command names itself and hints", "[cli][errors]") {
  auto r = run_cli("frobnicate");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Catch::Contains("unknown command 'frobnicate'") && Catch::Contains("hint:"));
}
