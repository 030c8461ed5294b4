// The assembler: trace text → expanded instruction stream, collecting every error.
//
// It reads the toy-machine lesson's traces as printed ("Full trace for c00", "Full trace: outer
// product matmul", the softmax hints). Lines, step numbers, comments, loops and index
// expressions belong to the shared front end (frontend.cpp); this file knows the machine: its
// instructions, registers and DRAM arrays.
#include "flashlab/toymachine/assembler.hpp"

#include <algorithm>

#include "text.hpp"

namespace flashlab::toy {

namespace {

struct OperandTemplate {
  OperandKind kind = OperandKind::Register;
  int reg = -1;
  std::string name;
  int array = -1;
  std::vector<IndexExpr> index;
};

// One instruction as written; loop variables are bound at expansion.
struct Statement {
  Opcode op = Opcode::LOAD;
  std::string mnemonic;  // as written
  int line = 0;
  int col = 0;           // 1-based character column of the mnemonic
  std::vector<OperandTemplate> operands;
};

struct Assembler {
  const Machine& m;
  Source& src;
  std::vector<Statement> statements;

  void error(int line, std::size_t byte_col, std::size_t byte_len, std::string msg, std::string hint) {
    src.error(line, byte_col, byte_len, std::move(msg), std::move(hint));
  }

  static std::string operand_usage(const IsaEntry& e) {
    bool all_regs = std::all_of(e.pattern.begin(), e.pattern.end(), [](OperandKind k) { return k == OperandKind::Register; });
    std::string count = std::to_string(e.pattern.size());
    return e.mnemonic + " takes " + count + (all_regs ? " registers: " : " operands: ") + e.mnemonic + " " + e.operands;
  }

  bool parse_register(int line, const IsaEntry& e, std::size_t slot, const std::string& s, Span span,
                      std::size_t name_end, OperandTemplate& out) {
    const std::string word = s.substr(span.begin, span.end - span.begin);
    if (name_end != span.end) {
      error(line, span.begin, span.end - span.begin,
            e.mnemonic + " operand " + std::to_string(slot + 1) + " must be a register, not '" + word + "'",
            operand_usage(e) + "; only LOAD and STORE touch DRAM");
      return false;
    }
    out.reg = m.find_register(out.name);
    if (out.reg >= 0) return true;
    std::string hint = "machine " + m.name + " has " + m.register_list();
    if (m.find_array(out.name) >= 0) hint = "'" + out.name + "' is a DRAM array; " + operand_usage(e);
    error(line, span.begin, span.end - span.begin, "machine " + m.name + " has no register " + out.name, hint);
    return false;
  }

  // A DRAM operand: name, then [expr] per dimension, each expression checked against `scope`.
  bool parse_memory(int line, const IsaEntry& e, std::size_t slot, const std::string& s, Span span, std::size_t i,
                    const IndexVars& scope, OperandTemplate& out) {
    const std::size_t st = span.begin, en = span.end;
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
      const std::size_t close = s.find(']', i);
      if (close == std::string::npos || close >= en) {
        error(line, i, en - i, "unclosed '['", "DRAM operands are written a[0][1], x[i] or out[n-1]");
        return false;
      }
      IndexExpr t{s.substr(i + 1, close - i - 1), line, i + 1};
      if (t.text.find_first_not_of(" \t") == std::string::npos) {
        error(line, i, close - i + 1, "empty index", "write an index such as x[0], x[i] or x[n-1]");
        ok = false;
      } else {
        ok = check_index(src, t, scope) && ok;
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

  // One operand slot: a register or a DRAM element, as the instruction's pattern says.
  bool parse_operand(int line, const IsaEntry& e, std::size_t slot, const std::string& s, Span span,
                     const IndexVars& scope, OperandTemplate& out) {
    std::size_t i = span.begin;
    while (i < span.end && text::is_ident_char(s[i])) ++i;
    if (i == span.begin || !text::is_ident_start(s[span.begin])) {
      // Built by appending: GCC 12 warns falsely on "'" + substr (GCC bug 105329).
      std::string msg(1, '\'');
      msg += s.substr(span.begin, span.end - span.begin);
      msg += "' is not an operand";
      // A character that looks like a space or like nothing is named, or the message would read
      // "' R0' is not an operand" with no visible reason.
      for (std::size_t k = span.begin; k < span.end; ++k) {
        const auto c = static_cast<unsigned char>(s[k]);
        if ((c & 0xC0) == 0x80 || (c >= 0x21 && c < 0x7F)) continue;
        msg += ": it holds a ";
        msg += text::describe_char(s, k);
        break;
      }
      error(line, span.begin, span.end - span.begin, std::move(msg), operand_usage(e));
      return false;
    }
    out.name = s.substr(span.begin, i - span.begin);
    out.kind = e.pattern[slot];
    if (out.kind == OperandKind::Register) return parse_register(line, e, slot, s, span, i, out);
    return parse_memory(line, e, slot, s, span, i, scope, out);
  }

  // The front end's statement parser: one instruction line.
  bool parse_statement(const StatementLine& st, const IndexVars& scope) {
    const int line = st.line;
    const std::string& s = src.line(line);
    const std::size_t p = st.mnemonic.begin, q = st.mnemonic.end;
    const std::string mn = s.substr(p, q - p);
    const IsaEntry* e = find_instruction(mn);
    if (!e) {
      error(line, p, q - p, "unknown instruction '" + mn + "'", "machine " + m.name + " has " + m.isa_list());
      return false;
    }
    if (!m.allows(e->opcode)) {
      error(line, p, q - p, "machine " + m.name + " has no " + e->mnemonic, "its instructions are " + m.isa_list());
      return false;
    }
    if (st.operands.size() != e->pattern.size()) {
      error(line, p, (st.operands.empty() ? q : st.operands.back().end) - p,
            e->mnemonic + " takes " + std::to_string(e->pattern.size()) + " operands, got " + std::to_string(st.operands.size()),
            operand_usage(*e));
      return false;
    }
    Statement n;
    n.op = e->opcode;
    n.mnemonic = mn;
    n.line = line;
    n.col = src.column(line, p);
    bool ok = true;
    for (std::size_t k = 0; k < st.operands.size(); ++k) {
      const Span span = st.operands[k];
      if (span.empty()) {
        error(line, span.begin, 1, "missing operand " + std::to_string(k + 1), operand_usage(*e));
        ok = false;
        continue;
      }
      OperandTemplate t;
      ok = parse_operand(line, *e, k, s, span, scope, t) && ok;
      n.operands.push_back(std::move(t));
    }
    if (ok) statements.push_back(std::move(n));
    return ok;
  }

  // The front end's emitter: one executed instruction, loop values substituted.
  bool emit(std::size_t statement, const IndexVars& vars, std::vector<Instruction>& code) {
    const Statement& n = statements[statement];
    Instruction ins;
    ins.op = n.op;
    ins.source_line = n.line;
    ins.source_col = n.col;
    ins.text = n.mnemonic;
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
        long long v = 0;
        if (!evaluate_index(src, ix, vars, v)) return false;
        o.index.push_back(v);
        ins.text += text::bracket(v);
      }
      ins.operands.push_back(std::move(o));
    }
    code.push_back(std::move(ins));
    return true;
  }
};

}  // namespace

AssembleResult assemble(std::string_view textv, const Machine& machine, std::string_view filename) {
  Source src(textv, std::string(filename));
  Assembler a{machine, src, {}};
  const IndexVars outer{{"n", machine.n}};
  const LoopProgram loops = parse_loops(
      src, outer, [&](const StatementLine& st, const IndexVars& scope) { return a.parse_statement(st, scope); });
  AssembleResult r;
  r.program.file = src.file();
  if (src.ok()) {
    if (const auto count = count_expansion(src, loops, outer)) {
      r.program.code.reserve(*count);
      expand_loops(src, loops, outer,
                   [&](std::size_t st, const IndexVars& vars) { return a.emit(st, vars, r.program.code); });
    }
  }
  r.diagnostics = src.diagnostics();
  r.program.source_lines = src.release_lines();  // last: diagnostics echo the lines
  if (!r.ok()) r.program.code.clear();
  return r;
}

}  // namespace flashlab::toy
