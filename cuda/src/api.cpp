// Host API (attention.hpp): reference tensors in, reference tensors out. Uploads the inputs,
// poisons every output with NaN, runs the kernels of one variant, checks every CUDA call and
// downloads the results. The launchers do the per-kernel validation.
#include "common.hpp"
// GCC 12 at -O2/-O3 reports a false -Wrestrict inside std::string operator+ when inlining
// ref::Shape::str() (GCC bug 105329); nothing here overlaps.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wrestrict"
#endif
#include "flashlab/cuda/attention.hpp"
#include "launchers.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

namespace flashlab::cuda {

using detail::DeviceBuffer;
using detail::Problem;

namespace {

void require_same(const char* name, const ref::Shape& got, const ref::Shape& want) {
  if (!(got == want))
    throw std::invalid_argument(std::string("flashlab::cuda: ") + name + " has shape " + got.str() + ", expected " +
                                want.str() + " (hint: Q, K, V, O, dO are all [B, N, H, d])");
}

int to_int(std::size_t v, const char* what) {
  if (v > std::size_t(1) << 30) throw std::invalid_argument(std::string("flashlab::cuda: ") + what + " is too large");
  return int(v);
}

Problem problem_of(const ref::Tensor<float>& Q, const Options& opt) {
  const auto& s = Q.shape();
  return detail::make_problem(to_int(s.batch, "batch"), to_int(s.seq, "SEQ"), to_int(s.heads, "HEAD_NUM"),
                              to_int(s.head_dim, "HEAD_DIM"), opt);
}

DeviceBuffer<float> upload(const ref::Tensor<float>& t) {
  DeviceBuffer<float> d(t.numel());
  d.upload(t.data());
  return d;
}

}  // namespace

ForwardResult attention_forward(ForwardVariant variant, const ref::Tensor<float>& Q, const ref::Tensor<float>& K,
                                const ref::Tensor<float>& V, const Options& opt) {
  require_same("K", K.shape(), Q.shape());
  require_same("V", V.shape(), Q.shape());
  const Problem p = problem_of(Q, opt);
  const std::size_t stats = std::size_t(p.batch) * p.heads * p.seq;
  DeviceBuffer<float> dQ = upload(Q), dK = upload(K), dV = upload(V);
  DeviceBuffer<float> dO(Q.numel()), dLSE(stats);
  dO.poison();
  dLSE.poison();

  switch (variant) {
    case ForwardVariant::naive: {
      DeviceBuffer<float> S(std::size_t(p.batch) * p.heads * std::size_t(p.seq) * p.seq);
      S.poison();
      detail::launch_naive_scores(p, dQ.get(), dK.get(), S.get());
      detail::launch_naive_softmax(p, S.get(), S.get(), dLSE.get());  // P overwrites S in place
      detail::launch_naive_pv(p, S.get(), dV.get(), dO.get());
      FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
      break;
    }
    case ForwardVariant::fa1: {
      DeviceBuffer<float> m(stats), l(stats);
      m.poison();
      l.poison();
      const int split = opt.fa1_query_split > 0 ? opt.fa1_query_split : detail::fa1_auto_split(p);
      detail::launch_fa1_forward(p, split, dQ.get(), dK.get(), dV.get(), dO.get(), m.get(), l.get(), dLSE.get());
      FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
      break;
    }
    case ForwardVariant::fa2:
      detail::launch_flash_forward(p, dQ.get(), dK.get(), dV.get(), dO.get(), dLSE.get());
      FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
      break;
  }
  ForwardResult out{ref::Tensor<float>(Q.shape()), std::vector<float>(stats)};
  dO.download(out.O.data());
  dLSE.download(out.LSE.data());
  return out;
}

BackwardResult attention_backward(BackwardVariant variant, const ref::Tensor<float>& Q, const ref::Tensor<float>& K,
                                  const ref::Tensor<float>& V, const ref::Tensor<float>& O,
                                  const ref::Tensor<float>& dO, const std::vector<float>& LSE, const Options& opt) {
  require_same("K", K.shape(), Q.shape());
  require_same("V", V.shape(), Q.shape());
  require_same("O", O.shape(), Q.shape());
  require_same("dO", dO.shape(), Q.shape());
  const Problem p = problem_of(Q, opt);
  const std::size_t stats = std::size_t(p.batch) * p.heads * p.seq;
  if (LSE.size() != stats)
    throw std::invalid_argument("flashlab::cuda: LSE has " + std::to_string(LSE.size()) + " elements, expected B*H*N = " +
                                std::to_string(stats) + " (hint: pass the LSE of the forward pass)");
  DeviceBuffer<float> q = upload(Q), k = upload(K), v = upload(V), o = upload(O), d_o = upload(dO);
  DeviceBuffer<float> lse(stats);
  lse.upload(LSE.data());
  DeviceBuffer<float> D(stats), dq(Q.numel()), dk(Q.numel()), dv(Q.numel());
  D.poison();
  dq.poison();
  dk.poison();
  dv.poison();

  detail::launch_bwd_preprocess(p, o.get(), d_o.get(), D.get());
  if (variant == BackwardVariant::two_kernel) {
    detail::launch_bwd_dq(p, q.get(), k.get(), v.get(), d_o.get(), lse.get(), D.get(), dq.get());
    detail::launch_bwd_dkdv(p, q.get(), k.get(), v.get(), d_o.get(), lse.get(), D.get(), dk.get(), dv.get());
  } else {
    detail::launch_zero_fill(p, dq.get());
    detail::launch_bwd_atomic(p, q.get(), k.get(), v.get(), d_o.get(), lse.get(), D.get(), dq.get(), dk.get(),
                              dv.get());
  }
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  BackwardResult out{ref::Tensor<float>(Q.shape()), ref::Tensor<float>(Q.shape()), ref::Tensor<float>(Q.shape()),
                     std::vector<float>(stats)};
  dq.download(out.dQ.data());
  dk.download(out.dK.data());
  dv.download(out.dV.data());
  D.download(out.D.data());
  return out;
}

}  // namespace flashlab::cuda
