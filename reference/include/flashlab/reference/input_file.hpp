/// @file input_file.hpp
/// @brief The one reader of whole input files (traces, machine files, lesson answers, block
///        masks, `.npy` tensors): bounded in bytes and in time whatever the file is.
///
/// A path may name a regular file, a pipe or FIFO, a character device (`/dev/stdin`,
/// `/dev/zero`), or `-` for standard input. A regular file is refused by its size before a byte
/// is read; anything else is read in chunks until end of file, the byte cap or the time limit,
/// whichever comes first, so `/dev/zero` or a FIFO nobody writes to ends in a message, never a
/// hang or an allocation past the cap. Every failure is an InputFileError whose message names the
/// path and the reason (no such file, a dangling or looping symbolic link, permission, a
/// directory, a socket, over the cap with the cap stated, no end of data within the time limit),
/// and whose hint() says what to do.
#pragma once

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

namespace flashlab::ref {

/// A file that cannot be read as a whole input; what() names the path and the reason.
class InputFileError : public std::runtime_error {
 public:
  /// The message is "<what> '<path>': <reason>"; `hint` says what to do.
  InputFileError(const std::string& path, const std::string& what, std::string reason, std::string hint)
      : std::runtime_error(what + " '" + path + "': " + reason), reason_(std::move(reason)), hint_(std::move(hint)) {}
  /// The reason alone ("no such file", "is a pipe (FIFO), not a regular file", …), for readers
  /// whose messages put the path first themselves.
  [[nodiscard]] const std::string& reason() const { return reason_; }
  /// What to do about it, in one sentence.
  [[nodiscard]] const std::string& hint() const { return hint_; }

 private:
  std::string reason_;
  std::string hint_;
};

/// How much a reader takes before it gives up.
struct InputLimits {
  std::uint64_t max_bytes = std::uint64_t{64} << 20;  ///< larger inputs are refused, the cap named
  std::chrono::milliseconds max_wait{10000};         ///< a pipe with no end of data by then is refused
};

/// Reads the whole input at `path` ("-" is standard input) within `limits`. `what` names the
/// input in messages ("trace", "machine file", "block mask"). Throws InputFileError.
std::string read_input_file(const std::string& path, const std::string& what, const InputLimits& limits = {});

/// Checks that `path` names a regular file that can be opened for reading (inputs that are
/// seeked, such as `.npy` tensors); throws InputFileError naming the reason otherwise (no such
/// file, a dangling or looping symbolic link, permission, a directory, a FIFO, a device, a socket).
void require_regular_file(const std::string& path, const std::string& what);

/// "64 MiB" for a power-of-two number of mebibytes, else the bytes with their unit.
std::string input_cap_str(std::uint64_t bytes);

}  // namespace flashlab::ref
