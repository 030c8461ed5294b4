// The flags every command spells the same way, declared in one place: --seed, --dim, --dtype,
// the tile flags --block-m/--block-n and the output formats --json/--csv. A command adds them
// with these helpers and never spells them by hand, so one concept has one spelling, one
// default and one meaning across `flashlab`; docs/cli-flags.md tabulates them per command and
// a test checks that table against every command's --help.
#pragma once

#include "core/cli.hpp"

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace flashlab::app {

/// The one default of --seed wherever a command draws random inputs.
inline constexpr long long kDefaultSeed = 1;
/// The one default of --dim (the head dimension d) wherever a command takes one value.
inline constexpr long long kDefaultDim = 64;

/// Adds --seed (default kDefaultSeed): "seed of <what>".
void add_seed_option(po::options_description& desc, std::string_view what = "the random inputs");
/// --seed, checked (non-negative, below 2^62: the same range everywhere).
unsigned long long seed_flag(const po::variables_map& vm);

/// Adds --seed without a default, for a command that draws fresh randomness by design (the
/// lesson checker's sizes and inputs): "<what> (default: drawn anew by design; the report prints
/// the seed used)". Any 64-bit seed a report printed is accepted, to repeat that run.
void add_fresh_seed_option(po::options_description& desc, std::string_view what);
/// The --seed of add_fresh_seed_option(), when given: a whole number from 0 to 2^64 - 1, else a
/// UsageError naming --seed.
std::optional<std::uint64_t> fresh_seed_flag(const po::variables_map& vm);

/// Adds --dim, d, the head dimension, default kDefaultDim; `note` follows the text (e.g. where
/// --inputs overrides it).
void add_dim_option(po::options_description& desc, std::string_view note = {});
/// Adds --dim as a sweep list ("64,128"), for the benchmarks that time several head dims.
void add_dim_list_option(po::options_description& desc, std::string_view default_list);

/// Adds --dtype: "element type of the tensors: <choices>" (with `note` after), default
/// `default_value`. --dtype never names the arithmetic (that is --precision).
void add_dtype_option(po::options_description& desc, std::string_view choices, std::string_view default_value,
                      std::string_view note = {});
/// The --dtype value, one of `allowed`; anything else is a UsageError naming --dtype and the choices.
std::string dtype_flag(const po::variables_map& vm, std::initializer_list<std::string_view> allowed);

/// Adds --precision, the arithmetic of the run: float | double.
void add_precision_option(po::options_description& desc, std::string_view default_value = "float");

/// The names a family gives its two tile sizes, for the help text: the glossary's Br/Bc or
/// STREAM's b_q/b_k, always spelt --block-m/--block-n on the command line (Triton's BLOCK_M,
/// BLOCK_N).
struct TileNames {
  std::string_view m = "Br";      ///< the query tile's name in the family's source
  std::string_view n = "Bc";      ///< the key tile's name
  std::string_view unit = "tile"; ///< "tile" or "block"
};

/// Adds --block-m (query rows per tile) and --block-n (key rows per tile) as po::value<long long>,
/// with the given defaults, or none (the command then requires them and says so).
void add_tile_options(po::options_description& desc, std::optional<long long> default_m,
                      std::optional<long long> default_n, const TileNames& names = {});

/// What a command prints: its text tables, one JSON document, or CSV.
enum class OutputFormat { text, json, csv };

/// Adds --json and --csv (the conventions of report.hpp: JSON one object or an array of row
/// objects, CSV a header row then one row per table row).
void add_output_options(po::options_description& desc);
/// The format --json / --csv ask for; both at once is a UsageError.
OutputFormat output_format(const po::variables_map& vm);

/// A flag that was renamed: given where only its new spelling exists, parse() refuses it with
/// a hint naming the new flag.
struct RetiredFlag {
  std::string_view old_name;  ///< without dashes, e.g. "bq"
  std::string_view new_name;  ///< e.g. "block-m"
  std::string_view meaning;   ///< what the new flag is, for the hint
};

/// Every retired spelling (--bq, --bk, and --dtype where a command's arithmetic is --precision).
const std::vector<RetiredFlag>& retired_flags();

}  // namespace flashlab::app
