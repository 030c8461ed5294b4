/// @file frontend.hpp
/// @brief The trace front end shared by the toy machine's assembler and the lessons' tile model:
/// the source split into lines, located diagnostics, the lexer for one line (optional step
/// number, mnemonic, comma-separated operands, `#` comments), checked integer index expressions,
/// and the loop directive `for i in A..B` … `end`, whose expansion is counted before anything
/// is built. Every limit of the front end is stated here, once.
///
/// Nothing here recurses on the input: loops are kept flat (each loop knows where its body
/// ends) and walked with an explicit stack, and index expressions are refused past
/// kMaxNesting levels, so no input can exhaust the call stack.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "flashlab/toymachine/diagnostic.hpp"

namespace flashlab::toy {

/// At most this many diagnostics are reported (the last one says how many more were dropped).
inline constexpr std::size_t kMaxDiagnostics = 20;

/// The instruction cap: a trace whose loops expand beyond this many instructions, or whose loops
/// iterate more often than this, is refused before anything is built. `run`, `step` and
/// `lesson check` all assemble through this front end, so this is their one cap.
inline constexpr std::size_t kMaxInstructions = 1'000'000;

/// Deepest nesting accepted anywhere in user text: loops in a trace, parentheses and unary
/// minus in an index expression, parentheses in a lesson formula.
inline constexpr int kMaxNesting = 32;

/// Names visible to an index expression and their values: `n`, then the open loop variables
/// (innermost last; the last binding of a name wins).
using IndexVars = std::vector<std::pair<std::string, long long>>;

/// Evaluates an index expression: integers, names from `vars`, `+ - *` (also `−`), unary minus
/// and parentheses, in checked 64-bit arithmetic. On error returns false and sets `error` and
/// `error_col` (0-based byte offset into `expr`): an unknown name, a syntax error, an overflow
/// ("index arithmetic overflows") or nesting deeper than kMaxNesting.
bool eval_index_expression(std::string_view expr, const IndexVars& vars, long long& result, std::string& error,
                           std::size_t& error_col);

/// The trace text split into lines, plus the diagnostics collected while reading it.
class Source {
 public:
  /// Splits `text` into lines (a UTF-8 byte-order mark and `\r` before `\n` are dropped).
  Source(std::string_view text, std::string file);
  /// The file name as given.
  [[nodiscard]] const std::string& file() const { return file_; }
  /// The lines, without their newlines.
  [[nodiscard]] const std::vector<std::string>& lines() const { return lines_; }
  /// Line `number` (1-based).
  [[nodiscard]] const std::string& line(int number) const { return lines_[static_cast<std::size_t>(number - 1)]; }
  /// 1-based character column of byte `byte` in line `number` (UTF-8 aware).
  [[nodiscard]] int column(int number, std::size_t byte) const;
  /// Records an error at line `number`, bytes [byte_col, byte_col + byte_len) under the caret.
  void error(int number, std::size_t byte_col, std::size_t byte_len, std::string message, std::string hint);
  /// True while no error was recorded.
  [[nodiscard]] bool ok() const { return diagnostics_.empty(); }
  /// Moves the lines out (for the assembled program), once reading is over.
  std::vector<std::string> release_lines() { return std::move(lines_); }
  /// The diagnostics in the order recorded, cut to kMaxDiagnostics (the last then says how many
  /// more there were).
  [[nodiscard]] std::vector<Diagnostic> diagnostics() const;

 private:
  std::string file_;
  std::vector<std::string> lines_;
  std::vector<Diagnostic> diagnostics_;
};

/// An index expression as written: its text and where it starts.
struct IndexExpr {
  std::string text;     ///< the expression, e.g. "n-1"
  int line = 0;         ///< 1-based line
  std::size_t at = 0;   ///< byte offset of the expression in its line
};

/// The hint for a bad index expression: which names are in scope and how to write one.
std::string index_hint(const IndexVars& scope);

/// Checks `e` while parsing: syntax and names in `scope` (values are placeholders, so an overflow
/// is not reported here). Records a located diagnostic and returns false on error.
bool check_index(Source& src, const IndexExpr& e, const IndexVars& scope);

/// Evaluates `e` with the current loop values; records a located diagnostic (an overflow
/// included) and returns false on error.
bool evaluate_index(Source& src, const IndexExpr& e, const IndexVars& vars, long long& out);

/// A byte range [begin, end) within a line.
struct Span {
  std::size_t begin = 0;  ///< first byte
  std::size_t end = 0;    ///< one past the last byte
  /// True for an empty range (a missing operand between two commas).
  [[nodiscard]] bool empty() const { return begin == end; }
};

/// One instruction line, lexed: the model parses the mnemonic and operands itself.
struct StatementLine {
  int line = 0;                ///< 1-based line
  Span mnemonic;               ///< the first word (letters, digits, `_`)
  std::vector<Span> operands;  ///< comma-separated, trimmed; none when nothing follows the mnemonic
  Span rest;                   ///< everything after the mnemonic up to a comment, trimmed
};

/// The header of one loop: `for var in lo..hi`.
struct LoopHeader {
  std::string var;  ///< the variable
  IndexExpr lo;     ///< the first value
  IndexExpr hi;     ///< the last value (inclusive)
};

/// One entry of a trace's loop structure: a statement, or a loop whose body follows it.
struct LoopItem {
  bool loop = false;         ///< a `for` (else a statement)
  bool leaf = true;          ///< loop: its body holds no loop
  int line = 0;              ///< 1-based line
  std::size_t col = 0;       ///< byte offset of the mnemonic or of `for`
  std::size_t index = 0;     ///< statement: its number in the model's own list; loop: its header
  std::size_t body_end = 0;  ///< loop: index of the first item after its `end`
};

/// The structure of a trace in source order, flat: loop k's body is items (k, body_end).
struct LoopProgram {
  std::vector<LoopItem> items;      ///< statements and loops in source order
  std::vector<LoopHeader> headers;  ///< the loops' headers, by LoopItem::index
  std::size_t statements = 0;       ///< statements the model kept
};

/// The model's parser for one instruction line: `scope` holds the names its index expressions
/// may use. Returns true when it kept the statement (it then has number LoopProgram::statements
/// at the time of the call); records diagnostics in the Source and returns false otherwise.
using StatementParser = std::function<bool(const StatementLine& statement, const IndexVars& scope)>;

/// Reads every line: blank lines, comments and step numbers are skipped, `for`/`end` (any case)
/// build the loop structure, every other line goes to `parse_statement`. Loops nested deeper than
/// kMaxNesting, a malformed header, an `end` without `for` and a `for` without `end` are
/// diagnostics. `scope` holds the names visible outside every loop (`n`).
LoopProgram parse_loops(Source& src, const IndexVars& scope, const StatementParser& parse_statement);

/// Counts the statements the loops expand to, without building anything: loops with a body of
/// statements only are counted in closed form, other loops are iterated. Records a diagnostic and
/// returns nothing when a bound does not evaluate, when the count exceeds kMaxInstructions or
/// when the loops iterate more than kMaxInstructions times.
std::optional<std::size_t> count_expansion(Source& src, const LoopProgram& program, const IndexVars& vars);

/// Called once per executed statement, in order, with the loop values at that point; returns
/// false to stop (after recording a diagnostic).
using StatementEmitter = std::function<bool(std::size_t statement, const IndexVars& vars)>;

/// Walks the loops and calls `emit` for every statement executed. Call count_expansion() first:
/// it refuses the traces this would take too long on. Returns false when a bound or `emit` failed.
bool expand_loops(Source& src, const LoopProgram& program, const IndexVars& vars, const StatementEmitter& emit);

}  // namespace flashlab::toy
