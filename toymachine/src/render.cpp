// The lesson's step table (the toy-machine lesson, "Full trace for c00": Step | Instruction | R0 | R1 | R2, each
// cell the symbolic contents after the step) and the counters block. Pure functions of states,
// so the stepper and `flashlab run --table` print the same thing.
#include "flashlab/toymachine/render.hpp"

#include <algorithm>

namespace flashlab::toy {

std::size_t display_width(const std::string& s) {
  std::size_t n = 0;
  for (unsigned char c : s)
    if ((c & 0xC0) != 0x80) ++n;
  return n;
}

namespace {

// Cuts to `max` characters (not bytes), ending in "…".
std::string cut(const std::string& s, std::size_t max) {
  if (max == 0 || display_width(s) <= max) return s;
  std::size_t chars = 0, i = 0;
  for (; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) {
      if (chars == max - 1) break;
      ++chars;
    }
  }
  return s.substr(0, i) + "\u2026";
}

std::string pad(const std::string& s, std::size_t w, bool right = false) {
  std::size_t d = display_width(s);
  std::string fill(w > d ? w - d : 0, ' ');
  return right ? fill + s : s + fill;
}

bool same(const std::optional<Value>& a, const std::optional<Value>& b) {
  if (!a || !b) return !a && !b;
  if (a->sym || b->sym) return a->sym == b->sym || (a->sym && b->sym && equivalent(*a->sym, *b->sym));
  return a->num == b->num;
}

}  // namespace

std::string render_cell(const std::optional<Value>& v, const Machine& machine, const RenderOptions& opt) {
  if (!v) return "";
  if (opt.numeric || !v->sym) return cut(format_number(v->num), opt.max_cell);
  return cut(to_string(*v->sym, &machine.names), opt.max_cell);
}

std::vector<std::string> render_row(const Program& program, const Machine& machine, const State& before,
                                    const State& after, const RenderOptions& opt) {
  std::vector<std::string> row;
  row.push_back(std::to_string(after.pc));
  row.push_back(before.pc < program.code.size() ? program.code[before.pc].text : "");
  for (std::size_t r = 0; r < after.registers.size(); ++r) {
    // The lesson marks an unchanged register with " (Problem 3's tables); optional here.
    if (opt.ditto && after.registers[r] && same(before.registers[r], after.registers[r])) row.emplace_back("\"");
    else row.push_back(render_cell(after.registers[r], machine, opt));
  }
  return row;
}

std::string render_table(const Program& program, const Machine& machine, const std::vector<State>& states,
                         const RenderOptions& opt) {
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> header = {"Step", "Instruction"};
  for (const auto& r : machine.registers) header.push_back(r);
  rows.push_back(header);
  for (std::size_t k = 1; k < states.size(); ++k) rows.push_back(render_row(program, machine, states[k - 1], states[k], opt));
  std::vector<std::size_t> w(header.size(), 0);
  for (const auto& row : rows)
    for (std::size_t c = 0; c < row.size() && c < w.size(); ++c) w[c] = std::max(w[c], display_width(row[c]));
  std::string out;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    std::string line;
    for (std::size_t c = 0; c < w.size(); ++c) {
      const std::string cell = c < rows[i].size() ? rows[i][c] : "";
      if (c) line += " | ";
      line += pad(cell, w[c], c == 0 && i > 0);
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
    if (i == 0) {
      std::string rule;
      for (std::size_t c = 0; c < w.size(); ++c) rule += (c ? "-+-" : "") + std::string(w[c], '-');
      out += rule + "\n";
    }
  }
  return out;
}

std::string render_counters(const Machine& machine, const Counters& c) {
  std::string ins;
  for (const auto& e : isa()) {
    auto k = c.instructions[static_cast<std::size_t>(e.opcode)];
    if (k) ins += (ins.empty() ? "" : ", ") + e.mnemonic + " " + std::to_string(k);
  }
  auto per_array = [&machine](const std::vector<std::uint64_t>& v) {
    std::string s;
    for (std::size_t i = 0; i < v.size() && i < machine.arrays.size(); ++i)
      if (v[i]) s += (s.empty() ? "" : ", ") + machine.arrays[i].name + " " + std::to_string(v[i]);
    return s.empty() ? s : " (" + s + ")";
  };
  std::string out;
  out += "cycles        " + std::to_string(c.cycles) + "\n";
  out += "instructions  " + std::to_string(c.total_instructions()) + (ins.empty() ? "" : " (" + ins + ")") + "\n";
  out += "DRAM reads    " + std::to_string(c.dram_reads) + per_array(c.array_reads) + "\n";
  out += "DRAM writes   " + std::to_string(c.dram_writes) + per_array(c.array_writes) + "\n";
  return out;
}

}  // namespace flashlab::toy
