/// @file lesson.hpp
/// @brief The lesson catalogue: every problem and quiz of the toy-machine lesson, and the traffic
/// chapter, as data. Each lesson is a folder lessons/data/ID/ — lesson.txt (title, machine,
/// sizes, budget, method checks, questions), statement.md, hints.md, discussion.md, starter and
/// solution traces — and lessons/data/catalogue.txt lists them in order. The folder is embedded
/// into the binary at build time, so `flashlab lesson …` works from any directory. Only what
/// must be code stays code: the independent references the traces are checked against.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace flashlab::lessons {

/// Cost targets of a trace exercise, each a formula in `n` (see formula.hpp); empty = no target.
struct CostTarget {
  std::string cycles;  ///< total cycles
  std::string loads;   ///< LOAD instructions (= DRAM reads on the toy machine)
  std::string reads;   ///< DRAM reads (elements)
  std::string writes;  ///< DRAM writes (elements)
};

/// Expected outputs for given inputs: array name → one entry per element; nullopt = not graded
/// (Problem 1 only asks for c[0][0]).
using ExpectedOutputs = std::map<std::string, std::vector<std::optional<double>>>;

/// Input values: array name → row-major elements (same shape as toy::Inputs).
using InputValues = std::map<std::string, std::vector<double>>;

/// An independent reference: the outputs a correct trace must produce from `inputs` at size `n`.
/// Written in plain C++ (not as a trace), so a wrong reference trace cannot agree with itself.
using ReferenceFn = std::function<ExpectedOutputs(const InputValues& inputs, int n)>;

/// Which simulator grades the trace.
enum class TraceModel {
  Toy,  ///< the scalar toy machine (toymachine/): registers hold numbers
  Tile  ///< the tile model (tile.hpp): a register holds a tile, LOAD moves a tile
};

/// The hostile inputs a numeric lesson is also checked on (adversarial.hpp builds them).
enum class InputFamily {
  None,       ///< the random inputs only (the matmul lessons: exact, checked symbolically)
  Softmax,    ///< x near ±800, all negative, all equal, a spread of ±800 around the maximum
  Mean,       ///< x near 1e9 (cancellation), all equal, all negative, ±800
  Attention   ///< scores near ±800, all equal, keys that move the maximum late
};

/// A trace exercise: write a trace for a machine; it is run and its cost graded.
struct TraceTask {
  TraceModel model = TraceModel::Toy;  ///< which simulator runs it
  std::string machine;                 ///< built-in toy profile name, or the name of the embedded machine file
  std::string machine_file;            ///< embedded machine-file text (empty: `machine` is a built-in profile)
  std::vector<int> ns;                 ///< the sizes `n` the trace is checked at (first one is shown)
  int smallest_n = 1;                  ///< the smallest n the lesson is defined for (adversarial sizes start here)
  CostTarget target;                   ///< the budget
  std::string target_text;             ///< the budget in words, e.g. "25 cycles, 13 LOADs"
  /// The budget as a hint while the lesson's questions are unanswered (the exact budget is a
  /// quiz answer then); empty: the budget is shown from the start.
  std::string hidden_target_text;
  bool symbolic_decides = false;       ///< outputs must also be symbolically equivalent (exact polynomials)
  InputFamily inputs = InputFamily::None;  ///< the hostile inputs it is also run on
  /// Method checks (checker.cpp): "outer-product", "exp-after-max", "running-max",
  /// "running-sum", "running-mean", "running-m2", "running-score-max", "running-denominator".
  std::vector<std::string> methods;
  ReferenceFn reference;               ///< the expected outputs
  std::string starter;                 ///< starter trace (embedded file text)
  std::string solution;                ///< reference solution (embedded file text)
  /// Tile model only: per-tensor transfer targets, e.g. {"Q load", "n"}, {"O store", "n^2"}.
  std::vector<std::pair<std::string, std::string>> tile_targets;
};

/// How an answer to a question is compared.
enum class AnswerKind {
  Formula,  ///< a formula in the question's variables, compared by value at random points
  Number,   ///< a number (a formula without variables), compared by value
  Choice,   ///< one letter of a multiple choice, case-insensitive
  Claim     ///< free text, judged by the claim it makes (claim.hpp): negated, contrary and
            ///< misdirected claims and distractors are refused
};

/// The domain of a formula variable: where an answer must agree with the expected formula.
struct VariableRange {
  std::string name;    ///< the variable, e.g. "n" or "ma"
  double lo = 1;       ///< smallest value
  double hi = 1e6;     ///< largest value (whole numbers: every value from lo to hi is tried)
  bool real = false;   ///< real numbers (true) or whole numbers (false)
};

/// One question with a checked answer.
struct Question {
  std::string key;                   ///< short name used in `name=value` answers, e.g. "reads"
  std::string prompt;                ///< the question
  AnswerKind kind = AnswerKind::Number;  ///< how the answer is compared
  std::string expected;              ///< the expected formula / number / letter / model phrase
  std::vector<std::string> vars;     ///< Formula: the variable names it may use, e.g. {"n"}
  std::vector<VariableRange> ranges; ///< Formula: where each variable is sampled (one per name in vars)
  std::vector<std::string> accepted; ///< Claim: phrases that state the expected claim (whole words, lower case)
  std::vector<std::string> rejected; ///< Claim: distractors; an answer asserting one is wrong
  std::vector<std::string> contrary; ///< Claim: phrases that state the opposite claim ("misses" for "hits")
  std::vector<std::string> about;    ///< Claim: what the claim is about ("l2", "v"); named next to it: fine
  std::vector<std::string> not_about;  ///< Claim: wrong quantities; named as what the claim is about: wrong
  bool bytes = false;                ///< Number: a byte count, which may carry a unit (4.362 GB, 58.1 MiB)
  std::string why;                   ///< one line shown after a correct answer
};

/// One lesson: a problem or quiz of the toy-machine lesson, or of the traffic chapter.
struct Lesson {
  std::string id;                    ///< `1` … `7` for the lesson text's problems; short names for quizzes
  std::string title;                 ///< one line for `lesson list`
  std::string section;               ///< the section of the lesson text it comes from
  std::string statement;             ///< the statement, in our own words (markdown-ish plain text)
  std::vector<std::string> hints;    ///< revealed one at a time; they lead, never state the answer
  std::optional<TraceTask> trace;    ///< the trace exercise, if the lesson has one
  std::vector<Question> questions;   ///< the questions, answered with `lesson answer`
  std::string discussion;            ///< shown after the lesson is passed
  std::string shape;                 ///< traffic chapter: the attention shape, e.g. "B=1 N=4096 … fp32"
};

/// All lessons, in curriculum order (lessons/data/catalogue.txt).
/// @throws std::logic_error on the first call when the embedded data is malformed (a packaging
/// bug: the test suite loads the catalogue).
const std::vector<Lesson>& catalogue();

/// The lesson with this id, or nullptr.
const Lesson* find_lesson(std::string_view id);

/// The ids of all lessons, space-separated (for hints in error messages).
std::string lesson_ids();

/// An embedded data file by its path under lessons/data/ (e.g. "1/solution.trace"), or nullptr.
const std::string* embedded_file(std::string_view path);

/// The paths of every embedded data file, sorted.
std::vector<std::string> embedded_files();

/// Parses one lesson from the texts of its folder (`files`: file name → contents, e.g.
/// "lesson.txt", "statement.md"). Used by catalogue() and by tests on malformed data.
/// @throws std::invalid_argument naming the file, the line and what is wrong.
Lesson parse_lesson(const std::string& id, const std::map<std::string, std::string>& files);

}  // namespace flashlab::lessons
