// The shared flags and refusals of the GPU commands (gpu_flags.hpp).
#include "core/gpu_flags.hpp"

#ifdef FLASHLAB_HAVE_CUDA
#include "flashlab/cuda/options.hpp"
#endif

#include <iostream>
#include <stdexcept>

namespace flashlab::app {

KernelFamily kernel_family(const std::string& value, KernelFamily default_family) {
  if (value == "fast") return KernelFamily::fast;
  if (value == "clear") return KernelFamily::clear;
  throw UsageError("--kernel '" + value + "' is unknown", default_family == KernelFamily::fast
                                                              ? "choose fast (the default) or clear"
                                                              : "choose clear (the default) or fast");
}

bool fp16_dtype(const std::string& value) {
  if (value != "bf16" && value != "fp16")
    throw UsageError("--dtype '" + value + "' is unknown", "choose bf16 (the default) or fp16");
  return value == "fp16";
}

std::string bwd_kernel_flag(const std::string& value) {
  if (value != "auto" && value != "mma" && value != "wgmma-ws" && value != "wgmma-ws-det")
    throw UsageError("--bwd-kernel '" + value + "' is unknown", "choose auto (the default), mma, wgmma-ws or wgmma-ws-det");
  return value;
}

std::vector<int> sweep_list(const char* flag, const std::string& text, long long lo, long long hi,
                            const char* example) {
  const auto v = integer_list(flag, text, lo, hi, example);
  return {v.begin(), v.end()};
}

int int_flag(const po::variables_map& vm, const char* flag, long long lo, long long hi) {
  require_range(flag, vm[flag].as<long long>(), lo, hi);
  return int(vm[flag].as<long long>());
}

UsageError built_without_cuda(std::string_view what, std::string_view alternative) {
  std::string hint =
      "rebuild with nvcc present (cmake --preset cuda, FLASHLAB_ENABLE_CUDA=ON) and run on a machine with an NVIDIA GPU";
  if (!alternative.empty()) hint += "; or " + std::string(alternative);
  return UsageError("this flashlab was built without CUDA (" + std::string(what) + ")", hint);
}

std::string device_flag(const Args& args) {
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--device") return i + 1 < args.size() ? args[i + 1] : std::string("?");
    if (args[i].rfind("--device=", 0) == 0) return args[i].substr(9);
  }
  return "";
}

Args without_device_flag(const Args& args) {
  Args out;
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--device") ++i;
    else if (args[i].rfind("--device=", 0) != 0) out.push_back(args[i]);
  }
  return out;
}

int dispatch_device(const Args& args, std::string_view command, int (*cpu)(const Args&), int (*cuda)(const Args&)) {
  const std::string device = device_flag(args);
  if (device == "cpu") return cpu(without_device_flag(args));
  return guarded(command, [&]() -> int {
    if (device != "cuda") throw UsageError("--device '" + device + "' is unknown", "choose cpu or cuda");
    return cuda(args);
  });
}

std::ostream& info_stream(bool data) { return data ? std::cerr : std::cout; }

void require_gpu([[maybe_unused]] std::string_view command) {
#ifdef FLASHLAB_HAVE_CUDA
  std::string why;
  if (!flashlab::cuda::device_available(&why))
    throw std::runtime_error("flashlab " + std::string(command) + " needs a CUDA GPU, and none is usable: " + why +
                             "\nhint: run it on a machine with an NVIDIA GPU and driver (nvidia-smi lists it)");
#endif
}

}  // namespace flashlab::app
