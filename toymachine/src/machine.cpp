// Machine profiles (the toy-machine lesson): the 3-register matmul machine of "The Toy Model", the 6-register
// one of "Enlarging the Register File", the 3-register softmax machine of "Softmax" and the
// 4-register one of "One More Register"; plus the parser for user machine files.
#include "flashlab/toymachine/machine.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <unordered_set>

#include "flashlab/toymachine/assembler.hpp"
#include "text.hpp"

namespace flashlab::toy {

std::size_t ArrayDecl::size() const {
  std::size_t s = 1;
  for (auto d : dims) s *= d;
  return s;
}

std::string ArrayDecl::shape() const {
  std::string s = name;
  for (auto d : dims) s += text::bracket(static_cast<long long>(d));
  return s;
}

std::string ArrayDecl::element_name(std::size_t flat) const {
  if (dims.empty()) return name;
  if (dims.size() == 1) return name + std::to_string(flat);
  std::size_t r = flat / dims[1], c = flat % dims[1];
  // a01 like the toy-machine lesson; with a dimension over 10 the digits would be ambiguous, so a1,12.
  if (dims[0] <= 10 && dims[1] <= 10) return name + std::to_string(r) + std::to_string(c);
  return name + std::to_string(r) + "," + std::to_string(c);
}

std::string ArrayDecl::element_operand(std::size_t flat) const {
  if (dims.empty()) return name;
  if (dims.size() == 1) return name + "[" + std::to_string(flat) + "]";
  return name + "[" + std::to_string(flat / dims[1]) + "][" + std::to_string(flat % dims[1]) + "]";
}

int Machine::find_register(std::string_view reg) const {
  for (std::size_t i = 0; i < registers.size(); ++i)
    if (text::iequals(registers[i], reg)) return static_cast<int>(i);
  return -1;
}

int Machine::find_array(std::string_view array) const {
  for (std::size_t i = 0; i < arrays.size(); ++i)
    if (arrays[i].name == array) return static_cast<int>(i);
  return -1;
}

bool Machine::allows(Opcode op) const { return std::find(opcodes.begin(), opcodes.end(), op) != opcodes.end(); }

std::string Machine::register_list() const {
  // "R0..R2" when the names are R0, R1, … in order (the lesson's matmul machines).
  bool numbered = registers.size() > 2;
  for (std::size_t i = 0; i < registers.size() && numbered; ++i)
    numbered = registers[i] == text::join("R", static_cast<long long>(i));
  if (numbered) return registers.front() + ".." + registers.back();
  std::string s;
  for (std::size_t i = 0; i < registers.size(); ++i) s += (i ? ", " : "") + registers[i];
  return s;
}

std::string Machine::isa_list() const {
  std::string s;
  for (std::size_t i = 0; i < opcodes.size(); ++i) s += (i ? " " : "") + mnemonic(opcodes[i]);
  return s;
}

std::string Machine::array_list() const {
  std::string s;
  for (std::size_t i = 0; i < arrays.size(); ++i) {
    const auto& a = arrays[i];
    const char* role = a.role == ArrayRole::Input ? "input" : a.role == ArrayRole::Output ? "output" : "constant";
    s += (i ? ", " : "") + a.shape() + " (" + role + ")";
  }
  return s;
}

namespace {

void set_default_cycles(Machine& m) {
  for (const auto& e : isa()) m.cycles[static_cast<std::size_t>(e.opcode)] = e.default_cycles;
}

ArrayDecl array(std::string name, std::vector<std::size_t> dims, ArrayRole role) {
  ArrayDecl a;
  a.name = std::move(name);
  a.dims = std::move(dims);
  a.role = role;
  return a;
}

ExprPtr input_expr(const ArrayDecl& a, std::size_t flat) { return make_input(a.name, flat, a.element_name(flat)); }

Machine matmul(std::string name, int regs, int n) {
  Machine m;
  m.name = std::move(name);
  m.description = regs == 3 ? "Problems 1-2: the smallest matmul machine, C = A x B with 2x2 matrices"
                            : "Problem 3: the register file doubled, for the outer-product order";
  for (int i = 0; i < regs; ++i) m.registers.push_back("R" + std::to_string(i));
  m.opcodes = {Opcode::LOAD, Opcode::STORE, Opcode::MAC_Z, Opcode::MAC};
  set_default_cycles(m);
  m.arrays = {array("a", {2, 2}, ArrayRole::Input), array("b", {2, 2}, ArrayRole::Input),
              array("c", {2, 2}, ArrayRole::Output)};
  m.n = n;
  // c_ij = a_i0·b_0j + a_i1·b_1j, so a register holding it prints as c00 (the toy-machine lesson, step 6 of Problem 1).
  for (std::size_t i = 0; i < 2; ++i)
    for (std::size_t j = 0; j < 2; ++j) {
      ExprPtr acc;
      for (std::size_t k = 0; k < 2; ++k) {
        ExprPtr t = make_mul(input_expr(m.arrays[0], i * 2 + k), input_expr(m.arrays[1], k * 2 + j));
        acc = acc ? make_add(acc, t) : t;
      }
      m.names.add(m.arrays[2].element_name(i * 2 + j), acc);
    }
  return m;
}

Machine softmax(std::string name, int regs, int n) {
  Machine m;
  m.name = std::move(name);
  m.description = regs == 3 ? "Problem 4: safe softmax in three passes, out = softmax(x)"
                            : "Problem 5: one more register, online softmax in two passes";
  m.registers = {"R0", "r1", "r2"};  // the lesson's own spelling
  if (regs == 4) m.registers.push_back("r3");
  m.opcodes = {Opcode::LOAD, Opcode::STORE, Opcode::MAX, Opcode::SUB, Opcode::EXP,
               Opcode::ADD,  Opcode::MUL,   Opcode::DIV, Opcode::MOV};
  set_default_cycles(m);
  const auto un = static_cast<std::size_t>(n);
  m.arrays = {array("x", {un}, ArrayRole::Input), array("out", {un}, ArrayRole::Output)};
  m.n = n;
  // m = max_j xj and S = Σ_j e^(xj − m), the names the lesson's Problem 4 tables use.
  // Only where a symbolic run can use them: beyond 4096 elements the CLI runs numeric-only anyway,
  // and the two definitions would cost memory per element.
  if (un > 4096) return m;
  std::vector<ExprPtr> xs, terms;
  for (std::size_t j = 0; j < un; ++j) xs.push_back(input_expr(m.arrays[0], j));
  const ExprPtr mx = make_max_of(xs);
  for (std::size_t j = 0; j < un; ++j) terms.push_back(make_exp(make_sub(xs[j], mx)));
  const ExprPtr s = make_sum_of(terms);
  m.names.add("m", mx);
  m.names.add("S", s);
  return m;
}

void check_n(int n) {
  if (n < 1 || n > kMaxN)
    throw MachineError("n = " + std::to_string(n) + " is out of range",
                       "n is the length of x and out; give 1.." + std::to_string(kMaxN));
}

}  // namespace

std::vector<std::string> builtin_machine_names() { return {"matmul3", "matmul6", "softmax3", "softmax4"}; }

Machine builtin_machine(std::string_view name, int n) {
  check_n(n);
  if (name == "matmul3") return matmul("matmul3", 3, n);
  if (name == "matmul6") return matmul("matmul6", 6, n);
  if (name == "softmax3") return softmax("softmax3", 3, n);
  if (name == "softmax4") return softmax("softmax4", 4, n);
  std::string list;
  for (const auto& b : builtin_machine_names()) list += (list.empty() ? "" : ", ") + b;
  throw MachineError("unknown machine '" + std::string(name) + "'",
                     "the built-in machines are " + list + " (flashlab machines lists them)");
}

// ---------------------------------------------------------------------------------------------
// Machine files (docs/toymachine.md, "Machine files"): one directive per line, `#` comments.

namespace {

struct FileParser {
  std::string file;
  std::vector<std::string> lines;
  int n;
  Machine m;
  std::unordered_set<std::string> declared_registers;  // upper-cased: names are case-insensitive
  bool have_isa = false;

  [[noreturn]] void fail(int line, std::size_t byte_col, std::size_t byte_len, const std::string& msg,
                         const std::string& hint) {
    Diagnostic d;
    d.file = file;
    d.line = line;
    const std::string& src = lines[static_cast<std::size_t>(line - 1)];
    d.col = text::chars_before(src, byte_col) + 1;
    d.length = std::max(1, text::chars_before(src.substr(std::min(byte_col, src.size())), byte_len));
    d.message = msg;
    d.hint = hint;
    d.source_line = src;
    throw MachineError(d);
  }

  // Words of a line (split on spaces and commas), with byte offsets.
  static std::vector<std::pair<std::string, std::size_t>> words(const std::string& s, std::size_t from,
                                                               std::size_t to) {
    std::vector<std::pair<std::string, std::size_t>> out;
    std::size_t i = from;
    while (i < to) {
      while (i < to && (text::is_space(s[i]) || s[i] == ',')) ++i;
      std::size_t st = i;
      while (i < to && !text::is_space(s[i]) && s[i] != ',') ++i;
      if (i > st) out.emplace_back(s.substr(st, i - st), st);
    }
    return out;
  }

  long long eval(int line, const std::string& expr, std::size_t at) {
    long long v = 0;
    std::string err;
    std::size_t col = 0;
    if (!eval_index_expression(expr, {{"n", n}}, v, err, col))
      fail(line, at + col, 1, err, "sizes are integer expressions in n, e.g. n, 2, n+1, 2*n");
    return v;
  }

  void parse_array(int line, ArrayRole role, const std::string& s, std::size_t from, std::size_t to) {
    std::size_t i = from;
    while (i < to && text::is_space(s[i])) ++i;
    std::size_t st = i;
    while (i < to && text::is_ident_char(s[i])) ++i;
    if (i == st || !text::is_ident_start(s[st]))
      fail(line, st, 1, "expected an array name", "e.g. input x[n], output c[2][2], constant one = 1");
    ArrayDecl a;
    a.name = s.substr(st, i - st);
    a.role = role;
    if (m.arrays.size() >= kMaxArrays)
      fail(line, st, a.name.size(), "more than " + std::to_string(kMaxArrays) + " arrays",
           "a machine may declare at most " + std::to_string(kMaxArrays) + " DRAM arrays");
    if (m.find_array(a.name) >= 0)
      fail(line, st, a.name.size(), "array '" + a.name + "' is declared twice", "give each DRAM array its own name");
    while (i < to && s[i] == '[') {
      std::size_t close = s.find(']', i);
      if (close == std::string::npos || close > to) fail(line, i, 1, "unclosed '['", "write dimensions as [n] or [2][2]");
      long long d = eval(line, s.substr(i + 1, close - i - 1), i + 1);
      if (d < 1 || d > kMaxN)
        fail(line, i + 1, close - i - 1, "dimension " + std::to_string(d) + " is out of range",
             "each dimension must be 1.." + std::to_string(kMaxN) + " (with n = " + std::to_string(n) + ")");
      a.dims.push_back(static_cast<std::size_t>(d));
      i = close + 1;
    }
    if (a.dims.size() > 2) fail(line, st, i - st, "arrays have at most 2 dimensions", "e.g. a[2][2] or x[n]");
    if (a.size() > static_cast<std::size_t>(kMaxN))
      fail(line, st, i - st, "array '" + a.name + "' has " + std::to_string(a.size()) + " elements",
           "at most " + std::to_string(kMaxN) + " elements per array");
    while (i < to && text::is_space(s[i])) ++i;
    if (role == ArrayRole::Constant) {
      if (i >= to || s[i] != '=')
        fail(line, i, 1, "a constant needs values", "e.g. constant one = 1, or constant w[3] = 0.5, 0.25, 0.25");
      auto vals = words(s, i + 1, to);
      for (const auto& [w, at] : vals) {
        char* endp = nullptr;
        double v = std::strtod(w.c_str(), &endp);
        if (endp != w.c_str() + w.size() || !std::isfinite(v))
          fail(line, at, w.size(), "'" + w + "' is not a number", "constant values are decimal numbers, e.g. 1, -0.5, 2e-3");
        a.values.push_back(v);
      }
      std::size_t vs = i + 1;
      while (vs < to && text::is_space(s[vs])) ++vs;
      if (a.values.size() != a.size())
        fail(line, vs, to - vs,
             a.shape() + " needs " + std::to_string(a.size()) + " values, got " + std::to_string(a.values.size()),
             "list the values row-major, separated by commas");
    } else if (i < to) {
      fail(line, i, to - i, "unexpected text after the array", "one array per line, e.g. input x[n]");
    }
    m.arrays.push_back(std::move(a));
  }

  Machine parse() {
    m.n = n;
    set_default_cycles(m);
    for (std::size_t li = 0; li < lines.size(); ++li) {
      const int line = static_cast<int>(li + 1);
      const std::string& s = lines[li];
      const std::size_t end = text::comment_start(s);
      auto ws = words(s, 0, end);
      if (ws.empty()) continue;
      const auto& [kw, kat] = ws[0];
      if (kw == "machine") {
        if (ws.size() != 2) fail(line, kat, kw.size(), "'machine' takes one name", "e.g. machine mysoftmax");
        m.name = ws[1].first;
      } else if (kw == "description") {
        std::size_t st = kat + kw.size();
        std::string d = s.substr(st, end - st);
        d.erase(0, d.find_first_not_of(" \t"));
        d.erase(d.find_last_not_of(" \t") + 1);
        if (d.size() >= 2 && d.front() == '"' && d.back() == '"') d = d.substr(1, d.size() - 2);
        m.description = d;
      } else if (kw == "registers") {
        if (ws.size() < 2) fail(line, kat, kw.size(), "'registers' needs at least one name", "e.g. registers R0 r1 r2");
        for (std::size_t k = 1; k < ws.size(); ++k) {
          const auto& [r, at] = ws[k];
          bool ok = text::is_ident_start(r[0]) && std::all_of(r.begin(), r.end(), text::is_ident_char);
          if (!ok) fail(line, at, r.size(), "'" + r + "' is not a register name", "register names are letters, digits and _, e.g. R0");
          if (m.registers.size() >= kMaxRegisters)
            fail(line, at, r.size(), "more than " + std::to_string(kMaxRegisters) + " registers",
                 "a machine may declare at most " + std::to_string(kMaxRegisters) + " registers");
          if (!declared_registers.insert(text::upper(r)).second)
            fail(line, at, r.size(), "register " + r + " is declared twice", "register names are case-insensitive: R1 and r1 are the same");
          m.registers.push_back(r);
        }
      } else if (kw == "isa") {
        for (std::size_t k = 1; k < ws.size(); ++k) {
          const auto& [w, at] = ws[k];
          const IsaEntry* e = find_instruction(w);
          if (!e) fail(line, at, w.size(), "unknown instruction '" + w + "'", "the instructions are " + all_mnemonics());
          if (!m.allows(e->opcode)) m.opcodes.push_back(e->opcode);
        }
        std::sort(m.opcodes.begin(), m.opcodes.end());
        have_isa = true;
      } else if (kw == "cycles") {
        if (ws.size() != 3) fail(line, kat, kw.size(), "'cycles' takes an instruction and a count", "e.g. cycles EXP 4");
        const IsaEntry* e = find_instruction(ws[1].first);
        if (!e) fail(line, ws[1].second, ws[1].first.size(), "unknown instruction '" + ws[1].first + "'",
                     "the instructions are " + all_mnemonics());
        char* endp = nullptr;
        long c = std::strtol(ws[2].first.c_str(), &endp, 10);
        if (endp != ws[2].first.c_str() + ws[2].first.size() || c < 1 || c > 1000000)
          fail(line, ws[2].second, ws[2].first.size(), "'" + ws[2].first + "' is not a cycle count",
               "a whole number from 1 to 1000000");
        m.cycles[static_cast<std::size_t>(e->opcode)] = static_cast<int>(c);
      } else if (kw == "input" || kw == "output" || kw == "constant") {
        ArrayRole role = kw == "input" ? ArrayRole::Input : kw == "output" ? ArrayRole::Output : ArrayRole::Constant;
        parse_array(line, role, s, kat + kw.size(), end);
      } else {
        fail(line, kat, kw.size(), "unknown directive '" + kw + "'",
             "machine files use: machine, description, registers, isa, cycles, input, output, constant");
      }
    }
    int last = static_cast<int>(lines.size());
    if (lines.empty()) lines.emplace_back(), last = 1;
    if (m.registers.empty()) fail(last, 0, 1, "the machine declares no registers", "add a line such as: registers R0 r1 r2");
    if (!have_isa || m.opcodes.empty()) fail(last, 0, 1, "the machine declares no instructions", "add a line such as: isa LOAD STORE MAX SUB EXP ADD MUL DIV MOV");
    if (m.name.empty()) m.name = "custom";
    return m;
  }

  static std::string all_mnemonics() {
    std::string s;
    for (const auto& e : isa()) s += (s.empty() ? "" : " ") + e.mnemonic;
    return s;
  }
};

}  // namespace

Machine parse_machine_file(std::string_view textv, std::string_view filename, int n) {
  check_n(n);
  FileParser p{std::string(filename), text::split_lines(textv), n, {}, {}};
  return p.parse();
}

}  // namespace flashlab::toy
