// The one CUPTI traffic probe of every family (internal): the measuring recipe of profiler.hpp
// applied to a launch sequence, its L2 flush and the pairing of CUPTI's ranges with the kernels.
#pragma once

#include "flashlab/cuda/profiler.hpp"

#include <cstddef>
#include <functional>

namespace flashlab::cuda::detail {

/// Runs `launches` once per metric of RangeProfiler::all_metrics(), one profiling session each
/// (a single replay pass, so every kernel runs exactly once per session), with L2 flushed right
/// before every kernel the launches announce (common.hpp: the launch hook; a `flush_bytes` buffer
/// written then read back, probe_kernels.hpp), and returns one entry per announced kernel, in
/// launch order, its counters summed over the sessions (the flush kernels left out). `launches`
/// must be idempotent (each session repeats it), launch on the default stream and synchronise
/// nothing. A metric the device refuses is listed in ProbeResult::unavailable (its counters stay
/// 0), or throws CudaError when `require_every_metric`. Throws std::invalid_argument for a flush
/// below 64 MiB (it cannot flush a 50 MB L2), CudaError when CUPTI's ranges do not pair with the
/// announced kernels one to one.
ProbeResult probe_kernels(const std::function<void()>& launches, std::size_t flush_bytes,
                          bool require_every_metric = false);

}  // namespace flashlab::cuda::detail
