// bench.cpp — the timing harness of the fast tensor-core forward and backward
// (flashlab/cuda/bench.hpp): the one implementation behind `flashlab bench attention` and
// `bench_cuda_attention`.
//
// Per shape: allocate input_sets × (Q, K, V [, dO], O, LSE) (+ dQ, dK, dV, workspace when the backward is
// timed), upload random N(0, 1) values rounded to the dtype, then per pass warmup + reps
// launches; before each, a cudaMemsetAsync of the flush buffer and a read of it (outside the event
// pair) evict L2 and leave it clean, and launch r reads input set r mod input_sets. Each timed launch sits alone between two
// events on the default stream and is synchronised before the next flush, so a time is one
// launch (the backward: every kernel of its design, see bench.hpp), never an overlap of
// several. The backward reads the O and LSE of one untimed forward per set, run before its
// warm-up.
#include "core/bench_timing.hpp"
#include "core/common.hpp"
#include "flashlab/cuda/bench.hpp"
#include "flashlab/reference/tensor.hpp"

#include <algorithm>
#include <random>
#include <stdexcept>
#include <string>

namespace flashlab::cuda {

namespace {

// The problem of one shape of the sweep.
ref::AttentionProblem problem_of(const AttentionBenchConfig& b, int n, int d, bool causal) {
  ref::AttentionProblem problem;
  problem.batch = std::size_t(b.batch);
  problem.seq = std::size_t(n);
  problem.heads = std::size_t(b.heads);
  problem.heads_kv = std::size_t(b.heads_kv);
  problem.seq_k = std::size_t(b.seq_k);
  problem.head_dim = std::size_t(d);
  problem.causal = causal;
  problem.dtype = b.dtype;
  problem.window_left = b.window_left;
  problem.window_right = b.window_right;
  if (b.packed) problem.set_packed(*b.packed);  // B, N and N_k from the sequences
  return problem;
}

void validate(const AttentionBenchConfig& b) {
  auto bad = [](const std::string& what) { throw std::invalid_argument("flashlab::cuda::bench: " + what); };
  if (b.seqs.empty()) bad("no sequence lengths given");
  if (b.head_dims.empty()) bad("no head dims given");
  if (b.causal.empty()) bad("no mask setting (causal or not) given");
  if (b.reps < 1) bad("reps = " + std::to_string(b.reps) + " must be >= 1");
  if (b.warmup < 0) bad("warmup = " + std::to_string(b.warmup) + " must be >= 0");
  if (b.input_sets < 1) bad("input_sets = " + std::to_string(b.input_sets) + " must be >= 1");
  if (b.heads < 1 || b.batch < 1) bad("heads and batch must be >= 1");
  if (b.heads_kv < 0 || b.seq_k < 0) bad("heads_kv and seq_k must be >= 0 (0: equal to heads, to N)");
  for (int n : b.seqs)
    if (n < 1) bad("sequence length " + std::to_string(n) + " must be >= 1");
  if (b.packed && b.pass != BenchPass::fwd && b.bwd_design == ref::Algorithm::bwd_atomic &&
      b.bwd_kernel == FastBackwardKernel::wgmma_ws_deterministic)
    bad("packed sequences time the backward on the two-kernel design and the atomic design's mma and wgmma-ws kernels "
        "(those that take them), not on wgmma-ws-det");
  if (b.bwd_design != ref::Algorithm::bwd_two_kernel && b.bwd_design != ref::Algorithm::bwd_atomic)
    bad("bwd_design = " + std::string(ref::algorithm_name(b.bwd_design)) + " is not a fast backward design");
  for (int d : b.head_dims)  // before any timing: every shape's limits, and the backward's where it runs
    for (int n : b.seqs) {
      check_fast_problem(problem_of(b, n, d, false));
      if (b.pass != BenchPass::fwd) (void)fast_attention_backward_workspace_bytes(b.bwd_design, problem_of(b, n, d, false));
    }
}

// One pool of random 16-bit values, made once per sweep; buffer k (of 4 · input_sets: Q, K, V, dO
// per set) is uploaded from offset 997·k, so the sets differ without drawing 4 · input_sets ·
// B·N·H·d normals per shape.
constexpr std::size_t kStride = 997;
constexpr std::size_t kPerSet = 4;

/// Times one shape of the sweep (the passes `bench.pass` selects), appending its rows to `rows`
/// and handing each to `on_row`. Device memory is allocated here and freed on return.
void bench_shape(const AttentionBenchConfig& bench, const ref::AttentionProblem& problem,
                 const std::vector<std::uint16_t>& pool, detail::LaunchTimer& timer,
                 std::vector<AttentionBenchRow>& rows, const std::function<void(const AttentionBenchRow&)>& on_row) {
  const bool do_fwd = bench.pass != BenchPass::bwd;
  const bool do_bwd = bench.pass != BenchPass::fwd;
  const std::size_t numel = problem.q_shape().numel(), kv_numel = problem.kv_shape().numel();
  const std::size_t stats = problem.stat_numel();
  const std::size_t sets = std::size_t(bench.input_sets);
  // Set s: Q, K, V, dO at 4s … 4s+3 (dO only when the backward is timed), O and LSE at s.
  const std::size_t per_set = do_bwd ? kPerSet : 3;
  std::vector<detail::DeviceBuffer<std::uint16_t>> in;
  in.reserve(kPerSet * sets);
  for (std::size_t k = 0; k < kPerSet * sets; ++k) {
    const std::size_t n = k % kPerSet >= per_set ? 0 : (k % kPerSet == 1 || k % kPerSet == 2) ? kv_numel : numel;
    in.emplace_back(n);
    if (n > 0) in.back().upload(pool.data() + kStride * k);
  }
  std::vector<detail::DeviceBuffer<std::uint16_t>> O;
  std::vector<detail::DeviceBuffer<float>> LSE;
  O.reserve(sets);
  LSE.reserve(sets);
  for (std::size_t s = 0; s < sets; ++s) {
    O.emplace_back(numel);
    LSE.emplace_back(stats);
  }
  const std::size_t grad_numel = do_bwd ? numel : 0, kv_grad_numel = do_bwd ? kv_numel : 0;  // dK, dV: K's shape
  detail::DeviceBuffer<std::uint16_t> dQ(grad_numel), dK(kv_grad_numel), dV(kv_grad_numel);
  // The forward kernel of this shape: the sweep's, or the front door's choice for the problem.
  const FastForwardKernel fwd_kernel = bench.fwd_auto ? fastest_forward_kernel(problem) : bench.fwd_kernel;
  // The backward kernel of this shape: the sweep's, or the fastest for its head dim.
  const FastBackwardKernel bwd_kernel =
      bench.bwd_auto ? fastest_backward_kernel(problem) : bench.bwd_kernel;
  // Workspace (D; atomic: + the fp32 dQ accumulator), allocated here, outside the timing.
  detail::DeviceBuffer<unsigned char> workspace(
      do_bwd ? fast_attention_backward_workspace_bytes(bench.bwd_design, problem) : 0);

  // One pass: warmup + reps launches of `launch(set)`, each alone between the events after
  // an L2 flush; returns its row.
  // The copy anchor (kv_copy): K then V of the set into one scratch buffer, device to device,
  // timed as a forward launch (flush, events, sets rotated), before the forward so that its row
  // carries both rates.
  double copy_tbps = 0.0;
  const std::size_t kv_bytes = kv_numel * sizeof(std::uint16_t);
  if (do_fwd && bench.kv_copy) {
    detail::DeviceBuffer<unsigned char> scratch(2 * kv_bytes);
    const detail::LaunchTimes t = timer.time(bench.warmup, bench.reps, [&](int r) {
      const std::size_t s = kPerSet * std::size_t(r % bench.input_sets);
      FLASHLAB_CUDA_CHECK(cudaMemcpyAsync(scratch.get(), in[s + 1].get(), kv_bytes, cudaMemcpyDeviceToDevice));
      FLASHLAB_CUDA_CHECK(cudaMemcpyAsync(scratch.get() + kv_bytes, in[s + 2].get(), kv_bytes, cudaMemcpyDeviceToDevice));
    });
    copy_tbps = 4.0 * double(kv_bytes) / (t.median_ms * 1e-3) / 1e12;  // 2·kv_bytes read + written
  }
  auto time_pass = [&](bool backward, const std::function<void(std::size_t)>& launch) {
    const detail::LaunchTimes t =
        timer.time(bench.warmup, bench.reps, [&](int r) { launch(std::size_t(r % bench.input_sets)); });
    AttentionBenchRow row;
    row.batch = int(problem.batch);
    row.seq = int(problem.seq);
    row.heads = int(problem.heads);
    row.head_dim = int(problem.head_dim);
    row.dtype = problem.dtype;
    row.attention.problem = problem;
    row.attention.backward = backward;
    row.attention.fwd_kernel = fwd_kernel;
    if (!backward && bench.kv_copy) {
      row.attention.kv_read_tbps = 2.0 * double(kv_bytes) / (t.median_ms * 1e-3) / 1e12;
      row.attention.copy_tbps = copy_tbps;
    }
    row.attention.bwd_design = bench.bwd_design;
    row.attention.bwd_kernel = bwd_kernel;
    row.reps = bench.reps;
    row.median_ms = t.median_ms;
    row.min_ms = t.min_ms;
    row.max_ms = t.max_ms;
    const double flops = backward ? attention_bwd_flops(problem) : attention_fwd_flops(problem);
    const double bytes = backward ? attention_bwd_bytes(problem) : attention_fwd_bytes(problem);
    row.tflops = flops / (row.median_ms * 1e-3) / 1e12;
    row.gbps = bytes / (row.median_ms * 1e-3) / 1e9;
    rows.push_back(row);
    if (on_row) on_row(row);
  };
  // Packed: the lists in device memory, uploaded once, as a caller of the varlen call holds them.
  const std::size_t lists = problem.packed ? problem.batch + 1 : 0;
  detail::DeviceBuffer<std::int32_t> cu_q(lists), cu_k(lists);
  if (problem.packed) {
    cu_q.upload(problem.packed->cu_seqlens_q().data());
    cu_k.upload(problem.packed->cu_seqlens_k().data());
  }
  auto forward = [&](std::size_t s) {
    if (problem.packed)
      fast_attention_forward_device(problem, {cu_q.get(), cu_k.get(), problem.packed->total_q(), problem.packed->total_k()},
                                    fwd_kernel, in[kPerSet * s].get(), in[kPerSet * s + 1].get(),
                                    in[kPerSet * s + 2].get(), O[s].get(), LSE[s].get());
    else
      fast_attention_forward_device(problem, fwd_kernel, in[kPerSet * s].get(), in[kPerSet * s + 1].get(),
                                    in[kPerSet * s + 2].get(), O[s].get(), LSE[s].get());
  };
  if (do_fwd) time_pass(false, forward);
  if (do_bwd) {
    // The backward consumes a real forward's O and LSE: one untimed forward per set.
    for (std::size_t s = 0; s < sets; ++s) forward(s);
    FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
    time_pass(true, [&](std::size_t s) {
      const std::size_t q = kPerSet * s;
      if (problem.packed)
        fast_attention_backward_device(bench.bwd_design, problem,
                                       {cu_q.get(), cu_k.get(), problem.packed->total_q(), problem.packed->total_k()},
                                       in[q].get(), in[q + 1].get(), in[q + 2].get(), O[s].get(), in[q + 3].get(),
                                       LSE[s].get(), dQ.get(), dK.get(), dV.get(), workspace.get(), nullptr,
                                       bwd_kernel);
      else
        fast_attention_backward_device(bench.bwd_design, problem, in[q].get(), in[q + 1].get(), in[q + 2].get(),
                                       O[s].get(), in[q + 3].get(), LSE[s].get(), dQ.get(), dK.get(), dV.get(),
                                       workspace.get(), nullptr, bwd_kernel);
    });
  }
}

}  // namespace

double attention_fwd_flops(const ref::AttentionProblem& problem) {
  const double n = double(problem.seq), nk = double(problem.n_k());
  // (query, key) pairs of one sequence: all, or (causal, bottom-right aligned) the triangle and the
  // rectangle left of it; a window's band row by row (the mask's one rule: visible_keys), and so
  // every packed sequence's with its own lengths.
  double pairs = !problem.causal ? n * nk : n <= nk ? n * nk - 0.5 * n * n : 0.5 * nk * nk;
  double sequences = double(problem.batch);
  if (problem.has_window() || problem.is_packed()) {
    pairs = 0.0;
    const std::size_t counted = problem.is_packed() ? problem.batch : 1;  // dense: the batch's sequences alike
    for (std::size_t b = 0; b < counted; ++b) {
      const ref::SequenceSpan s = problem.sequence(b);
      for (std::size_t i = 0; i < s.q_len; ++i) {
        const ref::KeyRange k = problem.visible_keys(s, static_cast<long long>(i));
        pairs += k.empty() ? 0.0 : double(k.end - k.first);
      }
    }
    if (problem.is_packed()) sequences = 1.0;
  }
  return 4.0 * pairs * sequences * double(problem.head_dim * problem.heads);
}

double attention_fwd_bytes(const ref::AttentionProblem& problem) {
  const ref::Shape q = problem.q_shape(), kv = problem.kv_shape();  // packed: one batch entry of the totals
  const double rows = double(q.batch * q.seq * q.heads);           // B·N·H
  const double kv_rows = double(kv.batch * kv.seq * kv.heads);     // B·N_k·H_kv
  return (2.0 * rows + 2.0 * kv_rows) * double(problem.head_dim) * 2.0 + rows * 4.0;  // Q, O, K, V (16-bit) + LSE
}

double attention_bwd_flops(const ref::AttentionProblem& problem) { return 2.5 * attention_fwd_flops(problem); }

double attention_bwd_bytes(const ref::AttentionProblem& problem) {
  // B·N·H and B·N_k·H_kv (packed: total_q·H and total_k·H_kv)
  const ref::Shape q = problem.q_shape(), kv = problem.kv_shape();
  const double rows = double(q.batch * q.seq * q.heads), kv_rows = double(kv.batch * kv.seq * kv.heads);
  // Q O dO dQ and K V dK dV (16-bit) + LSE, D, D (fp32)
  return (4.0 * rows + 4.0 * kv_rows) * double(problem.head_dim) * 2.0 + 3.0 * rows * 4.0;
}

std::vector<AttentionBenchRow> bench_attention(const AttentionBenchConfig& bench,
                                               const std::function<void(const AttentionBenchRow&)>& on_row) {
  validate(bench);
  std::string why;
  if (!device_available(&why)) throw CudaError("no usable CUDA device: " + why);

  const std::size_t buffers = kPerSet * std::size_t(bench.input_sets);
  std::size_t max_numel = 0;
  for (int d : bench.head_dims)
    for (int n : bench.seqs) {
      const ref::AttentionProblem p = problem_of(bench, n, d, false);
      max_numel = std::max({max_numel, p.q_shape().numel(), p.kv_shape().numel()});
    }
  std::vector<std::uint16_t> pool(max_numel + kStride * buffers);
  {
    std::mt19937 rng(bench.seed);
    std::normal_distribution<float> normal(0.f, 1.f);
    for (auto& x : pool) x = to_bits16(normal(rng), bench.dtype);
  }

  detail::LaunchTimer timer(bench.flush_bytes, bench.flush_dirty ? detail::L2Flush::dirty : detail::L2Flush::clean);
  std::vector<AttentionBenchRow> rows;
  // Packed: one shape per (d, causal), the sequences' own (`seqs` is not read).
  const std::vector<int> seqs = bench.packed ? std::vector<int>{0} : bench.seqs;
  for (int d : bench.head_dims)
    for (bool causal : bench.causal)
      for (int n : seqs) bench_shape(bench, problem_of(bench, n, d, causal), pool, timer, rows, on_row);
  return rows;
}

std::vector<AttentionBenchRow> bench_attention_forward(const AttentionBenchConfig& bench,
                                                       const std::function<void(const AttentionBenchRow&)>& on_row) {
  AttentionBenchConfig fwd = bench;
  fwd.pass = BenchPass::fwd;
  return bench_attention(fwd, on_row);
}

}  // namespace flashlab::cuda
