// `flashlab traffic levels --device cuda`: the grouped K/V, decode, MTA and STREAM rows, measured
// now. Each family's probe (the one CUPTI recipe of cuda/src/core) measures its kernels, one launch
// each after an L2 flush — attention its fast forward as the front door chooses it, MTA and STREAM
// their clear kernels; the reference counts the same passes — attention with the FA2 model at the
// tiles that ran, MTA in closed form, STREAM by running its loops on the same seeded inputs,
// because the key blocks the apply reads depend on them.
#include "lessons/traffic_families.hpp"

#include "core/cli.hpp"
#include "core/gpu_flags.hpp"

#ifdef FLASHLAB_HAVE_CUDA
#include <algorithm>

#include "flashlab/cuda/mta.hpp"
#include "flashlab/cuda/options.hpp"
#include "flashlab/cuda/fast_attention.hpp"
#include "flashlab/cuda/stream.hpp"
#include "flashlab/cuda/traffic_probe.hpp"
#include "flashlab/reference/stream.hpp"
#include "flashlab/reference/tensor.hpp"
#endif

namespace flashlab::app {

namespace fl = flashlab::lessons;

#ifdef FLASHLAB_HAVE_CUDA
namespace {

namespace fc = flashlab::cuda;
namespace rs = flashlab::ref::stream;

void add_counters(fl::FamilyBytes& r, const fc::KernelCounters& c) {
  r.l2_read += c.l2_read_bytes;
  r.l2_write += c.l2_write_bytes;
  r.l2_atomic += c.l2_atomic_bytes;
  r.dram_read += c.dram_read_bytes;
  r.dram_write += c.dram_write_bytes;
  r.duration_ms += c.duration_ns / 1e6;
}

void require_counters(const fc::ProbeResult& res) {
  if (res.unavailable.empty()) return;
  std::string names;
  for (const auto& u : res.unavailable) names += " " + u;
  throw UsageError("CUPTI metrics not available on this device:" + names,
                   "the recorded measurement is shown without --device cuda");
}

std::vector<fl::FamilyBytes> measure_attention_rows() {
  // The counted rows at the tiles the fast forward runs on this device (Tr = N/Br sets how often
  // each query head streams K and V).
  ref::AttentionProblem fwd = fl::gqa_chapter_problem(), decode = fl::decode_chapter_problem();
  for (ref::AttentionProblem* p : {&fwd, &decode}) {
    const fc::FastTiles tiles = fc::fast_forward_tiles(*p, fc::fastest_forward_kernel(*p));
    p->Br = std::size_t(tiles.Br);
    p->Bc = std::size_t(tiles.Bc);
  }
  std::vector<fl::FamilyBytes> rows = fl::attention_counted_rows(fwd, decode);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const fc::ProbeResult res = fc::measure_fast_forward(i == 0 ? fwd : decode);
    require_counters(res);
    for (const auto& k : res.kernels) add_counters(rows[i], k.counters);
  }
  return rows;
}

std::vector<fl::FamilyBytes> measure_mta(const fl::MtaChapterShape& s) {
  std::vector<fl::FamilyBytes> rows = fl::mta_counted_rows(s);
  fc::mta::ProbeConfig cfg;
  cfg.shape = s.shape;
  cfg.params.cq = s.cq;
  cfg.params.ck = s.ck;
  cfg.params.block = s.block;
  cfg.params.splits = s.splits;
  for (auto& r : rows) {
    const fc::mta::Pass pass = r.pass == "fwd"   ? fc::mta::Pass::forward
                               : r.pass == "bwd" ? fc::mta::Pass::backward
                                                 : fc::mta::Pass::infer;
    const fc::ProbeResult res = fc::mta::measure(pass, cfg);
    require_counters(res);
    for (const auto& k : res.kernels) add_counters(r, k.counters);
  }
  return rows;
}

std::vector<fl::FamilyBytes> measure_stream(const fl::StreamChapterShape& s) {
  ref::Tensor<float> q(ref::Shape{1, s.T, s.heads, s.d}), k(q.shape()), v(q.shape());
  ref::fill_normal(q, s.seed);
  ref::fill_normal(k, s.seed + 1);
  ref::fill_normal(v, s.seed + 2);
  const rs::Geometry g{s.T, s.bq, s.bk};
  const rs::BlockMask mask(g);
  std::vector<std::int64_t> I;
  const fc::stream::HostHeads Qh{q.data(), s.heads, s.d}, Kh{k.data(), s.heads, s.d}, Vh{v.data(), s.heads, s.d};
  const auto measured = fc::stream::measure_stream_traffic(Qh, Kh, Vh, mask, s.k, &I);
  fl::FamilyBytes est, app;
  est.family = app.family = "stream";
  est.pass = "estimate";
  app.pass = "apply";
  est.shape = app.shape = s.str();
  for (std::size_t h = 0; h < s.heads; ++h) {
    ref::Mat<float> Q(Eigen::Index(s.T), Eigen::Index(s.d)), K(Q.rows(), Q.cols()), V(Q.rows(), Q.cols());
    for (std::size_t t = 0; t < s.T; ++t)
      for (std::size_t c = 0; c < s.d; ++c) {
        const std::size_t at = (t * s.heads + h) * s.d + c;
        Q(Eigen::Index(t), Eigen::Index(c)) = q.data()[at];
        K(Eigen::Index(t), Eigen::Index(c)) = k.data()[at];
        V(Eigen::Index(t), Eigen::Index(c)) = v.data()[at];
      }
    const auto e = rs::stream_estimate(Q, K, mask, rs::EstimateParams{s.k, 8});
    // The GPU's I must be the reference's, or the counts describe other reads than the measured ones.
    if (!std::equal(e.indices.begin(), e.indices.end(), I.begin() + std::ptrdiff_t(h * g.n_q() * s.k)))
      throw std::runtime_error("traffic levels: the GPU estimate's key blocks differ from the reference's");
    const auto a = rs::stream_apply(Q, K, V, mask, e.indices, s.k, 8, false);
    est.counted_read += double(e.traffic.total_read_bytes());
    est.counted_write += double(e.traffic.total_write_bytes());
    app.counted_read += double(a.traffic.total_read_bytes());
    app.counted_write += double(a.traffic.total_write_bytes());
  }
  for (const auto& m : measured) add_counters(m.kernel.find("estimate") != std::string::npos ? est : app, m.counters);
  return {est, app};
}

}  // namespace
#endif

fl::FamilyMeasurement measure_families_live(const std::string& command, const std::string& date) {
#ifdef FLASHLAB_HAVE_CUDA
  std::string why;
  if (!fc::device_available(&why)) throw UsageError("--device cuda: " + why, "use --device cpu for the recorded measurement");
  fl::FamilyMeasurement m;
  m.date = date;
  m.device = fc::device_description();
  m.command = command;
  m.rows = measure_attention_rows();
  for (auto& r : measure_mta(fl::MtaChapterShape{})) m.rows.push_back(std::move(r));
  for (auto& r : measure_stream(fl::StreamChapterShape{})) m.rows.push_back(std::move(r));
  return m;
#else
  (void)command;
  (void)date;
  throw built_without_cuda("--device cuda", "leave out --device cuda for the recorded measurement");
#endif
}

}  // namespace flashlab::app
