// The formula evaluator behind `flashlab lesson answer`: a recursive-descent parser over a token
// list, evaluating as it parses. It never calls anything but arithmetic, so it is safe to feed it
// whatever a user types; length and nesting are capped so it cannot be made to recurse deeply.
#include "flashlab/lessons/formula.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <random>
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

std::string names_hint(const Bindings& vars) {
  std::string s = "use numbers, + - * / ^, parentheses, exp(…), max(…, …)";
  if (!vars.empty()) {
    s += " and the names ";
    bool first = true;
    for (const auto& [k, v] : vars) {
      s += (first ? "" : ", ") + k;
      first = false;
    }
  }
  return s;
}

// Splits the UTF-8 text into tokens. Multi-byte operators the lesson text itself uses (·, ×, −,
// ², ³) are accepted so an answer can be pasted from `lesson show`.
std::vector<Token> tokenize(const std::string& text, const Bindings& vars) {
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
      const std::string lit = text.substr(i, j - i);
      std::istringstream is(lit);
      double v = 0;
      if (!(is >> v) || !is.eof() || std::count(lit.begin(), lit.end(), '.') > 1) {
        throw FormulaError("'" + lit + "' is not a number", here, "write numbers like 3 or 0.5");
      }
      Token t{Tok::Number, v, {}, here};
      out.push_back(t);
      col += static_cast<int>(j - i) - 1;
      i = j;
      continue;
    }
    if (std::isalpha(c) || c == '_') {
      std::size_t j = i;
      while (j < text.size() && (std::isalpha(static_cast<unsigned char>(text[j])) || text[j] == '_')) ++j;
      const std::string word = text.substr(i, j - i);
      if (is_function(word) && !vars.count(word)) {
        out.push_back(Token{Tok::Func, 0, word, here});
        col += static_cast<int>(j - i) - 1;
        i = j;
        continue;
      }
      // Split a run of letters into bound names, longest first: `nd` → n·d, `Br` stays Br.
      std::size_t k = 0;
      while (k < word.size()) {
        std::size_t best = 0;
        for (const auto& [name, value] : vars) {
          if (name.size() > best && word.compare(k, name.size(), name) == 0) best = name.size();
        }
        if (best == 0) {
          throw FormulaError("unknown name '" + word + "'", here + static_cast<int>(k), names_hint(vars));
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
        throw FormulaError("unexpected '" + shown + "'", here, names_hint(vars));
      }
    }
    ++i;
  }
  out.push_back(Token{Tok::End, 0, {}, col + 1});
  return out;
}

class Parser {
 public:
  Parser(std::vector<Token> toks, const Bindings& vars) : toks_(std::move(toks)), vars_(vars) {}

  double parse() {
    const double v = expr(0);
    if (peek().kind != Tok::End) {
      throw FormulaError("unexpected text after the formula", peek().column,
                         "an answer is one formula, e.g. 3n or 2n^2 + 3n");
    }
    return v;
  }

 private:
  const Token& peek() const { return toks_[pos_]; }
  const Token& take() { return toks_[pos_++]; }

  void guard(int depth) const {
    if (depth > kMaxDepth) throw FormulaError("formula nested too deeply", peek().column, "simplify the formula");
  }

  double expr(int depth) {
    guard(depth);
    double v = term(depth + 1);
    while (peek().kind == Tok::Plus || peek().kind == Tok::Minus) {
      const bool plus = take().kind == Tok::Plus;
      const double r = term(depth + 1);
      v = plus ? v + r : v - r;
    }
    return v;
  }

  double term(int depth) {
    guard(depth);
    double v = unary(depth + 1);
    for (;;) {
      const Tok k = peek().kind;
      if (k == Tok::Star) {
        take();
        v *= unary(depth + 1);
      } else if (k == Tok::Slash) {
        const int col = take().column;
        const double r = unary(depth + 1);
        if (r == 0) throw FormulaError("division by zero", col, "check the denominator");
        v /= r;
      } else if (k == Tok::Name || k == Tok::LParen || k == Tok::Func) {
        v *= unary(depth + 1);  // implicit multiplication: 3n, n(n+1)
      } else if (k == Tok::Number) {
        throw FormulaError("a number cannot follow here", peek().column, "write 2n or n*2, not n2");
      } else {
        return v;
      }
    }
  }

  double unary(int depth) {
    guard(depth);
    if (peek().kind == Tok::Minus) {
      take();
      return -unary(depth + 1);
    }
    if (peek().kind == Tok::Plus) {
      take();
      return unary(depth + 1);
    }
    return power(depth + 1);
  }

  double power(int depth) {
    guard(depth);
    const double base = primary(depth + 1);
    if (peek().kind == Tok::Caret) {
      take();
      const double e = unary(depth + 1);  // right associative: n^2^1 = n^(2^1)
      return std::pow(base, e);
    }
    return base;
  }

  double primary(int depth) {
    guard(depth);
    const Token t = take();
    switch (t.kind) {
      case Tok::Number: return t.number;
      case Tok::Name: return vars_.at(t.name);
      case Tok::Func: return call(t, depth);
      case Tok::LParen: {
        const double v = expr(depth + 1);
        if (peek().kind != Tok::RParen) throw FormulaError("missing ')'", peek().column, "close every '('");
        take();
        return v;
      }
      case Tok::End:
        throw FormulaError("the formula ends too early", t.column, "finish the formula, e.g. 3n");
      default:
        throw FormulaError("expected a number, a name or '('", t.column, names_hint(vars_));
    }
  }

  // exp(x), max(a, b, …), min(a, b, …): the name is taken, then the parenthesised arguments.
  double call(const Token& f, int depth) {
    if (peek().kind != Tok::LParen)
      throw FormulaError(f.name + " needs its arguments in parentheses", peek().column, "e.g. " + f.name + "(x)");
    take();
    std::vector<double> args{expr(depth + 1)};
    while (peek().kind == Tok::Comma) {
      take();
      args.push_back(expr(depth + 1));
    }
    if (peek().kind != Tok::RParen) throw FormulaError("missing ')'", peek().column, "close every '('");
    take();
    if (f.name == "exp") {
      if (args.size() != 1) throw FormulaError("exp takes one argument", f.column, "e.g. exp(ma - mb)");
      return std::exp(args[0]);
    }
    if (args.size() < 2) throw FormulaError(f.name + " takes two or more arguments", f.column, "e.g. max(ma, mb)");
    return f.name == "max" ? *std::max_element(args.begin(), args.end()) : *std::min_element(args.begin(), args.end());
  }

  std::vector<Token> toks_;
  const Bindings& vars_;
  std::size_t pos_ = 0;
};

std::string fmt(double v) {
  std::ostringstream os;
  os.precision(10);
  os << v;
  return os.str();
}

}  // namespace

double evaluate_formula(const std::string& text, const Bindings& vars) {
  if (text.size() > kMaxLength) {
    throw FormulaError("formula longer than 200 characters", 0, "simplify the formula");
  }
  const bool blank = std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isspace(c); });
  if (blank) throw FormulaError("empty formula", 0, "type a formula such as 3n");
  Parser p(tokenize(text, vars), vars);
  const double v = p.parse();
  if (!std::isfinite(v)) throw FormulaError("the formula does not give a finite number", 0, "check powers and divisions");
  return v;
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

std::vector<Bindings> random_samples(const std::vector<VariableRange>& ranges, std::uint64_t seed, int count) {
  std::mt19937_64 rng(seed);
  std::vector<Bindings> out(static_cast<std::size_t>(count));
  for (auto& b : out) {
    for (const auto& r : ranges) {
      if (r.real) {
        b[r.name] = std::uniform_real_distribution<double>(r.lo, r.hi)(rng);
      } else {
        const auto lo = static_cast<long long>(r.lo), hi = static_cast<long long>(r.hi);
        b[r.name] = static_cast<double>(std::uniform_int_distribution<long long>(lo, hi)(rng));
      }
    }
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
