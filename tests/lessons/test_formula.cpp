// The formula evaluator behind formula answers: value semantics, implicit multiplication,
// safety limits and located errors.
#include <catch2/catch.hpp>

#include "flashlab/lessons/formula.hpp"

using namespace flashlab::lessons;

TEST_CASE("formula: arithmetic, powers, implicit multiplication", "[formula]") {
  const Bindings v{{"n", 5}, {"d", 3}, {"Br", 4}};
  CHECK(evaluate_formula("3n", v) == Approx(15));
  CHECK(evaluate_formula("2n^2 + 3n", v) == Approx(65));
  CHECK(evaluate_formula("n^2/(2n^2+3n)", v) == Approx(25.0 / 65));
  CHECK(evaluate_formula("2n^2d/Br", v) == Approx(2 * 25 * 3 / 4.0));
  CHECK(evaluate_formula("nd", v) == Approx(15));       // n·d: names split longest-first
  CHECK(evaluate_formula("2Br", v) == Approx(8));       // Br stays one name
  CHECK(evaluate_formula("n(n+1)", v) == Approx(30));
  CHECK(evaluate_formula("-n + 2^3", v) == Approx(3));
  CHECK(evaluate_formula("2^3^2", v) == Approx(512));   // right associative
  CHECK(evaluate_formula("3·n²", v) == Approx(75));     // pasted from the lesson text
  CHECK(evaluate_formula("n − 1", v) == Approx(4));
}

TEST_CASE("formula: errors name the column and give a hint", "[formula][errors]") {
  const Bindings v{{"n", 5}};
  auto error = [&](const std::string& f) -> FormulaError {
    try {
      evaluate_formula(f, v);
    } catch (const FormulaError& e) {
      return e;
    }
    FAIL("no error for " << f);
    return FormulaError("", 0, "");
  };
  auto e = error("3x");
  CHECK(std::string(e.what()) == "unknown name 'x'");
  CHECK(e.column() == 2);
  CHECK_THAT(e.hint(), Catch::Contains("n"));
  CHECK(std::string(error("(n+1").what()) == "missing ')'");
  CHECK(std::string(error("n2").what()) == "a number cannot follow here");
  CHECK(std::string(error("n/(n-5)").what()) == "division by zero");
  CHECK(std::string(error("").what()) == "empty formula");
  CHECK(std::string(error("3n +").what()) == "the formula ends too early");
  CHECK(std::string(error("3n $").what()) == "unexpected '$'");
  CHECK(std::string(error(std::string(300, 'n')).what()) == "formula longer than 200 characters");
  CHECK(std::string(error(std::string(60, '(') + "n" + std::string(60, ')')).what()) == "formula nested too deeply");
  CHECK(std::string(error("10^400").what()) == "the formula does not give a finite number");
}

TEST_CASE("formula: comparison by value at several points", "[formula]") {
  const auto s = default_samples({"n"});
  CHECK(s.size() == 5);
  CHECK(compare_formulas("n + 2n", "3n", s).equal);
  CHECK(compare_formulas("3*n", "3n", s).equal);
  const auto m = compare_formulas("n^2", "3n", s);
  CHECK(!m.equal);
  CHECK(m.counterexample == "at n=5: expected 15, got 25");
  // Two variables never take the same value at a sample point, so n·n and n·d differ.
  const auto s2 = default_samples({"n", "d"});
  CHECK(!compare_formulas("n^2", "nd", s2).equal);
  CHECK(compare_formulas("3dn^2", "3nd*n", {{{"n", 2}, {"d", 7}}}).equal);
}
