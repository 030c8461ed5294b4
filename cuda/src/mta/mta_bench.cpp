// mta_bench.cpp — the timing harness of the Multi-Token Attention kernels
// (flashlab/cuda/mta_bench.hpp): the one implementation behind `flashlab bench mta`.
//
// Per shape: allocate input_sets × (Q, K, V [, dO]) in the family's storage type (fp32 for the
// clear kernels, bf16/fp16 for the fast ones), one W, and the outputs; upload N(0, 1) values.
// Then plan_pass() builds the pass's timed launch (one small function per pass and family:
// plan_fwd_clear, plan_fwd_fast, …), and time_pass() runs warmup + reps launches on the one
// launch timer of every family (core/bench_timing.hpp): before each, a cudaMemsetAsync of the
// flush buffer (outside the event pair) evicts L2, and launch r reads input set r mod input_sets.
// Each timed launch sits alone between two events on the default stream and is synchronised
// before the next flush.
#include "core/bench_timing.hpp"
#include "core/common.hpp"
#include "core/probe.hpp"
// GCC 12 at -O2/-O3 reports a false -Wrestrict inside std::string operator+ (GCC bug 105329).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wrestrict"
#endif
#include "flashlab/cuda/dtype16.hpp"
#include "flashlab/cuda/mta.hpp"
#include "flashlab/cuda/mta_bench.hpp"
#include "flashlab/cuda/mta_fast.hpp"
#include "flashlab/cuda/mta_fast_backward.hpp"
#include "flashlab/cuda/profiler.hpp"
#include "mta/front_door.hpp"

#include <algorithm>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>

namespace flashlab::cuda::mta {

namespace {

using detail::DeviceBuffer;
using Bytes = DeviceBuffer<unsigned char>;

[[noreturn]] void bad(const std::string& what) { throw std::invalid_argument("flashlab::cuda::mta::bench: " + what); }

/// Storage type of the timed family: the clear kernels are fp32 only.
ref::Dtype storage_dtype(const MtaBenchConfig& b) {
  return b.kernel == MtaBenchKernel::clear ? ref::Dtype::fp32 : b.dtype;
}

/// Everything a pass may read or write for one shape: per input set Q, K, V (and dO when the
/// pass has a backward), O and two [B, H, N] statistics vectors (clear: M and L; fast: LSE in
/// `stat_a`), and the one W of the sweep. Element size of Q … O: storage_dtype().
struct ShapeBuffers {
  int seq = 0, head_dim = 0;
  std::size_t numel = 0, stats = 0;
  std::vector<Bytes> q, k, v, d_o, o;
  std::vector<DeviceBuffer<float>> stat_a, stat_b;
  DeviceBuffer<float> w;
};

/// A pass ready to time: `launch(set)` is the timed range; `flops` is its work for the TFLOP/s
/// column; `scratch` holds whatever it allocated (outside the timing).
struct PassPlan {
  std::function<void(std::size_t)> launch;
  double flops = 0.0;
  std::vector<Bytes> scratch;
};

ref::Shape shape_of(const MtaBenchConfig& b, const ShapeBuffers& s) {
  return ref::Shape{std::size_t(b.batch), std::size_t(s.seq), std::size_t(b.heads), std::size_t(s.head_dim)};
}

ref::mta::Params params_of(const MtaBenchConfig& b) {
  ref::mta::Params p;
  p.cq = std::size_t(b.cq);
  p.ck = std::size_t(b.ck);
  p.block = std::size_t(b.block);
  p.splits = std::size_t(b.splits);
  return p;
}

FastShape fast_shape_of(const MtaBenchConfig& b, int seq, int head_dim) {
  FastShape f;
  f.batch = b.batch;
  f.seq = seq;
  f.heads = b.heads;
  f.head_dim = head_dim;
  f.cq = b.cq;
  f.ck = b.ck;
  f.dtype = b.dtype;
  f.linear_path = b.linear_path;
  return f;
}

// ---- the passes: one small function each ------------------------------------------------------

/// The clear forward as the source orders it: O = 0 in HBM, then the forward kernel (O
/// read-modify-written per key tile, M and L saved).
PassPlan plan_fwd_clear(const MtaBenchConfig& b, ShapeBuffers& s) {
  const detail::mta::Launch L = detail::mta::make_launch(shape_of(b, s), params_of(b), false);
  PassPlan plan;
  plan.flops = mta_forward_flops(s.seq, s.head_dim, b.heads, b.batch, b.cq, b.ck);
  plan.launch = [&s, L](std::size_t set) {
    auto* o = reinterpret_cast<float*>(s.o[set].get());
    detail::mta::launch_zero_fill(o, s.numel);
    detail::mta::launch_forward(L, reinterpret_cast<const float*>(s.q[set].get()),
                                reinterpret_cast<const float*>(s.k[set].get()),
                                reinterpret_cast<const float*>(s.v[set].get()), s.w.get(), o, s.stat_a[set].get(),
                                s.stat_b[set].get());
  };
  return plan;
}

/// The fast forward: one kernel, O and LSE (base 2) written once; in the source's order
/// (MtaBenchConfig::o_order), O_i, m_i, ℓ_i also go through a workspace between key tiles.
PassPlan plan_fwd_fast(const MtaBenchConfig& b, ShapeBuffers& s) {
  const FastShape shape = fast_shape_of(b, s.seq, s.head_dim);
  check_fast_shape(shape);
  PassPlan plan;
  plan.flops = mta_forward_flops(s.seq, s.head_dim, b.heads, b.batch, b.cq, b.ck);
  if (b.o_order == FastOOrder::source) {
    plan.scratch.emplace_back(fast_source_order_workspace_bytes(shape));
    void* workspace = plan.scratch.back().get();
    plan.launch = [&s, shape, workspace](std::size_t set) {
      fast_forward_source_order_device(shape, s.q[set].get(), s.k[set].get(), s.v[set].get(), s.w.get(),
                                       s.o[set].get(), s.stat_a[set].get(), workspace);
    };
    return plan;
  }
  plan.launch = [&s, shape](std::size_t set) {
    fast_forward_device(shape, s.q[set].get(), s.k[set].get(), s.v[set].get(), s.w.get(), s.o[set].get(),
                        s.stat_a[set].get());
  };
  return plan;
}

/// The fast backward (dQ, dK, dV, dW) with its D preprocessing; O and LSE come from one untimed
/// fast forward per input set. `with_forward`: the forward runs inside the timed range too.
PassPlan plan_bwd_fast(const MtaBenchConfig& b, ShapeBuffers& s, bool with_forward) {
  const FastShape shape = fast_shape_of(b, s.seq, s.head_dim);
  check_fast_shape(shape);
  for (std::size_t set = 0; set < s.q.size(); ++set)
    fast_forward_device(shape, s.q[set].get(), s.k[set].get(), s.v[set].get(), s.w.get(), s.o[set].get(),
                        s.stat_a[set].get());
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  PassPlan plan;
  plan.flops = mta_backward_flops(s.seq, s.head_dim, b.heads, b.batch, b.cq, b.ck) +
               (with_forward ? mta_forward_flops(s.seq, s.head_dim, b.heads, b.batch, b.cq, b.ck) : 0.0);
  const std::size_t grad_bytes = s.numel * ref::dtype_bytes(b.dtype);
  for (int k = 0; k < 3; ++k) plan.scratch.emplace_back(grad_bytes);                // dQ, dK, dV
  plan.scratch.emplace_back(std::size_t(b.heads) * b.cq * b.ck * sizeof(float));    // dW
  plan.scratch.emplace_back(fast_backward_workspace_bytes(shape));                  // D, dQ accumulator
  // The launch keeps the raw device pointers: moving the plan moves the buffers, not their memory.
  std::vector<void*> raw;
  for (const Bytes& x : plan.scratch) raw.push_back(x.get());
  plan.launch = [&s, shape, raw, with_forward](std::size_t set) {
    if (with_forward)
      fast_forward_device(shape, s.q[set].get(), s.k[set].get(), s.v[set].get(), s.w.get(), s.o[set].get(),
                          s.stat_a[set].get());
    const FastBackwardPointers ptrs{s.q[set].get(), s.k[set].get(), s.v[set].get(), s.w.get(), s.o[set].get(),
                                    s.d_o[set].get(), s.stat_a[set].get(), raw[0], raw[1], raw[2],
                                    static_cast<float*>(raw[3])};
    fast_backward_device(shape, ptrs, raw[4]);
  };
  return plan;
}

/// The fast split-K decode of the last 16 rows (split kernel and combine kernel).
PassPlan plan_decode_fast(const MtaBenchConfig& b, ShapeBuffers& s) {
  const FastShape shape = fast_shape_of(b, s.seq, s.head_dim);
  check_fast_shape(shape);
  PassPlan plan;
  plan.flops = 0.0;  // bandwidth-bound: reported as read_tbps
  plan.scratch.emplace_back(fast_decode_workspace_bytes(shape));
  std::vector<void*> raw{plan.scratch[0].get()};
  plan.launch = [&s, shape, raw](std::size_t set) {
    fast_decode_device(shape, FastDecodePointers{s.q[set].get(), s.k[set].get(), s.v[set].get(), s.w.get(),
                                                 s.o[set].get()},
                       raw[0]);
  };
  return plan;
}

/// The anchor of the decode: a device-to-device copy of the bytes of K and V of input set `set`
/// into a scratch buffer, timed like a pass.
PassPlan plan_copy(const MtaBenchConfig& b, ShapeBuffers& s) {
  PassPlan plan;
  const std::size_t bytes = s.numel * ref::dtype_bytes(storage_dtype(b));
  plan.scratch.emplace_back(2 * bytes);
  auto* dst = plan.scratch[0].get();
  plan.launch = [&s, bytes, dst](std::size_t set) {
    FLASHLAB_CUDA_CHECK(cudaMemcpyAsync(dst, s.k[set].get(), bytes, cudaMemcpyDeviceToDevice));
    FLASHLAB_CUDA_CHECK(cudaMemcpyAsync(dst + bytes, s.v[set].get(), bytes, cudaMemcpyDeviceToDevice));
  };
  return plan;
}

/// Whether the harness has pass `b.pass` of family `b.kernel` (the one list of what exists);
/// throws std::invalid_argument naming the pass and family otherwise.
void require_pass(const MtaBenchConfig& b) {
  const bool timed = b.pass == MtaBenchPass::fwd || b.kernel == MtaBenchKernel::fast;
  if (!timed)
    bad(std::string("pass ") + to_string(b.pass) + " of the " + to_string(b.kernel) +
        " kernels is not timed by this harness yet (hint: --pass fwd)");
}

/// The pass `b.pass` of family `b.kernel` (require_pass() has checked that it exists).
PassPlan plan_pass(const MtaBenchConfig& b, ShapeBuffers& s) {
  require_pass(b);
  if (b.kernel == MtaBenchKernel::clear) return plan_fwd_clear(b, s);
  switch (b.pass) {
    case MtaBenchPass::bwd: return plan_bwd_fast(b, s, false);
    case MtaBenchPass::fwd_bwd: return plan_bwd_fast(b, s, true);
    case MtaBenchPass::decode: return plan_decode_fast(b, s);
    default: return plan_fwd_fast(b, s);
  }
}

// ---- the harness -----------------------------------------------------------------------------

// One pool of random values in the storage type, made once per sweep; buffer k is uploaded from
// element offset kStride·k, so the sets differ without drawing a fresh pool per buffer.
constexpr std::size_t kStride = 997;
constexpr std::size_t kPerSet = 4;  // Q, K, V, dO

bool has_backward(MtaBenchPass pass) { return pass == MtaBenchPass::bwd || pass == MtaBenchPass::fwd_bwd; }

ShapeBuffers allocate_shape(const MtaBenchConfig& b, int seq, int head_dim, const std::vector<unsigned char>& pool,
                            const std::vector<float>& w) {
  const std::size_t es = ref::dtype_bytes(storage_dtype(b));
  ShapeBuffers s;
  s.seq = seq;
  s.head_dim = head_dim;
  s.numel = std::size_t(b.batch) * seq * b.heads * head_dim;
  s.stats = std::size_t(b.batch) * b.heads * seq;
  std::size_t k = 0;
  auto input = [&](std::vector<Bytes>& into) {
    into.emplace_back(s.numel * es);
    into.back().upload(pool.data() + kStride * k * es);
    ++k;
  };
  for (int set = 0; set < b.input_sets; ++set) {
    input(s.q);
    input(s.k);
    input(s.v);
    if (has_backward(b.pass)) input(s.d_o);
    else ++k;
    s.o.emplace_back(s.numel * es);
    s.stat_a.emplace_back(s.stats);
    s.stat_b.emplace_back(s.stats);
  }
  s.w = DeviceBuffer<float>(w.size());
  s.w.upload(w.data());
  return s;
}

/// warmup + reps launches of `plan` on the one launch timer (core/bench_timing.hpp): each alone
/// between the events after an L2 flush, launch r on input set r mod input_sets.
MtaBenchRow time_pass(const MtaBenchConfig& b, const ShapeBuffers& s, const PassPlan& plan,
                      detail::LaunchTimer& timer) {
  const detail::LaunchTimes t =
      timer.time(b.warmup, b.reps, [&](int r) { plan.launch(std::size_t(r % b.input_sets)); });
  MtaBenchRow row;
  row.mta.kernel = b.kernel;
  row.mta.pass = b.pass;
  row.dtype = storage_dtype(b);
  row.mta.cq = b.cq;
  row.mta.ck = b.ck;
  row.head_dim = s.head_dim;
  row.seq = s.seq;
  row.heads = b.heads;
  row.batch = b.batch;
  row.reps = b.reps;
  row.median_ms = t.median_ms;
  row.min_ms = t.min_ms;
  row.max_ms = t.max_ms;
  row.tflops = plan.flops / (row.median_ms * 1e-3) / 1e12;
  if (b.pass == MtaBenchPass::decode)  // K and V: 2·numel elements
    row.mta.read_tbps =
        2.0 * double(s.numel) * double(ref::dtype_bytes(storage_dtype(b))) / (row.median_ms * 1e-3) / 1e12;
  return row;
}

/// One launch of `plan` (input set 0) under the one CUPTI probe (core/probe.hpp: one counter per
/// profiling session, L2 flushed before the kernel): the byte counters of `row`.
void measure_traffic(const MtaBenchConfig& b, const PassPlan& plan, MtaBenchRow& row) {
  const ProbeResult measured = detail::probe_kernels([&] { plan.launch(0); }, b.flush_bytes, true);
  KernelCounters sum;
  for (const MeasuredKernel& k : measured.kernels) RangeProfiler::accumulate(sum, k.counters);
  row.traffic = true;
  row.counters = sum;
}

void validate(const MtaBenchConfig& b) {
  if (b.seqs.empty()) bad("no sequence lengths given");
  if (b.head_dims.empty()) bad("no head dims given");
  if (b.reps < 1) bad("reps = " + std::to_string(b.reps) + " must be >= 1");
  if (b.warmup < 0) bad("warmup = " + std::to_string(b.warmup) + " must be >= 0");
  if (b.input_sets < 1) bad("input_sets = " + std::to_string(b.input_sets) + " must be >= 1");
  if (b.heads < 1 || b.batch < 1) bad("heads and batch must be >= 1");
  if (b.cq < 1 || b.ck < 1 || b.ck % 2 == 0)
    bad("kernel " + std::to_string(b.cq) + " x " + std::to_string(b.ck) + ": cq must be >= 1 and ck odd");
  for (int n : b.seqs)
    if (n < 1) bad("sequence length " + std::to_string(n) + " must be >= 1");
  if (b.kernel == MtaBenchKernel::fast && b.dtype != ref::Dtype::bf16 && b.dtype != ref::Dtype::fp16)
    bad("the fast kernels take bf16 or fp16, not " + std::string(ref::dtype_name(b.dtype)));
  require_pass(b);
  const bool fast_fwd = b.kernel == MtaBenchKernel::fast && b.pass == MtaBenchPass::fwd;
  if (b.o_order == FastOOrder::source && !fast_fwd)
    bad("the source O order is a variant of the fast forward only (hint: --kernel fast --pass fwd)");
  if (b.traffic && !fast_fwd) bad("traffic is measured for the fast forward only (hint: --kernel fast --pass fwd)");
  for (int d : b.head_dims) {  // shape limits, before any timing
    if (b.o_order == FastOOrder::source) check_fast_source_order(fast_shape_of(b, 1, d));
    if (b.kernel == MtaBenchKernel::fast) check_fast_shape(fast_shape_of(b, 1, d));
    else detail::mta::make_launch(ref::Shape{1, 1, std::size_t(b.heads), std::size_t(d)}, params_of(b), false);
  }
}

}  // namespace

const char* to_string(MtaBenchPass pass) {
  switch (pass) {
    case MtaBenchPass::bwd: return "bwd";
    case MtaBenchPass::fwd_bwd: return "fwd+bwd";
    case MtaBenchPass::decode: return "decode";
    default: return "fwd";
  }
}

const char* to_string(FastOOrder order) { return order == FastOOrder::source ? "source" : "on-chip"; }

const char* to_string(MtaBenchKernel kernel) { return kernel == MtaBenchKernel::clear ? "clear" : "fast"; }

double mta_backward_flops(int seq, int head_dim, int heads, int batch, int cq, int ck) {
  const double n = double(seq), hb = double(heads) * double(batch);
  return 5.0 * n * n * double(head_dim) * hb + 3.0 * n * n * double(cq) * double(ck) * hb;
}

double mta_forward_flops(int seq, int head_dim, int heads, int batch, int cq, int ck) {
  const double n = double(seq), hb = double(heads) * double(batch);
  const double products = 2.0 * n * n * double(head_dim) * hb;  // 4·N²·d·H·B, halved (causal)
  const double conv = n * n * double(cq) * double(ck) * hb;      // 2·cq·ck per score, N²/2 scores
  return products + conv;
}

std::vector<MtaBenchRow> bench_mta(const MtaBenchConfig& bench, const std::function<void(const MtaBenchRow&)>& on_row) {
  validate(bench);
  std::string why;
  if (!device_available(&why)) throw CudaError("no usable CUDA device: " + why);

  const ref::Dtype dt = storage_dtype(bench);
  const std::size_t es = ref::dtype_bytes(dt);
  std::size_t max_numel = 0;
  for (int d : bench.head_dims)
    for (int n : bench.seqs) max_numel = std::max(max_numel, std::size_t(bench.batch) * n * bench.heads * d);
  std::vector<unsigned char> pool((max_numel + kStride * kPerSet * std::size_t(bench.input_sets)) * es);
  {
    std::mt19937 rng(bench.seed);
    std::normal_distribution<float> normal(0.f, 1.f);
    for (std::size_t i = 0; i < pool.size() / es; ++i) {
      const float x = normal(rng);
      if (dt == ref::Dtype::fp32) std::memcpy(pool.data() + 4 * i, &x, 4);
      else {
        const std::uint16_t h = to_bits16(x, dt);
        std::memcpy(pool.data() + 2 * i, &h, 2);
      }
    }
  }
  const ref::mta::Weights<float> w =
      ref::mta::random_weights(std::size_t(bench.heads), std::size_t(bench.cq), std::size_t(bench.ck), bench.seed)
          .cast<float>();
  const std::vector<float> w_host(w.data(), w.data() + w.numel());

  detail::LaunchTimer timer(bench.flush_bytes);
  std::vector<MtaBenchRow> rows;
  for (int d : bench.head_dims)
    for (int n : bench.seqs) {
      ShapeBuffers s = allocate_shape(bench, n, d, pool, w_host);
      const PassPlan plan = plan_pass(bench, s);
      rows.push_back(time_pass(bench, s, plan, timer));
      rows.back().mta.o_order = bench.o_order;
      if (bench.traffic) measure_traffic(bench, plan, rows.back());
      if (bench.pass == MtaBenchPass::decode) {  // the copy anchor, same shape, same method, same run
        const MtaBenchRow copy = time_pass(bench, s, plan_copy(bench, s), timer);
        rows.back().mta.copy_tbps =
            4.0 * double(s.numel) * double(ref::dtype_bytes(dt)) / (copy.median_ms * 1e-3) / 1e12;
      }
      if (on_row) on_row(rows.back());
    }
  return rows;
}

}  // namespace flashlab::cuda::mta
