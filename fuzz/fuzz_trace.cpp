// libFuzzer target: the toy machine's trace front end and assembler, then a short numeric run
// and a few moves of the stepper's timeline. The first byte picks the machine and n; the rest
// is the trace. Anything may be rejected with diagnostics; nothing may crash, hang or throw.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "flashlab/toymachine/assembler.hpp"
#include "flashlab/toymachine/executor.hpp"
#include "flashlab/toymachine/machine.hpp"
#include "flashlab/toymachine/policy.hpp"
#include "flashlab/toymachine/timeline.hpp"

namespace toy = flashlab::toy;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  static const auto names = toy::builtin_machine_names();
  const std::uint8_t pick = data[0];
  const toy::Machine machine = toy::builtin_machine(names[pick % names.size()], 1 + (pick >> 4) % 8);
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  const auto assembled = toy::assemble(text, machine, "fuzz.trace");
  for (const auto& d : assembled.diagnostics) (void)toy::format_diagnostic(d);
  if (!assembled.ok()) return 0;
  // A small cycle cap keeps each input fast; the front end already capped the length.
  const toy::Inputs inputs = toy::random_inputs(machine, 1);
  toy::Executor run(assembled.program, machine, inputs, toy::Options{false, 20'000});
  if (const auto f = run.run()) (void)toy::format_fault(*f, "fuzz.trace");
  if (assembled.program.code.size() <= 2'000) {
    toy::Timeline tl(assembled.program, machine, inputs, toy::Options{true, 20'000});
    tl.run_to_end();
    tl.back();
    tl.go_to(tl.length() / 2);
    if (const auto hit = tl.find_line(1)) tl.go_to(hit->step);
  }
  return 0;
}
