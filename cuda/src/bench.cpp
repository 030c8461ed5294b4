// bench.cpp — the timing harness of the fast tensor-core forward (flashlab/cuda/bench.hpp): the one
// implementation behind `flashlab bench attention` and `bench_cuda_attention`.
//
// Per shape: allocate input_sets × (Q, K, V) + O + LSE, upload random N(0, 1) values rounded to
// the dtype, then warmup + reps launches; before each, a cudaMemsetAsync of the flush buffer
// (outside the event pair) evicts L2, and launch r reads input set r mod input_sets. Each timed
// launch sits alone between two events on the default stream and is synchronised before the
// next flush, so a time is one kernel, never an overlap of several.
#include "common.hpp"
#include "flashlab/cuda/bench.hpp"

#include <algorithm>
#include <random>
#include <stdexcept>
#include <string>

namespace flashlab::cuda {

namespace {

/// RAII pair of CUDA events.
class EventPair {
 public:
  EventPair() {
    FLASHLAB_CUDA_CHECK(cudaEventCreate(&start_));
    FLASHLAB_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~EventPair() {
    cudaEventDestroy(start_);  // destructor: nothing useful to do with an error here
    cudaEventDestroy(stop_);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
  cudaEvent_t start() const { return start_; }
  cudaEvent_t stop() const { return stop_; }

 private:
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
};

void validate(const AttentionBenchConfig& b) {
  auto bad = [](const std::string& what) { throw std::invalid_argument("flashlab::cuda::bench: " + what); };
  if (b.seqs.empty()) bad("no sequence lengths given");
  if (b.head_dims.empty()) bad("no head dims given");
  if (b.causal.empty()) bad("no mask setting (causal or not) given");
  if (b.reps < 1) bad("reps = " + std::to_string(b.reps) + " must be >= 1");
  if (b.warmup < 0) bad("warmup = " + std::to_string(b.warmup) + " must be >= 0");
  if (b.input_sets < 1) bad("input_sets = " + std::to_string(b.input_sets) + " must be >= 1");
  if (b.heads < 1 || b.batch < 1) bad("heads and batch must be >= 1");
  for (int n : b.seqs)
    if (n < 1) bad("sequence length " + std::to_string(n) + " must be >= 1");
  for (int d : b.head_dims) (void)fast_forward_tiles(d);  // throws for d ∉ {64, 128} before any timing
}

}  // namespace

double attention_fwd_flops(const FastForwardConfig& cfg) {
  const double n = cfg.seq;
  return 4.0 * n * n * cfg.head_dim * cfg.heads * cfg.batch * (cfg.causal ? 0.5 : 1.0);
}

double attention_fwd_bytes(const FastForwardConfig& cfg) {
  const double rows = double(cfg.batch) * cfg.seq * cfg.heads;  // B·N·H
  return 4.0 * rows * cfg.head_dim * 2.0 + rows * 4.0;          // Q, K, V, O (16-bit) + LSE (fp32)
}

std::vector<AttentionBenchRow> bench_attention_forward(const AttentionBenchConfig& bench,
                                                       const std::function<void(const AttentionBenchRow&)>& on_row) {
  validate(bench);
  std::string why;
  if (!device_available(&why)) throw CudaError("no usable CUDA device: " + why);

  // One pool of random 16-bit values, made once; buffer k (of 3 · input_sets) is uploaded from
  // offset 997·k, so the sets differ without drawing 3 · input_sets · B·N·H·d normals per shape.
  constexpr std::size_t kStride = 997;
  const std::size_t buffers = 3 * std::size_t(bench.input_sets);
  std::size_t max_numel = 0;
  for (int d : bench.head_dims)
    for (int n : bench.seqs) max_numel = std::max(max_numel, std::size_t(bench.batch) * n * bench.heads * d);
  std::vector<std::uint16_t> pool(max_numel + kStride * buffers);
  {
    std::mt19937 rng(bench.seed);
    std::normal_distribution<float> normal(0.f, 1.f);
    const bool bf16 = bench.dtype == FastDtype::bf16;
    for (auto& x : pool) x = bf16 ? float_to_bf16(normal(rng)) : float_to_fp16(normal(rng));
  }

  detail::DeviceBuffer<unsigned char> flush(bench.flush_bytes);
  EventPair ev;
  std::vector<AttentionBenchRow> rows;
  for (int d : bench.head_dims)
    for (bool causal : bench.causal)
      for (int n : bench.seqs) {
        FastForwardConfig cfg;
        cfg.batch = bench.batch;
        cfg.seq = n;
        cfg.heads = bench.heads;
        cfg.head_dim = d;
        cfg.causal = causal;
        cfg.dtype = bench.dtype;
        const std::size_t numel = std::size_t(cfg.batch) * n * cfg.heads * d;
        std::vector<detail::DeviceBuffer<std::uint16_t>> in;  // set s: Q, K, V at 3s, 3s+1, 3s+2
        in.reserve(buffers);
        for (std::size_t k = 0; k < buffers; ++k) {
          in.emplace_back(numel);
          in.back().upload(pool.data() + kStride * k);
        }
        detail::DeviceBuffer<std::uint16_t> O(numel);
        detail::DeviceBuffer<float> LSE(std::size_t(cfg.batch) * cfg.heads * n);

        std::vector<double> times;
        times.reserve(std::size_t(bench.reps));
        for (int r = 0; r < bench.warmup + bench.reps; ++r) {
          const std::size_t s = 3 * std::size_t(r % bench.input_sets);
          // Evict L2: outside the timed range (before the start event).
          if (flush.size()) FLASHLAB_CUDA_CHECK(cudaMemsetAsync(flush.get(), r & 0xff, flush.bytes()));
          FLASHLAB_CUDA_CHECK(cudaEventRecord(ev.start()));
          fast_attention_forward_device(cfg, in[s].get(), in[s + 1].get(), in[s + 2].get(), O.get(), LSE.get());
          FLASHLAB_CUDA_CHECK(cudaEventRecord(ev.stop()));
          FLASHLAB_CUDA_CHECK(cudaEventSynchronize(ev.stop()));
          float ms = 0.f;
          FLASHLAB_CUDA_CHECK(cudaEventElapsedTime(&ms, ev.start(), ev.stop()));
          if (r >= bench.warmup) times.push_back(ms);
        }
        FLASHLAB_CUDA_CHECK(cudaGetLastError());
        std::sort(times.begin(), times.end());
        const std::size_t m = times.size();
        AttentionBenchRow row;
        row.config = cfg;
        row.reps = bench.reps;
        row.median_ms = m % 2 ? times[m / 2] : 0.5 * (times[m / 2 - 1] + times[m / 2]);
        row.min_ms = times.front();
        row.max_ms = times.back();
        row.tflops = attention_fwd_flops(cfg) / (row.median_ms * 1e-3) / 1e12;
        row.gbps = attention_fwd_bytes(cfg) / (row.median_ms * 1e-3) / 1e9;
        rows.push_back(row);
        if (on_row) on_row(row);
      }
  return rows;
}

}  // namespace flashlab::cuda
