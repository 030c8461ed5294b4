/// @file formula.hpp
/// A tiny, safe evaluator for the formula answers of the lesson quizzes (`3n`, `2n^2 + 3n`,
/// `n^2/(2n^2+3n)`, `2*Br`, `da*exp(ma - max(ma, mb))`, `1.5e3`). Answers are compared by value
/// over their whole domain (every n from 1 to 10⁶, random and tied real points), never by string,
/// so `3n`, `n*3` and `n+2n` are all the same answer.
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

/// A formula compiled once (a postfix program) and evaluated at one point or at many points at once.
class Formula {
 public:
  /// Parses `text` over the variable names `names` (the grammar of evaluate_formula()).
  /// @throws FormulaError on a syntax error, an unknown name, or text too long or too deeply nested.
  Formula(const std::string& text, std::vector<std::string> names);
  ~Formula();                                  ///< out of line: Op is complete only in formula.cpp
  Formula(const Formula&);                     ///< copies the program
  Formula& operator=(const Formula&);          ///< copies the program
  Formula(Formula&&) noexcept;                 ///< moves the program
  Formula& operator=(Formula&&) noexcept;      ///< moves the program

  /// The value at one point (`values[k]` is the value of names[k]).
  /// @throws FormulaError on division by zero (with its column) or a result that is not finite.
  double operator()(const std::vector<double>& values) const;
  /// Evaluates at `count` points: `columns[k]` points at `count` values of names[k]. Writes NaN
  /// where the formula is undefined (division by zero, a result that is not finite).
  void evaluate(const std::vector<const double*>& columns, std::size_t count, double* out) const;
  /// Whether the formula mentions variable number `variable`.
  [[nodiscard]] bool uses(std::size_t variable) const;
  /// Whether the formula contains max(…) or min(…), i.e. is defined piecewise.
  [[nodiscard]] bool piecewise() const { return piecewise_; }

  struct Op;  ///< one instruction of the postfix program (defined in formula.cpp)

 private:
  void run(const std::vector<const double*>& columns, std::size_t count, double* out, int* division_column) const;
  std::vector<std::string> names_;
  std::vector<Op> code_;
  std::vector<bool> uses_;
  int max_depth_ = 0;
  bool piecewise_ = false;
};

/// Evaluates `text` with the given variables. Grammar: numbers (also `1.5e3`, `2E-4`), the bound variable names,
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
/// Throws FormulaError when `answer` does not parse or does not evaluate at a sample (the
/// expected formula is trusted).
FormulaMatch compare_formulas(const std::string& answer, const std::string& expected,
                              const std::vector<Bindings>& samples);

/// Compares `answer` with `expected` over the whole domain `ranges` (one per variable): the
/// fixed points of default_samples() first, then random points drawn from `seed`, then — for
/// real variables — points where two variables are equal or one is 0 or at an end of its range,
/// and — for whole-number variables — every value of each variable's range (1 … 10⁶ for n) with
/// the others at their smallest, a middling, their largest and a random value.
/// A point where the answer is undefined (division by zero) but the expected formula is not is a
/// counterexample. With no variables the two are compared as numbers.
/// Throws FormulaError when `answer` does not parse (the expected formula is trusted).
FormulaMatch compare_on_domain(const std::string& answer, const std::string& expected,
                               const std::vector<VariableRange>& ranges, std::uint64_t seed);

/// Sample points for the variables named in `names` (e.g. {"n"} or {"n","d","Br"}): several
/// distinct, non-special values per variable so that different polynomials cannot agree by chance.
std::vector<Bindings> default_samples(const std::vector<std::string>& names);

/// `count` random points: each variable drawn from its range (whole or real numbers).
std::vector<Bindings> random_samples(const std::vector<VariableRange>& ranges, std::uint64_t seed, int count);

}  // namespace flashlab::lessons
