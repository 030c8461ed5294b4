// bench_toymachine — how fast the toy machine's numeric-only executor runs (the target: at least
// 20 million instructions per second on one core).
//
// What it runs: the toy-machine lesson's online softmax (toymachine/traces/p5_online_softmax4.trace, Problem 5)
// and safe softmax (p4_safe_softmax3.trace, Problem 4) for n = 4096 on the built-in profiles,
// in numeric-only mode (Options{symbolic = false}: no expressions, no history). One sample runs
// the program `reps` times, each on a fresh Executor. The headline figure times Executor::run()
// only (the constructor has already decoded the program, as the assembler has already expanded
// it); the figure "with Executor construction" adds the constructor (decode, machine copy,
// initial DRAM; the program is moved in, as `flashlab run` does) to be honest about the whole cost. Medians over the samples; single-threaded.
//
// Usage: bench_toymachine [samples=15] [reps=20] [n=4096]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "flashlab/toymachine/assembler.hpp"
#include "flashlab/toymachine/executor.hpp"
#include "flashlab/toymachine/machine.hpp"

using namespace flashlab::toy;

namespace {

std::string read(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "error: cannot read %s\n", path.c_str());
    std::exit(1);
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The traces live in the source tree; CMake passes its absolute path (__FILE__ is not enough:
// with ccache's CCACHE_BASEDIR it is relative to the build folder, so the program found its
// traces only when started there).
std::string traces_dir() { return std::string(FLASHLAB_SOURCE_DIR) + "/toymachine/traces"; }

double bench(const char* label, const std::string& trace, const char* machine, int n, int samples, int reps) {
  const Machine m = builtin_machine(machine, n);
  const auto r = assemble(read(traces_dir() + "/" + trace), m, trace);
  if (!r.ok()) {
    for (const auto& d : r.diagnostics) std::fputs(format_diagnostic(d).c_str(), stderr);
    std::exit(1);
  }
  const Inputs in = random_inputs(m, 1);
  std::vector<double> rates, rates_with_setup;
  std::uint64_t checksum = 0;
  for (int s = 0; s < samples; ++s) {
    double seconds = 0.0, setup = 0.0;
    std::uint64_t instructions = 0;
    for (int k = 0; k < reps; ++k) {
      Program program = r.program;  // untimed: the CLI moves its freshly assembled program in
      const auto ts = std::chrono::steady_clock::now();
      Executor ex(std::move(program), m, in, Options{false, 0});  // decodes, fills DRAM
      const auto t0 = std::chrono::steady_clock::now();
      const auto fault = ex.run();
      const auto t1 = std::chrono::steady_clock::now();
      setup += std::chrono::duration<double>(t0 - ts).count();
      if (fault) {
        std::fputs(format_fault(*fault, trace).c_str(), stderr);
        std::exit(1);
      }
      seconds += std::chrono::duration<double>(t1 - t0).count();
      instructions += ex.state().counters.total_instructions();
      checksum += ex.state().counters.cycles;
    }
    rates.push_back(static_cast<double>(instructions) / seconds);
    rates_with_setup.push_back(static_cast<double>(instructions) / (seconds + setup));
  }
  std::sort(rates.begin(), rates.end());
  std::sort(rates_with_setup.begin(), rates_with_setup.end());
  const double median = rates[rates.size() / 2];
  std::printf("%-32s n=%-6d %7zu instructions/run  run(): median %6.1f M instr/s (min %.1f, max %.1f)"
              "  with Executor construction: %.1f M instr/s  [%d samples x %d runs; check %llu]\n",
              label, n, r.program.code.size(), median / 1e6, rates.front() / 1e6, rates.back() / 1e6,
              rates_with_setup[rates_with_setup.size() / 2] / 1e6, samples, reps, static_cast<unsigned long long>(checksum));
  return median;
}

}  // namespace

int main(int argc, char** argv) {
  const int samples = argc > 1 ? std::atoi(argv[1]) : 15;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 20;
  const int n = argc > 3 ? std::atoi(argv[3]) : 4096;
  if (samples < 1 || reps < 1 || n < 1 || n > 90000) {
    std::fprintf(stderr, "usage: bench_toymachine [samples>=1] [reps>=1] [n in 1..90000]\n");
    return 2;
  }
  std::printf("command: %s %d %d %d\n", argv[0], samples, reps, n);
  const double a = bench("online softmax (softmax4, P5)", "p5_online_softmax4.trace", "softmax4", n, samples, reps);
  const double b = bench("safe softmax (softmax3, P4)", "p4_safe_softmax3.trace", "softmax3", n, samples, reps);
  const double worst = std::min(a, b);
  std::printf("numeric-only executor: %.1f M instructions/s (the slower of the two medians); target >= 20: %s\n",
              worst / 1e6, worst >= 20e6 ? "met" : "NOT met");
  return 0;
}
