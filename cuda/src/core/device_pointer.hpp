// The one check of a device pointer argument (internal, host code): every family's front door
// asks it and throws its own error type with the answer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace flashlab::cuda::detail {

/// Why `ptr` cannot be a device argument that kernels read in `alignment`-byte pieces: "" when
/// it can, else "is null" or "is not N-byte aligned", followed by a hint. (cudaMalloc's pointers
/// are 256-byte aligned; a view into the middle of an array may not be.)
inline std::string device_pointer_problem(const void* ptr, std::size_t alignment) {
  if (ptr == nullptr) return "is null (hint: device memory of the documented layout)";
  if (reinterpret_cast<std::uintptr_t>(ptr) % alignment != 0)
    return "is not " + std::to_string(alignment) + "-byte aligned (hint: the kernels read whole " +
           std::to_string(alignment) + "-byte pieces; cudaMalloc's pointers are aligned)";
  return {};
}

}  // namespace flashlab::cuda::detail
