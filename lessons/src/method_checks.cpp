// Checks of the method (method_checks.hpp).
#include "method_checks.hpp"

#include <algorithm>
#include <cmath>
#include <map>

#include "flashlab/toymachine/render.hpp"
#include "flashlab/toymachine/value.hpp"

namespace flashlab::lessons::detail {

namespace {

constexpr std::uint64_t kCycleCap = 2'000'000;  // the checker's cap: a looping trace cannot hang
constexpr std::size_t kMaxShown = 80;           // symbolic text longer than this is left out

std::string num(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "∞" : "−∞";
  return toy::format_number(v);
}

bool close(double got, double want, double rel) {
  return std::fabs(got - want) <= rel * std::max(1.0, std::fabs(want));  // false for NaN
}

std::string symbolic(const toy::State& st, int reg, const toy::Machine& m) {
  if (reg < 0) return "";
  const auto& regs = st.registers;
  if (static_cast<std::size_t>(reg) >= regs.size() || !regs[static_cast<std::size_t>(reg)] ||
      !regs[static_cast<std::size_t>(reg)]->sym)
    return "";
  const std::string s = toy::to_string(*regs[static_cast<std::size_t>(reg)]->sym, &m.names);
  return s.size() <= kMaxShown ? s : "";
}

const toy::State& state_after(const toy::Executor& ex, std::size_t steps) {
  return steps < ex.history().size() ? ex.history()[steps] : ex.state();
}

// What each running-state method expects after element i, and how to say it.
struct RunningValue {
  const char* array;     // the streamed input whose rows are the elements: "x" or "k"
  const char* what;      // "the running maximum m = max(x0..x{i})"
  const char* advice;    // how to keep it
};

const std::map<std::string, RunningValue>& running_values() {
  static const std::map<std::string, RunningValue> v = {
      {"running-max", {"x", "the running maximum m = max(x0..x{i})",
                       "keep m in a register and update it with MAX as each element arrives"}},
      {"running-sum", {"x", "the running sum s = Σ_{j≤{i}} e^(xj − m) against the running maximum m",
                       "when the maximum moves from m to m′, rescale s by e^(m − m′) before adding e^(x − m′)"}},
      {"running-mean", {"x", "the running mean (x0 + … + x{i})/{i+1}",
                        "keep the mean itself and correct it by each element: mean += (x − mean)/k"}},
      {"running-m2", {"x", "M2 = Σ_{j≤{i}} (xj − mean)², the squared deviations from the running mean",
                      "correct M2 by (x − old mean)·(x − new mean) as each element arrives"}},
      {"running-score-max", {"k", "the running maximum score m = max(s0..s{i})",
                             "update m with MAX as each score arrives, keeping the old m for the rescale"}},
      {"running-denominator", {"k", "the running denominator l = Σ_{j≤{i}} e^(sj − m) against the running maximum",
                               "rescale l (and the numerator) by e^(m − m′) when the maximum moves"}},
      {"running-numerator", {"k", "the running numerator Σ_{j≤{i}} e^(sj − m)·v_j (each of its d components)",
                             "rescale each numerator component by the same e^(m − m′) as l, then add e^(s − m′)·v_j"}},
  };
  return v;
}

std::string fill(std::string s, int i) {
  for (auto [key, val] : {std::pair<std::string, int>{"{i+1}", i + 1}, {"{i}", i}}) {
    for (auto at = s.find(key); at != std::string::npos; at = s.find(key)) s.replace(at, key.size(), std::to_string(val));
  }
  return s;
}

// The streamed values of a run: x, or the scores q·k_j.
std::vector<double> streamed(const std::string& method, const toy::Inputs& in) {
  if (running_values().at(method).array == std::string("x")) return in.at("x");
  std::vector<double> s;
  const auto& q = in.at("q");
  const auto& k = in.at("k");
  for (std::size_t j = 0; j * 2 + 1 < k.size(); ++j) s.push_back(q[0] * k[2 * j] + q[1] * k[2 * j + 1]);
  return s;
}

// The running state of `method` after elements 0..i: one requirement per value the method keeps
// (the numerator has one per component), each a list of equivalent forms — Welford's M2 may be
// kept as M2 or as the running variance, the numerator as Σ e^(s − m)·v or already divided by l.
std::vector<std::vector<double>> running_value(const std::string& method, const toy::Inputs& in, int i) {
  const std::vector<double> s = streamed(method, in);
  const auto first = s.begin(), last = s.begin() + i + 1;
  const double m = *std::max_element(first, last);
  if (method == "running-max" || method == "running-score-max") return {{m}};
  double sum = 0;
  for (auto it = first; it != last; ++it) sum += std::exp(*it - m);
  if (method == "running-sum" || method == "running-denominator") return {{sum}};
  if (method == "running-numerator") {
    const auto& v = in.at("v");
    std::vector<std::vector<double>> out;
    for (std::size_t c = 0; c < 2; ++c) {
      double num = 0;
      for (int j = 0; j <= i; ++j) num += std::exp(s[static_cast<std::size_t>(j)] - m) * v[2 * static_cast<std::size_t>(j) + c];
      out.push_back({num, num / sum});
    }
    return out;
  }
  double mean = 0;
  for (auto it = first; it != last; ++it) mean += *it;
  mean /= i + 1;
  if (method == "running-mean") return {{mean}};
  double m2 = 0;
  for (auto it = first; it != last; ++it) m2 += (*it - mean) * (*it - mean);
  std::vector<double> forms{m2, m2 / (i + 1)};
  if (i > 0) forms.push_back(m2 / i);
  return {forms};
}

// Steps (0-based) of the first LOAD of each row of `array` (row = first index).
std::vector<std::optional<std::size_t>> first_loads(const toy::Executor& ex, const std::string& array, int rows) {
  std::vector<std::optional<std::size_t>> out(static_cast<std::size_t>(rows));
  const int ai = ex.machine().find_array(array);
  if (ai < 0) return out;
  for (std::size_t s = 0; s < ex.steps_taken() && s < ex.program().code.size(); ++s) {
    const auto& ins = ex.program().code[s];
    if (ins.op != toy::Opcode::LOAD || ins.operands.empty() || ins.operands[0].array != ai) continue;
    if (ins.operands[0].index.empty()) continue;
    const long long row = ins.operands[0].index[0];
    if (row >= 0 && row < rows && !out[static_cast<std::size_t>(row)]) out[static_cast<std::size_t>(row)] = s;
  }
  return out;
}

bool holds(const toy::State& st, double want) {
  return std::any_of(st.registers.begin(), st.registers.end(),
                     [&](const auto& r) { return r && close(r->num, want, 1e-9); });
}

}  // namespace

std::string step_name(const toy::Program& program, std::size_t step, std::string_view filename) {
  std::string s = "step " + std::to_string(step);
  if (step >= 1 && step <= program.code.size()) {
    const auto& ins = program.code[step - 1];
    s += " (" + std::string(filename) + ":" + std::to_string(ins.source_line) + ") `" + ins.text + "`";
  }
  return s;
}

std::optional<std::string> hostile_run(const toy::Program& program, const toy::Machine& machine,
                                       const HostileInputs& hostile, const ReferenceFn& reference, bool exp_after_max,
                                       const std::vector<toy::State>& symbolic_history, std::string_view filename) {
  const std::string on = " on " + hostile.name + " at n=" + std::to_string(machine.n);
  toy::Executor ex(program, machine, hostile.inputs, toy::Options{false, kCycleCap});
  while (!ex.done()) {
    const std::size_t pc = ex.state().pc;
    const auto& ins = program.code[pc];
    if (exp_after_max && ins.op == toy::Opcode::EXP && !ins.operands.empty()) {
      const int reg = ins.operands[0].reg;
      const auto& r = ex.state().registers[static_cast<std::size_t>(reg)];
      if (r && !(r->num <= 0)) {
        const std::string sym = pc < symbolic_history.size() ? symbolic(symbolic_history[pc], reg, machine) : "";
        return step_name(program, pc + 1, filename) + ": the exponent " + (sym.empty() ? "" : sym + " ") + "is " +
               num(r->num) + " > 0" + on +
               "\n    hint: subtract the running maximum first: with m ≥ x the exponent x − m is ≤ 0, so "
               "e^(x − m) ≤ 1 cannot overflow (the lesson text's numerical safety)";
      }
    }
    if (auto f = ex.step()) {
      return "runtime fault at step " + std::to_string(f->step) + " (" + std::string(filename) + ":" +
             std::to_string(f->source_line) + ")" + on + ": " + f->message;
    }
    const auto& regs = ex.state().registers;
    for (std::size_t r = 0; r < regs.size(); ++r) {
      if (regs[r] && !std::isfinite(regs[r]->num)) {
        return step_name(program, pc + 1, filename) + " puts " + num(regs[r]->num) + " in " + machine.registers[r] +
               on + " — the first step where it appears" +
               (ins.op == toy::Opcode::EXP ? std::string("\n    hint: e^x overflows float64 above x ≈ 709.8: subtract the "
                                                         "maximum before EXP so the exponent is ≤ 0")
                                           : std::string("\n    hint: 0/0 or ∞ − ∞: look at what this step divides or "
                                                         "subtracts on these inputs"));
      }
    }
  }
  const ExpectedOutputs want = reference(hostile.inputs, machine.n);
  for (const auto& [array, cells] : want) {
    const int ai = machine.find_array(array);
    if (ai < 0) continue;
    const auto& a = machine.arrays[static_cast<std::size_t>(ai)];
    for (std::size_t e = 0; e < cells.size(); ++e) {
      if (!cells[e]) continue;
      const auto& got = ex.state().dram[static_cast<std::size_t>(ai)][e];
      if (!got) return a.element_operand(e) + " was never written" + on;
      if (!close(got->num, *cells[e], hostile.tolerance)) {
        return a.element_operand(e) + " is wrong" + on + ": expected " + num(*cells[e]) + ", got " + num(got->num) +
               "\n    hint: a formula that cancels large numbers (a sum of squares minus a squared sum) loses "
               "every digit here; correct a running state instead";
      }
    }
  }
  return std::nullopt;
}

std::optional<std::string> running_state_problem(const toy::Executor& ex, const std::vector<std::string>& methods,
                                                 std::string_view filename) {
  const int n = ex.machine().n;
  for (const auto& method : methods) {
    auto it = running_values().find(method);
    if (it == running_values().end()) continue;
    const auto loads = first_loads(ex, it->second.array, n);
    for (int i = 1; i < n; ++i) {
      if (!loads[static_cast<std::size_t>(i)]) continue;  // never read: the outputs are wrong anyway
      const std::size_t from = *loads[static_cast<std::size_t>(i)] + 1;
      std::size_t to = ex.steps_taken();
      if (i + 1 < n && loads[static_cast<std::size_t>(i + 1)]) to = *loads[static_cast<std::size_t>(i + 1)];
      for (const auto& forms : running_value(method, ex.inputs(), i)) {
        bool found = false;
        for (std::size_t s = from; s <= to && !found; ++s)
          for (double want : forms) found = found || holds(state_after(ex, s), want);
        if (found) continue;
        const std::string next = i + 1 < n ? " before element " + std::to_string(i + 1) + " is read" : " by the end";
        return "the running state: after " + step_name(ex.program(), from, filename) + " reads element " +
               std::to_string(i) + ", no register holds " + fill(it->second.what, i) + " (= " + num(forms.front()) +
               ")" + next + "\n    hint: " + it->second.advice;
      }
    }
  }
  return std::nullopt;
}

namespace {

// Whether `e` mentions an element of one of `arrays` (memoised: the running state is a DAG).
bool depends_on(const toy::ExprPtr& e, const std::vector<std::string>& arrays, std::map<const toy::Expr*, bool>& memo) {
  if (!e) return false;
  if (auto it = memo.find(e.get()); it != memo.end()) return it->second;
  bool dep = e->kind == toy::ExprKind::Input &&
             std::find(arrays.begin(), arrays.end(), e->array) != arrays.end();
  for (const auto& a : e->args) dep = dep || depends_on(a, arrays, memo);
  memo[e.get()] = dep;
  return dep;
}

// The register operands an instruction reads, and the one it writes (−1: none).
std::pair<std::vector<int>, int> reads_writes(const toy::Instruction& ins) {
  std::vector<int> reads;
  int writes = -1;
  for (std::size_t k = 0; k < ins.operands.size(); ++k) {
    const auto& o = ins.operands[k];
    if (o.kind != toy::OperandKind::Register) continue;
    const bool last = k + 1 == ins.operands.size();
    if (last && ins.op != toy::Opcode::STORE) writes = o.reg;
    else reads.push_back(o.reg);
  }
  return {reads, writes};
}

}  // namespace

std::optional<std::string> carried_state_problem(const toy::Executor& ex, const std::vector<std::string>& methods,
                                                 std::string_view filename) {
  const int n = ex.machine().n;
  std::vector<std::string> running;
  std::string array, what;
  for (const auto& m : methods) {
    auto it = running_values().find(m);
    if (it == running_values().end()) continue;
    running.push_back(m);
    array = it->second.array;
    what += (what.empty() ? "" : "; ") + std::string(it->second.what);
  }
  if (running.empty() || n < 2) return std::nullopt;
  const std::vector<std::string> arrays =
      array == "x" ? std::vector<std::string>{"x"} : std::vector<std::string>{"k", "v"};
  const auto& prog = ex.program();
  const auto& m = ex.machine();
  const auto loads = first_loads(ex, array, n);
  std::map<const toy::Expr*, bool> memo;
  for (int i = 0; i + 1 < n; ++i) {
    if (!loads[static_cast<std::size_t>(i + 1)]) continue;
    const std::size_t at = *loads[static_cast<std::size_t>(i + 1)];  // the step that reads element i+1
    const toy::State& st = state_after(ex, at);
    // Live registers: read again before they are written.
    std::vector<int> live(m.registers.size(), 0);  // 0 unknown, 1 live, −1 dead
    for (std::size_t t = at; t < ex.steps_taken() && t < prog.code.size(); ++t) {
      const auto [reads, writes] = reads_writes(prog.code[t]);
      for (int r : reads)
        if (r >= 0 && live[static_cast<std::size_t>(r)] == 0) live[static_cast<std::size_t>(r)] = 1;
      if (writes >= 0 && live[static_cast<std::size_t>(writes)] == 0) live[static_cast<std::size_t>(writes)] = -1;
    }
    std::vector<double> allowed;
    std::string expected;
    for (const auto& method : running) {
      for (const auto& forms : running_value(method, ex.inputs(), i)) allowed.insert(allowed.end(), forms.begin(), forms.end());
    }
    for (std::size_t r = 0; r < live.size(); ++r) {
      const auto& v = st.registers[r];
      if (live[r] != 1 || !v || !depends_on(v->sym, arrays, memo)) continue;
      if (std::any_of(allowed.begin(), allowed.end(), [&](double w) { return close(v->num, w, 1e-9); })) continue;
      const std::string sym = symbolic(st, static_cast<int>(r), m);
      return "the method: " + step_name(prog, at + 1, filename) + " reads element " + std::to_string(i + 1) +
             " while " + m.registers[r] + " holds " + (sym.empty() ? "" : sym + " = ") + num(v->num) +
             ", which the steps after it use, but which is none of the lesson's running state after element " +
             std::to_string(i) + " (" + fill(what, i) + ")" +
             "\n    policy: from one element to the next this lesson carries its running state and nothing else "
             "derived from the elements; a method that carries something else — a running sum divided at every "
             "step, sums shifted by the first element, a copy of an element — can give right values and even be "
             "numerically sound, but it is not the method taught here, so it does not pass" +
             "\n    hint: " + running_values().at(running.front()).advice;
    }
  }
  return std::nullopt;
}

std::optional<std::string> outer_product_problem(const toy::Program& program, const toy::Machine& machine,
                                                 std::string_view filename) {
  // Distinct primes: every product a_ik·b_kj differs from every other and from every sum.
  const toy::Inputs in{{"a", {2, 3, 5, 7}}, {"b", {11, 13, 17, 19}}};
  auto product = [&](int i, int k, int j) { return in.at("a")[i * 2 + k] * in.at("b")[k * 2 + j]; };
  toy::Executor ex(program, machine, in, toy::Options{true, kCycleCap});
  std::optional<std::size_t> first_store;
  std::optional<std::string> third_operand;  // the first step after which three registers hold inputs
  bool four_at_once = false;
  while (!ex.done()) {
    const std::size_t pc = ex.state().pc;
    if (program.code[pc].op == toy::Opcode::STORE && !first_store) first_store = pc + 1;
    if (ex.step()) return std::nullopt;  // faults are reported by the value checks
    for (int k = 0; k < 2 && !four_at_once; ++k) {
      bool all = true;
      for (int i = 0; i < 2 && all; ++i)
        for (int j = 0; j < 2 && all; ++j) all = holds(ex.state(), product(i, k, j));
      four_at_once = all;
    }
    // The lesson text's scheme: R0 and R1 for operands, four accumulators. Count the registers
    // that hold an input element itself (symbolically, so no sum can pass for one).
    std::string held;
    int inputs = 0;
    for (std::size_t r = 0; r < ex.state().registers.size(); ++r) {
      const auto& v = ex.state().registers[r];
      if (!v || !v->sym || v->sym->kind != toy::ExprKind::Input) continue;
      ++inputs;
      held += (held.empty() ? "" : ", ") + machine.registers[r] + " = " + v->sym->name;
    }
    if (inputs > 2 && !third_operand) {
      third_operand = "the method: the outer-product order of this problem keeps two registers for operands and "
                      "four for the accumulators (one per output), but after " +
                      step_name(program, pc + 1, filename) + " " + std::to_string(inputs) +
                      " registers hold inputs at once (" + held + ")" +
                      "\n    policy: a third operand register saves LOADs — a fine schedule, but not the one this "
                      "problem asks for (its cycle count is the question), so it does not pass here; the quiz "
                      "inner6 is about schedules that use every register" +
                      "\n    hint: load each operand into R0 or R1 over the previous one, as the lesson text's trace does";
    }
  }
  if (!four_at_once) {
    std::string msg =
        "the method: the outer-product order holds the four partial sums of one k at once — a_0k·b_k0, "
        "a_0k·b_k1, a_1k·b_k0, a_1k·b_k1 in four accumulators — and this trace never does";
    if (first_store)
      msg += "; " + step_name(program, *first_store, filename) + " finishes an output while the others have no " +
             "partial sum yet: that is the inner-product order (the quiz inner6)";
    return msg + "\n    hint: for k = 0 load a_0k, a_1k, b_k0, b_k1 and make all four products, then add k = 1's";
  }
  return third_operand;
}

std::string first_departure(const toy::Executor& got, const toy::Executor& reference, std::string_view filename) {
  std::vector<double> seen;
  for (std::size_t s = 0; s <= reference.steps_taken(); ++s) {
    for (const auto& r : state_after(reference, s).registers)
      if (r) seen.push_back(r->num);
  }
  std::sort(seen.begin(), seen.end());
  auto known = [&](double v) {
    auto it = std::lower_bound(seen.begin(), seen.end(), v - 1e-12 * std::max(1.0, std::fabs(v)));
    return it != seen.end() && close(*it, v, 1e-12);
  };
  for (std::size_t s = 1; s <= got.steps_taken(); ++s) {
    const auto& before = state_after(got, s - 1).registers;
    const auto& after = state_after(got, s).registers;
    for (std::size_t r = 0; r < after.size(); ++r) {
      if (!after[r]) continue;
      const bool changed = !before[r] || before[r]->num != after[r]->num || before[r]->sym != after[r]->sym;
      if (!changed || known(after[r]->num)) continue;
      const std::string sym = symbolic(state_after(got, s), static_cast<int>(r), got.machine());
      return step_name(got.program(), s, filename) + " is the first step that departs from a correct run: it puts " +
             (sym.empty() ? "" : sym + " = ") + num(after[r]->num) + " in " + got.machine().registers[r] +
             ", a value no correct run holds";
    }
  }
  return "";
}

}  // namespace flashlab::lessons::detail
