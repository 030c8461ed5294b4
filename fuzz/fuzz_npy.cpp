// Fuzz target: the .npy reader (reference/src/core/npy.cpp) on arbitrary bytes as a whole file.
// Every input must end in an array or an NpyError; anything else (a crash, a sanitizer report,
// bad_alloc, another exception) is a bug. The 1 MiB limit stands in for the memory limit, so a
// header may declare any size without the fuzzer allocating it.
#include "flashlab/reference/npy.hpp"

#include <cstdint>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace flashlab::ref;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  try {
    const NpyArray a = parse_npy(bytes, "fuzz.npy", std::uint64_t{1} << 20);
    const auto values = a.as_double();
    if (values.size() != a.numel()) __builtin_trap();
    if (a.descr != "<f4" && a.descr != "<f8" && a.as_int64().size() != a.numel()) __builtin_trap();
  } catch (const NpyError&) {
    // A refusal with a message: the expected outcome for a malformed file.
  }
  return 0;
}
