// `flashlab run TRACE --machine NAME` and `flashlab machines`: parse flags, call the toy machine
// library (toymachine/), format the result. No machine semantics here.
#include <cmath>
#include <fstream>
#include <iostream>
#include <sstream>

#include "core/commands.hpp"
#include "core/report.hpp"
#include "core/shared_flags.hpp"
#include "toymachine/toy_flags.hpp"
#include "flashlab/toymachine/assembler.hpp"
#include "flashlab/toymachine/executor.hpp"
#include "flashlab/toymachine/isa.hpp"
#include "flashlab/toymachine/machine.hpp"
#include "flashlab/toymachine/policy.hpp"
#include "flashlab/toymachine/render.hpp"

namespace flashlab::app {

namespace toy = flashlab::toy;

namespace {

std::string builtin_list() {
  std::string s;
  for (const auto& n : toy::builtin_machine_names()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

// The ISA table for --help (the same table the assembler and executor use).
std::string isa_help() {
  std::string s = "Instructions (sources first, destination last; 1 cycle unless the machine says otherwise):\n";
  for (const auto& e : toy::isa()) {
    std::string form = e.mnemonic + " " + e.operands;
    s += "  " + form + std::string(form.size() < 22 ? 22 - form.size() : 1, ' ') + e.semantics + "\n";
  }
  return s;
}

// Loads the machine from --machine or --machine-file; throws UsageError naming the flag.
// Returns false (after printing the located error) when the machine file is malformed.
bool load_machine(const po::variables_map& vm, int n, toy::Machine& m) {
  const bool builtin = vm.count("machine") > 0, file = vm.count("machine-file") > 0;
  if (builtin && file)
    throw UsageError("--machine and --machine-file are exclusive", "give a built-in profile or a machine file, not both");
  if (!builtin && !file)
    throw UsageError("--machine is required", "the built-in machines are " + builtin_list() + ", or give --machine-file F");
  if (builtin) {
    try {
      m = toy::builtin_machine(vm["machine"].as<std::string>(), n);
    } catch (const toy::MachineError& e) {
      throw UsageError(std::string("--machine: ") + e.what(), e.hint());
    }
    return true;
  }
  const auto path = vm["machine-file"].as<std::string>();
  const std::string text = read_input(path, "--machine-file", "machine file");
  try {
    m = toy::parse_machine_file(text, path, n);
  } catch (const toy::MachineError& e) {
    if (e.diagnostic()) std::cerr << toy::format_diagnostic(*e.diagnostic());
    else std::cerr << "error: " << e.what() << "\nhint: " << e.hint() << "\n";
    return false;
  }
  return true;
}

// --inputs a=1,2,3,4 (repeatable): replaces the random values of one input array.
void apply_inputs(const std::vector<std::string>& specs, const toy::Machine& m, toy::Inputs& in) {
  for (const auto& spec : specs) {
    const auto eq = spec.find('=');
    if (eq == std::string::npos || eq == 0)
      throw UsageError("--inputs '" + spec + "' is not name=v1,v2,…", "e.g. --inputs x=1,2,3 (row-major for 2-D arrays)");
    const std::string name = spec.substr(0, eq);
    const int ai = m.find_array(name);
    if (ai < 0 || m.arrays[static_cast<std::size_t>(ai)].role != toy::ArrayRole::Input) {
      std::string ins;
      for (const auto& a : m.arrays)
        if (a.role == toy::ArrayRole::Input) ins += (ins.empty() ? "" : ", ") + a.shape();
      throw UsageError("--inputs: machine " + m.name + " has no input array '" + name + "'", "its inputs are " + ins);
    }
    const auto& a = m.arrays[static_cast<std::size_t>(ai)];
    std::vector<double> vals;
    std::stringstream ss(spec.substr(eq + 1));
    std::string item;
    while (std::getline(ss, item, ',')) {
      char* end = nullptr;
      const double v = std::strtod(item.c_str(), &end);
      if (item.empty() || end != item.c_str() + item.size())
        throw UsageError("--inputs: '" + item + "' is not a number (in " + name + ")", "values are decimal numbers, e.g. x=0.5,-1,2e-3");
      vals.push_back(v);
    }
    if (vals.size() != a.size())
      throw UsageError("--inputs: " + a.shape() + " needs " + std::to_string(a.size()) + " values, got " + std::to_string(vals.size()),
                       "list every element, row-major");
    in[name] = std::move(vals);
  }
}

// An array's cells nested like the array (scalar → value, 1-D → [..], 2-D → [[..], ..]).
template <typename Cell>
void nested(Json& j, const toy::ArrayDecl& a, const Cell& cell) {
  if (a.dims.empty()) return cell(0);
  const std::size_t rows = a.dims.size() == 2 ? a.dims[0] : 1, cols = a.dims.back();
  if (a.dims.size() == 2) j.begin_array();
  for (std::size_t r = 0; r < rows; ++r) {
    j.begin_array();
    for (std::size_t c = 0; c < cols; ++c) cell(r * cols + c);
    j.end_array();
  }
  if (a.dims.size() == 2) j.end_array();
}

void print_json(const toy::Executor& ex, const std::string& trace, OutputFormat format) {
  const auto& m = ex.machine();
  const auto& s = ex.state();
  const auto& c = s.counters;
  ReportOutput report(format, std::cout);
  Json& j = report.json();
  j.begin_object();
  j.key("machine").value(m.name);
  j.key("n").value(m.n);
  j.key("trace").value(trace);
  j.key("cycles").value(c.cycles);
  j.key("instructions").begin_object();
  for (auto op : m.opcodes) j.key(toy::mnemonic(op)).value(c.instructions[static_cast<std::size_t>(op)]);
  j.end_object();
  j.key("dram_reads").value(c.dram_reads);
  j.key("dram_writes").value(c.dram_writes);
  j.key("reads_per_array").begin_object();
  for (std::size_t i = 0; i < m.arrays.size(); ++i) j.key(m.arrays[i].name).value(c.array_reads[i]);
  j.end_object();
  j.key("writes_per_array").begin_object();
  for (std::size_t i = 0; i < m.arrays.size(); ++i) j.key(m.arrays[i].name).value(c.array_writes[i]);
  j.end_object();
  auto numbers = [&](toy::ArrayRole role) {
    j.begin_object();
    for (std::size_t i = 0; i < m.arrays.size(); ++i) {
      if (m.arrays[i].role != role) continue;
      j.key(m.arrays[i].name);
      nested(j, m.arrays[i], [&](std::size_t k) {
        const auto& v = s.dram[i][k];
        if (v) j.value(v->num);
        else j.null();
      });
    }
    j.end_object();
  };
  j.key("inputs");
  numbers(toy::ArrayRole::Input);
  j.key("outputs");
  numbers(toy::ArrayRole::Output);
  j.key("symbolic_outputs").begin_object();
  if (ex.options().symbolic) {
    for (std::size_t i = 0; i < m.arrays.size(); ++i) {
      if (m.arrays[i].role != toy::ArrayRole::Output) continue;
      j.key(m.arrays[i].name);
      nested(j, m.arrays[i], [&](std::size_t k) {
        const auto& v = s.dram[i][k];
        if (v && v->sym) j.value(toy::to_string(*v->sym, &m.names));
        else j.null();
      });
    }
  }
  j.end_object();
  j.key("fault");
  if (const auto& f = ex.fault()) {
    j.begin_object();
    j.key("step").value(static_cast<std::uint64_t>(f->step));
    j.key("line").value(f->source_line);
    j.key("message").value(f->message);
    j.key("hint").value(f->hint);
    j.end_object();
  } else {
    j.null();
  }
  j.end_object();
  report.finish();
}

void print_outputs(const toy::Executor& ex) {
  const auto& m = ex.machine();
  const auto& s = ex.state();
  for (std::size_t i = 0; i < m.arrays.size(); ++i) {
    const auto& a = m.arrays[i];
    if (a.role != toy::ArrayRole::Output) continue;
    const std::size_t show = std::min<std::size_t>(a.size(), 16);
    for (std::size_t k = 0; k < show; ++k) {
      const auto& v = s.dram[i][k];
      std::cout << a.element_operand(k) << " = ";
      if (!v) {
        std::cout << "(never written)\n";
        continue;
      }
      std::cout << toy::format_number(v->num);
      if (v->sym) std::cout << "   " << toy::to_string(*v->sym, &m.names);
      std::cout << "\n";
    }
    if (show < a.size()) std::cout << "… (" << a.size() - show << " more in " << a.name << "; --json prints all)\n";
  }
}

// The text report: a header, the step table when asked for, the counters and the outputs.
void print_text(const toy::Executor& ex, const std::string& trace_path, bool table, bool ditto) {
  const auto& m = ex.machine();
  std::cout << "machine " << m.name << " (n = " << m.n << "), " << trace_path << ": " << ex.steps_taken() << " of "
            << ex.program().code.size() << " instructions ran\n\n";
  if (table) {
    std::vector<toy::State> states = ex.history();
    states.push_back(ex.state());
    toy::RenderOptions ro;
    ro.ditto = ditto;
    std::cout << toy::render_table(ex.program(), m, states, ro) << "\n";
  }
  std::cout << toy::render_counters(m, ex.state().counters) << "\n";
  print_outputs(ex);
}

}  // namespace

int cmd_run(const Args& args) {
  return guarded("run", [&]() -> int {
    po::options_description desc("Options");
    desc.add_options()
        ("help,h", "show this help")
        ("trace", po::value<std::string>(), "the trace file (positional; - reads standard input)")
        ("machine,m", po::value<std::string>(), ("built-in machine profile: " + builtin_list()).c_str())
        ("machine-file", po::value<std::string>(), "a user-defined machine (format: docs/toymachine.md; - reads standard input)")
        ("inputs", po::value<std::vector<std::string>>()->composing(), "give one input array: name=v1,v2,… (row-major; repeatable)")
        ("table", po::bool_switch(), "print the lesson's step table (Step | Instruction | one column per register)")
        ("numeric", po::bool_switch(), "numbers only: no symbolic values, no history (fast)")
        ("ditto", po::bool_switch(), "with --table: show \" for a register unchanged since the row above, as the lesson does");
    add_output_options(desc);
    add_toy_run_options(desc);
    po::positional_options_description pos;
    pos.add("trace", 1);
    const auto vm = parse(args, desc, &pos);
    if (vm.count("help")) {
      print_help(std::cout, "run TRACE --machine NAME [options]",
                 "Runs a toy-machine trace (the toy-machine lesson) and counts cycles, instructions and DRAM traffic.\n"
                 "Exit codes: 0 ran, 2 usage error or the trace does not assemble, 3 runtime fault.",
                 desc);
      std::cout << isa_help();
      return kOk;
    }
    if (!vm.count("trace")) throw UsageError("missing TRACE file", "usage: flashlab run TRACE --machine NAME (see --help)");
    const OutputFormat format = output_format(vm);
    const bool table = vm["table"].as<bool>(), numeric = vm["numeric"].as<bool>();
    if (table && format != OutputFormat::text)
      throw UsageError(std::string("--table and --") + (format == OutputFormat::json ? "json" : "csv") + " are exclusive",
                       "pick one output format");
    if (table && numeric) throw UsageError("--table needs the symbolic run; drop --numeric", "--table shows every state, which --numeric does not keep");
    const ToyRunFlags flags = toy_run_flags(vm);
    toy::Machine machine;
    if (!load_machine(vm, flags.n, machine)) return kUsage;

    const auto trace_path = vm["trace"].as<std::string>();
    const std::string text = read_trace_file(trace_path);
    auto assembled = toy::assemble(text, machine, trace_path);
    if (!assembled.ok()) {
      for (const auto& d : assembled.diagnostics) std::cerr << toy::format_diagnostic(d);
      std::cerr << assembled.diagnostics.size() << (assembled.diagnostics.size() == 1 ? " error" : " errors")
                << "; the trace does not assemble for machine " << machine.name << "\n";
      return kUsage;
    }

    toy::Inputs inputs = toy::random_inputs(machine, flags.seed);
    if (vm.count("inputs")) apply_inputs(vm["inputs"].as<std::vector<std::string>>(), machine, inputs);
    // Symbolic mode keeps every state (for --table and back-steps): each holds all of DRAM, so
    // large runs switch to numeric-only rather than eat memory.
    const std::size_t cells = toy::dram_cells(machine);
    const std::size_t steps = assembled.program.code.size();
    const bool too_big = !toy::fits_symbolic(steps, machine);
    if (too_big && table)
      throw UsageError("--table: " + std::to_string(steps) + " instructions over " + std::to_string(cells) +
                           " DRAM cells is too large to tabulate",
                       "use a smaller --n for the table, or drop --table (large runs go numeric-only)");
    if (too_big && !numeric)
      std::cerr << "note: " << steps << " instructions over " << cells
                << " DRAM cells: running numeric-only (no symbolic values); pass --numeric to silence this\n";
    toy::Options opt;
    opt.symbolic = !numeric && !too_big;
    opt.cycle_cap = flags.max_cycles;
    toy::Executor ex(std::move(assembled.program), std::move(machine), inputs, opt);
    const auto fault = ex.run();

    if (format != OutputFormat::text) print_json(ex, trace_path, format);
    else print_text(ex, trace_path, table, vm["ditto"].as<bool>());
    // An output that is NaN or ∞ ran, but is almost never what was meant (e^800, 0/0).
    for (std::size_t i = 0; i < ex.machine().arrays.size(); ++i) {
      if (ex.machine().arrays[i].role != toy::ArrayRole::Output) continue;
      for (std::size_t k = 0; k < ex.state().dram[i].size(); ++k) {
        const auto& v = ex.state().dram[i][k];
        if (v && !std::isfinite(v->num))
          std::cerr << "warning: " << ex.machine().arrays[i].element_operand(k) << " is " << toy::format_number(v->num)
                    << " (overflow or 0/0; subtract the maximum before EXP)\n";
      }
    }
    if (fault) {
      std::cerr << toy::format_fault(*fault, trace_path);
      return kRuntimeFault;
    }
    return kOk;
  });
}

int cmd_machines(const Args& args) {
  return guarded("machines", [&]() -> int {
    po::options_description desc("Options");
    desc.add_options()
        ("help,h", "show this help")
        ("n", po::value<long long>()->default_value(8), "size the softmax arrays with this n")
        ("machine-file", po::value<std::string>(), "describe a user-defined machine instead (- reads standard input)");
    const auto vm = parse(args, desc);
    if (vm.count("help")) {
      print_help(std::cout, "machines [--n N] [--machine-file F]",
                 "Lists the toy-machine profiles: registers, instructions, DRAM arrays (the toy-machine lesson).", desc);
      std::cout << isa_help();
      return kOk;
    }
    const long long n = vm["n"].as<long long>();
    require_range("n", n, 1, toy::kMaxN);
    std::vector<toy::Machine> ms;
    if (vm.count("machine-file")) {
      toy::Machine m;
      if (!load_machine(vm, static_cast<int>(n), m)) return kUsage;
      ms.push_back(std::move(m));
    } else {
      for (const auto& name : toy::builtin_machine_names()) ms.push_back(toy::builtin_machine(name, static_cast<int>(n)));
    }
    for (const auto& m : ms) {
      std::cout << m.name << "  " << m.description << "\n";
      std::cout << "  registers     " << m.register_list() << "\n";
      std::cout << "  instructions  ";
      for (std::size_t i = 0; i < m.opcodes.size(); ++i) {
        const int cyc = m.cycles[static_cast<std::size_t>(m.opcodes[i])];
        std::cout << (i ? " " : "") << toy::mnemonic(m.opcodes[i]);
        if (cyc != 1) std::cout << "(" << cyc << " cycles)";
      }
      std::cout << "\n  DRAM          " << m.array_list() << "\n\n";
    }
    std::cout << isa_help();
    return kOk;
  });
}

}  // namespace flashlab::app
