/// @file memory_budget.hpp
/// @brief Checked size arithmetic and the memory budget every reader and command checks first.
///
/// Sizes that a user controls (flags, `.npy` headers, mask files) are multiplied here with
/// overflow checks, and compared with one memory limit before anything is allocated: the limit
/// is `FLASHLAB_MEMORY_LIMIT` when set (bytes, or with a suffix K M G T, powers of 1024), else
/// half of the machine's physical memory. The CLI's `--memory-limit` overrides both.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace flashlab::ref {

/// The environment variable that sets the memory limit (same syntax as parse_byte_size).
inline constexpr const char* kMemoryLimitEnv = "FLASHLAB_MEMORY_LIMIT";

/// A request that does not fit the memory limit, or a size that overflows 64 bits; the message
/// names what was asked for, the bytes and the limit.
class MemoryLimitError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;  ///< constructs from the message
};

/// a·b, or nothing when the product does not fit in 64 bits.
[[nodiscard]] std::optional<std::uint64_t> checked_mul(std::uint64_t a, std::uint64_t b);
/// a + b, or nothing when the sum does not fit in 64 bits.
[[nodiscard]] std::optional<std::uint64_t> checked_add(std::uint64_t a, std::uint64_t b);
/// The product of `dims` (1 for none), or nothing when it does not fit in 64 bits.
[[nodiscard]] std::optional<std::uint64_t> checked_product(const std::vector<std::size_t>& dims);

/// Parses "123", "512K", "64M", "8G", "1T" (optionally "GiB", "GB", "B"; powers of 1024).
/// Nothing for anything else, zero, or a value above 2^64 − 1.
[[nodiscard]] std::optional<std::uint64_t> parse_byte_size(std::string_view text);
/// "4.00 GiB (4294967296 bytes)": both forms, so messages can be compared and read.
[[nodiscard]] std::string bytes_str(std::uint64_t bytes);

/// Physical memory of the machine in bytes (0 when it cannot be found).
[[nodiscard]] std::uint64_t physical_memory_bytes();
/// The limit when nothing sets one: half of physical memory (4 GiB when it cannot be found).
[[nodiscard]] std::uint64_t default_memory_limit();
/// FLASHLAB_MEMORY_LIMIT when set, else default_memory_limit(). Throws MemoryLimitError when the
/// variable is set but not a size.
[[nodiscard]] std::uint64_t memory_limit_from_env();

/// Throws MemoryLimitError unless `bytes` ≤ `limit`; `what` says what needs them, e.g.
/// "q.npy: shape (4096, 8, 64) as float64". `source` names where the limit came from.
void require_within_limit(std::string_view what, std::uint64_t bytes, std::uint64_t limit,
                          std::string_view source = "--memory-limit or FLASHLAB_MEMORY_LIMIT; default half of physical memory");

}  // namespace flashlab::ref
