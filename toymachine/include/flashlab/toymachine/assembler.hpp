/// @file assembler.hpp
/// @brief Trace text → program. Accepts the seed's traces as printed (optional step numbers,
/// `#` comments, `a[0][0]`/`x[2]`/`out[1]` operands, register names in any case) plus a loop
/// directive `for i in A..B` … `end`, expanded before execution. Every error is collected.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "flashlab/toymachine/diagnostic.hpp"
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

/// At most this many diagnostics are reported (the last one says that more were dropped).
inline constexpr std::size_t kMaxDiagnostics = 20;

/// Loop expansion stops with an error beyond this many instructions.
inline constexpr std::size_t kMaxInstructions = 1'000'000;

/// Assembles `text` for `machine`. Unknown mnemonics, instructions the machine lacks, unknown
/// registers, wrong operand counts or kinds, bad index expressions and unbalanced loops are
/// diagnostics; array names and index ranges are checked when the instruction runs (faults).
AssembleResult assemble(std::string_view text, const Machine& machine, std::string_view filename);

/// Evaluates an index expression (integers, `n`, loop variables, + − * and parentheses);
/// exposed for the machine-file parser. On error returns false and sets `error` and `error_col`
/// (0-based offset into `expr`).
bool eval_index_expression(std::string_view expr, const std::vector<std::pair<std::string, long long>>& vars,
                           long long& result, std::string& error, std::size_t& error_col);

}  // namespace flashlab::toy
