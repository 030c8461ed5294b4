/// @file executor.hpp
/// @brief Runs a program on a machine: a pure step over an explicit State (counters included),
/// with history for true back-steps, numeric values always and symbolic values on request.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "flashlab/toymachine/assembler.hpp"
#include "flashlab/toymachine/machine.hpp"
#include "flashlab/toymachine/policy.hpp"
#include "flashlab/toymachine/value.hpp"

namespace flashlab::toy {

/// Cycles, instruction mix and DRAM traffic so far.
struct Counters {
  std::uint64_t cycles = 0;                                    ///< total cycles
  std::array<std::uint64_t, kOpcodeCount> instructions{};      ///< executed count per opcode
  std::uint64_t dram_reads = 0;                                ///< LOADs (one element each)
  std::uint64_t dram_writes = 0;                               ///< STOREs (one element each)
  std::vector<std::uint64_t> array_reads;                      ///< per array (Machine::arrays order)
  std::vector<std::uint64_t> array_writes;                     ///< per array
  std::vector<std::vector<std::uint32_t>> element_reads;       ///< per array, per flat element
  std::vector<std::vector<std::uint32_t>> element_writes;      ///< per array, per flat element
  /// Total executed instructions.
  [[nodiscard]] std::uint64_t total_instructions() const;
};

/// Whether the last DRAM access was a read or a write.
enum class AccessKind {
  Read,  ///< a LOAD
  Write  ///< a STORE
};

/// The last DRAM access, for the stepper's highlight.
struct Access {
  int array = -1;           ///< index into Machine::arrays
  std::size_t element = 0;  ///< flat element index
  AccessKind kind = AccessKind::Read;  ///< read or write
};

/// The whole machine state between two instructions.
struct State {
  std::size_t pc = 0;                                       ///< next instruction (= steps taken)
  std::vector<std::optional<Value>> registers;              ///< empty = never written
  std::vector<std::vector<std::optional<Value>>> dram;      ///< per array, per flat element
  Counters counters;                                        ///< counts so far
  std::optional<Access> last_access;                        ///< DRAM access of the last step, if any
};

/// A runtime fault: the instruction at `step` did not execute.
struct Fault {
  std::size_t step = 0;     ///< 1-based step number of the faulting instruction
  int source_line = 0;      ///< its line in the trace
  std::string message;      ///< e.g. "MAC_Z reads R1, which was never written"
  std::string hint;         ///< what to do about it
};

/// "file:line: step N: error: msg\nhint: …\n".
std::string format_fault(const Fault& f, const std::string& file);

/// Values for the input arrays, row-major: array name → elements.
using Inputs = std::map<std::string, std::vector<double>>;

/// Seeded random inputs for every Input array: uniform in [−2, 2], rounded to 0.01 so that
/// tables stay short. Same seed → same inputs.
Inputs random_inputs(const Machine& machine, std::uint64_t seed);

/// The initial state: inputs and constants in DRAM, registers and outputs empty.
/// @throws std::invalid_argument when an input is missing, unknown or has the wrong size.
State initial_state(const Machine& machine, const Inputs& inputs, bool symbolic);

/// Executes the instruction at state.pc in place. Returns the fault instead (state untouched)
/// when it cannot execute. `cycle_cap` = 0 means no cap.
std::optional<Fault> apply_step(const Program& program, const Machine& machine, State& state,
                                std::uint64_t cycle_cap);

/// The pure step: the state after the instruction at s.pc, or the fault.
std::optional<Fault> next_state(const Program& program, const Machine& machine, const State& s,
                                State& out, std::uint64_t cycle_cap);

/// Executor settings.
struct Options {
  /// Carry expressions and keep every state for back() and tables (false: numeric-only, no
  /// history, fast). History holds all of DRAM per step: keep symbolic runs small (the CLI goes
  /// numeric-only past the policy's size, policy.hpp).
  bool symbolic = true;
  std::uint64_t cycle_cap = kDefaultCycleCap;  ///< fault when a step would exceed it; 0 = no cap
};

/// Runs a program step by step, forward and back.
class Executor {
 public:
  /// Decodes the program once (operands → register numbers and flat DRAM indices) and builds
  /// the initial state. @throws std::invalid_argument for bad inputs (see initial_state()).
  Executor(Program program, Machine machine, const Inputs& inputs, Options options = {});

  /// The current state.
  [[nodiscard]] const State& state() const { return state_; }
  /// True when every instruction ran or a fault stopped the run.
  [[nodiscard]] bool done() const;
  /// The fault that stopped the run, if any.
  [[nodiscard]] const std::optional<Fault>& fault() const { return fault_; }
  /// Executes one instruction; returns the fault if it faulted. No-op when done().
  std::optional<Fault> step();
  /// Restores the previous state exactly (clears a fault first). False at the start, or
  /// in numeric-only mode (no history).
  bool back();
  /// Steps until done; returns the fault if any.
  std::optional<Fault> run();
  /// The program.
  [[nodiscard]] const Program& program() const { return program_; }
  /// The machine.
  [[nodiscard]] const Machine& machine() const { return machine_; }
  /// The inputs the run started from.
  [[nodiscard]] const Inputs& inputs() const { return inputs_; }
  /// Instructions executed so far.
  [[nodiscard]] std::size_t steps_taken() const { return state_.pc; }
  /// Every state before the current one: history()[k] is the state after k steps
  /// (symbolic mode; empty in numeric-only mode).
  [[nodiscard]] const std::vector<State>& history() const { return history_; }
  /// The options.
  [[nodiscard]] const Options& options() const { return options_; }

 private:
  struct Decoded;  // the program pre-decoded for the step core (executor.cpp)
  Program program_;
  Machine machine_;
  std::shared_ptr<const std::vector<Decoded>> decoded_;
  Inputs inputs_;
  Options options_;
  State state_;
  std::vector<State> history_;
  std::optional<Fault> fault_;
};

}  // namespace flashlab::toy
