// Main of the GPU tests: skips cleanly (exit 77, CTest's SKIP_RETURN_CODE) where no GPU is found.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "flashlab/cuda/options.hpp"

#include <iostream>
#include <string>

int main(int argc, char* argv[]) {
  std::string why;
  if (!flashlab::cuda::device_available(&why)) {
    std::cout << "SKIPPED: test_cuda needs a CUDA device: " << why
              << " (build here, run on the GPU machine: see docs/cuda.md)\n";
    return 77;
  }
  std::cout << "device: " << flashlab::cuda::device_description() << "\n";
  return Catch::Session().run(argc, argv);
}
