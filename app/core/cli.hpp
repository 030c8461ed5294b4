// Shared plumbing for the `flashlab` subcommands: argument parsing helpers, the mapping from
// exceptions to `error: …` lines and exit codes, and a tiny JSON writer. No algorithm code.
#pragma once

#include <boost/program_options.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <iosfwd>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace flashlab::app {

namespace po = boost::program_options;

/// Exit codes shared by every subcommand.
enum Exit : int {
  kOk = 0,          ///< ran (and, for checks, passed)
  kFailed = 1,      ///< ran but a check failed / answer wrong
  kUsage = 2,       ///< bad command line, or the input does not assemble/parse
  kRuntimeFault = 3 ///< the program ran and faulted (toy machine runtime fault)
};

/// A bad command line: printed as `error: <what>` plus `hint: <hint>`, exit 2.
class UsageError : public std::runtime_error {
 public:
  UsageError(const std::string& what, std::string hint = {})
      : std::runtime_error(what), hint_(std::move(hint)) {}
  [[nodiscard]] const std::string& hint() const { return hint_; }

 private:
  std::string hint_;
};

/// Arguments after the subcommand name (argv[2..]).
using Args = std::vector<std::string>;

/// Parses `args` against `desc` (+ positionals), turning Boost's errors into UsageError that
/// name the flag. Adds nothing itself: every command declares its own `--help`.
po::variables_map parse(const Args& args, const po::options_description& desc,
                        const po::positional_options_description* positional = nullptr);

/// What a `flashlab CMD SUBJECT [options]` command (bench, traffic) accepts as its subject.
struct SubjectCommand {
  std::string_view command;  ///< e.g. "traffic"
  std::string_view verb;     ///< e.g. "model", for "missing what to model: attention"
  std::string_view subject;  ///< the one subject there is so far, e.g. "attention"
  std::string_view example;  ///< a working command line, used as the hint
  std::string_view usage;    ///< the usage line for --help
  std::string_view summary;  ///< the summary for --help
};

/// Parses `args` for a subject command: the subject as the first positional, then `desc`.
/// Returns nothing after printing --help; throws UsageError for a missing or unknown subject.
std::optional<po::variables_map> parse_subject_command(const Args& args, const po::options_description& desc,
                                                       const SubjectCommand& cmd);

/// Prints `Usage: flashlab <usage>`, the summary and the option table.
void print_help(std::ostream& os, std::string_view usage, std::string_view summary,
                const po::options_description& desc);

/// Runs a subcommand body, mapping exceptions to `error: …` on stderr and an exit code:
/// UsageError and po errors → 2; anything else → 1. The command's name prefixes nothing:
/// messages already name the flag or the file:line:col.
int guarded(std::string_view command, const std::function<int()>& body);

/// Checks that an integer flag lies in [lo, hi]; throws UsageError naming the flag otherwise.
void require_range(std::string_view flag, long long value, long long lo, long long hi);

/// A comma-separated list flag ("1024,2048" → {1024, 2048}), each item an integer in [lo, hi];
/// anything else (an empty item, a trailing comma, text) is a UsageError naming the flag and
/// the item, with `example` in the hint.
std::vector<long long> integer_list(std::string_view flag, const std::string& text, long long lo, long long hi,
                                    std::string_view example);

/// Reads a whole input (a file, a pipe, a device, or "-" for standard input), bounded in bytes
/// (`max_bytes`, stated in the message when passed) and in time (10 s for a pipe to end).
/// Failures are UsageError naming `label` (the flag or positional, e.g. "--machine-file"), the
/// path and the reason, with a hint.
std::string read_input(const std::string& path, std::string_view label, std::string_view what,
                       std::uint64_t max_bytes = std::uint64_t{64} << 20);

struct Value;

/// Minimal JSON writer (objects, arrays, strings, numbers, booleans, null): streaming to an
/// ostream, or recording into a Value (report.hpp), which --json and --csv then print.
/// Non-finite doubles are written as null (JSON has no NaN/Inf).
class Json {
 public:
  explicit Json(std::ostream& os, bool pretty = true) : os_(&os), pretty_(pretty) {}
  /// Records the document into `into` instead of printing it.
  explicit Json(Value& into) : root_(&into) {}
  Json& begin_object();
  Json& end_object();
  Json& begin_array();
  Json& end_array();
  Json& key(std::string_view k);
  Json& value(std::string_view s);
  Json& value(const char* s) { return value(std::string_view(s)); }
  Json& value(const std::string& s) { return value(std::string_view(s)); }
  Json& value(double d);
  Json& value(std::int64_t i);
  Json& value(std::uint64_t u);
  Json& value(int i) { return value(static_cast<std::int64_t>(i)); }
  Json& value(bool b);
  Json& null();
  /// Ends the document with a newline (nothing when recording).
  void finish();

 private:
  void separator();
  void indent();
  Value& place(Value v);  // recording: puts v where the document is now, returns it
  std::ostream* os_ = nullptr;
  bool pretty_ = true;
  std::vector<bool> first_;  // per open container: no element written yet
  bool after_key_ = false;
  Value* root_ = nullptr;
  std::vector<Value*> open_;  // recording: the containers open now
  std::string key_;           // recording: the key of the next member
};

/// Escapes a string for JSON.
std::string json_escape(std::string_view s);

}  // namespace flashlab::app
