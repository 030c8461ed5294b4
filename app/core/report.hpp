// One writer for what the commands print as data: `--json` and `--csv` from the same calls.
// A command writes its report once through the Json builder (cli.hpp); the writer prints it as
// JSON, or flattens it into CSV, so the two formats carry the same fields with the same keys.
//
// The shapes, the same for every command (docs/cli-flags.md):
//  - JSON: one object (a verdict, a report) or an array of row objects (a table), keys stable.
//  - CSV: a header row, then one row per table row. The table is the document itself when it is
//    an array of objects; in an object it is the first member that is an array of objects, and
//    the object's other fields are repeated in front of every row (an object without such a
//    member is one row). Nested objects become dotted columns (config.seq), lists of numbers one
//    cell of space-separated values, further arrays of objects indexed columns (kernels.0.name).
#pragma once

#include "core/cli.hpp"
#include "core/shared_flags.hpp"

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace flashlab::app {

/// A JSON value held in memory (what Json records when it is given one).
struct Value {
  /// What the value holds.
  enum class Kind { null, boolean, integer, unsigned_integer, number, string, array, object };
  Kind kind = Kind::null;                              ///< which of the fields below is set
  bool boolean = false;                                ///< Kind::boolean
  std::int64_t integer = 0;                            ///< Kind::integer
  std::uint64_t unsigned_integer = 0;                  ///< Kind::unsigned_integer
  double number = 0;                                   ///< Kind::number
  std::string string;                                  ///< Kind::string
  std::vector<Value> items;                            ///< Kind::array
  std::vector<std::pair<std::string, Value>> members;  ///< Kind::object, in the order written
};

/// Prints `v` as JSON (pretty, as Json prints), ending with a newline.
void write_json(std::ostream& os, const Value& v);

/// Prints `v` as CSV by the rules above: a header row, then one row per table row. Fields are
/// quoted when they hold a comma, a quote or a line break; null is an empty field.
void write_csv(std::ostream& os, const Value& v);

/// The rows write_csv() prints, header first (for tests and for commands that check a count).
std::vector<std::vector<std::string>> csv_rows(const Value& v);

/// What a command prints with --json or --csv: fill json(), then finish() prints it in the
/// format asked for.
class ReportOutput {
 public:
  /// A report for --json or --csv (`format` must not be text).
  ReportOutput(OutputFormat format, std::ostream& os);
  /// The builder the command writes its document with.
  Json& json() { return json_; }
  /// Prints the document (JSON or CSV).
  void finish();

 private:
  OutputFormat format_;
  std::ostream& os_;
  Value doc_;
  Json json_;
};

/// A table printed row by row as its rows come (a benchmark's sweep, where a row can take
/// seconds): --json an array of row objects, --csv a header (the first row's columns) then one
/// line per row, each flushed as it is written. The same writer as ReportOutput: a row is the
/// object ReportOutput would hold as one element of its table.
class RowStream {
 public:
  /// A table for --json or --csv (`format` must not be text).
  RowStream(OutputFormat format, std::ostream& os);
  /// Prints one row, an object of scalars (and nested objects or lists, flattened as in
  /// write_csv()). In CSV every row must have the first row's columns (std::logic_error if not).
  void row(const Value& row);
  /// Ends the table: closes the JSON array; a CSV table without rows prints nothing.
  void finish();

 private:
  OutputFormat format_;
  std::ostream& os_;
  Json json_;
  std::optional<std::vector<std::string>> header_;  // CSV: the columns of the first row
};

/// `x` rounded to `decimals` places, for a measured figure whose further digits are noise (a
/// median in ms, a rate): the shortest text of the result is what the reports print.
double round_to(double x, int decimals);

}  // namespace flashlab::app
