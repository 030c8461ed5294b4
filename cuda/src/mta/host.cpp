// Host-tensor entries of the Multi-Token Attention family (mta.hpp, mta_fast.hpp,
// mta_fast_backward.hpp): thin wrappers for the tests and the CLI over the front door
// (front_door.cpp). Each validates as the reference does, uploads, poisons every output with NaN,
// launches, synchronises, downloads, and moves the row statistics between the reference's
// [B, N, H, 1] and the kernels' [B, H, N].
#include "core/common.hpp"
// GCC 12 at -O2/-O3 reports a false -Wrestrict inside std::string operator+ (GCC bug 105329).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wrestrict"
#endif
#include "flashlab/cuda/dtype16.hpp"
#include "flashlab/cuda/mta.hpp"
#include "flashlab/cuda/mta_fast.hpp"
#include "flashlab/cuda/mta_fast_backward.hpp"
#include "mta/front_door.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace flashlab::cuda::detail::mta {

std::vector<float> stats_to_device_layout(const ref::Tensor<float>& s) {
  const ref::Shape& sh = s.shape();
  std::vector<float> out(sh.batch * sh.heads * sh.seq);
  for (std::size_t b = 0; b < sh.batch; ++b)
    for (std::size_t n = 0; n < sh.seq; ++n)
      for (std::size_t h = 0; h < sh.heads; ++h)
        out[(b * sh.heads + h) * sh.seq + n] = s.data()[(b * sh.seq + n) * sh.heads + h];
  return out;
}

ref::Tensor<float> stats_from_device_layout(const std::vector<float>& v, const ref::Shape& shape) {
  ref::Tensor<float> s(ref::Shape{shape.batch, shape.seq, shape.heads, 1});
  for (std::size_t b = 0; b < shape.batch; ++b)
    for (std::size_t n = 0; n < shape.seq; ++n)
      for (std::size_t h = 0; h < shape.heads; ++h)
        s.data()[(b * shape.seq + n) * shape.heads + h] = v[(b * shape.heads + h) * shape.seq + n];
  return s;
}

}  // namespace flashlab::cuda::detail::mta

namespace flashlab::cuda::mta {

namespace dm = detail::mta;
using detail::DeviceBuffer;

namespace {

DeviceBuffer<float> upload(const float* data, std::size_t count) {
  DeviceBuffer<float> d(count);
  d.upload(data);
  return d;
}
DeviceBuffer<float> upload(const ref::Tensor<float>& t) { return upload(t.data(), t.numel()); }

// Output buffers start as NaN so that an element a kernel forgets to write fails every check.
DeviceBuffer<float> poisoned(std::size_t count) {
  DeviceBuffer<float> d(count);
  d.poison();
  return d;
}

void require_stats(const char* name, const ref::Tensor<float>& t, const ref::Shape& shape) {
  const ref::Shape want{shape.batch, shape.seq, shape.heads, 1};
  if (!(t.shape() == want))
    throw std::invalid_argument(std::string("flashlab::cuda::mta: ") + name + " has shape " + t.shape().str() +
                                ", expected " + want.str() + " (hint: pass the forward's " + name + ")");
}

}  // namespace

ref::mta::FlashForward<float> forward(const ref::Tensor<float>& q, const ref::Tensor<float>& k,
                                      const ref::Tensor<float>& v, const ref::mta::Weights<float>& w,
                                      const ref::mta::Params& p) {
  ref::mta::validate(q, k, v, w, p);
  const ref::Shape& sh = q.shape();
  const dm::Launch L = dm::make_launch(sh, p, false);
  const std::size_t stats = sh.batch * sh.heads * sh.seq;
  DeviceBuffer<float> dq = upload(q), dk = upload(k), dv = upload(v), dw = upload(w.data(), w.numel());
  DeviceBuffer<float> o = poisoned(q.numel()), m = poisoned(stats), l = poisoned(stats);
  dm::launch_zero_fill(o.get(), o.size());  // "Initialize O = (0) in HBM"
  dm::launch_forward(L, dq.get(), dk.get(), dv.get(), dw.get(), o.get(), m.get(), l.get());
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  ref::mta::FlashForward<float> out{ref::Tensor<float>(sh), {}, {}};
  o.download(out.o.data());
  std::vector<float> hm(stats), hl(stats);
  m.download(hm.data());
  l.download(hl.data());
  out.m = dm::stats_from_device_layout(hm, sh);
  out.l = dm::stats_from_device_layout(hl, sh);
  return out;
}

ref::mta::Grads<float> backward(const ref::Tensor<float>& q, const ref::Tensor<float>& k,
                                const ref::Tensor<float>& v, const ref::mta::Weights<float>& w,
                                const ref::Tensor<float>& o, const ref::Tensor<float>& m,
                                const ref::Tensor<float>& l, const ref::Tensor<float>& d_o,
                                const ref::mta::Params& p) {
  ref::mta::validate(q, k, v, w, p);
  const ref::Shape& sh = q.shape();
  if (!(o.shape() == sh)) throw std::invalid_argument("flashlab::cuda::mta: O has shape " + o.shape().str() + ", expected " + sh.str());
  if (!(d_o.shape() == sh))
    throw std::invalid_argument("flashlab::cuda::mta: dO has shape " + d_o.shape().str() + ", expected " + sh.str());
  require_stats("M", m, sh);
  require_stats("L", l, sh);
  const dm::Launch L = dm::make_launch(sh, p, true);
  const std::size_t stats = sh.batch * sh.heads * sh.seq;
  DeviceBuffer<float> dq_in = upload(q), dk_in = upload(k), dv_in = upload(v), dw_in = upload(w.data(), w.numel());
  DeviceBuffer<float> o_in = upload(o), do_in = upload(d_o);
  const std::vector<float> hm = dm::stats_to_device_layout(m), hl = dm::stats_to_device_layout(l);
  DeviceBuffer<float> m_in = upload(hm.data(), stats), l_in = upload(hl.data(), stats);
  DeviceBuffer<float> D = poisoned(stats), dQ = poisoned(q.numel()), dK = poisoned(q.numel()),
                      dV = poisoned(q.numel()), dW = poisoned(w.numel());
  dm::launch_bwd_preprocess(L, o_in.get(), do_in.get(), D.get());
  dm::launch_zero_fill(dW.get(), dW.size());  // "Initialize dW = (0) in HBM"
  dm::launch_bwd_dq_dw(L, dq_in.get(), dk_in.get(), dv_in.get(), dw_in.get(), do_in.get(), m_in.get(), l_in.get(),
                       D.get(), dQ.get(), dW.get());
  dm::launch_bwd_dk_dv(L, dq_in.get(), dk_in.get(), dv_in.get(), dw_in.get(), do_in.get(), m_in.get(), l_in.get(),
                       D.get(), dK.get(), dV.get());
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  ref::mta::Grads<float> g{ref::Tensor<float>(sh), ref::Tensor<float>(sh), ref::Tensor<float>(sh),
                           ref::mta::Weights<float>(sh.heads, p.cq, p.ck)};
  dQ.download(g.dq.data());
  dK.download(g.dk.data());
  dV.download(g.dv.data());
  dW.download(g.dw.data());
  return g;
}

ref::Tensor<float> infer(const ref::Tensor<float>& q, const ref::Tensor<float>& k, const ref::Tensor<float>& v,
                         const ref::mta::Weights<float>& w, const ref::mta::Params& p) {
  ref::mta::validate(q, k, v, w, p);
  if (p.cq > ref::mta::kInferQueryRows)
    throw std::invalid_argument("flashlab::cuda::mta: inference with cq = " + std::to_string(p.cq) +
                                " needs more query rows than the 16-row query tile holds (hint: cq <= 16)");
  const ref::Shape& sh = q.shape();
  const dm::Launch L = dm::make_launch(sh, p, false);
  const ref::Shape out_shape{sh.batch, 1, sh.heads, sh.head_dim};
  const std::size_t parts = sh.batch * sh.heads * p.splits;
  DeviceBuffer<float> dq = upload(q), dk = upload(k), dv = upload(v), dw = upload(w.data(), w.numel());
  DeviceBuffer<float> o = poisoned(out_shape.numel());
  DeviceBuffer<float> o_s, m_s, l_s;
  if (p.splits > 1) {
    o_s = poisoned(parts * sh.head_dim);
    m_s = poisoned(parts);
    l_s = poisoned(parts);
  }
  dm::launch_infer_split(L, dq.get(), dk.get(), dv.get(), dw.get(), o.get(), o_s.get(), m_s.get(), l_s.get());
  if (p.splits > 1) dm::launch_infer_combine(L, o_s.get(), m_s.get(), l_s.get(), o.get());
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  ref::Tensor<float> out(out_shape);
  o.download(out.data());
  return out;
}


// ---------------------------------------------------------------------------------- fast kernels

namespace {

template <typename T>
DeviceBuffer<T> upload_checked(const std::vector<T>& host, std::size_t want, const char* name) {
  if (host.size() != want)
    throw std::invalid_argument("flashlab::cuda::mta fast kernels: " + std::string(name) + " has " +
                                std::to_string(host.size()) + " elements, expected " + std::to_string(want));
  DeviceBuffer<T> d(want);
  d.upload(host.data());
  return d;
}

template <typename T>
DeviceBuffer<T> poisoned_buffer(std::size_t count) {
  DeviceBuffer<T> d(count);
  d.poison();
  return d;
}

std::size_t numel(const FastShape& s) { return std::size_t(s.batch) * s.seq * s.heads * s.head_dim; }
std::size_t stats(const FastShape& s) { return std::size_t(s.batch) * s.heads * s.seq; }
std::size_t taps(const FastShape& s) { return std::size_t(s.heads) * s.cq * s.ck; }

}  // namespace

FastForwardOutput fast_forward(const ref::Tensor<float>& q, const ref::Tensor<float>& k, const ref::Tensor<float>& v,
                               const ref::mta::Weights<float>& w, const ref::mta::Params& p, ref::Dtype dtype,
                               int linear_path, FastOOrder order) {
  ref::mta::validate(q, k, v, w, p);
  const ref::Shape& sh = q.shape();
  FastShape shape;
  auto narrow = [](std::size_t x) { return x > (std::size_t(1) << 30) ? -1 : int(x); };  // refused below
  shape.batch = narrow(sh.batch);
  shape.seq = narrow(sh.seq);
  shape.heads = narrow(sh.heads);
  shape.head_dim = narrow(sh.head_dim);
  shape.cq = narrow(p.cq);
  shape.ck = narrow(p.ck);
  shape.dtype = dtype;
  shape.scale = float(ref::mta::resolve_scale(p, sh.head_dim));
  shape.linear_path = linear_path;
  if (order == FastOOrder::source) check_fast_source_order(shape);
  else check_fast_shape(shape);
  auto to16 = [&](const ref::Tensor<float>& x) {
    const std::vector<std::uint16_t> out = to_bits16(x.data(), x.numel(), dtype);
    detail::DeviceBuffer<std::uint16_t> d(out.size());
    d.upload(out.data());
    return d;
  };
  detail::DeviceBuffer<std::uint16_t> dq = to16(q), dk = to16(k), dv = to16(v), dO(q.numel());
  detail::DeviceBuffer<float> dw(w.numel()), dlse(sh.batch * sh.heads * sh.seq);
  dw.upload(w.data());
  dO.poison();  // 0xFFFF is a NaN in bf16 and fp16 alike
  dlse.poison();
  if (order == FastOOrder::source) {
    detail::DeviceBuffer<float> workspace(fast_source_order_workspace_bytes(shape) / 4);
    workspace.poison();  // the kernel must not read what it has not written
    fast_forward_source_order_device(shape, dq.get(), dk.get(), dv.get(), dw.get(), dO.get(), dlse.get(),
                                     workspace.get(), nullptr);
    FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());  // before the workspace is freed
  } else {
    fast_forward_device(shape, dq.get(), dk.get(), dv.get(), dw.get(), dO.get(), dlse.get(), nullptr);
  }
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<std::uint16_t> o16(q.numel());
  dO.download(o16.data());
  FastForwardOutput out{ref::Tensor<float>(sh), std::vector<float>(dlse.size())};
  const std::vector<float> o = from_bits16(o16, dtype);
  std::copy(o.begin(), o.end(), out.o.data());
  dlse.download(out.lse.data());
  return out;
}

FastBackwardGrads fast_backward(const FastShape& shape, const std::vector<std::uint16_t>& Q,
                                const std::vector<std::uint16_t>& K,
                                const std::vector<std::uint16_t>& V, const std::vector<float>& W,
                                const std::vector<std::uint16_t>& O, const std::vector<std::uint16_t>& dO,
                                const std::vector<float>& LSE) {
  check_fast_shape(shape);
  const std::size_t n = numel(shape), n_stats = stats(shape), n_taps = taps(shape);
  DeviceBuffer<std::uint16_t> q = upload_checked(Q, n, "Q"), k = upload_checked(K, n, "K"), v = upload_checked(V, n, "V"),
                              o = upload_checked(O, n, "O"), d_o = upload_checked(dO, n, "dO");
  DeviceBuffer<float> w = upload_checked(W, n_taps, "W"), lse = upload_checked(LSE, n_stats, "LSE");
  DeviceBuffer<std::uint16_t> dq = poisoned_buffer<std::uint16_t>(n), dk = poisoned_buffer<std::uint16_t>(n),
                              dv = poisoned_buffer<std::uint16_t>(n);
  DeviceBuffer<float> dw = poisoned_buffer<float>(n_taps);
  DeviceBuffer<unsigned char> ws = poisoned_buffer<unsigned char>(fast_backward_workspace_bytes(shape));
  const FastBackwardPointers ptrs{q.get(), k.get(), v.get(), w.get(), o.get(), d_o.get(), lse.get(),
                                  dq.get(), dk.get(), dv.get(), dw.get()};
  fast_backward_device(shape, ptrs, ws.get(), nullptr);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  FastBackwardGrads out;
  out.dQ.resize(n);
  out.dK.resize(n);
  out.dV.resize(n);
  out.dW.resize(n_taps);
  out.D.resize(n_stats);
  dq.download(out.dQ.data());
  dk.download(out.dK.data());
  dv.download(out.dV.data());
  dw.download(out.dW.data());
  FLASHLAB_CUDA_CHECK(cudaMemcpy(out.D.data(), ws.get(), n_stats * sizeof(float), cudaMemcpyDeviceToHost));
  return out;
}

// ---------------------------------------------------------------------------------- decode

FastDecodeOutput fast_decode(const FastShape& shape, const std::vector<std::uint16_t>& Q,
                             const std::vector<std::uint16_t>& K, const std::vector<std::uint16_t>& V,
                             const std::vector<float>& W) {
  check_fast_shape(shape);
  const std::size_t n = numel(shape), n_taps = taps(shape);
  const std::size_t out = numel(shape) / shape.seq * std::size_t(std::min(shape.seq, kDecodeRows));
  DeviceBuffer<std::uint16_t> q = upload_checked(Q, n, "Q"), k = upload_checked(K, n, "K"), v = upload_checked(V, n, "V");
  DeviceBuffer<float> w = upload_checked(W, n_taps, "W");
  const std::size_t out_rows = out / shape.head_dim;  // B·R·H LSE values
  DeviceBuffer<std::uint16_t> o = poisoned_buffer<std::uint16_t>(out);
  DeviceBuffer<float> lse = poisoned_buffer<float>(out_rows);
  DeviceBuffer<unsigned char> ws = poisoned_buffer<unsigned char>(fast_decode_workspace_bytes(shape));
  fast_decode_device(shape, FastDecodePointers{q.get(), k.get(), v.get(), w.get(), o.get(), lse.get()}, ws.get(),
                     nullptr);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  FastDecodeOutput host{std::vector<std::uint16_t>(out), std::vector<float>(out_rows)};
  o.download(host.O.data());
  lse.download(host.LSE.data());
  return host;
}

}  // namespace flashlab::cuda::mta