/// @file policy.hpp
/// @brief How long a toy-machine run may be and how much of it is kept: one policy for `run`,
/// `step` and `lesson check`. The instruction cap itself is the front end's (kMaxInstructions in
/// frontend.hpp): no trace expands beyond it, whichever command reads it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "flashlab/toymachine/frontend.hpp"
#include "flashlab/toymachine/machine.hpp"

namespace flashlab::toy {

/// The default cycle cap: a run faults when a step would exceed it.
inline constexpr std::uint64_t kDefaultCycleCap = 10'000'000;

/// The largest cycle cap a user may ask for (`--max-cycles`; 0 means no cap at all).
inline constexpr std::uint64_t kMaxCycleCap = std::uint64_t{1} << 62;

/// A symbolic run keeps expressions and, for tables and back-steps, states: at most this many steps…
inline constexpr std::size_t kMaxSymbolicSteps = 20'000;

/// …and at most this many DRAM cells summed over the states kept (steps × cells). The stepper's
/// checkpoints obey the same budget.
inline constexpr std::size_t kMaxKeptCells = 4'000'000;

/// DRAM cells of a machine (every element of every array).
std::size_t dram_cells(const Machine& machine);

/// True when a run of `steps` instructions on `machine` may carry symbolic values and keep every
/// state; beyond that, commands run numeric-only (and say so).
bool fits_symbolic(std::size_t steps, const Machine& machine);

}  // namespace flashlab::toy
