// The flags every command shares (app/core/shared_flags.hpp, docs/cli-flags.md), end to end:
// each command takes the one spelling of the tile flags, --seed, --dim and --dtype; the retired
// spellings are refused with a hint naming the new flag; --seed defaults to 1 and --dim to 64
// everywhere; and --json / --csv print the same document: JSON that parses, CSV with a header
// and one row per row of the table the text output shows.
#include <catch2/catch.hpp>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "run_cli.hpp"

using flashlab::test::expect_usage_error;
using flashlab::test::fresh_temp_dir;
using flashlab::test::run_cli;
using flashlab::test::run_gpu_command;

namespace {

// A strict JSON reader, enough to say whether a document parses and to count what is in it.
class JsonCheck {
 public:
  explicit JsonCheck(const std::string& text) : s_(text) {}
  /// True when the text is exactly one JSON value (whitespace around it allowed).
  bool valid() {
    try {
      skip();
      value(0);
      skip();
      return i_ == s_.size();
    } catch (const std::exception&) {
      return false;
    }
  }
  /// The top-level value's kind ('{' or '[') and, for an array, its length.
  char top = 0;
  std::size_t top_length = 0;

 private:
  void skip() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  char peek() {
    if (i_ >= s_.size()) throw std::runtime_error("end");
    return s_[i_];
  }
  void expect(char c) {
    if (peek() != c) throw std::runtime_error("unexpected");
    ++i_;
  }
  void literal(const char* word) {
    for (const char* p = word; *p; ++p) expect(*p);
  }
  void string() {
    expect('"');
    while (peek() != '"') {
      if (static_cast<unsigned char>(s_[i_]) < 0x20) throw std::runtime_error("control");
      if (s_[i_] == '\\') ++i_;
      ++i_;
    }
    ++i_;
  }
  void number() {
    const std::size_t start = i_;
    if (peek() == '-') ++i_;
    while (i_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[i_])) || s_[i_] == '.' || s_[i_] == 'e' ||
                              s_[i_] == 'E' || s_[i_] == '+' || s_[i_] == '-'))
      ++i_;
    std::size_t used = 0;
    (void)std::stod(s_.substr(start, i_ - start), &used);
    if (used != i_ - start) throw std::runtime_error("number");
  }
  void value(int depth) {
    skip();
    const char c = peek();
    if (c == '{' || c == '[') {
      if (depth == 0) top = c;
      ++i_;
      skip();
      const char close = c == '{' ? '}' : ']';
      std::size_t n = 0;
      if (peek() != close) {
        while (true) {
          skip();
          if (c == '{') {
            string();
            skip();
            expect(':');
          }
          value(depth + 1);
          ++n;
          skip();
          if (peek() == ',') {
            ++i_;
            continue;
          }
          break;
        }
      }
      expect(close);
      if (depth == 0 && c == '[') top_length = n;
    } else if (c == '"') {
      string();
    } else if (c == 't') {
      literal("true");
    } else if (c == 'f') {
      literal("false");
    } else if (c == 'n') {
      literal("null");
    } else {
      number();
    }
  }
  const std::string& s_;
  std::size_t i_ = 0;
};

// CSV rows, fields split at commas outside double quotes ("" inside quotes is one quote).
std::vector<std::vector<std::string>> csv_rows(const std::string& text) {
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> row;
  std::string field;
  bool quoted = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"') field += '"', ++i;
      else if (c == '"') quoted = false;
      else field += c;
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      row.push_back(field);
      field.clear();
    } else if (c == '\n') {
      row.push_back(field);
      field.clear();
      rows.push_back(row);
      row.clear();
    } else {
      field += c;
    }
  }
  return rows;
}

// `flashlab <args> --json` parses; `--csv` has a header and `rows` rows of the header's width;
// both exit as the text run does. Returns the CSV rows (header first).
std::vector<std::vector<std::string>> check_formats(const std::string& args, std::size_t rows, int exit_code = 0,
                                                    const std::string& workdir = "") {
  INFO("flashlab " << args);
  const auto json = run_cli(args + " --json", workdir);
  CHECK(json.exit_code == exit_code);
  JsonCheck check(json.out);
  CHECK(check.valid());
  const auto csv = run_cli(args + " --csv", workdir);
  CHECK(csv.exit_code == exit_code);
  const auto table = csv_rows(csv.out);
  REQUIRE(!table.empty());
  CHECK(table.size() == rows + 1);
  for (const auto& r : table) CHECK(r.size() == table.front().size());
  if (check.top == '[') CHECK(check.top_length == rows);
  // The same run in text has no JSON braces or CSV header on stdout.
  const auto text = run_cli(args, workdir);
  CHECK(text.exit_code == exit_code);
  CHECK(text.out.find(csv.out.substr(0, csv.out.find('\n'))) == std::string::npos);
  return table;
}

std::size_t column(const std::vector<std::string>& header, const std::string& name) {
  for (std::size_t i = 0; i < header.size(); ++i)
    if (header[i] == name) return i;
  FAIL("no column " << name);
  return 0;
}

std::string source_dir() { return FLASHLAB_SOURCE_DIR; }

}  // namespace

TEST_CASE("shared flags: every family takes --block-m/--block-n, --seed and --dim", "[cli][flags]") {
  const std::string tmp = fresh_temp_dir("shared_flags");
  const std::string trace = source_dir() + "/toymachine/traces/p1_c00.trace";
  const std::vector<std::string> ok = {
      "attention fwd --seq 40 --dim 8 --block-m 16 --block-n 8 --seed 3",
      "traffic attention --seq 64,128 --dim 16 --block-m 16 --block-n 32",
      "traffic levels --block-m 64 --block-n 32",
      "traffic mta --pass fwd --seq 128 --dim 16 --block 32",
      "traffic ring --gpus 2 --seq 64 --dim 16",
      "mta fwd --seq 32 --dim 8 --block 16 --seed 3",
      "stream estimate --seq 64 --dim 8 --block-m 16 --block-n 8 --k 2 --seed 3",
      "stream apply --seq 64 --dim 8 --block-m 16 --block-n 16 --k 2 --precision double",
      "stream needles --seq 2048 --dim 16 --block-m 64 --block-n 64 --k 4 --needle-blocks 2 --needles 2 --seed 3",
      "stream fidelity --seq 256 --dim 8 --block-m 32 --block-n 32 --k 2 --workload random --seed 3",
      "stream trace --store " + tmp + "/store --seq 128 --dim 8 --block-m 16 --block-n 16 --k 2 --seed 3",
      "run " + trace + " --machine matmul3 --seed 3",
  };
  for (const auto& args : ok) {
    INFO("flashlab " << args);
    const auto r = run_cli(args);
    CHECK(r.exit_code == 0);
    CHECK(r.err.find("error:") == std::string::npos);
  }
  std::filesystem::remove_all(tmp);
}

TEST_CASE("shared flags: the retired spellings are refused with a hint naming the new flag", "[cli][flags]") {
  const std::string tmp = fresh_temp_dir("retired_flags");
  const std::vector<std::string> commands = {
      "stream estimate --seq 64 --dim 8 --k 2",
      "stream estimate --device cuda --seq 64 --dim 8 --k 2",
      "stream needles --seq 2048 --dim 16 --k 4",
      "stream fidelity --seq 256 --dim 8 --k 2",
      "stream trace --store " + tmp + "/s --seq 128 --dim 8 --k 2",
      "traffic stream --device cuda",
      "bench stream",
  };
  for (const auto& c : commands) {
    expect_usage_error(c + " --bq 16 --block-n 16", "--bq is not a flag of this command; use --block-m");
    expect_usage_error(c + " --block-m 16 --bk=16", "--bk is not a flag of this command; use --block-n");
    const auto r = run_cli(c + " --bq 16 --block-n 16");
    CHECK_THAT(r.err, Catch::Contains("hint: --block-m is query rows per block, STREAM's b_q"));
  }
  // STREAM's arithmetic is --precision, as attention's; its --dtype was that.
  expect_usage_error("stream estimate --seq 64 --dim 8 --block-m 16 --block-n 16 --k 2 --dtype fp64",
                     "--dtype is not a flag of this command; use --precision");
  // The file output of traffic stream is --append-csv; --csv prints to standard output everywhere.
  const auto help = run_cli("traffic stream --help");
  CHECK_THAT(help.out, Catch::Contains("--append-csv arg"));
  std::filesystem::remove_all(tmp);
}

TEST_CASE("shared flags: an abbreviated flag is refused, never taken for the flag it starts", "[cli][flags]") {
  // Boost would read `--dev cuda` as `--device cuda` (or as any one flag it is the start of).
  expect_usage_error("mta fwd --seq 32 --dev cuda", "unrecognised option '--dev'");
  expect_usage_error("attention fwd --seq 16 --dim 8 --dev cpu", "unrecognised option '--dev'");
  expect_usage_error("stream estimate --seq 64 --dim 8 --block-m 16 --block-n 16 --k 2 --see 3",
                     "unrecognised option '--see'");
  expect_usage_error("bench attention --pa fwd", "unrecognised option '--pa'");
}

TEST_CASE("shared flags: --seed defaults to 1 and --dim to 64 wherever they exist", "[cli][flags]") {
  const std::vector<std::pair<std::string, std::string>> runs = {
      {"mta fwd --seq 32", "mta fwd --seq 32 --seed 1 --dim 64"},
      {"stream estimate --seq 256 --block-m 16 --block-n 16 --k 3",
       "stream estimate --seq 256 --block-m 16 --block-n 16 --k 3 --seed 1 --dim 64"},
      {"attention fwd --seq 40 --dim 8", "attention fwd --seq 40 --dim 8 --seed 1"},
      {"stream fidelity --seq 256 --block-m 32 --block-n 32 --k 2 --workload random",
       "stream fidelity --seq 256 --block-m 32 --block-n 32 --k 2 --workload random --seed 1 --dim 64"},
  };
  for (const auto& [implicit, explicit_] : runs) {
    INFO("flashlab " << implicit);
    const auto a = run_cli(implicit + " --csv"), b = run_cli(explicit_ + " --csv");
    REQUIRE(a.exit_code == 0);
    auto ra = csv_rows(a.out), rb = csv_rows(b.out);
    REQUIRE(ra.size() == rb.size());
    // Timings differ between runs; every other field is the same.
    for (std::size_t i = 1; i < ra.size(); ++i)
      for (std::size_t c = 0; c < ra[0].size(); ++c)
        if (ra[0][c] != "seconds") CHECK(ra[i][c] == rb[i][c]);
  }
  // The seed matters: another seed gives other inputs.
  const auto s1 = run_cli("mta fwd --seq 32 --csv"), s2 = run_cli("mta fwd --seq 32 --seed 2 --csv");
  const auto e1 = csv_rows(s1.out), e2 = csv_rows(s2.out);
  CHECK(e1[1][column(e1[0], "errors.O")] != e2[1][column(e2[0], "errors.O")]);
  CHECK(e1[1][column(e1[0], "shape.dim")] == "64");
  // The help says so.
  for (const char* cmd : {"mta fwd", "stream estimate", "stream needles", "stream fidelity", "traffic ring",
                          "traffic attention", "traffic mta", "run"}) {
    INFO("flashlab " << cmd << " --help");
    const auto h = run_cli(std::string(cmd) + " --help");
    if (h.out.find("--seed") != std::string::npos) CHECK_THAT(h.out, Catch::Contains("--seed arg (=1)"));
    if (h.out.find("--dim") != std::string::npos) CHECK_THAT(h.out, Catch::Contains("--dim arg (=64)"));
  }
}

TEST_CASE("shared flags: the lesson checker draws a fresh seed by design and prints it", "[cli][flags][lesson]") {
  // The help, its lines joined (Boost wraps descriptions).
  std::string help;
  std::istringstream words(run_cli("lesson --help").out);
  for (std::string w; words >> w;) help += w + " ";
  CHECK_THAT(help, Catch::Contains("drawn anew by design") && Catch::Contains("prints the seed used"));
  const std::string tmp = fresh_temp_dir("lesson_seed");
  ::setenv("XDG_STATE_HOME", tmp.c_str(), 1);
  const std::string trace = source_dir() + "/toymachine/traces/p1_c00.trace";
  const auto a = run_cli("lesson check 1 '" + trace + "' --csv");
  REQUIRE(a.exit_code == 0);
  const auto rows = csv_rows(a.out);
  const std::string seed = rows[1][column(rows[0], "seed")];
  CHECK(!seed.empty());
  const auto again = run_cli("lesson check 1 '" + trace + "' --csv --seed " + seed);
  CHECK(csv_rows(again.out)[1][column(rows[0], "seed")] == seed);
  // The text report names it too (on stderr: stdout is the same from run to run).
  const auto text = run_cli("lesson check 1 '" + trace + "' --seed " + seed);
  CHECK_THAT(text.err, Catch::Contains("seed " + seed + " (--seed " + seed + " repeats this check)"));
  // The answer's verdict: one row per answered quantity (here the message holds a comma: quoted).
  check_formats("lesson answer 5 '3n; n'", 2, 1);
  ::unsetenv("XDG_STATE_HOME");
  std::filesystem::remove_all(tmp);
}

TEST_CASE("shared flags: --json parses and --csv has one row per table row", "[cli][flags][formats]") {
  // Tables: one row per N, per tensor, per pass, per step.
  auto t = check_formats("traffic attention --seq 64,128,256 --dim 16", 3);
  CHECK(t[0][column(t[0], "seq")] == "seq");
  CHECK(t[3][column(t[0], "seq")] == "256");
  check_formats("traffic attention --seq 64 --variant fa2 --dim 16", 5);  // Q K V O LSE
  check_formats("traffic mta --seq 128 --dim 16", 3);                      // fwd bwd infer
  // Verdicts: the object's table (attention's traffic per tensor) repeats the verdict per row.
  auto a = check_formats("attention fwd --seq 40 --dim 8 --block-m 16 --block-n 8", 5);
  CHECK(a[1][column(a[0], "ok")] == "true");
  CHECK(a[1][column(a[0], "traffic.tensor")] == "Q");
  auto m = check_formats("mta fwd --seq 32 --dim 8", 7);  // Q K V W O M L
  CHECK(m[1][column(m[0], "passed")] == "true");
  auto s = check_formats("stream estimate --seq 64 --dim 8 --block-m 16 --block-n 16 --k 2", 1);
  CHECK(s[1][column(s[0], "block_m")] == "16");
  CHECK(s[1][column(s[0], "indices")].find(';') != std::string::npos);  // the rows of I, one cell
  check_formats("stream fidelity --seq 256 --dim 8 --block-m 32 --block-n 32 --k 2,4 --workload random", 2);
  check_formats("run " + source_dir() + "/toymachine/traces/p1_c00.trace --machine matmul3", 1);
  auto n = check_formats("stream needles --seq 2048 --dim 16 --block-m 64 --block-n 64 --k 4 --needle-blocks 2 --needles 2", 1);
  CHECK(n[1][column(n[0], "planted")] == "4");
  // The ring: one row per pass and step, the problem and the verdict repeated in front.
  auto ring = check_formats("traffic ring --gpus 2 --seq 64 --dim 8 --causal", 2 + 3);
  CHECK(ring[1][column(ring[0], "steps.pass")] == "forward");
  CHECK(ring[5][column(ring[0], "steps.pass")] == "backward");
  CHECK(ring[1][column(ring[0], "problem.gpus")] == "2");
  CHECK(ring[1][column(ring[0], "counted_equals_model")] == "true");
  // The traffic chapter: attention's five designs at N, then the families' seven passes (the
  // grouped K/V forward and the decode step, MTA's three, STREAM's two).
  auto levels = check_formats("traffic levels", 5 + 7);
  CHECK(levels[1][column(levels[0], "family")] == "attention");
  CHECK(levels[1][column(levels[0], "pass")] == "naive_fwd");
  CHECK(!levels[1][column(levels[0], "l2_bytes")].empty());  // the recorded measurement is at this shape
  CHECK(levels[1][column(levels[0], "measured.device")].find("H100") != std::string::npos);
  CHECK(levels[6][column(levels[0], "family")] == "attention");
  CHECK(levels[6][column(levels[0], "pass")] == "fwd");
  CHECK(levels[6][column(levels[0], "toy_bytes")].empty());  // no toy level beyond the five designs
  CHECK(levels[12][column(levels[0], "family")] == "stream");
  CHECK(levels[12][column(levels[0], "toy_bytes")].empty());
  // At another shape the recorded measurement does not count: its columns are empty.
  auto other = check_formats("traffic levels --seq 1024,2048 --dim 32", 2 * 5 + 7);
  CHECK(other[1][column(other[0], "shape")].find("N=1024") != std::string::npos);
  CHECK(other[6][column(other[0], "shape")].find("N=2048") != std::string::npos);
  CHECK(other[1][column(other[0], "l2_bytes")].empty());
  CHECK(other[1][column(other[0], "measured.date")].empty());
  // --json and --csv exclude each other, everywhere.
  for (const char* cmd : {"attention fwd --seq 40 --dim 8", "mta fwd", "traffic attention --seq 64",
                          "stream estimate --seq 64 --block-m 16 --block-n 16 --k 2", "traffic ring --gpus 2 --seq 64",
                          "traffic levels", "traffic stream --device cuda", "bench attention", "bench mta",
                          "bench stream"})
    expect_usage_error(std::string(cmd) + " --json --csv", "--json and --csv exclude each other");
}

TEST_CASE("shared flags: the GPU commands' --json and --csv are checked in every build", "[cli][flags][formats]") {
  // A build without CUDA refuses them as it refuses the command (exit 2, error and hint, nothing
  // on stdout); a CUDA build without a GPU says it needs one. Where a GPU runs them, the document parses.
  for (const char* args : {"bench attention --seq 128 --dim 64 --causal --pass fwd --reps 20 --warmup 1",
                           "bench mta --seq 128 --dim 64 --reps 5 --warmup 0",
                           "bench stream --seq 1024 --dim 64 --k 2 --reps 1 --warmup 0",
                           "traffic stream --device cuda --seq 1024 --dim 64 --k 2"})
    for (const char* format : {" --json", " --csv"}) {
      INFO(args << format);
      const auto r = run_gpu_command(std::string(args) + format);
      if (r.exit_code != 0) continue;  // the refusal was checked by run_gpu_command
      if (std::string(format) == " --json") {
        CHECK(JsonCheck(r.out).valid());
      } else {
        const auto rows = csv_rows(r.out);
        REQUIRE(rows.size() >= 2);
        for (const auto& row : rows) CHECK(row.size() == rows.front().size());
      }
    }
  // traffic stream needs --device cuda, whatever the format.
  expect_usage_error("traffic stream --json", "traffic stream measures the GPU kernels only");
  // traffic levels writes a live measurement's files only with --device cuda.
  expect_usage_error("traffic levels --measured-csv m.csv", "--measured-csv needs --device cuda");
}

TEST_CASE("shared flags: a trace store's report and queries print JSON and CSV", "[cli][flags][formats]") {
  const std::string tmp = fresh_temp_dir("store_formats");
  const std::string store = tmp + "/store";
  const auto made = run_cli("stream trace --store " + store + " --seq 256 --dim 8 --block-m 16 --block-n 16 --k 2 --csv");
  REQUIRE(made.exit_code == 0);
  const auto rows = csv_rows(made.out);
  REQUIRE(rows.size() >= 2);
  CHECK(rows[1][column(rows[0], "block_m")] == "16");
  const auto q = run_cli("stream query " + store + " --reads 200 --top 3 --json");
  CHECK(q.exit_code == 0);
  CHECK(JsonCheck(q.out).valid());
  const auto qc = run_cli("stream query " + store + " --reads 200 --top 3 --csv");
  CHECK(qc.exit_code == 0);
  const auto edges = csv_rows(qc.out);
  CHECK(edges.size() >= 2);
  CHECK(edges.size() <= 4);  // at most --top rows
  std::filesystem::remove_all(tmp);
}
