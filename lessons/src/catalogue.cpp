// The lesson catalogue, read from the embedded lessons/data/: catalogue.txt gives the order, each
// lesson's lesson.txt its metadata (the format: docs/lessons.md, "Where things live"). What stays code:
// the independent references (plain C++, so a wrong reference trace cannot agree with itself)
// and the traffic model the traffic chapter's answers come from (reference/).
#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>

#include "flashlab/lessons/lesson.hpp"
#include "flashlab/lessons/traffic_chapter.hpp"
#include "flashlab/reference/attention_traffic.hpp"

namespace flashlab::lessons {

namespace detail {
const std::vector<std::pair<std::string, std::string>>& embedded_data();  // embedded_lessons.cpp
}

const std::string* embedded_file(std::string_view path) {
  for (const auto& [p, content] : detail::embedded_data()) {
    if (p == path) return &content;
  }
  return nullptr;
}

std::vector<std::string> embedded_files() {
  std::vector<std::string> out;
  for (const auto& [p, content] : detail::embedded_data()) out.push_back(p);
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

// ---- independent references (plain C++, not traces) ----------------------------------------

const std::vector<double>& in(const InputValues& inputs, const std::string& name) {
  auto it = inputs.find(name);
  if (it == inputs.end()) throw std::logic_error("reference: missing input " + name);
  return it->second;
}

ExpectedOutputs matmul_ref(const InputValues& inputs, bool only_c00) {
  const auto& a = in(inputs, "a");
  const auto& b = in(inputs, "b");
  std::vector<std::optional<double>> c(4);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) {
      if (only_c00 && (i || j)) continue;
      c[i * 2 + j] = a[i * 2] * b[j] + a[i * 2 + 1] * b[2 + j];
    }
  return {{"c", c}};
}

ExpectedOutputs softmax_ref(const InputValues& inputs, int n) {
  const auto& x = in(inputs, "x");
  double m = x[0];
  for (int i = 1; i < n; ++i) m = std::max(m, x[i]);
  long double s = 0;
  for (int i = 0; i < n; ++i) s += std::exp(static_cast<long double>(x[i] - m));
  std::vector<std::optional<double>> out(n);
  for (int i = 0; i < n; ++i) out[i] = static_cast<double>(std::exp(static_cast<long double>(x[i] - m)) / s);
  return {{"out", out}};
}

ExpectedOutputs mean_var_ref(const InputValues& inputs, int n, bool with_var) {
  const auto& x = in(inputs, "x");
  long double sum = 0;
  for (int i = 0; i < n; ++i) sum += x[i];
  const long double mean = sum / n;
  ExpectedOutputs out{{"mean", {static_cast<double>(mean)}}};
  if (with_var) {
    long double ss = 0;  // the two-pass definition, in long double: what Welford must reproduce
    for (int i = 0; i < n; ++i) ss += (x[i] - mean) * (x[i] - mean);
    out["var"] = {static_cast<double>(ss / (n - 1))};
  }
  return out;
}

ExpectedOutputs attention_row_ref(const InputValues& inputs, int n) {
  const auto& q = in(inputs, "q");
  const auto& k = in(inputs, "k");
  const auto& v = in(inputs, "v");
  std::vector<long double> s(n);
  long double m = -INFINITY;
  for (int j = 0; j < n; ++j) {
    s[j] = static_cast<long double>(q[0]) * k[j * 2] + static_cast<long double>(q[1]) * k[j * 2 + 1];
    m = std::max(m, s[j]);
  }
  long double l = 0, o0 = 0, o1 = 0;
  for (int j = 0; j < n; ++j) {
    const long double p = std::exp(s[j] - m);
    l += p;
    o0 += p * v[j * 2];
    o1 += p * v[j * 2 + 1];
  }
  return {{"o", {static_cast<double>(o0 / l), static_cast<double>(o1 / l)}}};
}

ReferenceFn reference_named(const std::string& name) {
  if (name == "matmul-c00") return [](const InputValues& x, int) { return matmul_ref(x, true); };
  if (name == "matmul") return [](const InputValues& x, int) { return matmul_ref(x, false); };
  if (name == "softmax") return softmax_ref;
  if (name == "mean") return [](const InputValues& x, int n) { return mean_var_ref(x, n, false); };
  if (name == "mean-variance") return [](const InputValues& x, int n) { return mean_var_ref(x, n, true); };
  if (name == "attention-row") return attention_row_ref;
  throw std::invalid_argument("unknown reference '" + name +
                              "' (matmul-c00, matmul, softmax, mean, mean-variance, attention-row)");
}

// ---- the lesson.txt format ------------------------------------------------------------------

std::string trim(const std::string& s) {
  const auto a = s.find_first_not_of(" \t\r");
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(" \t\r") - a + 1);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream is(s);
  while (std::getline(is, cur, sep)) {
    cur = trim(cur);
    if (!cur.empty()) out.push_back(cur);
  }
  return out;
}

std::vector<std::string> words(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream is(s);
  std::string w;
  while (is >> w) out.push_back(w);
  return out;
}

// hints.md holds the hints in order, separated by lines consisting of `---`.
std::vector<std::string> split_hints(const std::string& text) {
  std::vector<std::string> out;
  std::string cur, line;
  auto flush = [&] {
    while (!cur.empty() && (cur.back() == '\n' || cur.back() == ' ')) cur.pop_back();
    if (!cur.empty()) out.push_back(cur);
    cur.clear();
  };
  std::istringstream is(text);
  while (std::getline(is, line)) {
    if (line == "---") flush();
    else cur += line + "\n";
  }
  flush();
  return out;
}

// "n" → whole numbers 1..10⁶; "d=1..4096" → whole numbers 1..4096; "ma:-6..6" → real numbers.
VariableRange parse_range(const std::string& tok) {
  VariableRange r;
  const auto sep = tok.find_first_of(":=");
  r.name = tok.substr(0, sep);
  if (sep == std::string::npos) return r;
  const std::string span = tok.substr(sep + 1);
  const auto dots = span.find("..");
  if (dots == std::string::npos)
    throw std::invalid_argument("variable range '" + tok + "' is not NAME=LO..HI (whole) or NAME:LO..HI (real)");
  r.lo = std::stod(span.substr(0, dots));
  r.hi = std::stod(span.substr(dots + 2));
  r.real = tok[sep] == ':';
  if (!r.real && (r.lo != std::floor(r.lo) || r.hi != std::floor(r.hi) || r.lo < 1))
    throw std::invalid_argument("variable range '" + tok + "': a whole-number range needs whole bounds from 1");
  if (!(r.lo < r.hi)) throw std::invalid_argument("variable range '" + tok + "' is empty");
  return r;
}

ref::Algorithm model_variant(const std::string& name) {
  for (ref::Algorithm v : {ref::Algorithm::naive_fwd, ref::Algorithm::fa1_fwd, ref::Algorithm::fa2_fwd,
                         ref::Algorithm::naive_bwd, ref::Algorithm::bwd_two_kernel, ref::Algorithm::bwd_atomic}) {
    if (ref::algorithm_name(v) == name) return v;
  }
  throw std::invalid_argument("unknown traffic model '" + name + "'");
}

// "DESIGN [tensors=A,B] [loads=per_group|per_query_head]": the bytes the reference's model of
// DESIGN moves at `shape` (read + written), of the named tensors only when given, with K_j, V_j
// loaded once per query head (the default, as FA2 written for multi-head attention) or once per
// group of query heads that share them.
std::uint64_t model_bytes(const std::string& spec, const ref::AttentionProblem& shape) {
  const auto w = words(spec);
  if (w.empty()) throw std::invalid_argument("expected.model is empty");
  std::vector<std::string> tensors;
  ref::KvLoads loads = ref::KvLoads::per_query_head;
  for (std::size_t i = 1; i < w.size(); ++i) {
    if (w[i].rfind("tensors=", 0) == 0) tensors = split(w[i].substr(8), ',');
    else if (w[i] == "loads=per_group") loads = ref::KvLoads::per_group;
    else if (w[i] == "loads=per_query_head") loads = ref::KvLoads::per_query_head;
    else throw std::invalid_argument("expected.model: '" + w[i] + "' is not tensors=A,B or loads=per_group|per_query_head");
  }
  const auto t = ref::attention_traffic_formula(model_variant(w[0]), shape, loads);
  if (tensors.empty()) return t.total_read_bytes() + t.total_write_bytes();
  std::uint64_t bytes = 0;
  for (const auto& name : tensors) {
    const auto* c = t.find(name);
    if (!c) throw std::invalid_argument("expected.model: the model of " + w[0] + " moves no tensor '" + name + "'");
    bytes += (c->read_elements + c->write_elements) * c->element_bytes;
  }
  return bytes;
}

void set_question_field(Question& q, const std::string& key, const std::string& value,
                        const std::optional<ref::AttentionProblem>& shape) {
  if (key == "kind") {
    if (value == "formula") q.kind = AnswerKind::Formula;
    else if (value == "number") q.kind = AnswerKind::Number;
    else if (value == "choice") q.kind = AnswerKind::Choice;
    else if (value == "words" || value == "claim") q.kind = AnswerKind::Claim;
    else throw std::invalid_argument("kind '" + value + "' is not formula, number, choice or claim");
  } else if (key == "prompt") {
    q.prompt = value;
  } else if (key == "expected") {
    q.expected = value;
  } else if (key == "expected.model") {
    // The traffic chapter's answers come from the reference's model at the lesson's shape.
    if (!shape) throw std::invalid_argument("expected.model needs a shape: line before the questions");
    q.expected = std::to_string(model_bytes(value, *shape));
    q.bytes = true;
  } else if (key == "vars") {
    for (const auto& tok : words(value)) {
      q.ranges.push_back(parse_range(tok));
      q.vars.push_back(q.ranges.back().name);
    }
  } else if (key == "accept") {
    q.accepted = split(value, '|');
  } else if (key == "reject") {
    q.rejected = split(value, '|');
  } else if (key == "contrary") {
    q.contrary = split(value, '|');
  } else if (key == "about") {
    q.about = split(value, '|');
  } else if (key == "not.about") {
    q.not_about = split(value, '|');
  } else if (key == "unit") {
    if (value != "bytes") throw std::invalid_argument("unit '" + value + "' is not bytes");
    q.bytes = true;
  } else if (key == "why") {
    q.why = value;
  } else {
    throw std::invalid_argument("unknown question field '" + key + "'");
  }
}

InputFamily input_family(const std::string& v) {
  if (v == "none") return InputFamily::None;
  if (v == "softmax") return InputFamily::Softmax;
  if (v == "mean") return InputFamily::Mean;
  if (v == "attention") return InputFamily::Attention;
  throw std::invalid_argument("inputs '" + v + "' is not none, softmax, mean or attention");
}

// One `key: value` line outside a question block.
void set_lesson_field(Lesson& l, TraceTask& t, bool& has_trace, std::optional<ref::AttentionProblem>& shape,
                      const std::string& key, const std::string& value) {
  if (key == "title") l.title = value;
  else if (key == "section") l.section = value;
  else if (key == "trace") {
    has_trace = true;
    if (value == "toy") t.model = TraceModel::Toy;
    else if (value == "tile") t.model = TraceModel::Tile, t.machine = "tile";
    else throw std::invalid_argument("trace '" + value + "' is not toy or tile");
  } else if (key == "machine") t.machine = value;
  else if (key == "sizes") {
    for (const auto& w : words(value)) t.ns.push_back(std::stoi(w));
  } else if (key == "smallest_n") t.smallest_n = std::stoi(value);
  else if (key == "reference") t.reference = reference_named(value);
  else if (key == "symbolic") t.symbolic_decides = value == "yes";
  else if (key == "inputs") t.inputs = input_family(value);
  else if (key == "method") t.methods = words(value);
  else if (key == "cost.cycles") t.target.cycles = value;
  else if (key == "cost.loads") t.target.loads = value;
  else if (key == "cost.reads") t.target.reads = value;
  else if (key == "cost.writes") t.target.writes = value;
  else if (key == "tile.cost") {
    const auto eq = value.find('=');
    if (eq == std::string::npos) throw std::invalid_argument("tile.cost '" + value + "' is not 'T load = formula'");
    t.tile_targets.emplace_back(trim(value.substr(0, eq)), trim(value.substr(eq + 1)));
  } else if (key == "budget") t.target_text = value;
  else if (key == "budget.hidden") t.hidden_target_text = value;
  else if (key == "shape") shape = parse_attention_shape(value), l.shape = value;
  else throw std::invalid_argument("unknown field '" + key + "'");
}

const std::string& file_or_throw(const std::map<std::string, std::string>& files, const std::string& id,
                                 const std::string& name) {
  auto it = files.find(name);
  if (it == files.end()) throw std::invalid_argument("lessons/data/" + id + "/" + name + " is missing");
  return it->second;
}

std::string file_or_empty(const std::map<std::string, std::string>& files, const std::string& name) {
  auto it = files.find(name);
  return it == files.end() ? std::string() : it->second;
}

}  // namespace

Lesson parse_lesson(const std::string& id, const std::map<std::string, std::string>& files) {
  Lesson l;
  l.id = id;
  TraceTask t;
  bool has_trace = false;
  std::optional<ref::AttentionProblem> shape;
  std::optional<Question> q;
  std::istringstream is(file_or_throw(files, id, "lesson.txt"));
  std::string line;
  int no = 0;
  try {
    while (std::getline(is, line)) {
      ++no;
      const std::string s = trim(line);
      if (s.empty() || s[0] == '#') continue;
      if (s.front() == '[') {  // [question KEY]
        if (s.rfind("[question ", 0) != 0 || s.back() != ']') throw std::invalid_argument("expected [question KEY]");
        if (q) l.questions.push_back(std::move(*q));
        q = Question{};
        q->key = trim(s.substr(10, s.size() - 11));
        continue;
      }
      const auto colon = s.find(':');
      if (colon == std::string::npos) throw std::invalid_argument("expected 'key: value'");
      const std::string key = trim(s.substr(0, colon)), value = trim(s.substr(colon + 1));
      if (q) set_question_field(*q, key, value, shape);
      else set_lesson_field(l, t, has_trace, shape, key, value);
    }
    if (q) l.questions.push_back(std::move(*q));
  } catch (const std::exception& e) {
    throw std::invalid_argument("lessons/data/" + id + "/lesson.txt:" + std::to_string(no) + ": " + e.what());
  }
  for (const auto& question : l.questions) {
    if (question.expected.empty())
      throw std::invalid_argument("lessons/data/" + id + "/lesson.txt: question " + question.key + " has no expected answer");
  }
  l.statement = file_or_throw(files, id, "statement.md");
  l.hints = split_hints(file_or_empty(files, "hints.md"));
  l.discussion = trim(file_or_empty(files, "discussion.md"));
  if (has_trace) {
    if (t.model == TraceModel::Toy && !t.reference)
      throw std::invalid_argument("lessons/data/" + id + "/lesson.txt: a toy trace needs reference:");
    t.machine_file = file_or_empty(files, "machine.txt");
    t.starter = file_or_throw(files, id, "starter.trace");
    t.solution = file_or_throw(files, id, "solution.trace");
    l.trace = std::move(t);
  }
  return l;
}

namespace {

std::vector<Lesson> build() {
  const std::string* order = embedded_file("catalogue.txt");
  if (!order) throw std::logic_error("lesson data missing: lessons/data/catalogue.txt");
  std::vector<Lesson> all;
  std::istringstream is(*order);
  std::string line;
  while (std::getline(is, line)) {
    const std::string id = trim(line);
    if (id.empty() || id[0] == '#') continue;
    std::map<std::string, std::string> files;
    for (const auto& [path, content] : detail::embedded_data()) {
      if (path.size() > id.size() + 1 && path.compare(0, id.size() + 1, id + "/") == 0 &&
          path.find('/', id.size() + 1) == std::string::npos)
        files[path.substr(id.size() + 1)] = content;
    }
    try {
      all.push_back(parse_lesson(id, files));
    } catch (const std::invalid_argument& e) {
      throw std::logic_error(std::string("lesson data: ") + e.what());
    }
  }
  return all;
}

}  // namespace

const std::vector<Lesson>& catalogue() {
  static const std::vector<Lesson> all = build();
  return all;
}

const Lesson* find_lesson(std::string_view id) {
  for (const auto& l : catalogue()) {
    if (l.id == id) return &l;
  }
  return nullptr;
}

std::string lesson_ids() {
  std::string s;
  for (const auto& l : catalogue()) s += (s.empty() ? "" : " ") + l.id;
  return s;
}

}  // namespace flashlab::lessons
