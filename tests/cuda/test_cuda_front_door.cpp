// The families' front doors on the caller's device memory: the attention, MTA and STREAM device
// entry points on a non-default stream, again captured in a CUDA graph and replayed, and from
// several host threads at once, each result bitwise equal to the plain call on the default
// stream (every kernel used here sums in a fixed order); the STREAM trace's records on the device
// against the CPU reference's edges; the tiles fast_forward_tiles() reports for the tma-ws forward;
// the pointer checks; the 16-bit conversions. Tag [front-door]; the small shapes also
// [fast-sanitize] for compute-sanitizer.
#include <catch2/catch.hpp>

#include "flashlab/cuda/dtype16.hpp"
#include "flashlab/cuda/fast_attention.hpp"
#include "flashlab/cuda/mta_fast.hpp"
#include "flashlab/cuda/mta_fast_backward.hpp"
#include "flashlab/cuda/stream.hpp"
#include "flashlab/reference/stream.hpp"
#include "gpu_test_util.hpp"
#include "stream_test_util.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace fc = flashlab::cuda;
namespace fr = flashlab::ref;
namespace rs = flashlab::ref::stream;

namespace {

void check_cuda(cudaError_t err) {
  if (err != cudaSuccess) FAIL("CUDA: " << cudaGetErrorName(err) << " " << cudaGetErrorString(err));
}

/// A device array of bytes, freed on scope exit.
struct Dev {
  void* p = nullptr;
  std::size_t bytes = 0;
  explicit Dev(std::size_t n) : bytes(n) { check_cuda(cudaMalloc(&p, n == 0 ? 1 : n)); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  template <typename T>
  T* as() const { return static_cast<T*>(p); }
  template <typename T>
  void upload(const std::vector<T>& x) { check_cuda(cudaMemcpy(p, x.data(), x.size() * sizeof(T), cudaMemcpyHostToDevice)); }
  std::vector<unsigned char> download() const {
    std::vector<unsigned char> h(bytes);
    check_cuda(cudaMemcpy(h.data(), p, bytes, cudaMemcpyDeviceToHost));
    return h;
  }
  /// cudaMemset runs on the legacy default stream, unordered with the non-blocking streams the
  /// tests launch on: it is waited for here, or it could land on outputs already written.
  void poison() const {
    check_cuda(cudaMemset(p, 0xFF, bytes));
    check_cuda(cudaDeviceSynchronize());
  }
};

/// A non-default stream, destroyed on scope exit.
struct Stream {
  cudaStream_t s = nullptr;
  Stream() { check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(s); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
};

/// Runs `launches(stream)` captured in a CUDA graph on a fresh stream, replays the graph twice
/// (outputs poisoned before each replay by `poison`) and synchronises.
void run_as_graph(const std::function<void(cudaStream_t)>& launches, const std::function<void()>& poison) {
  Stream st;
  cudaGraph_t graph = nullptr;
  check_cuda(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeGlobal));
  launches(st.s);
  check_cuda(cudaStreamEndCapture(st.s, &graph));
  cudaGraphExec_t exec = nullptr;
  check_cuda(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 2; ++replay) {
    poison();
    check_cuda(cudaGraphLaunch(exec, st.s));
    check_cuda(cudaStreamSynchronize(st.s));
  }
  check_cuda(cudaGraphExecDestroy(exec));
  check_cuda(cudaGraphDestroy(graph));
}

std::vector<std::uint16_t> random_bits(std::size_t n, std::mt19937_64& rng, fr::Dtype dt) {
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<std::uint16_t> x(n);
  for (auto& v : x) v = fc::to_bits16(normal(rng), dt);
  return x;
}

/// Forward then backward of `problem` on device memory on `stream`, into `out` (O, LSE, dQ, dK,
/// dV: every output poisoned first by the caller).
struct AttentionBuffers {
  Dev q, k, v, d_o, o, lse, dq, dk, dv, ws;
  AttentionBuffers(const fr::AttentionProblem& p, fr::Algorithm design, std::mt19937_64& rng)
      : q(2 * numel(p)), k(2 * numel(p)), v(2 * numel(p)), d_o(2 * numel(p)), o(2 * numel(p)),
        lse(4 * p.stat_numel()), dq(2 * numel(p)), dk(2 * numel(p)), dv(2 * numel(p)),
        ws(fc::fast_attention_backward_workspace_bytes(design, p)) {
    q.upload(random_bits(numel(p), rng, p.dtype));
    k.upload(random_bits(numel(p), rng, p.dtype));
    v.upload(random_bits(numel(p), rng, p.dtype));
    d_o.upload(random_bits(numel(p), rng, p.dtype));
  }
  static std::size_t numel(const fr::AttentionProblem& p) { return p.batch * p.seq * p.heads * p.head_dim; }
  void poison() const {
    for (const Dev* d : {&o, &lse, &dq, &dk, &dv, &ws}) d->poison();
  }
  std::vector<std::vector<unsigned char>> outputs() const {
    return {o.download(), lse.download(), dq.download(), dk.download(), dv.download()};
  }
};

void attention_pass(const fr::AttentionProblem& p, fc::FastForwardKernel fwd, fr::Algorithm design,
                    fc::FastBackwardKernel bwd, const AttentionBuffers& b, cudaStream_t s) {
  fc::fast_attention_forward_device(p, fwd, b.q.p, b.k.p, b.v.p, b.o.p, b.lse.as<float>(), s);
  fc::fast_attention_backward_device(design, p, b.q.p, b.k.p, b.v.p, b.o.p, b.d_o.p, b.lse.as<float>(), b.dq.p,
                                     b.dk.p, b.dv.p, b.ws.p, s, bwd);
}

/// The attention entries on the default stream, on a non-default one, in a replayed graph and on
/// four threads with a stream each: all bitwise equal.
void check_attention_streams(const fr::AttentionProblem& p, fc::FastForwardKernel fwd, fr::Algorithm design,
                             fc::FastBackwardKernel bwd) {
  INFO(p.str() << " fwd " << fc::to_string(fwd) << " bwd " << fc::to_string(bwd));
  const auto seed = flashlab::test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  AttentionBuffers b(p, design, rng);
  b.poison();
  attention_pass(p, fwd, design, bwd, b, nullptr);
  check_cuda(cudaDeviceSynchronize());
  const auto want = b.outputs();
  // Nothing left poisoned: no 0xFFFF among the 16-bit outputs (O, dQ, dK, dV), no NaN in LSE.
  for (std::size_t t = 0; t < want.size(); ++t) {
    std::size_t poisoned = 0;
    if (t == 1) {
      std::vector<float> lse(want[t].size() / 4);
      std::memcpy(lse.data(), want[t].data(), want[t].size());
      for (float x : lse) poisoned += std::isnan(x) ? 1 : 0;
    } else {
      std::vector<std::uint16_t> bits(want[t].size() / 2);
      std::memcpy(bits.data(), want[t].data(), want[t].size());
      for (std::uint16_t x : bits) poisoned += x == 0xFFFF ? 1 : 0;
    }
    CHECK(poisoned == 0);
  }
  {
    Stream st;
    b.poison();
    attention_pass(p, fwd, design, bwd, b, st.s);
    check_cuda(cudaStreamSynchronize(st.s));
    CHECK(b.outputs() == want);
  }
  run_as_graph([&](cudaStream_t s) { attention_pass(p, fwd, design, bwd, b, s); }, [&] { b.poison(); });
  CHECK(b.outputs() == want);
  // Four threads, each with its own buffers (the same inputs) and stream, all at once.
  constexpr int kThreads = 4;
  std::vector<std::unique_ptr<AttentionBuffers>> mine;
  for (int t = 0; t < kThreads; ++t) {
    std::mt19937_64 same(seed);
    mine.push_back(std::make_unique<AttentionBuffers>(p, design, same));
    mine.back()->poison();
  }
  std::vector<std::thread> threads;
  std::vector<std::string> errors(kThreads);
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      try {
        Stream st;
        for (int rep = 0; rep < 3; ++rep) attention_pass(p, fwd, design, bwd, *mine[std::size_t(t)], st.s);
        if (cudaStreamSynchronize(st.s) != cudaSuccess) errors[std::size_t(t)] = "cudaStreamSynchronize failed";
      } catch (const std::exception& e) {
        errors[std::size_t(t)] = e.what();
      }
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    CHECK(errors[std::size_t(t)].empty());
    CHECK(mine[std::size_t(t)]->outputs() == want);
  }
}

fr::AttentionProblem problem(std::size_t B, std::size_t N, std::size_t H, std::size_t d, bool causal) {
  return flashlab::test::attention_problem(fr::Shape{B, N, H, d}, causal, fr::Dtype::bf16);
}

}  // namespace

TEST_CASE("front door: attention on device memory, any stream, graph capture, several threads",
          "[front-door][fast-sanitize]") {
  const auto mma = fc::FastForwardKernel::mma_sync;
  check_attention_streams(problem(2, 200, 3, 64, true), mma, fr::Algorithm::bwd_two_kernel,
                          fc::FastBackwardKernel::mma_sync);
  check_attention_streams(problem(1, 130, 2, 128, false), mma, fr::Algorithm::bwd_two_kernel,
                          fc::FastBackwardKernel::mma_sync);
  if (fc::fastest_forward_kernel() != fc::FastForwardKernel::tma_ws) return;  // the sm_90a kernels
  check_attention_streams(problem(1, 300, 2, 64, false), fc::FastForwardKernel::tma_ws, fr::Algorithm::bwd_atomic,
                          fc::FastBackwardKernel::wgmma_ws_deterministic);
  check_attention_streams(problem(1, 257, 2, 128, true), fc::FastForwardKernel::wgmma, fr::Algorithm::bwd_two_kernel,
                          fc::FastBackwardKernel::mma_sync);
}

TEST_CASE("front door: the tma-ws split tail (pool or graph allocation) on streams, graphs and threads",
          "[front-door]") {
  if (fc::fastest_forward_kernel() != fc::FastForwardKernel::tma_ws) return;
  // d = 64, N = 8192, H = 16: 688 units of Br = 192 on 132 SMs, 5.2 rounds: the tail is split.
  check_attention_streams(problem(1, 8192, 16, 64, false), fc::FastForwardKernel::tma_ws,
                          fr::Algorithm::bwd_two_kernel, fc::FastBackwardKernel::mma_sync);
}

TEST_CASE("front door: the split-KV forward (its partials from the pool or the graph) on streams, graphs and threads",
          "[front-door][fast-splitkv]") {
  // N = 2000, H = 1: 32 row tiles of Br = 64, several key ranges on any GPU of 64 SMs or more (the
  // combine kernel and the partials); N = 16, H = 2: one range of Br = 16 (no partials).
  const auto split_kv = fc::FastForwardKernel::split_kv;
  check_attention_streams(problem(1, 2000, 1, 64, false), split_kv, fr::Algorithm::bwd_two_kernel,
                          fc::FastBackwardKernel::mma_sync);
  check_attention_streams(problem(2, 1000, 1, 128, true), split_kv, fr::Algorithm::bwd_two_kernel,
                          fc::FastBackwardKernel::mma_sync);
  check_attention_streams(problem(1, 16, 2, 128, true), split_kv, fr::Algorithm::bwd_two_kernel,
                          fc::FastBackwardKernel::mma_sync);
}

TEST_CASE("front door: fast_forward_tiles reports the tiles the tma-ws forward runs", "[front-door]") {
  const auto ws = fc::FastForwardKernel::tma_ws;
  const auto mma = fc::FastForwardKernel::mma_sync;
  const fc::FastTiles m = fc::fast_forward_tiles(problem(1, 8192, 16, 64, false), mma);
  CHECK((m.Br == 128 && m.Bc == 64));
  if (fc::fastest_forward_kernel() != ws) return;
  int sms = 0;
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  // d = 64: three consumer warpgroups (Br = 192) once B·H·⌈N/192⌉ ≥ 2.5 × SMs (5 × causal).
  const std::size_t long_heads = std::size_t(sms);  // ⌈8192/192⌉ = 43 units per head: 43·SMs ≫ 5·SMs
  CHECK(fc::fast_forward_tiles(problem(1, 8192, long_heads, 64, false), ws).Br == 192);
  CHECK(fc::fast_forward_tiles(problem(1, 8192, long_heads, 64, true), ws).Br == 192);
  const fc::FastTiles short_list = fc::fast_forward_tiles(problem(1, 1024, 2, 64, false), ws);
  CHECK((short_list.Br == 128 && short_list.Bc == 128));
  // d = 128 without a mask: Bc = 192 where ⌈N/192⌉·192 pads N by ≤ 1 % (8192 → 8256), else 128.
  CHECK(fc::fast_forward_tiles(problem(1, 8192, 16, 128, false), ws).Bc == 192);
  CHECK(fc::fast_forward_tiles(problem(1, 2048, 16, 128, false), ws).Bc == 128);
  CHECK(fc::fast_forward_tiles(problem(1, 8192, 16, 128, true), ws).Bc == 128);
  CHECK(fc::fast_forward_tiles(problem(1, 8192, 16, 128, false), ws).Br == 128);
}

TEST_CASE("front door: MTA forward, backward and decode on device memory in a replayed graph",
          "[front-door][fast-sanitize]") {
  const auto seed = flashlab::test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  fc::mta::FastShape shape;
  shape.batch = 2;
  shape.seq = 150;
  shape.heads = 2;
  shape.head_dim = 64;
  shape.cq = 3;
  shape.ck = 3;
  const std::size_t n = std::size_t(shape.batch) * shape.seq * shape.heads * shape.head_dim;
  const std::size_t stats = std::size_t(shape.batch) * shape.heads * shape.seq;
  const std::size_t taps = std::size_t(shape.heads) * shape.cq * shape.ck;
  const std::size_t rows = std::size_t(std::min(shape.seq, fc::mta::kDecodeRows));
  Dev q(2 * n), k(2 * n), v(2 * n), d_o(2 * n), w(4 * taps), o(2 * n), lse(4 * stats), dq(2 * n), dk(2 * n),
      dv(2 * n), dw(4 * taps), ws(fc::mta::fast_backward_workspace_bytes(shape)),
      dec_o(2 * n / std::size_t(shape.seq) * rows), dec_lse(4 * stats / std::size_t(shape.seq) * rows),
      dec_ws(fc::mta::fast_decode_workspace_bytes(shape));
  q.upload(random_bits(n, rng, shape.dtype));
  k.upload(random_bits(n, rng, shape.dtype));
  v.upload(random_bits(n, rng, shape.dtype));
  d_o.upload(random_bits(n, rng, shape.dtype));
  std::vector<float> w_host(taps);
  std::normal_distribution<float> normal(0.f, 0.5f);
  for (auto& x : w_host) x = normal(rng);
  w.upload(w_host);
  auto launches = [&](cudaStream_t s) {
    fc::mta::fast_forward_device(shape, q.p, k.p, v.p, w.as<float>(), o.p, lse.as<float>(), s);
    const fc::mta::FastBackwardPointers ptrs{q.p, k.p, v.p, w.as<float>(), o.p, d_o.p, lse.as<float>(),
                                             dq.p, dk.p, dv.p, dw.as<float>()};
    fc::mta::fast_backward_device(shape, ptrs, ws.p, s);
    fc::mta::fast_decode_device(shape, fc::mta::FastDecodePointers{q.p, k.p, v.p, w.as<float>(), dec_o.p,
                                                                   dec_lse.as<float>()},
                                dec_ws.p, s);
  };
  auto poison = [&] {
    for (const Dev* d : {&o, &lse, &dq, &dk, &dv, &dw, &ws, &dec_o, &dec_lse, &dec_ws}) d->poison();
  };
  auto outputs = [&] {
    return std::vector<std::vector<unsigned char>>{o.download(),  lse.download(), dq.download(),     dk.download(),
                                                   dv.download(), dw.download(),  dec_o.download(), dec_lse.download()};
  };
  poison();
  launches(nullptr);
  check_cuda(cudaDeviceSynchronize());
  const auto want = outputs();
  run_as_graph(launches, poison);
  // dQ and dW are summed with atomics (dQ over key tiles in fp32, then rounded; dW over query
  // tiles: mta_fast_bwd.cu), so their last bits may differ run to run: dQ is compared within two
  // units of its 16-bit rounding relative to max|dQ|, dW within fp32 rounding; every other output
  // bitwise.
  const auto got = outputs();
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (i == 2 || i == 5) continue;
    CHECK(got[i] == want[i]);
  }
  std::vector<std::uint16_t> dq_want(n), dq_got(n);
  std::memcpy(dq_want.data(), want[2].data(), 2 * n);
  std::memcpy(dq_got.data(), got[2].data(), 2 * n);
  const std::vector<float> a = fc::from_bits16(dq_want, shape.dtype), b = fc::from_bits16(dq_got, shape.dtype);
  double dq_max = 0, dq_diff = 0;
  for (std::size_t i = 0; i < n; ++i) {
    dq_max = std::max(dq_max, double(std::abs(a[i])));
    dq_diff = std::max(dq_diff, double(std::abs(a[i] - b[i])));
  }
  CHECK(std::isfinite(dq_max));
  CHECK(dq_diff <= 2.0 / 128 * dq_max);  // bf16 keeps 8 significant bits: 2^-7 of the largest value
  std::vector<float> dw_want(taps), dw_got(taps);
  std::memcpy(dw_want.data(), want[5].data(), 4 * taps);
  std::memcpy(dw_got.data(), got[5].data(), 4 * taps);
  for (std::size_t i = 0; i < taps; ++i)
    CHECK(std::abs(dw_got[i] - dw_want[i]) <= 1e-4f * std::max(1.f, std::abs(dw_want[i])));
}

TEST_CASE("front door: STREAM trace on device memory equals the reference's edges, in a replayed graph",
          "[front-door][fast-sanitize]") {
  const auto seed = flashlab::test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const rs::Geometry g{777, 32, 16};
  const std::size_t d = 32, dv = 24, k = 5, H = 1;
  const fr::Mat<float> Q = flashlab::test::normal_mat(g.T, d, rng, 0.2), K = flashlab::test::normal_mat(g.T, d, rng),
                       V = flashlab::test::normal_mat(g.T, dv, rng);
  const rs::BlockMask mask(g, flashlab::test::user_mask(g, rng, 0.6));
  // T × d row-major matrices are [T, 1, d] arrays (Mat is row-major: flashlab/reference).
  const fc::stream::HostHeads hq{Q.data(), H, d}, hk{K.data(), H, d};
  const fc::stream::EstimateOutput est = fc::stream::stream_estimate(hq, hk, mask, k);
  REQUIRE(std::count(est.indices.begin(), est.indices.end(), -1) > 0);  // empty entries are exercised
  const auto ref = rs::stream_apply(Q.cast<double>().eval(), K.cast<double>().eval(), V.cast<double>().eval(), mask,
                                    est.indices, k, 4, true);
  Dev dq(4 * Q.size()), dk(4 * K.size()), dvv(4 * V.size()), di(8 * est.indices.size()), o(4 * V.size()),
      edges(sizeof(rs::Edge) * est.indices.size()), ws(fc::stream::stream_trace_workspace_bytes(g, H, dv));
  dq.upload(std::vector<float>(Q.data(), Q.data() + Q.size()));
  dk.upload(std::vector<float>(K.data(), K.data() + K.size()));
  dvv.upload(std::vector<float>(V.data(), V.data() + V.size()));
  di.upload(est.indices);
  auto launch = [&](cudaStream_t s) {
    fc::stream::stream_trace_device(mask, H, d, dv, k, dq.as<float>(), dk.as<float>(), dvv.as<float>(),
                                    di.as<std::int64_t>(), o.as<float>(), edges.as<rs::Edge>(), ws.p, s);
  };
  auto check_records = [&] {
    std::vector<rs::Edge> rec(est.indices.size());
    check_cuda(cudaMemcpy(rec.data(), edges.p, edges.bytes, cudaMemcpyDeviceToHost));
    std::size_t next = 0;  // the reference lists the non-empty entries in the same (q, slot) order
    double w_err = 0;
    for (std::size_t i = 0; i < rec.size(); ++i) {
      const rs::Edge& e = rec[i];
      CHECK((e.q == std::int64_t(i / k) && e.slot == std::int64_t(i % k) && e.r == est.indices[i]));
      if (est.indices[i] < 0) {
        CHECK((e.score == 0 && e.mass == 0 && e.value_norm == 0));
        continue;
      }
      REQUIRE(next < ref.edges.size());
      const rs::Edge& r = ref.edges[next++];
      CHECK((e.q == r.q && e.r == r.r && e.slot == r.slot));
      CHECK(float(e.score) == est.scores[i]);
      w_err = std::max({w_err, std::abs(e.mass - r.mass) / std::max(1.0, r.mass),
                        std::abs(e.value_norm - r.value_norm) / std::max(1.0, r.value_norm)});
    }
    CHECK(next == ref.edges.size());
    CHECK(w_err <= 1e-5);
    std::vector<float> out(V.size());
    check_cuda(cudaMemcpy(out.data(), o.p, 4 * out.size(), cudaMemcpyDeviceToHost));
    double o_err = 0;  // relative to each row's largest |O| (rows with no support are 0 in both)
    for (std::size_t t = 0; t < g.T; ++t) {
      const double scale = ref.O.row(Eigen::Index(t)).cwiseAbs().maxCoeff();
      for (std::size_t c = 0; c < dv; ++c) {
        const double diff = std::abs(double(out[t * dv + c]) - ref.O(Eigen::Index(t), Eigen::Index(c)));
        o_err = std::max(o_err, scale > 0 ? diff / scale : (diff == 0 ? 0.0 : 1.0));
      }
    }
    CHECK(o_err <= 1e-5);
  };
  edges.poison();
  o.poison();
  launch(nullptr);
  check_cuda(cudaDeviceSynchronize());
  check_records();
  run_as_graph(launch, [&] {
    edges.poison();
    o.poison();
  });
  check_records();
  // O may be left out: it then goes to the workspace.
  edges.poison();
  fc::stream::stream_trace_device(mask, H, d, dv, k, dq.as<float>(), dk.as<float>(), dvv.as<float>(),
                                  di.as<std::int64_t>(), nullptr, edges.as<rs::Edge>(), ws.p, nullptr);
  check_cuda(cudaDeviceSynchronize());
  check_records();
}

TEST_CASE("front door: device entries refuse null and misaligned pointers before launching", "[front-door]") {
  const fr::AttentionProblem p = problem(1, 64, 1, 64, false);
  Dev buf(1 << 16);
  const auto mma = fc::FastForwardKernel::mma_sync;
  auto* lse = buf.as<float>();
  CHECK_THROWS_WITH(fc::fast_attention_forward_device(p, mma, nullptr, buf.p, buf.p, buf.p, lse),
                    Catch::Contains("Q is null"));
  CHECK_THROWS_WITH(fc::fast_attention_forward_device(p, mma, buf.as<char>() + 2, buf.p, buf.p, buf.p, lse),
                    Catch::Contains("Q is not 16-byte aligned"));
  CHECK_THROWS_WITH(fc::fast_attention_backward_device(fr::Algorithm::bwd_atomic, p, buf.p, buf.p, buf.p, buf.p,
                                                       buf.p, lse, buf.p, buf.p, buf.p, buf.as<char>() + 16),
                    Catch::Contains("workspace is not 256-byte aligned"));
  fc::mta::FastShape shape;
  shape.seq = 64;
  CHECK_THROWS_WITH(fc::mta::fast_forward_device(shape, buf.p, buf.p, nullptr, lse, buf.p, lse),
                    Catch::Contains("V is null"));
  const rs::BlockMask mask(rs::Geometry{64, 16, 16});
  CHECK_THROWS_AS(fc::stream::stream_trace_device(mask, 1, 16, 16, 2, lse, lse, lse, nullptr, lse,
                                                  buf.as<rs::Edge>(), buf.p),
                  rs::StreamError);
  check_cuda(cudaDeviceSynchronize());  // nothing was launched, nothing failed
}

TEST_CASE("dtype16: one conversion for every family, round to nearest even", "[front-door]") {
  CHECK(fc::to_bits16(1.0f + 1.0f / 256, fr::Dtype::bf16) == 0x3F80);  // halfway: ties to even
  CHECK(fc::to_bits16(1.0f, fr::Dtype::fp16) == 0x3C00);
  CHECK(fc::from_bits16(std::uint16_t(0xC000), fr::Dtype::fp16) == -2.0f);
  CHECK(fc::round_to(1.0f + 1.0f / 256, fr::Dtype::bf16) == 1.0f);
  CHECK(fc::round_to(1.0f / 3, fr::Dtype::fp32) == 1.0f / 3);
  CHECK(std::isnan(fc::round_to(std::numeric_limits<float>::quiet_NaN(), fr::Dtype::bf16)));
  const std::vector<float> x{0.1f, -3.5f, 65504.f};
  const auto bits = fc::to_bits16(x.data(), x.size(), fr::Dtype::fp16);
  const auto back = fc::from_bits16(bits, fr::Dtype::fp16);
  for (std::size_t i = 0; i < x.size(); ++i) CHECK(back[i] == fc::round_to(x[i], fr::Dtype::fp16));
  CHECK_THROWS_WITH(fc::to_bits16(1.f, fr::Dtype::fp32), Catch::Contains("not a 16-bit storage type"));
}

// The backward's kernel for packed sequences and for d = 256 is the device's fastest, as for dense
// d = 64 and 128 (wgmma-ws on Hopper): the choice asks the device, so it is checked here, where one
// runs, and not among the limits (test_cuda_fast_limits.cpp needs no GPU).
TEST_CASE("front door: packed sequences and d = 256 take the backward's fastest kernel", "[front-door]") {
  fr::AttentionProblem p;
  p.heads = 32;
  p.heads_kv = 8;
  p.head_dim = 128;
  p.causal = true;
  p.dtype = fr::Dtype::bf16;
  p.set_packed(fr::PackedSequences({0, 40, 100}, {0, 70, 70}));
  CHECK(fc::fastest_backward_kernel(p) == fc::fastest_backward_kernel());
  fr::AttentionProblem d256;
  d256.seq = 8;
  d256.head_dim = 256;
  d256.dtype = fr::Dtype::bf16;
  CHECK(fc::fastest_backward_kernel(d256) == fc::fastest_backward_kernel());
}
