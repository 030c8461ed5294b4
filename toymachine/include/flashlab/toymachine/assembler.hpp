/// @file assembler.hpp
/// @brief Trace text → program. Accepts the toy-machine lesson's traces as printed (optional step
/// numbers, `#` comments, `a[0][0]`/`x[2]`/`out[1]` operands, register names in any case) plus
/// the loop directive `for i in A..B` … `end`, expanded before execution. The lexer, the
/// diagnostics, the index expressions, the loops and their limits are the shared front end's
/// (frontend.hpp); this file adds the machine's operands. Every error is collected.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "flashlab/toymachine/diagnostic.hpp"
#include "flashlab/toymachine/frontend.hpp"
#include "flashlab/toymachine/isa.hpp"
#include "flashlab/toymachine/machine.hpp"

namespace flashlab::toy {

/// One operand after loop expansion.
struct Operand {
  OperandKind kind = OperandKind::Register;  ///< register or DRAM cell
  int reg = -1;                   ///< Register: index into Machine::registers
  std::string name;               ///< register or array name as written
  int array = -1;                 ///< Memory: index into Machine::arrays, −1 when undeclared
  std::vector<long long> index;   ///< Memory: the evaluated indices (empty for a scalar)
};

/// One executable instruction (loops already expanded).
struct Instruction {
  Opcode op = Opcode::LOAD;       ///< the opcode
  std::vector<Operand> operands;  ///< in the order written
  int source_line = 0;            ///< 1-based line in the trace
  int source_col = 0;             ///< 1-based column of the mnemonic
  std::string text;               ///< as written, loop indices substituted: "LOAD x[3], R0"
};

/// An assembled trace.
struct Program {
  std::string file;                       ///< the trace's file name
  std::vector<std::string> source_lines;  ///< the trace text, one entry per line
  std::vector<Instruction> code;          ///< the expanded instruction stream
};

/// Program plus every diagnostic; the program is meaningful only when ok().
struct AssembleResult {
  Program program;                       ///< the program (partial when there are errors)
  std::vector<Diagnostic> diagnostics;   ///< the errors, in source order, at most kMaxDiagnostics
  /// True when the trace assembled without errors.
  [[nodiscard]] bool ok() const { return diagnostics.empty(); }
};

/// Assembles `text` for `machine`. Unknown mnemonics, instructions the machine lacks, unknown
/// registers, wrong operand counts or kinds, bad index expressions and unbalanced loops are
/// diagnostics, and so are loops past the front end's limits (kMaxInstructions, kMaxNesting) and
/// index arithmetic that overflows; array names and index ranges are checked when the instruction
/// runs (faults).
AssembleResult assemble(std::string_view text, const Machine& machine, std::string_view filename);

}  // namespace flashlab::toy
