// The ISA table (the toy-machine lesson, "Instruction Set" of the matmul machine and of the softmax machine).
// Operand order follows the lesson exactly: sources first, destination last.
#include "flashlab/toymachine/isa.hpp"

#include <cctype>

namespace flashlab::toy {

namespace {
constexpr auto R = OperandKind::Register;
constexpr auto M = OperandKind::Memory;
}  // namespace

const std::vector<IsaEntry>& isa() {
  // One row per instruction; the assembler, executor, hints, `flashlab machines` and
  // docs/toymachine.md all read this table. Row order must match enum Opcode.
  static const std::vector<IsaEntry> table = {
      {Opcode::LOAD, "LOAD", "src, Rd", {M, R}, 1, "load one DRAM element into a register", "Rd = DRAM[src]"},
      {Opcode::STORE, "STORE", "Rs, dst", {R, M}, 1, "store a register into one DRAM element", "DRAM[dst] = Rs"},
      {Opcode::MAC_Z, "MAC_Z", "Ra, Rb, Rd", {R, R, R}, 1, "multiply, no accumulate (first term of a dot product)",
       "Rd = Ra × Rb"},
      {Opcode::MAC, "MAC", "Ra, Rb, Rc, Rd", {R, R, R, R}, 1, "multiply-accumulate", "Rd = Ra × Rb + Rc"},
      {Opcode::MAX, "MAX", "Ra, Rb, Rd", {R, R, R}, 1, "maximum", "Rd = max(Ra, Rb)"},
      {Opcode::SUB, "SUB", "Ra, Rb, Rd", {R, R, R}, 1, "subtract", "Rd = Ra − Rb"},
      {Opcode::EXP, "EXP", "Ra, Rd", {R, R}, 1, "exponential", "Rd = exp(Ra)"},
      {Opcode::ADD, "ADD", "Ra, Rb, Rd", {R, R, R}, 1, "add", "Rd = Ra + Rb"},
      {Opcode::MUL, "MUL", "Ra, Rb, Rd", {R, R, R}, 1, "multiply", "Rd = Ra × Rb"},
      {Opcode::DIV, "DIV", "Ra, Rb, Rd", {R, R, R}, 1, "divide", "Rd = Ra / Rb"},
      {Opcode::MOV, "MOV", "Rs, Rd", {R, R}, 1, "copy a register", "Rd = Rs"},
  };
  return table;
}

const IsaEntry& isa_entry(Opcode op) { return isa()[static_cast<std::size_t>(op)]; }

const std::string& mnemonic(Opcode op) { return isa_entry(op).mnemonic; }

const IsaEntry* find_instruction(std::string_view name) {
  for (const auto& e : isa()) {
    if (e.mnemonic.size() != name.size()) continue;
    bool same = true;
    for (std::size_t i = 0; i < name.size() && same; ++i) {
      same = std::toupper(static_cast<unsigned char>(name[i])) == static_cast<unsigned char>(e.mnemonic[i]);
    }
    if (same) return &e;
  }
  return nullptr;
}

}  // namespace flashlab::toy
