/// @file value.hpp
/// @brief Values the toy machine carries: a float64 plus a symbolic expression over the input
/// names, printed the way the lesson's step tables print them (`a00·b00 + a01·b10`, `e^(x0 − m)`).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace flashlab::toy {

/// The node kinds of a symbolic expression.
enum class ExprKind {
  Input,     ///< one input element, e.g. `a01` or `x3`
  Constant,  ///< a number (a constant array element, or the result of folding, e.g. e^0 = 1)
  Sum,       ///< Σ coeff·term + constant: ADD, SUB and the accumulate of MAC, flattened
  Product,   ///< a × b (MUL, MAC_Z, the multiply of MAC)
  Quotient,  ///< a / b (DIV)
  Max,       ///< max of two or more terms, flattened and ordered (MAX)
  Exp        ///< e^a (EXP)
};

struct Expr;
/// Expressions are immutable trees shared between registers, DRAM cells and history states.
using ExprPtr = std::shared_ptr<const Expr>;

/// One immutable expression node. Build with the functions below, never by hand: they
/// flatten, cancel and fold so that equal values get equal trees (the toy-machine lesson, "Two paths to the
/// same sum": the online sum s_n must come out as the same Σ e^(xj − m) as the two-pass S).
struct Expr {
  ExprKind kind = ExprKind::Constant;  ///< which node this is
  std::uint64_t hash = 0;      ///< structural hash; commutative for Sum, Product and Max
  std::string name;            ///< Input: display name ("a01", "x3")
  std::string array;           ///< Input: the array's name ("a")
  std::size_t index = 0;       ///< Input: flat (row-major) element index
  double value = 0.0;          ///< Constant: the number; Sum: its constant term
  std::vector<ExprPtr> args;   ///< children (Sum terms, Product/Quotient operands, Max terms, Exp argument)
  std::vector<double> coeffs;  ///< Sum: one coefficient per term (+1 for ADD, −1 for SUB)
};

/// An input leaf: element `index` of `array`, shown as `display`.
ExprPtr make_input(const std::string& array, std::size_t index, const std::string& display);
/// A constant leaf.
ExprPtr make_constant(double v);
/// a + b (flattens sums, cancels equal terms with opposite signs, folds constants).
ExprPtr make_add(const ExprPtr& a, const ExprPtr& b);
/// a − b.
ExprPtr make_sub(const ExprPtr& a, const ExprPtr& b);
/// a × b (drops factors of 1, folds constants, merges e^u·e^v = e^(u+v), distributes a sum of
/// exponentials over e^v so that the online-softmax rescale folds into one sum).
ExprPtr make_mul(const ExprPtr& a, const ExprPtr& b);
/// a / b (folds constants, x/1 = x).
ExprPtr make_div(const ExprPtr& a, const ExprPtr& b);
/// max(a, b), flattened, deduplicated, inputs in array order.
ExprPtr make_max(const ExprPtr& a, const ExprPtr& b);
/// Σ items, the bulk form of make_add (linear time; used to name S over all n inputs).
ExprPtr make_sum_of(const std::vector<ExprPtr>& items);
/// max over items, the bulk form of make_max (linear time); null for an empty list.
ExprPtr make_max_of(const std::vector<ExprPtr>& items);
/// e^a (e^0 = 1).
ExprPtr make_exp(const ExprPtr& a);

/// Structural equality up to the order of Sum/Product/Max terms.
bool equivalent(const Expr& a, const Expr& b);

/// Names for whole expressions, so that the printer shows `c00` for a00·b00 + a01·b10 and `m`
/// for max(x0..x7), like the lesson's tables. Lookups are by hash, so printing stays cheap.
class NameTable {
 public:
  /// Registers `name` for `expr` (bare inputs and constants are ignored: they print as themselves).
  void add(const std::string& name, const ExprPtr& expr);
  /// The name of an expression equivalent to `e`, or nullptr.
  [[nodiscard]] const std::string* find(const Expr& e) const;
  /// True when no names are registered.
  [[nodiscard]] bool empty() const { return by_hash_.empty(); }

 private:
  std::unordered_multimap<std::uint64_t, std::pair<std::string, ExprPtr>> by_hash_;
};

/// Prints an expression like the lesson's tables: `a00·b00 + a01·b10`, `e^(x0 − m)`,
/// `max(x0, x1)`, `e^(x0 − m)/S`. Runs of four or more consecutive inputs in a max print as
/// `max(x0..x7)`; a sum of four or more terms that differ only in one input index prints as
/// `Σ_{j=0..7} e^(xj − m)`. Subexpressions found in `names` print as their name.
/// An expression whose expanded tree has more than kMaxPrintedTerms nodes prints as
/// `⟨expression of more than N terms⟩` instead (a squaring chain would otherwise print 2^k terms).
std::string to_string(const Expr& e, const NameTable* names = nullptr);

/// Expanded-tree size above which to_string() prints a placeholder instead of the expression.
inline constexpr std::size_t kMaxPrintedTerms = 2000;

/// A value in a register or DRAM cell: always a number; the expression is null in numeric-only mode.
struct Value {
  double num = 0.0;  ///< the float64 value
  ExprPtr sym;       ///< the symbolic value, or null when the executor runs numeric-only
};

/// Formats a number for tables: up to 6 significant digits, no trailing zeros.
std::string format_number(double v);

}  // namespace flashlab::toy
