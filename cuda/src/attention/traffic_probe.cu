// traffic_probe.cu — runs one attention algorithm's clear kernels under the one CUPTI probe
// (core/probe.hpp: L2 flushed before each measured kernel; traffic_probe.hpp). Inputs are
// generated on the device from a
// seeded hash (no host upload of hundreds of MB); the values are standard-normal-like. The fill and
// the flush are the recipe every probe shares (probe_kernels.hpp).
#include "flashlab/cuda/traffic_probe.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "flashlab/cuda/fast_attention.hpp"

#include "core/common.hpp"
#include "attention/launchers.hpp"
#include "core/probe.hpp"
#include "core/probe_kernels.hpp"

#include <algorithm>
#include <cstring>
#include <cstdint>
#include <functional>

namespace flashlab::cuda {

using detail::DeviceBuffer;

namespace {

void random_fill(DeviceBuffer<float>& b, unsigned long long seed) { detail::launch_random_fill(b.get(), b.size(), seed); }

__global__ void round_to_16bit(const float* in, std::uint16_t* out, std::size_t count, bool bf16) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < count; i += std::size_t(gridDim.x) * blockDim.x)
    out[i] = bf16 ? __nv_bfloat16_raw(__float2bfloat16_rn(in[i])).x : __half_raw(__float2half_rn(in[i])).x;
}

// The fast kernels' inputs: the clear kernels' seeded values, rounded to the problem's 16-bit type.
DeviceBuffer<std::uint16_t> random_16bit(std::size_t count, unsigned long long seed, bool bf16) {
  DeviceBuffer<float> values(count);
  random_fill(values, seed);
  DeviceBuffer<std::uint16_t> out(count);
  round_to_16bit<<<1024, 256>>>(values.get(), out.get(), count, bf16);
  FLASHLAB_CUDA_CHECK(cudaGetLastError());
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  return out;
}

}  // namespace

int fa1_query_split_for(const ProbeConfig& cfg) {
  check_clear_problem(ref::Algorithm::fa1_fwd, cfg.problem);
  const detail::Problem p = detail::make_problem(cfg.problem).with_tiles(int(cfg.problem.Br), int(cfg.problem.Bc));
  const int split = cfg.fa1_query_split > 0 ? cfg.fa1_query_split : detail::fa1_auto_split(p);
  // The launcher rounds to whole query-tile ranges; report the number of blocks it launches.
  const int Tr = p.Tr();
  const int per = (Tr + std::clamp(split, 1, Tr) - 1) / std::clamp(split, 1, Tr);
  return (Tr + per - 1) / per;
}

ProbeResult measure_attention(ref::Algorithm algorithm, const ProbeConfig& cfg) {
  check_clear_problem(algorithm, cfg.problem);
  const detail::Problem p = detail::make_problem(cfg.problem).with_tiles(int(cfg.problem.Br), int(cfg.problem.Bc));
  if (cfg.flush_bytes < (std::size_t(64) << 20))  // before any allocation (probe_kernels checks it too)
    throw std::invalid_argument("flashlab::cuda: flush buffer of " + std::to_string(cfg.flush_bytes) +
                                " bytes is too small to flush a 50 MB L2 (hint: use >= 128 MiB)");
  const std::size_t numel = std::size_t(p.batch) * p.seq * p.row_stride();
  const std::size_t stats = std::size_t(p.batch) * p.heads * p.seq;

  DeviceBuffer<float> Q(numel), K(numel), V(numel), O(numel), LSE(stats);
  random_fill(Q, cfg.seed * 4 + 0);
  random_fill(K, cfg.seed * 4 + 1);
  random_fill(V, cfg.seed * 4 + 2);
  ProbeResult result;
  // Buffers every algorithm may need (allocated only when used), then the launch sequence.
  DeviceBuffer<float> S, m, l, dO, D, dQ, dK, dV;
  std::function<void()> launches;
  switch (algorithm) {
    case ref::Algorithm::naive_fwd:
      S = DeviceBuffer<float>(std::size_t(p.batch) * p.heads * std::size_t(p.seq) * p.seq);
      launches = [&] {
        detail::launch_naive_scores(p, Q.get(), K.get(), S.get());
        detail::launch_naive_softmax(p, S.get(), S.get(), LSE.get());  // P overwrites S in place
        detail::launch_naive_pv(p, S.get(), V.get(), O.get());
      };
      break;
    case ref::Algorithm::fa1_fwd:
      m = DeviceBuffer<float>(stats);
      l = DeviceBuffer<float>(stats);
      result.fa1_query_split = fa1_query_split_for(cfg);
      launches = [&] {
        detail::launch_fa1_forward(p, result.fa1_query_split, Q.get(), K.get(), V.get(), O.get(), m.get(), l.get(),
                                   LSE.get());
      };
      break;
    case ref::Algorithm::fa2_fwd:
      launches = [&] { detail::launch_flash_forward(p, Q.get(), K.get(), V.get(), O.get(), LSE.get()); };
      break;
    case ref::Algorithm::bwd_two_kernel:
    case ref::Algorithm::bwd_atomic:
      dO = DeviceBuffer<float>(numel);
      D = DeviceBuffer<float>(stats);
      dQ = DeviceBuffer<float>(numel);
      dK = DeviceBuffer<float>(numel);
      dV = DeviceBuffer<float>(numel);
      random_fill(dO, cfg.seed * 4 + 3);
      detail::launch_flash_forward(p, Q.get(), K.get(), V.get(), O.get(), LSE.get());  // O, LSE (not measured)
      FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
      launches = [&] {
        detail::launch_bwd_preprocess(p, O.get(), dO.get(), D.get());
        if (algorithm == ref::Algorithm::bwd_two_kernel) {
          detail::launch_bwd_dq(p, Q.get(), K.get(), V.get(), dO.get(), LSE.get(), D.get(), dQ.get());
          detail::launch_bwd_dkdv(p, Q.get(), K.get(), V.get(), dO.get(), LSE.get(), D.get(), dK.get(), dV.get());
        } else {
          detail::launch_zero_fill(p, dQ.get());  // the atomic kernel only adds into dQ
          detail::launch_bwd_atomic(p, Q.get(), K.get(), V.get(), dO.get(), LSE.get(), D.get(), dQ.get(), dK.get(),
                                    dV.get());
        }
      };
      break;
    case ref::Algorithm::naive_bwd:
      break;  // refused by check_clear_problem
  }
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());

  // The launch sequences are idempotent (every output is overwritten; atomic dQ is zeroed first).
  ProbeResult measured = detail::probe_kernels(launches, cfg.flush_bytes);
  measured.fa1_query_split = result.fa1_query_split;
  return measured;
}

ProbeResult measure_fast_forward(const ref::AttentionProblem& problem, unsigned long long seed, std::size_t flush_bytes) {
  check_fast_problem(problem);
  if (flush_bytes < (std::size_t(64) << 20))
    throw std::invalid_argument("flashlab::cuda: flush buffer of " + std::to_string(flush_bytes) +
                                " bytes is too small to flush a 50 MB L2 (hint: use >= 128 MiB)");
  const bool bf16 = problem.dtype == ref::Dtype::bf16;
  const std::size_t q_numel = problem.batch * problem.n_q() * problem.heads * problem.head_dim;
  const std::size_t kv_numel = problem.batch * problem.n_k() * problem.h_kv() * problem.head_dim;
  const auto Q = random_16bit(q_numel, seed * 4 + 0, bf16), K = random_16bit(kv_numel, seed * 4 + 1, bf16),
             V = random_16bit(kv_numel, seed * 4 + 2, bf16);
  DeviceBuffer<std::uint16_t> O(q_numel);
  DeviceBuffer<float> LSE(problem.batch * problem.heads * problem.n_q());
  const FastForwardKernel kernel = fastest_forward_kernel(problem);
  // Idempotent: O and LSE are overwritten in full by every run.
  return detail::probe_kernels(
      [&] { fast_attention_forward_device(problem, kernel, Q.get(), K.get(), V.get(), O.get(), LSE.get(), nullptr); },
      flush_bytes);
}

}  // namespace flashlab::cuda
