// The flags `run` and `step` share (--n, --seed, --max-cycles) and how both read a trace file:
// declared and validated in one place, so the two commands accept the same values.
#pragma once

#include <cstdint>
#include <string>

#include "core/cli.hpp"

namespace flashlab::app {

/// The validated values of the shared toy-machine flags.
struct ToyRunFlags {
  int n = 8;                       ///< --n, in 1..toy::kMaxN
  std::uint64_t seed = 1;          ///< --seed, in 0..2^62
  std::uint64_t max_cycles = 0;    ///< --max-cycles, in 0..toy::kMaxCycleCap (0 = no cap)
};

/// Declares --n, --seed and --max-cycles with their defaults and help.
void add_toy_run_options(po::options_description& desc);

/// Reads and range-checks the shared flags; throws UsageError naming the flag.
ToyRunFlags toy_run_flags(const po::variables_map& vm);

/// Reads a trace file; throws UsageError naming the path when it is missing, a directory, not
/// readable or larger than any trace the front end could accept.
std::string read_trace_file(const std::string& path);

}  // namespace flashlab::app
