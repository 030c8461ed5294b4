#include "stream/stream_store_flags.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "flashlab/reference/npy.hpp"

namespace flashlab::app {

namespace rs = flashlab::ref::stream;

bool has_flag(const Args& args, std::string_view flag) {
  for (const auto& a : args)
    if (a == flag || (a.size() > flag.size() && a.compare(0, flag.size(), flag) == 0 && a[flag.size()] == '=')) return true;
  return false;
}

int with_store_errors(const std::function<int()>& body) {
  try {
    return body();
  } catch (const rs::StoreError& e) {
    throw UsageError(e.what(), e.hint().empty() ? "flashlab stream --help" : e.hint());
  } catch (const rs::StreamError& e) {
    throw UsageError(e.what(), "check the sizes against T (docs/stream.md)");
  }
}

std::optional<std::size_t> parse_index(std::string_view text) {
  std::size_t v = 0;
  if (text.empty() || text.size() > 18) return std::nullopt;
  const auto res = std::from_chars(text.data(), text.data() + text.size(), v);
  if (res.ec != std::errc() || res.ptr != text.data() + text.size()) return std::nullopt;
  return v;
}

Position parse_position(std::string_view text, bool plain_is_block) {
  Position p{0, plain_is_block};
  std::string_view digits = text;
  if (!text.empty() && (text[0] == 't' || text[0] == 'b')) {
    p.block = text[0] == 'b';
    digits = text.substr(1);
  }
  const auto v = parse_index(digits);
  if (!v)
    throw std::invalid_argument("'" + std::string(text) + "' is not a position: a number, t<token> or b<block>");
  p.value = *v;
  return p;
}

rs::TokenSpan parse_span(std::string_view text) {
  const auto dash = text.find('-');
  const auto a = parse_index(text.substr(0, dash));
  const auto b = dash == std::string_view::npos ? a : parse_index(text.substr(dash + 1));
  if (!a || !b) throw std::invalid_argument("'" + std::string(text) + "' is not a token span: FIRST or FIRST-LAST");
  if (*b < *a) throw std::invalid_argument("span '" + std::string(text) + "' ends before it starts");
  return {*a, *b + 1};
}

std::optional<std::size_t> parse_all_or_index(std::string_view text) {
  if (text == "all" || text.empty()) return std::nullopt;
  const auto v = parse_index(text);
  if (!v) throw std::invalid_argument("'" + std::string(text) + "' is neither 'all' nor an index");
  return v;
}

namespace {

namespace fs = std::filesystem;

constexpr const char* kInputsHint =
    "--inputs DIR must hold q.npy, k.npy (v.npy), float, [T, D], [T, H, D] or [L, T, H, D] (k, v: H_kv heads dividing H)";

/// Shape as (L, T, H, D) from a 2-, 3- or 4-D header.
std::array<std::size_t, 4> lthd(const ref::NpyHeader& h, const fs::path& p) {
  const auto& s = h.shape;
  if (s.size() == 2) return {1, s[0], 1, s[1]};
  if (s.size() == 3) return {1, s[0], s[1], s[2]};
  if (s.size() == 4) return {s[0], s[1], s[2], s[3]};
  throw UsageError(p.string() + ": has shape " + ref::shape_str(s) + ", expected [T, D], [T, H, D] or [L, T, H, D]",
                   kInputsHint);
}

}  // namespace

TraceInputsShape check_trace_inputs(const std::string& dirname, std::optional<long long> seq, std::optional<long long> dim,
                                    bool need_v) {
  const fs::path dir(dirname);
  if (!fs::is_directory(dir)) throw UsageError("--inputs " + dirname + ": not a directory", kInputsHint);
  TraceInputsShape in;
  in.dir = dirname;
  in.q_header = float_input_header(dir / "q.npy", kInputsHint);
  in.k_header = float_input_header(dir / "k.npy", kInputsHint);
  in.v_header = need_v ? float_input_header(dir / "v.npy", kInputsHint) : in.k_header;
  const auto &qh = in.q_header, &kh = in.k_header, &vh = in.v_header;
  const auto qs = lthd(qh, dir / "q.npy"), ks = lthd(kh, dir / "k.npy"), vs = lthd(vh, dir / "v.npy");
  in.L = qs[0];
  in.T = qs[1];
  in.H = qs[2];
  in.D = qs[3];
  in.H_kv = ks[2];
  in.D_v = need_v ? vs[3] : 0;
  auto bad = [&](const std::string& what) { throw UsageError(what, kInputsHint); };
  if (qh.shape.size() != kh.shape.size() || qh.shape.size() != vh.shape.size())
    bad("q.npy, k.npy" + std::string(need_v ? " and v.npy" : "") + " have different ranks: " + ref::shape_str(qh.shape) + ", " +
        ref::shape_str(kh.shape) + (need_v ? ", " + ref::shape_str(vh.shape) : ""));
  if (in.T == 0 || in.D == 0 || in.H == 0 || in.L == 0 || in.H_kv == 0 || (need_v && in.D_v == 0))
    bad("an input has a zero dimension");
  if (ks[0] != in.L || vs[0] != in.L) bad("k.npy and v.npy must have q.npy's L = " + std::to_string(in.L) + " layers");
  if (ks[1] != in.T || vs[1] != in.T) bad("k.npy and v.npy must have q.npy's T = " + std::to_string(in.T) + " tokens");
  if (ks[3] != in.D) bad("k.npy has head dim " + std::to_string(ks[3]) + ", q.npy " + std::to_string(in.D));
  if (vs[2] != in.H_kv) bad("v.npy must have k.npy's " + std::to_string(in.H_kv) + " heads");
  if (in.H % in.H_kv != 0) bad("q.npy's " + std::to_string(in.H) + " heads are not a multiple of k.npy's " + std::to_string(in.H_kv));
  if (seq && std::size_t(*seq) != in.T) bad("--seq " + std::to_string(*seq) + " disagrees with q.npy's T = " + std::to_string(in.T));
  if (dim && std::size_t(*dim) != in.D) bad("--dim " + std::to_string(*dim) + " disagrees with q.npy's D = " + std::to_string(in.D));
  return in;
}

TraceInputs load_trace_inputs(const std::string& dirname, const InputPolicy& policy, std::optional<long long> seq,
                              std::optional<long long> dim, bool need_v) {
  TraceInputs in;
  static_cast<TraceInputsShape&>(in) = check_trace_inputs(dirname, seq, dim, need_v);
  const fs::path dir(dirname);
  MemoryPlan plan;
  plan.add("q, k, v as float32",
           checked_size({in.L, in.T, in.H, in.D}, "q") + checked_size({in.L, in.T, in.H_kv, in.D + in.D_v}, "k, v"), 4);
  plan.add("the largest input read as float64", std::max(in.q_header.numel, std::max(in.k_header.numel, in.v_header.numel)), 8);
  plan.add("one head's Q, K, V, O", checked_size({in.T, 2 * in.D + 2 * in.D_v}, "head"), 4);
  plan.require_within(policy, "the inputs of --inputs " + dirname);
  std::vector<std::pair<const char*, std::vector<float>*>> files = {{"q.npy", &in.q}, {"k.npy", &in.k}};
  if (need_v) files.emplace_back("v.npy", &in.v);
  for (auto [name, out] : files) {
    const auto values = read_float_input(dir / name, policy, kInputsHint);
    out->assign(values.begin(), values.end());
  }
  return in;
}

TraceInputsReader::TraceInputsReader(const TraceInputsShape& shape, const InputPolicy& policy)
    : shape_(shape), policy_(policy) {}

void TraceInputsReader::read(int which, std::size_t layer, std::size_t t0, std::size_t rows, float* out) {
  static constexpr const char* kNames[3] = {"q.npy", "k.npy", "v.npy"};
  if (which < 0 || which > 2) throw std::out_of_range("trace inputs: tensor " + std::to_string(which));
  const ref::NpyHeader& h = which == 0 ? shape_.q_header : which == 1 ? shape_.k_header : shape_.v_header;
  const std::size_t heads = which == 0 ? shape_.H : shape_.H_kv, width = which == 2 ? shape_.D_v : shape_.D;
  if (layer >= shape_.L || t0 > shape_.T || rows > shape_.T - t0)
    throw std::out_of_range("trace inputs: layer " + std::to_string(layer) + " rows " + std::to_string(t0) + " + " +
                            std::to_string(rows) + " outside [L = " + std::to_string(shape_.L) + ", T = " +
                            std::to_string(shape_.T) + ")");
  const fs::path file = fs::path(shape_.dir) / kNames[which];
  // The header's sizes were multiplied with overflow checks; these offsets lie inside them.
  const std::size_t first = ((layer * shape_.T + t0) * heads) * width, n = rows * heads * width;
  std::ifstream f(file, std::ios::binary);
  if (!f) throw UsageError(file.string() + ": cannot be opened", kInputsHint);
  f.seekg(std::streamoff(h.data_offset + first * h.item_size));
  if (h.descr == "<f4") {
    f.read(reinterpret_cast<char*>(out), std::streamsize(n * sizeof(float)));
  } else {
    wide_.resize(n);
    f.read(reinterpret_cast<char*>(wide_.data()), std::streamsize(n * sizeof(double)));
  }
  if (!f || std::size_t(f.gcount()) != n * h.item_size)
    throw UsageError(file.string() + ": ended before element " + std::to_string(first + n) + " (the file changed?)",
                     kInputsHint);
  if (h.descr == "<f4") {
    require_finite(out, n, h.shape, file.string(), policy_, first);
  } else {
    require_finite(wide_.data(), n, h.shape, file.string(), policy_, first);
    for (std::size_t i = 0; i < n; ++i) out[i] = float(wide_[i]);
  }
}

ref::Mat<float> head_of(const std::vector<float>& a, std::size_t l, std::size_t T, std::size_t H, std::size_t h, std::size_t D) {
  ref::Mat<float> m(static_cast<Eigen::Index>(T), static_cast<Eigen::Index>(D));
  for (std::size_t t = 0; t < T; ++t)
    for (std::size_t c = 0; c < D; ++c) m(Eigen::Index(t), Eigen::Index(c)) = a[((l * T + t) * H + h) * D + c];
  return m;
}

}  // namespace flashlab::app
