// results_tables — the measured tables and plots of cuda/RESULTS.md, README.md and the GPU sections of
// docs/mta.md and docs/stream.md, generated from the CSV files in cuda/results/ (written by
// cuda/bench/measure.sh on the GPU machine) and bench/results/cpu.csv (written by bench/measure_cpu.sh).
//
// Manual. `results_tables [--check] REPO_ROOT PAGE...` reads the CSVs under REPO_ROOT. A page marks
// each generated table with
//     <!-- begin generated: NAME -->
//     ...
//     <!-- end generated: NAME -->
// and this program replaces what lies between the two lines with table NAME rendered from the CSVs.
// It also draws the sweeps as SVG plots, REPO_ROOT/docs/measured_*.svg (kPlots below), which the pages
// show as images. Without --check it rewrites the pages and the plots in place; with --check it
// changes nothing and exits 1 when a page's table or a plot differs from what the CSVs give (CTest
// runs it so). Exit 2: a CSV or a page is malformed (the message names file:line).
//
// The CSVs hold only runs of the kernels that are in the tree, each row with the commit that built
// it (cuda/results/README.md says how that was established); runs of builds the tree no longer has
// live in cuda/results/archive/, which this program never reads. A row whose commit is not a commit
// hash (unknown, uncommitted, a -dirty build) is refused. Columns: cuda/results/README.md and
// bench/results/README.md.
#include "core/svg_plot.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
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

  bool has_column(const std::string& name) const {
    return std::find(header.begin(), header.end(), name) != header.end();
  }
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

/// A commit as the results record it: 7 to 40 lowercase hex digits.
bool is_commit(const std::string& s) {
  return s.size() >= 7 && s.size() <= 40 &&
         std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
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
      if (!csv.has_column("commit"))
        throw InputError(where + ": no 'commit' column (date,device,commit,… : the commit that built the binaries)");
      continue;
    }
    if (fields.size() != csv.header.size())
      throw InputError(where + ": " + std::to_string(fields.size()) + " fields, the header has " +
                       std::to_string(csv.header.size()));
    const std::string& commit = fields[csv.column("commit")];
    if (!is_commit(commit))
      throw InputError(where + ": commit '" + commit + "' is not a commit hash (hint: a run of a build that is not " +
                       "a commit of the history belongs in cuda/results/archive/, which the pages do not read)");
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
  bool has(const std::string& name) const { return !str(name).empty() && str(name) != "n/a"; }
  double num(const std::string& name) const {
    const std::string& s = str(name);
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    if (s.empty() || *end != '\0' || !std::isfinite(v))
      throw InputError(where() + ": column '" + name + "' is not a number: '" + s + "'");
    return v;
  }
  std::string where() const { return table->path + ":" + std::to_string(table->lines[index]); }
};

std::vector<Row> rows_of(const Csv& csv) {
  std::vector<Row> rows;
  for (std::size_t i = 0; i < csv.rows.size(); ++i) rows.push_back(Row{&csv, i});
  return rows;
}

/// The rows of the newest run (largest date) of a file; empty when the file has none.
std::vector<Row> newest_rows(const Csv& csv) {
  std::string newest;
  for (const Row& r : rows_of(csv)) newest = std::max(newest, r.str("date"));
  std::vector<Row> rows;
  for (const Row& r : rows_of(csv))
    if (r.str("date") == newest) rows.push_back(r);
  return rows;
}

/// The rows of the run (date) with the most rows of pass `pass` (a tie goes to the newer): a full
/// sweep, which a later run of a few shapes does not replace. Empty when no row has that pass.
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
    if (!run.empty() && r.str("date") == run) rows.push_back(r);
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

/// "Run: DATE UTC, DEVICE, commit C." for a table whose rows come from one run.
std::string run_line(const Row& r) {
  return "Run: " + r.str("date") + " UTC, " + r.str("device") + ", commit " + r.str("commit") + ".\n\n";
}

/// What a table says when its file holds no run of the kernels in the tree.
std::string no_current_run(const std::string& file) {
  return "No run of the kernel as it is in the tree is recorded in `cuda/results/" + file +
         "` (runs of earlier builds: `cuda/results/archive/`).\n";
}

// ---- correctness ----------------------------------------------------------------------------

/// Every test and sanitizer command of the checks files, oldest first.
std::string checks_table(const std::string& root) {
  std::vector<Csv> files;
  for (const char* f : {"checks.csv", "fwd_tma_ws_checks.csv", "bwd_ws_checks.csv", "mta_fast_checks.csv",
                        "mta_fast_bwd_checks.csv", "stream_checks.csv"})
    files.push_back(read_csv(root + "/cuda/results/" + f));
  std::vector<Row> rows;
  for (const Csv& c : files)
    for (const Row& r : rows_of(c)) rows.push_back(r);
  std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.str("date") < b.str("date"); });
  std::set<std::string> devices;
  Markdown md;
  md.header({"date (UTC)", "commit", "command", "result", "assertions", "test cases", "sanitizer errors"});
  const auto or_dash = [](const Row& r, const std::string& c) { return r.has(c) ? r.str(c) : std::string("–"); };
  for (const Row& r : rows) {
    devices.insert(r.str("device"));
    md.line({r.str("date"), r.str("commit"), "`" + r.str("command") + "`", r.str("status"), or_dash(r, "assertions"),
             or_dash(r, "test_cases"), or_dash(r, "sanitizer_errors")});
  }
  std::string lead = "Device:";
  for (const std::string& d : devices) lead += " " + d;
  return lead + ".\n\n" + md.out.str();
}

/// Per test group: each quantity's worst error over every recorded run of the kernels in the tree.
std::string worst_errors_table(const std::string& root) {
  std::vector<Csv> files;
  for (const char* f : {"worst_errors.csv", "mta_fast_worst_errors.csv", "mta_fast_bwd_worst_errors.csv"})
    files.push_back(read_csv(root + "/cuda/results/" + f));
  struct Worst {
    double error = 0, tolerance = 0;
  };
  struct Group {
    std::vector<std::string> quantities;  // in order of appearance
    std::map<std::string, Worst> worst;
    std::set<std::string> runs;
    std::string newest, commit;
  };
  std::map<std::string, Group> groups;
  for (const Csv& c : files)
    for (const Row& r : rows_of(c)) {
      Group& g = groups[r.str("group")];
      const std::string& q = r.str("quantity");
      if (!g.worst.count(q)) g.quantities.push_back(q);
      Worst& w = g.worst[q];
      w.error = std::max(w.error, r.num("worst_error"));
      w.tolerance = std::max(w.tolerance, r.num("tolerance"));
      g.runs.insert(r.str("date"));
      if (r.str("date") >= g.newest) g.newest = r.str("date"), g.commit = r.str("commit");
    }
  Markdown md;
  md.header({"test group", "worst error / tolerance, per quantity", "runs", "newest run (UTC), commit"});
  for (const auto& [name, g] : groups) {
    std::string cell;
    for (const std::string& q : g.quantities) {
      const Worst& w = g.worst.at(q);
      cell += (cell.empty() ? "" : "; ") + q + " " + fmt("%.2e", w.error) + " / " + fmt("%.0e", w.tolerance);
    }
    md.line({name, cell, std::to_string(g.runs.size()), g.newest + ", " + g.commit});
  }
  return md.out.str();
}

// ---- traffic of the clear attention kernels -------------------------------------------------

std::string traffic_kernels_table(const std::string& root) {
  const Csv csv = read_csv(root + "/cuda/results/traffic_kernels.csv");
  const std::vector<Row> rows = newest_rows(csv);
  if (rows.empty()) return no_current_run("traffic_kernels.csv");
  Markdown md;
  md.header({"kernel", "N", "causal", "model read", "tiled model read", "L2→SM read", "L2→SM / tiled model",
             "L2 slice read", "DRAM read", "model write", "SM→L2 write", "DRAM write", "L2 atomic", "ms"});
  for (const Row& r : rows) {
    if (r.str("variant") == "naive") continue;  // the naive kernels are in the sweep table
    md.line({"`" + r.str("kernel") + "`", r.str("seq"), yes_no(r.str("causal")), bytes(r.num("model_read_bytes")),
             bytes(r.num("tiled_model_read_bytes")), bytes(r.num("l2_read_bytes")),
             ratio(r.num("l2_read_bytes"), r.num("tiled_model_read_bytes"), "%.3f"), bytes(r.num("lts_read_bytes")),
             bytes(r.num("dram_read_bytes")), bytes(r.num("model_write_bytes")), bytes(r.num("l2_write_bytes")),
             bytes(r.num("dram_write_bytes")), bytes(r.num("l2_atomic_bytes")),
             fmt("%.2f", r.num("duration_ns") / 1e6)});
  }
  return run_line(rows.front()) + md.out.str();
}

/// Whole-pass totals per N of the naive kernels and of FA2's one kernel (reads + writes).
struct SweepTotals {
  double model = 0, l2 = 0, dram = 0, ms = 0;
};

std::map<long, std::map<std::string, SweepTotals>> sweep_totals(const std::vector<Row>& rows) {
  std::map<long, std::map<std::string, SweepTotals>> by_n;
  for (const Row& r : rows) {
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
  const std::vector<Row> rows = newest_rows(csv);
  if (rows.empty()) return no_current_run("traffic_sweep.csv");
  Markdown md;
  md.header({"N", "model naive", "model flash", "model ratio", "L2→SM naive", "L2→SM flash", "L2 ratio", "DRAM naive",
             "DRAM flash", "DRAM ratio", "ms naive", "ms flash"});
  for (const auto& [n, v] : sweep_totals(rows)) {
    const SweepTotals naive = v.count("naive") ? v.at("naive") : SweepTotals{};
    const SweepTotals flash = v.count("fa2") ? v.at("fa2") : SweepTotals{};
    md.line({std::to_string(n), bytes(naive.model), bytes(flash.model), ratio(naive.model, flash.model, "%.2f"),
             bytes(naive.l2), bytes(flash.l2), ratio(naive.l2, flash.l2, "%.2f"), bytes(naive.dram),
             bytes(flash.dram), ratio(naive.dram, flash.dram, "%.1f"), fmt("%.2f", naive.ms), fmt("%.2f", flash.ms)});
  }
  return run_line(rows.front()) + md.out.str();
}

std::string readme_traffic_table(const std::string& root) {
  const Csv csv = read_csv(root + "/cuda/results/traffic_sweep.csv");
  const std::vector<Row> rows = newest_rows(csv);
  if (rows.empty()) return no_current_run("traffic_sweep.csv");
  Markdown md;
  md.header({"N", "model naive", "model FA2", "L2→SM naive", "L2→SM FA2", "DRAM naive", "DRAM FA2", "DRAM ratio"});
  for (const auto& [n, v] : sweep_totals(rows)) {
    if (n != 1024 && n != 4096 && n != 16384) continue;
    const SweepTotals naive = v.count("naive") ? v.at("naive") : SweepTotals{};
    const SweepTotals flash = v.count("fa2") ? v.at("fa2") : SweepTotals{};
    md.line({std::to_string(n), bytes(naive.model), bytes(flash.model), bytes(naive.l2), bytes(flash.l2),
             bytes(naive.dram), bytes(flash.dram), ratio(naive.dram, flash.dram, "%.0f×")});
  }
  return md.out.str();
}

// ---- attention timings: the fast kernels beside PyTorch SDPA ------------------------------------

/// The kernels in ladder order, each with the `flashlab bench attention` flag that selects it.
struct AttentionKernel {
  const char* pass;
  const char* label;  // the CSV's kernel column (without a -repeat suffix)
  const char* flag;
};
constexpr AttentionKernel kAttentionKernels[] = {
    {"fwd", "mma", "--fwd-kernel mma"},           {"fwd", "wgmma", "--fwd-kernel wgmma"},
    {"fwd", "tma-ws", "--fwd-kernel tma-ws"},     {"bwd", "two-kernel", "--bwd-design two-kernel"},
    {"bwd", "atomic", "--bwd-kernel mma"},        {"bwd", "wgmma-ws", "--bwd-kernel wgmma-ws"},
};

/// The kernel label without the `-repeat` / `-repeatN` suffix that marks another sweep of one run.
std::string kernel_of(const std::string& label) {
  const auto at = label.rfind("-repeat");
  if (at == std::string::npos) return label;
  for (std::size_t i = at + 7; i < label.size(); ++i)
    if (label[i] < '0' || label[i] > '9') return label;
  return label.substr(0, at);
}

/// fast_attention.csv, fwd_tma_ws.csv and bwd_ws.csv (same columns), loaded once; rows point into it.
class AttentionRuns {
 public:
  explicit AttentionRuns(const std::string& root)
      : files_{read_csv(root + "/cuda/results/fast_attention.csv"), read_csv(root + "/cuda/results/fwd_tma_ws.csv"),
               read_csv(root + "/cuda/results/bwd_ws.csv")} {
    for (const Csv& c : files_)
      for (const Row& r : rows_of(c)) rows_.push_back(r);
  }
  AttentionRuns(const AttentionRuns&) = delete;
  AttentionRuns& operator=(const AttentionRuns&) = delete;

  /// Rows of one kernel at one shape (dtype bf16 unless given), oldest first.
  std::vector<Row> at(const std::string& pass, const std::string& kernel, int d, bool causal, long n,
                      const std::string& dtype = "bf16") const {
    std::vector<Row> out;
    for (const Row& r : rows_)
      if (r.str("pass") == pass && kernel_of(r.str("kernel")) == kernel && r.str("dtype") == dtype &&
          r.num("d") == d && (r.str("causal") == "1") == causal && long(r.num("N")) == n)
        out.push_back(r);
    std::stable_sort(out.begin(), out.end(), [](const Row& a, const Row& b) { return a.str("date") < b.str("date"); });
    return out;
  }
  /// The (d, causal, N) shapes one kernel was timed at, d = 128 first.
  std::vector<std::tuple<int, bool, long>> shapes(const std::string& pass, const std::string& kernel) const {
    std::set<std::tuple<int, bool, long>> s;
    for (const Row& r : rows_)
      if (r.str("pass") == pass && kernel_of(r.str("kernel")) == kernel && r.str("dtype") == "bf16")
        s.insert({-int(r.num("d")), r.str("causal") == "1", long(r.num("N"))});
    std::vector<std::tuple<int, bool, long>> out;
    for (const auto& [md, c, n] : s) out.emplace_back(-md, c, n);
    return out;
  }
  const std::vector<Row>& rows() const { return rows_; }

 private:
  std::vector<Csv> files_;
  std::vector<Row> rows_;
};

bool has_sdpa(const Row& r) { return r.has("fa2_bnhd_tflops") && r.has("cudnn_bnhd_tflops"); }

/// The first sweep of the newest run among `rows` with SDPA figures of its own run, or none.
std::optional<Row> newest_with_sdpa(const std::vector<Row>& rows) {
  std::optional<Row> best;
  for (const Row& r : rows)
    if (has_sdpa(r) && (!best || r.str("date") > best->str("date"))) best = r;
  return best;
}

/// "min–max (n)" of ours ÷ cuDNN (bnhd) over every row with SDPA figures.
std::string cudnn_spread(const std::vector<Row>& rows) {
  double lo = INFINITY, hi = -INFINITY;
  int n = 0;
  for (const Row& r : rows)
    if (has_sdpa(r)) {
      const double x = r.num("tflops") / r.num("cudnn_bnhd_tflops");
      lo = std::min(lo, x), hi = std::max(hi, x), ++n;
    }
  if (n == 0) return "–";
  const std::string a = fmt("%.2f", lo), b = fmt("%.2f", hi);
  return (a == b ? a : a + "–" + b) + " (" + std::to_string(n) + ")";
}

std::string sdpa_pair(const Row& r, const char* a, const char* b) {
  return r.has(a) && r.has(b) ? fmt("%.1f", r.num(a)) + " / " + fmt("%.1f", r.num(b)) : "–";
}

std::string over(const Row& r, const char* column) {
  return r.has(column) ? ratio(r.num("tflops"), r.num(column), "%.2f") : "–";
}

/// Every run at the headline shape (bf16, d = 128, N = 8192, non-causal), kernels in ladder order.
std::string fast_headline_table(const std::string& root) {
  const AttentionRuns runs(root);
  Markdown md;
  md.header({"pass", "kernel", "run (UTC)", "commit", "TFLOP/s", "SDPA FA2 (bnhd / bhnd)", "SDPA cuDNN (bnhd / bhnd)",
             "÷ FA2", "÷ cuDNN"});
  for (const AttentionKernel& k : kAttentionKernels)
    for (const Row& r : runs.at(k.pass, k.label, 128, false, 8192))
      md.line({k.pass, k.label, r.str("date"), r.str("commit"), fmt("%.1f", r.num("tflops")),
               sdpa_pair(r, "fa2_bnhd_tflops", "fa2_bhnd_tflops"), sdpa_pair(r, "cudnn_bnhd_tflops", "cudnn_bhnd_tflops"),
               over(r, "fa2_bnhd_tflops"), over(r, "cudnn_bnhd_tflops")});
  return md.out.str();
}

/// README: per kernel of the ladder, its newest run with SDPA at N = 8192 non-causal (d = 128; the
/// Hopper kernels also d = 64), the anchors beside it and ours ÷ cuDNN over every run of that shape.
std::string readme_fast_table(const std::string& root) {
  const AttentionRuns runs(root);
  std::set<std::string> devices;
  Markdown md;
  md.header({"pass", "kernel", "d", "TFLOP/s", "SDPA cuDNN", "SDPA FA2", "÷ cuDNN", "÷ FA2", "÷ cuDNN, every run (n)",
             "run (UTC)", "commit"});
  for (const AttentionKernel& k : kAttentionKernels)
    for (const int d : {128, 64}) {
      const std::vector<Row> rows = runs.at(k.pass, k.label, d, false, 8192);
      const std::optional<Row> r = newest_with_sdpa(rows);
      if (!r || (d == 64 && std::string(k.label) != "tma-ws" && std::string(k.label) != "wgmma-ws")) continue;
      devices.insert(r->str("device"));
      std::string flag = "`";  // appended piece by piece: GCC 12 warns (-Wrestrict) on "`" + std::string
      flag += k.flag;
      flag += '`';
      md.line({k.pass, flag, std::to_string(d), fmt("%.1f", r->num("tflops")),
               fmt("%.1f", r->num("cudnn_bnhd_tflops")), fmt("%.1f", r->num("fa2_bnhd_tflops")),
               over(*r, "cudnn_bnhd_tflops"), over(*r, "fa2_bnhd_tflops"), cudnn_spread(rows), r->str("date"),
               r->str("commit")});
    }
  std::string device;
  for (const std::string& d : devices) device += (device.empty() ? "" : ", ") + d;
  return device + "; bf16, B = 1, H = 16, N = 8192, non-causal. Each row: `flashlab bench attention --csv --seq 8192 "
                  "--no-causal --dim d --pass fwd|bwd KERNEL`, then `python3 cuda/bench/sdpa_bench.py` on its CSV in "
                  "the same run (PyTorch SDPA on the same [B, N, H, d] memory).\n\n" +
         md.out.str();
}

/// One kernel's newest run with SDPA per shape (d, causal, N): TFLOP/s, the anchors of that run,
/// and ours ÷ cuDNN over every run of the shape. One run → a run line; several → a column each.
std::string kernel_sweep_table(const std::string& root, const std::string& pass, const std::string& kernel) {
  const AttentionRuns runs(root);
  std::vector<std::pair<Row, std::vector<Row>>> lines;
  std::set<std::string> dates;
  for (const auto& [d, causal, n] : runs.shapes(pass, kernel)) {
    const std::vector<Row> rows = runs.at(pass, kernel, d, causal, n);
    if (const std::optional<Row> r = newest_with_sdpa(rows)) {
      lines.emplace_back(*r, rows);
      dates.insert(r->str("date"));
    }
  }
  if (lines.empty()) return "No run of `" + kernel + "` with SDPA beside it is recorded.\n";
  const bool one_run = dates.size() == 1;
  std::vector<std::string> head{"d", "causal", "N", "TFLOP/s", "SDPA FA2", "SDPA cuDNN", "÷ FA2", "÷ cuDNN",
                                "÷ cuDNN, every run (n)"};
  if (!one_run) head.insert(head.end(), {"run (UTC)", "commit"});
  Markdown md;
  md.header(head);
  for (const auto& [r, rows] : lines) {
    std::vector<std::string> cells{r.str("d"), yes_no(r.str("causal")), r.str("N"), fmt("%.1f", r.num("tflops")),
                                   fmt("%.1f", r.num("fa2_bnhd_tflops")), fmt("%.1f", r.num("cudnn_bnhd_tflops")),
                                   over(r, "fa2_bnhd_tflops"), over(r, "cudnn_bnhd_tflops"), cudnn_spread(rows)};
    if (!one_run) cells.insert(cells.end(), {r.str("date"), r.str("commit")});
    md.line(cells);
  }
  return (one_run ? run_line(lines.front().first) : std::string()) + md.out.str();
}

/// The mma.sync forward, the wgmma forward and the mma.sync atomic backward of one run (the newest
/// that timed the mma forward and the atomic backward with SDPA), ours ÷ SDPA of its own rows.
std::string fast_sweep_table(const std::string& root, const std::string& dtype) {
  const AttentionRuns runs(root);
  std::set<std::string> with_mma;
  for (const Row& r : runs.rows())
    if (r.str("dtype") == dtype && r.str("kernel") == "mma" && has_sdpa(r)) with_mma.insert(r.str("date"));
  std::string run;
  for (const Row& r : runs.rows())
    if (r.str("dtype") == dtype && r.str("kernel") == "atomic" && has_sdpa(r) && with_mma.count(r.str("date")) &&
        r.str("date") > run)
      run = r.str("date");
  if (run.empty()) return "No run with SDPA beside the mma.sync kernels is recorded for " + dtype + ".\n";
  std::map<std::tuple<int, bool, long>, std::map<std::string, Row>> by_shape;  // kernel label → row
  std::optional<Row> any;
  for (const Row& r : runs.rows())
    if (r.str("date") == run && r.str("dtype") == dtype) {
      by_shape[{-int(r.num("d")), r.str("causal") == "1", long(r.num("N"))}].emplace(r.str("kernel"), r);
      any = r;
    }
  const bool wgmma = std::any_of(by_shape.begin(), by_shape.end(), [](const auto& s) { return s.second.count("wgmma"); });
  std::vector<std::string> head{"d", "causal", "N", "mma fwd", "÷ FA2", "÷ cuDNN"};
  if (wgmma) head.insert(head.end(), {"wgmma fwd", "÷ FA2", "÷ cuDNN"});
  head.insert(head.end(), {"mma atomic bwd", "÷ FA2", "÷ cuDNN"});
  Markdown md;
  md.header(head);
  for (const auto& [shape, k] : by_shape) {
    const auto& [md_, causal, n] = shape;
    std::vector<std::string> cells{std::to_string(-md_), causal ? "yes" : "no", std::to_string(n)};
    std::vector<const char*> kernels{"mma"};
    if (wgmma) kernels.push_back("wgmma");
    kernels.push_back("atomic");
    for (const char* name : kernels) {
      const auto it = k.find(name);
      if (it == k.end()) {
        cells.insert(cells.end(), {"–", "–", "–"});
        continue;
      }
      cells.insert(cells.end(), {fmt("%.1f", it->second.num("tflops")), over(it->second, "fa2_bnhd_tflops"),
                                 over(it->second, "cudnn_bnhd_tflops")});
    }
    md.line(cells);
  }
  return run_line(*any) + md.out.str();
}

// ---- MTA: the clear kernels' traffic, the fast kernels beside the unfused PyTorch MTA -----------

std::string mta_traffic_table(const std::string& root) {
  const Csv csv = read_csv(root + "/cuda/results/mta_traffic.csv");
  const std::vector<Row> rows = newest_rows(csv);
  if (rows.empty()) return no_current_run("mta_traffic.csv");
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
  return run_line(first) + "H = " + first.str("heads") + ", d = " + first.str("dim") + ", B = " + first.str("block") +
         ", batch " + first.str("batch") + ", fp32.\n\n" + md.out.str();
}

using MtaKey = std::tuple<std::string, std::string, std::string, std::string, std::string>;  // cq ck d N H
MtaKey mta_key(const Row& r) { return MtaKey{r.str("cq"), r.str("ck"), r.str("d"), r.str("N"), r.str("H")}; }

/// The unfused PyTorch rows of one run (mta_torch.py writes them into mta_torch.csv for the forward
/// runs and into mta_fast_bwd_torch.csv for the backward runs), by (shape, dtype, pass).
class TorchRows {
 public:
  TorchRows(const std::string& root, const std::string& date)
      : files_{read_csv(root + "/cuda/results/mta_torch.csv"), read_csv(root + "/cuda/results/mta_fast_bwd_torch.csv")} {
    for (const Csv& c : files_)
      for (const Row& r : rows_of(c))
        if (r.str("date") == date) rows_.emplace(std::make_tuple(mta_key(r), r.str("dtype"), r.str("pass")), r);
  }
  TorchRows(const TorchRows&) = delete;
  TorchRows& operator=(const TorchRows&) = delete;
  const Row* find(const MtaKey& k, const char* dtype, const char* pass) const {
    const auto it = rows_.find({k, dtype, pass});
    return it == rows_.end() ? nullptr : &it->second;
  }

 private:
  std::vector<Csv> files_;
  std::map<std::tuple<MtaKey, std::string, std::string>, Row> rows_;
};

/// The fast MTA forward (mta_fast.csv: `flashlab bench mta` rows, fast and clear, newest run) beside
/// the unfused PyTorch implementation of the same run, one row per (cq × ck, d) of the fast rows.
std::string mta_fast_table(const std::string& root) {
  const Csv ours_csv = read_csv(root + "/cuda/results/mta_fast.csv");
  const std::vector<Row> ours = newest_rows(ours_csv);
  if (ours.empty()) return no_current_run("mta_fast.csv");
  const TorchRows torch(root, ours.front().str("date"));
  std::map<MtaKey, const Row*> clear;
  for (const Row& r : ours)
    if (r.str("kernel") == "clear" && r.str("pass") == "fwd") clear[mta_key(r)] = &r;
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
  const auto cell = [](const Row* t, const char* col, const char* format) {
    return t ? fmt(format, t->num(col)) : std::string("–");
  };
  for (const Row* row : fast) {
    const Row& r = *row;
    const MtaKey k = mta_key(r);
    const double ms = r.num("ms");
    const Row* f32 = torch.find(k, "fp32", "fwd");
    const Row* b16 = torch.find(k, "bf16", "fwd");
    const Row* f32b = torch.find(k, "fp32", "fwd+bwd");
    const Row* b16b = torch.find(k, "bf16", "fwd+bwd");
    const auto times = [&](const Row* t) { return t ? ratio(t->num("torch_ms"), ms, "%.0f×") : std::string("–"); };
    const auto c = clear.find(k);
    md.line({r.str("cq") + " × " + r.str("ck"), r.str("d"), r.str("N"), r.str("H"),
             fmt("%.3f", ms) + " (" + fmt("%.3f", r.num("min_ms")) + "–" + fmt("%.3f", r.num("max_ms")) + ")",
             fmt("%.0f", r.num("tflops")), c == clear.end() ? "–" : fmt("%.1f", c->second->num("ms")),
             cell(f32, "torch_ms", "%.2f") + " / " + cell(b16, "torch_ms", "%.2f"), times(f32) + " / " + times(b16),
             cell(f32b, "torch_ms", "%.1f") + " / " + cell(b16b, "torch_ms", "%.1f"),
             cell(f32b, "torch_peak_gib", "%.2f")});
  }
  return run_line(ours.front()) + "bf16 inputs for the fast forward, causal, B = " + ours.front().str("B") + ".\n\n" +
         md.out.str();
}

/// What keeping O on chip saves (mta_fast_o_order.csv: `flashlab bench mta --o-order on-chip|source
/// --traffic` rows of one run, cuda/bench/mta_o_order.sh): per order the median and the CUPTI bytes
/// of one launch, their difference, and beside it the count of what the source order adds: after
/// every key tile but a block's last, O_i, m_i and ℓ_i of its Br = 64 rows in fp32 go out and come
/// back, (d + 2)·4 bytes per row each way; query tile i visits i + 1 key tiles (Br = Bc).
std::string mta_o_order_table(const std::string& root) {
  const Csv csv = read_csv(root + "/cuda/results/mta_fast_o_order.csv");
  const std::vector<Row> rows = newest_rows(csv);
  if (rows.empty()) return no_current_run("mta_fast_o_order.csv");
  const Row* by_order[2] = {nullptr, nullptr};  // on-chip, source
  for (const Row& r : rows) {
    const std::string& order = r.str("o_order");
    if (order != "on-chip" && order != "source")
      throw InputError(r.where() + ": o_order '" + order + "' is not on-chip or source");
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
  return run_line(chip) + "bf16, causal, cq × ck = " + chip.str("cq") + " × " + chip.str("ck") + ", d = " +
         chip.str("d") + ", N = " + chip.str("N") + ", H = " + chip.str("H") + ", B = " + chip.str("B") +
         "; bytes of one launch (CUPTI, L2 flushed before each counter). " + fmt("%.0f", trips) +
         " trips of a 64-row O_i tile with m_i and ℓ_i.\n\n" + md.out.str();
}

/// The fast MTA backward (mta_fast_bwd.csv: `flashlab bench mta` fwd, bwd and fwd+bwd rows of the run
/// with the most fwd+bwd rows) beside the unfused PyTorch forward + backward of the same run.
std::string mta_fast_bwd_table(const std::string& root) {
  const Csv ours_csv = read_csv(root + "/cuda/results/mta_fast_bwd.csv");
  const std::vector<Row> ours = fullest_run_rows(ours_csv, "fwd+bwd");
  if (ours.empty()) return no_current_run("mta_fast_bwd.csv");
  const TorchRows torch(root, ours.front().str("date"));
  std::map<std::pair<MtaKey, std::string>, const Row*> mine;  // (shape, pass)
  for (const Row& r : ours)
    if (r.str("kernel") == "fast" && r.str("dtype") == "bf16") mine[{mta_key(r), r.str("pass")}] = &r;
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
    const MtaKey k = mta_key(r);
    const auto find = [&](const char* pass) {
      const auto it = mine.find({k, pass});
      return it == mine.end() ? nullptr : it->second;
    };
    const Row *fwd = find("fwd"), *bwd = find("bwd");
    const Row* f32 = torch.find(k, "fp32", "fwd+bwd");
    const Row* b16 = torch.find(k, "bf16", "fwd+bwd");
    const auto cell = [](const Row* t) { return t ? fmt("%.1f", t->num("torch_ms")) : std::string("–"); };
    const auto times = [&](const Row* t) { return t ? ratio(t->num("torch_ms"), r.num("ms"), "%.0f×") : std::string("–"); };
    md.line({r.str("cq") + " × " + r.str("ck"), r.str("d"), r.str("N"), r.str("H"),
             fwd ? fmt("%.3f", fwd->num("ms")) : std::string("–"), span(bwd),
             bwd ? fmt("%.0f", bwd->num("tflops")) : std::string("–"), span(&r), cell(f32) + " / " + cell(b16),
             times(f32) + " / " + times(b16)});
  }
  return run_line(ours.front()) + "bf16 inputs, causal, B = " + ours.front().str("B") +
         "; fwd, bwd and fwd+bwd each timed alone in the same run, PyTorch right after it.\n\n" + md.out.str();
}

/// The split-K decode of the last 16 rows (mta_fast_bwd.csv, the run with the most decode rows): the
/// rate at which it reads K and V beside a device-to-device copy of the same bytes in the same run.
std::string mta_decode_table(const std::string& root) {
  const Csv csv = read_csv(root + "/cuda/results/mta_fast_bwd.csv");
  const std::vector<Row> rows = fullest_run_rows(csv, "decode");
  if (rows.empty()) return no_current_run("mta_fast_bwd.csv");
  Markdown md;
  md.header({"W (cq × ck)", "d", "N", "H", "ms (min–max)", "K, V read TB/s", "D2D copy TB/s (read + write)",
             "ratio"});
  for (const Row& r : rows) {
    if (r.str("pass") != "decode") continue;
    md.line({r.str("cq") + " × " + r.str("ck"), r.str("d"), r.str("N"), r.str("H"),
             fmt("%.3f", r.num("ms")) + " (" + fmt("%.3f", r.num("min_ms")) + "–" + fmt("%.3f", r.num("max_ms")) + ")",
             fmt("%.2f", r.num("read_tbps")), fmt("%.2f", r.num("copy_tbps")),
             ratio(r.num("read_tbps"), r.num("copy_tbps"), "%.2f")});
  }
  return run_line(rows.front()) + "bf16, B = " + rows.front().str("B") +
         ", the last 16 query rows, one wave of split blocks.\n\n" + md.out.str();
}

/// README's MTA rows: the fast bf16 forward (newest run of mta_fast.csv) and forward + backward (the
/// run of mta_fast_bwd.csv with the most such rows) at H = 16, N = 4096, d = 64, each beside the
/// unfused fp32 PyTorch implementation timed in the same run.
std::string readme_mta_table(const std::string& root) {
  const Csv fwd_csv = read_csv(root + "/cuda/results/mta_fast.csv");
  const Csv both_csv = read_csv(root + "/cuda/results/mta_fast_bwd.csv");
  const std::vector<Row> fwd = newest_rows(fwd_csv), both = fullest_run_rows(both_csv, "fwd+bwd");
  if (fwd.empty()) return no_current_run("mta_fast.csv");
  const TorchRows fwd_torch(root, fwd.front().str("date"));
  const TorchRows both_torch(root, both.empty() ? std::string() : both.front().str("date"));
  const auto pick = [](const std::vector<Row>& rows, const std::string& w, const char* pass) -> const Row* {
    for (const Row& r : rows)
      if (r.str("cq") == w && r.str("ck") == w && r.str("d") == "64" && r.str("N") == "4096" && r.str("H") == "16" &&
          r.str("pass") == pass && r.str("dtype") == "bf16" && r.str("kernel") == "fast")
        return &r;
    return nullptr;
  };
  const auto ms = [](const Row* r, const char* column) { return r ? fmt("%.3f", r->num(column)) : std::string("–"); };
  const auto times = [](const Row* torch, const Row* ours) {
    return torch && ours ? ratio(torch->num("torch_ms"), ours->num("ms"), "%.0f×") : std::string("–");
  };
  const auto when = [](const Row* r) { return r ? r->str("date") + ", " + r->str("commit") : std::string("–"); };
  Markdown md;
  md.header({"MTA, causal, H = 16, N = 4096, d = 64, bf16", "fast fwd ms", "PyTorch fp32 fwd ms", "× faster",
             "run, commit", "fast fwd+bwd ms", "PyTorch fp32 fwd+bwd ms", "× faster", "run, commit"});
  for (const std::string w : {"3", "11"}) {
    const Row* f = pick(fwd, w, "fwd");
    const Row* b = pick(both, w, "fwd+bwd");
    const Row* ft = f ? fwd_torch.find(mta_key(*f), "fp32", "fwd") : nullptr;
    const Row* bt = b ? both_torch.find(mta_key(*b), "fp32", "fwd+bwd") : nullptr;
    md.line({w + " × " + w, ms(f, "ms"), ms(ft, "torch_ms"), times(ft, f), when(f), ms(b, "ms"), ms(bt, "torch_ms"),
             times(bt, b), when(b)});
  }
  return md.out.str();
}

// ---- STREAM: the clear kernels' traffic, the fast kernels' timings ------------------------------

/// The estimate and apply kernels of one STREAM shape, side by side.
struct StreamShape {
  std::string label;  // "T | d | H | b_q × b_k | k" cells
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
    else throw InputError(r.where() + ": kernel '" + kernel + "' is neither the estimate nor the apply kernel");
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
  if (rows.empty()) return no_current_run("stream_traffic.csv");
  Markdown md;
  md.header({"T", "d", "H", "b_q × b_k", "k", "estimate: counted / L2→SM read", "ratio", "ms",
             "apply: counted / L2→SM read", "ratio", "ms", "estimate: counted / SM→L2 write", "DRAM read (estimate, apply)"});
  for (const StreamShape& s : stream_shapes(rows)) {
    const Row* e = s.estimate;
    const std::string writes = e ? bytes(e->num("counted_write_bytes")) + " / " + bytes(e->num("l2_write_bytes")) : "–";
    const std::string dram = (e ? bytes(e->num("dram_read_bytes")) : "–") + ", " +
                             (s.apply ? bytes(s.apply->num("dram_read_bytes")) : "–");
    md.line({s.label, stream_read_cells(e), stream_read_cells(s.apply), writes, dram});
  }
  return run_line(rows.front()) + md.out.str();
}

std::string ms_or_dash(const Row* r) { return r ? fmt("%.3f", r->num("ms")) : "–"; }

/// `flashlab bench stream` rows of the newest run: per shape the apply (each grouping) and, where
/// the run holds it, the estimate of the same shape.
std::string stream_timing_table(const std::string& root) {
  const Csv csv = read_csv(root + "/cuda/results/stream_fast.csv");
  const std::vector<Row> rows = newest_rows(csv);
  if (rows.empty()) return no_current_run("stream_fast.csv");
  const auto key_of = [](const Row& r) {
    return r.str("kernel") + "|" + r.str("dtype") + "|" + r.str("T") + "|" + r.str("d") + "|" + r.str("k") + "|" +
           r.str("H");
  };
  std::map<std::string, const Row*> estimate;
  for (const Row& r : rows) {
    if (r.str("pass") == "estimate") estimate[key_of(r)] = &r;
    else if (r.str("pass") != "apply")
      throw InputError(r.where() + ": pass '" + r.str("pass") + "' is neither estimate nor apply");
  }
  const bool estimates = !estimate.empty();
  std::vector<std::string> head{"kernels", "dtype", "T", "d", "k", "query blocks per thread block"};
  if (estimates) head.push_back("estimate ms");
  head.push_back("apply ms");
  if (estimates) head.push_back("estimate + apply ms");
  head.push_back(estimates ? "extra device bytes (estimate / apply)" : "extra device bytes (apply)");
  Markdown md;
  md.header(head);
  for (const Row& r : rows) {
    if (r.str("pass") != "apply") continue;
    const auto it = estimate.find(key_of(r));
    const Row* e = it == estimate.end() ? nullptr : it->second;
    std::vector<std::string> cells{r.str("kernel"), r.str("dtype"), r.str("T"), r.str("d"), r.str("k"),
                                   r.str("kernel") == "fast" ? r.str("group") : "–"};
    if (estimates) cells.push_back(ms_or_dash(e));
    cells.push_back(ms_or_dash(&r));
    if (estimates) cells.push_back(e ? fmt("%.3f", e->num("ms") + r.num("ms")) : "–");
    cells.push_back(estimates ? (e ? fmt("%.0f", e->num("extra_bytes")) : "–") + " / " + fmt("%.0f", r.num("extra_bytes"))
                              : fmt("%.0f", r.num("extra_bytes")));
    md.line(cells);
  }
  const Row& first = rows.front();
  return run_line(first) + "H = " + first.str("H") + ", b_q = " + first.str("bq") + ", b_k = " + first.str("bk") +
         ", causal; medians (the launch count is the CSV's `reps`), each launch alone, L2 flushed before each" +
         (estimates ? "" : "; no timing of the estimate as it is in the tree is recorded") + ".\n\n" + md.out.str();
}

/// The apply of the newest run of stream_sdpa.csv's date beside dense causal SDPA of the same run
/// (stream_sdpa.csv), one row per (T, d) with a column per k; the estimate + apply where the run holds
/// a timing of the estimate as it is in the tree.
std::string stream_sdpa_table(const std::string& root) {
  const Csv fast_csv = read_csv(root + "/cuda/results/stream_fast.csv");
  const Csv sdpa_csv = read_csv(root + "/cuda/results/stream_sdpa.csv");
  const std::vector<Row> sdpa = newest_rows(sdpa_csv);
  if (sdpa.empty()) return no_current_run("stream_sdpa.csv");
  const std::vector<Row> fast = rows_of(fast_csv);
  std::map<std::string, const Row*> apply;  // T|d|k|H → the apply row (one query block per thread block)
  for (const Row& r : fast)
    if (r.str("date") == sdpa.front().str("date") && r.str("kernel") == "fast" && r.str("pass") == "apply" &&
        r.str("group") == "1")
      apply[r.str("T") + "|" + r.str("d") + "|" + r.str("k") + "|" + r.str("H")] = &r;
  std::vector<std::string> ks;                                        // k values, in order of appearance
  std::vector<std::pair<std::string, std::string>> shapes;            // (T, d), in order of appearance
  std::map<std::pair<std::string, std::string>, std::vector<const Row*>> by_shape;
  for (const Row& r : sdpa) {
    if (std::find(ks.begin(), ks.end(), r.str("k")) == ks.end()) ks.push_back(r.str("k"));
    const auto shape = std::make_pair(r.str("T"), r.str("d"));
    if (!by_shape.count(shape)) shapes.push_back(shape);
    by_shape[shape].push_back(&r);
  }
  const bool estimates = std::any_of(sdpa.begin(), sdpa.end(), [](const Row& r) { return r.has("stream_ms"); });
  std::vector<std::string> head{"T", "d"};
  for (const std::string& k : ks) head.push_back("apply ms, k = " + k);
  if (estimates)
    for (const std::string& k : ks) head.push_back("estimate + apply ms, k = " + k);
  head.insert(head.end(), {"dense cuDNN ms", "dense flash ms"});
  Markdown md;
  md.header(head);
  for (const auto& shape : shapes) {
    const std::vector<const Row*>& rows = by_shape[shape];
    const auto of_k = [&](const std::string& k) -> const Row* {
      for (const Row* r : rows)
        if (r->str("k") == k) return r;
      return nullptr;
    };
    std::vector<std::string> cells{shape.first, shape.second};
    for (const std::string& k : ks) {
      const Row* r = of_k(k);
      const auto it = r ? apply.find(r->str("T") + "|" + r->str("d") + "|" + k + "|" + r->str("H")) : apply.end();
      cells.push_back(it == apply.end() ? "–" : fmt("%.3f", it->second->num("ms")));
    }
    if (estimates)
      for (const std::string& k : ks) {
        const Row* r = of_k(k);
        cells.push_back(r && r->has("stream_ms") ? fmt("%.3f", r->num("stream_ms")) : "–");
      }
    const Row& any = *rows.front();
    cells.push_back(any.has("cudnn_ms") ? fmt("%.1f", any.num("cudnn_ms")) : "–");
    cells.push_back(any.has("flash_ms") ? fmt("%.1f", any.num("flash_ms")) : "–");
    md.line(cells);
  }
  const Row& first = sdpa.front();
  return run_line(first) + first.str("kernel") + " kernels, " + first.str("dtype") + ", H = " + first.str("H") +
         ", causal; dense attention does not depend on k." +
         (estimates ? "" : " No timing of the estimate as it is in the tree is recorded.") + "\n\n" + md.out.str();
}

/// ncu's view of the fast apply at T = 1M per grouping (newest run): what loading the K/V blocks of
/// two neighbouring query blocks once saves.
std::string stream_group_table(const std::string& root) {
  const Csv csv = read_csv(root + "/cuda/results/stream_fast_ncu.csv");
  const std::vector<Row> rows = newest_rows(csv);
  if (rows.empty()) return no_current_run("stream_fast_ncu.csv");
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
  return run_line(first) + "T = " + first.str("T") + ", d = " + first.str("d") + ", k = " + first.str("k") +
         ", bf16, one head; one launch per grouping, caches flushed by ncu.\n\n" + md.out.str();
}

/// The fast bf16 estimate (`flashlab bench stream --check-indices`, measure.sh stream): time per shape,
/// its extra device memory, and the CUPTI traffic of one launch where the run measured it (−1: not).
std::string stream_fast_estimate_table(const std::string& root) {
  const Csv csv = read_csv(root + "/cuda/results/stream_fast_estimate.csv");
  const std::vector<Row> rows = newest_rows(csv);
  if (rows.empty()) return no_current_run("stream_fast_estimate.csv");
  Markdown md;
  md.header({"T", "d", "k", "ms (median)", "min – max", "extra memory", "L2→SM read", "DRAM read", "DRAM read rate",
             "I same every launch"});
  for (const Row& r : rows) {
    const bool measured = r.num("dram_read_bytes") >= 0;
    const double ms = r.num("ms");
    md.line({r.str("T"), r.str("d"), r.str("k"), fmt("%.3f", ms),
             fmt("%.3f", r.num("min_ms")) + " – " + fmt("%.3f", r.num("max_ms")), fmt("%.0f B", r.num("extra_bytes")),
             measured ? bytes(r.num("l2_read_bytes")) : "–", measured ? bytes(r.num("dram_read_bytes")) : "–",
             measured ? fmt("%.2f TB/s", r.num("dram_read_bytes") / (ms * 1e9)) : "–", yes_no(r.str("same_every_launch"))});
  }
  return run_line(rows.front()) + "One head, b_q = b_k = 64, causal, " + rows.front().str("dtype") +
         " inputs; medians of launches each timed alone after an L2 flush, I downloaded and compared after every launch.\n\n" + md.out.str();
}

/// README: STREAM at a million tokens (bf16, d = 128, k = 8, one head), newest run: the apply, the
/// estimate + apply where recorded, and dense causal attention of the same run.
std::string readme_stream_table(const std::string& root) {
  const Csv fast = read_csv(root + "/cuda/results/stream_fast.csv");
  const Csv sdpa = read_csv(root + "/cuda/results/stream_sdpa.csv");
  const auto shape = [](const Row& r) {
    return r.str("kernel") == "fast" && r.str("dtype") == "bf16" && r.str("T") == "1048576" && r.str("d") == "128" &&
           r.str("k") == "8" && r.str("H") == "1";
  };
  std::optional<Row> apply, estimate, dense;
  for (const Row& r : rows_of(fast))
    if (shape(r) && r.str("pass") == "apply" && r.str("group") == "1" && (!apply || r.str("date") > apply->str("date")))
      apply = r;
  if (!apply) return no_current_run("stream_fast.csv");
  for (const Row& r : rows_of(fast))
    if (shape(r) && r.str("pass") == "estimate" && r.str("date") == apply->str("date")) estimate = r;
  for (const Row& r : rows_of(sdpa))
    if (shape(r) && r.str("date") == apply->str("date")) dense = r;
  const auto dense_ms = [&](const char* c) { return dense && dense->has(c) ? fmt("%.1f", dense->num(c)) : "–"; };
  Markdown md;
  md.header({"STREAM, T = 1,048,576, d = 128, k = 8, bf16", "apply ms", "estimate ms", "dense causal cuDNN ms",
             "dense causal flash ms", "extra device bytes (apply)", "run (UTC)", "commit"});
  md.line({"`flashlab bench stream --kernel fast`", fmt("%.2f", apply->num("ms")),
           estimate ? fmt("%.2f", estimate->num("ms")) : "–", dense_ms("cudnn_ms"), dense_ms("flash_ms"),
           fmt("%.0f", apply->num("extra_bytes")), apply->str("date"), apply->str("commit")});
  return md.out.str();
}

// ---- CPU benchmark table --------------------------------------------------------------------

std::string readme_cpu_table(const std::string& root) {
  const Csv csv = read_csv(root + "/bench/results/cpu.csv");
  if (csv.rows.empty())
    return "No CPU benchmark run of the current tree is recorded in `bench/results/cpu.csv` (earlier runs: "
           "`bench/results/archive/cpu.csv`).\n";
  Markdown md;
  md.header({"what", "figure", "target", "command", "date, machine", "commit"});
  for (const Row& r : rows_of(csv))
    md.line({r.str("benchmark"), fmt("%.3g", r.num("value")) + (r.has("unit") ? " " + r.str("unit") : ""),
             r.has("target") ? r.str("target") : "–", "`" + r.str("command") + "`",
             r.str("date") + ", " + r.str("machine"), r.str("commit")});
  return md.out.str();
}

// ---- plots ------------------------------------------------------------------------------------

using flashlab::app::SvgPlot;
using flashlab::app::SvgSeries;

/// TFLOP/s against N at one (d, causal): the TMA forward and the wgmma-ws backward (newest run per N)
/// beside SDPA's cuDNN and FlashAttention-2 backends timed in the same runs.
SvgPlot attention_plot(const std::string& root, int d, bool causal) {
  const AttentionRuns runs(root);
  SvgPlot plot{"Attention on the H100, bf16, d = " + std::to_string(d) + (causal ? ", causal" : ", non-causal") +
                   ", H = 16",
               "sequence length N", "TFLOP/s",
               "flashlab's newest run per N of the kernels in the tree, SDPA timed in the same run",
               {}};
  const struct {
    const char* pass;
    const char* kernel;
    const char* name;
    int colour[3];  // ours, cuDNN, FA2
  } passes[] = {{"fwd", "tma-ws", "forward", {0, 1, 2}}, {"bwd", "wgmma-ws", "backward", {4, 3, 5}}};
  for (const auto& p : passes) {
    SvgSeries ours{std::string("flashlab ") + p.kernel + " " + p.name, {}, true, p.colour[0]};
    SvgSeries cudnn{std::string("SDPA cuDNN ") + p.name, {}, true, p.colour[1]};
    SvgSeries fa2{std::string("SDPA FlashAttention-2 ") + p.name, {}, true, p.colour[2]};
    for (const auto& [sd, sc, n] : runs.shapes(p.pass, p.kernel)) {
      if (sd != d || sc != causal) continue;
      const std::optional<Row> r = newest_with_sdpa(runs.at(p.pass, p.kernel, d, causal, n));
      if (!r) continue;
      ours.points.emplace_back(double(n), r->num("tflops"));
      cudnn.points.emplace_back(double(n), r->num("cudnn_bnhd_tflops"));
      fa2.points.emplace_back(double(n), r->num("fa2_bnhd_tflops"));
    }
    for (SvgSeries* s : {&ours, &cudnn, &fa2})
      if (!s->points.empty()) plot.series.push_back(*s);
  }
  return plot;
}

/// The MTA split-K decode's K, V read rate against N, per kernel size, beside a D2D copy of the same bytes.
SvgPlot mta_decode_plot(const std::string& root) {
  const Csv csv = read_csv(root + "/cuda/results/mta_fast_bwd.csv");
  SvgPlot plot{"MTA split-K decode on the H100, bf16, d = 128, H = 16 (the last 16 rows)", "sequence length N",
               "TB/s", "K and V read per second, beside a device-to-device copy of the same bytes in the same run", {}};
  std::map<std::string, SvgSeries> decode;
  SvgSeries copy{"D2D copy, read + write (anchor)", {}, true, 1};
  std::vector<Row> rows = fullest_run_rows(csv, "decode");
  std::string copy_size;
  for (const Row& r : rows) {
    if (r.str("pass") != "decode") continue;
    const std::string w = r.str("cq") + " × " + r.str("ck");
    if (!decode.count(w)) decode.emplace(w, SvgSeries{"flashlab decode, W = " + w, {}, true, int(decode.size()) + 2});
    decode[w].points.emplace_back(r.num("N"), r.num("read_tbps"));
    if (copy_size.empty()) copy_size = w;
    if (w == copy_size) copy.points.emplace_back(r.num("N"), r.num("copy_tbps"));
  }
  for (auto& [w, s] : decode) plot.series.push_back(s);
  if (!copy.points.empty()) plot.series.push_back(copy);
  return plot;
}

/// The STREAM apply's time against T (d = 128, k = 8, 16, 32) beside dense causal SDPA of the same run.
SvgPlot stream_plot(const std::string& root) {
  const Csv fast = read_csv(root + "/cuda/results/stream_fast.csv");
  const Csv sdpa = read_csv(root + "/cuda/results/stream_sdpa.csv");
  SvgPlot plot{"STREAM on the H100, bf16, d = 128, one head, causal", "sequence length T", "ms",
               "the fast apply (one query block per thread block) beside dense causal SDPA timed in the same run",
               {}};
  const std::vector<Row> rows = newest_rows(fast);
  std::map<int, SvgSeries> apply;
  for (const Row& r : rows)
    if (r.str("kernel") == "fast" && r.str("pass") == "apply" && r.str("group") == "1" && r.str("d") == "128" &&
        r.str("H") == "1") {
      const int k = int(r.num("k"));
      if (!apply.count(k)) apply.emplace(k, SvgSeries{"flashlab apply, k = " + std::to_string(k), {}, true, 0});
      apply[k].colour = k == 8 ? 0 : k == 16 ? 4 : 5;
      apply[k].points.emplace_back(r.num("T"), r.num("ms"));
    }
  SvgSeries cudnn{"dense causal SDPA, cuDNN (anchor)", {}, true, 1};
  SvgSeries flash{"dense causal SDPA, FlashAttention-2 (anchor)", {}, true, 2};
  const std::string date = rows.empty() ? std::string() : rows.front().str("date");
  for (const Row& r : rows_of(sdpa))
    if (r.str("date") == date && r.str("d") == "128" && r.str("k") == "8" && r.str("H") == "1") {
      if (r.has("cudnn_ms")) cudnn.points.emplace_back(r.num("T"), r.num("cudnn_ms"));
      if (r.has("flash_ms")) flash.points.emplace_back(r.num("T"), r.num("flash_ms"));
    }
  for (auto& [k, s] : apply) plot.series.push_back(s);
  for (SvgSeries* s : {&cudnn, &flash})
    if (!s->points.empty()) plot.series.push_back(*s);
  return plot;
}

/// The plots, each a file under REPO_ROOT.
const std::vector<std::pair<std::string, std::function<SvgPlot(const std::string&)>>>& plots() {
  static const std::vector<std::pair<std::string, std::function<SvgPlot(const std::string&)>>> list = {
      {"docs/measured_attention_d128.svg", [](const std::string& r) { return attention_plot(r, 128, false); }},
      {"docs/measured_attention_d128_causal.svg", [](const std::string& r) { return attention_plot(r, 128, true); }},
      {"docs/measured_attention_d64.svg", [](const std::string& r) { return attention_plot(r, 64, false); }},
      {"docs/measured_attention_d64_causal.svg", [](const std::string& r) { return attention_plot(r, 64, true); }},
      {"docs/measured_mta_decode.svg", mta_decode_plot},
      {"docs/measured_stream_apply.svg", stream_plot},
  };
  return list;
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
      {"fast_headline", fast_headline_table},
      {"fast_bf16", [](const std::string& r) { return fast_sweep_table(r, "bf16"); }},
      {"fast_fp16", [](const std::string& r) { return fast_sweep_table(r, "fp16"); }},
      {"tma_ws_sweep", [](const std::string& r) { return kernel_sweep_table(r, "fwd", "tma-ws"); }},
      {"bwd_ws_sweep", [](const std::string& r) { return kernel_sweep_table(r, "bwd", "wgmma-ws"); }},
      {"readme_fast", readme_fast_table},
      {"readme_cpu", readme_cpu_table},
      {"readme_mta", readme_mta_table},
      {"readme_stream", readme_stream_table},
      {"mta_traffic", mta_traffic_table},
      {"mta_fast", mta_fast_table},
      {"mta_o_order", mta_o_order_table},
      {"mta_fast_bwd", mta_fast_bwd_table},
      {"mta_decode", mta_decode_table},
      {"stream_traffic", stream_traffic_table},
      {"stream_timing", stream_timing_table},
      {"stream_sdpa", stream_sdpa_table},
      {"stream_group", stream_group_table},
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

/// The file's bytes, or nothing when it cannot be opened.
std::optional<std::string> slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
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
  const std::string& root = args[0];
  int stale = 0;
  for (std::size_t i = 1; i < args.size(); ++i) {
    const std::optional<std::string> old_text = slurp(args[i]);
    if (!old_text) throw InputError(args[i] + ": cannot open");
    const PageResult r = regenerate(args[i], *old_text, root);
    for (const auto& s : r.stale) {
      std::cerr << args[i] << ": generated table " << s << (check ? " differs from " : " rewritten from ")
                << "the CSVs under " << root << "\n";
      ++stale;
    }
    if (!check && r.text != *old_text) std::ofstream(args[i], std::ios::binary) << r.text;
  }
  for (const auto& [file, draw] : plots()) {
    const std::string path = root + "/" + file;
    std::string svg;
    try {
      svg = flashlab::app::render_svg(draw(root));
    } catch (const std::invalid_argument& e) {
      throw InputError(file + ": " + e.what());
    }
    if (slurp(path) == svg) continue;
    std::cerr << path << (check ? ": plot differs from " : ": plot rewritten from ") << "the CSVs under " << root << "\n";
    ++stale;
    if (!check && !(std::ofstream(path, std::ios::binary) << svg)) throw InputError(path + ": cannot write");
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
