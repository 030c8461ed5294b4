/// @file timeline.hpp
/// @brief Moving through one run in both directions with bounded memory, for the stepper.
///
/// The executor's step is pure, so the past need not be stored: the timeline keeps a checkpoint
/// every K steps (K chosen so that the checkpoints hold at most kMaxKeptCells DRAM cells and are
/// at most a thousand or so) and
/// reaches an earlier step by re-executing from the checkpoint before it. A back-step costs at
/// most K steps; memory stays bounded for a trace of any length.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "flashlab/toymachine/assembler.hpp"
#include "flashlab/toymachine/executor.hpp"
#include "flashlab/toymachine/machine.hpp"

namespace flashlab::toy {

/// Where `g :L` lands: the step before an execution of line L.
struct LineTarget {
  std::size_t step = 0;  ///< steps taken before the instruction of line L runs
  bool wrapped = false;  ///< true when line L does not run after the current position, so this
                         ///< is its first execution (behind the current position)
};

/// One run, navigable forward and back.
class Timeline {
 public:
  /// Builds the initial state (symbolic values when `options.symbolic`).
  /// @throws std::invalid_argument for bad inputs (see initial_state()).
  Timeline(Program program, Machine machine, const Inputs& inputs, Options options);

  /// The state after position() steps.
  [[nodiscard]] const State& state() const { return state_; }
  /// The state one step earlier (null at step 0): it marks what the last step changed.
  [[nodiscard]] const State* previous() const { return previous_ ? &*previous_ : nullptr; }
  /// Steps taken.
  [[nodiscard]] std::size_t position() const { return state_.pc; }
  /// Instructions in the program.
  [[nodiscard]] std::size_t length() const { return program_.code.size(); }
  /// The fault of the instruction at position(), once a step has tried it.
  [[nodiscard]] const std::optional<Fault>& fault() const { return fault_; }
  /// True at the end of the program or at a fault.
  [[nodiscard]] bool done() const { return fault_.has_value() || state_.pc >= program_.code.size(); }

  /// Executes one instruction; false when done() (a fault it meets is kept in fault()).
  bool step();
  /// Goes back one step (re-executing from a checkpoint); false at step 0.
  bool back();
  /// Goes to the state after `target` steps, or to the fault that stops the run before it.
  void go_to(std::size_t target);
  /// Runs to the end or to the fault.
  void run_to_end() { go_to(program_.code.size()); }
  /// The next execution of source line `line` after the current position, else its first one;
  /// nothing when no instruction comes from that line.
  [[nodiscard]] std::optional<LineTarget> find_line(int line) const;

  /// The program.
  [[nodiscard]] const Program& program() const { return program_; }
  /// The machine.
  [[nodiscard]] const Machine& machine() const { return machine_; }
  /// The options (symbolic or numeric-only, cycle cap).
  [[nodiscard]] const Options& options() const { return options_; }
  /// Steps between two checkpoints (K).
  [[nodiscard]] std::size_t checkpoint_interval() const { return interval_; }
  /// Checkpoints held now (at most length() / K + 1).
  [[nodiscard]] std::size_t checkpoints() const { return checkpoints_.size(); }

 private:
  // Moves state_ forward to `target` steps or to a fault, keeping checkpoints on the way.
  void advance(std::size_t target);
  // Puts state_ at the latest checkpoint at or before `target`.
  void restore(std::size_t target);

  Program program_;
  Machine machine_;
  Options options_;
  std::size_t interval_ = 1;
  std::vector<State> checkpoints_;  // checkpoints_[k]: the state after k · interval_ steps
  State state_;
  std::optional<State> previous_;
  std::optional<Fault> fault_;
  std::optional<Fault> first_fault_;  // the fault that ends the run, once met (runs are deterministic)
};

}  // namespace flashlab::toy
