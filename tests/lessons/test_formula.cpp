// The formula evaluator behind formula answers: value semantics, implicit multiplication,
// safety limits and located errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

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

TEST_CASE("formula: numbers in scientific notation, as the program prints them", "[formula]") {
  const Bindings v{{"n", 5}};
  CHECK(evaluate_formula("1.5e3", v) == 1500);
  CHECK(evaluate_formula("1.50995e+08", v) == Approx(150995000));
  CHECK(evaluate_formula("2E-2", v) == Approx(0.02));
  CHECK(evaluate_formula("3e2n", v) == 1500);  // the exponent ends at its digits
  CHECK(evaluate_formula("2exp(0)", v) == 2);  // no digit after e: not an exponent
  auto error = [&](const std::string& f) -> std::string {
    try {
      evaluate_formula(f, v);
    } catch (const FormulaError& e) {
      return e.what();
    }
    return "(no error)";
  };
  CHECK(error("3e") == "unknown name 'e'");
  CHECK(error("1e400") == "'1e400' is too large");
  CHECK(error("1.2.3") == "'1.2.3' is not a number");
}

TEST_CASE("formula: compiled once, the same value at one point and at many", "[formula]") {
  const Formula f("2n^2 + 3n - n/(n - 4)", {"n"});
  std::vector<double> n(100), out(100);
  for (std::size_t i = 0; i < n.size(); ++i) n[i] = static_cast<double>(i) + 1;
  f.evaluate({n.data()}, n.size(), out.data());
  for (std::size_t i = 0; i < n.size(); ++i) {
    INFO("n = " << n[i]);
    if (n[i] == 4) {
      CHECK(std::isnan(out[i]));  // undefined there, not an exception in the middle of a batch
      CHECK_THROWS_WITH(f({n[i]}), "division by zero");
    } else {
      CHECK(out[i] == f({n[i]}));
    }
  }
  // Small whole powers are products: exact where pow need not be.
  CHECK(Formula("n^2", {"n"})({1e6}) == 1e12);
  CHECK(Formula("max(n, d) + min(n, d)", {"n", "d"}).piecewise());
  CHECK(!Formula("n + d", {"n", "d"}).piecewise());
}

TEST_CASE("formula: compared over the whole domain, n = 1 to 10^6", "[formula]") {
  const std::vector<VariableRange> n{VariableRange{"n", 1, 1e6, false}};
  auto compare = [&](const std::string& a, const std::string& e, const std::vector<VariableRange>& r) {
    return compare_on_domain(a, e, r, 42);
  };
  CHECK(compare("n + 2n", "3n", n).equal);
  CHECK(compare("3n*min(1, 1000000/n)", "3n", n).equal);  // a piecewise answer that never differs
  // The fixed points first: the usual slip is reported at the same point every time.
  CHECK(compare("n^2", "3n", n).counterexample == "at n=5: expected 15, got 25");
  // Wrong at one n only, or only outside 5 … 1000: every n is tried.
  CHECK(compare("3n + max(0, 1 - (n - 777)^2)", "3n", n).counterexample == "at n=777: expected 2331, got 2332");
  CHECK_THAT(compare("3n + max(0, 4 - n)", "3n", n).counterexample, Catch::Matches("at n=[123]: expected .*"));
  CHECK(compare("3n + max(0, n - 999999)", "3n", n).counterexample == "at n=1000000: expected 3000000, got 3000001");
  // Undefined where the expected formula is not: wrong, with the reason.
  CHECK_THAT(compare("3n + 0/(n - 77)", "3n", n).counterexample,
             Catch::Contains("at n=77") && Catch::Contains("undefined there (division by zero)"));
  // Several whole-number variables: each is walked over its range.
  const std::vector<VariableRange> three{{"n", 1, 1e6, false}, {"d", 1, 4096, false}, {"Br", 1, 4096, false}};
  CHECK(compare("2Br", "2*Br", three).equal);
  CHECK_THAT(compare("2Br + max(0, 1 - (d - 33)^2)", "2Br", three).counterexample, Catch::Contains("d=33"));
  CHECK_THAT(compare("4n^2d + max(0, 1 - (Br - 7)^2)", "4n^2d", three).counterexample, Catch::Contains("Br=7"));
  // Real variables: where two are equal and where one is 0.
  const std::vector<VariableRange> reals{{"ma", -6, 6, true}, {"mb", -6, 6, true}};
  CHECK(compare("-min(-ma, -mb)", "max(ma, mb)", reals).equal);
  CHECK(!compare("max(ma, mb) + max(0, 1e-6 - (ma - mb)^2)", "max(ma, mb)", reals).equal);
  CHECK(!compare("max(ma, mb) + max(0, 1e-6 - ma^2)", "max(ma, mb)", reals).equal);
  // A number: compared at the one point there is.
  CHECK(compare_on_domain("2.5e1", "25", {}, 1).equal);
  CHECK_THROWS_AS(compare("3x", "3n", n), FormulaError);
}
