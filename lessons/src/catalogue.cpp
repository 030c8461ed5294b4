// The lesson catalogue: per lesson the metadata that is code (machine, sizes, cost targets,
// the independent reference, the questions), with the prose and traces read from the embedded
// lessons/data/<id>/ files. Order = the seed's order (seed 004: toy model, softmax, attention,
// element is tile, loop orders, quizzes, backward pass).
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "flashlab/lessons/lesson.hpp"

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

// A data file that must exist: a missing one is a packaging bug, reported loudly.
std::string data(const std::string& id, const std::string& file) {
  const std::string* s = embedded_file(id + "/" + file);
  if (!s) throw std::logic_error("lesson data missing: lessons/data/" + id + "/" + file);
  return *s;
}

std::string optional_data(const std::string& id, const std::string& file) {
  const std::string* s = embedded_file(id + "/" + file);
  return s ? *s : std::string();
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
  for (std::size_t i = 0; i <= text.size(); ++i) {
    if (i == text.size() || text[i] == '\n') {
      if (line == "---") flush();
      else cur += line + "\n";
      line.clear();
    } else {
      line += text[i];
    }
  }
  flush();
  return out;
}

Lesson base(const std::string& id, std::string title, std::string section) {
  Lesson l;
  l.id = id;
  l.title = std::move(title);
  l.section = std::move(section);
  l.statement = data(id, "statement.md");
  l.hints = split_hints(optional_data(id, "hints.md"));
  return l;
}

TraceTask toy_task(const std::string& id, std::string machine, std::vector<int> ns, CostTarget target,
                   std::string target_text, ReferenceFn ref) {
  TraceTask t;
  t.model = TraceModel::Toy;
  t.machine = std::move(machine);
  t.machine_file = optional_data(id, "machine.txt");
  t.ns = std::move(ns);
  t.target = std::move(target);
  t.target_text = std::move(target_text);
  t.reference = std::move(ref);
  t.starter = data(id, "starter.trace");
  t.solution = data(id, "solution.trace");
  return t;
}

Question formula(std::string key, std::string prompt, std::string expected, std::vector<std::string> vars,
                 std::string why) {
  Question q;
  q.key = std::move(key);
  q.prompt = std::move(prompt);
  q.kind = vars.empty() ? AnswerKind::Number : AnswerKind::Formula;
  q.expected = std::move(expected);
  q.vars = std::move(vars);
  q.why = std::move(why);
  return q;
}

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
    long double ss = 0;  // two-pass definition, the thing Welford must reproduce
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

std::vector<Lesson> build() {
  std::vector<Lesson> all;

  {  // seed: "Problem 1: Compute c00"
    Lesson l = base("1", "Problem 1: compute c00 on the 3-register machine", "The Toy Model");
    l.trace = toy_task("1", "matmul3", {}, {"7", "4", "", ""}, "7 cycles, 4 LOADs",
                       [](const InputValues& x, int) { return matmul_ref(x, true); });
    l.trace->symbolic_decides = true;
    l.discussion =
        "Three registers is the minimum for a dot product longer than one term: two operands and the "
        "running sum. MAC takes its addend from a register, never from DRAM.";
    all.push_back(std::move(l));
  }
  {  // seed: "Problem 2: Full matmul — Locality!"
    Lesson l = base("2", "Problem 2: full 2x2 matmul with 3 registers (locality)", "The Toy Model");
    l.trace = toy_task("2", "matmul3", {}, {"25", "13", "", ""}, "25 cycles, 13 LOADs",
                       [](const InputValues& x, int) { return matmul_ref(x, false); });
    l.trace->symbolic_decides = true;
    l.questions.push_back(formula("cycles", "cycles of the full matmul with operand reuse", "25", {},
                                  "4 × 7 = 28 minus the 3 LOADs saved by reusing one operand per output"));
    l.discussion = "Locality: ordering the work so that consecutive outputs share operands removes LOADs.";
    all.push_back(std::move(l));
  }
  {  // seed: "Problem 3: Outer product matmul"
    Lesson l = base("3", "Problem 3: outer-product matmul with 6 registers", "Enlarging the Register File");
    l.trace = toy_task("3", "matmul6", {}, {"22", "10", "", ""}, "22 cycles, 10 LOADs",
                       [](const InputValues& x, int) { return matmul_ref(x, false); });
    l.trace->symbolic_decides = true;
    l.questions.push_back(formula("cycles", "cycles of the outer-product matmul on 6 registers", "22", {},
                                  "10 LOADs + 8 MACs + 4 STOREs"));
    l.discussion =
        "More registers let each loaded value serve several outputs before it is replaced: 13 → 10 LOADs.";
    all.push_back(std::move(l));
  }
  {  // seed: "Quiz: inner product with 6 registers"
    Lesson l = base("inner6", "Quiz: the best inner product with 6 registers", "Enlarging the Register File");
    // The optimum, found by reasoning and checked on the machine: 8 MACs and 4 STOREs are
    // unavoidable and each of the 8 inputs must be read once, so 20 cycles / 8 LOADs is a lower
    // bound — and lessons/data/inner6/solution.trace reaches it.
    l.trace = toy_task("inner6", "matmul6", {}, {"20", "8", "", ""}, "20 cycles, 8 LOADs",
                       [](const InputValues& x, int) { return matmul_ref(x, false); });
    l.trace->symbolic_decides = true;
    l.questions.push_back(formula("cycles", "cycles of the best inner-product trace with 6 registers", "20", {},
                                  "8 LOADs + 8 MACs + 4 STOREs: nothing is read twice"));
    l.questions.push_back(formula("loads", "LOADs of that trace", "8", {},
                                  "each input once; the savings are the 5 re-reads of Problem 2"));
    l.discussion =
        "The savings come from reuse, not from the loop order: with two registers kept for b00 and b10 "
        "and the outputs walked c00 → c01 → c11 → c10, no input is read twice. 20 cycles is the lower bound "
        "(8 MACs + 4 STOREs + 8 distinct inputs), so it even beats the outer product's 22.";
    all.push_back(std::move(l));
  }
  {  // seed: "Problem 4: Safe softmax"
    Lesson l = base("4", "Problem 4: safe softmax with 3 registers (3 passes)", "Softmax");
    l.trace = toy_task("4", "softmax3", {4, 7}, {"", "", "3n", "n"}, "3n DRAM reads, n writes",
                       [](const InputValues& x, int n) { return softmax_ref(x, n); });
    l.questions.push_back(formula("reads", "DRAM reads of safe softmax with 3 registers", "3n", {"n"},
                                  "three passes over x: max, sum, normalise"));
    l.questions.push_back(formula("writes", "DRAM writes", "n", {"n"}, "only the outputs are written"));
    l.discussion =
        "The exponentials are recomputed in pass 3 instead of stored: compute is traded for DRAM traffic.";
    all.push_back(std::move(l));
  }
  {  // seed: "Problem 5: Online softmax trace"
    Lesson l = base("5", "Problem 5: online softmax with 4 registers (2 passes)", "One More Register");
    l.trace = toy_task("5", "softmax4", {4, 7}, {"", "", "2n", "n"}, "2n DRAM reads, n writes",
                       [](const InputValues& x, int n) { return softmax_ref(x, n); });
    l.questions.push_back(formula("reads", "DRAM reads of online softmax with 4 registers", "2n", {"n"},
                                  "one online pass for (m, S) plus the normalise pass"));
    l.questions.push_back(formula("writes", "DRAM writes", "n", {"n"}, "the outputs, once each"));
    l.discussion =
        "One register more merges the max pass into the sum pass: n fewer reads, for more arithmetic per "
        "element (MAX, 2 SUB, 2 EXP, MUL, ADD).";
    all.push_back(std::move(l));
  }
  {  // seed: "Problem 6: Other running tricks"
    Lesson l = base("6", "Problem 6: another running trick — the running mean", "Intuition and Exploration");
    l.trace = toy_task("6", "running", {4, 7}, {"", "", "n + 1", "1"}, "n + 1 DRAM reads, 1 write",
                       [](const InputValues& x, int n) { return mean_var_ref(x, n, false); });
    l.discussion =
        "Same pattern as online softmax: the state (k, mean) is corrected when the reference (the count) "
        "changes. Welford's variance adds one more number to the state.";
    all.push_back(std::move(l));
  }
  {  // seed: "Quiz: Online variance (Welford's algorithm)"
    Lesson l = base("welford", "Quiz: online variance (Welford) as a trace", "Intuition and Exploration");
    l.trace = toy_task("welford", "welford", {4, 7}, {"", "", "n + 1", "2"}, "n + 1 DRAM reads, 2 writes",
                       [](const InputValues& x, int n) { return mean_var_ref(x, n, true); });
    l.discussion =
        "(k−1)s²_k = (k−2)s²_{k−1} + (x_k − x̄_k)(x_k − x̄_{k−1}): the state (k, x̄, M2) is corrected for a "
        "moving mean exactly as (m, S) is corrected for a moving max.";
    all.push_back(std::move(l));
  }
  {  // seed: "Problem 7: Online attention update"
    Lesson l = base("7", "Problem 7: online attention for one query row (one pass)", "Applying Online Softmax");
    l.trace = toy_task("7", "attention", {3, 6}, {"", "", "4n + 2", "2"}, "4n + 2 DRAM reads, 2 writes",
                       [](const InputValues& x, int n) { return attention_row_ref(x, n); });
    l.questions.push_back(formula("passes", "passes over K and V", "1", {},
                                  "only the weighted sum is needed, so the normalise pass disappears"));
    l.discussion =
        "Each p_j is produced, multiplied into v_j, accumulated and discarded: P is never materialised, and "
        "the running state is O(d) per query row.";
    all.push_back(std::move(l));
  }
  {  // seed: "Inner Product vs. Outer Product in Attention" (FA2)
    Lesson l = base("fa2-order", "Tiles: the inner-product (FA2) loop order", "Inner Product vs. Outer Product");
    TraceTask t;
    t.model = TraceModel::Tile;
    t.machine = "tile";
    t.ns = {3, 5};
    t.target_text = "Q loads n, K and V loads n² each, O loads n, O stores n";
    t.tile_targets = {{"Q load", "n"}, {"K load", "n^2"}, {"V load", "n^2"}, {"O load", "n"}, {"O store", "n"}};
    t.starter = data("fa2-order", "starter.trace");
    t.solution = data("fa2-order", "solution.trace");
    l.trace = std::move(t);
    l.discussion = "FA2: each query's output stays in SRAM across all KV tiles and is stored once; KV is reloaded "
                   "for every query tile.";
    all.push_back(std::move(l));
  }
  {  // seed: "Inner Product vs. Outer Product in Attention" (FA1)
    Lesson l = base("fa1-order", "Tiles: the outer-product (FA1) loop order", "Inner Product vs. Outer Product");
    TraceTask t;
    t.model = TraceModel::Tile;
    t.machine = "tile";
    t.ns = {3, 5};
    t.target_text = "Q loads n², K and V loads n each, O loads n², O stores n²";
    t.tile_targets = {{"Q load", "n^2"}, {"K load", "n"}, {"V load", "n"}, {"O load", "n^2"}, {"O store", "n^2"}};
    t.starter = data("fa1-order", "starter.trace");
    t.solution = data("fa1-order", "solution.trace");
    l.trace = std::move(t);
    l.questions.push_back(formula("saved", "O stores saved by keeping one more output slot resident", "n - 1",
                                  {"n"}, "stored once instead of once per KV tile"));
    l.discussion = "FA1: KV is loaded once, but every query's state makes an HBM round trip per KV tile. Each "
                   "output slot kept in SRAM saves n − 1 stores, sliding toward the FA2 schedule.";
    all.push_back(std::move(l));
  }
  {
    Lesson l = base("ai-order", "Quiz: arithmetic intensity, inner vs outer product", "Quizzes");
    l.questions.push_back(formula("inner", "tile transfers of the FA2 order", "2n^2 + 3n", {"n"},
                                  "Q n + K n² + V n² + O n + O n"));
    l.questions.push_back(formula("outer", "tile transfers of the FA1 order", "3n^2 + 2n", {"n"},
                                  "Q n² + K n + V n + O n² + O n²"));
    l.questions.push_back(formula("ai", "block updates per tile transferred, FA2 order", "n^2/(2n^2 + 3n)", {"n"},
                                  "tends to 1/2 (FA1: 1/3)"));
    all.push_back(std::move(l));
  }
  {
    Lesson l = base("ai-flash", "Quiz: arithmetic intensity of flash attention", "Quizzes");
    l.questions.push_back(formula("flops", "FLOPs of QKᵀ and PV", "4n^2d", {"n", "d", "Br"}, "2·n²d for each product"));
    l.questions.push_back(formula("kv", "K and V elements read by FA2", "2n^2d/Br", {"n", "d", "Br"},
                                  "n/Br query blocks × 2nd elements each"));
    l.questions.push_back(formula("ai", "FLOPs per K/V element read", "2Br", {"n", "d", "Br"},
                                  "larger query blocks, higher intensity"));
    all.push_back(std::move(l));
  }
  {
    Lesson l = base("contraction", "Quiz: what lets the forward pass skip P?", "Backward Pass");
    Question q;
    q.key = "answer";
    q.prompt = "the key ingredient";
    q.kind = AnswerKind::Keyword;
    q.expected = "contraction";
    q.accepted = {"contraction", "contract", "reduction", "reduce", "weighted sum"};
    q.why = "P only appears inside Σ_j P_ij v_j: produced, consumed, discarded";
    l.questions.push_back(q);
    all.push_back(std::move(l));
  }
  {
    Lesson l = base("why-dw", "Quiz: why compute dW_Q, dW_K, dW_V?", "Backward Pass");
    Question q;
    q.key = "answer";
    q.prompt = "which statement is right";
    q.kind = AnswerKind::Choice;
    q.expected = "b";
    q.why = "the weight gradients are what the optimizer uses to update the projections";
    l.questions.push_back(q);
    all.push_back(std::move(l));
  }
  {
    Lesson l = base("bwd-compute", "Quiz: compute for the weight gradients and dX", "Backward Pass");
    l.questions.push_back(formula("dw", "MACs for dW_Q, dW_K, dW_V", "3nd^2", {"n", "d"}, "three (d×n)(n×d) products"));
    l.questions.push_back(formula("dx", "MACs for dX", "3nd^2", {"n", "d"}, "three (n×d)(d×d) products"));
    all.push_back(std::move(l));
  }
  {
    Lesson l = base("bwd-order", "Quiz: row-wise vs column-wise backward", "Backward Pass");
    l.questions.push_back(formula("rows", "inner products when iterating row-wise", "1", {}, "only dQ"));
    l.questions.push_back(formula("cols", "inner products when iterating column-wise", "2", {}, "dK and dV"));
    all.push_back(std::move(l));
  }
  {
    Lesson l = base("d-trick", "Quiz: the D_i trick and K loads", "Backward Pass");
    l.questions.push_back(formula("without", "K block loads without the trick", "2", {},
                                  "one sweep to finish D_i, one to use dS"));
    l.questions.push_back(formula("with", "K block loads with D_i precomputed", "1", {},
                                  "everything fuses into one pass: twice the arithmetic intensity"));
    all.push_back(std::move(l));
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
