// `flashlab traffic ring`: the fourth level of traffic, the bytes between GPUs. For
// context-parallel attention on G GPUs it prints, step by step, the bytes each GPU sends (and
// receives) around the ring, the compute of the busiest GPU that the transfer can hide behind,
// both as times at a link bandwidth and a compute rate, and whether the ring hides the link;
// then it runs the CPU simulation of the ring at the same shape (when small enough) and shows
// that the bytes it copied between the simulated ranks equal the model; then the ring measured
// on GPUs beside the model: recorded (lessons/data/traffic-ring/measured.csv, for the shapes it
// holds) or live with --device cuda. Formatting only: the model and the simulation are
// reference/ context_parallel.hpp, the measurement the attention family's ring.
#include "core/commands.hpp"
#include "core/gpu_flags.hpp"
#include "core/report.hpp"
#include "core/shared_flags.hpp"

#include "flashlab/lessons/traffic_chapter.hpp"
#include "flashlab/reference/context_parallel.hpp"
#ifdef FLASHLAB_HAVE_RING
#include "flashlab/cuda/context_parallel.hpp"
#include "flashlab/cuda/options.hpp"
#endif

#include <algorithm>
#include <cmath>
#include <ctime>
#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>

namespace flashlab::app {

namespace {

using namespace flashlab::ref;

constexpr const char* kUsageLine =
    "traffic ring --gpus G --seq N [--heads H] [--heads-kv H_kv] [--dim D] [--batch B] [--causal]\n"
    "                     [--layout zigzag|contiguous] [--dtype bf16|fp16|fp32] [--pass fwd|bwd|both]\n"
    "                     [--link-gbps W] [--tflops F] [--tflops-bwd F] [--csv|--json] [--device cpu|cuda]";
constexpr const char* kSummary =
    "Context-parallel (ring) attention on G GPUs: Q, K, V cut along the sequence (zigzag: GPU r\n"
    "holds chunks r and 2G-1-r, so causal work is even), K/V chunks passed around the ring while\n"
    "each GPU computes with the ones it holds, partial outputs merged by LSE; the backward passes\n"
    "dK/dV around too. Per step: bytes each GPU sends and receives (K, V in the dtype; dK, dV as\n"
    "fp32 sums), the FLOPs of the busiest and the idlest GPU, their times at --link-gbps and\n"
    "--tflops, and whether the transfer hides behind the compute. Then the CPU simulation of the\n"
    "ring runs at the same shape (when its work is small enough) and its copied bytes are\n"
    "checked against the model: counted == model. docs/context-parallel.md explains the ring.";

// Work the CPU simulation may take (its FLOPs, forward and backward together) before it is
// left out: about a second of single-threaded Eigen.
constexpr double kSimulationFlops = 4e9;

po::options_description options() {
  po::options_description d("Options");
  d.add_options()("help,h", "show this help")
      ("gpus", po::value<long long>(), "G, GPUs (ranks) in the ring")
      ("seq", po::value<long long>(), "N, the whole sequence (every GPU holds about N/G of it)")
      ("heads", po::value<long long>()->default_value(1), "H, query heads")
      ("heads-kv", po::value<long long>(), "H_kv, K/V heads (divides H; default H)")
      ;
  add_dim_option(d);
  d.add_options()
      ("batch", po::value<long long>()->default_value(1), "B, batch size")
      ("causal", po::bool_switch(), "causal mask")
      ("layout", po::value<std::string>(), "zigzag | contiguous (default: zigzag with --causal, else contiguous)")
      ;
  add_dtype_option(d, "bf16 | fp16 | fp32", "bf16", " (K and V on the link)");
  d.add_options()
      ("pass", po::value<std::string>()->default_value("both"), "fwd | bwd | both")
      ("link-gbps", po::value<double>()->default_value(370.0),
       "link bandwidth per GPU and direction, GB/s (default: a round figure just above the all-reduce "
       "bus bandwidth NCCL reported on 2- and 4-GPU H100 machines; NVLink 4's nominal is 450)")
      ("tflops", po::value<double>()->default_value(600.0),
       "forward compute rate per GPU, TFLOP/s (default: the fast forward, causal d = 128, one H100)")
      ("tflops-bwd", po::value<double>()->default_value(470.0),
       "backward compute rate per GPU, TFLOP/s (default: the fast backward, causal d = 128, one H100)")
      ("device", po::value<std::string>()->default_value("cpu"), "cpu (the model and the CPU simulation) | cuda");
  add_output_options(d);
  return d;
}

long long required(const po::variables_map& vm, const char* flag, long long lo, long long hi, const char* example) {
  if (!vm.count(flag)) throw UsageError(std::string("--") + flag + " is required", example);
  const long long v = vm[flag].as<long long>();
  require_range(flag, v, lo, hi);
  return v;
}

double rate_flag(const po::variables_map& vm, const char* flag) {
  const double v = vm[flag].as<double>();
  if (!(v > 0) || !std::isfinite(v) || v > 1e9)
    throw UsageError("--" + std::string(flag) + " " + std::to_string(v) + " is not a positive rate",
                     "e.g. --link-gbps 370 --tflops 600 --tflops-bwd 470");
  return v;
}

ContextParallelProblem problem_from(const po::variables_map& vm) {
  ContextParallelProblem p;
  p.gpus = std::size_t(required(vm, "gpus", 1, (long long)kMaxRanks, "e.g. --gpus 4"));
  p.attention.seq = std::size_t(required(vm, "seq", 1, 1LL << 26, "e.g. --seq 131072"));
  require_range("heads", vm["heads"].as<long long>(), 1, 1024);
  require_range("dim", vm["dim"].as<long long>(), 1, 1024);
  require_range("batch", vm["batch"].as<long long>(), 1, 1024);
  p.attention.heads = std::size_t(vm["heads"].as<long long>());
  p.attention.head_dim = std::size_t(vm["dim"].as<long long>());
  p.attention.batch = std::size_t(vm["batch"].as<long long>());
  p.attention.causal = vm["causal"].as<bool>();
  if (vm.count("heads-kv")) {
    const long long hkv = vm["heads-kv"].as<long long>();
    require_range("heads-kv", hkv, 1, 1024);
    if (p.attention.heads % std::size_t(hkv) != 0)
      throw UsageError("--heads-kv " + std::to_string(hkv) + " does not divide --heads " +
                           std::to_string(p.attention.heads),
                       "each K/V head serves H / H_kv query heads: e.g. --heads 16 --heads-kv 4");
    p.heads_kv = std::size_t(hkv);
  }
  p.attention.dtype = parse_dtype(dtype_flag(vm, {"bf16", "fp16", "fp32"}));
  const std::string layout =
      vm.count("layout") ? vm["layout"].as<std::string>() : (p.attention.causal ? "zigzag" : "contiguous");
  if (layout != "zigzag" && layout != "contiguous")
    throw UsageError("--layout '" + layout + "' is unknown", "choose zigzag or contiguous");
  p.layout = parse_layout(layout);
  // Every count fits 64 bits: the largest is a step's FLOPs, below 4·B·H·d·N².
  const double n = double(p.attention.seq);
  if (4.0 * double(p.attention.batch) * double(p.attention.heads) * double(p.attention.head_dim) * n * n > 9e18)
    throw UsageError("--batch x --heads x --dim x --seq^2 is too large to count in 64 bits",
                     "use a shorter --seq or fewer --heads");
  p.validate();
  return p;
}

std::string bytes_text(std::uint64_t b) {
  std::ostringstream s;
  const double v = double(b);
  s << std::fixed << std::setprecision(v >= 1e9 ? 2 : 1);
  if (v >= 1e9) s << v / 1e9 << " GB";
  else if (v >= 1e6) s << v / 1e6 << " MB";
  else if (v >= 1e3) s << v / 1e3 << " kB";
  else s << std::setprecision(0) << v << " B";
  return s.str();
}

std::string ms_text(double seconds) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(seconds * 1e3 >= 100 ? 1 : 4) << seconds * 1e3;
  return s.str();
}

std::string flops_text(std::uint64_t f) {
  std::ostringstream s;
  s << std::scientific << std::setprecision(3) << double(f);
  return s.str();
}

// What a pass of the model adds up to.
struct PassSummary {
  double compute_s = 0;   // Σ busiest GPU's compute
  double link_s = 0;      // Σ transfer times
  double ring_s = 0;      // Σ max(compute, link): the ring's time with every transfer overlapped
  double exposed_s = 0;   // Σ max(0, link − compute): what the compute does not hide
  bool hides = true;      // every step with compute hides its transfer
  std::size_t tail_steps = 0;  // steps with a transfer and no compute at all (the backward's last hop)
  double break_even = 0;  // N_local from which every step with compute hides its transfer
};

PassSummary summarise(const ContextParallelProblem& p, const std::vector<RingStepModel>& steps) {
  PassSummary s;
  double ratio = 0;  // the largest link/compute of a step with both
  for (const auto& m : steps) {
    s.compute_s += m.compute_s;
    s.link_s += m.link_s;
    s.ring_s += m.step_s();
    s.exposed_s += m.step_s() - m.compute_s;
    if (m.compute_s == 0 && m.link_s > 0) ++s.tail_steps;
    else if (!m.hidden()) s.hides = false;
    if (m.compute_s > 0 && m.link_s > 0) ratio = std::max(ratio, m.link_s / m.compute_s);
  }
  // Compute grows with N_local², bytes with N_local: a step hides from N_local · ratio on.
  s.break_even = ratio * double(p.local_seq());
  return s;
}

const char* pass_name(RingPass pass) { return pass == RingPass::forward ? "forward" : "backward"; }

// The K/V a step's compute uses, seen from GPU 0; the backward's last step carries the sums home.
std::string source_text(const ContextParallelProblem& p, RingPass pass, std::size_t step) {
  if (pass == RingPass::backward && step == p.gpus) return "(dK/dV home)";
  const std::size_t src = ring_source(p.gpus, 0, step);
  return src == 0 ? "own" : "GPU " + std::to_string(src);
}

void print_table(std::ostream& os, const ContextParallelProblem& p, RingPass pass,
                 const std::vector<RingStepModel>& steps, const PassSummary& s) {
  os << "\n" << pass_name(pass) << "\n";
  os << std::setw(5) << "step" << std::setw(14) << "K/V on GPU 0" << std::setw(13) << "sent/GPU" << std::setw(13)
     << "K+V" << std::setw(13) << "dK+dV" << std::setw(13) << "FLOPs max" << std::setw(13) << "FLOPs min"
     << std::setw(12) << "compute ms" << std::setw(10) << "link ms" << std::setw(8) << "hidden" << "\n";
  for (const auto& m : steps) {
    const bool tail = m.compute_s == 0 && m.link_s > 0;
    os << std::setw(5) << m.step << std::setw(14) << source_text(p, pass, m.step) << std::setw(13)
       << bytes_text(m.sent.total()) << std::setw(13) << bytes_text(m.sent.K + m.sent.V) << std::setw(13)
       << bytes_text(m.sent.dK + m.sent.dV) << std::setw(13) << flops_text(m.flops_max) << std::setw(13)
       << flops_text(m.flops_min) << std::setw(12) << ms_text(m.compute_s) << std::setw(10) << ms_text(m.link_s)
       << std::setw(8) << (tail ? "tail" : m.hidden() ? "yes" : "no") << "\n";
  }
  os << "  compute " << ms_text(s.compute_s) << " ms, link " << ms_text(s.link_s) << " ms; overlapped the ring takes "
     << ms_text(s.ring_s) << " ms, of which " << ms_text(s.exposed_s) << " ms are exposed transfers\n";
  os << "  the ring hides the communication: " << (s.hides ? "yes" : "no");
  if (s.hides && s.tail_steps) os << " (but for the last dK/dV hop, which has no compute beside it)";
  os << "\n";
  if (s.break_even > 0)
    os << "  every step hides its transfer from N_local ≈ " << std::size_t(std::ceil(s.break_even))
       << " rows per GPU on (here N_local = " << p.local_seq() << ")\n";
}

// The CPU simulation's verdict on one pass: did the ring copy exactly the model's bytes?
struct Counted {
  bool ran = false;
  std::string why_not;             // when not run
  std::vector<RingPass> passes;    // the passes checked
  std::vector<bool> equal;         // per pass
  std::vector<std::uint64_t> bytes;  // bytes the simulation copied, per pass (all ranks)
  std::string why;                 // the first difference, if any
};

Counted simulate(const ContextParallelProblem& p, const std::vector<RingPass>& passes) {
  Counted c;
  const AttentionProblem& a = p.attention;
  // The simulation's work: every block's forward (4·c·c·d per head), the backward's 3.5 times that.
  double work = 0;
  for (std::size_t r = 0; r < p.gpus; ++r)
    for (std::size_t s = 0; s < p.gpus; ++s)
      for (const RingBlock& b : ring_blocks(p, r, s)) work += double(block_flops(p, b, RingPass::forward));
  const bool bwd = passes.back() == RingPass::backward;
  work *= bwd ? 4.5 : 1.0;
  if (work > kSimulationFlops) {
    // Work grows with N²: the largest N (whole chunks) the simulation takes at these heads.
    const std::size_t fit = std::size_t(double(a.seq) * std::sqrt(kSimulationFlops / work)) / p.chunks() * p.chunks();
    std::ostringstream s;
    s << "not run: the CPU simulation would take " << std::scientific << std::setprecision(1) << work
      << " FLOPs here (it runs up to " << kSimulationFlops << "); ";
    if (fit > 0) s << "--seq " << fit << " or less shows the count";
    else s << "fewer --heads or a smaller --dim shows the count";
    c.why_not = s.str();
    return c;
  }
  Tensor<float> Q(Shape{a.batch, a.seq, a.heads, a.head_dim}), dO(Q.shape());
  Tensor<float> K(Shape{a.batch, a.seq, p.kv_heads(), a.head_dim}), V(K.shape());
  fill_normal(Q, 1);
  fill_normal(K, 2);
  fill_normal(V, 3);
  fill_normal(dO, 4);
  const auto f = context_parallel_forward(p, Q, K, V);
  c.ran = true;
  auto record = [&](RingPass pass, const std::vector<RankStep>& steps) {
    std::string why;
    c.passes.push_back(pass);
    c.equal.push_back(counted_equals_model(p, pass, steps, &why));
    if (!c.equal.back() && c.why.empty()) c.why = why;
    std::uint64_t total = 0;
    for (const auto& rs : steps) total += rs.sent.total();
    c.bytes.push_back(total);
  };
  for (RingPass pass : passes) {
    if (pass == RingPass::forward) record(pass, f.steps);
    else record(pass, context_parallel_backward(p, Q, K, V, f.O, f.LSE, dO).steps);
  }
  return c;
}

bool all_equal(const Counted& c) {
  for (bool e : c.equal)
    if (!e) return false;
  return true;
}

void print_counted(std::ostream& os, const Counted& c) {
  if (!c.ran) {
    os << "counted == model: " << c.why_not << "\n";
    return;
  }
  os << "counted == model: " << (all_equal(c) ? "yes" : "NO");
  os << " (the CPU simulation of the ring copied ";
  for (std::size_t i = 0; i < c.passes.size(); ++i)
    os << (i ? ", " : "") << c.bytes[i] << " bytes " << pass_name(c.passes[i]);
  os << " between its ranks, each rank and step equal to the model)\n";
  if (!all_equal(c)) os << "first difference: " << c.why << "\n";
}

namespace fl = flashlab::lessons;

// The measurement shown beside each pass: recorded rows for this shape, or a live run.
struct Measurements {
  std::string source;                    // "recorded" or "live"
  std::vector<fl::RingMeasured> rows;    // what there is (any shape when recorded)
  [[nodiscard]] const fl::RingMeasured* find(const ContextParallelProblem& p, RingPass pass) const {
    return fl::find_ring_measurement(rows, p, pass == RingPass::forward ? "fwd" : "bwd");
  }
};

#ifdef FLASHLAB_HAVE_RING
std::string utc_now_minutes() {
  char buf[32];
  const std::time_t t = std::time(nullptr);
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M", std::gmtime(&t));
  return buf;
}

// The ring on this machine's first G GPUs (one process driving them), timed as `flashlab bench
// attention --gpus` times it: 1 warm-up, 3 runs, the median.
Measurements measure_live(const ContextParallelProblem& p, const std::vector<RingPass>& passes) {
  namespace fc = flashlab::cuda;
  if (p.attention.dtype == Dtype::fp32)
    throw UsageError("--device cuda --dtype fp32: the ring's kernels take bf16 or fp16", "--dtype bf16");
  try {
    fc::check_context_parallel_problem(p);
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("--device cuda: ") + e.what(), "the model (--device cpu) takes any shape");
  }
  require_gpu("traffic ring --device cuda");
  std::vector<int> devices;
  for (std::size_t r = 0; r < p.gpus; ++r) devices.push_back(int(r));
  const fc::LocalRing ring(devices);
  fc::RingBenchConfig cfg;
  cfg.problem = p;
  cfg.forward = passes.front() == RingPass::forward;
  cfg.backward = passes.back() == RingPass::backward;
  cfg.warmups = 1;
  cfg.reps = 3;
  cfg.single = false;
  cfg.forward_kernel = fc::fastest_forward_kernel();
  cfg.backward_kernel = fc::fastest_backward_kernel();
  Measurements m;
  m.source = "live";
  const std::string description = fc::device_description();
  for (const auto& r : fc::bench_context_parallel(cfg, ring)) {
    fl::RingMeasured row;
    row.date = utc_now_minutes();
    row.device = description.substr(0, description.find(" ("));
    row.problem = p;
    row.pass = r.pass == RingPass::forward ? "fwd" : "bwd";
    row.ring_ms = r.ring_ms;
    row.model_bytes = double(r.model_bytes);
    row.counted_bytes = double(r.counted_bytes);
    row.max_exchange_ms = r.exchange_ms_max;
    row.max_step_compute_ms = r.compute_ms_max;
    row.exposed_ms = r.exposed_ms;
    m.rows.push_back(row);
  }
  return m;
}
#endif

void print_measured(std::ostream& os, const ContextParallelProblem& p, RingPass pass, const PassSummary& s,
                    const Measurements& m) {
  const fl::RingMeasured* r = m.find(p, pass);
  if (!r) return;
  os << "  measured (" << (m.source == "live" ? "live" : "recorded") << ", " << p.gpus << " x " << r->device << ", "
     << r->date << "): ring " << std::fixed << std::setprecision(1) << r->ring_ms << " ms (the model "
     << ms_text(s.ring_s) << "); sent per GPU " << bytes_text(std::uint64_t(r->counted_bytes)) << ", the model "
     << bytes_text(std::uint64_t(r->model_bytes)) << (r->counted_bytes == r->model_bytes ? ": equal" : ": DIFFERENT")
     << "\n    longest exchange " << std::setprecision(1) << r->max_exchange_ms << " ms beside a step of "
     << r->max_step_compute_ms << " ms; exposed " << r->exposed_ms << " ms (the model " << ms_text(s.exposed_s)
     << ")\n";
  os.unsetf(std::ios::floatfield);
}

// The recorded shapes, when none is this one (so that the reader knows what to ask for).
void print_recorded_shapes(std::ostream& os, const Measurements& m) {
  os << "measured: no recorded run of this shape (lessons/data/traffic-ring/measured.csv holds";
  std::vector<std::string> seen;
  for (const auto& r : m.rows) {
    const ContextParallelProblem& q = r.problem;
    std::ostringstream k;
    k << " --gpus " << q.gpus << " --seq " << q.attention.seq << " --heads " << q.attention.heads << " --heads-kv "
      << q.kv_heads() << " --dim " << q.attention.head_dim << (q.attention.causal ? " --causal" : "");
    if (std::find(seen.begin(), seen.end(), k.str()) == seen.end()) seen.push_back(k.str());
  }
  for (std::size_t i = 0; i < seen.size(); ++i) os << (i ? ";" : "") << seen[i];
  os << " on " << (m.rows.empty() ? std::string("no device") : m.rows.front().device)
     << "); --device cuda measures it on a machine with the GPUs\n";
}

// The report of --json and --csv: the problem and the rates, the simulation's verdict, one row
// per pass and step (the table: CSV prints a line per row, the fields before it repeated), then
// each pass's summary.
void write_report(Json& j, const ContextParallelProblem& p, double link, double tf, double tf_bwd,
                  const std::vector<RingPass>& passes, const Counted& c, const Measurements& measured) {
  j.begin_object();
  j.key("problem").begin_object();
  j.key("gpus").value(std::uint64_t(p.gpus)).key("layout").value(layout_name(p.layout));
  j.key("batch").value(std::uint64_t(p.attention.batch)).key("seq").value(std::uint64_t(p.attention.seq));
  j.key("heads").value(std::uint64_t(p.attention.heads)).key("heads_kv").value(std::uint64_t(p.kv_heads()));
  j.key("head_dim").value(std::uint64_t(p.attention.head_dim)).key("causal").value(p.attention.causal);
  j.key("dtype").value(dtype_name(p.attention.dtype));
  j.key("chunk_len").value(std::uint64_t(p.chunk_len())).key("local_seq").value(std::uint64_t(p.local_seq()));
  j.end_object();
  j.key("link_gbps").value(link).key("tflops").value(tf).key("tflops_bwd").value(tf_bwd);
  j.key("counted_equals_model");
  if (c.ran) j.value(all_equal(c));
  else j.null();
  if (!c.ran) j.key("not_counted_because").value(c.why_not);
  const auto model = [&](RingPass pass) {
    return ring_model(p, pass, link * 1e9, (pass == RingPass::forward ? tf : tf_bwd) * 1e12);
  };
  j.key("steps").begin_array();
  for (RingPass pass : passes)
    for (const auto& m : model(pass)) {
      j.begin_object().key("pass").value(pass_name(pass)).key("step").value(std::uint64_t(m.step));
      // The backward's last hop brings dK/dV home: no K/V chunk arrives.
      j.key("kv_source_of_gpu0");
      if (pass == RingPass::backward && m.step == p.gpus) j.null();
      else j.value(std::uint64_t(ring_source(p.gpus, 0, m.step)));
      j.key("sent_K").value(m.sent.K).key("sent_V").value(m.sent.V).key("sent_dK").value(m.sent.dK);
      j.key("sent_dV").value(m.sent.dV).key("sent_bytes").value(m.sent.total());
      j.key("flops_max").value(m.flops_max).key("flops_min").value(m.flops_min);
      j.key("compute_ms").value(m.compute_s * 1e3).key("link_ms").value(m.link_s * 1e3).key("hidden").value(m.hidden());
      j.end_object();
    }
  j.end_array();
  j.key("passes").begin_array();
  for (RingPass pass : passes) {
    const PassSummary s = summarise(p, model(pass));
    j.begin_object().key("pass").value(pass_name(pass));
    j.key("compute_ms").value(s.compute_s * 1e3).key("link_ms").value(s.link_s * 1e3);
    j.key("ring_ms").value(s.ring_s * 1e3).key("exposed_ms").value(s.exposed_s * 1e3).key("hides").value(s.hides);
    j.key("break_even_local_seq").value(s.break_even);
    j.key("measured");
    if (const fl::RingMeasured* r = measured.find(p, pass)) {
      j.begin_object().key("source").value(measured.source).key("device").value(r->device).key("date").value(r->date);
      j.key("ring_ms").value(r->ring_ms).key("model_bytes_per_gpu").value(r->model_bytes);
      j.key("counted_bytes_per_gpu").value(r->counted_bytes).key("counted_equals_model").value(r->counted_bytes == r->model_bytes);
      j.key("max_exchange_ms").value(r->max_exchange_ms).key("max_step_compute_ms").value(r->max_step_compute_ms);
      j.key("exposed_ms").value(r->exposed_ms);
      j.end_object();
    } else {
      j.null();
    }
    j.end_object();
  }
  j.end_array();
  j.end_object();
}

}  // namespace

int cmd_traffic_ring(const Args& args) {
  return guarded("traffic ring", [&]() -> int {
    const auto desc = options();
    const auto parsed = parse_subject_command(
        args, desc, {"traffic", "model", "ring", "flashlab traffic ring --gpus 4 --seq 4096 --causal", kUsageLine, kSummary});
    if (!parsed) return kOk;  // --help was printed
    const po::variables_map& vm = *parsed;
    const ContextParallelProblem p = problem_from(vm);
    const double link = rate_flag(vm, "link-gbps"), tf = rate_flag(vm, "tflops"), tf_bwd = rate_flag(vm, "tflops-bwd");
    const OutputFormat format = output_format(vm);
    const std::string pass = vm["pass"].as<std::string>();
    if (pass != "fwd" && pass != "bwd" && pass != "both")
      throw UsageError("--pass '" + pass + "' is unknown", "choose fwd, bwd or both");
    std::vector<RingPass> passes;
    if (pass != "bwd") passes.push_back(RingPass::forward);
    if (pass != "fwd") passes.push_back(RingPass::backward);
    const std::string device = vm["device"].as<std::string>();
    if (device != "cpu" && device != "cuda") throw UsageError("--device '" + device + "' is unknown", "choose cpu or cuda");
    Measurements measured;
    if (device == "cuda") {
#if defined(FLASHLAB_HAVE_RING)
      measured = measure_live(p, passes);
#elif defined(FLASHLAB_HAVE_CUDA)
      throw UsageError("--device cuda: this build has no context-parallel ring",
                       "build with CUDA and NCCL (nccl.h and libnccl in the CUDA installation); --device cpu prints "
                       "the model and the recorded measurement");
#else
      throw built_without_cuda("--device cuda measures the ring on G GPUs, with NCCL", "use --device cpu for the model");
#endif
    } else {
      measured.source = "recorded";
      measured.rows = fl::recorded_ring_measurements();
    }

    const Counted counted = simulate(p, passes);
    if (format != OutputFormat::text) {
      ReportOutput report(format, std::cout);
      write_report(report.json(), p, link, tf, tf_bwd, passes, counted, measured);
      report.finish();
    } else {
      std::ostream& os = std::cout;
      os << "ring attention on " << p.gpus << " GPUs (" << layout_name(p.layout) << (p.attention.causal ? ", causal" : "")
         << "): B=" << p.attention.batch << " N=" << p.attention.seq << " H=" << p.attention.heads
         << " H_kv=" << p.kv_heads() << " d=" << p.attention.head_dim << " " << dtype_name(p.attention.dtype) << "\n";
      os << "each GPU holds " << p.chunks_per_rank() << (p.chunks_per_rank() == 1 ? " chunk" : " chunks") << " of "
         << p.chunk_len() << " rows (N_local = " << p.local_seq() << ")";
      if (p.padded_seq() != p.attention.seq)
        os << "; the sequence is padded at its end to " << p.padded_seq() << " rows";
      os << "\nmodel: link " << link << " GB/s per GPU each way; compute " << tf << " TFLOP/s forward, " << tf_bwd
         << " backward\n";
      bool any = false;
      for (RingPass ps : passes) {
        const auto steps = ring_model(p, ps, link * 1e9, (ps == RingPass::forward ? tf : tf_bwd) * 1e12);
        const PassSummary summary = summarise(p, steps);
        print_table(os, p, ps, steps, summary);
        print_measured(os, p, ps, summary, measured);
        any = any || measured.find(p, ps) != nullptr;
      }
      os << "\n";
      print_counted(os, counted);
      if (!any) print_recorded_shapes(os, measured);
    }
    bool measured_equal = true;
    if (measured.source == "live")
      for (const auto& r : measured.rows) measured_equal = measured_equal && r.counted_bytes == r.model_bytes;
    return (!counted.ran || all_equal(counted)) && measured_equal ? kOk : kFailed;
  });
}

}  // namespace flashlab::app
