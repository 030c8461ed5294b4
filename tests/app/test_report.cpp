// The one --json / --csv writer of the `flashlab` commands (app/core/report.hpp), on documents
// built here: the JSON it prints is what the streaming writer prints, and the CSV follows the
// rules of docs/cli-flags.md (the table, the repeated fields, dotted and indexed columns, lists
// in one cell, quoting, null and non-finite numbers as empty fields).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/report.hpp"

using flashlab::app::Json;
using flashlab::app::OutputFormat;
using flashlab::app::ReportOutput;
using flashlab::app::Value;

namespace {

// One document written through `fill`, as the streaming writer prints it and as recorded then
// printed by ReportOutput in `format`.
template <class Fill>
std::pair<std::string, std::string> both(OutputFormat format, Fill fill) {
  std::ostringstream streamed, recorded;
  Json direct(streamed);
  fill(direct);
  direct.finish();
  ReportOutput report(format, recorded);
  fill(report.json());
  report.finish();
  return {streamed.str(), recorded.str()};
}

void verdict(Json& j) {
  j.begin_object().key("command").value("attention fwd").key("ok").value(true);
  j.key("config").begin_object().key("seq").value(std::uint64_t(100)).key("scale").value(0.25).end_object();
  j.key("nan").null();
  j.key("error").value(std::numeric_limits<double>::quiet_NaN());
  j.key("traffic").begin_array();
  for (const char* t : {"Q", "K"})
    j.begin_object().key("tensor").value(t).key("read_bytes").value(std::int64_t(64)).end_object();
  j.end_array();
  j.key("kernels").begin_array().begin_object().key("name").value("forward, one pass").end_object().end_array();
  j.key("indices").begin_array();
  j.begin_array().value(0).value(1).end_array().begin_array().value(2).value(-1).end_array();
  j.end_array();
  j.key("note").value("said \"twice\"\nthen stopped");
  j.end_object();
}

}  // namespace

TEST_CASE("report: --json prints what the streaming writer prints", "[app][report]") {
  const auto [streamed, recorded] = both(OutputFormat::json, verdict);
  CHECK(recorded == streamed);
  CHECK_THAT(recorded, Catch::Contains("\"error\": null") && Catch::Contains("\"nan\": null"));
}

TEST_CASE("report: --csv of a verdict is one row per row of its table, the other fields repeated",
          "[app][report]") {
  const auto rows = flashlab::app::csv_rows([] {
    Value v;
    Json j(v);
    verdict(j);
    return v;
  }());
  REQUIRE(rows.size() == 3);  // header + Q + K
  const std::vector<std::string> header = {"command",     "ok",      "config.seq",       "config.scale",
                                           "nan",         "error",   "kernels.0.name",   "indices",
                                           "note",        "traffic.tensor", "traffic.read_bytes"};
  CHECK(rows[0] == header);
  CHECK(rows[1] == std::vector<std::string>{"attention fwd", "true", "100", "0.25", "", "", "forward, one pass",
                                            "0 1;2 -1", "said \"twice\"\nthen stopped", "Q", "64"});
  CHECK(rows[2][9] == "K");
  // Printed: fields with a comma, a quote or a line break are quoted, quotes doubled.
  const auto [streamed, csv] = both(OutputFormat::csv, verdict);
  (void)streamed;
  CHECK_THAT(csv, Catch::StartsWith("command,ok,config.seq,config.scale,nan,error,kernels.0.name,indices,note,"));
  CHECK_THAT(csv, Catch::Contains("attention fwd,true,100,0.25,,,\"forward, one pass\",0 1;2 -1,"
                                  "\"said \"\"twice\"\"\nthen stopped\",Q,64\n"));
}

TEST_CASE("report: --csv of an array of row objects is one row each, of an object without a table one row",
          "[app][report]") {
  Value table;
  {
    Json j(table);
    j.begin_array();
    j.begin_object().key("seq").value(64).key("bytes").value(std::uint64_t(1) << 40).end_object();
    j.begin_object().key("seq").value(128).key("extra").value("only here").key("bytes").value(7).end_object();
    j.end_array();
  }
  const auto rows = flashlab::app::csv_rows(table);
  REQUIRE(rows.size() == 3);
  CHECK(rows[0] == std::vector<std::string>{"seq", "bytes", "extra"});
  CHECK(rows[1] == std::vector<std::string>{"64", "1099511627776", ""});
  CHECK(rows[2] == std::vector<std::string>{"128", "7", "only here"});

  Value single;
  {
    Json j(single);
    j.begin_object().key("found").value(4).key("recall").value(0.5).key("sets").begin_array().end_array().end_object();
  }
  const auto one = flashlab::app::csv_rows(single);
  REQUIRE(one.size() == 2);
  CHECK(one[0] == std::vector<std::string>{"found", "recall", "sets"});
  CHECK(one[1] == std::vector<std::string>{"4", "0.5", ""});
}

namespace {

// A benchmark row as the GPU sweeps build it.
Value bench_row(const char* pass, double ms, bool with_design) {
  Value v;
  Json j(v);
  j.begin_object().key("pass").value(pass).key("N").value(std::uint64_t(1024)).key("ms").value(ms);
  j.key("design");
  if (with_design) j.value("atomic");
  else j.null();
  j.end_object();
  return v;
}

}  // namespace

TEST_CASE("report: a table printed row by row is the table printed at once", "[app][report]") {
  using flashlab::app::RowStream;
  using flashlab::app::write_csv;
  using flashlab::app::write_json;
  const Value rows[] = {bench_row("fwd", 0.25, false), bench_row("bwd", 1.5, true)};
  Value table;
  table.kind = Value::Kind::array;
  for (const auto& r : rows) table.items.push_back(r);
  for (const OutputFormat format : {OutputFormat::json, OutputFormat::csv}) {
    std::ostringstream streamed, whole;
    RowStream stream(format, streamed);
    for (const auto& r : rows) stream.row(r);
    stream.finish();
    if (format == OutputFormat::json) write_json(whole, table);
    else write_csv(whole, table);
    CHECK(streamed.str() == whole.str());
  }
  std::ostringstream csv;
  RowStream stream(OutputFormat::csv, csv);
  stream.row(rows[0]);
  CHECK(csv.str() == "pass,N,ms,design\nfwd,1024,0.25,\n");  // the header once, null empty
  // A row of other columns would misalign the table: refused, not printed.
  Value other;
  Json(other).begin_object().key("kernel").value("mma").end_object();
  CHECK_THROWS_AS(stream.row(other), std::logic_error);
  CHECK(csv.str() == "pass,N,ms,design\nfwd,1024,0.25,\n");
  // No rows: an empty JSON array, an empty CSV.
  std::ostringstream empty_json, empty_csv;
  RowStream(OutputFormat::json, empty_json).finish();
  RowStream(OutputFormat::csv, empty_csv).finish();
  CHECK(empty_json.str() == "[]\n");
  CHECK(empty_csv.str().empty());
}

TEST_CASE("report: round_to keeps the digits a measurement resolves", "[app][report]") {
  using flashlab::app::round_to;
  CHECK(round_to(0.12345678, 6) == 0.123457);
  CHECK(round_to(512.3456, 3) == 512.346);
  CHECK(round_to(1234.56, 1) == 1234.6);
  CHECK(round_to(-0.00004, 4) == -0.0);
  CHECK(std::isnan(round_to(std::numeric_limits<double>::quiet_NaN(), 3)));
  CHECK(std::isinf(round_to(std::numeric_limits<double>::infinity(), 3)));
}
