// GPU tests of a STREAM layer traced to a store (flashlab/cuda/stream_layer.hpp) and of the head
// range of the fast estimate and the fast trace (HeadRange): a launch of some heads gives, for
// each of them, the rows of I, the scores, the margins and the records of the all-heads launch, bit
// for bit; the pipeline's store equals, file for file and byte for byte, the store written the
// simple way (estimate and trace of every head, everything downloaded, appended head by head) —
// with tiny chunks and a two-buffer ring, with several heads per launch, with and without the
// score columns, over two layers; the ring never holds more chunks than it has buffers.
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <cstring>
#include <random>

#include "../reference/test_stream_store_util.hpp"
#include "flashlab/cuda/stream_fast_estimate.hpp"
#include "flashlab/cuda/stream_layer.hpp"
#include "flashlab/reference/stream_store.hpp"
#include "gpu_test_util.hpp"
#include "stream_test_util.hpp"

using namespace flashlab;
using namespace flashlab::ref::stream;
namespace gs = flashlab::cuda::stream;
namespace fs = std::filesystem;

namespace {

/// A device array of n T's (the test's own: the library's DeviceBuffer is internal).
template <typename T>
struct Dev {
  T* p = nullptr;
  std::size_t n = 0;
  explicit Dev(std::size_t count) : n(count) { REQUIRE(cudaMalloc(&p, std::max<std::size_t>(n, 1) * sizeof(T)) == cudaSuccess); }
  Dev(std::size_t count, const T* host) : Dev(count) {
    REQUIRE(cudaMemcpy(p, host, n * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  std::vector<T> get() const {
    std::vector<T> h(n);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    REQUIRE(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
    return h;
  }
  void poison() { REQUIRE(cudaMemset(p, 0x7f, n * sizeof(T)) == cudaSuccess); }
};

template <typename T>
bool same_bytes(const T* a, const T* b, std::size_t n) {
  return std::memcmp(a, b, n * sizeof(T)) == 0;
}

/// Every file of store `a` equals store `b`'s, byte for byte (the same set of files).
void check_same_store(const fs::path& a, const fs::path& b) {
  std::size_t files = 0;
  for (const auto& e : fs::directory_iterator(a)) {
    INFO("file " << e.path().filename().string());
    REQUIRE(fs::exists(b / e.path().filename()));
    CHECK(test::stream::slurp(e.path()) == test::stream::slurp(b / e.path().filename()));
    ++files;
  }
  std::size_t files_b = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(b)) ++files_b;
  CHECK(files == files_b);
  CHECK(files >= 7);  // manifest, row_ptr, key_block, mass, rev_ptr, rev_query, segment_checksum (+ 2 weight columns)
}

/// The simple way: the fast estimate and the fast trace of every head on host arrays, every record
/// downloaded, each head appended whole.
void write_simple(StoreWriter& w, std::size_t layer, const test::Inputs16& in, std::size_t k) {
  const BlockMask mask(Geometry{in.T, 64, 64});
  const auto est = gs::stream_fast_estimate(in.heads(in.Q), in.heads(in.K), mask, k);
  const auto E = gs::stream_fast_trace(ref::Dtype::bf16, in.heads(in.Q), in.heads(in.K), in.heads(in.V), mask,
                                       est.indices, k);
  const std::size_t n_q = mask.geometry().n_q();
  for (std::size_t h = 0; h < in.H; ++h) {
    std::vector<std::int64_t> I(n_q * k);
    std::vector<float> mass(n_q * k), score(n_q * k), vn(n_q * k);
    for (std::size_t i = 0; i < n_q * k; ++i) {
      const gs::FastEdge& e = E[h * n_q * k + i];
      I[i] = e.r;
      mass[i] = e.mass;
      score[i] = e.score;
      vn[i] = e.value_norm;
    }
    w.begin_head(layer, h);
    w.append(RowChunk{0, n_q, I.data(), mass.data(), score.data(), vn.data()});
    w.end_head();
  }
}

StoreLayout layout_of(std::size_t T, std::size_t k, std::size_t layers, std::size_t H, std::size_t d, bool scores) {
  StoreLayout L;
  L.geometry = Geometry{T, 64, 64};
  L.k = k;
  L.layers = layers;
  L.heads = H;
  L.d = d;
  L.score = L.value_norm = scores;
  L.source = "test";
  return L;
}

}  // namespace

TEST_CASE("cuda stream layer: a head range gives each head's rows and records of the all-heads launch, bit for bit",
          "[gpu][stream-layer]") {
  for (const std::size_t d : {std::size_t(64), std::size_t(128)}) {
    const std::size_t T = 3001, H = 5, k = 8;  // ragged T: the last blocks are partial
    INFO("d = " << d);
    std::mt19937_64 rng(test::fresh_seed());
    const test::Inputs16 in = test::make_inputs16(T, H, d, ref::Dtype::bf16, 1.0 / std::sqrt(double(d)), rng);
    const BlockMask mask(Geometry{T, 64, 64});
    const std::size_t n_q = mask.geometry().n_q(), per_head = n_q * k;
    Dev<std::uint16_t> Q(in.Q.size(), in.Q.data()), K(in.K.size(), in.K.data()), V(in.V.size(), in.V.data());
    Dev<long long> I_all(H * per_head);
    Dev<float> S_all(H * per_head), M_all(H * n_q);
    gs::stream_fast_estimate_device(mask, H, d, k, Q.p, K.p, nullptr, I_all.p, S_all.p, M_all.p);
    const gs::FastApplyShape shape{T, H, d, k, ref::Dtype::bf16, 0};
    Dev<gs::FastEdge> E_all(H * per_head);
    E_all.poison();
    gs::stream_fast_trace_device(shape, Q.p, K.p, V.p, reinterpret_cast<const std::int64_t*>(I_all.p), E_all.p);
    const auto I0 = I_all.get();
    const auto S0 = S_all.get();
    const auto M0 = M_all.get();
    const auto E0 = E_all.get();
    CHECK(validate_indices(std::vector<std::int64_t>(I0.begin(), I0.begin() + std::ptrdiff_t(per_head)), k, mask).empty());

    for (const gs::HeadRange r : {gs::HeadRange{0, 1}, gs::HeadRange{3, 1}, gs::HeadRange{4, 1}, gs::HeadRange{1, 3},
                                  gs::HeadRange{2, 0}}) {
      const std::size_t count = r.count ? r.count : H - r.first;
      INFO("heads " << r.first << " + " << count);
      Dev<long long> I(count * per_head);
      Dev<float> S(count * per_head), M(count * n_q);
      I.poison();
      S.poison();
      M.poison();
      gs::stream_fast_estimate_device(mask, H, d, k, Q.p, K.p, nullptr, I.p, S.p, M.p, nullptr, r);
      const auto Ir = I.get();
      const auto Sr = S.get();
      const auto Mr = M.get();
      CHECK(same_bytes(Ir.data(), I0.data() + r.first * per_head, count * per_head));
      CHECK(same_bytes(Sr.data(), S0.data() + r.first * per_head, count * per_head));
      CHECK(same_bytes(Mr.data(), M0.data() + r.first * n_q, count * n_q));
      Dev<gs::FastEdge> E(count * per_head);
      E.poison();
      gs::stream_fast_trace_device(shape, Q.p, K.p, V.p, reinterpret_cast<const std::int64_t*>(I.p), E.p, nullptr, r);
      const auto Er = E.get();
      CHECK(same_bytes(Er.data(), E0.data() + r.first * per_head, count * per_head));
      // The same heads traced in pieces of query blocks (ragged: 47 = 20 + 20 + 7): the same records.
      Dev<gs::FastEdge> Ep(count * per_head);
      Ep.poison();
      for (std::size_t q0 = 0; q0 < n_q; q0 += 20)
        gs::stream_fast_trace_device(shape, Q.p, K.p, V.p, reinterpret_cast<const std::int64_t*>(I.p), Ep.p, nullptr, r,
                                     q0, std::min<std::size_t>(20, n_q - q0));
      const auto Ep_host = Ep.get();
      CHECK(same_bytes(Ep_host.data(), E0.data() + r.first * per_head, count * per_head));
    }
    {  // one piece leaves every other record as it was
      Dev<gs::FastEdge> Ep(per_head);
      Ep.poison();
      const auto before = Ep.get();
      gs::stream_fast_trace_device(shape, Q.p, K.p, V.p, reinterpret_cast<const std::int64_t*>(I_all.p), Ep.p, nullptr,
                                   gs::HeadRange{0, 1}, 10, 5);
      const auto after = Ep.get();
      CHECK(same_bytes(after.data(), before.data(), 10 * k));
      CHECK(same_bytes(after.data() + 10 * k, E0.data() + 10 * k, 5 * k));
      CHECK(same_bytes(after.data() + 15 * k, before.data() + 15 * k, per_head - 15 * k));
    }
    // Ranges outside [0, H) are refused by name.
    Dev<long long> I1(per_head);
    CHECK_THROWS_WITH(gs::stream_fast_estimate_device(mask, H, d, k, Q.p, K.p, nullptr, I1.p, nullptr, nullptr, nullptr,
                                                      gs::HeadRange{5, 1}),
                      Catch::Contains("head range starts at head 5"));
    Dev<gs::FastEdge> E1(per_head);
    CHECK_THROWS_WITH(gs::stream_fast_trace_device(shape, Q.p, K.p, V.p, reinterpret_cast<const std::int64_t*>(I1.p),
                                                   E1.p, nullptr, gs::HeadRange{3, 3}),
                      Catch::Contains("runs past H = 5"));
    CHECK_THROWS_WITH(gs::stream_fast_trace_device(shape, Q.p, K.p, V.p, reinterpret_cast<const std::int64_t*>(I1.p),
                                                   E1.p, nullptr, gs::HeadRange{0, 1}, n_q - 2, 3),
                      Catch::Contains("run past n_q"));
  }
}

TEST_CASE("cuda stream layer: the pipeline's store equals the store written the simple way, byte for byte",
          "[gpu][stream-layer]") {
  const std::size_t T = 5000, H = 5, d = 64, k = 8, layers = 2;  // n_q = 79: chunks of 3 end ragged
  std::mt19937_64 rng(test::fresh_seed());
  std::vector<test::Inputs16> in;
  for (std::size_t l = 0; l < layers; ++l) in.push_back(test::make_inputs16(T, H, d, ref::Dtype::bf16, 0.125, rng));
  const gs::FastApplyShape shape{T, H, d, k, ref::Dtype::bf16, 0};
  struct Case {
    gs::LayerTraceOptions opt;
    bool scores;
  };
  const Case cases[] = {{{1, 3, 2}, false},     // tiny chunks, a ring of two: the writer paces the copies
                        {{2, 3, 2}, true},      // two heads per launch (the last group has one)
                        {{5, 4096, 8}, false},  // every head in one launch, a head per chunk
                        {{1, 1, 3}, true}};     // one query block per chunk
  const fs::path simple[2] = {test::stream::fresh_dir("layer_simple"), test::stream::fresh_dir("layer_simple_scores")};
  std::uint64_t simple_sum[2] = {0, 0};
  for (int sc = 0; sc < 2; ++sc) {
    StoreWriter w = StoreWriter::create(simple[sc], layout_of(T, k, layers, H, d, sc == 1));
    for (std::size_t l = 0; l < layers; ++l) write_simple(w, l, in[l], k);
    simple_sum[sc] = w.checksum();
    w.close();
  }
  for (const Case& c : cases) {
    INFO("heads per launch " << c.opt.heads_per_launch << ", chunk " << c.opt.chunk_rows << " rows, ring of "
                             << c.opt.host_chunks << (c.scores ? ", with scores" : ""));
    const fs::path dir = test::stream::fresh_dir("layer_pipeline");
    StoreWriter w = StoreWriter::create(dir, layout_of(T, k, layers, H, d, c.scores));
    gs::LayerTracer tracer(shape, c.opt);
    for (std::size_t l = 0; l < layers; ++l) {
      Dev<std::uint16_t> Q(in[l].Q.size(), in[l].Q.data()), K(in[l].K.size(), in[l].K.data()),
          V(in[l].V.size(), in[l].V.data());
      tracer.trace_layer(l, Q.p, K.p, V.p, w);
      CHECK(w.segments_committed() == (l + 1) * H);
    }
    CHECK(w.complete());
    CHECK(w.checksum() == simple_sum[c.scores ? 1 : 0]);
    w.close();
    check_same_store(dir, simple[c.scores ? 1 : 0]);
    // Bounded host buffering: the ring, never more chunks in flight than buffers.
    const auto& s = tracer.stats();
    const std::size_t n_q = (T + 63) / 64, rows = std::min(c.opt.chunk_rows, n_q);
    CHECK(s.layers == layers);
    CHECK(s.chunks == layers * H * ((n_q + rows - 1) / rows));
    CHECK(s.max_chunks_in_flight >= 1);
    CHECK(s.max_chunks_in_flight <= c.opt.host_chunks);
    CHECK(s.pinned_bytes == c.opt.host_chunks * rows * k * sizeof(gs::FastEdge));
    CHECK(s.device_bytes == gs::layer_trace_device_bytes(shape, c.opt));
    CHECK(s.device_bytes == 2 * c.opt.heads_per_launch * n_q * k * (8 + sizeof(gs::FastEdge)));
    CHECK(s.estimate_ms > 0);
    CHECK(s.trace_ms > 0);
  }
}

TEST_CASE("cuda stream layer: random layers made on the device trace to the store the simple way writes",
          "[gpu][stream-layer]") {
  const std::size_t T = 4096, H = 3, d = 128, k = 16, layers = 2;
  const gs::FastApplyShape shape{T, H, d, k, ref::Dtype::bf16, 0};
  const fs::path dir = test::stream::fresh_dir("layer_random"), simple = test::stream::fresh_dir("layer_random_simple");
  std::uint64_t sum = 0;
  {
    StoreWriter w = StoreWriter::create(dir, layout_of(T, k, layers, H, d, true));
    const auto run = gs::layer_trace_random(shape, layers, 7, gs::LayerTraceOptions{1, 5, 2}, w);
    CHECK(run.layer_ms.size() == layers);
    CHECK(run.qkv_bytes == 3 * T * H * d * 2);
    sum = w.checksum();
  }
  {
    // The same inputs, downloaded, the simple way.
    StoreWriter w = StoreWriter::create(simple, layout_of(T, k, layers, H, d, true));
    for (std::size_t l = 0; l < layers; ++l) {
      test::Inputs16 in;
      in.T = T;
      in.H = H;
      in.d = d;
      Dev<std::uint16_t> x(T * H * d);
      for (int tensor = 0; tensor < 3; ++tensor) {
        gs::layer_random_inputs_device(x.p, x.n, 7, l, tensor, d);
        (tensor == 0 ? in.Q : tensor == 1 ? in.K : in.V) = x.get();
      }
      CHECK(in.Q != in.K);
      write_simple(w, l, in, k);
    }
    CHECK(w.checksum() == sum);
  }
  check_same_store(dir, simple);
  // A store of another layout is refused before anything runs.
  const fs::path other = test::stream::fresh_dir("layer_other");
  StoreWriter w = StoreWriter::create(other, layout_of(T, 8, 1, H, d, false));
  CHECK_THROWS_WITH(gs::layer_trace_random(shape, 1, 7, {}, w), Catch::Contains("is not the tracer's"));
  CHECK_THROWS_WITH(gs::LayerTracer(shape, gs::LayerTraceOptions{4, 16, 2}), Catch::Contains("heads per launch"));
  CHECK_THROWS_WITH(gs::LayerTracer(shape, gs::LayerTraceOptions{1, 16, 1}), Catch::Contains("at least 2"));
  CHECK_THROWS_WITH(gs::LayerTracer(gs::FastApplyShape{T, H, d, k, ref::Dtype::fp16, 0}), Catch::Contains("bf16"));
}
