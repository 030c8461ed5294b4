// Device scratch for the partial results of the fast forwards that split their work (the tma-ws
// split tail, the split-KV forward) (internal). The forward's device entry takes no workspace, so
// the partials come from a stream-ordered pool of the library's own, one per device, that keeps
// its memory between launches: safe on concurrent streams (the pool orders reuse by the streams'
// own dependencies), nothing mapped again after the first launches (the default pool gives its
// memory back at every synchronisation). Under stream capture the allocation becomes a node of
// the graph, which owns its memory: the device's default pool serves then, and no pool is created
// while capturing.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace flashlab::cuda::detail {

/// `bytes` of device memory ordered on `stream` (cudaMallocFromPoolAsync, or cudaMallocAsync under
/// capture); release it with free_partials() on the same stream after its last use.
void* allocate_partials(std::size_t bytes, cudaStream_t stream);

/// Returns memory from allocate_partials() to its pool, ordered after the work already on `stream`.
void free_partials(void* ptr, cudaStream_t stream);

}  // namespace flashlab::cuda::detail
