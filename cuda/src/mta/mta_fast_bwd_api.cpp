// Host API of the fast MTA backward and split-K decode (mta_fast_backward.hpp): the limits in one
// place, the launch geometry, workspaces, and the host-vector wrappers that upload, poison every
// output with NaN, run, check and download.
#include "core/common.hpp"
// GCC 12 at -O2/-O3 reports a false -Wrestrict inside std::string operator+ (GCC bug 105329).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wrestrict"
#endif
#include "flashlab/cuda/mta_fast_backward.hpp"
#include "mta/mta_fast_launch.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace flashlab::cuda::mta {

namespace dmf = detail::mta_fast;
using detail::DeviceBuffer;

namespace {

[[noreturn]] void refuse(const std::string& what) {
  throw std::invalid_argument("flashlab::cuda::mta fast backward: " + what);
}

std::size_t align256(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

/// Backward geometry: Br = 64 − 2Pq, Bc = 128 − 4Pk (≥ 34 and ≥ 100 within the limits).
dmf::Geometry make_geometry(const FastShape& shape) {
  check_fast_shape(shape);
  dmf::Geometry g;
  g.batch = shape.batch;
  g.seq = shape.seq;
  g.heads = shape.heads;
  g.head_dim = shape.head_dim;
  g.cq = shape.cq;
  g.ck = shape.ck;
  g.pq = g.cq - 1;
  g.pk = (g.ck - 1) / 2;
  g.br = dmf::kBwdBlockM - 2 * g.pq;
  g.bc = dmf::kBwdBlockN - 4 * g.pk;
  g.tr = (g.seq + g.br - 1) / g.br;
  g.tc = (g.seq + g.bc - 1) / g.bc;
  g.scale = shape.scale > 0.f ? shape.scale : 1.f / std::sqrt(float(shape.head_dim));
  return g;
}

std::size_t numel(const FastShape& s) { return std::size_t(s.batch) * s.seq * s.heads * s.head_dim; }
std::size_t stats(const FastShape& s) { return std::size_t(s.batch) * s.heads * s.seq; }
std::size_t taps(const FastShape& s) { return std::size_t(s.heads) * s.cq * s.ck; }

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

// ---------------------------------------------------------------------------------- backward

std::size_t fast_backward_workspace_bytes(const FastShape& shape) {
  return align256(stats(shape) * sizeof(float)) + align256(numel(shape) * sizeof(float));
}

void fast_backward_device(const FastShape& shape, const FastBackwardPointers& ptrs, void* workspace, void* stream) {
  const dmf::Geometry g = make_geometry(shape);
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
  a.dQaccum = reinterpret_cast<float*>(ws + align256(stats(shape) * sizeof(float)));
  a.dQ = static_cast<std::uint16_t*>(ptrs.dQ);
  a.dK = static_cast<std::uint16_t*>(ptrs.dK);
  a.dV = static_cast<std::uint16_t*>(ptrs.dV);
  a.dW = ptrs.dW;
  dmf::launch_backward(g, shape.dtype == ref::Dtype::bf16, a, static_cast<cudaStream_t>(stream));
}

FastBackwardGrads fast_backward(const FastShape& shape, const std::vector<std::uint16_t>& Q,
                                const std::vector<std::uint16_t>& K,
                                const std::vector<std::uint16_t>& V, const std::vector<float>& W,
                                const std::vector<std::uint16_t>& O, const std::vector<std::uint16_t>& dO,
                                const std::vector<float>& LSE) {
  check_fast_shape(shape);
  const std::size_t n = numel(shape), n_stats = stats(shape), n_taps = taps(shape);
  DeviceBuffer<std::uint16_t> q = upload(Q, n, "Q"), k = upload(K, n, "K"), v = upload(V, n, "V"),
                              o = upload(O, n, "O"), d_o = upload(dO, n, "dO");
  DeviceBuffer<float> w = upload(W, n_taps, "W"), lse = upload(LSE, n_stats, "LSE");
  DeviceBuffer<std::uint16_t> dq = poisoned<std::uint16_t>(n), dk = poisoned<std::uint16_t>(n),
                              dv = poisoned<std::uint16_t>(n);
  DeviceBuffer<float> dw = poisoned<float>(n_taps);
  DeviceBuffer<unsigned char> ws = poisoned<unsigned char>(fast_backward_workspace_bytes(shape));
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

namespace {

/// Decode geometry: Bc = kDecodeBlockN owned keys per tile (any kernel size), T_k whole tiles
/// per split.
dmf::Geometry decode_geometry(const FastShape& shape) {
  dmf::Geometry g = make_geometry(shape);
  const int bc = dmf::kDecodeBlockN, tiles = (g.seq + bc - 1) / bc;
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

int fast_decode_splits(const FastShape& shape) { return decode_geometry(shape).splits; }

std::size_t fast_decode_workspace_bytes(const FastShape& shape) {
  const std::size_t parts = stats(shape) / shape.seq * std::size_t(fast_decode_splits(shape)) * kDecodeRows;
  return align256(parts * shape.head_dim * sizeof(float)) + 2 * align256(parts * sizeof(float));
}

void fast_decode_device(const FastShape& shape, const FastDecodePointers& ptrs, void* workspace, void* stream) {
  const dmf::Geometry g = decode_geometry(shape);
  const std::size_t parts = stats(shape) / shape.seq * std::size_t(g.splits) * kDecodeRows;
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
  a.LSE = ptrs.LSE;
  dmf::launch_decode(g, shape.dtype == ref::Dtype::bf16, a, static_cast<cudaStream_t>(stream));
}

FastDecodeOutput fast_decode(const FastShape& shape, const std::vector<std::uint16_t>& Q,
                             const std::vector<std::uint16_t>& K, const std::vector<std::uint16_t>& V,
                             const std::vector<float>& W) {
  check_fast_shape(shape);
  const std::size_t n = numel(shape), n_taps = taps(shape);
  const std::size_t out = numel(shape) / shape.seq * std::size_t(std::min(shape.seq, kDecodeRows));
  DeviceBuffer<std::uint16_t> q = upload(Q, n, "Q"), k = upload(K, n, "K"), v = upload(V, n, "V");
  DeviceBuffer<float> w = upload(W, n_taps, "W");
  const std::size_t out_rows = out / shape.head_dim;  // B·R·H LSE values
  DeviceBuffer<std::uint16_t> o = poisoned<std::uint16_t>(out);
  DeviceBuffer<float> lse = poisoned<float>(out_rows);
  DeviceBuffer<unsigned char> ws = poisoned<unsigned char>(fast_decode_workspace_bytes(shape));
  fast_decode_device(shape, FastDecodePointers{q.get(), k.get(), v.get(), w.get(), o.get(), lse.get()}, ws.get(),
                     nullptr);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  FastDecodeOutput host{std::vector<std::uint16_t>(out), std::vector<float>(out_rows)};
  o.download(host.O.data());
  lse.download(host.LSE.data());
  return host;
}

}  // namespace flashlab::cuda::mta
