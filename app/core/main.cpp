// flashlab — FlashAttention from the smallest machine up.
// The dispatcher: picks the subcommand, hands it the remaining arguments.
#include <cstring>
#include <iostream>
#include <string_view>

#include "core/commands.hpp"

namespace {

using flashlab::app::Args;

struct Command {
  std::string_view name;
  std::string_view summary;
  int (*run)(const Args&);
};

// The order is the order of the three journeys: toy machine, lessons, references, traffic; then
// the GPU benchmark.
constexpr Command kCommands[] = {
    {"demo", "the tour: a toy-machine trace, online softmax, attention traffic (make demo)", flashlab::app::cmd_demo},
    {"run", "run a toy-machine trace and count cycles and DRAM traffic", flashlab::app::cmd_run},
    {"machines", "list the built-in toy-machine profiles", flashlab::app::cmd_machines},
    {"step", "step through a trace in the terminal, forward and back", flashlab::app::cmd_step},
    {"lesson", "the lesson's problems and quizzes, with checked answers", flashlab::app::cmd_lesson},
    {"attention", "attention forward/backward on the CPU reference (naive, FA1, FA2, atomic)", flashlab::app::cmd_attention},
    {"traffic", "HBM traffic of naive vs FA1 vs FA2, modelled (and measured with --device cuda)", flashlab::app::cmd_traffic},
    {"mta", "Multi-Token Attention reference: forward, backward, split-K inference", flashlab::app::cmd_mta},
    {"stream", "STREAM sparse tracing reference: estimate, apply, trace", flashlab::app::cmd_stream},
    {"bench", "time the GPU kernels: bench attention | mta | stream (ms, TFLOP/s)", flashlab::app::cmd_bench},
};

void usage(std::ostream& os) {
  os << "flashlab — FlashAttention from the smallest machine up\n\n"
        "Usage: flashlab <command> [options]   (flashlab <command> --help for its options)\n\n"
        "Commands:\n";
  for (const auto& c : kCommands) {
    os << "  " << c.name << std::string(12 - c.name.size(), ' ') << c.summary << "\n";
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0 ||
      std::strcmp(argv[1], "help") == 0) {
    usage(argc < 2 ? std::cerr : std::cout);
    return argc < 2 ? flashlab::app::kUsage : flashlab::app::kOk;
  }
  if (std::strcmp(argv[1], "--version") == 0) {
    std::cout << "flashlab " << FLASHLAB_VERSION << "\n";
    return 0;
  }
  const std::string_view name = argv[1];
  for (const auto& c : kCommands) {
    if (c.name == name) return c.run(Args(argv + 2, argv + argc));
  }
  std::cerr << "error: unknown command '" << name << "'\nhint: flashlab --help lists the commands\n";
  return flashlab::app::kUsage;
}
