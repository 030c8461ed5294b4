// Flags and checks shared by the commands that run GPU kernels: the `flashlab bench
// attention|mta|stream` sweeps and `mta`/`stream ... --device cuda`. One place for the
// --kernel fast|clear vocabulary, the --dtype bf16|fp16 check, the sweep lists and the refusals
// where nothing can run (no CUDA in the build, no usable GPU), so they read alike everywhere.
#pragma once

#include "core/cli.hpp"

#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

namespace flashlab::app {

/// What --kernel selects: the fast tensor-core kernels or the clear fp32 ones.
enum class KernelFamily { fast, clear };

/// The family a --kernel value names; anything but "fast" or "clear" is a UsageError naming
/// --kernel whose hint says which one is the default.
KernelFamily kernel_family(const std::string& value, KernelFamily default_family);

/// True for --dtype fp16, false for bf16 (the default); anything else is a UsageError naming --dtype.
bool fp16_dtype(const std::string& value);

/// A --bwd-kernel value checked: "auto" (the default: the fastest kernel the device runs), "mma",
/// "wgmma-ws" or "wgmma-ws-det" (the atomic backward design's kernels); anything else is a
/// UsageError naming --bwd-kernel.
std::string bwd_kernel_flag(const std::string& value);

/// A comma-separated sweep list flag ("1024,2048" → {1024, 2048}): cli.hpp's integer_list(),
/// each item in [lo, hi], as the ints the bench harnesses take.
std::vector<int> sweep_list(const char* flag, const std::string& text, long long lo, long long hi,
                            const char* example);

/// The value of an integer flag declared as po::value<long long>, checked to lie in [lo, hi].
int int_flag(const po::variables_map& vm, const char* flag, long long lo, long long hi);

/// The refusal of a build without CUDA: "this flashlab was built without CUDA (<what>)" with
/// the hint to rebuild with nvcc and run on a machine with an NVIDIA GPU, then "; or
/// <alternative>" when the command has one without the GPU (e.g. "use --device cpu").
UsageError built_without_cuda(std::string_view what, std::string_view alternative = {});

/// The value of --device in `args` ("--device X" or "--device=X"), "?" when the flag ends the
/// line, "" when it is absent: how a command that runs on two devices picks its path before parsing.
std::string device_flag(const Args& args);

/// `args` without --device and its value (what the CPU command, which has no such flag, parses).
Args without_device_flag(const Args& args);

/// The dispatch of a command that runs on two devices (`attention`, `mta`): --device cpu runs
/// `cpu` (the reference command) on `args` without the flag; --device cuda runs `cuda` on `args`
/// under guarded(`command`); any other value is a usage error naming --device.
int dispatch_device(const Args& args, std::string_view command, int (*cpu)(const Args&), int (*cuda)(const Args&));

/// Where a sweep writes its device and method lines: stderr with --json or --csv (`data`: stdout
/// then carries the document alone, a file for the comparison scripts), stdout otherwise.
std::ostream& info_stream(bool data);

/// Throws std::runtime_error "flashlab <command> needs a CUDA GPU, and none is usable: <why>"
/// with a hint when no GPU is usable (exit 1). Does nothing in a build without CUDA.
void require_gpu(std::string_view command);

}  // namespace flashlab::app
