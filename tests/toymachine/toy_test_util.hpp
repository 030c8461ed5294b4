// Helpers shared by the toy-machine tests: read one of the lesson's traces, assemble it (failing loudly with
// the diagnostics), and run it.
#pragma once

#include <catch2/catch.hpp>

#include <fstream>
#include <sstream>
#include <string>

#include "flashlab/toymachine/assembler.hpp"
#include "flashlab/toymachine/executor.hpp"

namespace toytest {

inline std::string read_trace(const std::string& name) {
  const std::string path = std::string(FLASHLAB_SOURCE_DIR) + "/toymachine/traces/" + name;
  std::ifstream in(path);
  REQUIRE(in.good());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline flashlab::toy::Program assemble_ok(const std::string& text, const flashlab::toy::Machine& m,
                                          const std::string& file = "t.trace") {
  auto r = flashlab::toy::assemble(text, m, file);
  std::string all;
  for (const auto& d : r.diagnostics) all += flashlab::toy::format_diagnostic(d);
  INFO(all);
  REQUIRE(r.ok());
  return r.program;
}

// All diagnostics of a trace that must not assemble, formatted.
inline std::string diagnostics_of(const std::string& text, const flashlab::toy::Machine& m,
                                  const std::string& file = "t.trace") {
  auto r = flashlab::toy::assemble(text, m, file);
  REQUIRE_FALSE(r.ok());
  std::string all;
  for (const auto& d : r.diagnostics) all += flashlab::toy::format_diagnostic(d);
  return all;
}

}  // namespace toytest
