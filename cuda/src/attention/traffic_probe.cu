// traffic_probe.cu — runs one attention algorithm's clear kernels under the one CUPTI probe
// (core/probe.hpp: L2 flushed before each measured kernel; traffic_probe.hpp). Inputs are
// generated on the device from a
// seeded hash (no host upload of hundreds of MB); the values are standard-normal-like. The fill and
// the flush are the recipe every probe shares (probe_kernels.hpp).
#include "flashlab/cuda/traffic_probe.hpp"

#include "core/common.hpp"
#include "attention/launchers.hpp"
#include "core/probe.hpp"
#include "core/probe_kernels.hpp"

#include <algorithm>
#include <cstring>
#include <functional>

namespace flashlab::cuda {

using detail::DeviceBuffer;

namespace {

void random_fill(DeviceBuffer<float>& b, unsigned long long seed) { detail::launch_random_fill(b.get(), b.size(), seed); }

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

}  // namespace flashlab::cuda
