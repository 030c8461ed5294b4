// The assembler: trace text → expanded instruction stream, collecting every error.
//
// It reads the seed's traces as printed (seed 004, "Full trace for c00", "Full trace: outer
// product matmul", the softmax hints): an optional leading step number, a mnemonic, operands
// separated by commas, `#` comments. The loop directive `for i in A..B` … `end` (inclusive,
// nestable) lets the n-element softmax passes be written once; it is expanded here, so the
// executor only ever sees straight-line code, as the seed's machine does.
#include "flashlab/toymachine/assembler.hpp"

#include <algorithm>
#include <limits>
#include <memory>

#include "text.hpp"

namespace flashlab::toy {

std::string format_diagnostic(const Diagnostic& d) {
  std::string out = d.file + ":" + std::to_string(d.line) + ":" + std::to_string(d.col) + ": error: " + d.message + "\n";
  if (!d.source_line.empty()) {
    out += "  " + d.source_line + "\n  ";
    // Tabs in the echoed line stay tabs under it, so the caret lines up.
    int col = 1;
    for (std::size_t i = 0; i < d.source_line.size() && col < d.col; ++i) {
      unsigned char c = static_cast<unsigned char>(d.source_line[i]);
      if ((c & 0xC0) == 0x80) continue;
      out += c == '\t' ? '\t' : ' ';
      ++col;
    }
    out += std::string(static_cast<std::size_t>(std::max(1, d.length)), '^') + "\n";
  }
  if (!d.hint.empty()) out += "hint: " + d.hint + "\n";
  return out;
}

// ---------------------------------------------------------------------------------------------
// Index expressions: integers, names (n, loop variables), + − * and parentheses.

namespace {

using Vars = std::vector<std::pair<std::string, long long>>;

struct ExprParser {
  std::string_view s;
  const Vars& vars;
  std::size_t pos = 0;
  std::string error;
  std::size_t error_col = 0;

  bool fail(const std::string& msg, std::size_t at) {
    if (error.empty()) error = msg, error_col = at;
    return false;
  }
  void skip() {
    while (pos < s.size() && text::is_space(s[pos])) ++pos;
  }
  // '-' or the seed's '−' (U+2212).
  bool minus() {
    if (pos < s.size() && s[pos] == '-') return ++pos, true;
    if (s.substr(pos, 3) == "\u2212") return pos += 3, true;
    return false;
  }
  static bool add_ok(long long a, long long b, long long& r) { return !__builtin_add_overflow(a, b, &r); }
  static bool mul_ok(long long a, long long b, long long& r) { return !__builtin_mul_overflow(a, b, &r); }

  bool sum(long long& v) {
    if (!term(v)) return false;
    for (;;) {
      skip();
      std::size_t at = pos;
      bool neg;
      if (pos < s.size() && s[pos] == '+') ++pos, neg = false;
      else if (minus()) neg = true;
      else return true;
      long long r = 0;
      if (!term(r)) return false;
      if (neg) r = -r;
      if (!add_ok(v, r, v)) return fail("index arithmetic overflows", at);
    }
  }
  bool term(long long& v) {
    if (!unary(v)) return false;
    for (;;) {
      skip();
      if (pos >= s.size() || s[pos] != '*') return true;
      std::size_t at = pos++;
      long long r = 0;
      if (!unary(r)) return false;
      if (!mul_ok(v, r, v)) return fail("index arithmetic overflows", at);
    }
  }
  bool unary(long long& v) {
    skip();
    if (minus()) {
      if (!unary(v)) return false;
      v = -v;
      return true;
    }
    return atom(v);
  }
  bool atom(long long& v) {
    skip();
    if (pos >= s.size()) return fail("expected a number or a name", pos);
    char c = s[pos];
    if (c == '(') {
      std::size_t open = pos++;
      if (!sum(v)) return false;
      skip();
      if (pos >= s.size() || s[pos] != ')') return fail("unclosed '('", open);
      ++pos;
      return true;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      std::size_t st = pos;
      v = 0;
      while (pos < s.size() && std::isdigit(static_cast<unsigned char>(s[pos]))) {
        if (!mul_ok(v, 10, v) || !add_ok(v, s[pos] - '0', v)) return fail("number too large", st);
        ++pos;
      }
      return true;
    }
    if (text::is_ident_start(c)) {
      std::size_t st = pos;
      while (pos < s.size() && text::is_ident_char(s[pos])) ++pos;
      std::string_view name = s.substr(st, pos - st);
      for (auto it = vars.rbegin(); it != vars.rend(); ++it)
        if (it->first == name) return v = it->second, true;
      return fail("unknown name '" + std::string(name) + "'", st);
    }
    return fail("unexpected '" + text::char_at(s, pos) + "'", pos);
  }
};

}  // namespace

bool eval_index_expression(std::string_view expr, const Vars& vars, long long& result, std::string& error,
                           std::size_t& error_col) {
  ExprParser p{expr, vars, 0, {}, 0};
  long long v = 0;
  bool ok = p.sum(v);
  if (ok) {
    p.skip();
    if (p.pos < expr.size()) ok = p.fail("unexpected '" + text::char_at(expr, p.pos) + "'", p.pos);
  }
  if (!ok) {
    error = p.error;
    error_col = p.error_col;
    return false;
  }
  result = v;
  return true;
}

// ---------------------------------------------------------------------------------------------

namespace {

struct IndexTemplate {
  std::string expr;     // as written between the brackets
  std::size_t at = 0;   // byte offset in the line
};

struct OperandTemplate {
  OperandKind kind = OperandKind::Register;
  int reg = -1;
  std::string name;
  int array = -1;
  std::vector<IndexTemplate> index;
};

struct Node {
  bool loop = false;
  int line = 0;
  // instruction
  Opcode op = Opcode::LOAD;
  std::string mnemonic_text;
  std::size_t col = 0;  // byte offset of the mnemonic
  std::vector<OperandTemplate> operands;
  // loop
  std::string var;
  IndexTemplate lo, hi;
  std::vector<Node> body;
};

struct Assembler {
  const Machine& m;
  std::string file;
  std::vector<std::string> lines;
  std::vector<Diagnostic> diags;
  Vars scope;  // names visible to index expressions while parsing: n, then loop variables

  void error(int line, std::size_t byte_col, std::size_t byte_len, std::string msg, std::string hint) {
    Diagnostic d;
    d.file = file;
    d.line = line;
    const std::string& src = lines[static_cast<std::size_t>(line - 1)];
    byte_col = std::min(byte_col, src.size());
    d.col = text::chars_before(src, byte_col) + 1;
    d.length = std::max(1, text::chars_before(std::string_view(src).substr(byte_col), byte_len));
    d.message = std::move(msg);
    d.hint = std::move(hint);
    d.source_line = src;
    diags.push_back(std::move(d));
  }

  std::string scope_names() const {
    std::string s;
    for (const auto& [name, v] : scope) s += (s.empty() ? "" : ", ") + name;
    return s;
  }

  // Checks an index expression now (syntax, names in scope); values come at expansion.
  bool check_expr(int line, const IndexTemplate& t) {
    long long v = 0;
    std::string err;
    std::size_t col = 0;
    if (eval_index_expression(t.expr, scope, v, err, col)) return true;
    // Overflow with placeholder values is not an error of the text.
    if (err.find("overflow") != std::string::npos) return true;
    error(line, t.at + col, 1, err + " in index '" + t.expr + "'",
          "indices are integer expressions over " + scope_names() + " with + - * and parentheses, e.g. x[i], x[n-1]");
    return false;
  }

  static std::string operand_usage(const IsaEntry& e) {
    bool all_regs = std::all_of(e.pattern.begin(), e.pattern.end(), [](OperandKind k) { return k == OperandKind::Register; });
    std::string count = std::to_string(e.pattern.size());
    return e.mnemonic + " takes " + count + (all_regs ? " registers: " : " operands: ") + e.mnemonic + " " + e.operands;
  }

  // One operand slot. `s` is the line, [st, en) the operand's bytes (trimmed).
  bool parse_operand(int line, const IsaEntry& e, std::size_t slot, const std::string& s, std::size_t st,
                     std::size_t en, OperandTemplate& out) {
    const std::string word = s.substr(st, en - st);
    std::size_t i = st;
    while (i < en && text::is_ident_char(s[i])) ++i;
    if (i == st || !text::is_ident_start(s[st])) {
      error(line, st, en - st, "'" + word + "' is not an operand", operand_usage(e));
      return false;
    }
    out.name = s.substr(st, i - st);
    const bool want_reg = e.pattern[slot] == OperandKind::Register;
    out.kind = e.pattern[slot];
    if (want_reg) {
      if (i != en) {
        error(line, st, en - st, e.mnemonic + " operand " + std::to_string(slot + 1) + " must be a register, not '" + word + "'",
              operand_usage(e) + "; only LOAD and STORE touch DRAM");
        return false;
      }
      out.reg = m.find_register(out.name);
      if (out.reg < 0) {
        std::string hint = "machine " + m.name + " has " + m.register_list();
        if (m.find_array(out.name) >= 0) hint = "'" + out.name + "' is a DRAM array; " + operand_usage(e);
        error(line, st, en - st, "machine " + m.name + " has no register " + out.name, hint);
        return false;
      }
      return true;
    }
    // A DRAM operand: name, then [expr] per dimension.
    if (m.find_register(out.name) >= 0 && i == en) {
      error(line, st, en - st,
            e.mnemonic + " operand " + std::to_string(slot + 1) + " must be a DRAM element, not register " + out.name,
            operand_usage(e) + ", e.g. " + (e.opcode == Opcode::LOAD ? "LOAD a[0][0], R0" : "STORE R2, c[0][0]"));
      return false;
    }
    out.array = m.find_array(out.name);
    bool ok = true;
    while (i < en) {
      if (s[i] != '[') {
        error(line, i, en - i, "unexpected '" + s.substr(i, en - i) + "' after " + out.name,
              "DRAM operands are written a[0][1], x[i] or out[n-1]");
        return false;
      }
      std::size_t close = s.find(']', i);
      if (close == std::string::npos || close >= en) {
        error(line, i, en - i, "unclosed '['", "DRAM operands are written a[0][1], x[i] or out[n-1]");
        return false;
      }
      IndexTemplate t{s.substr(i + 1, close - i - 1), i + 1};
      if (t.expr.find_first_not_of(" \t") == std::string::npos) {
        error(line, i, close - i + 1, "empty index", "write an index such as x[0], x[i] or x[n-1]");
        ok = false;
      } else {
        ok = check_expr(line, t) && ok;
      }
      out.index.push_back(std::move(t));
      i = close + 1;
      while (i < en && text::is_space(s[i])) ++i;
    }
    if (ok && out.array >= 0) {
      const ArrayDecl& a = m.arrays[static_cast<std::size_t>(out.array)];
      if (out.index.size() != a.dims.size()) {
        error(line, st, en - st,
              out.name + " has " + std::to_string(a.dims.size()) + " dimension" + (a.dims.size() == 1 ? "" : "s") +
                  ", written with " + std::to_string(out.index.size()) + " index" + (out.index.size() == 1 ? "" : "es"),
              "write it as " + a.element_operand(0) + " (" + a.shape() + ")");
        ok = false;
      }
    }
    return ok;
  }

  // An instruction line from byte `p` (the mnemonic) to `end`.
  void parse_instruction(int line, const std::string& s, std::size_t p, std::size_t end, std::vector<Node>& out) {
    std::size_t q = p;
    while (q < end && text::is_ident_char(s[q])) ++q;
    std::string mn = s.substr(p, q - p);
    const IsaEntry* e = find_instruction(mn);
    if (!e) {
      error(line, p, q - p, "unknown instruction '" + mn + "'", "machine " + m.name + " has " + m.isa_list());
      return;
    }
    if (!m.allows(e->opcode)) {
      error(line, p, q - p, "machine " + m.name + " has no " + e->mnemonic, "its instructions are " + m.isa_list());
      return;
    }
    Node n;
    n.line = line;
    n.op = e->opcode;
    n.mnemonic_text = mn;
    n.col = p;
    // Split operands on commas; brackets hold no commas.
    std::vector<std::pair<std::size_t, std::size_t>> spans;
    std::size_t i = q;
    while (i < end && text::is_space(s[i])) ++i;
    if (i < end) {
      std::size_t st = i;
      for (std::size_t k = i; k <= end; ++k) {
        if (k == end || s[k] == ',') {
          std::size_t a = st, b = k;
          while (a < b && text::is_space(s[a])) ++a;
          while (b > a && text::is_space(s[b - 1])) --b;
          spans.emplace_back(a, b);
          st = k + 1;
        }
      }
    }
    if (spans.size() != e->pattern.size()) {
      error(line, p, (spans.empty() ? q : spans.back().second) - p,
            e->mnemonic + " takes " + std::to_string(e->pattern.size()) + " operands, got " + std::to_string(spans.size()),
            operand_usage(*e));
      return;
    }
    bool ok = true;
    for (std::size_t k = 0; k < spans.size(); ++k) {
      auto [a, b] = spans[k];
      if (a == b) {
        error(line, a, 1, "missing operand " + std::to_string(k + 1), operand_usage(*e));
        ok = false;
        continue;
      }
      OperandTemplate t;
      ok = parse_operand(line, *e, k, s, a, b, t) && ok;
      n.operands.push_back(std::move(t));
    }
    if (ok) out.push_back(std::move(n));
  }

  // `for i in A..B` at byte p; returns false when the header is malformed (body still parsed).
  bool parse_for(int line, const std::string& s, std::size_t p, std::size_t end, Node& n) {
    const std::string usage = "write a loop as: for i in 0..n-1  (inclusive bounds, expressions in n), closed by end";
    std::size_t i = p + 3;
    while (i < end && text::is_space(s[i])) ++i;
    std::size_t vs = i;
    while (i < end && text::is_ident_char(s[i])) ++i;
    if (i == vs || !text::is_ident_start(s[vs])) {
      error(line, vs, 1, "expected a loop variable after 'for'", usage);
      return false;
    }
    n.var = s.substr(vs, i - vs);
    for (const auto& [name, v] : scope)
      if (name == n.var) {
        error(line, vs, i - vs, "loop variable '" + n.var + "' is already in use", "pick another name: in scope are " + scope_names());
        return false;
      }
    while (i < end && text::is_space(s[i])) ++i;
    if (s.compare(i, 2, "in") != 0 || (i + 2 < end && !text::is_space(s[i + 2]))) {
      error(line, i, 1, "expected 'in' after the loop variable", usage);
      return false;
    }
    i += 2;
    while (i < end && text::is_space(s[i])) ++i;
    std::size_t dots = s.find("..", i);
    if (dots == std::string::npos || dots >= end) {
      error(line, i, end - i, "expected a range A..B", usage);
      return false;
    }
    n.lo = {s.substr(i, dots - i), i};
    n.hi = {s.substr(dots + 2, end - dots - 2), dots + 2};
    bool ok = true;
    for (IndexTemplate* t : {&n.lo, &n.hi}) {
      if (t->expr.find_first_not_of(" \t") == std::string::npos) {
        error(line, t->at, 1, "missing loop bound", usage);
        ok = false;
      } else {
        ok = check_expr(line, *t) && ok;
      }
    }
    return ok;
  }

  // Parses lines from `li` until `end` (when nested) or EOF. Returns the line index after.
  std::size_t parse_block(std::size_t li, std::vector<Node>& out, int open_line, std::size_t open_col) {
    while (li < lines.size()) {
      const int line = static_cast<int>(li + 1);
      const std::string& s = lines[li];
      const std::size_t end = text::comment_start(s);
      ++li;
      std::size_t p = 0;
      while (p < end && text::is_space(s[p])) ++p;
      if (p == end) continue;
      // Optional step number (the seed's Step column), optionally followed by '.', ':' or ')'.
      if (std::isdigit(static_cast<unsigned char>(s[p]))) {
        std::size_t q = p;
        while (q < end && std::isdigit(static_cast<unsigned char>(s[q]))) ++q;
        if (q < end && (s[q] == '.' || s[q] == ':' || s[q] == ')')) ++q;
        if (q < end && !text::is_space(s[q]) && !text::is_ident_start(s[q])) {
          error(line, p, q - p + 1, "unexpected '" + s.substr(p, q - p + 1) + "'",
                "a line is [step number] INSTRUCTION operands, e.g. 1  LOAD a[0][0], R0");
          continue;
        }
        p = q;
        while (p < end && text::is_space(s[p])) ++p;
        if (p == end) continue;  // a bare step number (the seed's blank template rows)
      }
      if (!text::is_ident_start(s[p])) {
        error(line, p, 1, "unexpected '" + text::char_at(s, p) + "'", "a line is [step number] INSTRUCTION operands, e.g. 1  LOAD a[0][0], R0");
        continue;
      }
      std::size_t q = p;
      while (q < end && text::is_ident_char(s[q])) ++q;
      std::string word = s.substr(p, q - p);
      if (word == "end") {
        if (q < end && s.find_first_not_of(" \t", q) < end)
          error(line, q, end - q, "unexpected text after 'end'", "'end' stands alone on its line");
        if (open_line > 0) return li;
        error(line, p, 3, "'end' without a matching 'for'", "each 'end' closes one 'for i in A..B' loop");
        continue;
      }
      if (word == "for") {
        Node n;
        n.loop = true;
        n.line = line;
        n.col = p;
        bool ok = parse_for(line, s, p, end, n);
        if (ok) scope.emplace_back(n.var, 0);
        li = parse_block(li, n.body, line, p);
        if (ok) scope.pop_back();
        if (ok) out.push_back(std::move(n));
        continue;
      }
      parse_instruction(line, s, p, end, out);
    }
    if (open_line > 0)
      error(open_line, open_col, 3, "'for' without a matching 'end'", "close the loop with a line holding just: end");
    return li;
  }

  // ---- expansion ----
  std::vector<Instruction> code;
  bool too_long = false;

  long long value(const IndexTemplate& t, const Vars& env) {
    long long v = 0;
    std::string err;
    std::size_t col = 0;
    eval_index_expression(t.expr, env, v, err, col);  // checked at parse time
    return v;
  }

  void expand(const std::vector<Node>& nodes, Vars& env) {
    for (const Node& n : nodes) {
      if (too_long) return;
      if (n.loop) {
        long long lo = value(n.lo, env), hi = value(n.hi, env);
        env.emplace_back(n.var, 0);
        for (long long v = lo; v <= hi && !too_long; ++v) {
          env.back().second = v;
          expand(n.body, env);
          if (code.size() > kMaxInstructions) {
            too_long = true;
            error(n.line, n.col, 3, "the loops expand to more than " + std::to_string(kMaxInstructions) + " instructions",
                  "check the loop bounds, or use a smaller --n");
          }
        }
        env.pop_back();
        continue;
      }
      Instruction ins;
      ins.op = n.op;
      ins.source_line = n.line;
      ins.source_col = text::chars_before(lines[static_cast<std::size_t>(n.line - 1)], n.col) + 1;
      ins.text = n.mnemonic_text;
      for (std::size_t k = 0; k < n.operands.size(); ++k) {
        const OperandTemplate& t = n.operands[k];
        Operand o;
        o.kind = t.kind;
        o.reg = t.reg;
        o.name = t.name;
        o.array = t.array;
        ins.text += k == 0 ? " " : ", ";
        ins.text += t.name;
        for (const auto& ix : t.index) {
          o.index.push_back(value(ix, env));
          ins.text += text::bracket(o.index.back());
        }
        ins.operands.push_back(std::move(o));
      }
      code.push_back(std::move(ins));
    }
  }
};

}  // namespace

AssembleResult assemble(std::string_view textv, const Machine& machine, std::string_view filename) {
  Assembler a{machine, std::string(filename), text::split_lines(textv), {}, {{"n", machine.n}}, {}, false};
  std::vector<Node> nodes;
  a.parse_block(0, nodes, 0, 0);
  AssembleResult r;
  r.program.file = a.file;
  r.program.source_lines = a.lines;
  if (a.diags.empty()) {
    Vars env{{"n", machine.n}};
    a.expand(nodes, env);
    r.program.code = std::move(a.code);
  }
  if (a.diags.size() > kMaxDiagnostics) {
    std::size_t dropped = a.diags.size() - (kMaxDiagnostics - 1);
    a.diags.resize(kMaxDiagnostics - 1);
    Diagnostic more = a.diags.back();
    more.message = std::to_string(dropped) + " more errors not shown";
    more.hint = "fix the errors above first";
    more.source_line.clear();
    a.diags.push_back(std::move(more));
  }
  r.diagnostics = std::move(a.diags);
  if (!r.ok()) r.program.code.clear();
  return r;
}

}  // namespace flashlab::toy
