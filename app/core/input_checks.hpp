// One validation per concept, shared by `attention`, `mta` and `stream`: which input dtypes are
// accepted, what happens to NaN/±Inf, the memory limit and the sizes a run will hold, --seed,
// --scale, and the self-check tolerance scaled by the problem's conditioning. Each rule lives
// here once; the commands call it with their own file names and flags.
#pragma once

#include "core/cli.hpp"

#include "flashlab/reference/npy.hpp"

#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace flashlab::app {

/// What a command lets through, from --allow-nonfinite and --memory-limit (or the environment).
struct InputPolicy {
  bool allow_nonfinite = false;   ///< NaN/±Inf inputs pass (to study the NaN hazard)
  std::uint64_t memory_limit = 0; ///< bytes a run may hold
  std::string limit_source;       ///< where the limit came from, for messages
};

/// Adds --allow-nonfinite and --memory-limit to a command's options.
void add_input_options(po::options_description& desc);
/// The policy from the parsed flags: --memory-limit, else FLASHLAB_MEMORY_LIMIT, else half of
/// physical memory. Throws UsageError for a limit that is not a size.
InputPolicy input_policy(const po::variables_map& vm);

/// Header of an input tensor file, checked (format, sizes against the file) but not read; only
/// float32 and float64 pass (one dtype rule for every command). `hint` says what the command wants.
ref::NpyHeader float_input_header(const std::filesystem::path& file, std::string_view hint);
/// Reads an input tensor as float64 under the memory limit, then applies the finiteness policy.
std::vector<double> read_float_input(const std::filesystem::path& file, const InputPolicy& policy,
                                     std::string_view hint);
/// Throws UsageError naming `source` and the first NaN/±Inf (as an index into `shape`) unless the
/// policy allows non-finite values. `values` are elements first … first + n − 1 of the array (a
/// piece of a file read in chunks).
void require_finite(const double* values, std::size_t n, const std::vector<std::size_t>& shape,
                    std::string_view source, const InputPolicy& policy, std::size_t first = 0);
/// The same for float32 values.
void require_finite(const float* values, std::size_t n, const std::vector<std::size_t>& shape,
                    std::string_view source, const InputPolicy& policy, std::size_t first = 0);

/// `a·b·…` for sizes a user controls; UsageError naming `what` when the product overflows 64 bits.
std::uint64_t checked_size(std::initializer_list<std::uint64_t> factors, std::string_view what);

/// The memory a run will hold, summed item by item before anything is allocated.
class MemoryPlan {
 public:
  /// Adds `copies` buffers of `elements` elements of `element_bytes` each (checked arithmetic).
  void add(std::string_view what, std::uint64_t elements, std::uint64_t element_bytes, std::uint64_t copies = 1);
  /// The total in bytes (UINT64_MAX after an overflow).
  [[nodiscard]] std::uint64_t bytes() const { return overflow_ ? UINT64_MAX : total_; }
  /// Throws UsageError naming `request`, the total, its largest items and the limit when the
  /// total is above the policy's limit.
  void require_within(const InputPolicy& policy, std::string_view request) const;

 private:
  std::vector<std::pair<std::string, std::uint64_t>> items_;
  std::uint64_t total_ = 0;
  bool overflow_ = false;
};

/// --seed as a non-negative integer below 2^62 (the same range for every command).
unsigned long long checked_seed(long long value);
/// --scale when given: a positive finite number, else UsageError; nothing when absent.
std::optional<double> checked_scale(const po::variables_map& vm);

/// The `--save DIR` directory: created when missing; a UsageError (exit 2) naming the flag, the
/// path and the reason (a file is in the way, a parent is not a directory, permission denied)
/// with a hint, instead of the library's raw filesystem message.
std::filesystem::path prepare_save_dir(const std::string& dir);

/// Largest Euclidean norm of the rows of a row-major `rows × cols` block of `values`.
double max_row_norm(const double* values, std::size_t rows, std::size_t cols);

/// Logit bound up to which the fixed self-check tolerances hold (each command's default inputs
/// stay far below it).
inline constexpr double kCalibratedLogitBound = 64.0;
/// Cancellation ratio up to which they hold: ordinary random inputs give 60–900 (attention bwd).
inline constexpr double kCalibratedCancellation = 1024.0;
/// The loosest relative tolerance a self-check uses. Past it a check could pass results that agree
/// in no digit, so the tolerance stops growing there and the check says it cannot vouch for
/// inputs this ill-conditioned.
inline constexpr double kToleranceCeiling = 1e-2;

/// A self-check tolerance scaled by conditioning. A softmax weight inherits the absolute rounding
/// error of its logit, u·|s|, as a relative error, so two correct computations drift apart in
/// proportion to the largest logit: the fixed tolerance holds up to |s| ≤ 64 and grows as
/// base·L/64 beyond (L bounds |s|, e.g. scale·max‖q_i‖·max‖k_j‖ by Cauchy–Schwarz). A result
/// summed from terms C times larger than itself (a gradient through dS = P∘(dP − D) when P is
/// nearly one-hot) loses C in relative accuracy: above C = 1024 the tolerance grows by C/1024 too.
struct Tolerance {
  double value = 0;         ///< the tolerance used
  double base = 0;          ///< the fixed tolerance for well-conditioned inputs
  double logit_bound = 0;   ///< L
  double cancellation = 1;  ///< C, the size of the summed terms over the size of the result
  bool capped = false;      ///< the conditioning asked for more than kToleranceCeiling
  /// True when the conditioning raised the tolerance above the base.
  [[nodiscard]] bool scaled() const { return value > base || capped; }
  /// "1e-12", or "1.7e-09 (1e-12 scaled by the logit bound L = 1.1e+05 / 64)".
  [[nodiscard]] std::string str() const;
};
/// base·max(1, L/64)·max(1, C/1024), at most kToleranceCeiling (then `capped`, also when that
/// product is not finite).
Tolerance conditioned_tolerance(double base, double logit_bound, double cancellation = 1.0);

}  // namespace flashlab::app
