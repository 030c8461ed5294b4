// Host API of the fast MTA backward and split-K decode (mta_fast_backward.hpp): the limits in one
// place, the launch geometry, workspaces, and the host-vector wrappers that upload, poison every
// output with NaN, run, check and download.
#include "common.hpp"
// GCC 12 at -O2/-O3 reports a false -Wrestrict inside std::string operator+ (GCC bug 105329).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wrestrict"
#endif
#include "flashlab/cuda/mta_fast_backward.hpp"
#include "mta_fast.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace flashlab::cuda::mta {

namespace dmf = detail::mta_fast;
using detail::DeviceBuffer;

namespace {

[[noreturn]] void refuse(const std::string& what) { throw std::invalid_argument("flashlab::cuda::mta fast: " + what); }

std::size_t align256(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

dmf::Geometry make_geometry(const ref::Shape& shape, const ref::mta::Params& p) {
  dmf::Geometry g;
  g.batch = int(shape.batch);
  g.seq = int(shape.seq);
  g.heads = int(shape.heads);
  g.head_dim = int(shape.head_dim);
  g.cq = int(p.cq);
  g.ck = int(p.ck);
  g.pq = int(p.pq());
  g.pk = int(p.pk());
  g.br = dmf::kBwdBlockM - 2 * g.pq;  // ≥ 34 for cq ≤ 16
  g.bc = dmf::kBwdBlockN - 4 * g.pk;  // ≥ 100 for ck ≤ 15
  g.tr = (g.seq + g.br - 1) / g.br;
  g.tc = (g.seq + g.bc - 1) / g.bc;
  g.scale = float(ref::mta::resolve_scale(p, shape.head_dim));
  return g;
}

template <typename T>
DeviceBuffer<T> upload(const std::vector<T>& host, std::size_t want, const char* name) {
  if (host.size() != want)
    refuse(std::string(name) + " has " + std::to_string(host.size()) + " elements, expected " + std::to_string(want));
  DeviceBuffer<T> d(want);
  d.upload(host.data());
  return d;
}

template <typename T>
DeviceBuffer<T> poisoned(std::size_t count) {
  DeviceBuffer<T> d(count);
  d.poison();
  return d;
}

}  // namespace

void check_fast_mta(const ref::Shape& shape, const ref::mta::Params& p, ref::Dtype dtype) {
  if (shape.batch < 1 || shape.seq < 1 || shape.heads < 1)
    refuse("shape " + shape.str() + " has an empty dimension (hint: B, N, H >= 1)");
  if (shape.head_dim != 64 && shape.head_dim != 128)
    refuse("HEAD_DIM = " + std::to_string(shape.head_dim) + " is not 64 or 128 (hint: other d run on the clear kernels)");
  if (dtype != ref::Dtype::bf16 && dtype != ref::Dtype::fp16)
    refuse("dtype = " + std::string(ref::dtype_name(dtype)) +
           " is not bf16 or fp16 (hint: fp32 runs on the clear kernels, flashlab::cuda::mta::backward)");
  if (p.cq < 1 || p.cq > std::size_t(dmf::kMaxCq))
    refuse("cq = " + std::to_string(p.cq) + " is outside [1, " + std::to_string(dmf::kMaxCq) + "]");
  if (p.ck < 1 || p.ck > std::size_t(dmf::kMaxCk) || p.ck % 2 == 0)
    refuse("ck = " + std::to_string(p.ck) + " is not odd in [1, " + std::to_string(dmf::kMaxCk) + "]");
  if (shape.numel() >= (std::size_t(1) << 31) || shape.heads > 65535 || shape.batch > 65535)
    refuse("tensors of " + shape.str() + " are too large (B·N·H·d < 2^31, B and H <= 65535)");
  if (p.scale && !std::isfinite(*p.scale)) refuse("scale is not finite");
}

// ---------------------------------------------------------------------------------- backward

std::size_t fast_backward_workspace_bytes(const ref::Shape& shape) {
  return align256(shape.batch * shape.heads * shape.seq * sizeof(float)) + align256(shape.numel() * sizeof(float));
}

void fast_backward_device(const ref::Shape& shape, const ref::mta::Params& p, ref::Dtype dtype,
                          const FastBackwardPointers& ptrs, void* workspace, void* stream) {
  check_fast_mta(shape, p, dtype);
  const dmf::Geometry g = make_geometry(shape, p);
  auto* ws = static_cast<unsigned char*>(workspace);
  dmf::BwdArgs a{};
  a.Q = static_cast<const std::uint16_t*>(ptrs.Q);
  a.K = static_cast<const std::uint16_t*>(ptrs.K);
  a.V = static_cast<const std::uint16_t*>(ptrs.V);
  a.O = static_cast<const std::uint16_t*>(ptrs.O);
  a.dO = static_cast<const std::uint16_t*>(ptrs.dO);
  a.W = ptrs.W;
  a.LSE = ptrs.LSE;
  a.D = reinterpret_cast<float*>(ws);
  a.dQaccum = reinterpret_cast<float*>(ws + align256(shape.batch * shape.heads * shape.seq * sizeof(float)));
  a.dQ = static_cast<std::uint16_t*>(ptrs.dQ);
  a.dK = static_cast<std::uint16_t*>(ptrs.dK);
  a.dV = static_cast<std::uint16_t*>(ptrs.dV);
  a.dW = ptrs.dW;
  dmf::launch_backward(g, dtype == ref::Dtype::bf16, a, static_cast<cudaStream_t>(stream));
}

FastBackwardGrads fast_backward(const ref::Shape& shape, const ref::mta::Params& p, ref::Dtype dtype,
                                const std::vector<std::uint16_t>& Q, const std::vector<std::uint16_t>& K,
                                const std::vector<std::uint16_t>& V, const std::vector<float>& W,
                                const std::vector<std::uint16_t>& O, const std::vector<std::uint16_t>& dO,
                                const std::vector<float>& LSE) {
  check_fast_mta(shape, p, dtype);
  const std::size_t n = shape.numel(), stats = shape.batch * shape.heads * shape.seq, taps = shape.heads * p.cq * p.ck;
  DeviceBuffer<std::uint16_t> q = upload(Q, n, "Q"), k = upload(K, n, "K"), v = upload(V, n, "V"),
                              o = upload(O, n, "O"), d_o = upload(dO, n, "dO");
  DeviceBuffer<float> w = upload(W, taps, "W"), lse = upload(LSE, stats, "LSE");
  DeviceBuffer<std::uint16_t> dq = poisoned<std::uint16_t>(n), dk = poisoned<std::uint16_t>(n),
                              dv = poisoned<std::uint16_t>(n);
  DeviceBuffer<float> dw = poisoned<float>(taps);
  DeviceBuffer<unsigned char> ws = poisoned<unsigned char>(fast_backward_workspace_bytes(shape));
  const FastBackwardPointers ptrs{q.get(), k.get(), v.get(), w.get(), o.get(), d_o.get(), lse.get(),
                                  dq.get(), dk.get(), dv.get(), dw.get()};
  fast_backward_device(shape, p, dtype, ptrs, ws.get(), nullptr);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  FastBackwardGrads out;
  out.dQ.resize(n);
  out.dK.resize(n);
  out.dV.resize(n);
  out.dW.resize(taps);
  out.D.resize(stats);
  dq.download(out.dQ.data());
  dk.download(out.dK.data());
  dv.download(out.dV.data());
  dw.download(out.dW.data());
  FLASHLAB_CUDA_CHECK(cudaMemcpy(out.D.data(), ws.get(), stats * sizeof(float), cudaMemcpyDeviceToHost));
  return out;
}

// ---------------------------------------------------------------------------------- decode

namespace {

/// Decode geometry: effective keys per tile Bc = kDecodeBlockN − 2Pk, T_k whole tiles per split.
dmf::Geometry decode_geometry(const ref::Shape& shape, const ref::mta::Params& p) {
  dmf::Geometry g = make_geometry(shape, p);
  const int bc = dmf::kDecodeBlockN - 2 * g.pk, tiles = (g.seq + bc - 1) / bc;
  int dev = 0, sms = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&dev));
  FLASHLAB_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  // One wave: as many splits per head as the device's resident blocks allow (each split then
  // streams an equal share of the keys; a second, partial wave would leave most SMs idle).
  const int heads = g.batch * g.heads, wanted = std::max(1, sms * dmf::kDecodeBlocksPerSm / heads);
  const int per_split = (tiles + wanted - 1) / std::min(wanted, tiles);
  g.splits = (tiles + per_split - 1) / per_split;  // every split has at least one tile
  g.keys_per_split = per_split * bc;
  return g;
}

}  // namespace

int fast_decode_splits(const ref::Shape& shape, const ref::mta::Params& p) {
  check_fast_mta(shape, p, ref::Dtype::bf16);
  return decode_geometry(shape, p).splits;
}

std::size_t fast_decode_workspace_bytes(const ref::Shape& shape, const ref::mta::Params& p) {
  const std::size_t parts = shape.batch * shape.heads * std::size_t(fast_decode_splits(shape, p)) * kDecodeRows;
  return align256(parts * shape.head_dim * sizeof(float)) + 2 * align256(parts * sizeof(float));
}

void fast_decode_device(const ref::Shape& shape, const ref::mta::Params& p, ref::Dtype dtype,
                        const FastDecodePointers& ptrs, void* workspace, void* stream) {
  check_fast_mta(shape, p, dtype);
  const dmf::Geometry g = decode_geometry(shape, p);
  const std::size_t parts = shape.batch * shape.heads * std::size_t(g.splits) * kDecodeRows;
  auto* ws = static_cast<unsigned char*>(workspace);
  dmf::DecodeArgs a{};
  a.Q = static_cast<const std::uint16_t*>(ptrs.Q);
  a.K = static_cast<const std::uint16_t*>(ptrs.K);
  a.V = static_cast<const std::uint16_t*>(ptrs.V);
  a.W = ptrs.W;
  a.O_s = reinterpret_cast<float*>(ws);
  a.m_s = reinterpret_cast<float*>(ws + align256(parts * shape.head_dim * sizeof(float)));
  a.l_s = reinterpret_cast<float*>(ws + align256(parts * shape.head_dim * sizeof(float)) + align256(parts * sizeof(float)));
  a.O = static_cast<std::uint16_t*>(ptrs.O);
  dmf::launch_decode(g, dtype == ref::Dtype::bf16, a, static_cast<cudaStream_t>(stream));
}

std::vector<std::uint16_t> fast_decode(const ref::Shape& shape, const ref::mta::Params& p, ref::Dtype dtype,
                                       const std::vector<std::uint16_t>& Q, const std::vector<std::uint16_t>& K,
                                       const std::vector<std::uint16_t>& V, const std::vector<float>& W) {
  check_fast_mta(shape, p, dtype);
  const std::size_t n = shape.numel(), taps = shape.heads * p.cq * p.ck;
  const std::size_t out = shape.batch * std::min<std::size_t>(shape.seq, kDecodeRows) * shape.heads * shape.head_dim;
  DeviceBuffer<std::uint16_t> q = upload(Q, n, "Q"), k = upload(K, n, "K"), v = upload(V, n, "V");
  DeviceBuffer<float> w = upload(W, taps, "W");
  DeviceBuffer<std::uint16_t> o = poisoned<std::uint16_t>(out);
  DeviceBuffer<unsigned char> ws = poisoned<unsigned char>(fast_decode_workspace_bytes(shape, p));
  fast_decode_device(shape, p, dtype, FastDecodePointers{q.get(), k.get(), v.get(), w.get(), o.get()}, ws.get(), nullptr);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<std::uint16_t> host(out);
  o.download(host.data());
  return host;
}

}  // namespace flashlab::cuda::mta
