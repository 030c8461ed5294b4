// `flashlab traffic attention --device cuda`: the CUDA kernels' traffic measured with CUPTI,
// beside the model of the CPU reference (attention_traffic_kernels, same tiles and element size).
// Output only: the measurement lives in cuda/ (traffic_probe.hpp), the model in reference/.
//
// Per kernel: model bytes, measured L2 bytes (requests from the SMs, 32-byte sectors), measured
// DRAM bytes, their ratios and one line on the gap. Several --seq values add a sweep table of
// the naive-vs-flash (fa2) traffic ratio, modelled and measured.
#include "attention/cuda_traffic.hpp"

#include "flashlab/cuda/traffic_probe.hpp"
#include "flashlab/reference/attention_traffic.hpp"

#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace flashlab::app {

namespace {

namespace fc = flashlab::cuda;
namespace fr = flashlab::ref;

// The short name of an algorithm in the tables and the CSV (the names --variant takes).
const char* short_name(fr::Algorithm a) {
  switch (a) {
    case fr::Algorithm::naive_fwd: return "naive";
    case fr::Algorithm::fa1_fwd: return "fa1";
    case fr::Algorithm::fa2_fwd: return "fa2";
    case fr::Algorithm::bwd_two_kernel: return "bwd";
    case fr::Algorithm::bwd_atomic: return "atomic";
    case fr::Algorithm::naive_bwd: return "naive_bwd";
  }
  return "?";
}

// One row of the per-kernel table.
struct Row {
  std::string kernel;
  double model_read = 0, model_write = 0, model_atomic = 0;  // reference formula
  double tiled_read = 0;  // model + what the GPU tiling adds on purpose (naive, fa1); = model_read otherwise
  fc::KernelCounters m;
  std::string note;
};

double ratio(double a, double b) { return b > 0 ? a / b : 0.0; }

// The GPU kernels re-read some operands the reference's model counts once; state exactly how much.
double tiling_extra_read(const std::string& kernel, const fr::AttentionProblem& cfg, int fa1_split) {
  const double bh = double(cfg.batch * cfg.heads), nd = double(cfg.seq * cfg.head_dim), e = 4.0;
  const double Tr = double(cfg.Tr());
  if (kernel == "naive_scores_kernel" || kernel == "naive_pv_kernel") return (Tr - 1) * nd * e * bh;  // K / V per query tile
  if (kernel == "fa1_fwd_kernel" && fa1_split > 1) {
    // Each of the s blocks of a head reads the K_j, V_j its own query tiles can see.
    const std::size_t per = (cfg.Tr() + std::size_t(fa1_split) - 1) / std::size_t(fa1_split);
    double rows = 0, base_rows = 0;
    for (std::size_t first = 0; first < cfg.Tr(); first += per) {
      const std::size_t last_tile = std::min(cfg.Tr(), first + per) - 1;
      const std::size_t c = fr::visible_key_tiles(cfg, last_tile);
      rows += double(std::min(cfg.seq, c * cfg.Bc));
    }
    base_rows = double(std::min(cfg.seq, fr::visible_key_tiles(cfg, cfg.Tr() - 1) * cfg.Bc));
    return 2.0 * (rows - base_rows) * double(cfg.head_dim) * e * bh;
  }
  return 0.0;
}

std::string human(double bytes) {
  char buf[32];
  if (bytes >= 1e9) std::snprintf(buf, sizeof buf, "%.3f GB", bytes / 1e9);
  else if (bytes >= 1e6) std::snprintf(buf, sizeof buf, "%.3f MB", bytes / 1e6);
  else if (bytes >= 1e3) std::snprintf(buf, sizeof buf, "%.3f kB", bytes / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f B", bytes);
  return buf;
}

std::string pct(double x) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * x);
  return buf;
}

// One line on each gap between model, L2 and DRAM, from the measured numbers.
std::string explain(const Row& r, const fr::AttentionProblem& cfg, int fa1_split) {
  std::ostringstream os;
  if (r.kernel == "naive_scores_kernel")
    os << "K re-read by each of Tr=" << cfg.Tr() << " query-tile blocks (the model reads K once); ";
  else if (r.kernel == "naive_pv_kernel")
    os << "V re-read by each of Tr=" << cfg.Tr() << " query-tile blocks (the model reads V once); ";
  else if (r.kernel == "fa1_fwd_kernel" && fa1_split > 1)
    os << "K,V read by " << fa1_split << " blocks per head (FA1 as published: 1); ";
  else if (r.kernel == "bwd_atomic_kernel")
    os << "dQ read-modify-write is done in L2 by RED atomics (no data back to the SM; payload counted in SM->L2): "
          "model "
       << human(r.model_atomic) << " vs L2 atomic " << human(r.m.l2_atomic_bytes) << "; ";
  if (r.tiled_read > 0) {
    const double l2 = ratio(r.m.l2_read_bytes, r.tiled_read);
    if (l2 > 1.02)
      os << "L2->SM " << pct(l2 - 1) << " above model: 32-byte sectors, partly used at ragged tails; ";
    else if (l2 < 0.98)
      os << "L2->SM " << pct(1 - l2) << " below model; ";
    else
      os << "L2->SM = model (" << pct(l2) << "): every tile row is whole 32-byte sectors; ";
    const double slice = ratio(r.m.lts_read_bytes, r.m.l2_read_bytes);
    if (slice > 0 && slice < 0.95)
      os << "L2 slices counted only " << pct(slice)
         << " of it (observed when many blocks load the same tile at once: requests seem merged before the slices); ";
    const double dram = ratio(r.m.dram_read_bytes, r.m.l2_read_bytes);
    if (dram < 0.9)
      os << "DRAM " << pct(dram) << " of L2: re-reads of K_j/V_j (Q_i/dO_i) by other blocks hit in the 50 MB L2";
    else
      os << "DRAM = L2: data streamed once, nothing to reuse";
  }
  else
    os << "no reads; SM->L2 writes " << pct(ratio(r.m.l2_write_bytes, r.model_write)) << " of model";
  if (r.model_write > 0 && r.m.l2_write_bytes > 1.05 * r.model_write)
    os << "; writes " << pct(ratio(r.m.l2_write_bytes, r.model_write) - 1) << " above model: partial-sector stores";
  if (r.model_write > 0 && r.m.dram_write_bytes < 0.9 * r.model_write)
    os << "; DRAM writes " << pct(ratio(r.m.dram_write_bytes, r.model_write))
       << " of model: outputs still dirty in L2 when the kernel ends are written back later";
  return os.str();
}

struct Measured {
  std::vector<Row> rows;
  int fa1_split = 1;
  std::size_t passes = 0;
  std::vector<std::string> unavailable;
};

Measured measure(fr::Algorithm algorithm, const fr::AttentionProblem& cfg) {
  fc::ProbeConfig pc;
  pc.problem = cfg;
  const fc::ProbeResult res = fc::measure_attention(algorithm, pc);
  const auto model = fr::attention_traffic_kernels(algorithm, cfg);
  if (model.size() != res.kernels.size())
    throw std::runtime_error("model has " + std::to_string(model.size()) + " kernels, the GPU ran " +
                             std::to_string(res.kernels.size()));
  Measured out;
  out.fa1_split = res.fa1_query_split;
  out.passes = res.passes;
  out.unavailable = res.unavailable;
  for (std::size_t k = 0; k < model.size(); ++k) {
    Row r;
    r.kernel = res.kernels[k].kernel;
    r.m = res.kernels[k].counters;
    const fr::Traffic& t = model[k].traffic;
    r.model_read = double(t.total_read_bytes());
    r.model_write = double(t.total_write_bytes());
    if (algorithm == fr::Algorithm::bwd_atomic && r.kernel == "bwd_atomic_kernel") {
      // dQ's read-modify-write is done by atomics in L2: compare it with the atomic column.
      // The RED returns no data (no L2->SM read), its payload crosses to L2 like a store: so the
      // model's dQ reads leave the read column, its dQ writes stay in the SM->L2 write column.
      r.model_atomic = double(t.read_bytes("dQ"));
      r.model_read -= double(t.read_bytes("dQ"));
    }
    r.tiled_read = r.model_read + tiling_extra_read(r.kernel, cfg, res.fa1_query_split);
    r.note = explain(r, cfg, res.fa1_query_split);
    out.rows.push_back(std::move(r));
  }
  return out;
}

void print_table(std::ostream& os, const fr::AttentionProblem& cfg, fr::Algorithm v, const Measured& m) {
  os << "\n" << short_name(v) << "  " << cfg.str();
  if (v == fr::Algorithm::fa1_fwd) os << "  (FA1 query split " << m.fa1_split << ")";
  os << "  [CUPTI passes per metric " << m.passes << "]\n";
  char line[512];
  std::snprintf(line, sizeof line, "%-22s %11s %11s %11s %11s %11s %7s %7s %11s %11s %11s %11s %9s\n", "kernel",
                "model read", "tiled model", "L2->SM rd", "L2 slice rd", "DRAM read", "L2/mod", "DRAM/L2",
                "model write", "SM->L2 wr", "DRAM write", "L2 atomic", "time ms");
  os << line;
  for (const auto& r : m.rows) {
    std::snprintf(line, sizeof line, "%-22s %11s %11s %11s %11s %11s %7.3f %7.3f %11s %11s %11s %11s %9.3f\n",
                  r.kernel.c_str(), human(r.model_read).c_str(), human(r.tiled_read).c_str(),
                  human(r.m.l2_read_bytes).c_str(), human(r.m.lts_read_bytes).c_str(),
                  human(r.m.dram_read_bytes).c_str(), ratio(r.m.l2_read_bytes, r.tiled_read),
                  ratio(r.m.dram_read_bytes, r.m.l2_read_bytes), human(r.model_write).c_str(),
                  human(r.m.l2_write_bytes).c_str(), human(r.m.dram_write_bytes).c_str(),
                  human(r.m.l2_atomic_bytes).c_str(), r.m.duration_ns / 1e6);
    os << line;
    os << "    gap: " << r.note << "\n";
  }
  if (!m.unavailable.empty()) {
    os << "note: metrics not available on this device (read as 0):";
    for (const auto& u : m.unavailable) os << " " << u;
    os << "\n";
  }
}

void print_csv_header(std::ostream& os) {
  os << "variant,seq,heads,head_dim,block_m,block_n,causal,kernel,model_read_bytes,tiled_model_read_bytes,"
        "l2_read_bytes,lts_read_bytes,dram_read_bytes,model_write_bytes,l2_write_bytes,lts_write_bytes,"
        "dram_write_bytes,model_atomic_bytes,l2_atomic_bytes,duration_ns\n";
}

void print_csv(std::ostream& os, const fr::AttentionProblem& cfg, fr::Algorithm v, const Measured& m) {
  for (const auto& r : m.rows)
    os << short_name(v) << "," << cfg.seq << "," << cfg.heads << "," << cfg.head_dim << "," << cfg.Br << ","
       << cfg.Bc << "," << (cfg.causal ? 1 : 0) << "," << r.kernel << "," << r.model_read << "," << r.tiled_read
       << "," << r.m.l2_read_bytes << "," << r.m.lts_read_bytes << "," << r.m.dram_read_bytes << "," << r.model_write
       << "," << r.m.l2_write_bytes << "," << r.m.lts_write_bytes << "," << r.m.dram_write_bytes << ","
       << r.model_atomic << "," << r.m.l2_atomic_bytes << "," << r.m.duration_ns << "\n";
}

double total_model(const Measured& m) {
  double s = 0;
  for (const auto& r : m.rows) s += r.model_read + r.model_write + 2 * r.model_atomic;
  return s;
}
double total_l2(const Measured& m) {
  double s = 0;
  for (const auto& r : m.rows) s += r.m.l2_read_bytes + r.m.l2_write_bytes + 2 * r.m.l2_atomic_bytes;
  return s;
}
double total_dram(const Measured& m) {
  double s = 0;
  for (const auto& r : m.rows) s += r.m.dram_read_bytes + r.m.dram_write_bytes;
  return s;
}
double total_time(const Measured& m) {
  double s = 0;
  for (const auto& r : m.rows) s += r.m.duration_ns;
  return s;
}

}  // namespace

int cuda_traffic_attention(const fr::AttentionProblem& problem, const std::vector<std::size_t>& seqs,
                           std::optional<fr::Algorithm> algorithm, bool csv) {
  // No --variant: measure naive and fa2 side by side (the sweep table), like the CPU default.
  const fr::Algorithm v = algorithm.value_or(fr::Algorithm::naive_fwd);
  std::string why;
  if (!fc::device_available(&why)) {
    std::cerr << "error: --device cuda: " << why << "\nhint: run on a machine with an NVIDIA GPU, or use --device cpu\n";
    return kFailed;
  }
  auto config_for = [&](std::size_t n) {
    fr::AttentionProblem cfg = problem;
    cfg.seq = n;
    return cfg;
  };
  // The clear kernels' limits (check_clear_problem states them) before any measurement, as usage errors.
  for (std::size_t n : seqs) {
    try {
      fc::check_clear_problem(v, config_for(n));
    } catch (const std::invalid_argument& e) {
      throw UsageError(std::string("--device cuda: ") + e.what(),
                       "the clear CUDA kernels take --dtype fp32, --dim up to 256, --block-m and --block-n up to 128");
    }
  }

  std::ostream& os = std::cout;
  if (csv) print_csv_header(os);
  else
    os << "device: " << fc::device_description() << "\n"
       << "model = reference formula (attention_traffic_kernels, fp32 bytes); tiled model = model + operand re-reads\n"
       << "the GPU tiling adds on purpose (naive, FA1 split); L2->SM / SM->L2 = bytes over the crossbar between L2\n"
       << "and the SMs; L2 slice = sectors counted at the L2 slices; DRAM = HBM bytes. L2 is flushed (256 MiB\n"
       << "write + read) before every measured kernel; one CUPTI metric per replay-free session.\n";

  const bool sweep =
      (seqs.size() > 1 || !algorithm) && (v == fr::Algorithm::naive_fwd || v == fr::Algorithm::fa2_fwd);
  struct SweepRow {
    std::size_t n;
    Measured naive, flash;
  };
  std::vector<SweepRow> sweep_rows;
  for (std::size_t n : seqs) {
    const fr::AttentionProblem cfg = config_for(n);
    Measured m = measure(v, cfg);
    if (csv) print_csv(os, cfg, v, m);
    else print_table(os, cfg, v, m);
    if (sweep) {
      const fr::Algorithm other = v == fr::Algorithm::naive_fwd ? fr::Algorithm::fa2_fwd : fr::Algorithm::naive_fwd;
      Measured o = measure(other, cfg);
      if (csv) print_csv(os, cfg, other, o);
      else print_table(os, cfg, other, o);
      if (v == fr::Algorithm::naive_fwd) sweep_rows.push_back({n, std::move(m), std::move(o)});
      else sweep_rows.push_back({n, std::move(o), std::move(m)});
    }
    os.flush();
  }
  if (sweep && !csv) {
    os << "\nnaive vs flash (fa2) forward, total bytes read + written, B=" << problem.batch << " H=" << problem.heads
       << " d=" << problem.head_dim << " Br=" << problem.Br << " Bc=" << problem.Bc
       << (problem.causal ? " causal" : "") << "\n";
    char line[512];
    std::snprintf(line, sizeof line, "%7s %12s %12s %8s %12s %12s %8s %12s %12s %8s %10s %10s\n", "N", "model naive",
                  "model flash", "ratio", "L2 naive", "L2 flash", "ratio", "DRAM naive", "DRAM flash", "ratio",
                  "ms naive", "ms flash");
    os << line;
    for (const auto& s : sweep_rows) {
      std::snprintf(line, sizeof line, "%7zu %12s %12s %8.2f %12s %12s %8.2f %12s %12s %8.2f %10.3f %10.3f\n", s.n,
                    human(total_model(s.naive)).c_str(), human(total_model(s.flash)).c_str(),
                    ratio(total_model(s.naive), total_model(s.flash)), human(total_l2(s.naive)).c_str(),
                    human(total_l2(s.flash)).c_str(), ratio(total_l2(s.naive), total_l2(s.flash)),
                    human(total_dram(s.naive)).c_str(), human(total_dram(s.flash)).c_str(),
                    ratio(total_dram(s.naive), total_dram(s.flash)), total_time(s.naive) / 1e6,
                    total_time(s.flash) / 1e6);
      os << line;
    }
  }
  return kOk;
}

}  // namespace flashlab::app
