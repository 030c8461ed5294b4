// results_tables — the measured tables of cuda/RESULTS.md, README.md and the GPU sections of docs/mta.md,
// docs/stream.md and docs/optimisation.md, generated from the CSV files in cuda/results/ (written by
// cuda/bench/measure.sh on the GPU machine) and bench/results/cpu.csv (written by bench/measure_cpu.sh).
//
// Manual. `results_tables [--check] REPO_ROOT PAGE...` reads the CSVs under REPO_ROOT. A page marks
// each generated table with
//     <!-- begin generated: NAME -->
//     ...
//     <!-- end generated: NAME -->
// and this program replaces what lies between the two lines with table NAME rendered from the CSVs.
// Without --check it rewrites the pages in place; with --check it changes nothing and exits 1 when a
// page's table differs from what the CSVs give (CTest runs it so). Exit 2: a CSV or a page is
// malformed (the message names file:line). The CSV columns are documented in cuda/results/README.md
// and bench/results/README.md.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

namespace {

struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// ---- CSV ------------------------------------------------------------------------------------

/// One CSV file: the header's column names and the rows as strings (RFC 4180 quoting).
struct Csv {
  std::string path;
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
  std::vector<int> lines;  // the file line of each row, for messages

  std::size_t column(const std::string& name) const {
    const auto it = std::find(header.begin(), header.end(), name);
    if (it == header.end()) throw InputError(path + ":1: no column '" + name + "' in the header");
    return std::size_t(it - header.begin());
  }
};

std::vector<std::string> split_csv_line(const std::string& line, const std::string& where) {
  std::vector<std::string> fields(1);
  bool quoted = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted && c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
      fields.back() += '"';
      ++i;
    } else if (c == '"') {
      quoted = !quoted;
    } else if (c == ',' && !quoted) {
      fields.emplace_back();
    } else if (c != '\r') {
      fields.back() += c;
    }
  }
  if (quoted) throw InputError(where + ": unterminated quote");
  return fields;
}

Csv read_csv(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(path + ": cannot open (written by cuda/bench/measure.sh or bench/measure_cpu.sh; is REPO_ROOT right?)");
  Csv csv{path, {}, {}, {}};
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty()) continue;
    const std::string where = path + ":" + std::to_string(number);
    auto fields = split_csv_line(line, where);
    if (csv.header.empty()) {
      csv.header = std::move(fields);
      continue;
    }
    if (fields.size() != csv.header.size())
      throw InputError(where + ": " + std::to_string(fields.size()) + " fields, the header has " +
                       std::to_string(csv.header.size()));
    csv.rows.push_back(std::move(fields));
    csv.lines.push_back(number);
  }
  if (csv.header.empty()) throw InputError(path + ": empty file (a header line is expected)");
  return csv;
}

/// Read access to one row by column name, numbers checked where they are used.
struct Row {
  const Csv* table;
  std::size_t index;

  const std::string& str(const std::string& name) const { return table->rows[index][table->column(name)]; }
  bool has(const std::string& name) const { return !str(name).empty(); }
  double num(const std::string& name) const {
    const std::string& s = str(name);
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    if (s.empty() || *end != '\0' || !std::isfinite(v))
      throw InputError(table->path + ":" + std::to_string(table->lines[index]) + ": column '" + name +
                       "' is not a number: '" + s + "'");
    return v;
  }
};

std::vector<Row> rows_of(const Csv& csv) {
  std::vector<Row> rows;
  for (std::size_t i = 0; i < csv.rows.size(); ++i) rows.push_back(Row{&csv, i});
  return rows;
}

// ---- formatting -----------------------------------------------------------------------------

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

std::string bytes(double b) {
  if (b >= 1e9) return fmt("%.3f GB", b / 1e9);
  if (b >= 1e6) return fmt("%.1f MB", b / 1e6);
  if (b >= 1e3) return fmt("%.1f kB", b / 1e3);
  return fmt("%.0f B", b);
}

std::string ratio(double num, double den, const char* format) { return den > 0 ? fmt(format, num / den) : "–"; }

/// "a / b" of two optional TFLOP/s columns, or "–" when the run has no SDPA figures.
std::string pair(const Row& r, const std::string& a, const std::string& b, const char* format) {
  if (!r.has(a) || !r.has(b)) return "–";
  return fmt(format, r.num(a)) + " / " + fmt(format, r.num(b));
}

std::string ratio_pair(const Row& r, const std::string& a, const std::string& b) {
  if (!r.has(a) || !r.has(b)) return "–";
  const double ours = r.num("tflops");
  return ratio(ours, r.num(a), "%.2f") + " / " + ratio(ours, r.num(b), "%.2f");
}

std::string yes_no(const std::string& flag) { return flag == "1" ? "yes" : "no"; }

struct Markdown {
  std::ostringstream out;
  void header(const std::vector<std::string>& cells) {
    line(cells);
    out << '|';
    for (std::size_t i = 0; i < cells.size(); ++i) out << " --- |";
    out << '\n';
  }
  void line(const std::vector<std::string>& cells) {
    out << '|';
    for (const auto& c : cells) out << ' ' << c << " |";
    out << '\n';
  }
};

std::string run_line(const std::string& date, const std::string& device) {
  return "Run: " + date + " UTC, " + device + ".\n\n";
}

// ---- correctness tables ---------------------------------------------------------------------

/// One row per test or sanitizer command of a checks file (`schedule` too where the file has it).
std::string checks_rows(const std::string& path) {
  const Csv csv = read_csv(path);
  const bool schedule = std::find(csv.header.begin(), csv.header.end(), "schedule") != csv.header.end();
  Markdown md;
  std::vector<std::string> head{"date (UTC)", "device", "command", "result", "assertions", "test cases",
                                "sanitizer errors"};
  if (schedule) head.push_back("schedule");
  md.header(head);
  const auto or_dash = [](const Row& r, const std::string& c) { return r.has(c) ? r.str(c) : std::string("–"); };
  for (const Row& r : rows_of(csv)) {
    std::vector<std::string> cells{r.str("date"), r.str("device"), "`" + r.str("command") + "`", r.str("status"),
                                   or_dash(r, "assertions"), or_dash(r, "test_cases"), or_dash(r, "sanitizer_errors")};
    if (schedule) cells.push_back(r.str("schedule"));
    md.line(cells);
  }
  return md.out.str();
}

std::string checks_table(const std::string& root) { return checks_rows(root + "/cuda/results/checks.csv"); }

std::string tma_ws_checks_table(const std::string& root) {
  return checks_rows(root + "/cuda/results/fwd_tma_ws_checks.csv");
}

std::string mta_fast_checks_table(const std::string& root) {
  return checks_rows(root + "/cuda/results/mta_fast_checks.csv");
}

std::string worst_errors_table(const std::string& root) {
  const Csv csv = read_csv(root + "/cuda/results/worst_errors.csv");
  Markdown md;
  md.header({"date (UTC)", "test group", "quantity", "worst error", "tolerance", "where"});
  for (const Row& r : rows_of(csv))
    md.line({r.str("date"), r.str("group"), r.str("quantity"), fmt("%.2e", r.num("worst_error")),
             fmt("%.0e", r.num("tolerance")), r.has("where") ? r.str("where") : "–"});
  return md.out.str();
}

// ---- traffic tables -------------------------------------------------------------------------

std::string traffic_kernels_table(const std::string& root) {
  const Csv csv = read_csv(root + "/cuda/results/traffic_kernels.csv");
  Markdown md;
  md.header({"kernel", "N", "causal", "model read", "tiled model read", "L2→SM read", "L2→SM / tiled model",
             "L2 slice read", "DRAM read", "model write", "SM→L2 write", "DRAM write", "L2 atomic", "ms"});
  std::string date, device;
  for (const Row& r : rows_of(csv)) {
    if (r.str("variant") == "naive") continue;  // the naive kernels are in the sweep table
    date = r.str("date");
    device = r.str("device");
    md.line({"`" + r.str("kernel") + "`", r.str("seq"), yes_no(r.str("causal")), bytes(r.num("model_read_bytes")),
             bytes(r.num("tiled_model_read_bytes")), bytes(r.num("l2_read_bytes")),
             ratio(r.num("l2_read_bytes"), r.num("tiled_model_read_bytes"), "%.3f"), bytes(r.num("lts_read_bytes")),
             bytes(r.num("dram_read_bytes")), bytes(r.num("model_write_bytes")), bytes(r.num("l2_write_bytes")),
             bytes(r.num("dram_write_bytes")), bytes(r.num("l2_atomic_bytes")),
             fmt("%.2f", r.num("duration_ns") / 1e6)});
  }
  return run_line(date, device) + md.out.str();
}

/// Whole-pass totals per N of the naive kernels and of FA2's one kernel (reads + writes).
struct SweepTotals {
  double model = 0, l2 = 0, dram = 0, ms = 0;
};

std::map<long, std::map<std::string, SweepTotals>> sweep_totals(const Csv& csv) {
  std::map<long, std::map<std::string, SweepTotals>> by_n;
  for (const Row& r : rows_of(csv)) {
    SweepTotals& t = by_n[long(r.num("seq"))][r.str("variant")];
    t.model += r.num("model_read_bytes") + r.num("model_write_bytes");
    t.l2 += r.num("l2_read_bytes") + r.num("l2_write_bytes");
    t.dram += r.num("dram_read_bytes") + r.num("dram_write_bytes");
    t.ms += r.num("duration_ns") / 1e6;
  }
  return by_n;
}

std::string traffic_sweep_table(const std::string& root) {
  const Csv csv = read_csv(root + "/cuda/results/traffic_sweep.csv");
  Markdown md;
  md.header({"N", "model naive", "model flash", "model ratio", "L2→SM naive", "L2→SM flash", "L2 ratio", "DRAM naive",
             "DRAM flash", "DRAM ratio", "ms naive", "ms flash"});
  for (const auto& [n, v] : sweep_totals(csv)) {
    const SweepTotals naive = v.count("naive") ? v.at("naive") : SweepTotals{};
    const SweepTotals flash = v.count("fa2") ? v.at("fa2") : SweepTotals{};
    md.line({std::to_string(n), bytes(naive.model), bytes(flash.model), ratio(naive.model, flash.model, "%.2f"),
             bytes(naive.l2), bytes(flash.l2), ratio(naive.l2, flash.l2, "%.2f"), bytes(naive.dram),
             bytes(flash.dram), ratio(naive.dram, flash.dram, "%.1f"), fmt("%.2f", naive.ms), fmt("%.2f", flash.ms)});
  }
  const Row first{&csv, 0};
  return (csv.rows.empty() ? std::string() : run_line(first.str("date"), first.str("device"))) + md.out.str();
}

std::string readme_traffic_table(const std::string& root) {
  const Csv csv = read_csv(root + "/cuda/results/traffic_sweep.csv");
  Markdown md;
  md.header({"N", "model naive", "model FA2", "L2→SM naive", "L2→SM FA2", "DRAM naive", "DRAM FA2", "DRAM ratio"});
  for (const auto& [n, v] : sweep_totals(csv)) {
    if (n != 1024 && n != 4096 && n != 16384) continue;
    const SweepTotals naive = v.count("naive") ? v.at("naive") : SweepTotals{};
    const SweepTotals flash = v.count("fa2") ? v.at("fa2") : SweepTotals{};
    md.line({std::to_string(n), bytes(naive.model), bytes(flash.model), bytes(naive.l2), bytes(flash.l2),
             bytes(naive.dram), bytes(flash.dram), ratio(naive.dram, flash.dram, "%.0f×")});
  }
  return md.out.str();
}

// ---- fast-kernel timing tables --------------------------------------------------------------

bool headline_shape(const Row& r) {
  return r.str("dtype") == "bf16" && r.str("d") == "128" && r.str("N") == "8192" && r.str("causal") == "0";
}

/// The newest run (by date) with rows of `dtype` and SDPA figures beside them.
std::string newest_run(const Csv& csv, const std::string& dtype) {
  std::string newest;
  for (const Row& r : rows_of(csv))
    if (r.str("dtype") == dtype && r.has("fa2_bnhd_tflops") && r.str("date") > newest) newest = r.str("date");
  if (newest.empty()) throw InputError(csv.path + ": no " + dtype + " rows with SDPA figures");
  return newest;
}

std::string fast_sweep_table(const std::string& root, const std::string& dtype) {
  const Csv csv = read_csv(root + "/cuda/results/fast_attention.csv");
  const std::string run = newest_run(csv, dtype);
  std::vector<Row> rows;
  for (const Row& r : rows_of(csv))
    if (r.str("date") == run && r.str("dtype") == dtype) rows.push_back(r);
  std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
    const auto key = [](const Row& r) {
      return std::make_tuple(r.num("d"), r.num("causal"), r.num("N"), r.str("pass") == "bwd", r.str("kernel"));
    };
    return key(a) < key(b);
  });
  Markdown md;
  md.header({"d", "causal", "N", "pass", "kernel", "median ms", "min – max ms", "TFLOP/s", "SDPA FA2 (bnhd / bhnd)",
             "ours / FA2", "SDPA cuDNN (bnhd / bhnd)", "ours / cuDNN"});
  for (const Row& r : rows) {
    const bool bold = headline_shape(r);
    const std::string tflops = fmt("%.1f", r.num("tflops"));
    md.line({r.str("d"), yes_no(r.str("causal")), bold ? "**" + r.str("N") + "**" : r.str("N"), r.str("pass"),
             r.str("kernel"), fmt("%.4f", r.num("median_ms")),
             fmt("%.4f", r.num("min_ms")) + " – " + fmt("%.4f", r.num("max_ms")), bold ? "**" + tflops + "**" : tflops,
             pair(r, "fa2_bnhd_tflops", "fa2_bhnd_tflops", "%.1f"), ratio_pair(r, "fa2_bnhd_tflops", "fa2_bhnd_tflops"),
             pair(r, "cudnn_bnhd_tflops", "cudnn_bhnd_tflops", "%.1f"),
             ratio_pair(r, "cudnn_bnhd_tflops", "cudnn_bhnd_tflops")});
  }
  return run_line(run, rows.front().str("device")) + md.out.str();
}

std::string fast_headline_table(const std::string& root) {
  const Csv csv = read_csv(root + "/cuda/results/fast_attention.csv");
  Markdown md;
  md.header({"date (UTC)", "pass", "kernel", "median ms", "TFLOP/s", "SDPA FA2 (bnhd / bhnd)", "ours / FA2",
             "SDPA cuDNN (bnhd / bhnd)", "ours / cuDNN"});
  for (const Row& r : rows_of(csv)) {
    if (!headline_shape(r)) continue;
    md.line({r.str("date"), r.str("pass"), r.str("kernel"), r.has("median_ms") ? fmt("%.4f", r.num("median_ms")) : "–",
             fmt("%.1f", r.num("tflops")), pair(r, "fa2_bnhd_tflops", "fa2_bhnd_tflops", "%.1f"),
             ratio_pair(r, "fa2_bnhd_tflops", "fa2_bhnd_tflops"), pair(r, "cudnn_bnhd_tflops", "cudnn_bhnd_tflops", "%.1f"),
             ratio_pair(r, "cudnn_bnhd_tflops", "cudnn_bhnd_tflops")});
  }
  return md.out.str();
}

/// README: per kernel at the headline shape, its newest run with SDPA beside it (forward kernels first).
/// The README's headline table: the newest row per pass and kernel at the headline shape, from the
/// fast kernels' runs and the Hopper forwards' runs (same columns), SDPA of the same run beside it.
std::string readme_fast_table(const std::string& root) {
  const Csv fast = read_csv(root + "/cuda/results/fast_attention.csv");
  const Csv hopper = read_csv(root + "/cuda/results/fwd_tma_ws.csv");  // rows point into these three
  const Csv hopper_bwd = read_csv(root + "/cuda/results/bwd_ws.csv");
  std::vector<Row> all = rows_of(fast);
  for (const Row& r : rows_of(hopper))
    if (r.str("kernel") == "tma-ws") all.push_back(r);  // the default schedule only
  for (const Row& r : rows_of(hopper_bwd))
    if (r.str("kernel") == "wgmma-ws") all.push_back(r);  // the Hopper backward
  std::vector<Row> newest;  // one row per pass and kernel, in order of first appearance
  for (const Row& r : all) {
    if (!headline_shape(r) || !r.has("fa2_bnhd_tflops")) continue;
    const auto same = [&](const Row& k) { return k.str("pass") == r.str("pass") && k.str("kernel") == r.str("kernel"); };
    const auto it = std::find_if(newest.begin(), newest.end(), same);
    if (it == newest.end())
      newest.push_back(r);
    else if (r.str("date") > it->str("date"))
      *it = r;
  }
  std::stable_sort(newest.begin(), newest.end(),
                   [](const Row& a, const Row& b) { return a.str("pass") == "fwd" && b.str("pass") != "fwd"; });
  Markdown md;
  md.header({"pass", "kernel", "TFLOP/s", "× SDPA FA2 (bnhd / bhnd)", "× SDPA cuDNN (bnhd / bhnd)", "run (UTC)"});
  for (const Row& r : newest)
    md.line({r.str("pass"), r.str("kernel"), fmt("%.1f", r.num("tflops")),
             ratio_pair(r, "fa2_bnhd_tflops", "fa2_bhnd_tflops"), ratio_pair(r, "cudnn_bnhd_tflops", "cudnn_bhnd_tflops"),
             r.str("date")});
  return md.out.str();
}

// ---- Hopper forwards (tma-ws beside wgmma and SDPA) ----------------------------------------

/// The run of fwd_tma_ws.csv with the most `tma-ws` rows (the full sweep; a tie goes to the newer);
/// with `need_wgmma`, only among runs that also timed the wgmma forward (the table beside it), and
/// a tie goes to the older: the first full sweep, the one the TMA rung of docs/optimisation.md
/// reports (later sweeps beside wgmma belong to later rungs).
std::string tma_ws_sweep_run(const Csv& csv, bool need_wgmma) {
  std::map<std::string, int> count;
  std::set<std::string> with_wgmma;
  for (const Row& r : rows_of(csv))
    if (r.str("kernel") == "wgmma") with_wgmma.insert(r.str("date"));
  for (const Row& r : rows_of(csv))
    if (r.str("kernel") == "tma-ws" && (!need_wgmma || with_wgmma.count(r.str("date")))) ++count[r.str("date")];
  std::string best;
  for (const auto& [date, n] : count)
    if (best.empty() || n > count[best] || (n == count[best] && !need_wgmma)) best = date;
  if (best.empty()) throw InputError(csv.path + ": no rows of kernel 'tma-ws'");
  return best;
}

/// tma-ws per shape of its sweep run with N ≥ min_n, beside wgmma and SDPA (bnhd) of that run;
/// `pinned` (a run's date) names the run instead, for a rung that reports an older sweep.
std::string tma_ws_table(const std::string& root, double min_n, bool need_wgmma, const std::string& pinned = "") {
  const Csv csv = read_csv(root + "/cuda/results/fwd_tma_ws.csv");
  const std::string run = pinned.empty() ? tma_ws_sweep_run(csv, need_wgmma) : pinned;
  std::vector<Row> rows;
  std::map<std::tuple<std::string, std::string, std::string>, double> wgmma;  // (d, causal, N) -> TFLOP/s
  for (const Row& r : rows_of(csv)) {
    if (r.str("date") != run) continue;
    if (r.str("kernel") == "wgmma") wgmma[{r.str("d"), r.str("causal"), r.str("N")}] = r.num("tflops");
    if (r.str("kernel") == "tma-ws" && r.num("N") >= min_n) rows.push_back(r);
  }
  std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
    const auto key = [](const Row& r) { return std::make_tuple(-r.num("d"), r.num("causal"), r.num("N")); };
    return key(a) < key(b);
  });
  Markdown md;
  md.header({"d", "causal", "N", "tma-ws", "wgmma", "SDPA FA2", "SDPA cuDNN", "÷ wgmma", "÷ FA2", "÷ cuDNN"});
  for (const Row& r : rows) {
    const double ours = r.num("tflops");
    const auto w = wgmma.find({r.str("d"), r.str("causal"), r.str("N")});
    const bool sdpa = r.has("fa2_bnhd_tflops") && r.has("cudnn_bnhd_tflops");
    md.line({r.str("d"), yes_no(r.str("causal")), r.str("N"), fmt("%.1f", ours),
             w == wgmma.end() ? "–" : fmt("%.1f", w->second), sdpa ? fmt("%.1f", r.num("fa2_bnhd_tflops")) : "–",
             sdpa ? fmt("%.1f", r.num("cudnn_bnhd_tflops")) : "–",
             w == wgmma.end() ? "–" : ratio(ours, w->second, "%.2f×"),
             sdpa ? ratio(ours, r.num("fa2_bnhd_tflops"), "%.2f×") : "–",
             sdpa ? ratio(ours, r.num("cudnn_bnhd_tflops"), "%.2f×") : "–"});
  }
  return run_line(run, rows.empty() ? "–" : rows.front().str("device")) + md.out.str();
}

/// Every run's rows of fwd_tma_ws.csv at the headline shape: the run-to-run spread and the schedules.
std::string tma_ws_runs_table(const std::string& root) {
  const Csv csv = read_csv(root + "/cuda/results/fwd_tma_ws.csv");
  const Csv variants = read_csv(root + "/cuda/results/fwd_tma_ws_variants.csv");
  std::vector<Row> rows = rows_of(csv);
  for (const Row& r : rows_of(variants)) rows.push_back(r);
  std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.str("date") < b.str("date"); });
  Markdown md;
  md.header({"date (UTC)", "kernel", "median ms", "TFLOP/s", "SDPA FA2 (bnhd / bhnd)", "ours / FA2",
             "SDPA cuDNN (bnhd / bhnd)", "ours / cuDNN"});
  for (const Row& r : rows) {
    if (!headline_shape(r)) continue;
    md.line({r.str("date"), r.str("kernel"), fmt("%.4f", r.num("median_ms")), fmt("%.1f", r.num("tflops")),
             pair(r, "fa2_bnhd_tflops", "fa2_bhnd_tflops", "%.1f"), ratio_pair(r, "fa2_bnhd_tflops", "fa2_bhnd_tflops"),
             pair(r, "cudnn_bnhd_tflops", "cudnn_bhnd_tflops", "%.1f"),
             ratio_pair(r, "cudnn_bnhd_tflops", "cudnn_bhnd_tflops")});
  }
  return md.out.str();
}

/// One run of fwd_tma_ws.csv that timed builds side by side: per shape, every build's TFLOP/s (its
/// first sweep / its `-repeat` sweep, builds in order of appearance), then SDPA cuDNN (bnhd / bhnd)
/// of that run and the first build's mean ÷ cuDNN (bnhd) beside the others'.
std::string tma_ws_variants_table(const std::string& root, const std::string& run) {
  // The A/B runs of rejected variants from Rung 15 on live in fwd_tma_ws_variants.csv.
  const Csv csv = read_csv(root + "/cuda/results/fwd_tma_ws.csv");
  const Csv variants = read_csv(root + "/cuda/results/fwd_tma_ws_variants.csv");
  using Shape = std::tuple<double, double, double>;  // (−d, causal, N): d = 128 first
  std::vector<std::string> builds;                   // kernel labels without "-repeat"
  std::map<std::string, std::map<Shape, std::vector<double>>> tflops;
  std::map<Shape, std::string> cudnn;
  std::map<Shape, double> cudnn_bnhd;
  std::set<Shape> shapes;
  std::string device;
  const std::string repeat = "-repeat";
  std::vector<Row> rows = rows_of(csv);
  for (const Row& r : rows_of(variants)) rows.push_back(r);
  for (const Row& r : rows) {
    if (r.str("date") != run) continue;
    std::string k = r.str("kernel");
    if (k.size() > repeat.size() && k.compare(k.size() - repeat.size(), repeat.size(), repeat) == 0)
      k.resize(k.size() - repeat.size());
    if (std::find(builds.begin(), builds.end(), k) == builds.end()) builds.push_back(k);
    const Shape shape{-r.num("d"), r.num("causal"), r.num("N")};
    shapes.insert(shape);
    tflops[k][shape].push_back(r.num("tflops"));
    if (r.has("cudnn_bnhd_tflops")) {
      cudnn[shape] = pair(r, "cudnn_bnhd_tflops", "cudnn_bhnd_tflops", "%.1f");
      cudnn_bnhd[shape] = r.num("cudnn_bnhd_tflops");
    }
    device = r.str("device");
  }
  if (builds.empty()) throw InputError(csv.path + " and " + variants.path + ": no rows of run " + run);
  const auto mean = [](const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0) / v.size(); };
  std::vector<std::string> head{"d", "causal", "N"};
  for (const std::string& b : builds) head.push_back(b);
  head.push_back("SDPA cuDNN (bnhd / bhnd)");
  for (const std::string& b : builds) head.push_back(b + " ÷ cuDNN");
  Markdown md;
  md.header(head);
  for (const Shape& shape : shapes) {
    std::vector<std::string> cells{fmt("%.0f", -std::get<0>(shape)), std::get<1>(shape) != 0 ? "yes" : "no",
                                   fmt("%.0f", std::get<2>(shape))};
    for (const std::string& b : builds) {
      const auto it = tflops[b].find(shape);
      std::string cell = "–";
      if (it != tflops[b].end()) {
        cell.clear();
        for (double v : it->second) cell += (cell.empty() ? "" : " / ") + fmt("%.1f", v);
      }
      cells.push_back(cell);
    }
    cells.push_back(cudnn.count(shape) ? cudnn[shape] : "–");
    for (const std::string& b : builds) {
      const auto it = tflops[b].find(shape);
      cells.push_back(it != tflops[b].end() && cudnn_bnhd.count(shape)
                          ? ratio(mean(it->second), cudnn_bnhd[shape], "%.2f×")
                          : "–");
    }
    md.line(cells);
  }
  return run_line(run, device) + md.out.str();
}

// ---- Hopper backward (wgmma-ws beside the mma.sync atomic kernel and SDPA) ------------------

/// The run of bwd_ws.csv with the most wgmma-ws rows (the full sweep): every wgmma-ws shape, with the
/// deterministic variant and the mma.sync atomic kernel of the same run where they were timed,
/// and SDPA (bnhd) of that run.
std::string bwd_ws_table(const std::string& root) {
  const Csv csv = read_csv(root + "/cuda/results/bwd_ws.csv");
  // The sweep: the run with the most wgmma-ws rows (a tie goes to the newer), so a later run of a
  // few headline shapes does not replace it.
  // Runs that timed a previous build beside it belong to later rungs (bwd_ws_before_table).
  std::set<std::string> with_before;
  for (const Row& r : rows_of(csv))
    if (r.str("kernel") == "wgmma-ws-before") with_before.insert(r.str("date"));
  std::map<std::string, int> rows_per_run;
  for (const Row& r : rows_of(csv))
    if (r.str("kernel") == "wgmma-ws" && !with_before.count(r.str("date"))) ++rows_per_run[r.str("date")];
  std::string run;
  int most = 0;
  for (const auto& [date, count] : rows_per_run)
    if (count >= most) run = date, most = count;
  if (run.empty()) throw InputError(csv.path + ": no rows of kernel 'wgmma-ws'");
  std::vector<Row> rows;
  std::map<std::tuple<std::string, std::string, std::string>, double> atomic, det;  // (d, causal, N) -> TFLOP/s
  for (const Row& r : rows_of(csv)) {
    if (r.str("date") != run) continue;
    if (r.str("kernel") == "atomic") atomic[{r.str("d"), r.str("causal"), r.str("N")}] = r.num("tflops");
    if (r.str("kernel") == "wgmma-ws-det") det[{r.str("d"), r.str("causal"), r.str("N")}] = r.num("tflops");
    if (r.str("kernel") == "wgmma-ws") rows.push_back(r);
  }
  std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
    const auto key = [](const Row& r) { return std::make_tuple(-r.num("d"), r.num("causal"), r.num("N")); };
    return key(a) < key(b);
  });
  Markdown md;
  md.header({"d", "causal", "N", "wgmma-ws", "wgmma-ws-det", "mma atomic", "SDPA FA2", "SDPA cuDNN", "÷ mma atomic",
             "÷ FA2", "÷ cuDNN"});
  for (const Row& r : rows) {
    const double ours = r.num("tflops");
    const auto a = atomic.find({r.str("d"), r.str("causal"), r.str("N")});
    const auto dt = det.find({r.str("d"), r.str("causal"), r.str("N")});
    const bool sdpa = r.has("fa2_bnhd_tflops") && r.has("cudnn_bnhd_tflops");
    md.line({r.str("d"), yes_no(r.str("causal")), r.str("N"), fmt("%.1f", ours),
             dt == det.end() ? "–" : fmt("%.1f", dt->second), a == atomic.end() ? "–" : fmt("%.1f", a->second), sdpa ? fmt("%.1f", r.num("fa2_bnhd_tflops")) : "–",
             sdpa ? fmt("%.1f", r.num("cudnn_bnhd_tflops")) : "–",
             a == atomic.end() ? "–" : ratio(ours, a->second, "%.2f×"),
             sdpa ? ratio(ours, r.num("fa2_bnhd_tflops"), "%.2f×") : "–",
             sdpa ? ratio(ours, r.num("cudnn_bnhd_tflops"), "%.2f×") : "–"});
  }
  return run_line(run, rows.empty() ? "–" : rows.front().str("device")) + md.out.str();
}

/// The newest run of bwd_ws.csv that timed a previous build (kernel wgmma-ws-`before`) beside this
/// one: every wgmma-ws shape of it, the other builds of that run (kernels wgmma-ws-LABEL, one column
/// each, ÷ cuDNN for the previous build), the deterministic variant where timed and SDPA cuDNN (bnhd).
std::string bwd_ws_before_table(const std::string& root, const std::string& before = "before") {
  const Csv csv = read_csv(root + "/cuda/results/bwd_ws.csv");
  std::string run;
  for (const Row& r : rows_of(csv))
    if (r.str("kernel") == "wgmma-ws-" + before && r.str("date") > run) run = r.str("date");
  if (run.empty()) throw InputError(csv.path + ": no rows of kernel 'wgmma-ws-" + before + "'");
  using Shape = std::tuple<std::string, std::string, std::string>;  // (d, causal, N)
  std::map<std::string, std::map<Shape, double>> builds;            // label -> shape -> TFLOP/s
  std::vector<std::string> labels;                                  // in order of appearance, previous last
  std::vector<Row> rows;
  const std::string prefix = "wgmma-ws-";
  for (const Row& r : rows_of(csv)) {
    if (r.str("date") != run) continue;
    const std::string k = r.str("kernel");
    if (k == "wgmma-ws") rows.push_back(r);
    if (k.rfind(prefix, 0) != 0) continue;
    const std::string label = k.substr(prefix.size());
    if (!builds.count(label) && label != before && label != "det") labels.push_back(label);
    builds[label][{r.str("d"), r.str("causal"), r.str("N")}] = r.num("tflops");
  }
  labels.push_back(before);
  if (builds.count("det")) labels.push_back("det");
  const std::map<std::string, std::string> names{
      {"before", "previous build"},     {"det", "wgmma-ws-det"},           {"keysplit", "dQ key split"},
      {"lag", "dQ lagged"},             {"helpers", "helper-function build"}, {"repeat", "wgmma-ws, 2nd sweep"},
      {"rung11", "Rung 11 build"},      {"rung11-repeat", "Rung 11 build, 2nd sweep"},
      {"3stages", "3 stages"},          {"3stages-repeat", "3 stages, 2nd sweep"}};
  std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
    const auto key = [](const Row& r) { return std::make_tuple(-r.num("d"), r.num("causal"), r.num("N")); };
    return key(a) < key(b);
  });
  std::vector<std::string> head{"d", "causal", "N", "wgmma-ws"};
  for (const std::string& l : labels) head.push_back(names.count(l) ? names.at(l) : l);
  for (const char* h : {"SDPA cuDNN", "÷ previous", "previous ÷ cuDNN", "÷ cuDNN"}) head.push_back(h);
  Markdown md;
  md.header(head);
  for (const Row& r : rows) {
    const double ours = r.num("tflops");
    const Shape shape{r.str("d"), r.str("causal"), r.str("N")};
    const auto of = [&](const std::string& l) -> std::optional<double> {
      const auto& m = builds[l];
      const auto it = m.find(shape);
      return it == m.end() ? std::nullopt : std::optional<double>(it->second);
    };
    std::vector<std::string> cells{r.str("d"), yes_no(r.str("causal")), r.str("N"), fmt("%.1f", ours)};
    for (const std::string& l : labels) cells.push_back(of(l) ? fmt("%.1f", *of(l)) : "–");
    const bool cudnn = r.has("cudnn_bnhd_tflops");
    const std::optional<double> previous = of(before);
    cells.push_back(cudnn ? fmt("%.1f", r.num("cudnn_bnhd_tflops")) : "–");
    cells.push_back(previous ? ratio(ours, *previous, "%.2f×") : "–");
    cells.push_back(previous && cudnn ? ratio(*previous, r.num("cudnn_bnhd_tflops"), "%.2f×") : "–");
    cells.push_back(cudnn ? ratio(ours, r.num("cudnn_bnhd_tflops"), "%.2f×") : "–");
    md.line(cells);
  }
  return run_line(run, rows.empty() ? "–" : rows.front().str("device")) + md.out.str();
}

std::string bwd_ws_checks_table(const std::string& root) {
  return checks_rows(root + "/cuda/results/bwd_ws_checks.csv");
}

// ---- MTA and STREAM: measured traffic of the clear kernels beside the model ----------------

/// The rows of the newest run (largest date) of a file.
std::vector<Row> newest_rows(const Csv& csv) {
  std::string newest;
  for (const Row& r : rows_of(csv)) newest = std::max(newest, r.str("date"));
  std::vector<Row> rows;
  for (const Row& r : rows_of(csv))
    if (r.str("date") == newest) rows.push_back(r);
  if (rows.empty()) throw InputError(csv.path + ": no rows");
  return rows;
}

/// The rows of the run (date) with the most rows of pass `pass` (a tie goes to the newer): a full
/// sweep, which a later run of a few shapes does not replace.
std::vector<Row> fullest_run_rows(const Csv& csv, const std::string& pass) {
  std::map<std::string, int> count;
  for (const Row& r : rows_of(csv))
    if (r.str("pass") == pass) ++count[r.str("date")];
  std::string run;
  int most = 0;
  for (const auto& [date, n] : count)
    if (n >= most) run = date, most = n;
  std::vector<Row> rows;
  for (const Row& r : rows_of(csv))
    if (r.str("date") == run) rows.push_back(r);
  if (rows.empty()) throw InputError(csv.path + ": no rows of pass '" + pass + "'");
  return rows;
}

std::string mta_traffic_table(const std::string& root) {
  const Csv csv = read_csv(root + "/cuda/results/mta_traffic.csv");
  const std::vector<Row> rows = newest_rows(csv);
  Markdown md;
  md.header({"pass", "W (cq × ck)", "N", "splits", "model read", "L2→SM read", "ratio", "model write", "SM→L2 write",
             "ratio", "model atomic", "L2 atomic", "DRAM read", "ms"});
  for (const Row& r : rows)
    md.line({r.str("pass"), r.str("cq") + " × " + r.str("ck"), r.str("seq"),
             r.str("pass") == "infer" ? r.str("splits") : "–", bytes(r.num("model_read_bytes")),
             bytes(r.num("l2_read_bytes")), ratio(r.num("l2_read_bytes"), r.num("model_read_bytes"), "%.4f"),
             bytes(r.num("model_write_bytes")), bytes(r.num("l2_write_bytes")),
             ratio(r.num("l2_write_bytes"), r.num("model_write_bytes"), "%.4f"), bytes(r.num("model_atomic_bytes")),
             bytes(r.num("l2_atomic_bytes")), bytes(r.num("dram_read_bytes")), fmt("%.2f", r.num("duration_ms"))});
  const Row& first = rows.front();
  return run_line(first.str("date"), first.str("device")) + "H = " + first.str("heads") + ", d = " +
         first.str("dim") + ", B = " + first.str("block") + ", batch " + first.str("batch") + ", fp32.\n\n" +
         md.out.str();
}

/// The fast MTA forward (mta_fast.csv: `flashlab bench mta` rows, fast and clear) beside the unfused
/// PyTorch implementation of the same run (mta_torch.csv), newest run of each file, one row per
/// (cq × ck, d) of the fast forward rows.
std::string mta_fast_table(const std::string& root) {
  const Csv ours_csv = read_csv(root + "/cuda/results/mta_fast.csv");
  const Csv torch_csv = read_csv(root + "/cuda/results/mta_torch.csv");
  const std::vector<Row> ours = newest_rows(ours_csv), torch = newest_rows(torch_csv);
  using Key = std::tuple<std::string, std::string, std::string, std::string, std::string>;  // cq ck d N H
  const auto key = [](const Row& r) { return Key{r.str("cq"), r.str("ck"), r.str("d"), r.str("N"), r.str("H")}; };
  std::map<Key, const Row*> clear;
  std::map<std::tuple<Key, std::string, std::string>, const Row*> pt;  // (shape, dtype, pass)
  for (const Row& r : ours)
    if (r.str("kernel") == "clear" && r.str("pass") == "fwd") clear[key(r)] = &r;
  for (const Row& r : torch) pt[{key(r), r.str("dtype"), r.str("pass")}] = &r;
  const auto torch_ms = [&](const Key& k, const char* dtype, const char* pass) -> const Row* {
    const auto it = pt.find({k, dtype, pass});
    return it == pt.end() ? nullptr : it->second;
  };
  Markdown md;
  md.header({"W (cq × ck)", "d", "N", "H", "fast fwd ms (min–max)", "TFLOP/s", "clear fp32 fwd ms",
             "PyTorch fwd ms fp32 / bf16", "PyTorch ÷ fast (fp32 / bf16)", "PyTorch fwd+bwd ms fp32 / bf16",
             "PyTorch fwd+bwd peak GiB fp32"});
  std::vector<const Row*> fast;  // the bf16 forward rows, by kernel size (cq·ck, then cq) and d
  for (const Row& r : ours)
    if (r.str("kernel") == "fast" && r.str("pass") == "fwd" && r.str("dtype") == "bf16") fast.push_back(&r);
  std::stable_sort(fast.begin(), fast.end(), [](const Row* a, const Row* b) {
    const auto order = [](const Row* r) { return std::make_tuple(r->num("cq") * r->num("ck"), r->num("cq"), r->num("d")); };
    return order(a) < order(b);
  });
  for (const Row* row : fast) {
    const Row& r = *row;
    const Key k = key(r);
    const double ms = r.num("ms");
    const Row* f32 = torch_ms(k, "fp32", "fwd");
    const Row* b16 = torch_ms(k, "bf16", "fwd");
    const Row* f32b = torch_ms(k, "fp32", "fwd+bwd");
    const Row* b16b = torch_ms(k, "bf16", "fwd+bwd");
    const auto cell = [](const Row* t, const char* col, const char* format) {
      return t ? fmt(format, t->num(col)) : std::string("–");
    };
    const auto times = [&](const Row* t) { return t ? ratio(t->num("torch_ms"), ms, "%.0f×") : std::string("–"); };
    const auto c = clear.find(k);
    md.line({r.str("cq") + " × " + r.str("ck"), r.str("d"), r.str("N"), r.str("H"),
             fmt("%.3f", ms) + " (" + fmt("%.3f", r.num("min_ms")) + "–" + fmt("%.3f", r.num("max_ms")) + ")",
             fmt("%.0f", r.num("tflops")), c == clear.end() ? "–" : fmt("%.1f", c->second->num("ms")),
             cell(f32, "torch_ms", "%.2f") + " / " + cell(b16, "torch_ms", "%.2f"), times(f32) + " / " + times(b16),
             cell(f32b, "torch_ms", "%.1f") + " / " + cell(b16b, "torch_ms", "%.1f"),
             cell(f32b, "torch_peak_gib", "%.2f")});
  }
  const Row& first = ours.front();
  return run_line(first.str("date"), first.str("device")) + "bf16 inputs for the fast forward, causal, B = " +
         first.str("B") + ".\n\n" + md.out.str();
}

/// What keeping O on chip saves (mta_fast_o_order.csv: `flashlab bench mta --o-order on-chip|source
/// --traffic` rows of one run, cuda/bench/mta_o_order.sh): per order the median and the CUPTI bytes
/// of one launch, their difference, and beside it the count of what the source order adds: after
/// every key tile but a block's last, O_i, m_i and ℓ_i of its Br = 64 rows in fp32 go out and come
/// back, (d + 2)·4 bytes per row each way; query tile i visits i + 1 key tiles (Br = Bc).
std::string mta_o_order_table(const std::string& root) {
  const Csv csv = read_csv(root + "/cuda/results/mta_fast_o_order.csv");
  const std::vector<Row> rows = newest_rows(csv);
  const Row* by_order[2] = {nullptr, nullptr};  // on-chip, source
  for (const Row& r : rows) {
    const std::string& order = r.str("o_order");
    if (order != "on-chip" && order != "source")
      throw InputError(csv.path + ":" + std::to_string(csv.lines[r.index]) + ": o_order '" + order +
                       "' is not on-chip or source");
    by_order[order == "source"] = &r;
  }
  if (!by_order[0] || !by_order[1]) throw InputError(csv.path + ": the newest run lacks an on-chip or a source row");
  const Row &chip = *by_order[0], &src = *by_order[1];
  const auto cells = [](const Row& r) {
    return std::vector<std::string>{fmt("%.3f", r.num("ms")) + " (" + fmt("%.3f", r.num("min_ms")) + "–" +
                                        fmt("%.3f", r.num("max_ms")) + ")",
                                    bytes(r.num("l2_read_bytes")), bytes(r.num("l2_write_bytes")),
                                    bytes(r.num("dram_read_bytes")), bytes(r.num("dram_write_bytes"))};
  };
  const auto diff = [&](const char* col) { return bytes(src.num(col) - chip.num(col)); };
  const double tq = std::ceil(src.num("N") / 64.0), heads = src.num("H") * src.num("B");
  const double trips = heads * tq * (tq - 1) / 2;  // Σ_i i: tile i makes i trips
  const double model = trips * 64 * (src.num("d") + 2) * 4;
  Markdown md;
  md.header({"O order", "fwd ms (min–max)", "L2→SM read", "SM→L2 write", "DRAM read", "DRAM write"});
  std::vector<std::string> line = cells(chip);
  line.insert(line.begin(), "on chip (the kernel's)");
  md.line(line);
  line = cells(src);
  line.insert(line.begin(), "source (O_i, m_i, ℓ_i through global memory)");
  md.line(line);
  md.line({"source − on chip", fmt("%+.3f", src.num("ms") - chip.num("ms")) + " (" +
                                   ratio(src.num("ms"), chip.num("ms"), "%.2f×") + ")",
           diff("l2_read_bytes"), diff("l2_write_bytes"), diff("dram_read_bytes"), diff("dram_write_bytes")});
  md.line({"count of the trips", "–", bytes(model), bytes(model), "–", "–"});
  return run_line(chip.str("date"), chip.str("device")) + "bf16, causal, cq × ck = " + chip.str("cq") + " × " +
         chip.str("ck") + ", d = " + chip.str("d") + ", N = " + chip.str("N") + ", H = " + chip.str("H") +
         ", B = " + chip.str("B") + "; bytes of one launch (CUPTI, L2 flushed before each counter). " +
         fmt("%.0f", trips) + " trips of a 64-row O_i tile with m_i and ℓ_i.\n\n" + md.out.str();
}

/// The fast MTA backward (mta_fast_bwd.csv: `flashlab bench mta` fwd, bwd and fwd+bwd rows of one
/// run) beside the unfused PyTorch forward + backward of the same run (mta_fast_bwd_torch.csv), one
/// row per (cq × ck, d) of the bf16 fwd+bwd rows of the run with the most of them.
std::string mta_fast_bwd_table(const std::string& root) {
  const Csv ours_csv = read_csv(root + "/cuda/results/mta_fast_bwd.csv");
  const Csv torch_csv = read_csv(root + "/cuda/results/mta_fast_bwd_torch.csv");
  const std::vector<Row> ours = fullest_run_rows(ours_csv, "fwd+bwd"), torch = rows_of(torch_csv);
  using Key = std::tuple<std::string, std::string, std::string, std::string, std::string>;  // cq ck d N H
  const auto key = [](const Row& r) { return Key{r.str("cq"), r.str("ck"), r.str("d"), r.str("N"), r.str("H")}; };
  std::map<std::pair<Key, std::string>, const Row*> mine;                      // (shape, pass)
  std::map<std::tuple<Key, std::string, std::string>, const Row*> pt;          // (shape, dtype, pass)
  for (const Row& r : ours)
    if (r.str("kernel") == "fast" && r.str("dtype") == "bf16") mine[{key(r), r.str("pass")}] = &r;
  for (const Row& r : torch)
    if (r.str("date") == ours.front().str("date")) pt[{key(r), r.str("dtype"), r.str("pass")}] = &r;
  const auto find = [](const auto& m, const auto& k) -> const Row* {
    const auto it = m.find(k);
    return it == m.end() ? nullptr : it->second;
  };
  Markdown md;
  md.header({"W (cq × ck)", "d", "N", "H", "fwd ms", "bwd ms (min–max)", "bwd TFLOP/s", "fwd+bwd ms (min–max)",
             "PyTorch fwd+bwd ms fp32 / bf16", "PyTorch ÷ fast fwd+bwd (fp32 / bf16)"});
  std::vector<const Row*> rows;
  for (const Row& r : ours)
    if (r.str("kernel") == "fast" && r.str("dtype") == "bf16" && r.str("pass") == "fwd+bwd") rows.push_back(&r);
  std::stable_sort(rows.begin(), rows.end(), [](const Row* a, const Row* b) {
    const auto order = [](const Row* r) { return std::make_tuple(r->num("cq") * r->num("ck"), r->num("cq"), r->num("d")); };
    return order(a) < order(b);
  });
  const auto span = [](const Row* r) {
    return r ? fmt("%.3f", r->num("ms")) + " (" + fmt("%.3f", r->num("min_ms")) + "–" + fmt("%.3f", r->num("max_ms")) + ")"
             : std::string("–");
  };
  for (const Row* row : rows) {
    const Row& r = *row;
    const Key k = key(r);
    const Row* fwd = find(mine, std::make_pair(k, std::string("fwd")));
    const Row* bwd = find(mine, std::make_pair(k, std::string("bwd")));
    const Row* f32 = find(pt, std::make_tuple(k, std::string("fp32"), std::string("fwd+bwd")));
    const Row* b16 = find(pt, std::make_tuple(k, std::string("bf16"), std::string("fwd+bwd")));
    const auto cell = [](const Row* t) { return t ? fmt("%.1f", t->num("torch_ms")) : std::string("–"); };
    const auto times = [&](const Row* t) { return t ? ratio(t->num("torch_ms"), r.num("ms"), "%.0f×") : std::string("–"); };
    md.line({r.str("cq") + " × " + r.str("ck"), r.str("d"), r.str("N"), r.str("H"),
             fwd ? fmt("%.3f", fwd->num("ms")) : std::string("–"), span(bwd),
             bwd ? fmt("%.0f", bwd->num("tflops")) : std::string("–"), span(&r), cell(f32) + " / " + cell(b16),
             times(f32) + " / " + times(b16)});
  }
  const Row& first = ours.front();
  return run_line(first.str("date"), first.str("device")) + "bf16 inputs, causal, B = " + first.str("B") +
         "; fwd, bwd and fwd+bwd each timed alone in the same run, PyTorch (d = 64 shapes) right after it.\n\n" +
         md.out.str();
}

/// The split-K decode of the last 16 rows (mta_fast_bwd.csv, the run with the most decode rows): the
/// rate at which it reads K and V beside a device-to-device copy of the same bytes in the same run.
std::string mta_decode_table(const std::string& root) {
  const Csv csv = read_csv(root + "/cuda/results/mta_fast_bwd.csv");
  Markdown md;
  md.header({"W (cq × ck)", "d", "N", "H", "ms (min–max)", "K, V read TB/s", "D2D copy TB/s (read + write)",
             "ratio"});
  const std::vector<Row> rows = fullest_run_rows(csv, "decode");
  for (const Row& r : rows) {
    if (r.str("pass") != "decode") continue;
    md.line({r.str("cq") + " × " + r.str("ck"), r.str("d"), r.str("N"), r.str("H"),
             fmt("%.3f", r.num("ms")) + " (" + fmt("%.3f", r.num("min_ms")) + "–" + fmt("%.3f", r.num("max_ms")) + ")",
             fmt("%.2f", r.num("read_tbps")), fmt("%.2f", r.num("copy_tbps")),
             ratio(r.num("read_tbps"), r.num("copy_tbps"), "%.2f")});
  }
  const Row& first = rows.front();
  return run_line(first.str("date"), first.str("device")) + "bf16, B = " + first.str("B") +
         ", the last 16 query rows, one wave of split blocks.\n\n" + md.out.str();
}

/// The estimate and apply kernels of one STREAM shape, side by side.
struct StreamShape {
  std::string label;  // "T | d | H | k" cells
  const Row* estimate = nullptr;
  const Row* apply = nullptr;
};

std::vector<StreamShape> stream_shapes(const std::vector<Row>& rows) {
  std::vector<StreamShape> shapes;
  for (const Row& r : rows) {
    const std::string label = r.str("T") + " | " + r.str("d") + " | " + r.str("H") + " | " + r.str("bq") + " × " +
                              r.str("bk") + " | " + r.str("k");
    auto it = std::find_if(shapes.begin(), shapes.end(), [&](const StreamShape& s) { return s.label == label; });
    if (it == shapes.end()) it = shapes.insert(shapes.end(), StreamShape{label});
    const std::string& kernel = r.str("kernel");
    if (kernel.find("estimate") != std::string::npos) it->estimate = &r;
    else if (kernel.find("apply") != std::string::npos) it->apply = &r;
    else throw InputError(r.table->path + ":" + std::to_string(r.table->lines[r.index]) + ": kernel '" + kernel +
                          "' is neither the estimate nor the apply kernel");
  }
  return shapes;
}

/// "counted / measured | ratio | ms" cells of one kernel, or dashes when the run lacks it.
std::string stream_read_cells(const Row* r) {
  if (r == nullptr) return "– | – | –";
  return bytes(r->num("counted_read_bytes")) + " / " + bytes(r->num("l2_read_bytes")) + " | " +
         ratio(r->num("l2_read_bytes"), r->num("counted_read_bytes"), "%.3f") + " | " +
         fmt("%.1f", r->num("duration_ms"));
}

std::string stream_traffic_table(const std::string& root) {
  const Csv csv = read_csv(root + "/cuda/results/stream_traffic.csv");
  const std::vector<Row> rows = newest_rows(csv);
  Markdown md;
  md.header({"T", "d", "H", "b_q × b_k", "k", "estimate: counted / L2→SM read", "ratio", "ms",
             "apply: counted / L2→SM read", "ratio", "ms", "estimate: counted / SM→L2 write", "DRAM read (estimate, apply)"});
  for (const StreamShape& s : stream_shapes(rows)) {
    const Row* e = s.estimate;
    const std::string writes =
        e ? bytes(e->num("counted_write_bytes")) + " / " + bytes(e->num("l2_write_bytes")) : "–";
    const std::string dram = (e ? bytes(e->num("dram_read_bytes")) : "–") + ", " +
                             (s.apply ? bytes(s.apply->num("dram_read_bytes")) : "–");
    md.line({s.label, stream_read_cells(e), stream_read_cells(s.apply), writes, dram});
  }
  return run_line(rows.front().str("date"), rows.front().str("device")) + md.out.str();
}

// ---- STREAM timings (`flashlab bench stream`) beside dense causal SDPA -------------------

/// One line of the STREAM timing table: a shape's estimate row and one of its apply rows.
struct StreamTiming {
  std::string key;  // kernel, dtype, T, d, k, H
  const Row* estimate = nullptr;
  const Row* apply = nullptr;
};

std::vector<StreamTiming> stream_timings(const std::vector<Row>& rows) {
  std::vector<StreamTiming> lines;
  auto key_of = [](const Row& r) {
    return r.str("kernel") + "|" + r.str("dtype") + "|" + r.str("T") + "|" + r.str("d") + "|" + r.str("k") + "|" +
           r.str("H");
  };
  for (const Row& r : rows) {  // apply rows first: one line each (groups differ)
    if (r.str("pass") == "apply") lines.push_back(StreamTiming{key_of(r), nullptr, &r});
    else if (r.str("pass") != "estimate")
      throw InputError(r.table->path + ":" + std::to_string(r.table->lines[r.index]) + ": pass '" + r.str("pass") +
                       "' is neither estimate nor apply");
  }
  for (const Row& r : rows) {
    if (r.str("pass") != "estimate") continue;
    bool attached = false;
    for (StreamTiming& l : lines)
      if (l.key == key_of(r) && l.estimate == nullptr) l.estimate = &r, attached = true;
    if (!attached) lines.push_back(StreamTiming{key_of(r), &r, nullptr});
  }
  return lines;
}

std::string ms_or_dash(const Row* r) { return r ? fmt("%.3f", r->num("ms")) : "–"; }

std::string stream_timing_table(const std::string& root) {
  const Csv csv = read_csv(root + "/cuda/results/stream_fast.csv");
  const std::vector<Row> rows = newest_rows(csv);
  Markdown md;
  md.header({"kernels", "dtype", "T", "d", "k", "query blocks per thread block", "estimate ms", "apply ms",
             "estimate + apply ms", "extra device bytes (estimate / apply)"});
  for (const StreamTiming& l : stream_timings(rows)) {
    const Row& any = l.apply ? *l.apply : *l.estimate;
    const std::string total = l.apply && l.estimate ? fmt("%.3f", l.estimate->num("ms") + l.apply->num("ms")) : "–";
    const std::string extra = (l.estimate ? fmt("%.0f", l.estimate->num("extra_bytes")) : "–") + " / " +
                              (l.apply ? fmt("%.0f", l.apply->num("extra_bytes")) : "–");
    md.line({any.str("kernel"), any.str("dtype"), any.str("T"), any.str("d"), any.str("k"),
             l.apply && any.str("kernel") == "fast" ? any.str("group") : "–", ms_or_dash(l.estimate),
             ms_or_dash(l.apply), total, extra});
  }
  const Row& first = rows.front();
  return run_line(first.str("date"), first.str("device")) + "H = " + first.str("H") + ", b_q = " + first.str("bq") +
         ", b_k = " + first.str("bk") + ", causal; medians (the launch count is the CSV's `reps`), each launch alone, "
         "L2 flushed before each.\n\n" + md.out.str();
}

std::string ratio_or_dash(const Row& r, const std::string& column) {
  return r.has(column) && r.str(column) != "n/a" ? r.str(column) + "×" : "–";
}

std::string ms_cell(const Row& r, const std::string& column) {
  return r.has(column) && r.str(column) != "n/a" ? fmt("%.1f", r.num(column)) : "–";
}

std::string stream_sdpa_table(const std::string& root) {
  const Csv csv = read_csv(root + "/cuda/results/stream_sdpa.csv");
  const std::vector<Row> rows = newest_rows(csv);
  Markdown md;
  md.header({"kernels", "dtype", "T", "d", "k", "STREAM passes", "STREAM ms", "dense cuDNN ms", "dense flash ms",
             "× faster than cuDNN", "× faster than flash"});
  for (const Row& r : rows)
    md.line({r.str("kernel"), r.str("dtype"), r.str("T"), r.str("d"), r.str("k"), r.str("passes"),
             fmt("%.3f", r.num("stream_ms")), ms_cell(r, "cudnn_ms"), ms_cell(r, "flash_ms"),
             ratio_or_dash(r, "cudnn/stream"), ratio_or_dash(r, "flash/stream")});
  return run_line(rows.front().str("date"), rows.front().str("device")) + md.out.str();
}

/// ncu's view of the fast apply at T = 1M per grouping (newest run): what loading the K/V blocks of
/// two neighbouring query blocks once saves.
std::string stream_group_table(const std::string& root) {
  const Csv csv = read_csv(root + "/cuda/results/stream_fast_ncu.csv");
  const std::vector<Row> rows = newest_rows(csv);
  std::map<std::string, std::map<std::string, double>> by_group;  // group → metric → value
  for (const Row& r : rows) by_group[r.str("group")][r.str("metric")] = r.num("value");
  Markdown md;
  md.header({"query blocks per thread block", "L2→SM read", "DRAM read", "DRAM write", "ncu duration ms",
             "warps active %", "tensor pipe active %"});
  for (const auto& [group, m] : by_group) {
    const auto get = [&](const char* name) {
      const auto it = m.find(name);
      if (it == m.end()) throw InputError(csv.path + ": group " + group + " has no metric '" + name + "'");
      return it->second;
    };
    md.line({group, bytes(32.0 * get("lts__t_sectors_srcunit_tex_op_read.sum")), bytes(get("dram__bytes_read.sum")),
             bytes(get("dram__bytes_write.sum")), fmt("%.3f", get("gpu__time_duration.sum") / 1e6),
             fmt("%.1f", get("sm__warps_active.avg.pct_of_peak_sustained_active")),
             fmt("%.1f", get("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"))});
  }
  const Row& first = rows.front();
  return run_line(first.str("date"), first.str("device")) + "T = " + first.str("T") + ", d = " + first.str("d") +
         ", k = " + first.str("k") + ", bf16, one head; one launch per grouping, caches flushed by ncu.\n\n" +
         md.out.str();
}

/// README: STREAM at a million tokens (bf16, d = 128, k = 8, one head), newest run, beside dense.
std::string readme_stream_table(const std::string& root) {
  const Csv sdpa = read_csv(root + "/cuda/results/stream_sdpa.csv");
  const Csv fast = read_csv(root + "/cuda/results/stream_fast.csv");
  std::optional<Row> best;
  for (const Row& r : rows_of(sdpa))
    if (r.str("kernel") == "fast" && r.str("dtype") == "bf16" && r.str("T") == "1048576" && r.str("d") == "128" &&
        r.str("k") == "8" && r.str("H") == "1" && (!best || r.str("date") > best->str("date")))
      best = r;
  if (!best) throw InputError(sdpa.path + ": no fast bf16 row at T = 1048576, d = 128, k = 8, H = 1");
  // Extra bytes of the estimate and of the apply (one query block per thread block) of that run.
  double extra = 0;
  int passes = 0;
  for (const Row& r : rows_of(fast))
    if (r.str("date") == best->str("date") && r.str("kernel") == "fast" && r.str("dtype") == "bf16" &&
        r.str("T") == "1048576" && r.str("d") == "128" && r.str("k") == "8" && r.str("H") == "1" &&
        (r.str("pass") == "estimate" || r.str("group") == "1"))
      extra = std::max(extra, r.num("extra_bytes")), ++passes;  // the passes run one after the other
  Markdown md;
  md.header({"STREAM, T = 1,048,576, d = 128, k = 8, bf16", "estimate ms", "apply ms", "dense causal cuDNN ms",
             "× faster", "extra device bytes (peak)", "run (UTC)"});
  const auto cell = [&](const char* c) { return best->has(c) ? fmt("%.2f", best->num(c)) : std::string("–"); };
  md.line({best->str("passes"), cell("estimate_ms"), cell("apply_ms"), ms_cell(*best, "cudnn_ms"),
           ratio_or_dash(*best, "cudnn/stream"), passes ? fmt("%.0f", extra) : "–", best->str("date")});
  return md.out.str();
}

/// README's MTA row: the fast bf16 forward (newest run of mta_fast.csv) and forward + backward
/// (the run of mta_fast_bwd.csv with the most such rows) at one shape, each beside the unfused fp32 PyTorch
/// implementation timed in the same run (mta_torch.csv, mta_fast_bwd_torch.csv).
std::string readme_mta_table(const std::string& root) {
  // Rows point into their Csv: the four files stay alive for the whole function.
  const Csv fwd_csv = read_csv(root + "/cuda/results/mta_fast.csv");
  const Csv fwd_torch_csv = read_csv(root + "/cuda/results/mta_torch.csv");
  const Csv both_csv = read_csv(root + "/cuda/results/mta_fast_bwd.csv");
  const Csv both_torch_csv = read_csv(root + "/cuda/results/mta_fast_bwd_torch.csv");
  const std::vector<Row> fwd = newest_rows(fwd_csv), both = fullest_run_rows(both_csv, "fwd+bwd");
  // PyTorch only from the run of the rows it stands beside.
  const auto same_run = [](const Csv& csv, const std::string& date) {
    std::vector<Row> rows;
    for (const Row& r : rows_of(csv))
      if (r.str("date") == date) rows.push_back(r);
    return rows;
  };
  const std::vector<Row> fwd_torch = same_run(fwd_torch_csv, fwd.front().str("date"));
  const std::vector<Row> both_torch = same_run(both_torch_csv, both.front().str("date"));
  const auto pick = [](const std::vector<Row>& rows, const std::string& w, const std::string& pass,
                       const std::string& dtype, const char* kernel) -> const Row* {
    for (const Row& r : rows)
      if (r.str("cq") == w && r.str("ck") == w && r.str("d") == "64" && r.str("N") == "4096" && r.str("H") == "16" &&
          r.str("pass") == pass && r.str("dtype") == dtype && (!kernel || r.str("kernel") == kernel))
        return &r;
    return nullptr;
  };
  const auto ms = [](const Row* r, const char* column) { return r ? fmt("%.3f", r->num(column)) : std::string("–"); };
  const auto times = [](const Row* torch, const Row* ours) {
    return torch && ours ? ratio(torch->num("torch_ms"), ours->num("ms"), "%.0f×") : std::string("–");
  };
  Markdown md;
  md.header({"MTA, causal, H = 16, N = 4096, d = 64, bf16", "fast fwd ms", "PyTorch fp32 fwd ms", "× faster",
             "fast fwd+bwd ms", "PyTorch fp32 fwd+bwd ms", "× faster", "runs (UTC)"});
  for (const std::string w : {"3", "11"}) {
    const Row* f = pick(fwd, w, "fwd", "bf16", "fast");
    const Row* ft = pick(fwd_torch, w, "fwd", "fp32", nullptr);
    const Row* b = pick(both, w, "fwd+bwd", "bf16", "fast");
    const Row* bt = pick(both_torch, w, "fwd+bwd", "fp32", nullptr);
    md.line({w + " × " + w, ms(f, "ms"), ms(ft, "torch_ms"), times(ft, f), ms(b, "ms"), ms(bt, "torch_ms"), times(bt, b),
             fwd.front().str("date") + " / " + both.front().str("date")});
  }
  return md.out.str();
}

/// The fast bf16 estimate (`flashlab bench stream --check-indices`, measure.sh stream): time per shape, its extra device
/// memory, and the CUPTI traffic of one launch where the run measured it (−1 in the CSV: not).
std::string stream_fast_estimate_table(const std::string& root) {
  const Csv csv = read_csv(root + "/cuda/results/stream_fast_estimate.csv");
  const std::vector<Row> rows = newest_rows(csv);
  Markdown md;
  md.header({"T", "d", "k", "ms (median)", "min – max", "extra memory", "L2→SM read", "DRAM read",
             "DRAM read rate", "I same every launch"});
  for (const Row& r : rows) {
    const bool measured = r.num("dram_read_bytes") >= 0;
    const double ms = r.num("ms");
    md.line({r.str("T"), r.str("d"), r.str("k"), fmt("%.3f", ms), fmt("%.3f", r.num("min_ms")) + " – " +
             fmt("%.3f", r.num("max_ms")), fmt("%.0f B", r.num("extra_bytes")),
             measured ? bytes(r.num("l2_read_bytes")) : "–", measured ? bytes(r.num("dram_read_bytes")) : "–",
             measured ? fmt("%.2f TB/s", r.num("dram_read_bytes") / (ms * 1e9)) : "–", yes_no(r.str("same_every_launch"))});
  }
  const Row& first = rows.front();
  return run_line(first.str("date"), first.str("device")) + "One head, b_q = b_k = 64, causal, " + first.str("dtype") +
         " inputs, 20 launches per shape (10 with traffic), L2 flushed before each.\n\n" + md.out.str();
}

// ---- CPU benchmark table ------------------------------------------------------------------

std::string readme_cpu_table(const std::string& root) {
  const Csv csv = read_csv(root + "/bench/results/cpu.csv");
  Markdown md;
  md.header({"what", "figure", "target", "command", "date, machine"});
  for (const Row& r : rows_of(csv))
    md.line({r.str("benchmark"), fmt("%.3g", r.num("value")) + (r.has("unit") ? " " + r.str("unit") : ""),
             r.has("target") ? r.str("target") : "–", "`" + r.str("command") + "`",
             r.str("date") + ", " + r.str("machine")});
  return md.out.str();
}

// ---- pages ----------------------------------------------------------------------------------

using Renderer = std::function<std::string(const std::string&)>;

const std::map<std::string, Renderer>& renderers() {
  static const std::map<std::string, Renderer> table = {
      {"checks", checks_table},
      {"worst_errors", worst_errors_table},
      {"traffic_kernels", traffic_kernels_table},
      {"traffic_sweep", traffic_sweep_table},
      {"readme_traffic", readme_traffic_table},
      {"fast_bf16", [](const std::string& r) { return fast_sweep_table(r, "bf16"); }},
      {"fast_fp16", [](const std::string& r) { return fast_sweep_table(r, "fp16"); }},
      {"fast_headline", fast_headline_table},
      {"readme_fast", readme_fast_table},
      {"readme_cpu", readme_cpu_table},
      {"tma_ws_sweep", [](const std::string& r) { return tma_ws_table(r, 0, false); }},
      {"tma_ws_long", [](const std::string& r) { return tma_ws_table(r, 8192, true); }},  // beside wgmma
      // The kept kernel of the three-consumer rung (its sweep, before later rungs replaced it)
      {"tma_ws_sweep_three_consumers", [](const std::string& r) { return tma_ws_table(r, 0, false, "2026-11-23 23:35"); }},
      // The wider key tiles' rung (its sweep, before later rungs replaced it)
      {"tma_ws_sweep_wide_keys", [](const std::string& r) { return tma_ws_table(r, 0, false, "2026-11-24 01:46"); }},
      // Rung 14: the lagging maximum, the vote and the early exponentials beside the build before
      {"tma_ws_lag", [](const std::string& r) { return tma_ws_variants_table(r, "2026-11-24 03:10"); }},
      {"tma_ws_vote", [](const std::string& r) { return tma_ws_variants_table(r, "2026-11-24 03:33"); }},
      {"tma_ws_early", [](const std::string& r) { return tma_ws_variants_table(r, "2026-11-24 03:53"); }},
      {"tma_ws_exp_fma", [](const std::string& r) { return tma_ws_variants_table(r, "2026-11-24 04:55"); }},
      {"tma_ws_two_p", [](const std::string& r) { return tma_ws_variants_table(r, "2026-11-24 05:18"); }},
      {"tma_ws_desc", [](const std::string& r) { return tma_ws_variants_table(r, "2026-11-24 05:38"); }},
      {"tma_ws_split_tail", [](const std::string& r) { return tma_ws_variants_table(r, "2026-11-24 06:17"); }},
      {"tma_ws_split_tail_first", [](const std::string& r) { return tma_ws_variants_table(r, "2026-11-24 05:56"); }},
      {"tma_ws_runs", tma_ws_runs_table},
      {"tma_ws_checks", tma_ws_checks_table},
      {"bwd_ws_sweep", bwd_ws_table},
      {"bwd_ws_checks", bwd_ws_checks_table},
      {"bwd_ws_before", [](const std::string& r) { return bwd_ws_before_table(r); }},
      // Rung 13: the ping-pong build beside the Rung 11 build and the three-stage one
      {"bwd_ws_pingpong", [](const std::string& r) { return bwd_ws_before_table(r, "rung11"); }},
      {"mta_traffic", mta_traffic_table},
      {"mta_fast", mta_fast_table},
      {"mta_fast_checks", mta_fast_checks_table},
      {"mta_fast_bwd", mta_fast_bwd_table},
      {"mta_decode", mta_decode_table},
      {"mta_o_order", mta_o_order_table},
      {"mta_fast_bwd_checks", [](const std::string& r) { return checks_rows(r + "/cuda/results/mta_fast_bwd_checks.csv"); }},
      {"stream_traffic", stream_traffic_table},
      {"stream_timing", stream_timing_table},
      {"stream_sdpa", stream_sdpa_table},
      {"stream_group", stream_group_table},
      {"readme_stream", readme_stream_table},
      {"readme_mta", readme_mta_table},
      {"stream_fast_estimate", stream_fast_estimate_table},
  };
  return table;
}

const std::string kBegin = "<!-- begin generated: ";
const std::string kEnd = "<!-- end generated: ";

/// The name in a marker line "<!-- begin generated: NAME -->", or "" when the line is no marker.
std::string marker_name(const std::string& line, const std::string& prefix) {
  if (line.rfind(prefix, 0) != 0) return "";
  const auto stop = line.find(" -->", prefix.size());
  return stop == std::string::npos ? "" : line.substr(prefix.size(), stop - prefix.size());
}

struct PageResult {
  std::string text;
  std::vector<std::string> stale;  // "NAME (line N)" of each table that differs
};

PageResult regenerate(const std::string& page, const std::string& text, const std::string& root) {
  std::istringstream in(text);
  PageResult result;
  std::string line, open, body;
  int number = 0, open_line = 0;
  while (std::getline(in, line)) {
    ++number;
    const std::string where = page + ":" + std::to_string(number);
    if (!open.empty()) {
      if (marker_name(line, kBegin) != "") throw InputError(where + ": begin marker inside '" + open + "'");
      const std::string end = marker_name(line, kEnd);
      if (end.empty()) {
        body += line + "\n";
        continue;
      }
      if (end != open) throw InputError(where + ": end marker '" + end + "' closes '" + open + "'");
      const std::string fresh = renderers().at(open)(root);
      if (fresh != body) result.stale.push_back(open + " (line " + std::to_string(open_line) + ")");
      result.text += fresh + line + "\n";
      open.clear();
      continue;
    }
    result.text += line + "\n";
    open = marker_name(line, kBegin);
    if (!open.empty() && !renderers().count(open)) throw InputError(where + ": no generated table named '" + open + "'");
    open_line = number;
    body.clear();
    if (marker_name(line, kEnd) != "") throw InputError(where + ": end marker without a begin marker");
  }
  if (!open.empty()) throw InputError(page + ":" + std::to_string(open_line) + ": '" + open + "' is never ended");
  return result;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

int run(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  const bool check = !args.empty() && args.front() == "--check";
  if (check) args.erase(args.begin());
  if (args.size() < 2) {
    std::cerr << "usage: results_tables [--check] REPO_ROOT PAGE...\n";
    return 2;
  }
  int stale = 0;
  for (std::size_t i = 1; i < args.size(); ++i) {
    const std::string old_text = slurp(args[i]);
    const PageResult r = regenerate(args[i], old_text, args[0]);
    for (const auto& s : r.stale) {
      std::cerr << args[i] << ": generated table " << s << (check ? " differs from " : " rewritten from ")
                << "the CSVs under " << args[0] << "\n";
      ++stale;
    }
    if (!check && r.text != old_text) std::ofstream(args[i], std::ios::binary) << r.text;
  }
  if (check && stale > 0) {
    std::cerr << "hint: regenerate with `cmake --build --preset cpu --target results-pages`\n";
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const InputError& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
}
