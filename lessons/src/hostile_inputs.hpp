// Hostile inputs for the numeric lessons: values that make a trace which skips the method of
// the lesson overflow, divide 0 by 0 or cancel, while a trace that follows it stays exact.
// Private to the checker (checker.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flashlab/lessons/lesson.hpp"
#include "flashlab/toymachine/executor.hpp"
#include "flashlab/toymachine/machine.hpp"

namespace flashlab::lessons::detail {

/// One named input set and the tolerance its outputs are compared with.
struct HostileInputs {
  std::string name;         ///< what it is, for the feedback: "x near +800"
  toy::Inputs inputs;       ///< one value per element of every input array
  double tolerance = 1e-9;  ///< relative to max(1, |expected|)
};

/// The hostile input sets of `family` for `machine` at its size (machine.n). Same seed → same
/// inputs. Empty for InputFamily::None.
std::vector<HostileInputs> hostile_inputs(InputFamily family, const toy::Machine& machine, std::uint64_t seed);

}  // namespace flashlab::lessons::detail
