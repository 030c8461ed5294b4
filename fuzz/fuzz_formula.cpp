// libFuzzer target: the formula answers of the lesson quizzes (`3n`, `2n^2 + 3n`, `4n^2d`).
// A FormulaError (with its column and hint) is the only acceptable failure; any other exception,
// crash or hang is a finding.
#include <cstddef>
#include <cstdint>
#include <string>

#include "flashlab/lessons/formula.hpp"

namespace lessons = flashlab::lessons;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    (void)lessons::evaluate_formula(text, {{"n", 5}, {"d", 3}, {"Br", 2}});
  } catch (const lessons::FormulaError& e) {
    (void)e.column();
  }
  try {
    (void)lessons::compare_formulas(text, "2n^2 + 3n", lessons::default_samples({"n"}));
  } catch (const lessons::FormulaError& e) {
    (void)e.hint();
  }
  return 0;
}
