/// @file checker.hpp
/// @brief Grades a submitted trace or answer against a lesson: runs the trace on several random
/// and hostile inputs and once symbolically, compares every graded output with an independent
/// reference, checks the lesson's method, then grades the cost against the lesson's budget, and
/// says exactly what is wrong and at which step.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "flashlab/lessons/lesson.hpp"
#include "flashlab/toymachine/machine.hpp"

namespace flashlab::lessons {

/// The outcome of `lesson check`, ordered from best to worst.
enum class Verdict {
  Passed,          ///< correct on every input and within every target
  OverBudget,      ///< correct, but over at least one cost target
  Wrong,           ///< runs but an output is wrong or missing, or a runtime fault stopped it
  DoesNotAssemble  ///< the trace has assembler errors (diagnostics filled)
};

/// One graded cost: what was measured against its target at one `n`.
struct CostLine {
  std::string metric;     ///< "cycles", "LOADs", "DRAM reads", "DRAM writes", "Q load", …
  int n = 0;              ///< the size it was measured at (0 when the machine has no n)
  std::uint64_t measured = 0;  ///< the measured count
  std::string formula;    ///< the target formula, e.g. "3n"
  std::uint64_t target = 0;    ///< the formula's value at n
  /// True when measured ≤ target.
  [[nodiscard]] bool within() const { return measured <= target; }
};

/// What `check_trace` found.
struct CheckReport {
  Verdict verdict = Verdict::Wrong;      ///< the outcome
  std::vector<std::string> diagnostics;  ///< DoesNotAssemble: formatted assembler errors
  std::vector<std::string> problems;     ///< each thing that is wrong, one sentence (+ detail) each
  std::vector<std::string> notes;        ///< helpful observations (re-reads, beating the target)
  std::vector<CostLine> costs;           ///< every graded cost
  int runs = 0;                          ///< numeric runs done (random inputs × sizes)
  int hostile_runs = 0;                  ///< runs on hostile inputs (±800, ties, 1e9 offsets) that passed
  std::vector<int> sizes;                ///< the sizes n it was checked at (see check_trace())
  std::vector<int> lesson_sizes;         ///< the lesson's own sizes (their costs are always printed)
  std::uint64_t seed = 0;                ///< the seed of the large sizes and random inputs (CheckOptions::seed)
  bool budget_hidden = false;            ///< the budget is a quiz answer: cost lines say over/within only
  bool symbolic = false;                 ///< the outputs were also compared symbolically (and matched)
  /// Process exit code for `lesson check`: 0 passed, 1 wrong or over budget, 2 does not assemble.
  [[nodiscard]] int exit_code() const;
  /// The whole report as text, as `lesson check` prints it.
  [[nodiscard]] std::string to_text() const;
};

/// Number of random inputs each size is checked on (at least five).
inline constexpr int kRandomRuns = 5;

/// How a check reports.
struct CheckOptions {
  /// Say whether the cost is within the budget but not the budget itself (it is the answer to
  /// a question of the lesson that the student has not answered yet).
  bool hide_budget = false;
  /// The seed of the check: the large sizes and every random input but the first are drawn from
  /// it. Unset: drawn fresh for every check (the report states it, so a check can be repeated).
  std::optional<std::uint64_t> seed;
};

/// Grades `text` (a trace, file name `filename` for diagnostics) against `lesson`'s trace task.
/// Sizes: the lesson's own, every n from the smallest it allows up to 24, the sizes around each
/// constant of the trace's loops and indices (where its behaviour can change), and three sizes
/// from 25 to 128 drawn from the check's seed (never from the trace). At each: random inputs (the
/// first fixed, the rest from the seed) against an independent reference; for the numeric lessons
/// hostile inputs (an ∞, a NaN or a positive exponent is wrong, named by its step); the lesson's
/// method (the outer product's order and operand registers, the running state after each element,
/// the state carried from element to element); then its cost. A trace that beats its budget is
/// mentioned only when it passed.
/// @throws std::invalid_argument when the lesson has no trace exercise.
CheckReport check_trace(const Lesson& lesson, std::string_view text, std::string_view filename,
                        const CheckOptions& options = {});

/// The toy machine of a trace task at size `n`: the built-in profile, or the lesson's embedded
/// machine file. @throws std::invalid_argument for a tile-model task; toy::MachineError for bad n.
toy::Machine task_machine(const TraceTask& task, int n);

/// The lesson text's cost-comparison table ("Inner Product vs. Outer Product in Attention"), measured:
/// runs the reference traces of `fa2-order` and `fa1-order` on the tile model at size `n` and
/// prints Q, KV and O loads and stores of both orders beside the lesson text's formulas.
std::string loop_order_table(int n);

/// One graded answer to one question.
struct AnswerLine {
  std::string key;        ///< the question's key
  bool correct = false;   ///< whether it matched
  std::string message;    ///< feedback: "correct: …" or what is wrong ("at n=5: expected 15, got 10")
};

/// What `check_answer` found.
struct AnswerReport {
  std::vector<AnswerLine> lines;  ///< one per question answered
  bool all_correct = false;       ///< every question of the lesson answered correctly
  std::string error;              ///< a malformed answer (unparseable formula, unknown key) — exit 2
  std::string hint;               ///< how to write it instead
  /// 0 all correct, 1 something wrong or missing, 2 malformed.
  [[nodiscard]] int exit_code() const;
  /// The report as text.
  [[nodiscard]] std::string to_text() const;
};

/// Grades `text` against the lesson's questions. Several answers are separated by `;` or `,`
/// and given in the order of the questions, or as `key=value` (e.g. `reads=3n; writes=n`).
/// @throws std::invalid_argument when the lesson has no questions.
AnswerReport check_answer(const Lesson& lesson, std::string_view text);

}  // namespace flashlab::lessons
