// GPU tests of a STREAM layer traced to a store (flashlab/cuda/stream_layer.hpp) and of the head
// range of the fast estimate and the fast trace (HeadRange): a launch of some heads gives, for
// each of them, the rows of I, the scores, the margins and the records of the all-heads launch, bit
// for bit; the pipeline's store equals, file for file and byte for byte, the store written the
// simple way (estimate and trace of every head, everything downloaded, appended head by head) —
// with tiny chunks and a two-buffer ring, with several heads per launch, with and without the
// score columns, over two layers; the ring never holds more chunks than it has buffers.
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <memory>
#include <random>

#include "../reference/test_stream_store_util.hpp"
#include "flashlab/cuda/stream_fast_estimate.hpp"
#include "flashlab/cuda/stream_layer.hpp"
#include "flashlab/reference/stream_fidelity.hpp"
#include "flashlab/reference/stream_query.hpp"
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

TEST_CASE("cuda stream fast trace without value norms: blocks, score and mass of the full trace, bit for bit",
          "[gpu][stream-layer][stream-fast-trace]") {
  // The layer traces a store of key blocks and mass with value_norm = false: its second pass reads
  // K only, from the tiles the first pass left in SRAM on. Every record but value_norm (NaN where
  // a block was kept) must be the full trace's bytes: n_kept from 1 to k (T = 1, early query blocks,
  // a user mask with empty entries), both head dims and dtypes, a head range and a piece of rows.
  std::mt19937_64 rng(test::fresh_seed());
  struct Case { std::size_t T, H, d, k; double q_sd, mask_p; ref::Dtype dtype; bool ints; };
  const ref::Dtype bf = ref::Dtype::bf16, fp = ref::Dtype::fp16;
  for (const Case c : {Case{1, 1, 64, 2, 1.0, 1.0, bf, false}, Case{300, 2, 64, 3, 0.125, 1.0, bf, true},
                       Case{777, 1, 128, 4, 1.0, 1.0, bf, false}, Case{1000, 2, 128, 8, 0.09, 0.6, fp, false},
                       Case{2049, 3, 64, 16, 0.3, 1.0, bf, false}, Case{1500, 1, 128, 5, 0.09, 0.5, bf, true},
                       Case{3001, 2, 128, 16, 0.09, 1.0, bf, false}}) {
    INFO("T=" << c.T << " H=" << c.H << " d=" << c.d << " k=" << c.k << " mask p=" << c.mask_p);
    const test::Inputs16 in = test::make_inputs16(c.T, c.H, c.d, c.dtype, c.q_sd, rng, c.ints);
    const Geometry g{c.T, 64, 64};
    const BlockMask mask = test::case_mask(g, rng, c.mask_p);
    const std::vector<std::int64_t> I = test::reference_indices(in, mask, c.k);
    const std::size_t n = I.size(), per_head = g.n_q() * c.k;
    Dev<std::uint16_t> Q(in.Q.size(), in.Q.data()), K(in.K.size(), in.K.data()), V(in.V.size(), in.V.data());
    Dev<long long> dI(n, reinterpret_cast<const long long*>(I.data()));
    Dev<gs::FastEdge> full(n), mass_only(n);
    full.poison();
    mass_only.poison();
    const gs::FastApplyShape shape{c.T, c.H, c.d, c.k, c.dtype, 0};
    const auto* Ip = reinterpret_cast<const std::int64_t*>(dI.p);
    gs::stream_fast_trace_device(shape, Q.p, K.p, V.p, Ip, full.p);
    gs::stream_fast_trace_device(shape, Q.p, K.p, nullptr, Ip, mass_only.p, nullptr, {}, 0, 0, false);
    const auto F = full.get(), M = mass_only.get();
    std::size_t kept = 0;
    for (std::size_t i = 0; i < n; ++i) {
      INFO("record " << i);
      CHECK(same_bytes(&F[i], &M[i], 1) == (F[i].r < 0));  // a kept block differs by value_norm only
      CHECK(same_bytes(reinterpret_cast<const char*>(&F[i]), reinterpret_cast<const char*>(&M[i]),
                       offsetof(gs::FastEdge, value_norm)));
      if (F[i].r >= 0) {
        CHECK(std::isnan(M[i].value_norm));
        ++kept;
      }
    }
    CHECK(kept > 0);
    // The last head alone, its rows from query block 1 on: the same bytes where they land.
    if (g.n_q() > 1) {
      Dev<gs::FastEdge> piece(per_head);
      piece.poison();
      const gs::HeadRange last{c.H - 1, 1};
      gs::stream_fast_trace_device(shape, Q.p, K.p, V.p, Ip + (c.H - 1) * per_head, piece.p, nullptr, last, 1, 0, false);
      const auto P = piece.get();
      CHECK(same_bytes(P.data() + c.k, M.data() + (c.H - 1) * per_head + c.k, per_head - c.k));
    }
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
                        {{1, 1, 3}, true},      // one query block per chunk
                        {{1, 7, 4, gs::LayerPriority::trace}, false},     // the trace's thread blocks first
                        {{2, 5, 3, gs::LayerPriority::estimate}, true}};  // the estimate's first
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
                             << c.opt.host_chunks << ", priority " << gs::layer_priority_name(c.opt.priority)
                             << (c.scores ? ", with scores" : ""));
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

namespace {

/// The rows of `a` and `b`: the same key blocks in the same order; mass (and score, when kept)
/// within the 16-bit bound of the fast trace's tests: b is the float64 reference of a's bf16 run.
void check_store_near(const Store& a, const Store& b) {
  REQUIRE(a.segments() == b.segments());
  const Geometry& g = a.layout().geometry;
  std::size_t rows_checked = 0, records = 0;
  for (std::size_t s = 0; s < a.segments(); ++s)
    for (std::size_t q = 0; q < g.n_q(); ++q) {
      const auto x = a.row(s, q), y = b.row(s, q);
      INFO("segment " << s << " q " << q);
      REQUIRE(x.size == y.size);
      for (std::size_t j = 0; j < x.size; ++j) {
        REQUIRE(x.key_block[j] == y.key_block[j]);
        CHECK(std::fabs(double(x.mass[j]) - double(y.mass[j])) <= 1e-4 * std::max(1.0, double(y.mass[j])));
        if (x.score != nullptr && y.score != nullptr)
          CHECK(std::fabs(double(x.score[j]) - double(y.score[j])) <= 1e-5 * (1 + std::fabs(double(y.score[j]))));
      }
      ++rows_checked;
      records += x.size;
    }
  CHECK(rows_checked == a.segments() * g.n_q());
  CHECK(records > 0);
}

/// Host float inputs [L, T, H, d] (Q) and [L, T, H_kv, d] (K, V), and a fill that uploads them
/// through a LayerInputUploader of small chunks (the command's way for --inputs files).
struct HostLayers {
  std::size_t L = 0, T = 0, H = 0, H_kv = 0, d = 0;
  std::vector<float> q, k, v;
  ref::Mat<float> head(const std::vector<float>& a, std::size_t l, std::size_t heads, std::size_t h) const {
    ref::Mat<float> m(static_cast<Eigen::Index>(T), static_cast<Eigen::Index>(d));
    for (std::size_t t = 0; t < T; ++t)
      for (std::size_t c = 0; c < d; ++c) m(Eigen::Index(t), Eigen::Index(c)) = a[((l * T + t) * heads + h) * d + c];
    return m;
  }
};

HostLayers int_layers(std::size_t L, std::size_t T, std::size_t H, std::size_t H_kv, std::size_t d, std::mt19937_64& rng) {
  HostLayers x{L, T, H, H_kv, d, {}, {}, {}};
  std::uniform_int_distribution<int> v(-2, 2);
  x.q.resize(L * T * H * d);
  x.k.resize(L * T * H_kv * d);
  x.v.resize(L * T * H_kv * d);
  for (auto* a : {&x.q, &x.k, &x.v})
    for (auto& e : *a) e = float(v(rng));
  return x;
}

gs::LayerInputFill upload_fill(const HostLayers& x, gs::LayerInputUploader& up, std::size_t* uploads) {
  return [&x, &up, uploads](std::size_t l, std::size_t, std::uint16_t* Q, std::uint16_t* K, std::uint16_t* V) {
    const std::vector<float>* src[3] = {&x.q, &x.k, &x.v};
    std::uint16_t* dst[3] = {Q, K, V};
    for (int which = 0; which < 3; ++which) {
      const std::size_t heads = which == 0 ? x.H : x.H_kv, step = up.rows_per_chunk(heads);
      for (std::size_t t = 0; t < x.T; t += step) {
        const std::size_t rows = std::min(step, x.T - t);
        std::memcpy(up.host_chunk(), src[which]->data() + (l * x.T + t) * heads * x.d, rows * heads * x.d * sizeof(float));
        up.upload(heads, t, rows, gs::HeadRange{0, x.H}, dst[which]);
        ++*uploads;
      }
    }
  };
}

}  // namespace

TEST_CASE("cuda stream layer: user inputs uploaded in chunks trace to the CPU reference's store (GQA, user mask)",
          "[gpu][stream-layer]") {
  const auto seed = test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  // Ragged T, two key/value heads for four query heads, a user mask, integers exact in bf16.
  const std::size_t L = 2, T = 1500, H = 4, H_kv = 2, d = 64, k = 5;
  const HostLayers x = int_layers(L, T, H, H_kv, d, rng);
  const Geometry g{T, 64, 64};
  const BlockMask mask(g, test::user_mask(g, rng, 0.7));
  const fs::path gpu = test::stream::fresh_dir("layer_inputs_gpu"), cpu = test::stream::fresh_dir("layer_inputs_cpu");
  gs::LayerInputUploader up(T, H, d, 64 << 10);  // 64 KiB chunks: many per tensor
  REQUIRE(up.rows_per_chunk(H) == (64 << 10) / 4 / (H * d));
  std::size_t uploads = 0;
  {
    StoreWriter w = StoreWriter::create(gpu, layout_of(T, k, L, H, d, true));
    const auto run = gs::layer_trace(gs::FastApplyShape{T, H, d, k, ref::Dtype::bf16, 0}, upload_fill(x, up, &uploads),
                                     gs::LayerTraceOptions{2, 7, 3}, w, &mask);
    CHECK(run.layer_ms.size() == L);
    CHECK(run.stats.device_bytes == gs::layer_trace_device_bytes(gs::FastApplyShape{T, H, d, k, ref::Dtype::bf16, 0},
                                                                 gs::LayerTraceOptions{2, 7, 3}) +
                                        g.n_q() * ((g.n_k() + 63) / 64) * 8);
    w.close();
  }
  CHECK(uploads == L * ((T + up.rows_per_chunk(H) - 1) / up.rows_per_chunk(H) +
                        2 * ((T + up.rows_per_chunk(H_kv) - 1) / up.rows_per_chunk(H_kv))));
  {
    StoreWriter w = StoreWriter::create(cpu, layout_of(T, k, L, H, d, true));
    for (std::size_t l = 0; l < L; ++l)
      for (std::size_t h = 0; h < H; ++h) {
        const auto Qh = x.head(x.q, l, H, h), Kh = x.head(x.k, l, H_kv, h / (H / H_kv)), Vh = x.head(x.v, l, H_kv, h / (H / H_kv));
        const auto est = stream_estimate(Qh, Kh, mask, EstimateParams{k, 4});
        w.begin_head(l, h);
        w.append_edges(stream_apply(Qh, Kh, Vh, mask, est.indices, k, 4, true).edges);
        w.end_head();
      }
    w.close();
  }
  const Store a = Store::open(gpu), b = Store::open(cpu);
  CHECK(a.verify().empty());
  check_store_near(a, b);
  // Bad uploads are refused by name, before any copy.
  CHECK_THROWS_WITH(up.upload(3, 0, 1, gs::HeadRange{0, H}, nullptr), Catch::Contains("not a multiple"));
  CHECK_THROWS_WITH(up.upload(H, T - 1, 2, gs::HeadRange{0, H}, nullptr), Catch::Contains("outside"));
  CHECK_THROWS_WITH(up.rows_per_chunk(H + 1), Catch::Contains("source heads"));
  CHECK_THROWS_WITH(gs::LayerTracer(gs::FastApplyShape{T, H, d, k, ref::Dtype::bf16, 0}, {}, &mask).trace_layer(
                        0, nullptr, nullptr, nullptr, *std::make_unique<StoreWriter>(StoreWriter::create(
                                                           test::stream::fresh_dir("layer_bad_head") / "s",
                                                           layout_of(T, k, 1, H, d, false))),
                        H),
                    Catch::Contains("first head"));
  const BlockMask other(Geometry{T + 64, 64, 64});
  CHECK_THROWS_WITH(gs::LayerTracer(gs::FastApplyShape{T, H, d, k, ref::Dtype::bf16, 0}, {}, &other),
                    Catch::Contains("block mask's geometry"));
}

TEST_CASE("cuda stream layer: a resumed trace writes the bytes of an uninterrupted one", "[gpu][stream-layer]") {
  std::mt19937_64 rng(test::fresh_seed());
  const std::size_t L = 2, T = 2000, H = 3, d = 128, k = 6;
  const HostLayers x = int_layers(L, T, H, H, d, rng);
  const gs::FastApplyShape shape{T, H, d, k, ref::Dtype::bf16, 0};
  const gs::LayerTraceOptions opt{2, 9, 2};
  gs::LayerInputUploader up(T, H, d, 256 << 10);
  std::size_t uploads = 0;
  const fs::path whole = test::stream::fresh_dir("layer_resume_whole");
  {
    StoreWriter w = StoreWriter::create(whole, layout_of(T, k, L, H, d, true));
    gs::layer_trace(shape, upload_fill(x, up, &uploads), opt, w);
    w.close();
  }
  // Interrupted inside layer 0: its first head committed (as the command had written it), the
  // writer gone without close().
  const fs::path mid = test::stream::fresh_dir("layer_resume_mid");
  {
    const Store st = Store::open(whole);
    StoreWriter w = StoreWriter::create(mid, layout_of(T, k, L, H, d, true));
    const std::size_t n_q = st.layout().geometry.n_q();
    std::vector<std::int64_t> I(n_q * k, -1);
    std::vector<float> mass(n_q * k, 0.f), score(n_q * k, 0.f), vn(n_q * k, 0.f);
    for (std::size_t q = 0; q < n_q; ++q) {
      const auto row = st.row(0, q);
      for (std::size_t j = 0; j < row.size; ++j) {
        I[q * k + j] = row.key_block[j];
        mass[q * k + j] = row.mass[j];
        score[q * k + j] = row.score[j];
        vn[q * k + j] = row.value_norm[j];
      }
    }
    w.begin_head(0, 0);
    w.append(RowChunk{0, n_q, I.data(), mass.data(), score.data(), vn.data()});
    w.end_head();
  }
  {
    StoreWriter w = StoreWriter::reopen(mid);
    REQUIRE(w.next_head() == std::pair<std::size_t, std::size_t>{0, 1});
    const auto run = gs::layer_trace(shape, upload_fill(x, up, &uploads), opt, w);
    CHECK(run.layer_ms.size() == L);
    w.close();
  }
  check_same_store(whole, mid);
  // Interrupted between layers: the fill of layer 1 fails, layer 0 stays committed.
  const fs::path between = test::stream::fresh_dir("layer_resume_between");
  {
    StoreWriter w = StoreWriter::create(between, layout_of(T, k, L, H, d, true));
    const gs::LayerInputFill good = upload_fill(x, up, &uploads);
    const gs::LayerInputFill failing = [&](std::size_t l, std::size_t h0, std::uint16_t* Q, std::uint16_t* K, std::uint16_t* V) {
      if (l == 1) throw std::runtime_error("inputs of layer 1 unreadable");
      good(l, h0, Q, K, V);
    };
    CHECK_THROWS_WITH(gs::layer_trace(shape, failing, opt, w), Catch::Contains("unreadable"));
    CHECK(w.segments_committed() == H);
  }
  {
    StoreWriter w = StoreWriter::reopen(between);
    REQUIRE(w.next_head() == std::pair<std::size_t, std::size_t>{1, 0});
    const auto run = gs::layer_trace(shape, upload_fill(x, up, &uploads), opt, w);
    CHECK(run.layer_ms.size() == 1);
    w.close();
  }
  check_same_store(whole, between);
}

TEST_CASE("cuda stream layer: needles planted as the CPU trace plants them are found by the route query",
          "[gpu][stream-layer]") {
  // The CPU trace's needles workload (layers 0 and 2; layer 1 random), each head drawn on the host
  // and uploaded head by head; T = 2048, k = 8 (as the reference's route test, at d = 64).
  const Geometry g{2048, 64, 64};
  const std::size_t L = 3, H = 2, d = 64, k = 8;
  const gs::FastApplyShape shape{g.T, H, d, k, ref::Dtype::bf16, 0};
  gs::LayerInputUploader up(g.T, H, d, 100 << 10);
  std::vector<Needle> planted;
  const gs::LayerInputFill fill = [&](std::size_t l, std::size_t h0, std::uint16_t* Q, std::uint16_t* K, std::uint16_t* V) {
    for (std::size_t h = h0; h < H; ++h) {
      WorkloadParams p{g, d, 5};
      p.variant = l * H + h;
      p.needle_blocks = 4;
      p.needles_per_block = 2;
      const auto in = make_workload(l == 1 ? Workload::random : Workload::needles, p);
      if (l != 1) planted = in.planted;
      const std::pair<const ref::Mat<float>*, std::uint16_t*> parts[3] = {{&in.Q, Q}, {&in.K, K}, {&in.V, V}};
      const std::size_t step = up.rows_per_chunk(1);
      for (const auto& [m, dst] : parts)
        for (std::size_t t = 0; t < g.T; t += step) {
          const std::size_t rows = std::min(step, g.T - t);
          std::memcpy(up.host_chunk(), m->data() + t * d, rows * d * sizeof(float));
          up.upload(1, t, rows, gs::HeadRange{h, 1}, dst);
        }
    }
  };
  const fs::path dir = test::stream::fresh_dir("layer_needles");
  {
    StoreWriter w = StoreWriter::create(dir, layout_of(g.T, k, L, H, d, false));
    gs::layer_trace(shape, fill, gs::LayerTraceOptions{1, 8, 2}, w);
    w.close();
  }
  const Store st = Store::open(dir);
  REQUIRE(planted.size() == 8);
  for (const auto& nd : planted) {
    INFO("needle q " << nd.q << " r " << nd.r);
    for (std::size_t l : {std::size_t(0), std::size_t(2)}) {
      const auto reads = top_reads(st, nd.q, HeadSelection{l, std::nullopt}, Pruning{16, 1.0});
      CHECK(std::any_of(reads.edges.begin(), reads.edges.end(), [&](const StoreEdge& e) { return e.r == nd.r; }));
    }
    RouteParams p;
    p.residual = 0.5;
    p.pruning = {8, 1.0};
    const auto route = ref::stream::route(st, TokenSpan{nd.r * g.bk, (nd.r + 1) * g.bk}, TokenSpan{nd.q * g.bq, (nd.q + 1) * g.bq}, p);
    REQUIRE(route.total > 0);
    for (const auto& rl : route.layers) {
      INFO("layer " << rl.layer);
      if (rl.layer != 1)
        CHECK(std::any_of(rl.edges.begin(), rl.edges.end(),
                          [&](const RouteEdge& e) { return e.head && e.q == nd.q && e.r == nd.r; }));
    }
  }
}
