#include "flashlab/reference/memory_budget.hpp"

#include <unistd.h>

#include <cctype>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <limits>

namespace flashlab::ref {

std::optional<std::uint64_t> checked_mul(std::uint64_t a, std::uint64_t b) {
  std::uint64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

std::optional<std::uint64_t> checked_add(std::uint64_t a, std::uint64_t b) {
  std::uint64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

std::optional<std::uint64_t> checked_product(const std::vector<std::size_t>& dims) {
  std::uint64_t n = 1;
  for (const std::size_t d : dims) {
    const auto next = checked_mul(n, d);
    if (!next) return std::nullopt;
    n = *next;
  }
  return n;
}

std::optional<std::uint64_t> parse_byte_size(std::string_view text) {
  std::uint64_t value = 0;
  const char* first = text.data();
  const char* last = text.data() + text.size();
  const auto [end, ec] = std::from_chars(first, last, value);
  if (ec != std::errc() || end == first) return std::nullopt;
  std::string unit(end, last);
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (unit.size() > 1 && unit.back() == 'B') unit.pop_back();  // "GB", "GIB" → "G", "GI"
  if (!unit.empty() && unit.back() == 'I') unit.pop_back();
  int shift = 0;
  if (unit == "K") shift = 10;
  else if (unit == "M") shift = 20;
  else if (unit == "G") shift = 30;
  else if (unit == "T") shift = 40;
  else if (!unit.empty() && unit != "B") return std::nullopt;
  const auto bytes = checked_mul(value, std::uint64_t{1} << shift);
  if (!bytes || *bytes == 0) return std::nullopt;
  return bytes;
}

std::string bytes_str(std::uint64_t bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 6) {
    v /= 1024.0;
    ++u;
  }
  char buf[96];
  if (u == 0) std::snprintf(buf, sizeof buf, "%llu bytes", static_cast<unsigned long long>(bytes));
  else std::snprintf(buf, sizeof buf, "%.2f %s (%llu bytes)", v, units[u], static_cast<unsigned long long>(bytes));
  return buf;
}

std::uint64_t physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return 0;
  return checked_mul(std::uint64_t(pages), std::uint64_t(page)).value_or(0);
}

std::uint64_t default_memory_limit() {
  const std::uint64_t phys = physical_memory_bytes();
  return phys ? phys / 2 : std::uint64_t{4} << 30;
}

std::uint64_t memory_limit_from_env() {
  const char* env = std::getenv(kMemoryLimitEnv);
  if (!env || !*env) return default_memory_limit();
  const auto v = parse_byte_size(env);
  if (!v)
    throw MemoryLimitError(std::string(kMemoryLimitEnv) + "='" + env +
                           "' is not a size (e.g. 4G, 512M or a number of bytes)");
  return *v;
}

void require_within_limit(std::string_view what, std::uint64_t bytes, std::uint64_t limit, std::string_view source) {
  if (bytes <= limit) return;
  throw MemoryLimitError(std::string(what) + " needs " + bytes_str(bytes) + ", above the memory limit of " +
                         bytes_str(limit) + " (" + std::string(source) + ")");
}

}  // namespace flashlab::ref
