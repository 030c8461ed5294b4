// The stepper's frame renderer (the house style: "Rendering is a pure function
// render(now, previous) -> text, tested against golden files"). Everything the screen shows is
// computed here from two states; app/toymachine/cmd_step.cpp only reads keys, keeps the timeline and
// prints what this returns. Markers stay in the text (`>` next instruction, `*` changed
// register, `[…]R` / `[…]W` last DRAM access) so that golden tests see them without colour.
#include "flashlab/lessons/stepper.hpp"

#include "expr_size.hpp"

#include <algorithm>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "flashlab/toymachine/render.hpp"
#include "flashlab/toymachine/value.hpp"

namespace flashlab::lessons {

namespace {

// Byte offset of code point `cp` in UTF-8 `s` (s.size() when beyond the end).
std::size_t byte_of(const std::string& s, std::size_t cp) {
  std::size_t i = 0, n = 0;
  while (i < s.size() && n < cp) {
    const auto c = static_cast<unsigned char>(s[i]);
    i += c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    ++n;
  }
  return std::min(i, s.size());
}

std::string repeat(const std::string& s, std::size_t n) {
  std::string out;
  for (std::size_t i = 0; i < n; ++i) out += s;
  return out;
}

std::string right(const std::string& s, std::size_t w) {
  const std::size_t d = toy::display_width(s);
  return d >= w ? s : std::string(w - d, ' ') + s;
}

bool same_value(const std::optional<toy::Value>& a, const std::optional<toy::Value>& b) {
  if (a.has_value() != b.has_value()) return false;
  if (!a) return true;
  if (a->sym && b->sym) return a->sym == b->sym || toy::equivalent(*a->sym, *b->sym);
  return a->num == b->num;
}

std::string cell(const std::optional<toy::Value>& v, const toy::Machine& m, bool numeric, std::size_t max) {
  toy::RenderOptions ro;
  // An expression too large to print (a register squared many times) shows as its number.
  ro.numeric = numeric || (v && v->sym && !detail::printable(*v->sym));
  ro.max_cell = max;
  return toy::render_cell(v, m, ro);
}

// The listing: a window of the expanded instruction stream around the next instruction.
std::vector<std::string> listing(const toy::Program& p, std::size_t pc, std::size_t rows, std::size_t width) {
  std::vector<std::string> out;
  out.push_back(fit("Trace (" + std::to_string(p.code.size()) + " steps)", width));
  const std::size_t avail = rows > 1 ? rows - 1 : 0;
  const std::size_t total = p.code.size();
  std::size_t first = 0;
  if (total > avail) {
    // Keep the next instruction in the upper third so the coming ones are visible.
    const std::size_t lead = avail / 3;
    first = pc > lead ? pc - lead : 0;
    first = std::min(first, total - avail);
  }
  const std::size_t digits = std::to_string(std::max<std::size_t>(total, 1)).size();
  for (std::size_t r = 0; r < avail; ++r) {
    const std::size_t i = first + r;
    if (i >= total) {
      out.push_back(fit(i == total && pc == total ? "> (end)" : "", width));
      continue;
    }
    const std::string mark = i == pc ? "> " : "  ";
    out.push_back(fit(mark + right(std::to_string(i + 1), digits) + "  " + p.code[i].text, width));
  }
  return out;
}

std::vector<std::string> registers(const toy::Machine& m, const toy::State& now, const toy::State* prev, bool numeric,
                                   std::size_t rows, std::size_t width) {
  std::vector<std::string> out;
  out.push_back(fit(numeric ? "Registers (numeric)" : "Registers (symbolic, numeric)", width));
  std::size_t name_w = 0;
  for (const auto& r : m.registers) name_w = std::max(name_w, toy::display_width(r));
  const std::size_t num_w = 10;
  for (std::size_t i = 0; i < m.registers.size() && out.size() < rows; ++i) {
    const auto& v = now.registers[i];
    const bool changed = prev && !same_value(prev->registers[i], v);
    // Built with += (GCC 12 warns falsely on chained temporaries here, PR105329).
    std::string line(changed ? "*" : " ");
    line += fit(m.registers[i], name_w);
    line += "  ";
    const std::size_t rest = width > toy::display_width(line) ? width - toy::display_width(line) : 0;
    if (!v) {
      line += "-";
    } else if (numeric || rest < num_w + 6) {
      line += cell(v, m, true, rest);
    } else {
      const std::size_t sym_w = rest - num_w - 1;
      line += fit(cell(v, m, false, sym_w), sym_w) + " " + right(toy::format_number(v->num), num_w);
    }
    out.push_back(fit(line, width));
  }
  if (out.size() < m.registers.size() + 1 && !out.empty()) out.back() = fit("  … (taller terminal shows all)", width);
  return out;
}

std::vector<std::string> dram(const toy::Machine& m, const toy::State& now, bool numeric, std::size_t width) {
  std::vector<std::string> out;
  std::size_t name_w = 0;
  for (const auto& a : m.arrays) name_w = std::max(name_w, toy::display_width(a.name));
  for (std::size_t ai = 0; ai < m.arrays.size(); ++ai) {
    const auto& a = m.arrays[ai];
    std::string line(" ");
    line += fit(a.name, name_w);
    line += " ";
    const auto& reads = now.counters.element_reads.size() > ai ? now.counters.element_reads[ai]
                                                               : std::vector<std::uint32_t>{};
    for (std::size_t e = 0; e < now.dram[ai].size(); ++e) {
      std::string c = now.dram[ai][e] ? cell(now.dram[ai][e], m, numeric, 9) : "·";
      if (e < reads.size() && reads[e] > 0) {
        c += "(";
        c += std::to_string(reads[e]);
        c += ")";
      }
      const bool last = now.last_access && now.last_access->array == static_cast<int>(ai) &&
                        now.last_access->element == e;
      if (last) {
        line += "[";
        line += c;
        line += now.last_access->kind == toy::AccessKind::Read ? "]R" : "]W";
      } else {
        line += " ";
        line += c;
        line += "  ";
      }
      if (toy::display_width(line) > width) break;
    }
    out.push_back(fit(line, width));
  }
  return out;
}

std::string counters(const toy::Machine& m, const toy::Counters& c) {
  auto count = [&](toy::Opcode op) { return c.instructions[static_cast<std::size_t>(op)]; };
  std::ostringstream os;
  os << "cycle " << c.cycles << " | LOADs " << count(toy::Opcode::LOAD) << " | STOREs " << count(toy::Opcode::STORE);
  if (m.allows(toy::Opcode::MAC) || m.allows(toy::Opcode::MAC_Z))
    os << " | MACs " << count(toy::Opcode::MAC) + count(toy::Opcode::MAC_Z);
  std::uint64_t alu = 0;
  for (auto op : {toy::Opcode::MAX, toy::Opcode::SUB, toy::Opcode::EXP, toy::Opcode::ADD, toy::Opcode::MUL,
                  toy::Opcode::DIV, toy::Opcode::MOV})
    alu += count(op);
  if (alu > 0 || m.allows(toy::Opcode::EXP)) os << " | ALU " << alu;
  os << " | DRAM reads " << c.dram_reads << ", writes " << c.dram_writes;
  return os.str();
}

}  // namespace

std::string fit(const std::string& s, std::size_t width) {
  const std::size_t w = toy::display_width(s);
  if (w == width) return s;
  if (w < width) return s + std::string(width - w, ' ');
  if (width == 0) return "";
  return s.substr(0, byte_of(s, width - 1)) + "…";
}

bool states_printable(const std::vector<toy::State>& states) {
  std::unordered_map<const toy::Expr*, std::size_t> memo;  // shared across states: trees are shared
  for (const auto& st : states) {
    for (const auto& r : st.registers) {
      if (r && r->sym && detail::expanded_size(*r->sym, 401, memo) > 400) return false;
    }
  }
  return true;
}

std::size_t listing_width(int width) {
  const std::size_t w = static_cast<std::size_t>(std::max(width, 40));
  return std::min<std::size_t>(w * 9 / 20, 40);
}

const std::string& stepper_keys_help() {
  static const std::string text =
      "Keys\n"
      "  n, space, →, j    next: execute one instruction\n"
      "  b, ←, k           back: undo one instruction (a true reverse step)\n"
      "  e, G              run to the end (or to the fault)\n"
      "  g                 go to a step: type its number, or :L for source line L; Enter\n"
      "  r                 restart from step 0\n"
      "  s                 toggle symbolic / numeric values\n"
      "  ?                 this help (any key returns)\n"
      "  q, Esc            quit\n"
      "Markers: > next instruction   * register changed by the last step\n"
      "         x(2) element read twice   [..]R / [..]W the last DRAM read / write\n";
  return text;
}

std::string render_frame(const FrameContext& ctx, const toy::State& now, const toy::State* previous,
                         const FrameOptions& opt) {
  const std::size_t W = static_cast<std::size_t>(std::max(opt.width, 40));
  const std::size_t H = static_cast<std::size_t>(std::max(opt.height, 12));
  const toy::Program& p = *ctx.program;
  const toy::Machine& m = *ctx.machine;
  std::vector<std::string> lines;

  // Title.
  const std::string where = "step " + std::to_string(now.pc) + "/" + std::to_string(p.code.size()) + "  " +
                            (opt.numeric ? "numeric" : "symbolic");
  const std::string title = "flashlab step: " + opt.title;
  const std::size_t tw = toy::display_width(where);
  lines.push_back(fit(title, W > tw + 1 ? W - tw - 1 : 0) + " " + where);
  lines.push_back(repeat("─", W));

  const auto dram_lines = dram(m, now, opt.numeric, W);
  const std::size_t fixed = 2 /*title, rule*/ + 1 /*dram rule*/ + dram_lines.size() + 3 /*counters, status, keys*/;
  const std::size_t mid = H > fixed ? H - fixed : 1;

  if (opt.help) {
    std::istringstream is(stepper_keys_help());
    std::string l;
    std::vector<std::string> help;
    while (std::getline(is, l)) help.push_back(l);
    const std::size_t rows = mid + 1 + dram_lines.size();
    for (std::size_t r = 0; r < rows; ++r) lines.push_back(fit(r < help.size() ? help[r] : "", W));
  } else {
    const std::size_t left_w = listing_width(static_cast<int>(W));
    const std::size_t right_w = W - left_w - 3;
    const auto left = listing(p, now.pc, mid, left_w);
    const auto reg = registers(m, now, previous, opt.numeric, mid, right_w);
    for (std::size_t r = 0; r < mid; ++r) {
      lines.push_back(fit(r < left.size() ? left[r] : "", left_w) + " │ " + fit(r < reg.size() ? reg[r] : "", right_w));
    }
    const std::string label = "── DRAM: x(k) read k times, [..]R last read, [..]W last write ";
    const std::size_t lw = toy::display_width(label);
    lines.push_back(lw >= W ? fit(label, W) : label + repeat("─", W - lw));
    for (const auto& d : dram_lines) lines.push_back(d);
  }

  lines.push_back(fit(counters(m, now.counters), W));
  std::string status;
  if (ctx.fault) {
    status = "FAULT at step " + std::to_string(ctx.fault->step) + " (line " + std::to_string(ctx.fault->source_line) +
             "): " + ctx.fault->message;
  } else if (!opt.status.empty()) {
    status = opt.status;
  } else if (now.pc >= p.code.size()) {
    status = "end of trace: b steps back, r restarts, q quits";
  } else {
    status = "next: " + p.code[now.pc].text + "   (line " + std::to_string(p.code[now.pc].source_line) + ")";
  }
  lines.push_back(fit(status, W));
  lines.push_back(fit("n next  b back  e end  g goto  r restart  s sym/num  ? help  q quit", W));

  // Exactly H lines (the middle region absorbs rounding; trim or pad defensively).
  while (lines.size() < H) lines.insert(lines.end() - 3, std::string(W, ' '));
  while (lines.size() > H) lines.erase(lines.end() - 4);
  std::string out;
  for (const auto& l : lines) {
    std::string t = l;
    while (!t.empty() && t.back() == ' ') t.pop_back();  // no trailing blanks: stable golden files
    out += t + "\n";
  }
  return out;
}

}  // namespace flashlab::lessons
