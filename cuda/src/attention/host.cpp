// Host-vector entries of the attention family (attention.hpp, fast_attention.hpp): thin wrappers
// for the tests and the CLI over the front door (front_door.cpp). Each checks the problem there,
// uploads the inputs, poisons every output with NaN (an element a kernel forgets to write fails
// every comparison), runs the kernels, synchronises and downloads the results.
#include "core/common.hpp"
// GCC 12 at -O2/-O3 reports a false -Wrestrict inside std::string operator+ when inlining
// ref::Shape::str() (GCC bug 105329); nothing here overlaps.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wrestrict"
#endif
#include "flashlab/cuda/attention.hpp"
#include "flashlab/cuda/fast_attention.hpp"
#include "attention/front_door.hpp"
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

/// Host 16-bit tensors of `numel` elements each, uploaded; a wrong size names the tensor.
template <typename T>
DeviceBuffer<T> upload_checked(const char* name, const std::vector<T>& x, std::size_t numel, const char* layout) {
  if (x.size() != numel)
    throw std::invalid_argument(std::string("flashlab::cuda: ") + name + " has " + std::to_string(x.size()) +
                                " elements, expected " + std::to_string(numel) + " (hint: " + layout + ")");
  DeviceBuffer<T> d(numel);
  d.upload(x.data());
  return d;
}

/// The prefix sums of a packed problem uploaded (they live while this does), and their view.
struct UploadedLists {
  DeviceBuffer<std::int32_t> cu_q, cu_k;
  explicit UploadedLists(const ref::AttentionProblem& problem)
      : cu_q(upload_checked("cu_seqlens_q", problem.packed->cu_seqlens_q(), problem.batch + 1, "B + 1 prefix sums")),
        cu_k(upload_checked("cu_seqlens_k", problem.packed->cu_seqlens_k(), problem.batch + 1, "B + 1 prefix sums")) {}
  FastPackedSequences view(const ref::AttentionProblem& problem) const {
    return {cu_q.get(), cu_k.get(), problem.packed->total_q(), problem.packed->total_k()};
  }
};

}  // namespace

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

FastForwardResult fast_attention_forward(const ref::AttentionProblem& problem, FastForwardKernel kernel,
                                         const std::vector<std::uint16_t>& Q, const std::vector<std::uint16_t>& K,
                                         const std::vector<std::uint16_t>& V) {
  check_fast_problem(problem);
  // Packed: [1, total_q, H, d] and [1, total_k, H_kv, d] (q_shape, kv_shape), the lists uploaded.
  const std::size_t numel = problem.q_shape().numel(), kv_numel = problem.kv_shape().numel();
  const std::size_t stats = problem.stat_numel();
  const char* layout = problem.is_packed() ? "Q is [1, total_q, H, d], K and V are [1, total_k, H_kv, d]"
                                           : "Q is [B, N, H, d], K and V are [B, N_k, H_kv, d]";
  DeviceBuffer<std::uint16_t> dQ = upload_checked("Q", Q, numel, layout),
                              dK = upload_checked("K", K, kv_numel, layout),
                              dV = upload_checked("V", V, kv_numel, layout), dO(numel);
  DeviceBuffer<float> dLSE(stats);
  dO.poison();  // 0xFFFF is a NaN in bf16 and fp16 alike
  dLSE.poison();
  if (problem.is_packed()) {
    const UploadedLists lists(problem);
    fast_attention_forward_device(problem, lists.view(problem), kernel, dQ.get(), dK.get(), dV.get(), dO.get(), dLSE.get(),
                                  nullptr);
    FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());  // before the lists' buffers go
  } else {
    fast_attention_forward_device(problem, kernel, dQ.get(), dK.get(), dV.get(), dO.get(), dLSE.get(), nullptr);
  }
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  FastForwardResult r;
  r.O.resize(numel);
  r.LSE.resize(stats);
  dO.download(r.O.data());
  dLSE.download(r.LSE.data());
  return r;
}

FastBackwardResult fast_attention_backward(ref::Algorithm design, const ref::AttentionProblem& problem,
                                           const std::vector<std::uint16_t>& Q,
                                           const std::vector<std::uint16_t>& K, const std::vector<std::uint16_t>& V,
                                           const std::vector<std::uint16_t>& O, const std::vector<std::uint16_t>& dO,
                                           const std::vector<float>& LSE, FastBackwardKernel kernel) {
  detail::check_fast_backward(design, problem, kernel);  // before the sizes: the front door's messages
  const std::size_t ws_bytes = fast_attention_backward_workspace_bytes(design, problem);
  // Packed: [1, total_q, H, d] and [1, total_k, H_kv, d] (q_shape, kv_shape), the lists uploaded.
  const std::size_t numel = problem.q_shape().numel(), kv_numel = problem.kv_shape().numel();
  const std::size_t stats = problem.stat_numel();
  const char* kLayout = problem.is_packed() ? "Q, O, dO are [1, total_q, H, d], K and V are [1, total_k, H_kv, d]"
                                            : "Q, O, dO are [B, N, H, d], K and V are [B, N_k, H_kv, d]";
  DeviceBuffer<std::uint16_t> bQ = upload_checked("Q", Q, numel, kLayout), bK = upload_checked("K", K, kv_numel, kLayout),
                              bV = upload_checked("V", V, kv_numel, kLayout), bO = upload_checked("O", O, numel, kLayout),
                              bdO = upload_checked("dO", dO, numel, kLayout);
  DeviceBuffer<float> bLSE =
      upload_checked("LSE", LSE, stats, problem.is_packed() ? "LSE is [1, H, total_q]" : "LSE is [B, H, N]");
  DeviceBuffer<std::uint16_t> bdQ(numel), bdK(kv_numel), bdV(kv_numel);
  DeviceBuffer<unsigned char> bws(ws_bytes);
  bdQ.poison();  // 0xFFFF is a NaN in bf16 and fp16 alike; 0xFFFFFFFF in fp32
  bdK.poison();
  bdV.poison();
  bws.poison();  // D and (atomic) the dQ accumulator: NaN unless the kernels write/zero them
  if (problem.is_packed()) {
    const UploadedLists lists(problem);
    fast_attention_backward_device(design, problem, lists.view(problem), bQ.get(), bK.get(), bV.get(), bO.get(), bdO.get(),
                                   bLSE.get(), bdQ.get(), bdK.get(), bdV.get(), bws.get(), nullptr, kernel);
    FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());  // before the lists' buffers go
  } else {
    fast_attention_backward_device(design, problem, bQ.get(), bK.get(), bV.get(), bO.get(), bdO.get(), bLSE.get(),
                                   bdQ.get(), bdK.get(), bdV.get(), bws.get(), nullptr, kernel);
  }
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  FastBackwardResult r;
  r.dQ.resize(numel);
  r.dK.resize(kv_numel);
  r.dV.resize(kv_numel);
  r.D.resize(stats);
  bdQ.download(r.dQ.data());
  bdK.download(r.dK.data());
  bdV.download(r.dV.data());
  FLASHLAB_CUDA_CHECK(cudaMemcpy(r.D.data(), bws.get(), stats * sizeof(float), cudaMemcpyDeviceToHost));
  return r;
}

}  // namespace flashlab::cuda
