// The attention commands' shared flags (attention_flags.hpp).
#include "attention/attention_flags.hpp"

#include "flashlab/reference/npy.hpp"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <utility>
#include <vector>

namespace flashlab::app {

namespace {

// The flag that sets each AttentionProblem field.
const char* flag_of(const std::string& field) {
  if (field == "batch") return "--batch";
  if (field == "seq") return "--seq";
  if (field == "heads") return "--heads";
  if (field == "head_dim") return "--dim";
  if (field == "Br") return "--block-m";
  if (field == "Bc") return "--block-n";
  if (field == "scale") return "--scale";
  if (field == "seq_k") return "--seq-k";
  if (field == "heads_kv") return "--heads-kv";
  if (field == "window_left" || field == "window_right") return "--window";
  if (field == "cu_seqlens_q" || field == "cu_seqlens_k") return "--cu-seqlens";
  return "";
}

// "attention problem: Br = 0 must be at least 1 (hint: …)" → {"Br = 0 must be at least 1", "…"}.
std::pair<std::string, std::string> split_problem_error(const std::string& what) {
  const auto colon = what.find(": ");
  const auto paren = what.rfind(" (hint: ");
  const std::size_t from = colon == std::string::npos ? 0 : colon + 2;
  const std::string body = what.substr(from, paren == std::string::npos ? std::string::npos : paren - from);
  const std::string hint = paren == std::string::npos ? "" : what.substr(paren + 8, what.size() - paren - 9);
  return {body, hint};
}

constexpr const char* kCuSeqlensHint =
    "a --cu-seqlens file holds a line 'cu_seqlens_q = 0 3 3 10' (B + 1 prefix sums of the query lengths) and, "
    "when the key lengths differ, a line 'cu_seqlens_k = 0 5 5 17'";

}  // namespace

void add_tile_options(po::options_description& d) {
  add_tile_options(d, static_cast<long long>(ref::kDefaultBr), static_cast<long long>(ref::kDefaultBc));
}

std::size_t size_flag(const po::variables_map& vm, const char* name) {
  const long long v = vm[name].as<long long>();
  if (v < 0)
    throw UsageError("--" + std::string(name) + " " + std::to_string(v) + " is negative",
                     "--" + std::string(name) + " takes a positive integer");
  return static_cast<std::size_t>(v);
}

void validate_flags(const ref::AttentionProblem& problem) {
  try {
    problem.validate();
  } catch (const ref::ProblemError& e) {
    const std::string flag = flag_of(e.field());
    // "attention problem: Br = 0 must be at least 1 (hint: …)" → "--block-m: Br = 0 must be …".
    const auto [body, hint] = split_problem_error(e.what());
    throw UsageError((flag.empty() ? std::string() : flag + ": ") + body, hint);
  }
}

void require_fast_dim(std::size_t d, bool packed, const std::string& elsewhere) {
  if (d != 64 && d != 128 && d != 256)
    throw UsageError("--dim " + std::to_string(d) + " is not 64, 128 or 256",
                     "the fast kernels are compiled for d = 64, 128 and 256; " + elsewhere);
  if (packed && d == 256)
    throw UsageError("--dim 256 with --cu-seqlens: the fast kernels take packed sequences at d = 64 and 128",
                     "pad the sequences into a dense batch, or drop to --dim 128; " + elsewhere);
}

void require_det_backward(const DetBackwardFlags& f, const std::string& hint, const std::string& packed_hint) {
  // A window, grouped K/V and N_k != N: every backward but the fixed-order wgmma-ws kernel at d = 64
  // and 128 (at d = 256 it takes them).
  const bool below_256 = std::any_of(f.dims.begin(), f.dims.end(), [](int d) { return d != 256; });
  if (below_256) {
    const std::string other = "--bwd-kernel wgmma-ws-det at --dim 64 and 128";
    const char* takers = "the two-kernel design, the atomic design's mma and wgmma-ws kernels, and wgmma-ws-det at "
                         "--dim 256";
    if (f.window_left >= 0 || f.window_right >= 0)
      throw UsageError("--window " + std::to_string(f.window_left) + "," + std::to_string(f.window_right) +
                           ": the fast backward takes a window on " + takers + " (" + other + " takes none)",
                       hint);
    if (f.heads_kv > 0 && f.heads_kv != f.heads)
      throw UsageError("--heads-kv " + std::to_string(f.heads_kv) + " differs from --heads " +
                           std::to_string(f.heads) + ": the fast backward takes grouped K/V on " + takers + " (" +
                           other + " takes H_kv = H)",
                       hint);
    if (f.seq_k > 0)
      for (int n : f.seqs)
        if (std::size_t(n) != f.seq_k)
          throw UsageError("--seq-k " + std::to_string(f.seq_k) + " differs from N = " + std::to_string(n) +
                               ": the fast backward takes N_k != N on " + takers + " (" + other + " takes N_k = N)",
                           hint);
  }
  // Packed sequences: the backward on every kernel but the fixed-order wgmma-ws one.
  if (f.packed)
    throw UsageError("--cu-seqlens: --bwd-kernel wgmma-ws-det takes no packed sequences: the fast backward takes them "
                     "on the two-kernel design and the atomic design's mma and wgmma-ws kernels",
                     packed_hint);
}

ref::PackedSequences parse_cu_seqlens(std::string_view text, const std::string& source) {
  const char* const names[2] = {"cu_seqlens_q", "cu_seqlens_k"};
  std::optional<std::vector<std::int32_t>> lists[2];
  std::size_t list_line[2] = {0, 0};
  std::size_t line_no = 0;
  for (std::size_t pos = 0; pos <= text.size();) {
    std::size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (const auto hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
    const auto fail = [&](std::size_t col, const std::string& what) {
      throw UsageError("--cu-seqlens: " + source + ":" + std::to_string(line_no) + ":" + std::to_string(col + 1) + ": " +
                           what,
                       kCuSeqlensHint);
    };
    const auto blank = [&](char c) { return c == ' ' || c == '\t' || c == '\r'; };
    std::size_t c = 0;
    while (c < line.size() && blank(line[c])) ++c;
    if (c == line.size()) continue;
    const std::size_t name_col = c;
    while (c < line.size() && (std::isalnum(static_cast<unsigned char>(line[c])) || line[c] == '_')) ++c;
    const std::string name(line.substr(name_col, c - name_col));
    const int which = name == names[0] ? 0 : name == names[1] ? 1 : -1;
    if (which < 0) fail(name_col, name.empty() ? "expected a name" : "unknown name '" + name + "'");
    if (lists[which]) fail(name_col, name + " is given twice (first on line " + std::to_string(list_line[which]) + ")");
    while (c < line.size() && blank(line[c])) ++c;
    if (c == line.size() || line[c] != '=') fail(c, "expected '=' after " + name);
    ++c;
    std::vector<std::int32_t> values;
    while (true) {
      while (c < line.size() && (blank(line[c]) || line[c] == ',')) ++c;
      if (c == line.size()) break;
      const std::size_t start = c;
      if (line[c] == '-') ++c;
      long long v = 0;
      bool digits = false;
      while (c < line.size() && std::isdigit(static_cast<unsigned char>(line[c]))) {
        if (v <= 2147483648LL) v = v * 10 + (line[c] - '0');
        digits = true;
        ++c;
      }
      std::size_t end = c;
      while (end < line.size() && !blank(line[end]) && line[end] != ',') ++end;
      const std::string item(line.substr(start, end - start));
      if (!digits || end != c) fail(start, "'" + item + "' is not an integer");
      if (line[start] == '-') v = -v;
      if (v > 2147483647LL || v < -2147483647LL) fail(start, item + " does not fit an int32 prefix sum");
      values.push_back(static_cast<std::int32_t>(v));
    }
    if (values.empty()) fail(c, name + " lists no numbers");
    lists[which] = std::move(values);
    list_line[which] = line_no;
  }
  if (!lists[0]) throw UsageError("--cu-seqlens: " + source + " has no cu_seqlens_q line", kCuSeqlensHint);
  try {
    return lists[1] ? ref::PackedSequences(*lists[0], *lists[1]) : ref::PackedSequences(*lists[0]);
  } catch (const ref::ProblemError& e) {
    const bool keys = e.field() == "cu_seqlens_k" && lists[1];
    const auto [body, hint] = split_problem_error(e.what());
    throw UsageError("--cu-seqlens: " + source + ":" + std::to_string(list_line[keys ? 1 : 0]) + ": " + body, hint);
  }
}

ref::PackedSequences read_cu_seqlens(const std::string& path) {
  return parse_cu_seqlens(read_input(path, "--cu-seqlens", "cu_seqlens file", std::uint64_t{1} << 20), path);
}

ref::Algorithm algorithm_flag(const std::string& value, bool backward) {
  try {
    return ref::parse_algorithm(value, backward);
  } catch (const std::invalid_argument& e) {
    // "algorithm 'fa9' is unknown (hint: …)" → "--variant 'fa9' is unknown", hint "…".
    std::string what = e.what();
    if (what.rfind("algorithm ", 0) == 0) what = "--variant " + what.substr(10);
    const auto paren = what.rfind(" (hint: ");
    if (paren == std::string::npos) throw UsageError(what);
    throw UsageError(what.substr(0, paren), what.substr(paren + 8, what.size() - paren - 9));
  }
}

AttentionOperand attention_operand_shape(const std::filesystem::path& file) {
  const auto h = float_input_header(file, kAttentionInputsHint);
  if (h.shape.size() != 3 && h.shape.size() != 4)
    throw UsageError(file.string() + ": shape " + ref::shape_str(h.shape) + " is not [N, H, D] or [B, N, H, D]",
                     "attention operands use the Triton walkthrough's layout [SEQ, HEAD_NUM, HEAD_DIM], optionally with a batch");
  const bool four = h.shape.size() == 4;
  const ref::Shape s{four ? h.shape[0] : 1, h.shape[four ? 1 : 0], h.shape[four ? 2 : 1], h.shape[four ? 3 : 2]};
  if (h.numel == 0)
    throw UsageError(file.string() + ": shape " + ref::shape_str(h.shape) + " has a zero dimension",
                     "every dimension must be at least 1");
  return {s, four};
}

ref::Tensor<double> load_attention_operand(const std::filesystem::path& file, const InputPolicy& policy) {
  ref::Tensor<double> t(attention_operand_shape(file).shape);
  const auto values = read_float_input(file, policy, kAttentionInputsHint);
  std::copy(values.begin(), values.end(), t.data());
  return t;
}

void require_operand_match(const std::filesystem::path& file, const char* what, std::size_t got, std::size_t want,
                           const char* against, const char* hint) {
  if (got != want) {
    std::ostringstream m;
    m << file.string() << ": " << what << " is " << got << " but " << against << " has " << want;
    throw UsageError(m.str(), hint);
  }
}

void add_window_option(po::options_description& d, const char* note) {
  d.add_options()("window", po::value<std::string>(),
                  (std::string("L,R: keys seen left and right of the diagonal; -1 unbounded (e.g. 128,0)") + note).c_str());
}

void window_flag(const po::variables_map& vm, ref::AttentionProblem& problem) {
  if (!vm.count("window")) return;
  const auto w = integer_list("window", vm["window"].as<std::string>(), -1, ref::kMaxWindow, "128,0");
  if (w.size() != 2)
    throw UsageError("--window takes two numbers, L,R; got " + std::to_string(w.size()),
                     "keys seen left and right of the diagonal, -1 for unbounded: --window 128,0");
  problem.window_left = w[0];
  problem.window_right = w[1];
}

}  // namespace flashlab::app
