/// @file isa.hpp
/// @brief The toy machine's instruction set: one table drives the assembler, the executor,
/// `--help`, the error hints and docs/toymachine.md (the toy-machine lesson, "Instruction Set", both machines).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace flashlab::toy {

/// Every opcode of both of the lesson's machines (matmul: LOAD STORE MAC_Z MAC; softmax: LOAD STORE MAX SUB
/// EXP ADD MUL DIV MOV). A machine profile allows a subset.
enum class Opcode {
  LOAD,   ///< `LOAD src, Rd`: Rd = DRAM[src]
  STORE,  ///< `STORE Rs, dst`: DRAM[dst] = Rs
  MAC_Z,  ///< `MAC_Z Ra, Rb, Rd`: Rd = Ra × Rb
  MAC,    ///< `MAC Ra, Rb, Rc, Rd`: Rd = Ra × Rb + Rc
  MAX,    ///< `MAX Ra, Rb, Rd`: Rd = max(Ra, Rb)
  SUB,    ///< `SUB Ra, Rb, Rd`: Rd = Ra − Rb
  EXP,    ///< `EXP Ra, Rd`: Rd = e^Ra
  ADD,    ///< `ADD Ra, Rb, Rd`: Rd = Ra + Rb
  MUL,    ///< `MUL Ra, Rb, Rd`: Rd = Ra × Rb
  DIV,    ///< `DIV Ra, Rb, Rd`: Rd = Ra / Rb
  MOV     ///< `MOV Rs, Rd`: Rd = Rs
};

/// The kind of one operand slot in an instruction's pattern.
enum class OperandKind {
  Register,  ///< a register name, e.g. `R0` or `r1`
  Memory     ///< a DRAM cell, e.g. `a[0][1]`, `x[i]`, `out[n-1]` or a scalar `one`
};

/// One row of the ISA table.
struct IsaEntry {
  Opcode opcode;                      ///< the opcode this row describes
  std::string mnemonic;               ///< upper-case mnemonic as the lesson writes it, e.g. "MAC_Z"
  std::string operands;               ///< operand pattern for help and hints, e.g. "Ra, Rb, Rc, Rd"
  std::vector<OperandKind> pattern;   ///< the kind of each operand slot, in order
  int default_cycles;                 ///< cycles unless the machine profile says otherwise
  std::string doc;                    ///< one-line description
  std::string semantics;              ///< e.g. "Rd = Ra × Rb + Rc"
};

/// The ISA table, in opcode order (index = static_cast<int>(opcode)).
const std::vector<IsaEntry>& isa();

/// The row of `op`.
const IsaEntry& isa_entry(Opcode op);

/// Looks a mnemonic up case-insensitively; nullptr when there is no such instruction.
const IsaEntry* find_instruction(std::string_view mnemonic);

/// The mnemonic of `op` ("MAC_Z").
const std::string& mnemonic(Opcode op);

/// Number of opcodes in the table.
inline constexpr int kOpcodeCount = 11;

}  // namespace flashlab::toy
