/// @file machine.hpp
/// @brief Machine profiles: registers, the allowed ISA subset, cycle costs and the DRAM layout.
/// The built-in profiles are the lesson's two machines (the toy-machine lesson, "The Toy Model" and "Softmax",
/// plus "Enlarging the Register File" and "One More Register").
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "flashlab/toymachine/diagnostic.hpp"
#include "flashlab/toymachine/isa.hpp"
#include "flashlab/toymachine/value.hpp"

namespace flashlab::toy {

/// What a DRAM array is for.
enum class ArrayRole {
  Input,     ///< read-only, filled from random or given inputs
  Output,    ///< starts empty (every cell "never written"); the program STOREs into it
  Constant   ///< read-only, filled with fixed values from the machine definition
};

/// One DRAM array.
struct ArrayDecl {
  std::string name;                 ///< as operands spell it: `a`, `x`, `out`
  std::vector<std::size_t> dims;    ///< {} for a scalar, {n} for 1-D, {rows, cols} for 2-D
  ArrayRole role = ArrayRole::Input;  ///< input, output or constant
  std::vector<double> values;       ///< Constant: the row-major values

  /// Number of elements (1 for a scalar).
  [[nodiscard]] std::size_t size() const;
  /// Shape as written in docs and hints: `a[2][2]`, `x[8]`, `one`.
  [[nodiscard]] std::string shape() const;
  /// The name an element shows in symbolic values: `a01`, `x3` (`a1,12` when a dimension > 10).
  [[nodiscard]] std::string element_name(std::size_t flat) const;
  /// The element as an operand: `a[0][1]`, `x[3]`, `one`.
  [[nodiscard]] std::string element_operand(std::size_t flat) const;
};

/// A machine profile.
struct Machine {
  std::string name;                        ///< e.g. "matmul3"
  std::string description;                 ///< one line for `flashlab machines`
  std::vector<std::string> registers;      ///< display names in order, e.g. {"R0", "r1", "r2"}
  std::vector<Opcode> opcodes;             ///< the allowed instructions, in ISA order
  std::array<int, kOpcodeCount> cycles{};  ///< cycles per opcode (meaningful for allowed ones)
  std::vector<ArrayDecl> arrays;           ///< the DRAM layout
  int n = 8;                               ///< the `--n` parameter that sized the arrays
  NameTable names;                         ///< names the printer uses (c00; m and S when n <= 4096)

  /// Index of a register, case-insensitive; −1 when the machine has no such register.
  [[nodiscard]] int find_register(std::string_view reg) const;
  /// Index of an array by exact name; −1 when undeclared.
  [[nodiscard]] int find_array(std::string_view array) const;
  /// True when the profile allows `op`.
  [[nodiscard]] bool allows(Opcode op) const;
  /// The register list for hints: "R0..R2" when they are R0, R1, R2; else "R0, r1, r2".
  [[nodiscard]] std::string register_list() const;
  /// The allowed mnemonics, space-separated.
  [[nodiscard]] std::string isa_list() const;
  /// The arrays for hints: "a[2][2] (input), b[2][2] (input), c[2][2] (output)".
  [[nodiscard]] std::string array_list() const;
};

/// An error in a machine definition (unknown profile, bad machine file, bad --n).
/// what() is one line ("file:line:col: msg" for files); hint() says what to do.
class MachineError : public std::runtime_error {
 public:
  /// An error with no source location (unknown profile, bad n).
  MachineError(const std::string& message, std::string hint)
      : std::runtime_error(message), hint_(std::move(hint)) {}
  /// An error located in a machine file.
  explicit MachineError(const Diagnostic& d)
      : std::runtime_error(d.file + ":" + std::to_string(d.line) + ":" + std::to_string(d.col) + ": " + d.message),
        hint_(d.hint), diagnostic_(d) {}
  /// What to do about it.
  [[nodiscard]] const std::string& hint() const { return hint_; }
  /// The located error, for files (print it with format_diagnostic()).
  [[nodiscard]] const std::optional<Diagnostic>& diagnostic() const { return diagnostic_; }

 private:
  std::string hint_;
  std::optional<Diagnostic> diagnostic_;
};

/// Largest `n` a profile accepts (DRAM arrays stay small enough to print and to hold).
inline constexpr int kMaxN = 1 << 20;
/// Most registers a machine file may declare: far beyond any lesson's machine, and small enough
/// that every lookup by name and every rendered register table stays cheap.
inline constexpr std::size_t kMaxRegisters = 4096;
/// Most DRAM arrays a machine file may declare (the same reasons).
inline constexpr std::size_t kMaxArrays = 1024;

/// The built-in profiles: matmul3 (R0–R2; LOAD STORE MAC_Z MAC; a[2][2], b[2][2] → c[2][2]),
/// matmul6 (R0–R5, same DRAM), softmax3 (R0, r1, r2; LOAD STORE MAX SUB EXP ADD MUL DIV MOV;
/// x[n] → out[n]), softmax4 (adds r3). One cycle per instruction.
/// @throws MachineError for an unknown name or n outside 1..kMaxN.
Machine builtin_machine(std::string_view name, int n = 8);

/// Names of the built-in profiles, in the order `flashlab machines` lists them.
std::vector<std::string> builtin_machine_names();

/// Parses a user-defined machine (format: docs/toymachine.md, "Machine files"), with sizes in
/// terms of `n`. @throws MachineError whose message is `file:line:col: error: …` with a hint.
Machine parse_machine_file(std::string_view text, std::string_view filename, int n);

}  // namespace flashlab::toy
