#include "toymachine/toy_flags.hpp"

#include <string_view>

#include "core/shared_flags.hpp"

#include "flashlab/toymachine/machine.hpp"
#include "flashlab/toymachine/policy.hpp"

namespace flashlab::app {

namespace {

// A trace of kMaxInstructions lines of ordinary length is a few tens of MB; a file beyond this is
// not a trace the front end could accept, so it is refused before it is read.
constexpr std::uintmax_t kMaxTraceBytes = std::uintmax_t{64} << 20;

}  // namespace

void add_toy_run_options(po::options_description& desc) {
  // Signed types, so that "-1" reaches the range check (an unsigned flag would wrap it silently).
  desc.add_options()
      ("n", po::value<long long>()->default_value(8), "the size n of the machine's arrays (softmax profiles, machine files)")
      ;
  add_seed_option(desc, "the random inputs (uniform in [-2, 2], 2 decimals)");
  desc.add_options()
      ("max-cycles", po::value<long long>()->default_value(static_cast<long long>(toy::kDefaultCycleCap)),
       "runtime fault beyond this many cycles (0 = no cap)");
}

ToyRunFlags toy_run_flags(const po::variables_map& vm) {
  ToyRunFlags f;
  const long long n = vm["n"].as<long long>();
  require_range("n", n, 1, toy::kMaxN);
  f.n = static_cast<int>(n);
  f.seed = static_cast<std::uint64_t>(seed_flag(vm));
  const long long cycles = vm["max-cycles"].as<long long>();
  require_range("max-cycles", cycles, 0, static_cast<long long>(toy::kMaxCycleCap));
  f.max_cycles = static_cast<std::uint64_t>(cycles);
  return f;
}

std::string read_trace_file(const std::string& path) {
  try {
    return read_input(path, "TRACE", "trace", kMaxTraceBytes);
  } catch (const UsageError& e) {
    // A trace too large to accept gets the front end's reason, not only the size.
    if (std::string_view(e.what()).find("over the cap") == std::string_view::npos) throw;
    throw UsageError(e.what(), "a trace expands to at most " + std::to_string(toy::kMaxInstructions) +
                                   " instructions: write repeated work as a loop (for i in 0..n-1 … end)");
  }
}

}  // namespace flashlab::app
