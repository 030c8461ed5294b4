// The executor: one step function over an explicit State (the toy-machine lesson's machine: every LOAD and
// STORE moves one element between DRAM and the register file and costs its cycles).
//
// One semantic core, step_core<Symbolic>, serves both modes: the symbolic mode (values carry
// expressions, every state is kept for back-steps and the step table) and the numeric-only mode
// the benchmark measures (no expressions, no history, instructions pre-decoded).
#include "flashlab/toymachine/executor.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "text.hpp"

namespace flashlab::toy {

std::uint64_t Counters::total_instructions() const {
  std::uint64_t s = 0;
  for (auto c : instructions) s += c;
  return s;
}

std::string format_fault(const Fault& f, const std::string& file) {
  std::string out = file + ":" + std::to_string(f.source_line) + ": step " + std::to_string(f.step) +
                    ": error: " + f.message + "\n";
  if (!f.hint.empty()) out += "hint: " + f.hint + "\n";
  return out;
}

Inputs random_inputs(const Machine& machine, std::uint64_t seed) {
  // splitmix64: the same seed gives the same inputs on every platform (std distributions do not).
  std::uint64_t st = seed;
  auto next = [&st]() {
    std::uint64_t z = (st += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  Inputs in;
  for (const auto& a : machine.arrays) {
    if (a.role != ArrayRole::Input) continue;
    std::vector<double> v(a.size());
    for (auto& x : v) {
      double u = static_cast<double>(next() >> 11) * 0x1.0p-53;  // [0, 1)
      x = std::round((u * 4.0 - 2.0) * 100.0) / 100.0;           // [−2, 2], two decimals
    }
    in[a.name] = std::move(v);
  }
  return in;
}

State initial_state(const Machine& machine, const Inputs& inputs, bool symbolic) {
  for (const auto& [name, vals] : inputs) {
    int ai = machine.find_array(name);
    if (ai < 0 || machine.arrays[static_cast<std::size_t>(ai)].role != ArrayRole::Input) {
      std::string ins;
      for (const auto& a : machine.arrays)
        if (a.role == ArrayRole::Input) ins += (ins.empty() ? "" : ", ") + a.shape();
      throw std::invalid_argument("machine " + machine.name + " has no input array '" + name + "' (its inputs: " + ins + ")");
    }
  }
  State s;
  s.registers.assign(machine.registers.size(), std::nullopt);
  s.dram.resize(machine.arrays.size());
  Counters& c = s.counters;
  c.array_reads.assign(machine.arrays.size(), 0);
  c.array_writes.assign(machine.arrays.size(), 0);
  c.element_reads.resize(machine.arrays.size());
  c.element_writes.resize(machine.arrays.size());
  for (std::size_t i = 0; i < machine.arrays.size(); ++i) {
    const ArrayDecl& a = machine.arrays[i];
    const std::size_t size = a.size();
    c.element_reads[i].assign(size, 0);
    c.element_writes[i].assign(size, 0);
    auto& cells = s.dram[i];
    cells.assign(size, std::nullopt);
    if (a.role == ArrayRole::Output) continue;  // outputs start never-written
    const std::vector<double>* vals = &a.values;
    if (a.role == ArrayRole::Input) {
      auto it = inputs.find(a.name);
      if (it == inputs.end()) throw std::invalid_argument("no values for input array " + a.shape());
      vals = &it->second;
    }
    if (vals->size() != size)
      throw std::invalid_argument(a.shape() + " needs " + std::to_string(size) + " values, got " + std::to_string(vals->size()));
    for (std::size_t k = 0; k < size; ++k) {
      Value v{(*vals)[k], nullptr};
      if (symbolic)
        v.sym = a.role == ArrayRole::Input ? make_input(a.name, k, a.element_name(k)) : make_constant((*vals)[k]);
      cells[k] = std::move(v);
    }
  }
  return s;
}

constexpr std::int64_t kUndeclared = -1;
constexpr std::int64_t kOutOfRange = -2;

// An instruction decoded for the core: register numbers and a flat DRAM index.
namespace detail {
struct DecodedInstruction {
  Opcode op = Opcode::LOAD;
  int r[4] = {-1, -1, -1, -1};  // register operands in order
  int array = -1;
  std::int64_t flat = kUndeclared;
  std::uint32_t cycles = 1;
};
}  // namespace detail

namespace {

using detail::DecodedInstruction;

DecodedInstruction decode(const Instruction& ins, const Machine& m) {
  DecodedInstruction d;
  d.op = ins.op;
  d.cycles = static_cast<std::uint32_t>(m.cycles[static_cast<std::size_t>(ins.op)]);
  int nr = 0;
  for (const Operand& o : ins.operands) {
    if (o.kind == OperandKind::Register) {
      if (nr < 4) d.r[nr++] = o.reg;
      continue;
    }
    d.array = o.array;
    if (o.array < 0 || static_cast<std::size_t>(o.array) >= m.arrays.size()) {
      d.array = -1;
      d.flat = kUndeclared;
      continue;
    }
    const ArrayDecl& a = m.arrays[static_cast<std::size_t>(o.array)];
    d.flat = 0;
    if (o.index.size() != a.dims.size()) {
      d.flat = kOutOfRange;
      continue;
    }
    for (std::size_t k = 0; k < a.dims.size(); ++k) {
      long long ix = o.index[k];
      if (ix < 0 || static_cast<unsigned long long>(ix) >= a.dims[k]) {
        d.flat = kOutOfRange;
        break;
      }
      d.flat = d.flat * static_cast<std::int64_t>(a.dims[k]) + ix;
    }
  }
  return d;
}

// ---- fault messages (cold path) ----

const Operand* memory_operand(const Instruction& ins) {
  for (const auto& o : ins.operands)
    if (o.kind == OperandKind::Memory) return &o;
  return nullptr;
}

std::string written(const Operand& o) {
  std::string s = o.name;
  for (auto i : o.index) s += text::bracket(i);
  return s;
}

Fault make_fault(const Program& p, std::size_t pc, std::string msg, std::string hint) {
  Fault f;
  f.step = pc + 1;
  f.source_line = p.code[pc].source_line;
  f.message = p.code[pc].text + ": " + std::move(msg);
  f.hint = std::move(hint);
  return f;
}

Fault dram_fault(const Program& p, const Machine& m, std::size_t pc, const DecodedInstruction& d) {
  const Instruction& ins = p.code[pc];
  const Operand* o = memory_operand(ins);
  const std::string name = o ? o->name : "?";
  if (d.flat == kUndeclared)
    return make_fault(p, pc, "machine " + m.name + " has no DRAM array '" + name + "'",
                      "its DRAM arrays are " + m.array_list());
  const ArrayDecl& a = m.arrays[static_cast<std::size_t>(d.array)];
  std::string hint;
  if (a.dims.size() == 1) {
    const std::string last = std::to_string(a.dims[0] - 1);
    hint = a.name + " has " + std::to_string(a.dims[0]) + " elements: " + a.name + "[0].." + a.name + "[" + last + "]";
    if (a.dims[0] == static_cast<std::size_t>(m.n))
      hint += " (the last is " + a.name + "[n-1], n = " + std::to_string(m.n) + ")";
  } else if (a.dims.size() == 2) {
    hint = a.shape() + ": rows 0.." + std::to_string(a.dims[0] - 1) + ", columns 0.." + std::to_string(a.dims[1] - 1);
  } else {
    hint = a.name + " is a scalar: write it without an index";
  }
  return make_fault(p, pc, (o ? written(*o) : name) + " is out of range", hint);
}

std::string reg_name(const Machine& m, int r) { return m.registers[static_cast<std::size_t>(r)]; }

Fault unset_register_fault(const Program& p, const Machine& m, std::size_t pc, int r) {
  return make_fault(p, pc, "reads " + reg_name(m, r) + ", which was never written",
                    "give " + reg_name(m, r) + " a value first: LOAD it from DRAM or make it the destination of an earlier instruction");
}

// ---- the core ----

template <bool Symbolic>
std::optional<Fault> step_core(const Program& p, const Machine& m, const DecodedInstruction& d, State& s, std::uint64_t cap) {
  const std::size_t pc = s.pc;
  Counters& c = s.counters;
  if (cap != 0 && c.cycles + d.cycles > cap)
    return make_fault(p, pc, "the cycle cap of " + std::to_string(cap) + " would be exceeded (" +
                                 std::to_string(c.cycles) + " cycles so far)",
                      "the trace runs longer than allowed: check the loop bounds, or raise the cap (--max-cycles)");
  auto& R = s.registers;
  // Source registers must hold a value (the lesson's machine has no zeroed registers).
  auto need = [&](int r) -> std::optional<Fault> {
    if (!R[static_cast<std::size_t>(r)]) return unset_register_fault(p, m, pc, r);
    return std::nullopt;
  };
  auto val = [&](int r) -> const Value& { return *R[static_cast<std::size_t>(r)]; };
  auto set = [&](int r, double num, ExprPtr sym) { R[static_cast<std::size_t>(r)] = Value{num, std::move(sym)}; };

  switch (d.op) {
    case Opcode::LOAD: {
      if (d.flat < 0) return dram_fault(p, m, pc, d);
      const auto ai = static_cast<std::size_t>(d.array);
      const auto fi = static_cast<std::size_t>(d.flat);
      const auto& cell = s.dram[ai][fi];
      if (!cell)
        return make_fault(p, pc, "reads " + m.arrays[ai].element_operand(fi) + ", which was never written",
                          "output cells start empty: STORE a value into " + m.arrays[ai].element_operand(fi) + " before loading it");
      R[static_cast<std::size_t>(d.r[0])] = cell;
      ++c.dram_reads;
      ++c.array_reads[ai];
      ++c.element_reads[ai][fi];
      s.last_access = Access{d.array, fi, AccessKind::Read};
      break;
    }
    case Opcode::STORE: {
      if (auto f = need(d.r[0])) return f;
      if (d.flat < 0) return dram_fault(p, m, pc, d);
      const auto ai = static_cast<std::size_t>(d.array);
      const auto fi = static_cast<std::size_t>(d.flat);
      const ArrayDecl& a = m.arrays[ai];
      if (a.role != ArrayRole::Output) {
        std::string outs;
        for (const auto& b : m.arrays)
          if (b.role == ArrayRole::Output) outs += (outs.empty() ? "" : ", ") + b.shape();
        return make_fault(p, pc,
                          "stores into " + std::string(a.role == ArrayRole::Input ? "input" : "constant") + " array " + a.name +
                              ", which is read-only",
                          outs.empty() ? "machine " + m.name + " has no output array" : "results go to the output array: " + outs);
      }
      s.dram[ai][fi] = val(d.r[0]);
      ++c.dram_writes;
      ++c.array_writes[ai];
      ++c.element_writes[ai][fi];
      s.last_access = Access{d.array, fi, AccessKind::Write};
      break;
    }
    case Opcode::MOV: {
      if (auto f = need(d.r[0])) return f;
      R[static_cast<std::size_t>(d.r[1])] = val(d.r[0]);
      s.last_access.reset();
      break;
    }
    case Opcode::EXP: {
      if (auto f = need(d.r[0])) return f;
      const Value& a = val(d.r[0]);
      ExprPtr e;
      if constexpr (Symbolic) e = make_exp(a.sym);
      set(d.r[1], std::exp(a.num), std::move(e));
      s.last_access.reset();
      break;
    }
    case Opcode::MAC: {
      if (auto f = need(d.r[0])) return f;
      if (auto f = need(d.r[1])) return f;
      if (auto f = need(d.r[2])) return f;
      const Value &a = val(d.r[0]), &b = val(d.r[1]), &acc = val(d.r[2]);
      ExprPtr e;
      // Accumulator first, so c00 reads a00·b00 + a01·b10 in the order the products arrived.
      if constexpr (Symbolic) e = make_add(acc.sym, make_mul(a.sym, b.sym));
      set(d.r[3], a.num * b.num + acc.num, std::move(e));
      s.last_access.reset();
      break;
    }
    default: {  // the two-source register ops: MAC_Z MAX SUB ADD MUL DIV
      if (auto f = need(d.r[0])) return f;
      if (auto f = need(d.r[1])) return f;
      const Value &a = val(d.r[0]), &b = val(d.r[1]);
      double num = 0.0;
      ExprPtr e;
      switch (d.op) {
        case Opcode::MAC_Z:
        case Opcode::MUL:
          num = a.num * b.num;
          if constexpr (Symbolic) e = make_mul(a.sym, b.sym);
          break;
        case Opcode::MAX:
          num = std::fmax(a.num, b.num);
          if constexpr (Symbolic) e = make_max(a.sym, b.sym);
          break;
        case Opcode::SUB:
          num = a.num - b.num;
          if constexpr (Symbolic) e = make_sub(a.sym, b.sym);
          break;
        case Opcode::ADD:
          num = a.num + b.num;
          if constexpr (Symbolic) e = make_add(a.sym, b.sym);
          break;
        case Opcode::DIV:
          num = a.num / b.num;
          if constexpr (Symbolic) e = make_div(a.sym, b.sym);
          break;
        default: break;
      }
      set(d.r[2], num, std::move(e));
      s.last_access.reset();
      break;
    }
  }
  c.cycles += d.cycles;
  ++c.instructions[static_cast<std::size_t>(d.op)];
  ++s.pc;
  return std::nullopt;
}

bool is_symbolic(const State& s) {
  for (const auto& r : s.registers)
    if (r) return r->sym != nullptr;
  for (const auto& a : s.dram)
    for (const auto& v : a)
      if (v) return v->sym != nullptr;
  return true;
}

}  // namespace

std::optional<Fault> apply_step(const Program& program, const Machine& machine, State& state, std::uint64_t cycle_cap) {
  if (state.pc >= program.code.size()) return std::nullopt;
  const DecodedInstruction d = decode(program.code[state.pc], machine);
  return is_symbolic(state) ? step_core<true>(program, machine, d, state, cycle_cap)
                            : step_core<false>(program, machine, d, state, cycle_cap);
}

std::optional<Fault> next_state(const Program& program, const Machine& machine, const State& s, State& out,
                                std::uint64_t cycle_cap) {
  State t = s;
  if (auto f = apply_step(program, machine, t, cycle_cap)) return f;
  out = std::move(t);
  return std::nullopt;
}

// ---- Executor ----

struct Executor::Decoded : detail::DecodedInstruction {};

Executor::Executor(Program program, Machine machine, const Inputs& inputs, Options options)
    : program_(std::move(program)), machine_(std::move(machine)), inputs_(inputs), options_(options),
      state_(initial_state(machine_, inputs_, options_.symbolic)) {
  auto code = std::make_shared<std::vector<Decoded>>();
  code->reserve(program_.code.size());
  for (const auto& ins : program_.code) code->push_back(Decoded{decode(ins, machine_)});
  decoded_ = std::move(code);
}

bool Executor::done() const { return fault_.has_value() || state_.pc >= program_.code.size(); }

std::optional<Fault> Executor::step() {
  if (done()) return std::nullopt;
  const DecodedInstruction& d = (*decoded_)[state_.pc];
  if (options_.symbolic) {
    history_.push_back(state_);
    auto f = step_core<true>(program_, machine_, d, state_, options_.cycle_cap);
    if (f) history_.pop_back();  // a faulting step changes nothing
    fault_ = f;
    return f;
  }
  fault_ = step_core<false>(program_, machine_, d, state_, options_.cycle_cap);
  return fault_;
}

bool Executor::back() {
  if (history_.empty()) return false;
  fault_.reset();
  state_ = std::move(history_.back());
  history_.pop_back();
  return true;
}

std::optional<Fault> Executor::run() {
  if (options_.symbolic) {
    while (!done()) step();
    return fault_;
  }
  // Numeric-only: the tight loop over the pre-decoded program (bench/bench_toymachine.cpp).
  const auto& code = *decoded_;
  const std::size_t size = code.size();
  while (!fault_ && state_.pc < size)
    fault_ = step_core<false>(program_, machine_, code[state_.pc], state_, options_.cycle_cap);
  return fault_;
}

}  // namespace flashlab::toy
