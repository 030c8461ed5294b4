// The trace front end: lines, diagnostics, the line lexer, index expressions and loops, shared by
// the toy machine's assembler (assembler.cpp) and the lessons' tile model (lessons/src/tile.cpp).
//
// The loop directive `for i in A..B` … `end` (inclusive, nestable) lets the n-element passes of
// the toy-machine lesson be written once. Loops are expanded before execution, so the machines
// only ever see straight-line code, as the lesson's machine does. The expansion is counted first
// (closed form where a loop holds only statements) so that a trace over the instruction cap is
// refused before anything is built, and a loop with an empty body cannot spin for hours.
#include "flashlab/toymachine/frontend.hpp"

#include <algorithm>
#include <limits>

#include "text.hpp"

namespace flashlab::toy {

namespace {

// Echoed lines are cut to a window around the caret: a line of 200,000 parentheses stays readable.
constexpr int kEchoWidth = 100;

// Byte offset of code point `cp` (0-based) in UTF-8 `s`.
std::size_t byte_of_char(std::string_view s, int cp) {
  int n = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) continue;
    if (n++ == cp) return i;
  }
  return s.size();
}

}  // namespace

std::string format_diagnostic(const Diagnostic& d) {
  // User text (the message quotes tokens, the echo the line) goes through text::visible: a
  // trace's escape sequences must not reach the terminal.
  std::string out = d.file + ":" + std::to_string(d.line) + ":" + std::to_string(d.col) + ": error: " +
                    text::visible(d.message) + "\n";
  if (!d.source_line.empty()) {
    // The window [first, first + kEchoWidth) in characters, holding the caret's column.
    const int chars = text::chars_before(d.source_line, d.source_line.size());
    const int first = chars <= kEchoWidth ? 0 : std::clamp(d.col - 1 - kEchoWidth / 2, 0, chars - kEchoWidth);
    const std::size_t b0 = byte_of_char(d.source_line, first);
    const std::size_t b1 = chars <= kEchoWidth ? d.source_line.size() : byte_of_char(d.source_line, first + kEchoWidth);
    const std::string lead = first > 0 ? "…" : "";
    out += "  " + lead + text::visible(d.source_line.substr(b0, b1 - b0)) + (b1 < d.source_line.size() ? "…" : "") +
           "\n  ";
    if (first > 0) out += ' ';
    // Tabs in the echoed line stay tabs under it, so the caret lines up.
    int col = first + 1;
    for (std::size_t i = b0; i < b1 && col < d.col; ++i) {
      unsigned char c = static_cast<unsigned char>(d.source_line[i]);
      if ((c & 0xC0) == 0x80) continue;
      out += c == '\t' ? '\t' : ' ';
      ++col;
    }
    const int carets = std::max(1, std::min(d.length, first + kEchoWidth + 1 - d.col));  // within the window
    out += std::string(static_cast<std::size_t>(carets), '^') + "\n";
  }
  if (!d.hint.empty()) out += "hint: " + d.hint + "\n";
  return out;
}

// ---------------------------------------------------------------------------------------------
// Index expressions: integers, names (n, loop variables), + − * and parentheses, checked.

namespace {

struct ExprParser {
  std::string_view s;
  const IndexVars& vars;
  std::size_t pos = 0;
  int depth = 0;  // open parentheses and unary minuses: each is one level of recursion
  std::string error;
  std::size_t error_col = 0;

  bool fail(const std::string& msg, std::size_t at) {
    if (error.empty()) error = msg, error_col = at;
    return false;
  }
  bool overflow(std::size_t at) { return fail("index arithmetic overflows", at); }
  // One more level of nesting, refused past kMaxNesting before the parser recurses.
  bool deeper(std::size_t at) {
    if (++depth <= kMaxNesting) return true;
    return fail("index expression nested deeper than " + std::to_string(kMaxNesting) + " levels", at);
  }
  void skip() {
    while (pos < s.size() && text::is_space(s[pos])) ++pos;
  }
  // '-' or the lesson's '−' (U+2212).
  bool minus() {
    if (pos < s.size() && s[pos] == '-') return ++pos, true;
    if (s.substr(pos, 3) == "\u2212") return pos += 3, true;
    return false;
  }

  bool sum(long long& v) {
    if (!term(v)) return false;
    for (;;) {
      skip();
      const std::size_t at = pos;
      bool neg;
      if (pos < s.size() && s[pos] == '+') ++pos, neg = false;
      else if (minus()) neg = true;
      else return true;
      long long r = 0;
      if (!term(r)) return false;
      if (neg ? __builtin_sub_overflow(v, r, &v) : __builtin_add_overflow(v, r, &v)) return overflow(at);
    }
  }
  bool term(long long& v) {
    if (!unary(v)) return false;
    for (;;) {
      skip();
      if (pos >= s.size() || s[pos] != '*') return true;
      const std::size_t at = pos++;
      long long r = 0;
      if (!unary(r)) return false;
      if (__builtin_mul_overflow(v, r, &v)) return overflow(at);
    }
  }
  bool unary(long long& v) {
    skip();
    const std::size_t at = pos;
    if (!minus()) return atom(v);
    if (!deeper(at) || !unary(v)) return false;
    --depth;
    if (__builtin_sub_overflow(0LL, v, &v)) return overflow(at);  // −INT64_MIN does not exist
    return true;
  }
  bool atom(long long& v) {
    skip();
    if (pos >= s.size()) return fail("expected a number or a name", pos);
    const char c = s[pos];
    if (c == '(') {
      const std::size_t open = pos++;
      if (!deeper(open) || !sum(v)) return false;
      --depth;
      skip();
      if (pos >= s.size() || s[pos] != ')') return fail("unclosed '('", open);
      ++pos;
      return true;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      const std::size_t st = pos;
      v = 0;
      while (pos < s.size() && std::isdigit(static_cast<unsigned char>(s[pos]))) {
        if (__builtin_mul_overflow(v, 10LL, &v) || __builtin_add_overflow(v, static_cast<long long>(s[pos] - '0'), &v))
          return fail("number too large", st);
        ++pos;
      }
      return true;
    }
    if (text::is_ident_start(c)) {
      const std::size_t st = pos;
      while (pos < s.size() && text::is_ident_char(s[pos])) ++pos;
      const std::string_view name = s.substr(st, pos - st);
      for (auto it = vars.rbegin(); it != vars.rend(); ++it)
        if (it->first == name) return v = it->second, true;
      return fail("unknown name '" + std::string(name) + "'", st);
    }
    return fail("unexpected " + text::describe_char(s, pos), pos);
  }
};

// An expression quoted in a message, cut when long (the caret shows the place anyway).
std::string quoted(const std::string& expr) {
  constexpr std::size_t kShown = 40;
  if (expr.size() <= kShown) return "'" + expr + "'";
  std::size_t cut = kShown;
  while (cut > 0 && (static_cast<unsigned char>(expr[cut]) & 0xC0) == 0x80) --cut;
  return "'" + expr.substr(0, cut) + "…'";
}

std::string scope_names(const IndexVars& scope) {
  std::string s;
  for (const auto& [name, v] : scope) s += (s.empty() ? "" : ", ") + name;
  return s;
}

}  // namespace

bool eval_index_expression(std::string_view expr, const IndexVars& vars, long long& result, std::string& error,
                           std::size_t& error_col) {
  ExprParser p{expr, vars, 0, 0, {}, 0};
  long long v = 0;
  bool ok = p.sum(v);
  if (ok) {
    p.skip();
    if (p.pos < expr.size()) ok = p.fail("unexpected " + text::describe_char(expr, p.pos), p.pos);
  }
  if (!ok) {
    error = p.error;
    error_col = p.error_col;
    return false;
  }
  result = v;
  return true;
}

namespace {

// The hint for one evaluation error: nesting and overflow have their own.
std::string hint_for(const std::string& err, const IndexVars& vars) {
  if (err.rfind("index expression nested", 0) == 0)
    return "an index may nest at most " + std::to_string(kMaxNesting) + " parentheses and unary minuses: write it flatter";
  if (err == "index arithmetic overflows") return "an index is a 64-bit integer: check the expression and the loop bounds";
  return index_hint(vars);
}

}  // namespace

std::string index_hint(const IndexVars& scope) {
  return "indices are integer expressions over " + scope_names(scope) +
         " with + - * and parentheses, e.g. x[i], x[n-1]";
}

bool check_index(Source& src, const IndexExpr& e, const IndexVars& scope) {
  long long v = 0;
  std::string err;
  std::size_t col = 0;
  if (eval_index_expression(e.text, scope, v, err, col)) return true;
  // The loop variables hold placeholders while parsing: an overflow is judged at expansion.
  if (err == "index arithmetic overflows") return true;
  src.error(e.line, e.at + col, 1, err + " in index " + quoted(e.text), hint_for(err, scope));
  return false;
}

bool evaluate_index(Source& src, const IndexExpr& e, const IndexVars& vars, long long& out) {
  std::string err;
  std::size_t col = 0;
  if (eval_index_expression(e.text, vars, out, err, col)) return true;
  std::string values;
  for (const auto& [name, v] : vars) values += (values.empty() ? "" : ", ") + name + " = " + std::to_string(v);
  src.error(e.line, e.at + col, 1, err + " in index " + quoted(e.text) + " (with " + values + ")", hint_for(err, vars));
  return false;
}

// ---------------------------------------------------------------------------------------------
// Lines and diagnostics.

Source::Source(std::string_view text, std::string file) : file_(std::move(file)), lines_(text::split_lines(text)) {}

int Source::column(int number, std::size_t byte) const {
  return text::chars_before(line(number), byte) + 1;
}

void Source::error(int number, std::size_t byte_col, std::size_t byte_len, std::string message, std::string hint) {
  Diagnostic d;
  d.file = file_;
  d.line = number;
  if (diagnostics_.size() >= kMaxDiagnostics) {  // only counted: a million bad lines stay cheap
    diagnostics_.push_back(std::move(d));
    return;
  }
  const std::string& src = line(number);
  byte_col = std::min(byte_col, src.size());
  d.col = text::chars_before(src, byte_col) + 1;
  d.length = std::max(1, text::chars_before(std::string_view(src).substr(byte_col), byte_len));
  d.message = std::move(message);
  d.hint = std::move(hint);
  d.source_line = src;
  diagnostics_.push_back(std::move(d));
}

std::vector<Diagnostic> Source::diagnostics() const {
  if (diagnostics_.size() <= kMaxDiagnostics) return diagnostics_;
  std::vector<Diagnostic> out(diagnostics_.begin(), diagnostics_.begin() + (kMaxDiagnostics - 1));
  Diagnostic more = out.back();
  more.message = std::to_string(diagnostics_.size() - (kMaxDiagnostics - 1)) + " more errors not shown";
  more.hint = "fix the errors above first";
  more.source_line.clear();
  out.push_back(std::move(more));
  return out;
}

// ---------------------------------------------------------------------------------------------
// The loop structure.

namespace {

const char* const kLineUsage = "a line is [step number] INSTRUCTION operands, e.g. 1  LOAD a[0][0], R0";
const char* const kLoopUsage =
    "write a loop as: for i in 0..n-1  (inclusive bounds, expressions in n), closed by end";

struct OpenLoop {
  std::size_t item = 0;   // index in LoopProgram::items
  bool named = false;     // its variable was pushed onto the scope
};

struct LoopParser {
  Source& src;
  IndexVars scope;
  const StatementParser& parse_statement;
  LoopProgram program;
  std::vector<OpenLoop> open;
  std::size_t too_deep = 0;  // `for` lines past kMaxNesting still open (their `end`s pair with them)

  void skip_space(const std::string& s, std::size_t& i, std::size_t end) {
    while (i < end && text::is_space(s[i])) ++i;
  }

  // `for VAR in A..B`; fills the item and returns whether the header is well formed.
  bool parse_header(int line, const std::string& s, std::size_t p, std::size_t end, LoopHeader& item) {
    std::size_t i = p + 3;
    skip_space(s, i, end);
    const std::size_t vs = i;
    while (i < end && text::is_ident_char(s[i])) ++i;
    if (i == vs || !text::is_ident_start(s[vs])) {
      src.error(line, vs, 1, "expected a loop variable after 'for'", kLoopUsage);
      return false;
    }
    item.var = s.substr(vs, i - vs);
    for (const auto& [name, v] : scope)
      if (name == item.var) {
        src.error(line, vs, i - vs, "loop variable '" + item.var + "' is already in use",
                  "pick another name: in scope are " + scope_names(scope));
        item.var.clear();
        return false;
      }
    skip_space(s, i, end);
    if (!text::iequals(std::string_view(s).substr(i, 2), "in") || (i + 2 < end && !text::is_space(s[i + 2]))) {
      src.error(line, i, 1, "expected 'in' after the loop variable", kLoopUsage);
      return false;
    }
    i += 2;
    skip_space(s, i, end);
    const std::size_t dots = s.find("..", i);
    if (dots == std::string::npos || dots >= end) {
      src.error(line, i, end - i, "expected a range A..B", kLoopUsage);
      return false;
    }
    item.lo = {s.substr(i, dots - i), line, i};
    item.hi = {s.substr(dots + 2, end - dots - 2), line, dots + 2};
    bool ok = true;
    for (const IndexExpr* e : {&item.lo, &item.hi}) {
      if (e->text.find_first_not_of(" \t") == std::string::npos) {
        src.error(line, e->at, 1, "missing loop bound", kLoopUsage);
        ok = false;
      } else {
        ok = check_index(src, *e, scope) && ok;
      }
    }
    return ok;
  }

  void open_loop(int line, const std::string& s, std::size_t p, std::size_t end) {
    if (too_deep > 0 || open.size() >= static_cast<std::size_t>(kMaxNesting)) {
      if (too_deep++ == 0)
        src.error(line, p, 3, "loops nested deeper than " + std::to_string(kMaxNesting) + " levels",
                  "flatten the trace: at most " + std::to_string(kMaxNesting) + " loops may be open at once");
      return;
    }
    LoopHeader header;
    parse_header(line, s, p, end, header);
    if (!open.empty()) program.items[open.back().item].leaf = false;
    const bool named = !header.var.empty();
    if (named) scope.emplace_back(header.var, 0);
    LoopItem item;
    item.loop = true;
    item.line = line;
    item.col = p;
    item.index = program.headers.size();
    program.headers.push_back(std::move(header));
    program.items.push_back(item);
    open.push_back({program.items.size() - 1, named});
  }

  void close_loop(int line, const std::string& s, std::size_t p, std::size_t q, std::size_t end) {
    if (q < end && s.find_first_not_of(" \t", q) < end)
      src.error(line, q, end - q, "unexpected text after 'end'", "'end' stands alone on its line");
    if (too_deep > 0) {
      --too_deep;
      return;
    }
    if (open.empty()) {
      src.error(line, p, 3, "'end' without a matching 'for'", "each 'end' closes one 'for i in A..B' loop");
      return;
    }
    program.items[open.back().item].body_end = program.items.size();
    if (open.back().named) scope.pop_back();
    open.pop_back();
  }

  // Operands: comma separated and trimmed (brackets hold no commas).
  static std::vector<Span> operands(const std::string& s, std::size_t from, std::size_t end) {
    std::vector<Span> out;
    std::size_t i = from;
    while (i < end && text::is_space(s[i])) ++i;
    if (i >= end) return out;
    std::size_t st = i;
    for (std::size_t k = i; k <= end; ++k) {
      if (k != end && s[k] != ',') continue;
      std::size_t a = st, b = k;
      while (a < b && text::is_space(s[a])) ++a;
      while (b > a && text::is_space(s[b - 1])) --b;
      out.push_back({a, b});
      st = k + 1;
    }
    return out;
  }

  void statement(int line, const std::string& s, std::size_t p, std::size_t q, std::size_t end) {
    if (too_deep > 0) return;  // inside refused loops: their body is not read
    StatementLine st;
    st.line = line;
    st.mnemonic = {p, q};
    st.operands = operands(s, q, end);
    std::size_t a = q, b = end;
    while (a < b && text::is_space(s[a])) ++a;
    while (b > a && text::is_space(s[b - 1])) --b;
    st.rest = {a, b};
    if (!parse_statement(st, scope)) return;
    LoopItem item;
    item.line = line;
    item.col = p;
    item.index = program.statements++;
    program.items.push_back(item);
  }

  void read_line(int line, const std::string& s) {
    const std::size_t end = text::comment_start(s);
    std::size_t p = 0;
    skip_space(s, p, end);
    if (p == end) return;
    // Optional step number (the lesson's Step column), optionally followed by '.', ':' or ')'.
    if (std::isdigit(static_cast<unsigned char>(s[p]))) {
      std::size_t q = p;
      while (q < end && std::isdigit(static_cast<unsigned char>(s[q]))) ++q;
      if (q < end && (s[q] == '.' || s[q] == ':' || s[q] == ')')) ++q;
      if (q < end && !text::is_space(s[q]) && !text::is_ident_start(s[q])) {
        src.error(line, p, q - p + 1, "unexpected '" + s.substr(p, q - p + 1) + "'", kLineUsage);
        return;
      }
      p = q;
      skip_space(s, p, end);
      if (p == end) return;  // a bare step number (the lesson's blank template rows)
    }
    if (!text::is_ident_start(s[p])) {
      src.error(line, p, 1, "unexpected " + text::describe_char(s, p), kLineUsage);
      return;
    }
    std::size_t q = p;
    while (q < end && text::is_ident_char(s[q])) ++q;
    const std::string_view word = std::string_view(s).substr(p, q - p);
    if (text::iequals(word, "end")) return close_loop(line, s, p, q, end);
    if (text::iequals(word, "for")) return open_loop(line, s, p, end);
    statement(line, s, p, q, end);
  }
};

}  // namespace

LoopProgram parse_loops(Source& src, const IndexVars& scope, const StatementParser& parse_statement) {
  LoopParser p{src, scope, parse_statement, {}, {}, 0};
  const auto& lines = src.lines();
  // A carriage return left inside a line (CRLF endings are already stripped) means bare-CR line
  // endings: the whole file reads as one line, so name that instead of the noise it would cause.
  for (std::size_t li = 0; li < lines.size(); ++li) {
    const auto cr = lines[li].find('\r');
    if (cr == std::string::npos || cr + 1 == lines[li].size()) continue;
    src.error(static_cast<int>(li + 1), cr, 1, "a carriage return (U+000D) inside a line: the file has bare-CR line endings",
              "save it with \\n line endings, e.g. tr '\\r' '\\n' < old.trace > new.trace");
    return std::move(p.program);
  }
  for (std::size_t li = 0; li < lines.size(); ++li) p.read_line(static_cast<int>(li + 1), lines[li]);
  for (const OpenLoop& o : p.open) {
    const LoopItem& it = p.program.items[o.item];
    src.error(it.line, it.col, 3, "'for' without a matching 'end'", "close the loop with a line holding just: end");
  }
  return std::move(p.program);
}

// ---------------------------------------------------------------------------------------------
// Counting and expansion: one walk over the flat items with an explicit stack of open loops.

namespace {

struct Frame {
  std::size_t item = 0;               // the loop's index
  long long value = 0;                // the loop variable now
  unsigned long long remaining = 0;   // iterations left, this one included
};

// Iterations of `for v in lo..hi`; false when there are 2^64 of them.
bool trip_count(long long lo, long long hi, unsigned long long& trips) {
  if (hi < lo) return trips = 0, true;
  const unsigned long long span = static_cast<unsigned long long>(hi) - static_cast<unsigned long long>(lo);
  if (span == std::numeric_limits<unsigned long long>::max()) return false;
  trips = span + 1;
  return true;
}

struct Walker {
  Source& src;
  const LoopProgram& program;
  IndexVars vars;
  const StatementEmitter* emit = nullptr;  // null: count only
  std::size_t count = 0;                   // statements emitted (or counted)
  std::size_t iterations = 0;              // loop iterations walked one by one
  std::vector<Frame> stack;

  // The outermost open loop (or the item itself): where "too many" errors point.
  const LoopItem& outermost(std::size_t k) const {
    return program.items[stack.empty() ? k : stack.front().item];
  }
  bool refuse(std::size_t k, const std::string& what) {
    const LoopItem& at = outermost(k);
    src.error(at.line, at.col, 3, "the loops " + what,
              "check the loop bounds (write them in terms of n); a trace may expand to at most " +
                  std::to_string(kMaxInstructions) + " instructions");
    return false;
  }
  std::size_t scope_end() const { return stack.empty() ? program.items.size() : program.items[stack.back().item].body_end; }

  // Enters the loop at k (or skips it); returns false on error.
  bool enter(std::size_t& k) {
    const LoopItem& loop = program.items[k];
    const LoopHeader& header = program.headers[loop.index];
    long long lo = 0, hi = 0;
    if (!evaluate_index(src, header.lo, vars, lo) || !evaluate_index(src, header.hi, vars, hi)) return false;
    unsigned long long trips = 0;
    if (!trip_count(lo, hi, trips)) return refuse(k, "iterate 2^64 times");
    const std::size_t body = loop.body_end - k - 1;  // statements, when the loop is a leaf
    if (trips == 0 || (loop.leaf && body == 0)) {
      k = loop.body_end;
      return true;
    }
    if (loop.leaf && !emit) {  // closed form: no need to walk it
      unsigned long long total = 0;
      if (__builtin_mul_overflow(trips, static_cast<unsigned long long>(body), &total) ||
          __builtin_add_overflow(total, static_cast<unsigned long long>(count), &total) || total > kMaxInstructions)
        return refuse(k, "expand to more than " + std::to_string(kMaxInstructions) + " instructions");
      count = static_cast<std::size_t>(total);
      k = loop.body_end;
      return true;
    }
    if (!emit && ++iterations > kMaxInstructions)
      return refuse(k, "iterate more than " + std::to_string(kMaxInstructions) + " times");
    stack.push_back({k, lo, trips});
    vars.emplace_back(header.var, lo);
    ++k;
    return true;
  }

  // At the end of a body: next iteration, or leave the loop.
  bool next(std::size_t& k) {
    Frame& f = stack.back();
    if (--f.remaining > 0) {
      ++f.value;  // below hi, so no overflow
      vars.back().second = f.value;
      k = f.item + 1;
      if (!emit && ++iterations > kMaxInstructions)
        return refuse(k, "iterate more than " + std::to_string(kMaxInstructions) + " times");
      return true;
    }
    k = program.items[f.item].body_end;
    vars.pop_back();
    stack.pop_back();
    return true;
  }

  bool walk() {
    std::size_t k = 0;
    for (;;) {
      if (k >= scope_end()) {
        if (stack.empty()) return true;
        if (!next(k)) return false;
        continue;
      }
      const LoopItem& it = program.items[k];
      if (it.loop) {
        if (!enter(k)) return false;
        continue;
      }
      if (emit) {
        if (!(*emit)(it.index, vars)) return false;
      } else if (count >= kMaxInstructions) {
        return refuse(k, "expand to more than " + std::to_string(kMaxInstructions) + " instructions");
      }
      ++count;
      ++k;
    }
  }
};

}  // namespace

std::optional<std::size_t> count_expansion(Source& src, const LoopProgram& program, const IndexVars& vars) {
  Walker w{src, program, vars, nullptr, 0, 0, {}};
  if (!w.walk()) return std::nullopt;
  return w.count;
}

bool expand_loops(Source& src, const LoopProgram& program, const IndexVars& vars, const StatementEmitter& emit) {
  Walker w{src, program, vars, &emit, 0, 0, {}};
  return w.walk();
}

}  // namespace flashlab::toy
