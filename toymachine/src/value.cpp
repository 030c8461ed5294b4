// Symbolic values: the expressions the lesson's step tables print in each register column.
//
// Construction normalises as it goes (flatten, cancel, fold) so that two routes to the same
// quantity give the same tree. That is the point of the toy-machine lesson, "Two paths to the same sum": the
// online sum s_k = s_{k-1}·e^(m_{k-1} − m_k) + e^(x_{k-1} − m_k) folds, by e^u·e^v = e^(u+v),
// into Σ_j e^(xj − m_k), which at k = n *is* the two-pass S and prints as `S`.
#include "flashlab/toymachine/value.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <functional>

namespace flashlab::toy {

namespace {

std::uint64_t mix(std::uint64_t h, std::uint64_t v) {
  // splitmix64-style finaliser over the running value: cheap, well spread.
  std::uint64_t z = h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::uint64_t dbits(double d) { return std::bit_cast<std::uint64_t>(d == 0.0 ? 0.0 : d); }

bool is_const(const ExprPtr& e, double v) { return e->kind == ExprKind::Constant && e->value == v; }

Expr node(ExprKind k) {
  Expr e;
  e.kind = k;
  return e;
}

ExprPtr finish(Expr e) {
  std::uint64_t h = static_cast<std::uint64_t>(e.kind) + 1;
  switch (e.kind) {
    case ExprKind::Input:
      h = mix(h, std::hash<std::string>{}(e.array));
      h = mix(h, e.index);
      break;
    case ExprKind::Constant:
      h = mix(h, dbits(e.value));
      break;
    case ExprKind::Sum: {
      std::uint64_t acc = 0;  // order-independent: a + b hashes like b + a
      for (std::size_t i = 0; i < e.args.size(); ++i) acc += mix(e.args[i]->hash, dbits(e.coeffs[i]));
      h = mix(mix(h, acc), dbits(e.value));
      break;
    }
    case ExprKind::Product:
    case ExprKind::Max: {
      std::uint64_t acc = 0;
      for (const auto& a : e.args) acc += mix(a->hash, 7);
      h = mix(h, acc);
      break;
    }
    case ExprKind::Quotient:
    case ExprKind::Exp:
      for (const auto& a : e.args) h = mix(h, a->hash);
      break;
  }
  e.hash = h;
  return std::make_shared<const Expr>(std::move(e));
}

// Multiset match of two term lists (with optional coefficients), hash first.
bool same_terms(const Expr& a, const Expr& b, bool with_coeffs) {
  if (a.args.size() != b.args.size()) return false;
  std::vector<bool> used(b.args.size(), false);
  for (std::size_t i = 0; i < a.args.size(); ++i) {
    bool found = false;
    for (std::size_t j = 0; j < b.args.size() && !found; ++j) {
      if (used[j] || a.args[i]->hash != b.args[j]->hash) continue;
      if (with_coeffs && a.coeffs[i] != b.coeffs[j]) continue;
      if (equivalent(*a.args[i], *b.args[j])) used[j] = found = true;
    }
    if (!found) return false;
  }
  return true;
}

// Terms of a sum-to-be: (term, coefficient) plus a constant. Equal terms are found through a
// hash index, so building a k-term sum costs O(k), not O(k²) (the softmax names m and S are
// built over all n inputs at every --n).
struct Terms {
  std::vector<ExprPtr> args;
  std::vector<double> coeffs;
  double constant = 0.0;
  std::unordered_multimap<std::uint64_t, std::size_t> index;

  void add(const ExprPtr& e, double sign) {
    if (e->kind == ExprKind::Constant) {
      constant += sign * e->value;
    } else if (e->kind == ExprKind::Sum) {
      for (std::size_t i = 0; i < e->args.size(); ++i) add_term(e->args[i], sign * e->coeffs[i]);
      constant += sign * e->value;
    } else {
      add_term(e, sign);
    }
  }
  void add_term(const ExprPtr& t, double c) {
    auto [lo, hi] = index.equal_range(t->hash);
    for (auto it = lo; it != hi; ++it) {
      if (equivalent(*args[it->second], *t)) {
        coeffs[it->second] += c;  // x − x cancels in build() (lesson: SUB R0, r1, R0 with R0 = r1 = x0 gives 0)
        return;
      }
    }
    index.emplace(t->hash, args.size());
    args.push_back(t);
    coeffs.push_back(c);
  }
  ExprPtr build() {
    std::size_t w = 0;
    for (std::size_t i = 0; i < args.size(); ++i)
      if (coeffs[i] != 0.0) args[w] = args[i], coeffs[w] = coeffs[i], ++w;
    args.resize(w);
    coeffs.resize(w);
    if (args.empty()) return make_constant(constant);
    if (args.size() == 1 && coeffs[0] == 1.0 && constant == 0.0) return args[0];
    Expr e = node(ExprKind::Sum);
    e.args = std::move(args);
    e.coeffs = std::move(coeffs);
    e.value = constant;
    return finish(std::move(e));
  }
};

bool input_less(const ExprPtr& a, const ExprPtr& b) {
  if (a->array != b->array) return a->array < b->array;
  return a->index < b->index;
}

}  // namespace

ExprPtr make_input(const std::string& array, std::size_t index, const std::string& display) {
  Expr e = node(ExprKind::Input);
  e.array = array;
  e.index = index;
  e.name = display;
  return finish(std::move(e));
}

ExprPtr make_constant(double v) {
  Expr e = node(ExprKind::Constant);
  e.value = v;
  return finish(std::move(e));
}

ExprPtr make_add(const ExprPtr& a, const ExprPtr& b) {
  Terms t;
  t.add(a, 1.0);
  t.add(b, 1.0);
  return t.build();
}

ExprPtr make_sub(const ExprPtr& a, const ExprPtr& b) {
  Terms t;
  t.add(a, 1.0);
  t.add(b, -1.0);
  return t.build();
}

ExprPtr make_exp(const ExprPtr& a) {
  if (is_const(a, 0.0)) return make_constant(1.0);  // e^0 = 1 (the toy-machine lesson, online softmax init)
  Expr e = node(ExprKind::Exp);
  e.args = {a};
  return finish(std::move(e));
}

ExprPtr make_mul(const ExprPtr& a, const ExprPtr& b) {
  if (a->kind == ExprKind::Constant && b->kind == ExprKind::Constant) return make_constant(a->value * b->value);
  if (is_const(a, 1.0)) return b;
  if (is_const(b, 1.0)) return a;
  // e^u · e^v = e^(u+v): the online-softmax rescale e^(m − m') cancels the old max.
  if (a->kind == ExprKind::Exp && b->kind == ExprKind::Exp) return make_exp(make_add(a->args[0], b->args[0]));
  // (Σ c_j e^(u_j)) · e^v = Σ c_j e^(u_j + v): s·e^(m − m') becomes Σ e^(xj − m').
  auto distributes = [](const ExprPtr& s, const ExprPtr& f) {
    if (s->kind != ExprKind::Sum || f->kind != ExprKind::Exp || s->value != 0.0) return false;
    return std::all_of(s->args.begin(), s->args.end(), [](const ExprPtr& t) { return t->kind == ExprKind::Exp; });
  };
  const ExprPtr* sum = nullptr;
  const ExprPtr* factor = nullptr;
  if (distributes(a, b)) sum = &a, factor = &b;
  else if (distributes(b, a)) sum = &b, factor = &a;
  if (sum) {
    Terms t;
    for (std::size_t i = 0; i < (*sum)->args.size(); ++i) t.add_term(make_mul((*sum)->args[i], *factor), (*sum)->coeffs[i]);
    return t.build();
  }
  Expr e = node(ExprKind::Product);
  e.args = {a, b};
  return finish(std::move(e));
}

ExprPtr make_div(const ExprPtr& a, const ExprPtr& b) {
  if (a->kind == ExprKind::Constant && b->kind == ExprKind::Constant && b->value != 0.0)
    return make_constant(a->value / b->value);
  if (is_const(b, 1.0)) return a;
  Expr e = node(ExprKind::Quotient);
  e.args = {a, b};
  return finish(std::move(e));
}

ExprPtr make_max_of(const std::vector<ExprPtr>& items) {
  if (items.empty()) return nullptr;
  if (items.size() == 1) return items[0];
  std::vector<ExprPtr> terms;
  std::unordered_multimap<std::uint64_t, std::size_t> index;
  if (std::all_of(items.begin(), items.end(), [](const ExprPtr& t) { return t->kind == ExprKind::Constant; })) {
    double v = items[0]->value;
    for (const auto& t : items) v = std::max(v, t->value);
    return make_constant(v);
  }
  auto add = [&](const ExprPtr& t) {
    auto [lo, hi] = index.equal_range(t->hash);
    for (auto it = lo; it != hi; ++it)
      if (equivalent(*terms[it->second], *t)) return;  // max(x, x) = x
    index.emplace(t->hash, terms.size());
    terms.push_back(t);
  };
  for (const auto& p : items) {
    if (p->kind == ExprKind::Max) {
      for (const auto& t : p->args) add(t);
    } else {
      add(p);
    }
  }
  if (terms.size() == 1) return terms[0];
  // Inputs first, in array order, so a running max reads max(x0, x1, x2) whatever the
  // operand order of MAX; other terms keep their order after them.
  std::stable_partition(terms.begin(), terms.end(), [](const ExprPtr& t) { return t->kind == ExprKind::Input; });
  auto inputs_end = std::find_if(terms.begin(), terms.end(), [](const ExprPtr& t) { return t->kind != ExprKind::Input; });
  std::stable_sort(terms.begin(), inputs_end, input_less);
  Expr e = node(ExprKind::Max);
  e.args = std::move(terms);
  return finish(std::move(e));
}

ExprPtr make_max(const ExprPtr& a, const ExprPtr& b) { return make_max_of({a, b}); }

ExprPtr make_sum_of(const std::vector<ExprPtr>& items) {
  Terms t;
  for (const auto& e : items) t.add(e, 1.0);
  return t.build();
}

bool equivalent(const Expr& a, const Expr& b) {
  if (&a == &b) return true;  // shared subtrees: without this, squaring chains compare in 2^k
  if (&a == &b) return true;
  if (a.hash != b.hash || a.kind != b.kind) return false;
  switch (a.kind) {
    case ExprKind::Input: return a.array == b.array && a.index == b.index;
    case ExprKind::Constant: return a.value == b.value;
    case ExprKind::Sum: return a.value == b.value && same_terms(a, b, true);
    case ExprKind::Max: return same_terms(a, b, false);
    case ExprKind::Product:
      return (equivalent(*a.args[0], *b.args[0]) && equivalent(*a.args[1], *b.args[1])) ||
             (equivalent(*a.args[0], *b.args[1]) && equivalent(*a.args[1], *b.args[0]));
    case ExprKind::Quotient:
      return equivalent(*a.args[0], *b.args[0]) && equivalent(*a.args[1], *b.args[1]);
    case ExprKind::Exp: return equivalent(*a.args[0], *b.args[0]);
  }
  return false;
}

void NameTable::add(const std::string& name, const ExprPtr& expr) {
  if (!expr || expr->kind == ExprKind::Input || expr->kind == ExprKind::Constant) return;
  by_hash_.emplace(expr->hash, std::make_pair(name, expr));
}

const std::string* NameTable::find(const Expr& e) const {
  auto [lo, hi] = by_hash_.equal_range(e.hash);
  for (auto it = lo; it != hi; ++it)
    if (equivalent(*it->second.second, e)) return &it->second.first;
  return nullptr;
}

std::string format_number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v == 0.0 ? 0.0 : v);
  return buf;
}

namespace {

constexpr const char* kMinus = "\u2212";  // − as the lesson prints it
constexpr const char* kDot = "\u00b7";    // ·

// Printer. `subst` (when set) prints input (array, index) as array + "j": used to detect and
// print Σ_{j=p..q} f(xj). Substitution does not reach inside max(…): the running max is shared.
struct Printer {
  const NameTable* names;
  const std::string* subst_array = nullptr;
  std::size_t subst_index = 0;
  bool in_max = false;
  bool hit = false;

  std::string print(const Expr& e) {
    if (names && !names->empty()) {
      if (const std::string* n = names->find(e)) return *n;
    }
    switch (e.kind) {
      case ExprKind::Input:
        if (subst_array && !in_max && e.array == *subst_array && e.index == subst_index) {
          hit = true;
          return e.array + "j";
        }
        return e.name;
      case ExprKind::Constant: return format_number(e.value);
      case ExprKind::Sum: return sum(e);
      case ExprKind::Product: return factor(*e.args[0], false) + kDot + factor(*e.args[1], false);
      case ExprKind::Quotient: return factor(*e.args[0], false) + "/" + factor(*e.args[1], true);
      case ExprKind::Max: return max(e);
      case ExprKind::Exp: {
        const Expr& a = *e.args[0];
        std::string s = print(a);
        if ((a.kind == ExprKind::Input || a.kind == ExprKind::Constant) && s.find(' ') == std::string::npos)
          return "e^" + s;
        return "e^(" + s + ")";
      }
    }
    return "?";
  }

  std::string factor(const Expr& e, bool denominator) {
    std::string s = print(e);
    bool named = names && names->find(e);
    bool paren = !named && (e.kind == ExprKind::Sum || e.kind == ExprKind::Quotient ||
                            (denominator && e.kind == ExprKind::Product));
    if (!paren && e.kind == ExprKind::Constant && e.value < 0) paren = true;
    return paren ? "(" + s + ")" : s;
  }

  std::string max(const Expr& e) {
    bool saved = in_max;
    in_max = true;
    std::string out = "max(";
    for (std::size_t i = 0; i < e.args.size();) {
      // A run of ≥ 4 consecutive inputs of one array prints as x0..x7 (lesson: max(x_{0..n−2})).
      std::size_t j = i;
      if (e.args[i]->kind == ExprKind::Input) {
        while (j + 1 < e.args.size() && e.args[j + 1]->kind == ExprKind::Input &&
               e.args[j + 1]->array == e.args[i]->array && e.args[j + 1]->index == e.args[j]->index + 1)
          ++j;
      }
      if (i > 0) out += ", ";
      if (j - i + 1 >= 4) {
        out += print(*e.args[i]) + ".." + print(*e.args[j]);
        i = j + 1;
      } else {
        out += print(*e.args[i]);
        ++i;
      }
    }
    in_max = saved;
    return out + ")";
  }

  static void collect_inputs(const Expr& e, std::vector<const Expr*>& out) {
    if (e.kind == ExprKind::Max) return;
    if (e.kind == ExprKind::Input) {
      out.push_back(&e);
      return;
    }
    for (const auto& a : e.args) collect_inputs(*a, out);
  }

  // Σ_{j=p..q} f(xj) when the terms are f(xp), f(xp+1), …, f(xq), all with coefficient 1.
  bool try_sigma(const Expr& e, std::string& out) {
    if (e.args.size() < 4 || e.value != 0.0 || subst_array) return false;
    for (double c : e.coeffs)
      if (c != 1.0) return false;
    std::vector<const Expr*> cands;
    collect_inputs(*e.args[0], cands);
    for (const Expr* c : cands) {
      std::string first;
      bool ok = true;
      for (std::size_t k = 0; k < e.args.size() && ok; ++k) {
        Printer p{names, &c->array, c->index + k};
        std::string s = p.print(*e.args[k]);
        ok = p.hit && (k == 0 ? (first = s, true) : s == first);
      }
      if (ok) {
        out = "\u03a3_{j=" + std::to_string(c->index) + ".." + std::to_string(c->index + e.args.size() - 1) + "} " + first;
        return true;
      }
    }
    return false;
  }

  std::string sum(const Expr& e) {
    std::string out;
    if (try_sigma(e, out)) return out;
    // 1 − x reads better than −x + 1: a constant leads when the first term is negative.
    const bool constant_first = e.value != 0.0 && !e.coeffs.empty() && e.coeffs[0] < 0;
    if (constant_first) out = format_number(e.value);
    for (std::size_t i = 0; i < e.args.size(); ++i) {
      double c = e.coeffs[i];
      const Expr& t = *e.args[i];
      std::string s = print(t);
      if (t.kind == ExprKind::Sum) s = "(" + s + ")";
      double mag = std::fabs(c);
      std::string body = mag == 1.0 ? s : format_number(mag) + kDot + s;
      if (i == 0 && !constant_first) out += (c < 0 ? std::string(kMinus) : std::string()) + body;
      else out += (c < 0 ? std::string(" ") + kMinus + " " : std::string(" + ")) + body;
    }
    if (e.value != 0.0 && !constant_first) {
      out += e.value < 0 ? std::string(" ") + kMinus + " " : std::string(" + ");
      out += format_number(std::fabs(e.value));
    }
    return out;
  }
};

}  // namespace

namespace {
// Nodes of the fully expanded tree of `e`, saturating at `cap`. Expressions are shared DAGs: a
// trace that squares a register 80 times builds 81 nodes whose printed form has 2^80 terms, so
// the printer asks this first (memoised per shared node: linear in the DAG).
// A named subexpression (c00, m, S) prints as its name and counts as one node.
std::size_t expanded_size(const Expr& e, std::size_t cap, const NameTable* names,
                          std::unordered_map<const Expr*, std::size_t>& memo) {
  if (auto it = memo.find(&e); it != memo.end()) return it->second;
  std::size_t n = 1;
  const bool named = names && !names->empty() && names->find(e);
  for (const auto& a : e.args) {
    if (!a || named) continue;
    n += expanded_size(*a, cap, names, memo);
    if (n >= cap) {
      n = cap;
      break;
    }
  }
  memo.emplace(&e, n);
  return n;
}
}  // namespace

std::string to_string(const Expr& e, const NameTable* names) {
  std::unordered_map<const Expr*, std::size_t> memo;
  if (expanded_size(e, kMaxPrintedTerms + 1, names, memo) > kMaxPrintedTerms)
    return "\u27e8expression of more than " + std::to_string(kMaxPrintedTerms) + " terms\u27e9";
  Printer p{names};
  return p.print(e);
}

}  // namespace flashlab::toy
