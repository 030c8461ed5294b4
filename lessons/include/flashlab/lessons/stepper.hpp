/// @file stepper.hpp
/// @brief Frames of the terminal stepper (`flashlab step`), as a pure function of two machine
/// states: `render_frame(now, previous, options) → text`. The interactive front (app/toymachine/cmd_step.cpp)
/// only reads keys and prints these frames, so every frame can be tested against golden text.
/// Layout (80×24 and up): title; the instruction listing with the next instruction marked `>`
/// beside the register file (changed registers marked `*`, symbolic and numeric); the DRAM arrays
/// with per-element read counts and the last read/write marked; the counters; a status line;
/// the keys.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "flashlab/toymachine/assembler.hpp"
#include "flashlab/toymachine/executor.hpp"
#include "flashlab/toymachine/machine.hpp"

namespace flashlab::lessons {

/// What the frame shows besides the states.
struct FrameOptions {
  int width = 80;             ///< terminal columns (frames never exceed it; minimum 40)
  int height = 24;            ///< terminal rows (frames have exactly this many lines; minimum 12)
  bool numeric = false;       ///< show numbers instead of expressions in registers and DRAM
  bool help = false;          ///< show the key help instead of the panes
  std::string title;          ///< e.g. "p1.trace on matmul3"
  std::string status;         ///< a message for the status line (e.g. a prompt or "at the start")
};

/// What the frame is about: the program, its machine, and how the run ended (if it did).
struct FrameContext {
  const toy::Program* program = nullptr;  ///< the assembled trace
  const toy::Machine* machine = nullptr;  ///< its machine
  const toy::Fault* fault = nullptr;      ///< the fault that stopped the run at `now`, if any
};

/// Renders one frame. `previous` is the state one step before `now` (null at the start); it
/// decides which registers are marked changed. Lines are separated by '\n'; every line is at
/// most `opt.width` characters (UTF-8 code points) wide and there are exactly `opt.height` lines.
/// Pure: the same arguments always give the same text.
std::string render_frame(const FrameContext& ctx, const toy::State& now, const toy::State* previous,
                         const FrameOptions& opt);

/// Width (columns) of the listing pane in a frame `width` columns wide; the front end uses it to
/// highlight the current instruction's row.
std::size_t listing_width(int width);

/// The key help shown by `?` (also in `flashlab step --help`).
const std::string& stepper_keys_help();

/// False when some register in `states` holds an expression too large to print (a register
/// squared over and over prints as 2^k factors); callers then show numbers instead.
bool states_printable(const std::vector<toy::State>& states);

/// Cuts or pads `s` to exactly `width` code points (cut text ends in `…`).
std::string fit(const std::string& s, std::size_t width);

}  // namespace flashlab::lessons
