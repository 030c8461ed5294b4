// `flashlab step [TRACE] (--machine NAME | --machine-file F | --lesson ID)`: the full-screen
// terminal stepper. This file only parses flags, owns the timeline, reads keys and prints
// frames; every frame comes from the pure lessons::render_frame (lessons/src/stepper.cpp), which
// the golden tests cover, and every move is the timeline's (toymachine/timeline.hpp: bounded
// memory, checkpoints and re-execution). Without a TTY (or with --plain) it prints the lesson's
// step table instead and exits, so it also works in pipes and scripts.
#include <curses.h>
#include <langinfo.h>
#include <unistd.h>

#include <clocale>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

#include "core/commands.hpp"
#include "toymachine/toy_flags.hpp"
#include "flashlab/lessons/checker.hpp"
#include "flashlab/lessons/lesson.hpp"
#include "flashlab/lessons/stepper.hpp"
#include "flashlab/toymachine/assembler.hpp"
#include "flashlab/toymachine/executor.hpp"
#include "flashlab/toymachine/machine.hpp"
#include "flashlab/toymachine/policy.hpp"
#include "flashlab/toymachine/render.hpp"
#include "flashlab/toymachine/timeline.hpp"

namespace flashlab::app {

namespace toy = flashlab::toy;
namespace lessons = flashlab::lessons;

namespace {

// Frames are UTF-8 (─ │ · … −). In a terminal whose locale is not UTF-8 they are spelled in ASCII.
std::string ascii(const std::string& s) {
  static const std::pair<const char*, const char*> map[] = {
      {"─", "-"}, {"│", "|"}, {"·", "."}, {"…", "~"}, {"−", "-"}, {"×", "x"}, {"Σ", "S"}, {"→", ">"}, {"←", "<"}};
  std::string out;
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      out += s[i++];
      continue;
    }
    bool done = false;
    for (const auto& [from, to] : map) {
      const std::size_t n = std::strlen(from);
      if (s.compare(i, n, from) == 0) {
        out += to;
        i += n;
        done = true;
        break;
      }
    }
    if (!done) {
      out += '?';
      i += c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    }
  }
  return out;
}

struct Stepper {
  Stepper(toy::Timeline t, std::string name) : tl(std::move(t)), title(std::move(name)) {}
  toy::Timeline tl;
  std::string title;
  bool numeric = false;
  bool help = false;
  std::string status;
  std::optional<std::string> input;  // the goto prompt's text while typing
};

// Digits → a number, or nothing when empty, not all digits, or too large (no stoul text leaks).
std::optional<std::size_t> parse_count(const std::string& digits) {
  if (digits.empty() || digits.size() > 12) return std::nullopt;
  std::size_t v = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<std::size_t>(c - '0');
  }
  return v;
}

// `g` then "12" → step 12; ":7" → the next execution of source line 7 after the current
// position, or its first one when none follows (the status line says which).
void do_goto(Stepper& s, const std::string& text) {
  const bool line_goto = !text.empty() && text[0] == ':';
  const auto value = parse_count(line_goto ? text.substr(1) : text);
  if (!value) {
    s.status = "'" + text + "' is not a step number (or :line)";
    return;
  }
  if (line_goto) {
    const std::string line = std::to_string(*value);
    const auto hit = *value <= 1'000'000'000 ? s.tl.find_line(static_cast<int>(*value)) : std::nullopt;
    if (!hit) {
      s.status = "line " + line + " runs no instruction";
      return;
    }
    s.tl.go_to(hit->step);
    s.status = hit->wrapped ? "line " + line + " does not run again: back at its first execution, step " + std::to_string(hit->step)
                            : "line " + line + ": its next execution, step " + std::to_string(hit->step);
    if (s.tl.position() != hit->step) s.status = "the run stops at a fault before line " + line;
    return;
  }
  if (*value > s.tl.length()) {
    s.status = "step " + text + " is out of range: 0.." + std::to_string(s.tl.length());
    return;
  }
  s.tl.go_to(*value);
}

// Draws one frame; highlights read the markers the pure frame already carries.
void draw(const Stepper& s, bool utf8, bool colour) {
  lessons::FrameOptions opt;
  opt.width = COLS;
  opt.height = LINES;
  opt.numeric = s.numeric || !s.tl.options().symbolic;
  opt.help = s.help;
  opt.title = s.title;
  opt.status = s.input ? "go to step (or :line), Enter to go, Esc to cancel: " + *s.input : s.status;
  lessons::FrameContext ctx{&s.tl.program(), &s.tl.machine(), s.tl.fault() ? &*s.tl.fault() : nullptr};
  const std::string frame = lessons::render_frame(ctx, s.tl.state(), s.tl.previous(), opt);
  erase();
  std::istringstream is(frame);
  std::string line;
  const int left = static_cast<int>(lessons::listing_width(COLS));
  for (int row = 0; std::getline(is, line) && row < LINES; ++row) {
    mvaddstr(row, 0, (utf8 ? line : ascii(line)).c_str());
    if (line.rfind("> ", 0) == 0) mvchgat(row, 0, left, A_REVERSE, 0, nullptr);
    const bool changed_reg = line.find("│ *") != std::string::npos;
    if (!colour) {
      if (changed_reg) mvchgat(row, left + 3, -1, A_BOLD, 0, nullptr);
      continue;
    }
    if (line.rfind("FAULT", 0) == 0) mvchgat(row, 0, -1, A_BOLD, 2, nullptr);
    if (changed_reg) mvchgat(row, left + 3, -1, A_BOLD, 1, nullptr);
    // The last DRAM access, `[..]R` or `[..]W`, in cyan (columns counted in characters).
    std::size_t rb = line.find("]R");
    if (rb == std::string::npos) rb = line.find("]W");
    const std::size_t lb = rb == std::string::npos ? rb : line.rfind('[', rb);
    if (lb != std::string::npos && line.rfind("──", 0) != 0) {
      const int col = static_cast<int>(toy::display_width(line.substr(0, lb)));
      const int len = static_cast<int>(toy::display_width(line.substr(lb, rb + 2 - lb)));
      mvchgat(row, col, len, A_BOLD, 3, nullptr);
    }
  }
  refresh();
}

// One key of the goto prompt.
void prompt_key(Stepper& s, int ch) {
  if (ch == '\n' || ch == KEY_ENTER || ch == '\r') {
    const std::string text = *s.input;
    s.input.reset();
    do_goto(s, text);
  } else if (ch == 27) {
    s.input.reset();
  } else if ((ch == KEY_BACKSPACE || ch == 127 || ch == 8) && !s.input->empty()) {
    s.input->pop_back();
  } else if ((ch >= '0' && ch <= '9') || ch == ':') {
    if (s.input->size() < 12) *s.input += static_cast<char>(ch);
  }
}

// One key of the stepper; returns false to quit.
bool stepper_key(Stepper& s, int ch) {
  switch (ch) {
    case 'q':
    case 27:
      return false;
    case 'n':
    case ' ':
    case 'j':
    case KEY_RIGHT:
    case KEY_DOWN:
      if (s.tl.done()) s.status = s.tl.fault() ? "stopped by the fault: b steps back" : "at the end: b steps back";
      else s.tl.step();
      break;
    case 'b':
    case 'k':
    case KEY_LEFT:
    case KEY_UP:
      if (!s.tl.back()) s.status = "at the start";
      break;
    case 'e':
    case 'G':
    case KEY_END:
      s.tl.run_to_end();
      break;
    case 'r':
    case KEY_HOME:
      s.tl.go_to(0);
      break;
    case 'g':
      s.input = std::string();
      break;
    case 's':
      if (!s.tl.options().symbolic) s.status = "numeric only: the trace is too long to carry expressions";
      else s.numeric = !s.numeric;
      break;
    case '?':
    case 'h':
      s.help = true;
      break;
    default:
      s.status = "unknown key: ? shows the keys";
  }
  return true;
}

int interactive(Stepper& s) {
  // Wide characters need a UTF-8 locale; fall back to C.UTF-8, then to ASCII frames.
  std::setlocale(LC_ALL, "");
  bool utf8 = std::strcmp(nl_langinfo(CODESET), "UTF-8") == 0;
  if (!utf8 && std::setlocale(LC_CTYPE, "C.UTF-8")) utf8 = std::strcmp(nl_langinfo(CODESET), "UTF-8") == 0;
  // newterm (not initscr, which exits the process) so that an unknown TERM is an error we report.
  SCREEN* screen = newterm(nullptr, stdout, stdin);
  if (!screen) {
    const char* term = std::getenv("TERM");
    throw UsageError(std::string("cannot drive this terminal (TERM=") + (term ? term : "unset") + ")",
                     "set TERM (e.g. TERM=xterm), or use --plain for the step table");
  }
  cbreak();
  noecho();
  keypad(stdscr, TRUE);
  curs_set(0);
  set_escdelay(25);
  const bool colour = has_colors() && !std::getenv("NO_COLOR");
  if (colour) {
    start_color();
    use_default_colors();
    init_pair(1, COLOR_YELLOW, -1);  // changed registers
    init_pair(2, COLOR_RED, -1);     // faults
    init_pair(3, COLOR_CYAN, -1);    // last DRAM access
  }
  for (;;) {
    draw(s, utf8, colour);
    const int ch = getch();
    s.status.clear();
    if (ch == KEY_RESIZE) continue;
    if (s.input) {
      prompt_key(s, ch);
    } else if (s.help) {
      s.help = false;  // any key leaves the help; q also quits
      if (ch == 'q') break;
    } else if (!stepper_key(s, ch)) {
      break;
    }
  }
  endwin();
  delscreen(screen);
  return kOk;
}

// Without a terminal: the step table (every state) when the run keeps them, else the counters.
int print_plain(toy::Executor ex, const std::string& trace_name, bool numeric) {
  ex.run();
  const toy::Machine& machine = ex.machine();
  if (ex.options().symbolic) {
    std::vector<toy::State> states = ex.history();
    states.push_back(ex.state());
    toy::RenderOptions ro;
    ro.numeric = numeric || !lessons::states_printable(states);
    if (ro.numeric && !numeric) std::cerr << "note: expressions too large to print; showing numbers\n";
    std::cout << toy::render_table(ex.program(), machine, states, ro) << "\n";
  } else {
    std::cerr << "note: " << ex.program().code.size() << " instructions over " << toy::dram_cells(machine)
              << " DRAM cells: too long for the step table; counters only (the full-screen stepper and"
                 " flashlab run show more)\n";
  }
  std::cout << toy::render_counters(machine, ex.state().counters);
  if (const auto& f = ex.fault()) {
    std::cerr << toy::format_fault(*f, trace_name);
    return kRuntimeFault;
  }
  return kOk;
}

// The machine of --lesson, --machine or --machine-file; false after printing a located error in a
// machine file.
bool step_machine(const po::variables_map& vm, const lessons::Lesson* lesson, int n, toy::Machine& machine) {
  try {
    if (lesson) {
      const auto& ns = lesson->trace->ns;
      machine = lessons::task_machine(*lesson->trace, vm["n"].defaulted() && !ns.empty() ? ns.front() : n);
    } else if (vm.count("machine")) {
      machine = toy::builtin_machine(vm["machine"].as<std::string>(), n);
    } else {
      const auto path = vm["machine-file"].as<std::string>();
      const std::string mtext = read_input(path, "--machine-file", "machine file");
      machine = toy::parse_machine_file(mtext, path, n);
    }
  } catch (const toy::MachineError& e) {
    if (!e.diagnostic()) throw UsageError(e.what(), e.hint());
    std::cerr << toy::format_diagnostic(*e.diagnostic());
    return false;
  }
  return true;
}

}  // namespace

int cmd_step(const Args& args) {
  return guarded("step", [&]() -> int {
    po::options_description desc("Options");
    desc.add_options()("help,h", "show this help")("machine,m", po::value<std::string>(), "built-in machine profile")(
        "machine-file", po::value<std::string>(), "a machine file (docs/toymachine.md; - reads standard input)")(
        "lesson", po::value<std::string>(), "use lesson ID's machine (and its starter when no TRACE is given)")(
        "plain", "print the step table and counters instead of the full-screen view")(
        "numeric", "start with numeric values");
    add_toy_run_options(desc);
    po::options_description hidden;
    hidden.add_options()("trace", po::value<std::string>());
    po::options_description all;
    all.add(desc).add(hidden);
    po::positional_options_description pos;
    pos.add("trace", 1);
    const auto vm = parse(args, all, &pos);
    if (vm.count("help")) {
      print_help(std::cout, "step [TRACE] (--machine NAME | --machine-file F | --lesson ID) [options]",
                 "Step through a toy-machine trace, forward and back. With no TRACE: lesson 1's worked trace\n"
                 "(the lesson's c00 trace on matmul3). Full screen on a terminal; otherwise (or --plain)\n"
                 "the step table.\n\n" + lessons::stepper_keys_help(),
                 desc);
      return kOk;
    }
    const ToyRunFlags flags = toy_run_flags(vm);
    const int n = flags.n;
    const int sources = static_cast<int>(vm.count("machine") + vm.count("machine-file") + vm.count("lesson"));
    if (sources > 1) throw UsageError("--machine, --machine-file and --lesson are exclusive", "give one of them");

    std::string trace_name, text;
    toy::Machine machine;
    const lessons::Lesson* lesson = nullptr;
    if (vm.count("lesson")) {
      lesson = lessons::find_lesson(vm["lesson"].as<std::string>());
      if (!lesson) {
        throw UsageError("--lesson: no lesson '" + vm["lesson"].as<std::string>() + "'",
                         "the lessons are: " + lessons::lesson_ids());
      }
      if (!lesson->trace || lesson->trace->model != lessons::TraceModel::Toy) {
        throw UsageError("--lesson " + lesson->id + " has no toy-machine trace to step through",
                         "the tile lessons are checked with flashlab lesson check; the quizzes have no trace");
      }
    }
    if (!vm.count("trace")) {
      if (sources == 0) lesson = lessons::find_lesson("1");
      if (!lesson) throw UsageError("TRACE is missing", "give a trace file, or --lesson ID to open its starter");
      const bool worked = sources == 0;  // the default opens the lesson's worked trace
      text = worked ? lesson->trace->solution : lesson->trace->starter;
      trace_name = "lesson " + lesson->id + (worked ? " worked trace" : " starter");
    } else {
      trace_name = vm["trace"].as<std::string>();
      if (sources == 0) {
        throw UsageError("--machine is required", "e.g. --machine matmul3 (flashlab machines lists them), or --lesson ID");
      }
    }
    if (vm.count("trace")) text = read_trace_file(trace_name);
    if (!step_machine(vm, lesson, n, machine)) return kUsage;

    auto as = toy::assemble(text, machine, trace_name);
    if (!as.ok()) {
      for (const auto& d : as.diagnostics) std::cerr << toy::format_diagnostic(d);
      return kUsage;
    }
    const auto inputs = toy::random_inputs(machine, flags.seed);
    // The run policy (policy.hpp), as `run` applies it: long traces go numeric-only.
    const toy::Options options{toy::fits_symbolic(as.program.code.size(), machine), flags.max_cycles};
    const bool numeric = vm.count("numeric") > 0;
    if (vm.count("plain") || !::isatty(STDOUT_FILENO) || !::isatty(STDIN_FILENO))
      return print_plain(toy::Executor(std::move(as.program), machine, inputs, options), trace_name, numeric);
    Stepper s(toy::Timeline(std::move(as.program), machine, inputs, options), trace_name + " on " + machine.name);
    s.numeric = numeric;
    if (!options.symbolic) s.status = "numeric only: the trace is too long to carry expressions";
    try {
      return interactive(s);
    } catch (...) {
      if (!isendwin()) endwin();  // leave the terminal usable before the error is printed
      throw;
    }
  });
}

}  // namespace flashlab::app
