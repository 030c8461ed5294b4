// The shared flags (shared_flags.hpp).
#include "core/shared_flags.hpp"

#include "core/input_checks.hpp"

#include <charconv>

namespace flashlab::app {

void add_seed_option(po::options_description& desc, std::string_view what) {
  desc.add_options()("seed", po::value<long long>()->default_value(kDefaultSeed), ("seed of " + std::string(what)).c_str());
}

unsigned long long seed_flag(const po::variables_map& vm) { return checked_seed(vm["seed"].as<long long>()); }

void add_fresh_seed_option(po::options_description& desc, std::string_view what) {
  desc.add_options()("seed", po::value<std::string>(),
                     (std::string(what) + " (default: drawn anew by design; the report prints the seed used)").c_str());
}

std::optional<std::uint64_t> fresh_seed_flag(const po::variables_map& vm) {
  if (!vm.count("seed")) return std::nullopt;
  const std::string text = vm["seed"].as<std::string>();
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  // A sign or a fraction is refused rather than wrapped.
  if (text.empty() || ec != std::errc() || end != text.data() + text.size())
    throw UsageError("--seed must be a whole number from 0 to 18446744073709551615, not '" + text + "'",
                     "give the number a report names, e.g. --seed 12345");
  return v;
}

void add_dim_option(po::options_description& desc, std::string_view note) {
  desc.add_options()("dim", po::value<long long>()->default_value(kDefaultDim),
                     ("d, head dimension" + std::string(note)).c_str());
}

void add_dim_list_option(po::options_description& desc, std::string_view default_list) {
  desc.add_options()("dim", po::value<std::string>()->default_value(std::string(default_list)),
                     "head dims d, comma separated");
}

void add_dtype_option(po::options_description& desc, std::string_view choices, std::string_view default_value,
                      std::string_view note) {
  desc.add_options()("dtype", po::value<std::string>()->default_value(std::string(default_value)),
                     ("element type of the tensors: " + std::string(choices) + std::string(note)).c_str());
}

std::string dtype_flag(const po::variables_map& vm, std::initializer_list<std::string_view> allowed) {
  const std::string value = vm["dtype"].as<std::string>();
  std::string list;
  for (const auto a : allowed) {
    if (a == value) return value;
    list += (list.empty() ? "" : ", ") + std::string(a);
  }
  throw UsageError("--dtype '" + value + "' is unknown", "choose " + list);
}

void add_precision_option(po::options_description& desc, std::string_view default_value) {
  desc.add_options()("precision", po::value<std::string>()->default_value(std::string(default_value)),
                     "arithmetic of the run: float | double");
}

void add_tile_options(po::options_description& desc, std::optional<long long> default_m,
                      std::optional<long long> default_n, const TileNames& names) {
  const auto text = [&](std::string_view name, const char* rows, const char* triton, bool required) {
    return std::string(name) + ", " + rows + " rows per " + std::string(names.unit) + " (" + triton + ")" +
           (required ? " (required)" : "");
  };
  const auto add = [&](const char* flag, std::optional<long long> def, const std::string& help) {
    if (def) desc.add_options()(flag, po::value<long long>()->default_value(*def), help.c_str());
    else desc.add_options()(flag, po::value<long long>(), help.c_str());
  };
  add("block-m", default_m, text(names.m, "query", "BLOCK_M", !default_m));
  add("block-n", default_n, text(names.n, "key", "BLOCK_N", !default_n));
}

void add_output_options(po::options_description& desc) {
  desc.add_options()("json", po::bool_switch(), "print JSON: one object, or an array of row objects")(
      "csv", po::bool_switch(), "print CSV: a header row, then one row per table row");
}

OutputFormat output_format(const po::variables_map& vm) {
  const bool json = vm.count("json") && vm["json"].as<bool>();
  const bool csv = vm.count("csv") && vm["csv"].as<bool>();
  if (json && csv) throw UsageError("--json and --csv exclude each other", "choose one output format");
  return json ? OutputFormat::json : csv ? OutputFormat::csv : OutputFormat::text;
}

const std::vector<RetiredFlag>& retired_flags() {
  static const std::vector<RetiredFlag> kRetired = {
      {"bq", "block-m", "query rows per block, STREAM's b_q"},
      {"bk", "block-n", "key rows per block, STREAM's b_k"},
      {"dtype", "precision", "the arithmetic of the run, float or double (--dtype is the tensors' element type)"},
  };
  return kRetired;
}

}  // namespace flashlab::app
