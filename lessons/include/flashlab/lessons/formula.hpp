/// @file formula.hpp
/// A tiny, safe evaluator for the formula answers of the lesson quizzes (`3n`, `2n^2 + 3n`,
/// `n^2/(2n^2+3n)`, `2*Br`, `da*exp(ma - max(ma, mb))`). Answers are compared by value at fixed
/// and random points, never by string, so `3n`, `n*3` and `n+2n` are all the same answer.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "flashlab/lessons/lesson.hpp"

namespace flashlab::lessons {

/// A formula that could not be parsed or evaluated; says where (1-based column) and how to fix it.
class FormulaError : public std::runtime_error {
 public:
  /// @param what message naming the problem, @param column 1-based column in the formula (0: none),
  /// @param hint one line on how to write it instead.
  FormulaError(const std::string& what, int column, std::string hint)
      : std::runtime_error(what), column_(column), hint_(std::move(hint)) {}
  /// 1-based column of the offending token, 0 when the error concerns the whole formula.
  [[nodiscard]] int column() const { return column_; }
  /// How to write it instead.
  [[nodiscard]] const std::string& hint() const { return hint_; }

 private:
  int column_;
  std::string hint_;
};

/// Variable values for one evaluation, e.g. {{"n", 8}, {"d", 4}}.
using Bindings = std::map<std::string, double>;

/// Evaluates `text` with the given variables. Grammar: numbers, the bound variable names,
/// `+ - * / ^` (also `·`, `×`, `²`, `³`), parentheses, unary minus, implicit multiplication
/// (`3n`, `2n^2d`, `nd` = n·d when both are bound names, longest name first) and the functions
/// exp(x), max(a, b, …) and min(a, b, …).
/// Throws FormulaError on a syntax error, an unknown name, division by zero or a result that is
/// not finite. Input longer than 200 characters or nested deeper than 32 levels is refused.
double evaluate_formula(const std::string& text, const Bindings& vars);

/// Result of comparing an answer formula with the expected one.
struct FormulaMatch {
  bool equal = false;        ///< equal (relative 1e-9) at every sample point
  std::string counterexample;  ///< when not equal: "at n=5: expected 15, got 10"
};

/// Compares `answer` with `expected` by value at `samples` (each a full set of bindings).
/// Throws FormulaError when `answer` does not parse (the expected formula is trusted).
FormulaMatch compare_formulas(const std::string& answer, const std::string& expected,
                              const std::vector<Bindings>& samples);

/// Sample points for the variables named in `names` (e.g. {"n"} or {"n","d","Br"}): several
/// distinct, non-special values per variable so that different polynomials cannot agree by chance.
std::vector<Bindings> default_samples(const std::vector<std::string>& names);

/// `count` random points: each variable drawn from its range (whole or real numbers).
std::vector<Bindings> random_samples(const std::vector<VariableRange>& ranges, std::uint64_t seed, int count);

}  // namespace flashlab::lessons
