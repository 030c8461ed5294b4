/// @file render.hpp
/// @brief The lesson's step table (Step | Instruction | one column per register) and the
/// counters block, as pure functions of states.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "flashlab/toymachine/assembler.hpp"
#include "flashlab/toymachine/executor.hpp"
#include "flashlab/toymachine/machine.hpp"

namespace flashlab::toy {

/// How cells are shown.
struct RenderOptions {
  bool numeric = false;       ///< show numbers instead of expressions
  bool ditto = false;         ///< show `"` for a register unchanged since the previous row (the lesson's style)
  std::size_t max_cell = 48;  ///< longer cell contents are cut to this many characters, ending in `…`
};

/// The contents of one register as a table cell: the expression (named where the machine names
/// it), or the number, or empty when never written.
std::string render_cell(const std::optional<Value>& v, const Machine& machine, const RenderOptions& opt);

/// One row: step number, instruction text, each register after the step. `before` is the state
/// before the step (for ditto marks), `after` the state after it.
std::vector<std::string> render_row(const Program& program, const Machine& machine, const State& before,
                                    const State& after, const RenderOptions& opt);

/// The whole step table for states[0..k] (states[k] after k steps): header, rule and one row
/// per step, columns padded to their widest cell (widths counted in characters, not bytes).
std::string render_table(const Program& program, const Machine& machine, const std::vector<State>& states,
                         const RenderOptions& opt);

/// The counters block: cycles, instructions per opcode, DRAM reads and writes per array.
std::string render_counters(const Machine& machine, const Counters& c);

/// Number of characters (UTF-8 code points) in `s`, for column widths.
std::size_t display_width(const std::string& s);

}  // namespace flashlab::toy
