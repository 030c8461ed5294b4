// Checks of the method, not only the values (private to the checker): the run on hostile inputs
// with the step where an ∞, a NaN or a positive exponent first appears; the state a running
// algorithm must hold after each element; the outer product's loop order; and the first step
// of a wrong trace that computes a value no correct run computes.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "flashlab/lessons/lesson.hpp"
#include "flashlab/toymachine/assembler.hpp"
#include "flashlab/toymachine/executor.hpp"
#include "flashlab/toymachine/machine.hpp"
#include "hostile_inputs.hpp"

namespace flashlab::lessons::detail {

/// "step 12 (file:7) `EXP R0, R0`": how feedback names a step (1-based).
std::string step_name(const toy::Program& program, std::size_t step, std::string_view filename);

/// Runs `program` numerically on one hostile input set and checks every step: with
/// `exp_after_max`, an EXP whose exponent is above 0 is wrong; any ∞ or NaN a step puts in a
/// register is wrong. Then the outputs are compared with `reference`. Returns the problem, one
/// sentence naming the step (and the symbolic exponent from `symbolic_history`, a symbolic run
/// of the same program, when it has that step), or nullopt when the run is right.
std::optional<std::string> hostile_run(const toy::Program& program, const toy::Machine& machine,
                                       const HostileInputs& hostile, const ReferenceFn& reference, bool exp_after_max,
                                       const std::vector<toy::State>& symbolic_history, std::string_view filename);

/// The state checks of `methods` ("running-max", "running-sum", "running-mean", "running-m2",
/// "running-score-max", "running-denominator", "running-numerator") on a symbolic run `ex` (history kept): after
/// each element arrives, some register must hold the running value before the next element is
/// read. Returns the first problem, naming the step, or nullopt.
std::optional<std::string> running_state_problem(const toy::Executor& ex, const std::vector<std::string>& methods,
                                                 std::string_view filename);

/// The carried state ("carried-state"): just before each element i+1 of the streamed array is
/// first read, every register whose value depends on the streamed inputs and is read again
/// later must hold one of the running values of `methods` after element i (in one of its
/// accepted forms). A trace that carries anything else — a sum it divides at every step, sums
/// shifted by the first element — uses another method, sound or not. Returns the first problem,
/// naming the step, the register and what it holds, or nullopt.
std::optional<std::string> carried_state_problem(const toy::Executor& ex, const std::vector<std::string>& methods,
                                                 std::string_view filename);

/// Problem 3's method: some state holds all four partial products a_ik·b_kj of one k at once
/// (the rank-1 update), and at no step do more than two registers hold input elements (the
/// lesson text's scheme: two operand registers, four accumulators). Runs `program` on inputs
/// whose products are all distinct. Returns the problem, naming the step, or nullopt.
std::optional<std::string> outer_product_problem(const toy::Program& program, const toy::Machine& machine,
                                                 std::string_view filename);

/// For a trace with wrong outputs: the first step whose result no state of the correct run
/// `reference` holds (compared by value on the same inputs, shown symbolically). Empty when
/// every step's value also appears in the correct run.
std::string first_departure(const toy::Executor& got, const toy::Executor& reference, std::string_view filename);

}  // namespace flashlab::lessons::detail
