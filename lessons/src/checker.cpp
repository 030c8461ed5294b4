// The checker behind `flashlab lesson check` and `lesson answer`. A trace is graded in stages,
// and the feedback names the first thing a student can act on:
//   1. it must assemble (for every size n it is checked at) — else the diagnostics, exit 2;
//   2. it must be right: run numerically on kRandomRuns random inputs per size, every graded
//      output compared with an independent C++ reference; once symbolically, so the feedback
//      can show "expected a00·b01 + a01·b11, got a00·b01 + a01·b10" (the toy-machine lesson
//      prints its tables that way), and for the matmul lessons the symbolic form must match too;
//      a wrong trace also gets the first step that departs from a correct run;
//   3. it must survive hostile inputs (hostile_inputs.hpp): the step where an ∞, a NaN or a
//      positive exponent first appears is named;
//   4. it must be within the lesson's budget (cycles, LOADs, DRAM reads/writes as formulas in n,
//      checked at each n — so `3n` is graded as a formula, not at one size);
//   5. it must follow the lesson's method (method_checks.hpp): right values by the wrong method
//      (an inner product for the outer-product problem, a sum instead of a running mean) fail.
#include "flashlab/lessons/checker.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <optional>
#include <cstdlib>
#include <random>
#include <sstream>
#include <stdexcept>

#include "claim.hpp"
#include "expr_size.hpp"
#include "hostile_inputs.hpp"
#include "method_checks.hpp"
#include "flashlab/lessons/formula.hpp"
#include "flashlab/lessons/tile.hpp"
#include "flashlab/toymachine/assembler.hpp"
#include "flashlab/toymachine/executor.hpp"
#include "flashlab/toymachine/machine.hpp"
#include "flashlab/toymachine/policy.hpp"
#include "flashlab/toymachine/render.hpp"
#include "flashlab/toymachine/value.hpp"

namespace flashlab::lessons {

namespace {

// The run policy of every toy-machine command (toymachine/policy.hpp): the same cycle cap as
// `run` and `step`; the symbolic runs keep every state (for the re-read analysis), so a trace
// must fit the symbolic budget, as `run --table` requires.
constexpr std::uint64_t kCheckCycleCap = toy::kDefaultCycleCap;
constexpr std::size_t kMaxCheckedSteps = toy::kMaxSymbolicSteps;
constexpr std::size_t kMaxShown = 120;                // symbolic strings are cut here

// The sizes of a check (checked_sizes()). Every n up to kEverySizeUpTo covers the small and
// boundary sizes. Sizes up to kFullUpTo get everything, the method checks included, which need the
// symbolic run — and it keeps every state (all of DRAM per step), so larger sizes are checked on
// numbers: kLargeSizes sizes drawn from the check's seed up to kLargestDrawn, and the sizes around
// the trace's larger constants up to the largest n the machine takes.
constexpr int kEverySizeUpTo = 24;
constexpr int kFullUpTo = 64;
constexpr int kLargeSizes = 3;
constexpr int kLargestDrawn = 256;
constexpr std::size_t kMaxConstantSizes = 24;
constexpr int kConstantRuns = 2;    // random inputs at a size around a large constant
constexpr int kHostileUpTo = 4096;  // hostile inputs up to this n
constexpr int kTileLargestN = 512;
constexpr int kTileLargestDrawn = 128;

std::string num(double v) { return toy::format_number(v); }

std::string at_n(int n) { return n > 0 ? " at n=" + std::to_string(n) : ""; }

std::uint64_t target_value(const std::string& formula, int n) {
  const double v = evaluate_formula(formula, {{"n", static_cast<double>(n)}});
  return static_cast<std::uint64_t>(std::llround(v));
}

// Grades one measured count against its formula; adds the cost line and, if over, the problem.
void grade_cost(CheckReport& rep, const std::string& metric, int n, std::uint64_t measured,
                const std::string& formula, bool hidden) {
  if (formula.empty()) return;
  CostLine c;
  c.metric = metric;
  c.n = n;
  c.measured = measured;
  c.formula = formula;
  c.target = target_value(formula, n);
  rep.costs.push_back(c);
  const bool constant = formula.find('n') == std::string::npos;
  const std::string tgt = constant ? formula : formula + " = " + std::to_string(c.target);
  if (hidden) {  // the budget is a quiz answer: say over or not, never by how much
    if (measured > c.target)
      rep.problems.push_back(metric + at_n(n) + ": " + std::to_string(measured) +
                             " — over the budget (its exact value is a question of this lesson)");
    return;
  }
  if (measured > c.target) {
    rep.problems.push_back(metric + at_n(n) + ": " + std::to_string(measured) + ", target " + tgt + " — " +
                           std::to_string(measured - c.target) + " over");
  }
}

// Flat element index of a memory operand.
std::size_t flat_index(const toy::ArrayDecl& a, const std::vector<long long>& idx) {
  std::size_t f = 0;
  for (std::size_t d = 0; d < idx.size() && d < a.dims.size(); ++d) f = f * a.dims[d] + static_cast<std::size_t>(idx[d]);
  return f;
}

// "re-read" summary from per-element read counts: "each x[i] is read 3 times" or "a[0][0] ×2, …".
std::vector<std::string> reread_summary(const toy::Machine& m, const toy::Counters& c) {
  std::vector<std::string> out;
  for (std::size_t ai = 0; ai < m.arrays.size() && ai < c.element_reads.size(); ++ai) {
    const auto& a = m.arrays[ai];
    const auto& reads = c.element_reads[ai];
    if (reads.empty()) continue;
    const auto mx = *std::max_element(reads.begin(), reads.end());
    if (mx <= 1) continue;
    const bool uniform = reads.size() > 2 && std::all_of(reads.begin(), reads.end(), [&](auto r) { return r == mx; });
    if (uniform) {
      out.push_back("each element of " + a.name + " is read " + std::to_string(mx) + " times");
      continue;
    }
    std::string s;
    int shown = 0;
    for (std::size_t e = 0; e < reads.size(); ++e) {
      if (reads[e] <= 1) continue;
      if (shown++ == 6) {
        s += ", …";
        break;
      }
      s += (s.empty() ? "" : ", ") + a.element_operand(e) + " ×" + std::to_string(reads[e]);
    }
    out.push_back("read more than once: " + s);
  }
  return out;
}

// LOADs of a value that a register already holds (the lesson text, Problem 2: "you can reuse it"). One
// message per source line, so a loop body is reported once with a count.
std::vector<std::string> needless_loads(const toy::Executor& ex) {
  std::vector<std::string> out;
  std::map<int, std::pair<std::size_t, int>> by_line;  // source line → (index in out, repeats)
  const auto& prog = ex.program();
  const auto& m = ex.machine();
  const auto& hist = ex.history();
  const std::size_t steps = ex.steps_taken();
  for (std::size_t s = 0; s < steps && s < prog.code.size(); ++s) {
    const auto& ins = prog.code[s];
    if (ins.op != toy::Opcode::LOAD || ins.operands.size() != 2) continue;
    const auto& mem = ins.operands[0];
    if (mem.array < 0) continue;
    const toy::State& before = s < hist.size() ? hist[s] : ex.state();
    const auto& a = m.arrays[static_cast<std::size_t>(mem.array)];
    const std::size_t f = flat_index(a, mem.index);
    if (f >= before.dram[static_cast<std::size_t>(mem.array)].size()) continue;
    const auto& cell = before.dram[static_cast<std::size_t>(mem.array)][f];
    if (!cell || !cell->sym) continue;
    // The destination first: reloading the register's own value is the clearest waste.
    std::vector<std::size_t> order;
    if (ins.operands[1].reg >= 0) order.push_back(static_cast<std::size_t>(ins.operands[1].reg));
    for (std::size_t r = 0; r < before.registers.size(); ++r)
      if (static_cast<int>(r) != ins.operands[1].reg) order.push_back(r);
    for (std::size_t r : order) {
      if (r >= before.registers.size()) continue;
      const auto& reg = before.registers[r];
      if (!reg || !reg->sym || !toy::equivalent(*reg->sym, *cell->sym)) continue;
      auto seen = by_line.find(ins.source_line);
      if (seen != by_line.end()) {
        ++seen->second.second;
        break;
      }
      // Constants print as their number; name the DRAM cell instead ("one", not "1").
      const std::string what = a.role == toy::ArrayRole::Constant ? a.element_operand(f)
                                                                   : toy::to_string(*cell->sym, &m.names);
      std::string msg = "step " + std::to_string(s + 1) + " (line " + std::to_string(ins.source_line) + ") `" +
                        ins.text + "` reads " + what + " again, but " + m.registers[r] + " already holds it";
      msg += static_cast<int>(r) == ins.operands[1].reg ? " — drop this LOAD" : " — use " + m.registers[r] + " instead";
      by_line[ins.source_line] = {out.size(), 0};
      out.push_back(msg);
      break;
    }
  }
  for (const auto& [line, where] : by_line) {
    if (where.second > 0) out[where.first] += " (and " + std::to_string(where.second) + " more times in the loop)";
  }
  return out;
}

struct SymbolicOutputs {
  std::map<std::string, std::vector<toy::ExprPtr>> cells;  // array → per element (null = unwritten)
};

SymbolicOutputs symbolic_outputs(const toy::Machine& m, const toy::State& s) {
  SymbolicOutputs out;
  for (std::size_t ai = 0; ai < m.arrays.size(); ++ai) {
    if (m.arrays[ai].role != toy::ArrayRole::Output) continue;
    auto& v = out.cells[m.arrays[ai].name];
    for (const auto& c : s.dram[ai]) v.push_back(c && c->sym ? c->sym : nullptr);
  }
  return out;
}

// A symbolic output for feedback: the expression as the lesson text's tables print it; when that is
// just a name (c00), the expansion too ("c00 = a00·b00 + a01·b10"). Empty when unknown or too
// long to help (a truncated formula hides exactly the part that differs).
std::string shown(const toy::Machine& m, const SymbolicOutputs& so, const std::string& array, std::size_t e) {
  auto it = so.cells.find(array);
  if (it == so.cells.end() || e >= it->second.size() || !it->second[e]) return "";
  if (!detail::printable(*it->second[e])) return "";
  const std::string named = toy::to_string(*it->second[e], &m.names);
  if (named.size() > kMaxShown) return "";
  const bool bare_name = std::all_of(named.begin(), named.end(), [](unsigned char c) { return std::isalnum(c) || c == '_'; });
  if (bare_name) {
    const std::string full = toy::to_string(*it->second[e]);
    if (full != named && full.size() <= kMaxShown) return named + " = " + full;
  }
  return named;
}

bool has_method(const TraceTask& task, const std::string& m) {
  return std::find(task.methods.begin(), task.methods.end(), m) != task.methods.end();
}

// splitmix64: independent streams from one check seed (the sizes, each size's inputs).
std::uint64_t mix(std::uint64_t a, std::uint64_t b = 0, std::uint64_t c = 0) {
  std::uint64_t z = a + 0x9E3779B97F4A7C15ull * (b + 1) + 0xBF58476D1CE4E5B9ull * (c + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The integer constants of a trace's loop bounds and index expressions: `for i in 30..n-1`
// behaves differently from n = 31 on, `x[n-30]` exists from n = 30 on.
std::vector<long long> trace_constants(std::string_view text) {
  std::vector<long long> out;
  std::istringstream is{std::string(text)};
  std::string line;
  while (std::getline(is, line)) {
    line = line.substr(0, line.find('#'));
    std::size_t i = line.find_first_not_of(" \t0123456789");  // a leading step number is no constant
    if (i == std::string::npos) continue;
    const bool loop = line.compare(i, 4, "for ") == 0 || line.compare(i, 4, "FOR ") == 0;
    int depth = 0;
    for (; i < line.size(); ++i) {
      const char c = line[i];
      depth += c == '[' ? 1 : c == ']' && depth > 0 ? -1 : 0;
      if (!std::isdigit(static_cast<unsigned char>(c)) || (depth == 0 && !loop)) continue;
      std::size_t j = i;
      while (j < line.size() && std::isdigit(static_cast<unsigned char>(line[j]))) ++j;
      if (j - i <= 6) out.push_back(std::stoll(line.substr(i, j - i)));
      i = j - 1;
    }
  }
  return out;
}

// The sizes a trace is checked at. `full`, in the order checked: the lesson's own sizes (shown
// first), then every n from the smallest the lesson allows up to kEverySizeUpTo and the sizes
// around every constant of the trace (where its loops and indices change behaviour) up to
// kFullUpTo. `numeric` (n, random inputs): kLargeSizes sizes above kEverySizeUpTo drawn from the
// check's seed — which the trace cannot influence — and the sizes around its larger constants.
struct CheckSizes {
  std::vector<int> full;
  std::vector<std::pair<int, int>> numeric;
};

CheckSizes checked_sizes(const TraceTask& task, std::string_view text, std::uint64_t seed,
                         int largest_drawn = kLargestDrawn) {
  if (task.ns.empty()) return {{0}, {}};
  CheckSizes out;
  std::vector<int>& sizes = out.full;
  sizes = task.ns;
  auto known = [&](long long n) {
    return std::find(sizes.begin(), sizes.end(), n) != sizes.end() ||
           std::any_of(out.numeric.begin(), out.numeric.end(), [&](const auto& p) { return p.first == n; });
  };
  for (int n = task.smallest_n; n <= kEverySizeUpTo; ++n)
    if (!known(n)) sizes.push_back(n);
  std::vector<long long> around;
  for (long long c : trace_constants(text)) {
    for (long long n : {c - 1, c, c + 1, c + 2, (c + 1) / 2, (c + 1) / 2 + 1}) {
      if (n > kEverySizeUpTo && n <= toy::kMaxN && std::find(around.begin(), around.end(), n) == around.end())
        around.push_back(n);
    }
  }
  std::mt19937_64 rng(mix(seed, 0xC0FFEE));
  std::shuffle(around.begin(), around.end(), rng);  // past the cap, which ones is up to the seed
  if (around.size() > kMaxConstantSizes) around.resize(kMaxConstantSizes);
  for (long long n : around) {
    if (known(n)) continue;
    if (n <= kFullUpTo) sizes.push_back(static_cast<int>(n));
    else out.numeric.emplace_back(static_cast<int>(n), kConstantRuns);
  }
  for (int k = 0, tries = 0; k < kLargeSizes && tries < 1000; ++tries) {
    const int n = kEverySizeUpTo + 1 + static_cast<int>(rng() % static_cast<std::uint64_t>(largest_drawn - kEverySizeUpTo));
    if (known(n)) continue;
    out.numeric.emplace_back(n, kRandomRuns);
    ++k;
  }
  std::sort(sizes.begin() + static_cast<std::ptrdiff_t>(task.ns.size()), sizes.end());
  std::sort(out.numeric.begin(), out.numeric.end());
  return out;
}

// The inputs of random run `k` (1-based) at size n: run 1 is fixed (its numbers appear in the
// feedback, which should read the same each time); the others come from the check's seed.
toy::Inputs run_inputs(const toy::Machine& machine, std::uint64_t seed, int n, int k) {
  return k == 1 ? toy::random_inputs(machine, 1) : toy::random_inputs(machine, mix(seed, static_cast<std::uint64_t>(n), static_cast<std::uint64_t>(k)));
}

// The reference solution's symbolic run on the first input: what a right trace's outputs look
// like, for the messages. Made only when a message needs it (it keeps every state).
class ReferenceRun {
 public:
  ReferenceRun(const Lesson& lesson, const toy::Machine& machine, const toy::Inputs& in)
      : lesson_(lesson), machine_(machine), in_(in) {}
  const toy::Executor& run() {
    if (!ex_) {
      auto ref = toy::assemble(lesson_.trace->solution, machine_, lesson_.id + "/solution.trace");
      if (!ref.ok()) throw std::logic_error("lesson " + lesson_.id + ": the reference solution does not assemble");
      ex_.emplace(ref.program, machine_, in_, toy::Options{true, kCheckCycleCap});
      if (ex_->run()) throw std::logic_error("lesson " + lesson_.id + ": the reference solution faults");
      outputs_ = symbolic_outputs(machine_, ex_->state());
    }
    return *ex_;
  }
  const SymbolicOutputs& outputs() {
    run();
    return outputs_;
  }

 private:
  const Lesson& lesson_;
  const toy::Machine& machine_;
  const toy::Inputs& in_;
  std::optional<toy::Executor> ex_;
  SymbolicOutputs outputs_;
};

// The numeric runs on kRandomRuns random inputs against the independent reference; false (with
// the problems added) when an output is wrong, unwritten or a run faults.
bool numeric_runs_right(const Lesson& lesson, const TraceTask& task, const toy::Program& program,
                        const toy::Machine& machine, const toy::Inputs& in1, int n, std::uint64_t check_seed,
                        const SymbolicOutputs& got_sym, ReferenceRun* want_sym, std::string_view filename,
                        CheckReport& rep, int runs = kRandomRuns, toy::Counters* counters = nullptr) {
  static const SymbolicOutputs none;
  auto want_outputs = [&]() -> const SymbolicOutputs& { return want_sym ? want_sym->outputs() : none; };
  int wrong_cells = 0;
  for (int seed = 1; seed <= runs; ++seed) {
    const toy::Inputs inputs = seed == 1 ? in1 : run_inputs(machine, check_seed, n, seed);
    toy::Executor ex(program, machine, inputs, toy::Options{false, kCheckCycleCap});
    if (auto f = ex.run()) {
      rep.problems.push_back("runtime fault at step " + std::to_string(f->step) + " (" + std::string(filename) +
                             ":" + std::to_string(f->source_line) + ")" + at_n(n) + ": " + f->message);
      return false;
    }
    ++rep.runs;
    if (counters && seed == 1) *counters = ex.state().counters;
    const ExpectedOutputs want = task.reference(inputs, n > 0 ? n : machine.n);
    for (const auto& [array, cells] : want) {
      const int ai = machine.find_array(array);
      if (ai < 0) throw std::logic_error("lesson " + lesson.id + ": no output array " + array);
      const auto& a = machine.arrays[static_cast<std::size_t>(ai)];
      for (std::size_t e = 0; e < cells.size(); ++e) {
        if (!cells[e]) continue;
        const auto& got = ex.state().dram[static_cast<std::size_t>(ai)][e];
        auto expected = [&] { return shown(machine, want_outputs(), array, e); };  // only for a message
        if (!got) {
          if (seed == 1 && wrong_cells < 4) {
            const std::string w_sym = expected();
            rep.problems.push_back(a.element_operand(e) + " was never written" +
                                   (w_sym.empty() ? "" : " (expected " + w_sym + ")") + at_n(n));
          }
          ++wrong_cells;
          continue;
        }
        const double w = *cells[e];
        if (!(std::fabs(got->num - w) <= 1e-9 * std::max(1.0, std::fabs(w)))) {  // NaN is wrong too
          if (wrong_cells < 4) {
            std::string msg = a.element_operand(e) + " is wrong" + at_n(n) + ": expected ";
            const std::string w_sym = expected(), g_sym = shown(machine, got_sym, array, e);
            if (!w_sym.empty()) msg += w_sym + " = ";
            msg += num(w) + ", got ";
            if (!g_sym.empty()) msg += g_sym + " = ";
            msg += num(got->num);
            if (seed != 1)
              msg += " (random input #" + std::to_string(seed) + "; --seed " + std::to_string(check_seed) +
                     " repeats it)";
            rep.problems.push_back(msg);
          }
          ++wrong_cells;
        }
      }
    }
    if (wrong_cells > 0) break;
  }
  if (wrong_cells > 4) rep.problems.push_back("… and " + std::to_string(wrong_cells - 4) + " more wrong outputs");
  return wrong_cells == 0;
}

// Exact lessons: the formula, not just the numbers (the lesson text's tables: c00 = a00·b00 +
// a01·b10). False (with the problems added) when an output's polynomial differs.
bool symbolic_right(const TraceTask& task, const toy::Machine& machine, const toy::Inputs& in1, int n,
                    const SymbolicOutputs& got_sym, ReferenceRun& ref, CheckReport& rep) {
  const SymbolicOutputs& want_sym = ref.outputs();
  bool right = true;
  for (const auto& [array, cells] : task.reference(in1, n > 0 ? n : machine.n)) {
    const auto& g = got_sym.cells.at(array);
    const auto& w = want_sym.cells.at(array);
    for (std::size_t e = 0; e < cells.size(); ++e) {
      if (!cells[e] || !w[e]) continue;
      if (!g[e] || !toy::equivalent(*g[e], *w[e])) {
        rep.problems.push_back(machine.arrays[static_cast<std::size_t>(machine.find_array(array))].element_operand(e) +
                               " has the right numbers but the wrong formula: expected " +
                               shown(machine, want_sym, array, e) + ", got " + shown(machine, got_sym, array, e));
        right = false;
      }
    }
  }
  return right;
}

// Grades the counters of one size against the budget; true when something is over.
bool grade_toy_cost(const TraceTask& task, int n, const toy::Counters& c, bool hidden, CheckReport& rep) {
  const std::size_t before = rep.problems.size();
  grade_cost(rep, "cycles", n, c.cycles, task.target.cycles, hidden);
  grade_cost(rep, "LOADs", n, c.instructions[static_cast<std::size_t>(toy::Opcode::LOAD)], task.target.loads, hidden);
  grade_cost(rep, "DRAM reads", n, c.dram_reads, task.target.reads, hidden);
  grade_cost(rep, "DRAM writes", n, c.dram_writes, task.target.writes, hidden);
  return rep.problems.size() > before;
}

// A runtime fault of the symbolic run, with a note when the trace was written for one size.
std::string fault_message(const toy::Fault& f, std::string_view filename, int n, const std::vector<int>& sizes) {
  std::string msg = "runtime fault at step " + std::to_string(f.step) + " (" + std::string(filename) + ":" +
                    std::to_string(f.source_line) + ")" + at_n(n) + ": " + f.message;
  if (!f.hint.empty()) msg += "\n    hint: " + f.hint;
  // A trace written for one size (say n = 8, unrolled) faults at the other sizes.
  if (sizes.size() > 1 && f.message.find("out of range") != std::string::npos) {
    msg += "\n    note: this lesson is checked at n =";
    for (int sz : sizes) msg += " " + std::to_string(sz);
    msg += ": write the trace once with loops in terms of n (for i in 1..n-1 … end)";
  }
  return msg;
}

void check_toy(const Lesson& lesson, const TraceTask& task, std::string_view text, std::string_view filename,
               const CheckOptions& opt, CheckReport& rep) {
  const CheckSizes checked = checked_sizes(task, text, rep.seed);
  const std::vector<int>& sizes = checked.full;
  rep.sizes = sizes;
  rep.lesson_sizes = task.ns;
  std::vector<std::string> method_problems;
  for (std::size_t si = 0; si < sizes.size(); ++si) {
    const int n = sizes[si];
    const toy::Machine machine = task_machine(task, n > 0 ? n : 8);
    auto as = toy::assemble(text, machine, filename);
    if (!as.ok()) {
      rep.verdict = Verdict::DoesNotAssemble;
      for (const auto& d : as.diagnostics) rep.diagnostics.push_back(toy::format_diagnostic(d));
      if (si > 0) rep.diagnostics.push_back("(the trace assembles at n = " + std::to_string(sizes.front()) +
                                            " but not at n = " + std::to_string(n) + ")\n");
      return;
    }
    rep.verdict = Verdict::Wrong;  // until it has passed every stage
    if (as.program.code.size() > kMaxCheckedSteps) {
      rep.problems.push_back("the trace expands to " + std::to_string(as.program.code.size()) + " instructions" +
                             at_n(n) + "; a lesson check runs at most " + std::to_string(kMaxCheckedSteps) +
                             " — check the loop bounds (they are written in terms of n)");
      return;
    }

    // The symbolic run (first random input) — for the feedback, the method checks and the
    // re-read analysis.
    const toy::Inputs in1 = run_inputs(machine, rep.seed, n, 1);
    toy::Executor sym(as.program, machine, in1, toy::Options{true, kCheckCycleCap});
    sym.run();
    ReferenceRun sym_ref(lesson, machine, in1);
    const SymbolicOutputs got_sym = symbolic_outputs(machine, sym.state());
    if (const auto& f = sym.fault()) {
      rep.problems.push_back(fault_message(*f, filename, n, sizes));
      return;
    }
    if (!numeric_runs_right(lesson, task, as.program, machine, in1, n, rep.seed, got_sym, &sym_ref, filename, rep)) {
      const std::string departs = detail::first_departure(sym, sym_ref.run(), filename);
      if (!departs.empty()) rep.notes.push_back(departs);
      return;
    }
    if (task.symbolic_decides) {
      if (!symbolic_right(task, machine, in1, n, got_sym, sym_ref, rep)) return;
      rep.symbolic = true;
    }
    // Hostile inputs: ±800, all negative, ties, the maximum at each position, 1e9 offsets — the
    // step an ∞, a NaN or a positive exponent first appears is named.
    const bool exp_after_max = has_method(task, "exp-after-max");
    for (const auto& h : detail::hostile_inputs(task.inputs, machine, mix(rep.seed, static_cast<std::uint64_t>(n), 7))) {
      if (auto p = detail::hostile_run(as.program, machine, h, task.reference, exp_after_max, sym.history(), filename)) {
        rep.problems.push_back(*p);
        return;
      }
      ++rep.hostile_runs;
    }
    // Cost: the counters are data-independent (no branches), so the symbolic run's are the cost.
    const toy::Counters& c = sym.state().counters;
    const bool over = grade_toy_cost(task, n, c, opt.hide_budget, rep);
    // The method, at every size: a trace may follow it at the lesson's sizes only.
    if (method_problems.empty()) {
      if (has_method(task, "outer-product")) {
        if (auto p = detail::outer_product_problem(as.program, machine, filename)) method_problems.push_back(*p);
      }
      // "the method: …" → "the method at n=4: …": the size goes with the first line.
      auto located = [n](std::string p) {
        const auto colon = p.find(": ");
        if (n > 0 && colon != std::string::npos && colon < 20) p.insert(colon, at_n(n));
        return p;
      };
      if (auto p = detail::running_state_problem(sym, task.methods, filename)) method_problems.push_back(located(*p));
      if (method_problems.empty() && has_method(task, "carried-state")) {
        if (auto p = detail::carried_state_problem(sym, task.methods, filename)) method_problems.push_back(located(*p));
      }
    }
    if (si == 0) {
      const bool reads_over = over && (!task.target.loads.empty() || !task.target.reads.empty());
      for (const auto& s : needless_loads(sym)) (reads_over ? rep.problems : rep.notes).push_back(s);
      if (reads_over) {
        for (const auto& s : reread_summary(machine, c)) rep.notes.push_back(s);
      }
    }
  }
  // The larger sizes: numbers and cost only (no symbolic run).
  for (const auto& [n, runs] : checked.numeric) {
    const toy::Machine machine = task_machine(task, n);
    const auto as = toy::assemble(text, machine, filename);
    if (!as.ok()) {  // past the machine's instruction cap, say: the trace cannot run there at all
      rep.notes.push_back("not checked at n=" + std::to_string(n) + ": " + as.diagnostics.front().message);
      continue;
    }
    rep.sizes.push_back(n);
    toy::Counters c;
    const toy::Inputs in1 = run_inputs(machine, rep.seed, n, 1);
    if (!numeric_runs_right(lesson, task, as.program, machine, in1, n, rep.seed, {}, nullptr, filename, rep, runs, &c))
      return;
    if (n <= kHostileUpTo) {
      for (const auto& h : detail::hostile_inputs(task.inputs, machine, mix(rep.seed, static_cast<std::uint64_t>(n), 7))) {
        if (auto p = detail::hostile_run(as.program, machine, h, task.reference, has_method(task, "exp-after-max"), {}, filename)) {
          rep.problems.push_back(*p);
          return;
        }
        ++rep.hostile_runs;
      }
    }
    grade_toy_cost(task, n, c, opt.hide_budget, rep);
  }
  if (rep.problems.empty() && !method_problems.empty()) {
    rep.problems = method_problems;
    return;
  }
  rep.verdict = rep.problems.empty() ? Verdict::Passed : Verdict::OverBudget;
}

std::string tile_list(const std::vector<long long>& tiles) {
  std::string s;
  for (long long t : tiles) s += (s.empty() ? "" : ", ") + std::to_string(t);
  return "{" + s + "}";
}

// The first step of a wrong tile trace that departs from every correct run: a correct run never
// makes an O[i] in HBM lose a merged KV tile, and its last STORE of O[i] holds all n of them.
std::string tile_departure(const tile::TileProgram& prog, const tile::TileShape& shape, const tile::TileInputs& in,
                           const tile::TileRun& full, std::string_view filename) {
  auto where = [&](std::size_t pc) {
    const auto& ins = prog.code[pc];
    return "step " + std::to_string(pc + 1) + " (" + std::string(filename) + ":" + std::to_string(ins.source_line) +
           ") `" + ins.text + "`";
  };
  std::vector<std::vector<long long>> before(static_cast<std::size_t>(shape.n));
  for (std::size_t k = 0; k < prog.code.size(); ++k) {
    if (prog.code[k].op != tile::TileOp::STORE) continue;  // only a STORE changes O in HBM
    tile::TileProgram prefix;
    prefix.code.assign(prog.code.begin(), prog.code.begin() + static_cast<std::ptrdiff_t>(k + 1));
    const auto run = tile::run_tiles(prefix, shape, in.q, in.k, in.v);
    for (std::size_t i = 0; i < before.size(); ++i) {
      const auto& now = run.merged[i];
      if (std::includes(now.begin(), now.end(), before[i].begin(), before[i].end())) continue;
      return where(k) + " is the first step that departs from a correct run: O[" + std::to_string(i) +
             "] in HBM had KV tiles " + tile_list(before[i]) + " and now has " + tile_list(now) +
             " — it stores a state loaded before the last update";
    }
    before = run.merged;
  }
  for (std::size_t i = 0; i < full.merged.size(); ++i) {
    if (static_cast<int>(full.merged[i].size()) == shape.n) continue;
    for (std::size_t k = prog.code.size(); k-- > 0;) {
      const auto& ins = prog.code[k];
      if (ins.op == tile::TileOp::STORE && ins.index == static_cast<long long>(i))
        return where(k) + " is the last store of O[" + std::to_string(i) + "]: it holds KV tiles " +
               tile_list(full.merged[i]) + " of 0.." + std::to_string(shape.n - 1);
    }
    return "O[" + std::to_string(i) + "] is never stored: a correct run stores every query tile's state";
  }
  return "";
}

void check_tile(const TraceTask& task, std::string_view text, std::string_view filename, CheckReport& rep) {
  // The tile model has no symbolic run: its larger sizes are checked in full (n² block updates a
  // run, so they are drawn up to kTileLargestDrawn), with fewer runs around a large constant.
  const CheckSizes checked = checked_sizes(task, text, rep.seed, kTileLargestDrawn);
  std::vector<int> sizes = checked.full;
  std::map<int, int> runs_at;
  for (const auto& [n, runs] : checked.numeric) {
    if (n > kTileLargestN) continue;
    sizes.push_back(n);
    runs_at[n] = runs;
  }
  rep.sizes = sizes;
  rep.lesson_sizes = task.ns;
  for (std::size_t si = 0; si < sizes.size(); ++si) {
    const int n = sizes[si];
    const tile::TileShape shape = tile::lesson_shape(n);
    const auto prog = tile::assemble_tiles(text, shape, filename);
    if (!prog.ok()) {
      rep.verdict = Verdict::DoesNotAssemble;
      for (const auto& d : prog.diagnostics) rep.diagnostics.push_back(toy::format_diagnostic(d));
      return;
    }
    const int runs = runs_at.count(n) ? runs_at.at(n) : kRandomRuns;
    for (int seed = 1; seed <= runs; ++seed) {
      const auto in = tile::random_tile_inputs(
          shape, seed == 1 ? 1 : mix(rep.seed, static_cast<std::uint64_t>(n), static_cast<std::uint64_t>(seed)));
      const auto run = tile::run_tiles(prog, shape, in.q, in.k, in.v);
      if (run.fault) {
        rep.problems.push_back("runtime fault" + at_n(n) + ": " + *run.fault +
                               (run.fault_hint.empty() ? "" : "\n    hint: " + run.fault_hint));
        rep.verdict = Verdict::Wrong;
        return;
      }
      ++rep.runs;
      int bad = 0;
      for (int i = 0; i < n; ++i) {
        if (static_cast<int>(run.merged[i].size()) == n) continue;
        std::string missing;
        for (long long j = 0; j < n; ++j) {
          if (!std::binary_search(run.merged[i].begin(), run.merged[i].end(), j))
            missing += (missing.empty() ? "" : ", ") + std::to_string(j);
        }
        if (bad++ < 4) {
          rep.problems.push_back("O[" + std::to_string(i) + "] is wrong" + at_n(n) + ": the state stored in HBM " +
                                 (run.merged[i].empty() ? std::string("was never updated")
                                                        : "is missing KV tiles " + missing));
        }
      }
      if (bad > 0) {
        const std::string departs = tile_departure(prog, shape, in, run, filename);
        if (!departs.empty()) rep.notes.push_back(departs);
        rep.verdict = Verdict::Wrong;
        return;
      }
      const auto want = tile::naive_attention(in.q, in.k, in.v, n * shape.rows, shape.d);
      for (std::size_t e = 0; e < want.size(); ++e) {
        if (!(std::fabs(run.out[e] - want[e]) <= 1e-9 * std::max(1.0, std::fabs(want[e])))) {  // NaN is wrong
          rep.problems.push_back("O row " + std::to_string(e / shape.d) + " differs from softmax(QKᵀ)V" + at_n(n) +
                                 ": expected " + num(want[e]) + ", got " + num(run.out[e]));
          rep.verdict = Verdict::Wrong;
          return;
        }
      }
      if (seed == 1) {
        for (const auto& [metric, formula] : task.tile_targets) {
          const char tensor = metric[0];
          const bool load = metric.find("load") != std::string::npos;
          const auto& m = load ? run.counters.loads : run.counters.stores;
          const auto it = m.find(tensor);
          grade_cost(rep, metric + "s", n, it == m.end() ? 0 : it->second, formula, false);
        }
      }
    }
  }
  rep.verdict = rep.problems.empty() ? Verdict::Passed : Verdict::OverBudget;
}

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(std::string_view s) {
  std::size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return std::string(s.substr(a, b - a));
}

// A wrong number says which way it is off, coarsely — never the answer itself.
std::string how_far(double got, const std::string& expected) {
  const double want = evaluate_formula(expected, {});
  const std::string dir = got < want ? "too small" : "too large";
  const double ratio = want != 0 && got != 0 ? std::max(got / want, want / got) : 0;
  if (ratio > 0 && ratio <= 1.1) return toy::format_number(got) + " is a little " + dir + " (within 10%)";
  if (ratio > 0 && ratio <= 2) return toy::format_number(got) + " is " + dir + " (within a factor of 2)";
  return toy::format_number(got) + " is " + dir + " (by more than a factor of 2)";
}

// The byte units the program prints (GB, MiB, …) and a few spellings of "bytes".
std::optional<double> unit_factor(const std::string& unit) {
  static const std::map<std::string, double> units = {
      {"B", 1},         {"byte", 1},      {"bytes", 1},     {"kB", 1e3},        {"KB", 1e3},
      {"MB", 1e6},      {"GB", 1e9},      {"TB", 1e12},     {"KiB", 1024.0},    {"MiB", 1048576.0},
      {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
  const auto it = units.find(unit);
  if (it != units.end()) return it->second;
  return std::nullopt;
}

// A number answer as written: its value and, when it is a plain literal (3, 0.5, 4.362e9,
// 4.362 GB), the precision it was written to.
struct WrittenNumber {
  double value = 0;
  bool literal = false;  // a single literal, so "rounded to the digits given" means something
  int significant = 0;   // literal: significant digits written
  double half_ulp = 0;   // literal: half a unit of its last written digit, in the answer's unit
};

// Parses a number answer; a malformed one sets `error`/`hint` and returns nothing. A unit is
// allowed only where the answer is a byte count.
std::optional<WrittenNumber> written_number(const Question& q, std::string text, std::string& error,
                                            std::string& hint) {
  text = trim(text);
  // A trailing unit word: "4.362 GB", "2^30 B".
  double factor = 1;
  std::size_t end = text.size();
  while (end > 0 && std::isalpha(static_cast<unsigned char>(text[end - 1]))) --end;
  if (end < text.size() && end > 0 && (text[end - 1] == ' ' || std::isdigit(static_cast<unsigned char>(text[end - 1])) ||
                                       text[end - 1] == ')')) {
    const std::string unit = text.substr(end);
    const bool exponent = (unit == "e" || unit == "E");
    if (!exponent) {
      const auto f = unit_factor(unit);
      if (!f) {
        if (q.bytes) {
          error = "unknown unit '" + unit + "'";
          hint = "write bytes as a number, or with B, kB, MB, GB, KiB, MiB or GiB (e.g. 4.362 GB)";
          return std::nullopt;
        }
      } else if (!q.bytes) {
        error = "'" + q.key + "' is a count, not a number of bytes: leave out the unit '" + unit + "'";
        hint = "this answer is a plain number, e.g. " + q.key + "=3";
        return std::nullopt;
      } else {
        factor = *f;
        text = trim(text.substr(0, end));
      }
    }
  }
  WrittenNumber w;
  try {
    w.value = evaluate_formula(text, {}) * factor;
  } catch (const FormulaError& e) {
    error = "answer '" + q.key + "' = \"" + text + "\": " + e.what() +
            (e.column() > 0 ? " (column " + std::to_string(e.column()) + ")" : "");
    hint = e.hint() + "; this answer is a number";
    return std::nullopt;
  }
  // A single literal: [sign] digits [. digits] [e [sign] digits].
  std::size_t i = 0;
  if (i < text.size() && (text[i] == '+' || text[i] == '-')) ++i;
  std::string digits;
  int decimals = 0;
  bool point = false;
  for (; i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || (text[i] == '.' && !point)); ++i) {
    if (text[i] == '.') {
      point = true;
      continue;
    }
    digits += text[i];
    if (point) ++decimals;
  }
  long exponent = 0;
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    char* stop = nullptr;
    exponent = std::strtol(text.c_str() + i + 1, &stop, 10);
    i = static_cast<std::size_t>(stop - text.c_str());
  }
  if (i == text.size() && !digits.empty() && std::abs(exponent) < 300) {
    w.literal = true;
    const auto first = digits.find_first_not_of('0');
    w.significant = first == std::string::npos ? 1 : static_cast<int>(digits.size() - first);
    w.half_ulp = 0.5 * std::pow(10.0, static_cast<double>(exponent - decimals)) * factor;
  }
  return w;
}

}  // namespace

toy::Machine task_machine(const TraceTask& t, int n) {
  if (t.model != TraceModel::Toy) throw std::invalid_argument("the tile model has no toy machine");
  if (!t.machine_file.empty()) return toy::parse_machine_file(t.machine_file, t.machine + ".machine", n);
  return toy::builtin_machine(t.machine, n);
}

std::string loop_order_table(int n) {
  const tile::TileShape shape = tile::lesson_shape(n);
  const auto in = tile::random_tile_inputs(shape, 1);
  tile::TileCounters c[2];
  const char* ids[2] = {"fa2-order", "fa1-order"};
  for (int k = 0; k < 2; ++k) {
    const Lesson* l = find_lesson(ids[k]);
    if (!l || !l->trace) throw std::logic_error(std::string("lesson ") + ids[k] + " is missing");
    const auto prog = tile::assemble_tiles(l->trace->solution, shape, "solution.trace");
    const auto run = tile::run_tiles(prog, shape, in.q, in.k, in.v);
    if (!prog.ok() || run.fault) throw std::logic_error(std::string("lesson ") + ids[k] + ": reference trace fails");
    c[k] = run.counters;
  }
  auto get = [](const std::map<char, std::uint64_t>& m, char t) {
    auto it = m.find(t);
    return it == m.end() ? std::uint64_t{0} : it->second;
  };
  // KV counts a (K_j, V_j) pair once, as the lesson text's table does.
  struct Row {
    const char* name;
    std::uint64_t inner, outer;
    const char* f_inner;
    const char* f_outer;
  } rows[] = {
      {"Q loads", get(c[0].loads, 'Q'), get(c[1].loads, 'Q'), "n", "n²"},
      {"KV loads", get(c[0].loads, 'K'), get(c[1].loads, 'K'), "n²", "n"},
      {"O loads", get(c[0].loads, 'O'), get(c[1].loads, 'O'), "n", "n²"},
      {"O stores", get(c[0].stores, 'O'), get(c[1].stores, 'O'), "n", "n²"},
  };
  std::ostringstream os;
  os << "The lesson text's cost comparison, measured on the tile model at n = " << n << " (in tiles):\n";
  os << "              inner product (FA2)   outer product (FA1)\n";
  os << "  outer loop  over queries          over KV\n";
  for (const auto& r : rows) {
    std::ostringstream a, b;
    a << r.inner << " (" << r.f_inner << ")";
    b << r.outer << " (" << r.f_outer << ")";
    std::string as = a.str(), bs = b.str();
    os << "  " << r.name << std::string(12 - std::string(r.name).size(), ' ') << as
       << std::string(as.size() < 22 ? 22 - toy::display_width(as) : 1, ' ') << bs << "\n";
  }
  return os.str();
}

int CheckReport::exit_code() const {
  switch (verdict) {
    case Verdict::Passed: return 0;
    case Verdict::DoesNotAssemble: return 2;
    default: return 1;
  }
}

namespace {

// "1…24, 31, 57, 90": runs of consecutive sizes shortened.
std::string size_list(std::vector<int> sizes) {
  std::sort(sizes.begin(), sizes.end());
  std::string s;
  for (std::size_t i = 0; i < sizes.size();) {
    std::size_t j = i;
    while (j + 1 < sizes.size() && sizes[j + 1] == sizes[j] + 1) ++j;
    s += (s.empty() ? "" : ", ") + std::to_string(sizes[i]);
    if (j > i + 1) s += "…" + std::to_string(sizes[j]);
    else if (j == i + 1) s += ", " + std::to_string(sizes[j]);
    i = j + 1;
  }
  return s;
}

}  // namespace

std::string CheckReport::to_text() const {
  std::ostringstream os;
  for (const auto& d : diagnostics) os << d;
  for (const auto& p : problems) os << "  ✗ " << p << "\n";
  for (const auto& nt : notes) os << "  · " << nt << "\n";
  if (!costs.empty()) {
    // The lesson's own sizes, and any size where the trace is over; the rest in one line.
    os << "cost:\n";
    std::vector<int> quiet;
    for (const auto& c : costs) {
      const bool own = c.n == 0 || std::find(lesson_sizes.begin(), lesson_sizes.end(), c.n) != lesson_sizes.end();
      if (!own && c.within()) {
        if (std::find(quiet.begin(), quiet.end(), c.n) == quiet.end()) quiet.push_back(c.n);
        continue;
      }
      std::string metric = c.metric + (c.n > 0 ? " (n=" + std::to_string(c.n) + ")" : "");
      os << "  " << metric << std::string(metric.size() < 24 ? 24 - metric.size() : 1, ' ') << c.measured;
      if (budget_hidden) {
        os << (c.within() ? "   within the budget" : "   OVER the budget") << "\n";
        continue;
      }
      os << "   target " << c.formula;
      if (c.formula.find('n') != std::string::npos) os << " = " << c.target;
      os << (c.within() ? "   ok" : "   OVER") << "\n";
    }
    if (!quiet.empty()) os << "  (within the " << (budget_hidden ? "budget" : "target") << " at n = " << size_list(quiet) << " too)\n";
  }
  switch (verdict) {
    case Verdict::Passed:
      os << "PASSED: correct on " << runs << " random inputs" << (symbolic ? " and symbolically" : "");
      if (hostile_runs > 0) os << ", and on " << hostile_runs << " hostile inputs (±800, ties, large offsets)";
      if (sizes.size() > 1) os << " at n = " << size_list(sizes) << " (--seed " << seed << " repeats this check)";
      break;
    case Verdict::OverBudget: os << "OVER BUDGET: correct on " << runs << " random inputs, but over the target"; break;
    case Verdict::Wrong: os << "WRONG"; break;
    case Verdict::DoesNotAssemble: os << "DOES NOT ASSEMBLE: fix the errors above and check again"; break;
  }
  os << "\n";
  return os.str();
}

CheckReport check_trace(const Lesson& lesson, std::string_view text, std::string_view filename,
                        const CheckOptions& options) {
  if (!lesson.trace) throw std::invalid_argument("lesson " + lesson.id + " has no trace to check");
  CheckReport rep;
  rep.budget_hidden = options.hide_budget;
  // The seed of the large sizes and of every random input but the first: fresh for every check
  // unless given, so a trace cannot be written for the sizes a check will try.
  rep.seed = options.seed ? *options.seed : (static_cast<std::uint64_t>(std::random_device{}()) << 32 | std::random_device{}());
  if (lesson.trace->model == TraceModel::Tile) {
    check_tile(*lesson.trace, text, filename, rep);
  } else {
    check_toy(lesson, *lesson.trace, text, filename, options, rep);
  }
  // Beating the budget is worth a word only for a trace that passed: a wrong trace is never
  // praised, whatever it costs.
  if (rep.verdict == Verdict::Passed && !rep.budget_hidden) {
    for (const auto& c : rep.costs) {
      if (c.measured >= c.target) continue;
      const bool constant = c.formula.find('n') == std::string::npos;
      rep.notes.push_back(c.metric + at_n(c.n) + ": " + std::to_string(c.measured) + " beats the target " + c.formula +
                          (constant ? "" : " = " + std::to_string(c.target)) +
                          " — nice; tell us how");
      break;
    }
  }
  return rep;
}

int AnswerReport::exit_code() const {
  if (!error.empty()) return 2;
  return all_correct ? 0 : 1;
}

std::string AnswerReport::to_text() const {
  std::ostringstream os;
  if (!error.empty()) {
    os << "error: " << error << "\n";
    if (!hint.empty()) os << "hint: " << hint << "\n";
    return os.str();
  }
  for (const auto& l : lines) os << "  " << (l.correct ? "✓ " : "✗ ") << l.key << ": " << l.message << "\n";
  os << (all_correct ? "PASSED: every answer is right\n" : "NOT YET: see the answers marked ✗\n");
  return os.str();
}

namespace {

// The answer text split into one part per answer. A lesson with one keyword/choice question
// takes the whole text; otherwise `;` and `,` separate (not inside parentheses: max(ma, mb)),
// and so does a known `key=` after a blank (`lesson answer 4 reads=3n writes=n`).
std::vector<std::string> split_answers(const Lesson& lesson, std::string_view text, bool single_free) {
  if (single_free) return {std::string(text)};
  std::string joined(text);
  for (const auto& q : lesson.questions) {
    for (std::size_t at = joined.find(" " + q.key + "="); at != std::string::npos;
         at = joined.find(" " + q.key + "=", at + 2)) {
      joined[at] = ';';
    }
  }
  // The question a part starting at `at` answers, if it names one ("why=…").
  auto keyed = [&](std::size_t at) -> const Question* {
    while (at < joined.size() && std::isspace(static_cast<unsigned char>(joined[at]))) ++at;
    for (const auto& q : lesson.questions) {
      std::size_t e = at + q.key.size();
      if (joined.compare(at, q.key.size(), q.key) != 0) continue;
      while (e < joined.size() && joined[e] == ' ') ++e;
      if (e < joined.size() && joined[e] == '=') return &q;
    }
    return nullptr;
  };
  std::vector<std::string> parts;
  std::string cur;
  int depth = 0;
  bool free_text = false;  // a claim runs on, commas and all, to the next "key=" or the end
  auto start_part = [&](std::size_t at) {
    const Question* q = keyed(at);
    if (!q && parts.size() < lesson.questions.size()) q = &lesson.questions[parts.size()];
    free_text = q && q->kind == AnswerKind::Claim;
  };
  start_part(0);
  for (std::size_t i = 0; i < joined.size(); ++i) {
    const char c = joined[i];
    depth += c == '(' ? 1 : c == ')' && depth > 0 ? -1 : 0;
    const bool separator = (c == ';' || c == ',') && (free_text ? keyed(i + 1) != nullptr : depth == 0);
    if (separator) {
      parts.push_back(cur);
      cur.clear();
      depth = 0;
      start_part(i + 1);
    } else {
      cur += c;
    }
  }
  parts.push_back(cur);
  parts.erase(std::remove_if(parts.begin(), parts.end(), [](const std::string& p) { return trim(p).empty(); }),
              parts.end());
  return parts;
}

// Grades one answer `v` to `q` into `line`; a malformed answer sets rep.error/hint and returns false.
bool grade_answer(const Lesson& lesson, const Question& q, const std::string& v, AnswerLine& line, AnswerReport& rep) {
  switch (q.kind) {
    case AnswerKind::Formula: {
      try {
        const auto m = compare_on_domain(v, q.expected, q.ranges, std::random_device{}());
        line.correct = m.equal;
        line.message = m.equal ? "correct — " + q.why : "wrong (" + q.prompt + "): " + m.counterexample;
      } catch (const FormulaError& e) {
        rep.error = "answer '" + q.key + "' = \"" + v + "\": " + e.what() +
                    (e.column() > 0 ? " (column " + std::to_string(e.column()) + ")" : "");
        rep.hint = e.hint() + "; e.g. " + q.key + "=3n";
        return false;
      }
      return true;
    }
    case AnswerKind::Number: {
      const auto w = written_number(q, v, rep.error, rep.hint);
      if (!w) return false;
      const double want = evaluate_formula(q.expected, {});
      const double diff = std::fabs(w->value - want);
      // Exact, or the exact value rounded to the digits written (the program's own tables print
      // 4.362 GB and its messages 1.50995e+08): at least four significant digits for that.
      const bool exact = diff <= 1e-9 * std::max(1.0, std::fabs(want));
      const bool rounds = w->literal && diff <= w->half_ulp * (1 + 1e-12);
      line.correct = exact || (rounds && w->significant >= 4);
      if (exact) line.message = "correct — " + q.why;
      else if (line.correct)
        line.message = "correct (to the " + std::to_string(w->significant) + " significant digits given) — " + q.why;
      else if (rounds)
        line.message = "wrong (" + q.prompt + "): " + std::to_string(w->significant) +
                       " significant digits cannot tell the right value from its neighbours — give at least 4, "
                       "or the exact value";
      else
        line.message = "wrong (" + q.prompt + "): " + how_far(w->value, q.expected);
      return true;
    }
    case AnswerKind::Choice: {
      std::string c = lower(trim(v));
      c.erase(std::remove_if(c.begin(), c.end(), [](char ch) { return ch == '(' || ch == ')' || ch == '.'; }), c.end());
      if (c.size() != 1 || c[0] < 'a' || c[0] > 'z') {
        rep.error = "\"" + v + "\" is not one letter";
        rep.hint = "answer a multiple choice with its letter, e.g. a";
        return false;
      }
      line.correct = c == q.expected;
      line.message = line.correct ? "correct — " + q.why : "wrong: (" + c + ") is not it — reread the options";
      return true;
    }
    case AnswerKind::Claim: {
      const detail::ClaimVerdict w =
          detail::judge_claim(v, detail::ClaimSpec{q.accepted, q.rejected, q.contrary, q.about, q.not_about});
      line.correct = w.correct;
      line.message = w.correct ? "correct — " + q.why : w.why + " — try `lesson hint " + lesson.id + "`";
      return true;
    }
  }
  return true;
}

}  // namespace

AnswerReport check_answer(const Lesson& lesson, std::string_view text) {
  if (lesson.questions.empty()) throw std::invalid_argument("lesson " + lesson.id + " has no questions");
  AnswerReport rep;
  std::string keys, f;
  for (const auto& q : lesson.questions) {
    keys += (keys.empty() ? "" : ", ") + q.key;
    f += (f.empty() ? "" : "; ") + q.key + "=…";
  }
  const std::string form = "answer as \"" + f + "\" (names: " + keys + ")";
  const bool single_free = lesson.questions.size() == 1 && lesson.questions[0].kind != AnswerKind::Formula &&
                           lesson.questions[0].kind != AnswerKind::Number;
  const std::vector<std::string> parts = split_answers(lesson, text, single_free);
  auto malformed = [&](std::string error, std::string hint) {
    rep.error = std::move(error);
    rep.hint = std::move(hint);
    return rep;
  };
  if (parts.empty()) return malformed("empty answer", form);
  std::map<std::string, std::string> given;
  std::size_t next = 0;
  for (const auto& raw : parts) {
    const std::string p = trim(raw);
    const auto eq = p.find('=');
    std::string key, value = p;
    if (eq != std::string::npos && !single_free) {
      key = lower(trim(p.substr(0, eq)));
      value = trim(p.substr(eq + 1));
      const bool known = std::any_of(lesson.questions.begin(), lesson.questions.end(),
                                     [&](const Question& q) { return q.key == key; });
      if (!known) return malformed("unknown answer name '" + key + "'", "lesson " + lesson.id + " asks for: " + keys + "; " + form);
    } else {
      if (next >= lesson.questions.size())
        return malformed("more answers than questions (" + std::to_string(lesson.questions.size()) + ")", form);
      key = lesson.questions[next].key;
    }
    ++next;
    if (given.count(key)) return malformed("'" + key + "' is answered twice", form);
    given[key] = value;
  }
  rep.all_correct = true;
  for (const auto& q : lesson.questions) {
    AnswerLine line;
    line.key = q.key;
    auto it = given.find(q.key);
    if (it == given.end()) {
      line.message = "not answered (" + q.prompt + ")";
    } else if (!grade_answer(lesson, q, it->second, line, rep)) {
      rep.lines.clear();
      rep.all_correct = false;
      return rep;
    }
    rep.all_correct = rep.all_correct && line.correct;
    rep.lines.push_back(line);
  }
  return rep;
}

}  // namespace flashlab::lessons
