// Flags shared by the attention commands (attention, traffic, bench): the one place that turns
// them into a ref::AttentionProblem and a --variant into a ref::Algorithm, and that turns the
// problem's validation errors into usage errors naming the flag.
#pragma once

#include "core/cli.hpp"

#include "flashlab/reference/attention_problem.hpp"

#include <cstddef>
#include <string>
#include <string_view>

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

/// The sequences of a --cu-seqlens file: a line `cu_seqlens_q = 0 3 3 10` (B + 1 prefix sums of
/// the query lengths) and, when the keys' lengths differ, a line `cu_seqlens_k = 0 5 5 17`;
/// numbers separated by spaces or commas, `#` starts a comment. A syntax error is a UsageError
/// naming --cu-seqlens and `source`:line:col; a list ref::PackedSequences refuses (not starting
/// at 0, decreasing, no query at all, …) names `source`:line and keeps the problem's hint.
ref::PackedSequences parse_cu_seqlens(std::string_view text, const std::string& source);

/// Reads and parses a --cu-seqlens file (a file, a pipe, or "-" for standard input; at most
/// 1 MiB); UsageError naming the flag when it cannot be read.
ref::PackedSequences read_cu_seqlens(const std::string& path);

/// The algorithm a --variant value names for a forward or backward pass (ref::parse_algorithm);
/// an unknown value is a UsageError naming --variant.
ref::Algorithm algorithm_flag(const std::string& value, bool backward);

}  // namespace flashlab::app
