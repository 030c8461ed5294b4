// `flashlab traffic levels`: the traffic chapter's three-level table (lessons/traffic_chapter.hpp)
// — toy tile counts × bytes per tile, the reference's counted bytes, and measured L2 / DRAM
// bytes: the recorded H100 measurement shipped with the lessons, or a live one with
// `--device cuda` (the cuda library's traffic probe, summed over each design's kernels).
// Also the `--svg FILE` plot of `flashlab traffic attention` (svg_plot.hpp).
#include "lessons/cmd_traffic_chapter.hpp"

#include <algorithm>
#include <ctime>
#include <optional>
#include <utility>
#include <fstream>
#include <iostream>
#include <sstream>

#include "attention/attention_flags.hpp"
#include "core/commands.hpp"
#include "core/gpu_flags.hpp"
#include "core/report.hpp"
#include "flashlab/lessons/lesson.hpp"
#include "flashlab/lessons/progress.hpp"
#include "flashlab/lessons/traffic_chapter.hpp"
#include "core/svg_plot.hpp"
#include "lessons/traffic_families.hpp"

#ifdef FLASHLAB_HAVE_CUDA
#include "flashlab/cuda/options.hpp"
#include "flashlab/cuda/traffic_probe.hpp"
#endif

namespace flashlab::app {

namespace {

namespace fl = flashlab::lessons;
namespace fr = flashlab::ref;

constexpr const char* kLevelsUsage =
    "traffic levels [--seq N[,N2,...]] [--heads H] [--dim D] [--block-m BM] [--block-n BN]\n"
    "                       [--device cpu|cuda] [--forward-seq N[,N2,...]] [--json|--csv] [--measured-csv FILE]\n"
    "                       [--families-csv FILE]";
constexpr const char* kLevelsSummary =
    "The traffic chapter's table: for one shape, the HBM bytes of naive, FA1 and FA2 forward and of\n"
    "the two backward designs at three levels — the toy tile model's counts × bytes per tile, the\n"
    "reference's counted bytes, and the bytes measured on an H100 (L2 requests and DRAM). Without\n"
    "--device cuda the measurement is the recorded one shipped with the lessons (its date, device\n"
    "and command are printed). --json and --csv print the tables as one table of rows (family, pass,\n"
    "shape, toy, counted, L2 and DRAM bytes, their ratios, where the measurement comes from).\n"
    "--measured-csv FILE with --device cuda writes the measurement in the shipped format\n"
    "(lessons/data/traffic-levels/measured.csv); --forward-seq adds sizes measured for the\n"
    "forward designs only (the --svg plot's points). A second table does the\n"
    "same for Multi-Token Attention and STREAM at their own shapes (their clear kernels, the\n"
    "reference's counts); --families-csv FILE with --device cuda writes that measurement in its\n"
    "shipped format (lessons/data/traffic-levels/measured_families.csv). The lessons traffic-fwd,\n"
    "traffic-bwd and traffic-levels ask for the numbers.";

// The chapter's shape: the `shape:` line of the traffic lessons.
fr::AttentionProblem chapter_shape() {
  const fl::Lesson* l = fl::find_lesson("traffic-levels");
  if (!l || l->shape.empty()) throw std::logic_error("lesson traffic-levels has no shape");
  return fl::parse_attention_shape(l->shape);
}


#ifdef FLASHLAB_HAVE_CUDA
std::string today() {
  const std::time_t t = std::time(nullptr);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&t));
  return buf;
}

fl::Measurement measure_live(const fr::AttentionProblem& shape, const std::vector<std::size_t>& seqs,
                             const std::vector<std::size_t>& forward_seqs, const std::string& command) {
  namespace fc = flashlab::cuda;
  std::string why;
  if (!fc::device_available(&why)) throw UsageError("--device cuda: " + why, "use --device cpu for the recorded measurement");
  fl::Measurement m;
  m.date = today();
  m.device = fc::device_description();
  m.command = command;
  m.shape = shape;
  const fr::Algorithm designs[] = {fr::Algorithm::naive_fwd, fr::Algorithm::fa1_fwd, fr::Algorithm::fa2_fwd,
                                   fr::Algorithm::bwd_two_kernel, fr::Algorithm::bwd_atomic};
  std::vector<std::pair<std::size_t, bool>> sizes;  // (N, forward only)
  for (std::size_t n : seqs) sizes.emplace_back(n, false);
  for (std::size_t n : forward_seqs) sizes.emplace_back(n, true);
  std::sort(sizes.begin(), sizes.end());
  for (const auto& [n, forward_only] : sizes) {
    for (const fr::Algorithm model : designs) {
      if (forward_only && fr::is_backward(model)) continue;
      fc::ProbeConfig pc;
      pc.problem = shape;
      pc.problem.seq = n;
      const fc::ProbeResult res = fc::measure_attention(model, pc);
      fl::MeasuredBytes b;
      b.variant = std::string(fr::algorithm_name(model));
      b.seq = n;
      for (const auto& k : res.kernels) {
        b.l2_read += k.counters.l2_read_bytes;
        b.l2_write += k.counters.l2_write_bytes;
        b.l2_atomic += k.counters.l2_atomic_bytes;
        b.dram_read += k.counters.dram_read_bytes;
        b.dram_write += k.counters.dram_write_bytes;
      }
      m.rows.push_back(b);
    }
  }
  return m;
}
#endif

// A measurement in its shipped format (`text`) to the file of `flag`; a file that cannot be
// written is named with the flag.
[[maybe_unused]] void write_shipped_csv(const char* flag, const std::string& path, const std::string& text) {
  std::ofstream out(path);
  if (!out) throw UsageError(std::string(flag) + ": cannot write '" + path + "'", "give a writable file name");
  out << text;
  if (!out) throw UsageError(std::string(flag) + ": writing '" + path + "' failed", "check the disk");
}

// Where a row's measurement comes from (null fields where there is none).
void write_source(Json& j, const std::string* date, const std::string* device, const std::string* command) {
  j.key("measured").begin_object();
  for (const auto& [key, value] : {std::pair{"date", date}, std::pair{"device", device}, std::pair{"command", command}}) {
    j.key(key);
    if (value) j.value(value->empty() ? std::string("now") : *value);
    else j.null();
  }
  j.end_object();
}

// A measured figure and its ratio to `base`, null where unmeasured.
void write_measured(Json& j, const char* key, const char* ratio_key, std::optional<double> bytes, double base) {
  j.key(key);
  if (bytes) j.value(*bytes);
  else j.null();
  j.key(ratio_key);
  if (bytes && base > 0) j.value(round_to(*bytes / base, 3));
  else j.null();
}

// The --json / --csv document: both tables as one array of rows, attention's designs per N first,
// then the other families' passes at their own shapes.
void write_levels(Json& j, fr::AttentionProblem cfg, const std::vector<std::size_t>& seqs, const fl::Measurement* measured,
                  const fl::FamilyMeasurement& families) {
  j.begin_array();
  for (std::size_t n : seqs) {
    cfg.seq = n;
    for (const fr::Algorithm v : fl::chapter_variants()) {
      const std::string name(fr::algorithm_name(v));
      const auto t = fr::attention_traffic_formula(v, cfg);
      const double counted = double(t.total_read_bytes() + t.total_write_bytes());
      const auto toy = fl::toy_tile_bytes(v, cfg);
      const fl::MeasuredBytes* r = measured ? measured->find(name, n) : nullptr;
      j.begin_object().key("family").value("attention").key("pass").value(name).key("shape").value(cfg.str());
      j.key("toy_bytes");
      if (toy) j.value(std::uint64_t(*toy));
      else j.null();
      j.key("counted_bytes").value(counted);
      const double l2 = r ? r->l2_total() : 0;
      write_measured(j, "l2_bytes", "l2_over_counted", r ? std::optional(l2) : std::nullopt, counted);
      write_measured(j, "dram_bytes", "dram_over_l2", r ? std::optional(r->dram_total()) : std::nullopt, l2);
      write_source(j, r ? &measured->date : nullptr, r ? &measured->device : nullptr, r ? &measured->command : nullptr);
      j.end_object();
    }
  }
  for (const auto& r : families.rows) {
    j.begin_object().key("family").value(r.family).key("pass").value(r.pass).key("shape").value(r.shape);
    j.key("toy_bytes").null().key("counted_bytes").value(r.counted_total());
    write_measured(j, "l2_bytes", "l2_over_counted", r.l2_total(), r.counted_total());
    write_measured(j, "dram_bytes", "dram_over_l2", r.dram_total(), r.l2_total());
    write_source(j, &families.date, &families.device, &families.command);
    j.end_object();
  }
  j.end_array();
}

std::vector<std::size_t> seq_sizes(const char* flag, const std::string& text) {
  const auto v = integer_list(flag, text, 1, 1LL << 20, "4096");
  return {v.begin(), v.end()};
}

}  // namespace

int cmd_traffic_levels(const Args& args) {
  return guarded("traffic", [&]() -> int {
    const fr::AttentionProblem chapter = chapter_shape();
    po::options_description desc("Options");
    desc.add_options()("help,h", "show this help")
        ("seq", po::value<std::string>()->default_value(std::to_string(chapter.seq)), "sequence lengths N, comma separated")
        ("heads", po::value<long long>()->default_value(static_cast<long long>(chapter.heads)), "H, number of heads")
        ;
    // The chapter's recorded shape: d = 64 (the one --dim default), Br = 64, Bc = 32.
    add_dim_option(desc);
    add_tile_options(desc, static_cast<long long>(chapter.Br), static_cast<long long>(chapter.Bc));
    desc.add_options()
        ("device", po::value<std::string>()->default_value("cpu"), "cpu (recorded measurement) | cuda (measure now)")
        ("forward-seq", po::value<std::string>(), "cuda: more N, measured for the forward designs only")
        ;
    add_output_options(desc);
    desc.add_options()
        ("measured-csv", po::value<std::string>(), "cuda: also write the attention measurement to this file (as shipped)")
        ("families-csv", po::value<std::string>(), "cuda: also write the MTA and STREAM measurement to this file");
    const auto vm = parse(args, desc);
    if (vm.count("help")) {
      print_help(std::cout, kLevelsUsage, kLevelsSummary, desc);
      return kOk;
    }
    const auto seqs = seq_sizes("seq", vm["seq"].as<std::string>());
    fr::AttentionProblem cfg = chapter;
    cfg.heads = size_flag(vm, "heads");
    cfg.head_dim = size_flag(vm, "dim");
    cfg.Br = size_flag(vm, "block-m");
    cfg.Bc = size_flag(vm, "block-n");
    for (std::size_t n : seqs) {  // the problem's own limits, named by flag (one place for each)
      cfg.seq = n;
      validate_flags(cfg);
    }
    const std::string device = vm["device"].as<std::string>();
    if (device != "cpu" && device != "cuda") throw UsageError("--device '" + device + "' is unknown", "choose cpu or cuda");
    const OutputFormat format = output_format(vm);
    for (const char* flag : {"forward-seq", "measured-csv", "families-csv"})
      if (device == "cpu" && vm.count(flag))
        throw UsageError("--" + std::string(flag) + " needs --device cuda",
                         "the recorded measurements are lessons/data/traffic-levels/measured*.csv");
    const std::string measured_csv = vm.count("measured-csv") ? vm["measured-csv"].as<std::string>() : std::string();
    const std::string families_csv = vm.count("families-csv") ? vm["families-csv"].as<std::string>() : std::string();

    fl::Measurement live;
    const fl::Measurement* measured = &fl::recorded_measurement();
    fl::FamilyMeasurement live_families;
    const fl::FamilyMeasurement* families = &fl::recorded_family_measurement();
    if (device == "cuda") {
#ifdef FLASHLAB_HAVE_CUDA
      std::string command = "flashlab traffic levels";
      for (const auto& a : args) command += " " + a;
      const auto forward_seqs =
          vm.count("forward-seq") ? seq_sizes("forward-seq", vm["forward-seq"].as<std::string>()) : std::vector<std::size_t>{};
      live = measure_live(cfg, seqs, forward_seqs, command);
      measured = &live;
      live_families = measure_families_live(command, live.date);
      families = &live_families;
      if (!measured_csv.empty()) write_shipped_csv("--measured-csv", measured_csv, fl::measurement_csv(live));
      if (!families_csv.empty()) write_shipped_csv("--families-csv", families_csv, fl::family_csv(live_families));
#else
      throw built_without_cuda("--device cuda", "leave out --device cuda for the recorded measurement");
#endif
    }
    // The recorded measurement counts only at its own shape.
    const auto& r = measured->shape;
    const bool same = r.batch == cfg.batch && r.heads == cfg.heads && r.head_dim == cfg.head_dim &&
                      r.Br == cfg.Br && r.Bc == cfg.Bc && r.dtype == cfg.dtype;
    if (format != OutputFormat::text) {
      ReportOutput report(format, std::cout);
      write_levels(report.json(), cfg, seqs, same ? measured : nullptr, *families);
      report.finish();
      return kOk;
    }
    bool explain = false;
    try {
      explain = fl::load_progress(fl::progress_path()).answers_passed.count("traffic-levels") > 0;
    } catch (const std::exception&) {
    }
    for (std::size_t n : seqs) {
      cfg.seq = n;
      std::cout << fl::traffic_levels_table(cfg, same ? measured : nullptr, explain) << "\n";
    }
    std::cout << fl::traffic_families_table(*families, explain);
    return kOk;
  });
}

bool traffic_svg_wanted(const po::variables_map& vm) { return vm.count("svg") > 0; }

void write_traffic_svg(const po::variables_map& vm, const std::vector<std::size_t>& seqs,
                       const fr::AttentionProblem& base) {
  const std::string path = vm["svg"].as<std::string>();
  const fl::Measurement& rec = fl::recorded_measurement();
  const auto& r = rec.shape;
  const bool same = r.batch == base.batch && r.heads == base.heads && r.head_dim == base.head_dim &&
                    r.Br == base.Br && r.Bc == base.Bc && r.dtype == base.dtype && !base.causal;
  SvgPlot plot;
  plot.title = "attention HBM bytes against N (B=" + std::to_string(base.batch) + " H=" + std::to_string(base.heads) +
               " d=" + std::to_string(base.head_dim) + " Br=" + std::to_string(base.Br) +
               " Bc=" + std::to_string(base.Bc) + (base.causal ? " causal " : " ") +
               std::string(fr::dtype_name(base.dtype)) + ")";
  plot.x_label = "sequence length N";
  plot.y_label = "HBM bytes (read + written)";
  const std::pair<fr::Algorithm, const char*> designs[] = {
      {fr::Algorithm::naive_fwd, "naive"}, {fr::Algorithm::fa1_fwd, "FA1"}, {fr::Algorithm::fa2_fwd, "FA2"}};
  int colour = 0;
  for (const auto& [v, name] : designs) {
    SvgSeries model{std::string(name) + " model", {}, false, colour};
    SvgSeries meas{std::string(name) + " measured (L2)", {}, true, colour};
    ++colour;
    for (std::size_t n : seqs) {
      fr::AttentionProblem c = base;
      c.seq = n;
      const auto t = fr::attention_traffic_formula(v, c);
      model.points.push_back({double(n), double(t.total_read_bytes() + t.total_write_bytes())});
      if (!same) continue;
      if (const auto* m = rec.find(std::string(fr::algorithm_name(v)), n)) meas.points.push_back({double(n), m->l2_total()});
    }
    plot.series.push_back(model);
    if (!meas.points.empty()) plot.series.push_back(meas);
  }
  plot.note = same ? "measured: " + rec.device + ", " + rec.date + " (lessons/data/traffic-levels/measured.csv)"
                   : "no recorded measurement at this shape (it has " + r.str() + ")";
  std::ofstream out(path);
  if (!out) throw UsageError("--svg: cannot write '" + path + "'", "give a writable file name, e.g. --svg traffic.svg");
  out << render_svg(plot);
  if (!out) throw UsageError("--svg: writing '" + path + "' failed", "check the disk");
  std::cerr << "wrote " << path << "\n";
}

}  // namespace flashlab::app
