// The measuring recipe every CUPTI traffic probe shares (internal): seeded inputs generated on
// the device and the L2 flush launched before each measured kernel, so that its counters start
// from a cold L2. One definition for the attention, MTA and any later probe.
#pragma once

#include <cstddef>

namespace flashlab::cuda::detail {

/// Names of the two flush kernels as CUPTI reports them, in launch order; every probe leaves
/// ranges whose kernel name starts with kL2FlushPrefix out of its results.
inline constexpr const char* kL2FlushWriteKernel = "l2_flush_write_kernel";
inline constexpr const char* kL2FlushReadKernel = "l2_flush_read_kernel";
inline constexpr const char* kL2FlushPrefix = "l2_flush_";

/// Seeded unit-variance random values written on the device: x[i] is a sum of 4 uniforms from a
/// 64-bit hash of (seed, i), so the same seed gives the same inputs on every run.
void launch_random_fill(float* x, std::size_t count, unsigned long long seed);
/// Evicts L2: writes then reads back `count` floats of `buf` (≫ L2), so the dirty lines of the
/// write are written back here and not during the measured kernel; `sink` keeps the reads alive.
void launch_l2_flush(float* buf, std::size_t count, float* sink);
/// The read half of launch_l2_flush alone: reads `count` floats of `buf` (≫ L2) through L2, so
/// every dirty line L2 held (a memset's, a kernel's outputs) is written back now and L2 is left
/// holding clean lines only; on the default stream, as the rest of this file.
void launch_l2_write_back(const float* buf, std::size_t count, float* sink);

}  // namespace flashlab::cuda::detail
