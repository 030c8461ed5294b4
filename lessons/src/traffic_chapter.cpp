// The traffic chapter's three-level table (traffic_chapter.hpp): toy tile counts × bytes per
// tile, the reference's counted bytes, and measured L2 / DRAM bytes.
#include "flashlab/lessons/traffic_chapter.hpp"

#include <cmath>
#include <cstdio>
#include <sstream>
#include <stdexcept>

#include "flashlab/lessons/formula.hpp"
#include "flashlab/lessons/lesson.hpp"
#include "flashlab/reference/attention_traffic.hpp"
#include "flashlab/reference/mta_traffic.hpp"

namespace flashlab::lessons {

namespace {

std::vector<std::string> split_csv(const std::string& line) {
  // Fields may be quoted (the command contains spaces and maybe commas); "" is a quote.
  std::vector<std::string> out;
  std::string cur;
  bool quoted = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') cur += '"', ++i;
      else if (c == '"') quoted = false;
      else cur += c;
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      out.push_back(cur);
      cur.clear();
    } else if (c != '\r') {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

// Calls row(fields) for every data line of a CSV `text` whose first line must be `header`, with
// `width` fields per line; errors name `file`:line.
template <typename Row>
void for_each_csv_row(const std::string& text, const char* header, std::size_t width, const char* file, Row row) {
  std::istringstream is(text);
  std::string line;
  int no = 0;
  bool seen_header = false;
  while (std::getline(is, line)) {
    ++no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    try {
      if (!seen_header) {
        if (line != header) throw std::invalid_argument("the header is not " + std::string(header));
        seen_header = true;
        continue;
      }
      const auto f = split_csv(line);
      if (f.size() != width)
        throw std::invalid_argument(std::to_string(f.size()) + " fields, expected " + std::to_string(width));
      row(f);
    } catch (const std::exception& e) {
      throw std::invalid_argument(std::string(file) + ":" + std::to_string(no) + ": " + e.what());
    }
  }
}

std::string quote(const std::string& s) {
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

std::size_t to_size(const std::string& s, const char* what) {
  std::size_t used = 0;
  long long v = -1;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != s.size() || v < 1) throw std::invalid_argument(std::string(what) + " '" + s + "' is not a positive integer");
  return static_cast<std::size_t>(v);
}

double to_bytes(const std::string& s) {
  std::size_t used = 0;
  double v = -1;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != s.size() || !(v >= 0) || !std::isfinite(v)) throw std::invalid_argument("'" + s + "' is not a byte count");
  return v;
}

std::string human(double bytes) {
  char buf[32];
  if (bytes >= 1e9) std::snprintf(buf, sizeof buf, "%.3f GB", bytes / 1e9);
  else if (bytes >= 1e6) std::snprintf(buf, sizeof buf, "%.3f MB", bytes / 1e6);
  else std::snprintf(buf, sizeof buf, "%.3f kB", bytes / 1e3);
  return buf;
}

std::string pad(std::string s, std::size_t w) {
  // Widths count code points (the table uses "—" and "×").
  std::size_t cps = 0;
  for (unsigned char c : s) cps += (c & 0xC0) != 0x80;
  if (cps < w) s.insert(0, w - cps, ' ');
  return s;
}

// Degree of a tile-count formula in n: 1 for n, 2 for n^2 (checked at n = 2 and 3).
int degree(const std::string& formula) {
  const double two = evaluate_formula(formula, {{"n", 2.0}}), three = evaluate_formula(formula, {{"n", 3.0}});
  for (int k = 1; k <= 2; ++k) {
    if (std::fabs(two - std::pow(2.0, k)) < 1e-9 && std::fabs(three - std::pow(3.0, k)) < 1e-9) return k;
  }
  throw std::logic_error("tile count '" + formula + "' is neither n nor n^2");
}

}  // namespace

ref::AttentionProblem parse_attention_shape(const std::string& text) {
  ref::AttentionProblem c;
  std::istringstream is(text);
  std::string w;
  while (is >> w) {
    const auto eq = w.find('=');
    if (eq == std::string::npos) {
      if (w == "fp32" || w == "bf16" || w == "fp16") c.dtype = ref::parse_dtype(w);
      else if (w == "causal") c.causal = true;
      else throw std::invalid_argument("shape: unknown word '" + w + "'");
      continue;
    }
    const std::string k = w.substr(0, eq);
    const std::size_t v = to_size(w.substr(eq + 1), k.c_str());
    if (k == "B") c.batch = v;
    else if (k == "N") c.seq = v;
    else if (k == "H") c.heads = v;
    else if (k == "H_kv") c.heads_kv = v;
    else if (k == "N_k") c.seq_k = v;
    else if (k == "d") c.head_dim = v;
    else if (k == "Br") c.Br = v;
    else if (k == "Bc") c.Bc = v;
    else throw std::invalid_argument("shape: unknown size '" + k + "' (B, N, N_k, H, H_kv, d, Br, Bc)");
  }
  c.validate();
  return c;
}

const MeasuredBytes* Measurement::find(const std::string& variant, std::size_t seq) const {
  for (const auto& r : rows) {
    if (r.variant == variant && r.seq == seq) return &r;
  }
  return nullptr;
}

Measurement parse_measurement_csv(const std::string& text) {
  Measurement m;
  for_each_csv_row(text, kMeasuredCsvHeader, 16, "measured.csv", [&](const std::vector<std::string>& f) {
    ref::AttentionProblem c;
    c.batch = to_size(f[4], "batch");
    c.seq = to_size(f[5], "seq");
    c.heads = to_size(f[6], "heads");
    c.head_dim = to_size(f[7], "head_dim");
    c.Br = to_size(f[8], "block_m");
    c.Bc = to_size(f[9], "block_n");
    c.dtype = ref::parse_dtype(f[10]);
    if (m.rows.empty()) {
      m.date = f[0];
      m.device = f[1];
      m.command = f[2];
      m.shape = c;
    } else if (f[0] != m.date || f[1] != m.device || f[2] != m.command || c.batch != m.shape.batch ||
               c.heads != m.shape.heads || c.head_dim != m.shape.head_dim || c.Br != m.shape.Br ||
               c.Bc != m.shape.Bc || c.dtype != m.shape.dtype) {
      throw std::invalid_argument("every row must share date, device, command and shape (only N varies)");
    }
    MeasuredBytes r;
    r.variant = f[3];
    r.seq = c.seq;
    r.l2_read = to_bytes(f[11]);
    r.l2_write = to_bytes(f[12]);
    r.l2_atomic = to_bytes(f[13]);
    r.dram_read = to_bytes(f[14]);
    r.dram_write = to_bytes(f[15]);
    m.rows.push_back(r);
  });
  if (m.rows.empty()) throw std::invalid_argument("measured.csv has no rows");
  return m;
}

const Measurement& recorded_measurement() {
  static const Measurement m = [] {
    const std::string* text = embedded_file("traffic-levels/measured.csv");
    if (!text) throw std::logic_error("lesson data missing: lessons/data/traffic-levels/measured.csv");
    return parse_measurement_csv(*text);
  }();
  return m;
}

std::string measurement_csv(const Measurement& m) {
  std::ostringstream os;
  os.precision(12);
  os << kMeasuredCsvHeader << "\n";
  for (const auto& r : m.rows) {
    os << m.date << "," << quote(m.device) << "," << quote(m.command) << "," << r.variant << "," << m.shape.batch
       << "," << r.seq << "," << m.shape.heads << "," << m.shape.head_dim << "," << m.shape.Br << ","
       << m.shape.Bc << "," << ref::dtype_name(m.shape.dtype) << "," << r.l2_read << "," << r.l2_write << ","
       << r.l2_atomic << "," << r.dram_read << "," << r.dram_write << "\n";
  }
  return os.str();
}

std::optional<std::uint64_t> toy_tile_bytes(ref::Algorithm v, const ref::AttentionProblem& cfg) {
  const char* id = v == ref::Algorithm::fa2_fwd ? "fa2-order" : v == ref::Algorithm::fa1_fwd ? "fa1-order" : nullptr;
  if (!id || cfg.causal) return std::nullopt;
  const Lesson* l = find_lesson(id);
  if (!l || !l->trace) throw std::logic_error(std::string("lesson ") + id + " is missing");
  const std::uint64_t Tr = cfg.Tr(), Tc = cfg.Tc(), bh = cfg.batch * cfg.heads;
  const std::uint64_t elem = ref::dtype_bytes(cfg.dtype);
  std::uint64_t bytes = 0;
  for (const auto& [metric, formula] : l->trace->tile_targets) {
    const char tensor = metric[0];
    const bool query_side = tensor == 'Q' || tensor == 'O';
    const std::uint64_t own = query_side ? Tr : Tc;
    const std::uint64_t count = degree(formula) == 2 ? Tr * Tc : own;
    const std::uint64_t tile = (query_side ? cfg.Br : cfg.Bc) * cfg.head_dim * elem;
    bytes += count * tile * bh;
  }
  return bytes;
}

std::vector<ref::Algorithm> chapter_variants() {
  return {ref::Algorithm::naive_fwd, ref::Algorithm::fa1_fwd, ref::Algorithm::fa2_fwd, ref::Algorithm::bwd_two_kernel,
          ref::Algorithm::bwd_atomic};
}

std::string traffic_levels_table(const ref::AttentionProblem& cfg, const Measurement* measured, bool explain) {
  std::ostringstream os;
  os << "HBM traffic at " << cfg.str() << ", three levels (bytes read + written):\n";
  os << "  toy      = the tile lessons' transfer counts × bytes per tile (fa1-order, fa2-order only)\n";
  os << "  counted  = the reference's traffic model (traffic-fwd, traffic-bwd)\n";
  os << "  L2       = bytes the SMs requested from L2;  DRAM = bytes L2 moved to and from HBM\n";
  if (measured)
    os << "  measured: " << (measured->date.empty() ? "now" : measured->date) << ", " << measured->device
       << ", `" << measured->command << "`\n";
  os << "\n"
     << pad("design", 16) << pad("toy", 12) << pad("counted", 12) << pad("L2", 12) << pad("L2/counted", 12)
     << pad("DRAM", 12) << pad("DRAM/L2", 10) << "\n";
  for (ref::Algorithm v : chapter_variants()) {
    const std::string name(ref::algorithm_name(v));
    const auto t = ref::attention_traffic_formula(v, cfg);
    const double counted = double(t.total_read_bytes() + t.total_write_bytes());
    const auto toy = toy_tile_bytes(v, cfg);
    const MeasuredBytes* r = measured ? measured->find(name, cfg.seq) : nullptr;
    char ratio_l2[16] = "—", ratio_dram[16] = "—";
    if (r) {
      std::snprintf(ratio_l2, sizeof ratio_l2, "%.3f", r->l2_total() / counted);
      std::snprintf(ratio_dram, sizeof ratio_dram, "%.3f", r->l2_total() > 0 ? r->dram_total() / r->l2_total() : 0.0);
    }
    os << pad(name, 16) << pad(toy ? human(double(*toy)) : "—", 12) << pad(human(counted), 12)
       << pad(r ? human(r->l2_total()) : "—", 12) << pad(ratio_l2, 12) << pad(r ? human(r->dram_total()) : "—", 12)
       << pad(ratio_dram, 10) << "\n";
  }
  os << "\ntoy vs counted: the tile model loads and stores O (the running state) where the kernels start\n"
        "from zero and write O once; it has no m, l or LSE. naive's L2 is above counted: the GPU kernels\n"
        "re-read K and V once per query tile where the model reads them once.\n";
  if (!measured || !measured->find("fa2_fwd", cfg.seq))
    os << "no measurement at N = " << cfg.seq << ": the recorded one has "
       << (measured ? measured->shape.str() : std::string("none")) << "; measure live with --device cuda\n";
  if (explain) {
    os << "why DRAM < L2: every query tile (block) requests all of K_j and V_j, Tr = " << cfg.Tr()
       << " times per head; after the first request the lines are in the 50 MB L2, so the re-reads are\n"
          "served from L2 and only the first one reaches HBM.\n";
  } else {
    os << "why is DRAM below L2?  flashlab lesson show traffic-levels\n";
  }
  return os.str();
}

FamilyMeasurement parse_family_csv(const std::string& text) {
  FamilyMeasurement m;
  for_each_csv_row(text, kFamiliesCsvHeader, 14, "measured_families.csv", [&](const std::vector<std::string>& f) {
    if (m.rows.empty()) {
      m.date = f[0];
      m.device = f[1];
      m.command = f[2];
    } else if (f[0] != m.date || f[1] != m.device || f[2] != m.command) {
      throw std::invalid_argument("every row must share date, device and command");
    }
    if (f[3] != "attention" && f[3] != "mta" && f[3] != "stream")
      throw std::invalid_argument("family '" + f[3] + "' is not attention, mta or stream");
    FamilyBytes r;
    r.family = f[3];
    r.pass = f[4];
    r.shape = f[5];
    r.counted_read = to_bytes(f[6]);
    r.counted_write = to_bytes(f[7]);
    r.l2_read = to_bytes(f[8]);
    r.l2_write = to_bytes(f[9]);
    r.l2_atomic = to_bytes(f[10]);
    r.dram_read = to_bytes(f[11]);
    r.dram_write = to_bytes(f[12]);
    r.duration_ms = to_bytes(f[13]);
    m.rows.push_back(r);
  });
  if (m.rows.empty()) throw std::invalid_argument("measured_families.csv has no rows");
  return m;
}

std::string family_csv(const FamilyMeasurement& m) {
  std::ostringstream os;
  os.precision(12);
  os << kFamiliesCsvHeader << "\n";
  for (const auto& r : m.rows)
    os << m.date << "," << quote(m.device) << "," << quote(m.command) << "," << r.family << "," << r.pass << ","
       << quote(r.shape) << "," << r.counted_read << "," << r.counted_write << "," << r.l2_read << "," << r.l2_write
       << "," << r.l2_atomic << "," << r.dram_read << "," << r.dram_write << "," << r.duration_ms << "\n";
  return os.str();
}

const FamilyMeasurement& recorded_family_measurement() {
  static const FamilyMeasurement m = [] {
    const std::string* text = embedded_file("traffic-levels/measured_families.csv");
    if (!text) throw std::logic_error("lesson data missing: lessons/data/traffic-levels/measured_families.csv");
    return parse_family_csv(*text);
  }();
  return m;
}

std::vector<RingMeasured> parse_ring_csv(const std::string& text) {
  std::vector<RingMeasured> rows;
  for_each_csv_row(text, kRingCsvHeader, 18, "measured.csv", [&](const std::vector<std::string>& f) {
    RingMeasured r;
    r.date = f[0];
    r.device = f[1];
    ref::ContextParallelProblem& p = r.problem;
    p.gpus = to_size(f[2], "gpus");
    p.layout = ref::parse_layout(f[3]);
    if (f[4] != "0" && f[4] != "1") throw std::invalid_argument("causal '" + f[4] + "' is not 0 or 1");
    p.attention.causal = f[4] == "1";
    p.attention.seq = to_size(f[5], "N");
    p.attention.batch = to_size(f[6], "B");
    p.attention.heads = to_size(f[7], "H");
    const std::size_t hkv = to_size(f[8], "H_kv");
    p.heads_kv = hkv == p.attention.heads ? 0 : hkv;
    p.attention.head_dim = to_size(f[9], "d");
    p.attention.dtype = ref::parse_dtype(f[10]);
    p.validate();
    if (f[11] != "fwd" && f[11] != "bwd") throw std::invalid_argument("pass '" + f[11] + "' is not fwd or bwd");
    r.pass = f[11];
    r.ring_ms = to_bytes(f[12]);
    r.model_bytes = to_bytes(f[13]);
    r.counted_bytes = to_bytes(f[14]);
    r.max_exchange_ms = to_bytes(f[15]);
    r.max_step_compute_ms = to_bytes(f[16]);
    r.exposed_ms = to_bytes(f[17]);
    rows.push_back(r);
  });
  return rows;
}

std::string ring_csv(const std::vector<RingMeasured>& rows) {
  std::ostringstream os;
  os.precision(12);
  os << kRingCsvHeader << "\n";
  for (const auto& r : rows) {
    const ref::ContextParallelProblem& p = r.problem;
    os << r.date << "," << quote(r.device) << "," << p.gpus << "," << ref::layout_name(p.layout) << ","
       << int(p.attention.causal) << "," << p.attention.seq << "," << p.attention.batch << "," << p.attention.heads
       << "," << p.kv_heads() << "," << p.attention.head_dim << "," << ref::dtype_name(p.attention.dtype) << ","
       << r.pass << "," << r.ring_ms << "," << r.model_bytes << "," << r.counted_bytes << "," << r.max_exchange_ms
       << "," << r.max_step_compute_ms << "," << r.exposed_ms << "\n";
  }
  return os.str();
}

const std::vector<RingMeasured>& recorded_ring_measurements() {
  static const std::vector<RingMeasured> rows = [] {
    const std::string* text = embedded_file("traffic-ring/measured.csv");
    if (!text) throw std::logic_error("lesson data missing: lessons/data/traffic-ring/measured.csv");
    return parse_ring_csv(*text);
  }();
  return rows;
}

const RingMeasured* find_ring_measurement(const std::vector<RingMeasured>& rows, const ref::ContextParallelProblem& p,
                                          const std::string& pass) {
  const RingMeasured* found = nullptr;
  for (const auto& r : rows) {
    const ref::ContextParallelProblem& q = r.problem;
    if (r.pass == pass && q.gpus == p.gpus && q.layout == p.layout && q.attention.batch == p.attention.batch &&
        q.attention.seq == p.attention.seq && q.attention.heads == p.attention.heads && q.kv_heads() == p.kv_heads() &&
        q.attention.head_dim == p.attention.head_dim && q.attention.causal == p.attention.causal &&
        q.attention.dtype == p.attention.dtype)
      found = &r;
  }
  return found;
}

std::string MtaChapterShape::str() const {
  return "B=" + std::to_string(shape.batch) + " N=" + std::to_string(shape.seq) + " H=" + std::to_string(shape.heads) +
         " d=" + std::to_string(shape.head_dim) + " W=" + std::to_string(cq) + "x" + std::to_string(ck) +
         " block=" + std::to_string(block) + " splits=" + std::to_string(splits) + " fp32";
}

std::string StreamChapterShape::str() const {
  return "T=" + std::to_string(T) + " H=" + std::to_string(heads) + " d=" + std::to_string(d) +
         " b_q=" + std::to_string(bq) + " b_k=" + std::to_string(bk) + " k=" + std::to_string(k) + " seed=" +
         std::to_string(seed) + " fp32";
}

namespace {

ref::AttentionProblem lesson_shape(const char* id) {
  const Lesson* l = find_lesson(id);
  if (!l || l->shape.empty()) throw std::logic_error(std::string("lesson data missing: the shape of ") + id);
  return parse_attention_shape(l->shape);
}

FamilyBytes counted_row(const char* pass, const ref::AttentionProblem& p, ref::KvLoads loads) {
  const ref::Traffic t = ref::attention_traffic_formula(ref::Algorithm::fa2_fwd, p, loads);
  FamilyBytes r;
  r.family = "attention";
  r.pass = pass;
  r.shape = p.str();
  r.counted_read = double(t.total_read_bytes());
  r.counted_write = double(t.total_write_bytes());
  return r;
}

}  // namespace

ref::AttentionProblem gqa_chapter_problem() { return lesson_shape("traffic-gqa"); }

ref::AttentionProblem decode_chapter_problem() { return lesson_shape("traffic-decode"); }

std::vector<FamilyBytes> attention_counted_rows(const ref::AttentionProblem& fwd, const ref::AttentionProblem& decode) {
  return {counted_row("fwd", fwd, ref::KvLoads::per_query_head), counted_row("decode", decode, ref::KvLoads::per_group)};
}

std::vector<FamilyBytes> mta_counted_rows(const MtaChapterShape& s) {
  ref::mta::Params p;
  p.cq = s.cq;
  p.ck = s.ck;
  p.block = s.block;
  p.splits = s.splits;
  std::vector<FamilyBytes> rows;
  for (const char* pass : {"fwd", "bwd", "infer"}) {
    const std::string ps = pass;
    const ref::Traffic t = ps == "fwd"   ? ref::mta::forward_traffic(s.shape, p)
                           : ps == "bwd" ? ref::mta::backward_traffic(s.shape, p)
                                         : ref::mta::infer_traffic(s.shape, p);
    FamilyBytes r;
    r.family = "mta";
    r.pass = ps;
    r.shape = s.str();
    r.counted_read = double(t.total_read_bytes());
    r.counted_write = double(t.total_write_bytes());
    rows.push_back(r);
  }
  return rows;
}

std::string traffic_families_table(const FamilyMeasurement& m, bool explain) {
  std::ostringstream os;
  os << "Grouped K/V and decoding (the fast bf16 kernels), Multi-Token Attention and STREAM (clear fp32\n"
     << "kernels), bytes read + written:\n"
     << "  counted  = the reference's count (attention: the FA2 model, K/V per query head for the forward\n"
     << "             and per group for the decode step; MTA: its closed form, equal to its tile loops;\n"
     << "             STREAM: its loops on the measured run's inputs, which fix the key blocks the apply reads)\n"
     << "  L2       = bytes the SMs requested from L2;  DRAM = bytes L2 moved to and from HBM\n"
     << "  time     = the kernels' time under the profiler, L2 flushed first; DRAM/time its bandwidth\n"
     << "  measured: " << (m.date.empty() ? "now" : m.date) << ", " << m.device << ", `" << m.command << "`\n";
  std::string shape;
  for (const auto& r : m.rows) {
    if (r.shape != shape) {
      shape = r.shape;
      os << "\n" << r.family << " at " << r.shape << "\n"
         << pad("pass", 18) << pad("counted", 12) << pad("L2", 12) << pad("L2/counted", 12) << pad("DRAM", 12)
         << pad("DRAM/L2", 10) << pad("time", 12) << pad("DRAM/time", 12) << "\n";
    }
    char ratio_l2[16] = "—", ratio_dram[16] = "—", time[24] = "—", rate[24] = "—";
    if (r.counted_total() > 0) std::snprintf(ratio_l2, sizeof ratio_l2, "%.3f", r.l2_total() / r.counted_total());
    if (r.l2_total() > 0) std::snprintf(ratio_dram, sizeof ratio_dram, "%.3f", r.dram_total() / r.l2_total());
    if (r.duration_ms > 0) {
      std::snprintf(time, sizeof time, "%.3f ms", r.duration_ms);
      std::snprintf(rate, sizeof rate, "%.0f GB/s", r.dram_total() / (r.duration_ms * 1e-3) / 1e9);
    }
    os << pad(r.family + " " + r.pass, 18) << pad(human(r.counted_total()), 12) << pad(human(r.l2_total()), 12)
       << pad(ratio_l2, 12) << pad(human(r.dram_total()), 12) << pad(ratio_dram, 10) << pad(time, 12)
       << pad(rate, 12) << "\n";
  }
  if (explain)
    os << "\nwhy DRAM < L2 here too: the grouped forward's query heads of one group ask for the same K/V\n"
          "tiles, and every query tile of a head streams all of them; MTA's overlapping tiles re-read their\n"
          "halo rows and every query tile re-reads K and V; STREAM's apply reads the k kept blocks of every\n"
          "query block, and neighbouring query blocks keep many of the same.\n"
          "The re-reads are served from L2. The decode step and MTA's split-K inference read each K and V\n"
          "row once, so their DRAM bytes are nearly their L2 bytes; the decode step's time is those bytes\n"
          "at close to the HBM's bandwidth (DRAM/time), which is why decoding is bound by memory.\n";
  return os.str();
}

}  // namespace flashlab::lessons
