// Runs the real `flashlab` binary for end-to-end tests and captures what it printed.
#pragma once

#include <filesystem>
#include <string>

namespace flashlab::test {

/// What one `flashlab …` invocation produced.
struct CliResult {
  int exit_code = -1;
  std::string out;  ///< stdout
  std::string err;  ///< stderr
};

/// Runs `flashlab <args>` (args is a shell-quoted string) with stdin from /dev/null and
/// NO_COLOR set, in `workdir` if given, and returns exit code and both streams.
CliResult run_cli(const std::string& args, const std::string& workdir = "");

/// Checks that `flashlab <args>` is a usage error: exit 2, nothing on stdout, and on stderr
/// `error:` with `message` in it and a `hint:` (the CLI's contract for bad input).
void expect_usage_error(const std::string& args, const std::string& message);

/// Runs a GPU command (valid flags) where it may not be able to run, and checks the refusal:
/// a build without CUDA gives a usage error "built without CUDA" (exit 2); a CUDA build without
/// a usable GPU exits 1 with "needs a CUDA GPU" and a hint, stdout empty. Returns the result:
/// exit code 0 means a GPU ran it, and the caller checks the output.
CliResult run_gpu_command(const std::string& args);

/// The whole content of the file at `path` as bytes (empty when it cannot be read).
std::string read_text(const std::filesystem::path& path);

/// A fresh empty directory under the system temp dir, unique per call.
std::string fresh_temp_dir(const std::string& tag);

}  // namespace flashlab::test
