// The bounded whole-file reader (input_file.hpp). POSIX calls rather than std::ifstream: the
// stream library can neither open a FIFO without blocking until a writer comes nor wait on a pipe
// with a deadline, and both are needed so that no input can hang a command.
#include "flashlab/reference/input_file.hpp"

#include <cerrno>
#include <cstring>
#include <string_view>

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

namespace flashlab::ref {

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void fail(const std::string& path, const std::string& what, const std::string& reason,
                       const std::string& hint) {
  throw InputFileError(path, what, reason, hint);
}

// Closes the descriptor on every path out, standard input excepted.
struct Fd {
  int fd = -1;
  bool owned = true;
  ~Fd() {
    if (fd >= 0 && owned) ::close(fd);
  }
};

std::string open_error(const std::string& path, int err) {
  switch (err) {
    case ENOENT: {
      struct stat ls {};
      if (::lstat(path.c_str(), &ls) == 0 && S_ISLNK(ls.st_mode)) return "a symbolic link to a file that does not exist";
      return "no such file";
    }
    case ELOOP: return "a loop of symbolic links";
    case EACCES: return "permission denied";
    case ENOTDIR: return "a part of the path is not a directory";
    case ENAMETOOLONG: return "the path is too long";
    case ENXIO: return "a socket or a device with nothing behind it";
    default: return std::strerror(err);
  }
}

[[noreturn]] void no_end(const std::string& path, const std::string& what, const InputLimits& limits) {
  fail(path, what,
       "no end of data within " + std::to_string(limits.max_wait.count() / 1000) + " s (a pipe or terminal still open?)",
       "close the writing end of the pipe (Ctrl-D on a terminal), or save the " + what + " to a file first");
}

}  // namespace

std::string input_cap_str(std::uint64_t bytes) {
  if (bytes >= (1u << 20) && bytes % (1u << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= 1024 && bytes % 1024 == 0) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " bytes";
}

void require_regular_file(const std::string& path, const std::string& what) {
  Fd in;
  in.fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (in.fd < 0) {
    const int err = errno;
    fail(path, what, open_error(path, err),
         err == EACCES ? "check the file's permissions" : "check the path");
  }
  struct stat st {};
  if (::fstat(in.fd, &st) != 0) fail(path, what, std::strerror(errno), "check the path");
  if (S_ISREG(st.st_mode)) return;
  const char* kind = S_ISDIR(st.st_mode)    ? "is a directory"
                     : S_ISFIFO(st.st_mode) ? "is a pipe (FIFO), not a regular file"
                     : S_ISCHR(st.st_mode)  ? "is a character device, not a regular file"
                     : S_ISBLK(st.st_mode)  ? "is a block device, not a regular file"
                                            : "is not a regular file";
  fail(path, what, kind, S_ISDIR(st.st_mode) ? "give the path of a file inside it" : "save the " + what + " to a file first");
}

std::string read_input_file(const std::string& path, const std::string& what, const InputLimits& limits) {
  const std::string cap = input_cap_str(limits.max_bytes);
  Fd in;
  if (path == "-") {
    in.fd = STDIN_FILENO;
    in.owned = false;
  } else {
    // O_NONBLOCK: opening a FIFO without a writer must not wait; reads are paced by poll below.
    in.fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (in.fd < 0) {
      const int err = errno;
      fail(path, what, open_error(path, err),
           err == EACCES ? "check the file's permissions" : "check the path (\"-\" reads standard input)");
    }
  }
  struct stat st {};
  if (::fstat(in.fd, &st) != 0) fail(path, what, std::strerror(errno), "check the path");
  if (S_ISDIR(st.st_mode)) fail(path, what, "is a directory", "give the path of a file inside it");
  if (S_ISSOCK(st.st_mode)) fail(path, what, "is a socket, not a file", "give the path of a regular file, a pipe or -");
  const bool regular = S_ISREG(st.st_mode);
  if (regular && static_cast<std::uint64_t>(st.st_size) > limits.max_bytes)
    fail(path, what,
         "is " + std::to_string(static_cast<std::uint64_t>(st.st_size)) + " bytes, over the cap of " + cap + " for a " +
             what,
         "a " + what + " of this size is not one flashlab could use: check that this is the file you meant");

  std::string out;
  if (regular) out.reserve(static_cast<std::size_t>(st.st_size));
  const auto deadline = Clock::now() + limits.max_wait;
  char buf[1 << 16];
  for (;;) {
    // Standard input keeps its blocking mode (it is shared with the caller's terminal or pipe), so
    // it is read only once poll says data or its end is there; what we opened ourselves is
    // non-blocking and is read first.
    if (!in.owned && !regular) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      pollfd p{in.fd, POLLIN, 0};
      if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) == 0) no_end(path, what, limits);
    }
    const ssize_t got = ::read(in.fd, buf, sizeof buf);
    if (got > 0) {
      if (out.size() + static_cast<std::uint64_t>(got) > limits.max_bytes)
        fail(path, what, "holds more than the cap of " + cap + " for a " + what + " (read stopped there)",
             "a " + what + " of this size is not one flashlab could use; is this a device or an endless pipe?");
      out.append(buf, static_cast<std::size_t>(got));
      continue;
    }
    if (got == 0) break;  // end of file; a FIFO whose writers are gone (or never came) reads as ended
    const int err = errno;
    if (err == EINTR) continue;
    if (err != EAGAIN && err != EWOULDBLOCK) fail(path, what, std::string("read failed: ") + std::strerror(err), "check the file");
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) no_end(path, what, limits);
    pollfd p{in.fd, POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(left));
  }
  return out;
}

}  // namespace flashlab::ref
