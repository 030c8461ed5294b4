// Host API of the clear kernels (attention.hpp): reference tensors in, reference tensors out.
// check_clear_problem() is the one place that states their limits; then each call uploads the
// inputs, poisons every output with NaN, runs the kernels of one algorithm, checks every CUDA
// call and downloads the results.
#include "core/common.hpp"
// GCC 12 at -O2/-O3 reports a false -Wrestrict inside std::string operator+ when inlining
// ref::Shape::str() (GCC bug 105329); nothing here overlaps.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wrestrict"
#endif
#include "flashlab/cuda/attention.hpp"
#include "attention/launchers.hpp"

#include <stdexcept>
#include <string>

namespace flashlab::cuda {

using detail::DeviceBuffer;
using detail::Problem;

namespace {

[[noreturn]] void reject(const std::string& field, const std::string& value, const std::string& limit,
                         const std::string& hint) {
  throw std::invalid_argument("flashlab::cuda: clear kernels: " + field + " = " + value + " " + limit +
                              " (hint: " + hint + ")");
}

void require_same(const char* name, const ref::Shape& got, const ref::Shape& want) {
  if (!(got == want))
    throw std::invalid_argument(std::string("flashlab::cuda: ") + name + " has shape " + got.str() + ", expected " +
                                want.str() + " (hint: Q, K, V, O, dO are all the problem's [B, N, H, d])");
}

DeviceBuffer<float> upload(const ref::Tensor<float>& t) {
  DeviceBuffer<float> d(t.numel());
  d.upload(t.data());
  return d;
}

}  // namespace

void check_clear_problem(ref::Algorithm algorithm, const ref::AttentionProblem& problem) {
  problem.validate();
  if (const std::string feature = problem.extended_feature(); !feature.empty())
    throw std::invalid_argument("flashlab::cuda: clear kernels: " + feature +
                                " is not supported yet (hint: the CPU reference supports it: flashlab attention fwd|bwd)");
  if (algorithm == ref::Algorithm::naive_bwd)
    reject("algorithm", "naive_bwd", "has no CUDA kernels", "use bwd_two_kernel or bwd_atomic");
  if (problem.dtype != ref::Dtype::fp32)
    reject("dtype", std::string(ref::dtype_name(problem.dtype)), "is not fp32",
           "the clear kernels compute in fp32 on CUDA cores; bf16/fp16 run on the fast kernels");
  if (problem.n_k() != problem.n_q())
    reject("seq_k (N_k)", std::to_string(problem.n_k()), "differs from N = " + std::to_string(problem.n_q()),
           "the CUDA kernels are self-attention");
  if (problem.head_dim > kClearMaxHeadDim)
    reject("head_dim (d)", std::to_string(problem.head_dim), "is above 256", "the kernels keep whole rows of d in SRAM");
  if (problem.Br > kClearMaxTileRows)
    reject("Br", std::to_string(problem.Br), "is above 128", "one thread per tile row; try 64");
  if (problem.Bc > kClearMaxTileRows)
    reject("Bc", std::to_string(problem.Bc), "is above 128", "one thread per tile row; try 64");
  if (algorithm == ref::Algorithm::naive_fwd && problem.seq > std::size_t(detail::naive_max_seq()))
    reject("seq (N)", std::to_string(problem.seq), "is above " + std::to_string(detail::naive_max_seq()),
           "the naive softmax holds one row of S in shared memory; use fa2_fwd");
}

ForwardResult attention_forward(ref::Algorithm algorithm, const ref::AttentionProblem& problem,
                                const ref::Tensor<float>& Q, const ref::Tensor<float>& K,
                                const ref::Tensor<float>& V, int fa1_query_split) {
  check_clear_problem(algorithm, problem);
  if (ref::is_backward(algorithm))
    reject("algorithm", std::string(ref::algorithm_name(algorithm)), "is a backward design",
           "attention_forward runs naive_fwd, fa1_fwd or fa2_fwd");
  require_same("Q", Q.shape(), problem.q_shape());
  require_same("K", K.shape(), problem.kv_shape());
  require_same("V", V.shape(), problem.kv_shape());
  const Problem p = detail::make_problem(problem).with_tiles(int(problem.Br), int(problem.Bc));
  const std::size_t stats = problem.stat_numel();
  DeviceBuffer<float> dQ = upload(Q), dK = upload(K), dV = upload(V);
  DeviceBuffer<float> dO(Q.numel()), dLSE(stats);
  dO.poison();
  dLSE.poison();

  if (algorithm == ref::Algorithm::naive_fwd) {
    DeviceBuffer<float> S(std::size_t(p.batch) * p.heads * std::size_t(p.seq) * p.seq);
    S.poison();
    detail::launch_naive_scores(p, dQ.get(), dK.get(), S.get());
    detail::launch_naive_softmax(p, S.get(), S.get(), dLSE.get());  // P overwrites S in place
    detail::launch_naive_pv(p, S.get(), dV.get(), dO.get());
  } else if (algorithm == ref::Algorithm::fa1_fwd) {
    DeviceBuffer<float> m(stats), l(stats);
    m.poison();
    l.poison();
    const int split = fa1_query_split > 0 ? fa1_query_split : detail::fa1_auto_split(p);
    detail::launch_fa1_forward(p, split, dQ.get(), dK.get(), dV.get(), dO.get(), m.get(), l.get(), dLSE.get());
  } else {
    detail::launch_flash_forward(p, dQ.get(), dK.get(), dV.get(), dO.get(), dLSE.get());
  }
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  ForwardResult out{ref::Tensor<float>(Q.shape()), std::vector<float>(stats)};
  dO.download(out.O.data());
  dLSE.download(out.LSE.data());
  return out;
}

BackwardResult attention_backward(ref::Algorithm algorithm, const ref::AttentionProblem& problem,
                                  const ref::Tensor<float>& Q, const ref::Tensor<float>& K,
                                  const ref::Tensor<float>& V, const ref::Tensor<float>& O,
                                  const ref::Tensor<float>& dO, const std::vector<float>& LSE) {
  check_clear_problem(algorithm, problem);
  if (!ref::is_backward(algorithm))
    reject("algorithm", std::string(ref::algorithm_name(algorithm)), "is a forward loop order",
           "attention_backward runs bwd_two_kernel or bwd_atomic");
  require_same("Q", Q.shape(), problem.q_shape());
  require_same("K", K.shape(), problem.kv_shape());
  require_same("V", V.shape(), problem.kv_shape());
  require_same("O", O.shape(), problem.q_shape());
  require_same("dO", dO.shape(), problem.q_shape());
  const Problem p = detail::make_problem(problem).with_tiles(int(problem.Br), int(problem.Bc));
  const std::size_t stats = problem.stat_numel();
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
  if (algorithm == ref::Algorithm::bwd_two_kernel) {
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
