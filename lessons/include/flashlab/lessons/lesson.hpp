/// @file lesson.hpp
/// @brief The lesson catalogue: every problem and quiz of seed 004 as data — statement, hints,
/// the machine, a starter and a reference trace, the cost targets and the questions with
/// checked answers. Texts live in lessons/data/ID/ and are embedded into the binary at build
/// time, so `flashlab lesson …` works from any directory.
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

/// A trace exercise: write a trace for a machine; it is run and its cost graded.
struct TraceTask {
  TraceModel model = TraceModel::Toy;  ///< which simulator runs it
  std::string machine;                 ///< built-in toy profile name, or the name of the embedded machine file
  std::string machine_file;            ///< embedded machine-file text (empty: `machine` is a built-in profile)
  std::vector<int> ns;                 ///< the sizes `n` the trace is checked at (first one is shown)
  CostTarget target;                   ///< the budget
  std::string target_text;             ///< the budget in words, e.g. "25 cycles, 13 LOADs"
  bool symbolic_decides = false;       ///< outputs must also be symbolically equivalent (exact polynomials)
  ReferenceFn reference;               ///< the expected outputs
  std::string starter;                 ///< starter trace (embedded file text)
  std::string solution;                ///< reference solution (embedded file text)
  /// Tile model only: per-tensor transfer targets, e.g. {"Q load", "n"}, {"O store", "n^2"}.
  std::vector<std::pair<std::string, std::string>> tile_targets;
};

/// How an answer to a question is compared.
enum class AnswerKind {
  Formula,  ///< a formula in the question's variables, compared by value at several points
  Number,   ///< a number (a formula without variables), compared by value
  Choice,   ///< one letter of a multiple choice, case-insensitive
  Keyword   ///< free text that must contain one of the accepted words (case-insensitive)
};

/// One question with a checked answer.
struct Question {
  std::string key;                   ///< short name used in `name=value` answers, e.g. "reads"
  std::string prompt;                ///< the question
  AnswerKind kind = AnswerKind::Number;  ///< how the answer is compared
  std::string expected;              ///< the expected formula / number / letter
  std::vector<std::string> vars;     ///< Formula: the variable names it may use, e.g. {"n"}
  std::vector<std::string> accepted; ///< Keyword: accepted words
  std::string why;                   ///< one line shown after a correct answer
};

/// One lesson: a problem or quiz of seed 004.
struct Lesson {
  std::string id;                    ///< `1` … `7` for the seed's problems; short names for quizzes
  std::string title;                 ///< one line for `lesson list`
  std::string section;               ///< the seed section it comes from
  std::string statement;             ///< the statement, in our own words (markdown-ish plain text)
  std::vector<std::string> hints;    ///< revealed one at a time
  std::optional<TraceTask> trace;    ///< the trace exercise, if the lesson has one
  std::vector<Question> questions;   ///< the questions, answered with `lesson answer`
  std::string discussion;            ///< shown after the lesson is passed
};

/// All lessons, in curriculum order (the seed's order).
const std::vector<Lesson>& catalogue();

/// The lesson with this id, or nullptr.
const Lesson* find_lesson(std::string_view id);

/// The ids of all lessons, space-separated (for hints in error messages).
std::string lesson_ids();

/// An embedded data file by its path under lessons/data/ (e.g. "1/solution.trace"), or nullptr.
const std::string* embedded_file(std::string_view path);

/// The paths of every embedded data file, sorted.
std::vector<std::string> embedded_files();

}  // namespace flashlab::lessons
