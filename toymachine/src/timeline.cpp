// The run policy (how long a run may be, how much of it is kept) and the stepper's timeline:
// checkpoints every K steps and re-execution from the one before a target, so that moving back
// through a long trace costs at most K steps and the memory held stays bounded.
#include "flashlab/toymachine/timeline.hpp"

#include <algorithm>

#include "flashlab/toymachine/policy.hpp"

namespace flashlab::toy {

namespace {

// At most this many checkpoints (plus the initial state): per-state overhead stays bounded for
// small machines, and a back-step re-executes at most length / kMaxCheckpoints steps.
constexpr std::size_t kMaxCheckpoints = 1024;

}  // namespace

std::size_t dram_cells(const Machine& machine) {
  std::size_t cells = 0;
  for (const auto& a : machine.arrays) cells += a.size();
  return cells;
}

bool fits_symbolic(std::size_t steps, const Machine& machine) {
  const std::size_t cells = std::max<std::size_t>(dram_cells(machine), 1);
  return steps <= kMaxSymbolicSteps && steps <= kMaxKeptCells / cells;
}

Timeline::Timeline(Program program, Machine machine, const Inputs& inputs, Options options)
    : program_(std::move(program)), machine_(std::move(machine)), options_(options),
      state_(initial_state(machine_, inputs, options_.symbolic)) {
  // K such that the length / K + 1 checkpoints hold at most kMaxKeptCells cells and number at
  // most kMaxCheckpoints.
  const std::size_t cells = std::max<std::size_t>(dram_cells(machine_) + machine_.registers.size(), 1);
  const std::size_t kept = std::clamp<std::size_t>(kMaxKeptCells / cells, 1, kMaxCheckpoints);
  interval_ = std::max<std::size_t>(1, (program_.code.size() + kept - 1) / kept);
  checkpoints_.push_back(state_);
}

void Timeline::advance(std::size_t target) {
  target = std::min(target, program_.code.size());
  while (state_.pc < target) {
    if (first_fault_ && state_.pc + 1 == first_fault_->step) break;
    if (auto f = apply_step(program_, machine_, state_, options_.cycle_cap)) {
      first_fault_ = std::move(f);
      break;
    }
    if (state_.pc % interval_ == 0 && state_.pc / interval_ == checkpoints_.size()) checkpoints_.push_back(state_);
  }
}

void Timeline::restore(std::size_t target) {
  const std::size_t k = std::min(target / interval_, checkpoints_.size() - 1);
  if (state_.pc < k * interval_ || state_.pc > target) state_ = checkpoints_[k];
}

bool Timeline::step() {
  if (done()) return false;
  State before = state_;
  if (auto f = apply_step(program_, machine_, state_, options_.cycle_cap)) {
    first_fault_ = f;
    fault_ = std::move(f);
    return true;
  }
  if (state_.pc % interval_ == 0 && state_.pc / interval_ == checkpoints_.size()) checkpoints_.push_back(state_);
  previous_ = std::move(before);
  return true;
}

bool Timeline::back() {
  if (state_.pc == 0) return false;
  go_to(state_.pc - 1);
  return true;
}

void Timeline::go_to(std::size_t target) {
  target = std::min(target, program_.code.size());
  fault_.reset();
  // First where the run really gets to (a fault may stop it before target)…
  restore(target);
  advance(target);
  const std::size_t reached = state_.pc;
  if (first_fault_ && reached + 1 == first_fault_->step && reached < target) fault_ = first_fault_;
  // …then the state one step before it, for the change marks: again from a checkpoint.
  if (reached == 0) {
    previous_.reset();
    return;
  }
  State here = state_;
  restore(reached - 1);
  advance(reached - 1);
  previous_ = std::move(state_);
  state_ = std::move(here);
}

std::optional<LineTarget> Timeline::find_line(int line) const {
  const auto& code = program_.code;
  for (std::size_t i = state_.pc + 1; i < code.size(); ++i)
    if (code[i].source_line == line) return LineTarget{i, false};
  for (std::size_t i = 0; i <= state_.pc && i < code.size(); ++i)
    if (code[i].source_line == line) return LineTarget{i, true};
  return std::nullopt;
}

}  // namespace flashlab::toy
