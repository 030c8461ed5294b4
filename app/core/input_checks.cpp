#include "core/input_checks.hpp"

#include <unistd.h>

#include "flashlab/reference/memory_budget.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <sstream>

namespace flashlab::app {

namespace fs = std::filesystem;

namespace {
constexpr long long kMaxSeed = 1LL << 62;
constexpr const char* kNonfiniteHint =
    "inputs must be finite numbers; --allow-nonfinite lets NaN and ±Inf through (to study the NaN hazard)";

// "[3, 0, 17]": the first offending element, so it can be found with numpy indexing.
std::string index_str(std::size_t flat, const std::vector<std::size_t>& shape) {
  std::vector<std::size_t> idx(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    const std::size_t n = std::max<std::size_t>(shape[d], 1);
    idx[d] = flat % n;
    flat /= n;
  }
  std::ostringstream s;
  s << '[';
  for (std::size_t d = 0; d < idx.size(); ++d) s << (d ? ", " : "") << idx[d];
  return s.str() + ']';
}
}  // namespace

void add_input_options(po::options_description& desc) {
  desc.add_options()
      ("allow-nonfinite", po::bool_switch(), "let NaN and ±Inf inputs through (to study the NaN hazard)")
      ("memory-limit", po::value<std::string>(),
       "largest memory a run may hold, e.g. 8G or 512M (default: FLASHLAB_MEMORY_LIMIT, else half of RAM)");
}

InputPolicy input_policy(const po::variables_map& vm) {
  InputPolicy p;
  p.allow_nonfinite = vm.count("allow-nonfinite") && vm["allow-nonfinite"].as<bool>();
  if (vm.count("memory-limit")) {
    const std::string text = vm["memory-limit"].as<std::string>();
    const auto v = ref::parse_byte_size(text);
    if (!v) throw UsageError("--memory-limit '" + text + "' is not a size", "e.g. --memory-limit 8G, 512M or 1000000 (bytes)");
    p.memory_limit = *v;
    p.limit_source = "--memory-limit";
    return p;
  }
  try {
    p.memory_limit = ref::memory_limit_from_env();
  } catch (const ref::MemoryLimitError& e) {
    throw UsageError(e.what(), "unset it or give a size such as 8G");
  }
  const char* env = std::getenv(ref::kMemoryLimitEnv);
  p.limit_source = env && *env ? std::string(ref::kMemoryLimitEnv) : "half of physical memory; --memory-limit raises it";
  return p;
}

ref::NpyHeader float_input_header(const fs::path& file, std::string_view hint) {
  ref::NpyHeader h;
  try {
    h = ref::read_npy_header(file);
  } catch (const ref::NpyError& e) {
    throw UsageError(e.what(), std::string(hint));
  }
  if (h.descr != "<f4" && h.descr != "<f8")
    throw UsageError(file.string() + ": dtype " + h.descr + " is not float32 (<f4) or float64 (<f8)",
                     "inputs are floating point: np.save(path, arr.astype(np.float32))");
  return h;
}

std::vector<double> read_float_input(const fs::path& file, const InputPolicy& policy, std::string_view hint) {
  const ref::NpyHeader h = float_input_header(file, hint);
  ref::NpyArray a;
  try {
    a = ref::read_npy(file, policy.memory_limit);
  } catch (const ref::NpyError& e) {
    throw UsageError(e.what(), "--memory-limit raises the limit; " + std::string(hint));
  }
  auto values = a.as_double();
  require_finite(values.data(), values.size(), h.shape, file.string(), policy);
  return values;
}

namespace {
template <typename T>
void require_finite_of(const T* values, std::size_t n, const std::vector<std::size_t>& shape, std::string_view source,
                       const InputPolicy& policy, std::size_t first) {
  if (policy.allow_nonfinite) return;
  for (std::size_t i = 0; i < n; ++i) {
    if (std::isfinite(values[i])) continue;
    const char* what = std::isnan(values[i]) ? "NaN" : values[i] > 0 ? "+Inf" : "-Inf";
    std::ostringstream m;
    m << source << ": element " << index_str(first + i, shape) << " (flat index " << first + i << ") is " << what;
    throw UsageError(m.str(), kNonfiniteHint);
  }
}
}  // namespace

void require_finite(const double* values, std::size_t n, const std::vector<std::size_t>& shape,
                    std::string_view source, const InputPolicy& policy, std::size_t first) {
  require_finite_of(values, n, shape, source, policy, first);
}

void require_finite(const float* values, std::size_t n, const std::vector<std::size_t>& shape,
                    std::string_view source, const InputPolicy& policy, std::size_t first) {
  require_finite_of(values, n, shape, source, policy, first);
}

std::uint64_t checked_size(std::initializer_list<std::uint64_t> factors, std::string_view what) {
  std::uint64_t n = 1;
  for (const auto f : factors) {
    const auto next = ref::checked_mul(n, f);
    if (!next) throw UsageError(std::string(what) + " does not fit in 64 bits", "use smaller sizes");
    n = *next;
  }
  return n;
}

void MemoryPlan::add(std::string_view what, std::uint64_t elements, std::uint64_t element_bytes, std::uint64_t copies) {
  const auto a = ref::checked_mul(elements, element_bytes);
  const auto b = a ? ref::checked_mul(*a, copies) : std::nullopt;
  const auto t = b ? ref::checked_add(total_, *b) : std::nullopt;
  if (!t) {
    overflow_ = true;
    items_.emplace_back(what, UINT64_MAX);
    return;
  }
  total_ = *t;
  items_.emplace_back(what, *b);
}

void MemoryPlan::require_within(const InputPolicy& policy, std::string_view request) const {
  if (!overflow_ && total_ <= policy.memory_limit) return;
  auto items = items_;
  std::stable_sort(items.begin(), items.end(), [](const auto& x, const auto& y) { return x.second > y.second; });
  std::ostringstream m, hint;
  m << request << " needs " << (overflow_ ? std::string("more than 2^64 bytes") : ref::bytes_str(total_))
    << ", above the memory limit of " << ref::bytes_str(policy.memory_limit) << " (" << policy.limit_source << ")";
  hint << "largest parts:";
  for (std::size_t i = 0; i < std::min<std::size_t>(items.size(), 3); ++i)
    hint << (i ? "; " : " ") << items[i].first << " "
         << (items[i].second == UINT64_MAX ? std::string("> 2^64 bytes") : ref::bytes_str(items[i].second));
  hint << ". Use smaller sizes, or raise --memory-limit if the machine has the memory";
  throw UsageError(m.str(), hint.str());
}

unsigned long long checked_seed(long long value) {
  require_range("seed", value, 0, kMaxSeed);
  return static_cast<unsigned long long>(value);
}

std::optional<double> checked_scale(const po::variables_map& vm) {
  if (!vm.count("scale")) return std::nullopt;
  const double s = vm["scale"].as<double>();
  if (!(s > 0.0) || !std::isfinite(s))
    throw UsageError("--scale must be a positive finite number", "e.g. --scale 0.125 (default 1/sqrt(d))");
  return s;
}

double max_row_norm(const double* values, std::size_t rows, std::size_t cols) {
  double worst = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    double sum = 0;
    for (std::size_t c = 0; c < cols; ++c) sum += values[r * cols + c] * values[r * cols + c];
    worst = std::max(worst, std::sqrt(sum));
  }
  return worst;
}

std::string Tolerance::str() const {
  std::ostringstream s;
  s.precision(2);
  s << value;
  if (!scaled()) return s.str();
  s << " (" << base << " scaled by";
  if (logit_bound > kCalibratedLogitBound) s << " the logit bound L = " << logit_bound << " / " << kCalibratedLogitBound;
  if (logit_bound > kCalibratedLogitBound && cancellation > kCalibratedCancellation) s << " and";
  if (cancellation > kCalibratedCancellation)
    s << " the gradients' cancellation C = " << cancellation << " / " << kCalibratedCancellation;
  s << ")";
  if (capped)
    s << ", capped at " << kToleranceCeiling
      << ": the check cannot vouch for inputs this ill-conditioned (scale the inputs down)";
  return s.str();
}

std::filesystem::path prepare_save_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path path(dir);
  const std::string flag = "--save '" + dir + "'";
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (fs::exists(st) && !fs::is_directory(st))
    throw UsageError(flag + ": is a file, not a directory", "give a directory: the outputs are written inside it");
  if (!fs::exists(st)) {
    fs::create_directories(path, ec);
    if (ec) {
      const std::string why = ec == std::errc::permission_denied ? "permission denied"
                              : ec == std::errc::not_a_directory ? "a part of the path is a file"
                                                                 : ec.message();
      throw UsageError(flag + ": cannot create the directory (" + why + ")",
                       "give a directory you can write to, e.g. --save out");
    }
  }
  if (::access(path.c_str(), W_OK | X_OK) != 0)
    throw UsageError(flag + ": the directory is not writable (permission denied)",
                     "give a directory you can write to, e.g. --save out");
  return path;
}

Tolerance conditioned_tolerance(double base, double logit_bound, double cancellation) {
  Tolerance t;
  t.base = base;
  t.logit_bound = logit_bound;
  t.cancellation = cancellation;
  const double raised = base * std::max(1.0, logit_bound / kCalibratedLogitBound) *
                        std::max(1.0, cancellation / kCalibratedCancellation);
  t.capped = !std::isfinite(raised) || raised > kToleranceCeiling;
  t.value = t.capped ? std::max(base, kToleranceCeiling) : std::max(base, raised);
  return t;
}

}  // namespace flashlab::app
