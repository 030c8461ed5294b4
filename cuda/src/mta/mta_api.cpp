// Host API of the clear MTA kernels (mta.hpp): reference tensors in, reference tensors out.
// Validates as the reference does, builds the launch description, uploads, poisons every output
// with NaN, launches, checks, downloads, and moves the row statistics between the reference's
// [B, N, H, 1] and the kernels' [B, H, N].
#include "core/common.hpp"
// GCC 12 at -O2/-O3 reports a false -Wrestrict inside std::string operator+ (GCC bug 105329).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wrestrict"
#endif
#include "flashlab/cuda/mta.hpp"
#include "mta/mta_api.hpp"

#include <sstream>
#include <stdexcept>
#include <string>

namespace flashlab::cuda::detail::mta {

static_assert(kInferQueryRows == int(ref::mta::kInferQueryRows), "the device query tile must match the reference's");

namespace {
int to_int(std::size_t v, const char* what) {
  if (v > (std::size_t(1) << 30))
    throw std::invalid_argument(std::string("flashlab::cuda::mta: ") + what + " = " + std::to_string(v) +
                                " is too large for the kernels' int indexing");
  return int(v);
}
}  // namespace

Launch make_launch(const ref::Shape& shape, const ref::mta::Params& p, bool backward) {
  const ref::mta::Tiling t = backward ? ref::mta::backward_tiling(shape.seq, p) : ref::mta::forward_tiling(shape.seq, p);
  Launch L;
  L.batch = to_int(shape.batch, "batch");
  L.seq = to_int(shape.seq, "SEQ");
  L.heads = to_int(shape.heads, "HEAD_NUM");
  L.head_dim = to_int(shape.head_dim, "HEAD_DIM");
  if (std::size_t(L.batch) * L.seq * L.heads * std::size_t(L.head_dim) > (std::size_t(1) << 34))
    throw std::invalid_argument("flashlab::cuda::mta: tensors of " + shape.str() + " are too large");
  L.cq = to_int(p.cq, "cq");
  L.ck = to_int(p.ck, "ck");
  L.pq = int(p.pq());
  L.pk = int(p.pk());
  L.block = to_int(p.block, "block B");
  L.br = int(t.br);
  L.bc = int(t.bc);
  L.tr = int(t.tr);
  L.tc = int(t.tc);
  L.splits = to_int(p.splits, "splits");
  L.tk = (L.seq + L.splits * L.bc - 1) / (L.splits * L.bc);  // T_k = ⌈N / (N_splits · Bc)⌉
  L.scale = float(ref::mta::resolve_scale(p, shape.head_dim));
  if (L.heads > 65535 || L.batch > 65535)
    throw std::invalid_argument("flashlab::cuda::mta: HEAD_NUM and batch must be at most 65535 (grid dimensions)");
  return L;
}

void set_smem(const void* kernel, std::size_t bytes, const char* kernel_name, const Launch& L) {
  int dev = 0, optin = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&dev));
  FLASHLAB_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (bytes > std::size_t(optin)) {
    std::ostringstream os;
    os << "flashlab::cuda::mta: " << kernel_name << " needs " << bytes << " bytes of shared memory for block B = "
       << L.block << ", HEAD_DIM = " << L.head_dim << ", cq x ck = " << L.cq << " x " << L.ck
       << " but the device allows " << optin << " (hint: use a smaller --block, e.g. 32)";
    throw std::invalid_argument(os.str());
  }
  FLASHLAB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

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

}  // namespace flashlab::cuda::mta
