// The attention commands' shared flags (attention_flags.hpp).
#include "attention/attention_flags.hpp"

#include <stdexcept>

namespace flashlab::app {

namespace {

// The flag that sets each AttentionProblem field.
const char* flag_of(const std::string& field) {
  if (field == "batch") return "--batch";
  if (field == "seq") return "--seq";
  if (field == "heads") return "--heads";
  if (field == "head_dim") return "--dim";
  if (field == "Br") return "--block-m";
  if (field == "Bc") return "--block-n";
  if (field == "scale") return "--scale";
  return "";
}

}  // namespace

void add_tile_options(po::options_description& d) {
  d.add_options()("block-m", po::value<long long>()->default_value(static_cast<long long>(ref::kDefaultBr)),
                  "Br, query rows per tile")(
      "block-n", po::value<long long>()->default_value(static_cast<long long>(ref::kDefaultBc)),
      "Bc, key rows per tile");
}

std::size_t size_flag(const po::variables_map& vm, const char* name) {
  const long long v = vm[name].as<long long>();
  if (v < 0)
    throw UsageError("--" + std::string(name) + " " + std::to_string(v) + " is negative",
                     "--" + std::string(name) + " takes a positive integer");
  return static_cast<std::size_t>(v);
}

void validate_flags(const ref::AttentionProblem& problem) {
  try {
    problem.validate();
  } catch (const ref::ProblemError& e) {
    const std::string what = e.what();
    const std::string flag = flag_of(e.field());
    // "attention problem: Br = 0 must be at least 1 (hint: …)" → "--block-m: Br = 0 must be …".
    const auto colon = what.find(": ");
    const auto paren = what.rfind(" (hint: ");
    const std::string body = what.substr(colon == std::string::npos ? 0 : colon + 2,
                                         paren == std::string::npos ? std::string::npos : paren - colon - 2);
    const std::string hint = paren == std::string::npos ? "" : what.substr(paren + 8, what.size() - paren - 9);
    throw UsageError((flag.empty() ? std::string() : flag + ": ") + body, hint);
  }
}

ref::Algorithm algorithm_flag(const std::string& value, bool backward) {
  try {
    return ref::parse_algorithm(value, backward);
  } catch (const std::invalid_argument& e) {
    // "algorithm 'fa9' is unknown (hint: …)" → "--variant 'fa9' is unknown", hint "…".
    std::string what = e.what();
    if (what.rfind("algorithm ", 0) == 0) what = "--variant " + what.substr(10);
    const auto paren = what.rfind(" (hint: ");
    if (paren == std::string::npos) throw UsageError(what);
    throw UsageError(what.substr(0, paren), what.substr(paren + 8, what.size() - paren - 9));
  }
}

}  // namespace flashlab::app
