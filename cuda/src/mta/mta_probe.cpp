// The MTA traffic probe (mta.hpp, measure): one pass of the clear MTA kernels on seeded device
// inputs under the one CUPTI probe of every family (core/probe.hpp: L2 flushed before every
// measured kernel, one metric per profiling session).
#include "core/common.hpp"
// GCC 12 at -O2/-O3 reports a false -Wrestrict inside std::string operator+ (GCC bug 105329).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wrestrict"
#endif
#include "flashlab/cuda/mta.hpp"
#include "flashlab/cuda/profiler.hpp"
#include "mta/front_door.hpp"
#include "core/probe.hpp"
#include "core/probe_kernels.hpp"

#include <algorithm>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace flashlab::cuda::mta {

namespace dm = detail::mta;
using detail::DeviceBuffer;

ProbeResult measure(Pass pass, const ProbeConfig& cfg) {
  const ref::Shape& sh = cfg.shape;
  const ref::mta::Params& p = cfg.params;
  if (pass == Pass::infer && p.cq > ref::mta::kInferQueryRows)
    throw std::invalid_argument("flashlab::cuda::mta: inference needs cq <= 16 (the 16-row query tile)");
  if (cfg.flush_bytes < (std::size_t(64) << 20))
    throw std::invalid_argument("flashlab::cuda::mta: a flush buffer of " + std::to_string(cfg.flush_bytes) +
                                " bytes cannot flush a 50 MB L2 (hint: use >= 128 MiB)");
  if (sh.batch < 1 || sh.seq < 1 || sh.heads < 1 || sh.head_dim < 1)
    throw std::invalid_argument("flashlab::cuda::mta: empty shape " + sh.str());
  const dm::Launch F = dm::make_launch(sh, p, false);
  const dm::Launch Bw = pass == Pass::backward ? dm::make_launch(sh, p, true) : F;
  const std::size_t numel = sh.numel(), stats = sh.batch * sh.heads * sh.seq, taps = sh.heads * p.cq * p.ck;

  DeviceBuffer<float> Q(numel), K(numel), V(numel), W(taps), O(numel), M(stats), L(stats);
  detail::launch_random_fill(Q.get(), numel, cfg.seed * 8 + 0);
  detail::launch_random_fill(K.get(), numel, cfg.seed * 8 + 1);
  detail::launch_random_fill(V.get(), numel, cfg.seed * 8 + 2);
  detail::launch_random_fill(W.get(), taps, cfg.seed * 8 + 3);

  DeviceBuffer<float> dO, D, dQ, dK, dV, dW, O_s, M_s, L_s;
  std::function<void()> launches;
  switch (pass) {
    case Pass::forward:
      launches = [&] {
        dm::launch_zero_fill(O.get(), numel);
        dm::launch_forward(F, Q.get(), K.get(), V.get(), W.get(), O.get(), M.get(), L.get());
      };
      break;
    case Pass::backward:
      dO = DeviceBuffer<float>(numel);
      D = DeviceBuffer<float>(stats);
      dQ = DeviceBuffer<float>(numel);
      dK = DeviceBuffer<float>(numel);
      dV = DeviceBuffer<float>(numel);
      dW = DeviceBuffer<float>(taps);
      detail::launch_random_fill(dO.get(), numel, cfg.seed * 8 + 4);
      dm::launch_zero_fill(O.get(), numel);  // the forward for O, M, L (not measured)
      dm::launch_forward(F, Q.get(), K.get(), V.get(), W.get(), O.get(), M.get(), L.get());
      launches = [&] {
        dm::launch_bwd_preprocess(Bw, O.get(), dO.get(), D.get());
        dm::launch_zero_fill(dW.get(), taps);
        dm::launch_bwd_dq_dw(Bw, Q.get(), K.get(), V.get(), W.get(), dO.get(), M.get(), L.get(), D.get(), dQ.get(),
                             dW.get());
        dm::launch_bwd_dk_dv(Bw, Q.get(), K.get(), V.get(), W.get(), dO.get(), M.get(), L.get(), D.get(), dK.get(),
                             dV.get());
      };
      break;
    case Pass::infer: {
      const std::size_t parts = sh.batch * sh.heads * p.splits;
      if (p.splits > 1) {
        O_s = DeviceBuffer<float>(parts * sh.head_dim);
        M_s = DeviceBuffer<float>(parts);
        L_s = DeviceBuffer<float>(parts);
      }
      launches = [&] {
        dm::launch_infer_split(F, Q.get(), K.get(), V.get(), W.get(), O.get(), O_s.get(), M_s.get(), L_s.get());
        if (p.splits > 1) dm::launch_infer_combine(F, O_s.get(), M_s.get(), L_s.get(), O.get());
      };
      break;
    }
  }
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  // Every launch sequence is idempotent (each output is rewritten; O and dW are zeroed first).
  return detail::probe_kernels(launches, cfg.flush_bytes);
}

}  // namespace flashlab::cuda::mta
