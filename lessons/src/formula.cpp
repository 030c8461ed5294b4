// The formula evaluator behind `flashlab lesson answer`: a recursive-descent parser over a token
// list that compiles the formula once into a postfix program; the program is then evaluated at
// one point or at many points at once (an answer is compared with the expected formula at every
// n from 1 to 10⁶, so evaluation must be cheap). It never calls anything but arithmetic, so it
// is safe to feed it whatever a user types; length and nesting are capped so it cannot be made
// to recurse deeply.
#include "flashlab/lessons/formula.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <random>
#include <set>
#include <sstream>

#include "flashlab/toymachine/frontend.hpp"

namespace flashlab::lessons {

namespace {

constexpr std::size_t kMaxLength = 200;
constexpr int kMaxDepth = toy::kMaxNesting;  // the same nesting limit as trace index expressions

enum class Tok { Number, Name, Func, Plus, Minus, Star, Slash, Caret, LParen, RParen, Comma, End };

// The functions an answer may call (the tile merge needs them): exp(x), max(a, b), min(a, b).
bool is_function(const std::string& word) { return word == "exp" || word == "max" || word == "min"; }

struct Token {
  Tok kind;
  double number = 0;
  std::string name;
  int column = 0;  // 1-based, in code points
};

std::string names_hint(const std::vector<std::string>& names) {
  std::string s = "use numbers (3, 0.5, 1.5e3), + - * / ^, parentheses, exp(…), max(…, …)";
  if (!names.empty()) {
    s += " and the names ";
    for (std::size_t i = 0; i < names.size(); ++i) s += (i ? ", " : "") + names[i];
  }
  return s;
}

bool digit_at(const std::string& text, std::size_t i) {
  return i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]));
}

// Splits the UTF-8 text into tokens. Multi-byte operators the lesson text itself uses (·, ×, −,
// ², ³) are accepted so an answer can be pasted from `lesson show`, and numbers may be written
// as the program prints them (1.5e+08).
std::vector<Token> tokenize(const std::string& text, const std::vector<std::string>& names) {
  std::vector<Token> out;
  int col = 0;
  std::size_t i = 0;
  auto push = [&](Tok k, int c) { out.push_back(Token{k, 0, {}, c}); };
  while (i < text.size()) {
    ++col;
    const unsigned char c = static_cast<unsigned char>(text[i]);
    const int here = col;
    if (std::isspace(c)) { ++i; continue; }
    if (std::isdigit(c) || c == '.') {
      std::size_t j = i;
      while (j < text.size() && (std::isdigit(static_cast<unsigned char>(text[j])) || text[j] == '.')) ++j;
      // Scientific notation: an e or E directly followed by a digit, or by a sign and a digit.
      if (j < text.size() && (text[j] == 'e' || text[j] == 'E')) {
        const bool sign = j + 1 < text.size() && (text[j + 1] == '+' || text[j + 1] == '-');
        if (digit_at(text, j + 1 + (sign ? 1 : 0))) {
          j += sign ? 2 : 1;
          while (digit_at(text, j)) ++j;
        }
      }
      const std::string lit = text.substr(i, j - i);
      const std::string mantissa = lit.substr(0, lit.find_first_of("eE"));
      char* end = nullptr;
      const double v = std::strtod(lit.c_str(), &end);
      if (end != lit.c_str() + lit.size() || std::count(mantissa.begin(), mantissa.end(), '.') > 1 || mantissa == ".") {
        throw FormulaError("'" + lit + "' is not a number", here, "write numbers like 3, 0.5 or 1.5e3");
      }
      if (!std::isfinite(v)) throw FormulaError("'" + lit + "' is too large", here, "write a smaller number");
      out.push_back(Token{Tok::Number, v, {}, here});
      col += static_cast<int>(j - i) - 1;
      i = j;
      continue;
    }
    if (std::isalpha(c) || c == '_') {
      std::size_t j = i;
      while (j < text.size() && (std::isalpha(static_cast<unsigned char>(text[j])) || text[j] == '_')) ++j;
      const std::string word = text.substr(i, j - i);
      const bool bound = std::find(names.begin(), names.end(), word) != names.end();
      if (is_function(word) && !bound) {
        out.push_back(Token{Tok::Func, 0, word, here});
        col += static_cast<int>(j - i) - 1;
        i = j;
        continue;
      }
      // Split a run of letters into bound names, longest first: `nd` → n·d, `Br` stays Br.
      std::size_t k = 0;
      while (k < word.size()) {
        std::size_t best = 0;
        for (const auto& name : names) {
          if (name.size() > best && word.compare(k, name.size(), name) == 0) best = name.size();
        }
        if (best == 0) {
          throw FormulaError("unknown name '" + word + "'", here + static_cast<int>(k), names_hint(names));
        }
        out.push_back(Token{Tok::Name, 0, word.substr(k, best), here + static_cast<int>(k)});
        k += best;
      }
      col += static_cast<int>(j - i) - 1;
      i = j;
      continue;
    }
    // Multi-byte operators (UTF-8).
    auto starts = [&](const char* s) { return text.compare(i, std::char_traits<char>::length(s), s) == 0; };
    if (starts("\xC2\xB7") || starts("\xC3\x97")) { push(Tok::Star, here); i += 2; continue; }    // · ×
    if (starts("\xE2\x88\x92")) { push(Tok::Minus, here); i += 3; continue; }                    // −
    if (starts("\xC2\xB2") || starts("\xC2\xB3")) {                                              // ² ³
      push(Tok::Caret, here);
      out.push_back(Token{Tok::Number, text[i + 1] == '\xB2' ? 2.0 : 3.0, {}, here});
      i += 2;
      continue;
    }
    switch (c) {
      case '+': push(Tok::Plus, here); break;
      case '-': push(Tok::Minus, here); break;
      case '*': push(Tok::Star, here); break;
      case '/': push(Tok::Slash, here); break;
      case '^': push(Tok::Caret, here); break;
      case '(': push(Tok::LParen, here); break;
      case ')': push(Tok::RParen, here); break;
      case ',': push(Tok::Comma, here); break;
      default: {
        std::string shown = c < 0x80 ? std::string(1, static_cast<char>(c)) : std::string("non-ASCII character");
        throw FormulaError("unexpected '" + shown + "'", here, names_hint(names));
      }
    }
    ++i;
  }
  out.push_back(Token{Tok::End, 0, {}, col + 1});
  return out;
}

}  // namespace

// One instruction of the postfix program.
struct Formula::Op {
  enum Kind { Const, Var, Neg, Add, Sub, Mul, Div, Pow, PowInt, Exp, Max, Min } kind = Const;
  double value = 0;  // Const
  int arg = 0;       // Var: the variable's index; Max/Min: the number of arguments; PowInt: the exponent
  int column = 0;    // Div: the column of '/', for "division by zero"
};

namespace {

// The parser: emits postfix code while it reads. Precedence, lowest first: + −; * / and
// implicit multiplication; unary minus; ^ (right associative); numbers, names, calls, ( ).
class Parser {
 public:
  using Op = Formula::Op;
  Parser(std::vector<Token> toks, const std::vector<std::string>& names) : toks_(std::move(toks)), names_(names) {}

  std::vector<Op> parse() {
    expr(0);
    if (peek().kind != Tok::End) {
      throw FormulaError("unexpected text after the formula", peek().column,
                         "an answer is one formula, e.g. 3n or 2n^2 + 3n");
    }
    return std::move(code_);
  }

 private:
  const Token& peek() const { return toks_[pos_]; }
  const Token& take() { return toks_[pos_++]; }
  void emit(Op::Kind k, int arg = 0, int column = 0) { code_.push_back(Op{k, 0, arg, column}); }

  void guard(int depth) const {
    if (depth > kMaxDepth) throw FormulaError("formula nested too deeply", peek().column, "simplify the formula");
  }

  void expr(int depth) {
    guard(depth);
    term(depth + 1);
    while (peek().kind == Tok::Plus || peek().kind == Tok::Minus) {
      const bool plus = take().kind == Tok::Plus;
      term(depth + 1);
      emit(plus ? Op::Add : Op::Sub);
    }
  }

  void term(int depth) {
    guard(depth);
    unary(depth + 1);
    for (;;) {
      const Tok k = peek().kind;
      if (k == Tok::Star) {
        take();
        unary(depth + 1);
        emit(Op::Mul);
      } else if (k == Tok::Slash) {
        const int col = take().column;
        unary(depth + 1);
        emit(Op::Div, 0, col);
      } else if (k == Tok::Name || k == Tok::LParen || k == Tok::Func) {
        unary(depth + 1);  // implicit multiplication: 3n, n(n+1)
        emit(Op::Mul);
      } else if (k == Tok::Number) {
        throw FormulaError("a number cannot follow here", peek().column, "write 2n or n*2, not n2");
      } else {
        return;
      }
    }
  }

  void unary(int depth) {
    guard(depth);
    if (peek().kind == Tok::Minus) {
      take();
      unary(depth + 1);
      emit(Op::Neg);
      return;
    }
    if (peek().kind == Tok::Plus) {
      take();
      unary(depth + 1);
      return;
    }
    power(depth + 1);
  }

  void power(int depth) {
    guard(depth);
    primary(depth + 1);
    if (peek().kind == Tok::Caret) {
      take();
      unary(depth + 1);  // right associative: n^2^1 = n^(2^1)
      emit(Op::Pow);
    }
  }

  void primary(int depth) {
    guard(depth);
    const Token t = take();
    switch (t.kind) {
      case Tok::Number: code_.push_back(Op{Op::Const, t.number, 0, 0}); return;
      case Tok::Name: {
        const auto at = std::find(names_.begin(), names_.end(), t.name) - names_.begin();
        emit(Op::Var, static_cast<int>(at));
        return;
      }
      case Tok::Func: call(t, depth); return;
      case Tok::LParen: {
        expr(depth + 1);
        if (peek().kind != Tok::RParen) throw FormulaError("missing ')'", peek().column, "close every '('");
        take();
        return;
      }
      case Tok::End:
        throw FormulaError("the formula ends too early", t.column, "finish the formula, e.g. 3n");
      default:
        throw FormulaError("expected a number, a name or '('", t.column, names_hint(names_));
    }
  }

  // exp(x), max(a, b, …), min(a, b, …): the name is taken, then the parenthesised arguments.
  void call(const Token& f, int depth) {
    if (peek().kind != Tok::LParen)
      throw FormulaError(f.name + " needs its arguments in parentheses", peek().column, "e.g. " + f.name + "(x)");
    take();
    expr(depth + 1);
    int args = 1;
    while (peek().kind == Tok::Comma) {
      take();
      expr(depth + 1);
      ++args;
    }
    if (peek().kind != Tok::RParen) throw FormulaError("missing ')'", peek().column, "close every '('");
    take();
    if (f.name == "exp") {
      if (args != 1) throw FormulaError("exp takes one argument", f.column, "e.g. exp(ma - mb)");
      emit(Op::Exp);
      return;
    }
    if (args < 2) throw FormulaError(f.name + " takes two or more arguments", f.column, "e.g. max(ma, mb)");
    emit(f.name == "max" ? Op::Max : Op::Min, args);
  }

  std::vector<Token> toks_;
  const std::vector<std::string>& names_;
  std::vector<Op> code_;
  std::size_t pos_ = 0;
};

std::string fmt(double v) {
  std::ostringstream os;
  os.precision(10);
  os << v;
  return os.str();
}

// Points are evaluated in chunks of this many (one stack slot holds a chunk).
constexpr std::size_t kChunk = 256;

}  // namespace

Formula::Formula(const std::string& text, std::vector<std::string> names) : names_(std::move(names)) {
  if (text.size() > kMaxLength) {
    throw FormulaError("formula longer than 200 characters", 0, "simplify the formula");
  }
  const bool blank = std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isspace(c); });
  if (blank) throw FormulaError("empty formula", 0, "type a formula such as 3n");
  code_ = Parser(tokenize(text, names_), names_).parse();
  // x^k with a small whole constant k (n^2, d²) as repeated multiplication: std::pow is most of
  // the cost of comparing an answer at 10⁶ points, and x·x is exact where pow need not be.
  std::vector<Op> folded;
  for (const Op& op : code_) {
    if (op.kind == Op::Pow && !folded.empty() && folded.back().kind == Op::Const) {
      const double k = folded.back().value;
      if (k == std::floor(k) && k >= 1 && k <= 8) {
        folded.back() = Op{Op::PowInt, 0, static_cast<int>(k), 0};
        continue;
      }
    }
    folded.push_back(op);
  }
  code_ = std::move(folded);
  int depth = 0;
  for (const Op& op : code_) {
    switch (op.kind) {
      case Op::Const:
      case Op::Var: ++depth; break;
      case Op::Neg:
      case Op::PowInt:
      case Op::Exp: break;
      case Op::Max:
      case Op::Min: depth -= op.arg - 1; break;
      default: --depth; break;
    }
    max_depth_ = std::max(max_depth_, depth);
  }
  uses_.assign(names_.size(), false);
  for (const Op& op : code_) {
    if (op.kind == Op::Var) uses_[static_cast<std::size_t>(op.arg)] = true;
    if (op.kind == Op::Max || op.kind == Op::Min) piecewise_ = true;
  }
}

Formula::~Formula() = default;
Formula::Formula(const Formula&) = default;
Formula& Formula::operator=(const Formula&) = default;
Formula::Formula(Formula&&) noexcept = default;
Formula& Formula::operator=(Formula&&) noexcept = default;

bool Formula::uses(std::size_t variable) const { return variable < uses_.size() && uses_[variable]; }

void Formula::run(const std::vector<const double*>& columns, std::size_t count, double* out,
                  int* division_column) const {
  std::vector<double> stack(static_cast<std::size_t>(std::max(max_depth_, 1)) * kChunk);
  for (std::size_t base = 0; base < count; base += kChunk) {
    const std::size_t len = std::min(kChunk, count - base);
    std::size_t sp = 0;  // stack depth, in chunks
    auto top = [&](std::size_t k) { return stack.data() + (sp - k) * kChunk; };
    for (const Op& op : code_) {
      switch (op.kind) {
        case Op::Const: {
          double* d = stack.data() + sp++ * kChunk;
          std::fill(d, d + len, op.value);
          break;
        }
        case Op::Var: {
          double* d = stack.data() + sp++ * kChunk;
          const double* src = columns[static_cast<std::size_t>(op.arg)] + base;
          std::copy(src, src + len, d);
          break;
        }
        case Op::Neg: {
          double* a = top(1);
          for (std::size_t i = 0; i < len; ++i) a[i] = -a[i];
          break;
        }
        case Op::Exp: {
          double* a = top(1);
          for (std::size_t i = 0; i < len; ++i) a[i] = std::exp(a[i]);
          break;
        }
        case Op::PowInt: {
          double* a = top(1);
          for (std::size_t i = 0; i < len; ++i) {
            const double x = a[i];
            double r = x;
            for (int k = 1; k < op.arg; ++k) r *= x;
            a[i] = r;
          }
          break;
        }
        case Op::Max:
        case Op::Min: {
          const std::size_t args = static_cast<std::size_t>(op.arg);
          double* first = top(args);
          for (std::size_t k = 1; k < args; ++k) {
            const double* b = first + k * kChunk;
            for (std::size_t i = 0; i < len; ++i) {
              // NaN stays NaN: an undefined argument leaves the result undefined.
              if (std::isnan(b[i])) first[i] = b[i];
              else if (!std::isnan(first[i])) first[i] = op.kind == Op::Max ? std::max(first[i], b[i]) : std::min(first[i], b[i]);
            }
          }
          sp -= args - 1;
          break;
        }
        default: {
          double* a = top(2);
          const double* b = top(1);
          switch (op.kind) {
            case Op::Add: for (std::size_t i = 0; i < len; ++i) a[i] += b[i]; break;
            case Op::Sub: for (std::size_t i = 0; i < len; ++i) a[i] -= b[i]; break;
            case Op::Mul: for (std::size_t i = 0; i < len; ++i) a[i] *= b[i]; break;
            case Op::Pow: for (std::size_t i = 0; i < len; ++i) a[i] = std::pow(a[i], b[i]); break;
            case Op::Div:
              for (std::size_t i = 0; i < len; ++i) {
                if (b[i] == 0) {
                  if (division_column && *division_column == 0) *division_column = op.column;
                  a[i] = std::numeric_limits<double>::quiet_NaN();
                } else {
                  a[i] /= b[i];
                }
              }
              break;
            default: break;
          }
          --sp;
          break;
        }
      }
    }
    const double* result = stack.data();
    for (std::size_t i = 0; i < len; ++i) out[base + i] = std::isfinite(result[i]) ? result[i] : std::numeric_limits<double>::quiet_NaN();
  }
}

double Formula::operator()(const std::vector<double>& values) const {
  std::vector<const double*> columns;
  for (const double& v : values) columns.push_back(&v);
  columns.resize(names_.size(), nullptr);
  double out = 0;
  int division = 0;
  run(columns, 1, &out, &division);
  if (division > 0) throw FormulaError("division by zero", division, "check the denominator");
  if (std::isnan(out)) throw FormulaError("the formula does not give a finite number", 0, "check powers and divisions");
  return out;
}

void Formula::evaluate(const std::vector<const double*>& columns, std::size_t count, double* out) const {
  run(columns, count, out, nullptr);
}

double evaluate_formula(const std::string& text, const Bindings& vars) {
  std::vector<std::string> names;
  std::vector<double> values;
  for (const auto& [k, v] : vars) {
    names.push_back(k);
    values.push_back(v);
  }
  return Formula(text, names)(values);
}

FormulaMatch compare_formulas(const std::string& answer, const std::string& expected,
                              const std::vector<Bindings>& samples) {
  FormulaMatch m;
  m.equal = true;
  for (const auto& s : samples) {
    const double got = evaluate_formula(answer, s);
    const double want = evaluate_formula(expected, s);
    const double tol = 1e-9 * std::max(1.0, std::fabs(want));
    if (std::fabs(got - want) > tol) {
      std::string at;
      for (const auto& [k, v] : s) at += (at.empty() ? "" : ", ") + k + "=" + fmt(v);
      m.equal = false;
      m.counterexample = "at " + at + ": expected " + fmt(want) + ", got " + fmt(got);
      return m;
    }
  }
  return m;
}

namespace {

// A batch of points: one column of values per variable.
struct Points {
  std::vector<std::vector<double>> columns;
  explicit Points(std::size_t vars) : columns(vars) {}
  [[nodiscard]] std::size_t size() const { return columns.empty() ? 0 : columns[0].size(); }
  void add(const std::vector<double>& p) {
    for (std::size_t k = 0; k < p.size(); ++k) columns[k].push_back(p[k]);
  }
};

// Compares the answer with the expected formula at every point of `pts`; false (with the first
// counterexample) when they differ or the answer is undefined where the expected one is not.
bool agree(const Formula& answer, const Formula& expected, const std::vector<std::string>& names, const Points& pts,
           FormulaMatch& m) {
  const std::size_t count = pts.size();
  if (count == 0) return true;
  std::vector<const double*> cols;
  for (const auto& c : pts.columns) cols.push_back(c.data());
  std::vector<double> got(count), want(count);
  answer.evaluate(cols, count, got.data());
  expected.evaluate(cols, count, want.data());
  for (std::size_t i = 0; i < count; ++i) {
    if (std::isnan(want[i])) continue;  // outside the expected formula's own domain
    const double tol = 1e-9 * std::max(1.0, std::fabs(want[i]));
    if (!std::isnan(got[i]) && std::fabs(got[i] - want[i]) <= tol) continue;
    std::string at;
    std::vector<double> point;
    for (std::size_t k = 0; k < names.size(); ++k) {
      at += (at.empty() ? "" : ", ") + names[k] + "=" + fmt(pts.columns[k][i]);
      point.push_back(pts.columns[k][i]);
    }
    m.equal = false;
    if (std::isnan(got[i])) {
      std::string why = "it is not a finite number there";
      try {
        (void)answer(point);
      } catch (const FormulaError& e) {
        why = e.what();
      }
      m.counterexample = "at " + at + ": expected " + fmt(want[i]) + ", but your formula is undefined there (" + why + ")";
    } else {
      m.counterexample = "at " + at + ": expected " + fmt(want[i]) + ", got " + fmt(got[i]);
    }
    return false;
  }
  return true;
}

double draw(const VariableRange& r, std::mt19937_64& rng, bool log_scale) {
  if (r.real) return std::uniform_real_distribution<double>(r.lo, r.hi)(rng);
  if (log_scale && r.lo >= 1) {
    const double v = std::exp(std::uniform_real_distribution<double>(std::log(r.lo), std::log(r.hi + 1))(rng));
    return std::clamp(std::floor(v), r.lo, r.hi);
  }
  const auto lo = static_cast<long long>(r.lo), hi = static_cast<long long>(r.hi);
  return static_cast<double>(std::uniform_int_distribution<long long>(lo, hi)(rng));
}

}  // namespace

FormulaMatch compare_on_domain(const std::string& answer, const std::string& expected,
                               const std::vector<VariableRange>& ranges, std::uint64_t seed) {
  std::vector<std::string> names;
  for (const auto& r : ranges) names.push_back(r.name);
  const Formula a(answer, names), e(expected, names);
  FormulaMatch m;
  m.equal = true;
  const std::size_t nv = ranges.size();
  if (nv == 0) return compare_formulas(answer, expected, {Bindings{}});  // a number: one point
  const bool any_real = std::any_of(ranges.begin(), ranges.end(), [](const VariableRange& r) { return r.real; });
  std::mt19937_64 rng(seed);

  // 1. Fixed points first: the usual slips are reported at the same, readable point every time.
  if (!any_real) {
    Points fixed(nv);
    for (const auto& b : default_samples(names)) {
      std::vector<double> p;
      bool inside = true;
      for (const auto& r : ranges) {
        const double v = b.at(r.name);
        inside = inside && v >= r.lo && v <= r.hi;
        p.push_back(v);
      }
      if (inside) fixed.add(p);
    }
    if (!agree(a, e, names, fixed, m)) return m;
  }

  // 2. Random points, drawn anew for every answer (uniform and, for whole numbers, log-uniform).
  Points random(nv);
  const int random_count = any_real ? 20000 : 4096;
  for (int i = 0; i < random_count; ++i) {
    std::vector<double> p;
    for (const auto& r : ranges) p.push_back(draw(r, rng, i % 2 == 1));
    random.add(p);
  }
  if (!agree(a, e, names, random, m)) return m;

  // 3. Real variables: where a max or min switches branches — two variables equal (ma = mb),
  //    a variable at 0 and at the ends of its range — at random values of the others.
  if (any_real) {
    Points edges(nv);
    for (std::size_t u = 0; u < nv; ++u) {
      for (int i = 0; i < 256; ++i) {
        std::vector<double> p;
        for (const auto& r : ranges) p.push_back(draw(r, rng, false));
        for (std::size_t v = 0; v < nv; ++v) {
          if (v == u || ranges[v].real != ranges[u].real) continue;
          auto q = p;
          q[v] = std::clamp(q[u], ranges[v].lo, ranges[v].hi);
          edges.add(q);
        }
        for (double special : {0.0, ranges[u].lo, ranges[u].hi}) {
          if (special < ranges[u].lo || special > ranges[u].hi) continue;
          auto q = p;
          q[u] = special;
          edges.add(q);
        }
      }
    }
    if (!agree(a, e, names, edges, m)) return m;
  }

  // 4. Whole-number variables: every value of the range, one variable at a time, with the others
  //    at their smallest, a middling, their largest and a random value. A
  //    piecewise answer (max, min, a division that is undefined at one point) differs somewhere
  //    in the range or nowhere, so every n where it could differ is tried.
  for (std::size_t u = 0; u < nv; ++u) {
    const auto& r = ranges[u];
    if (r.real) continue;
    if (!a.uses(u) && !e.uses(u)) continue;
    std::set<std::vector<double>> combos;
    const int variants = nv == 1 ? 1 : 4;
    for (int c = 0; c < variants; ++c) {
      std::vector<double> p;
      for (std::size_t v = 0; v < nv; ++v) {
        const auto& o = ranges[v];
        if (o.real) {
          p.push_back(draw(o, rng, false));
          continue;
        }
        const double mid = std::clamp(16.0, o.lo, o.hi);
        const double pick[] = {o.lo, mid, o.hi, draw(o, rng, true)};
        p.push_back(pick[c]);
      }
      combos.insert(p);
    }
    const double span = r.hi - r.lo + 1;
    for (const auto& base : combos) {
      // In blocks, so that a sweep of 10⁶ points never holds more than one block.
      constexpr std::size_t kBlock = 65536;
      Points sweep(nv);
      for (std::size_t v = 0; v < nv; ++v) sweep.columns[v].reserve(kBlock);
      auto flush = [&]() {
        const bool ok = agree(a, e, names, sweep, m);
        for (auto& c : sweep.columns) c.clear();
        return ok;
      };
      auto add = [&](double x) {
        for (std::size_t v = 0; v < nv; ++v) sweep.columns[v].push_back(v == u ? x : base[v]);
        return sweep.size() < kBlock || flush();
      };
      bool ok = true;
      if (span <= 2e6) {
        for (double x0 = r.lo; x0 <= r.hi && ok; x0 += kBlock) {
          const auto len = static_cast<std::size_t>(std::min<double>(kBlock, r.hi - x0 + 1));
          for (std::size_t v = 0; v < nv; ++v) sweep.columns[v].assign(len, base[v]);
          auto& col = sweep.columns[u];
          for (std::size_t i = 0; i < len; ++i) col[i] = x0 + static_cast<double>(i);
          ok = flush();
        }
      } else {  // too wide to walk: the ends, every power of two with its neighbours, random
        for (double x = r.lo; x < r.lo + 1000 && ok; ++x) ok = add(x);
        for (double x = r.hi - 1000; x <= r.hi && ok; ++x) ok = add(x);
        for (double p2 = 1; p2 < r.hi && ok; p2 *= 2)
          for (double d = -1; d <= 1 && ok; ++d)
            if (p2 + d >= r.lo && p2 + d <= r.hi) ok = add(p2 + d);
        for (int i = 0; i < 100000 && ok; ++i) ok = add(draw(r, rng, i % 2 == 1));
      }
      if (!ok || !flush()) return m;
    }
  }
  return m;
}

std::vector<Bindings> random_samples(const std::vector<VariableRange>& ranges, std::uint64_t seed, int count) {
  std::mt19937_64 rng(seed);
  std::vector<Bindings> out(static_cast<std::size_t>(count));
  for (auto& b : out) {
    for (const auto& r : ranges) b[r.name] = draw(r, rng, false);
  }
  return out;
}

std::vector<Bindings> default_samples(const std::vector<std::string>& names) {
  // Five points; each variable walks its own sequence of primes-ish values so that no two
  // variables are equal at any point (n vs d confusions show up).
  static const double seq[][5] = {{5, 8, 13, 64, 1000}, {3, 7, 16, 2, 128}, {4, 2, 32, 11, 16}, {6, 9, 2, 17, 64}};
  std::vector<Bindings> out(5);
  for (std::size_t p = 0; p < 5; ++p) {
    for (std::size_t v = 0; v < names.size(); ++v) out[p][names[v]] = seq[v % 4][p] + static_cast<double>(v / 4);
  }
  return out;
}

}  // namespace flashlab::lessons
