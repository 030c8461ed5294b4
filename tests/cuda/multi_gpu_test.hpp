// What the GPU tests that need several GPUs share (their own executables, one process driving the
// machine's GPUs): the GPU count, one LocalRing per G for the whole run, and the main that skips
// (exit 77, "SKIPPED" said plainly) on a machine of fewer than 2 GPUs.
#pragma once

#include <catch2/catch.hpp>

#include "flashlab/cuda/context_parallel.hpp"
#include "flashlab/cuda/options.hpp"

#include <cuda_runtime.h>

#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <vector>

namespace flashlab::test {

/// The GPUs CUDA sees (0 where it sees none).
inline int device_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

/// GPUs 0 … G − 1 as one LocalRing, made once per G for the whole run (communicators take a while).
inline const cuda::LocalRing& ring_of(int G) {
  static std::map<int, std::unique_ptr<cuda::LocalRing>> rings;
  auto& r = rings[G];
  if (!r) {
    std::vector<int> devices;
    for (int d = 0; d < G; ++d) devices.push_back(d);
    r = std::make_unique<cuda::LocalRing>(devices);
  }
  return *r;
}

/// The main of a multi-GPU test executable `name`: NVLink multicast off unless the caller set it,
/// exit 77 with "SKIPPED" below 2 GPUs (`machines`: the machines it is meant for), else Catch2.
inline int multi_gpu_test_main(const char* name, const char* machines, int argc, char* argv[]) {
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  std::string why;
  if (!cuda::device_available(&why)) {
    std::cout << "SKIPPED: " << name << " needs CUDA GPUs: " << why << "\n";
    return 77;
  }
  if (device_count() < 2) {
    std::cout << "SKIPPED: " << name << " needs at least 2 GPUs, this machine has " << device_count()
              << " (run it on a machine of " << machines << ")\n";
    return 77;
  }
  std::cout << "device: " << cuda::device_description() << " x " << device_count() << "\n";
  return Catch::Session().run(argc, argv);
}

}  // namespace flashlab::test
