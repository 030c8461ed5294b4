// Flags shared by the attention commands (attention, traffic, bench): the one place that turns
// them into a ref::AttentionProblem and a --variant into a ref::Algorithm, and that turns the
// problem's validation errors into usage errors naming the flag.
#pragma once

#include "core/cli.hpp"

#include "flashlab/reference/attention_problem.hpp"

#include <cstddef>
#include <string>

namespace flashlab::app {

/// Adds --block-m (Br) and --block-n (Bc), declared as po::value<long long>, with the one
/// default of each tile (ref::kDefaultBr, ref::kDefaultBc).
void add_tile_options(po::options_description& d);

/// The value of an integer flag declared as po::value<long long>, as a size; a negative value
/// is a UsageError naming the flag (its limits are the problem's, checked by validate_flags()).
std::size_t size_flag(const po::variables_map& vm, const char* name);

/// Runs problem.validate() and rethrows its ProblemError as a UsageError whose message names
/// the flag that sets the field (--block-m for Br, --dim for d, …) and keeps its hint.
void validate_flags(const ref::AttentionProblem& problem);

/// The algorithm a --variant value names for a forward or backward pass (ref::parse_algorithm);
/// an unknown value is a UsageError naming --variant.
ref::Algorithm algorithm_flag(const std::string& value, bool backward);

}  // namespace flashlab::app
