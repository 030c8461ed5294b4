// bench_context_parallel — times context-parallel (ring) attention on G GPUs of this machine, one
// process driving them all (flashlab::cuda::bench_context_parallel, the method is stated there),
// beside the single-GPU fast kernels on the whole problem; writes one CSV row per pass.
// cuda/bench/context_parallel.sh runs the checks and the scaling sweeps with it.
//
// Usage: bench_cuda_context_parallel --gpus G --seq N [--heads 16] [--heads-kv H_kv] [--dim 128]
//        [--batch 1] [--causal 0|1] [--layout zigzag|contiguous] [--dtype bf16|fp16]
//        [--pass fwd|bwd|both] [--reps 5] [--warmups 1] [--no-single]
//        [--single-fwd-ms MS --single-bwd-ms MS (one GPU's times measured earlier on this machine:
//         no new single-GPU run, these give the efficiency)]
//        [--fwd-kernel fastest|mma|wgmma|tma-ws] [--bwd-kernel fastest|mma|wgmma-ws]
//        [--csv FILE (appended; the header when the file is new)] [--label TEXT]
//
// Columns: date (UTC), device, label, gpus, layout, causal, N, B, H, H_kv, d, dtype, pass,
// fwd/bwd kernel, ring ms (median, min, max), ring TFLOP/s per GPU, single-GPU ms and TFLOP/s,
// strong-scaling efficiency (single ms / (G · ring ms)), bytes one GPU sends by the model and as
// handed to NCCL, whether they are equal, the longest exchange and step compute, the exposed ms.
#include "flashlab/cuda/context_parallel.hpp"
#include "flashlab/cuda/options.hpp"

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <string>

namespace fc = flashlab::cuda;
namespace fr = flashlab::ref;

namespace {

[[noreturn]] void usage(const std::string& what) {
  std::fprintf(stderr,
               "error: %s\nhint: bench_cuda_context_parallel --gpus 2 --seq 65536 [--heads 16 --heads-kv 4 --dim 128 "
               "--causal 1 --pass both --reps 5 --csv out.csv]\n",
               what.c_str());
  std::exit(2);
}

long long number(const char* flag, const char* text, long long lo, long long hi) {
  char* end = nullptr;
  const long long v = std::strtoll(text, &end, 10);
  if (!end || *end || v < lo || v > hi)
    usage(std::string(flag) + " '" + text + "' is not an integer in " + std::to_string(lo) + " … " + std::to_string(hi));
  return v;
}

std::string utc_now() {
  char buf[32];
  const std::time_t t = std::time(nullptr);
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M", std::gmtime(&t));
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  setenv("NCCL_NVLS_ENABLE", "0", 0);  // NVLink multicast off unless the caller set it
  fc::RingBenchConfig cfg;
  fr::ContextParallelProblem& p = cfg.problem;
  p.attention.heads = 16;
  p.attention.head_dim = 128;
  p.attention.dtype = fr::Dtype::bf16;
  std::string layout, csv_path, label = "ring", fwd_kernel = "fastest", bwd_kernel = "fastest", pass = "both";
  bool have_gpus = false, have_seq = false;
  double given_single[2] = {-1, -1};  // forward, backward
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    if (arg == "--no-single") {
      cfg.single = false;
      continue;
    }
    if (a + 1 >= argc) usage("'" + arg + "' is unknown or lacks its value");
    const char* v = argv[++a];
    if (arg == "--gpus") p.gpus = std::size_t(number("--gpus", v, 1, 64)), have_gpus = true;
    else if (arg == "--seq") p.attention.seq = std::size_t(number("--seq", v, 1, 1LL << 26)), have_seq = true;
    else if (arg == "--heads") p.attention.heads = std::size_t(number("--heads", v, 1, 1024));
    else if (arg == "--heads-kv") p.heads_kv = std::size_t(number("--heads-kv", v, 1, 1024));
    else if (arg == "--dim") p.attention.head_dim = std::size_t(number("--dim", v, 1, 1024));
    else if (arg == "--batch") p.attention.batch = std::size_t(number("--batch", v, 1, 1024));
    else if (arg == "--causal") p.attention.causal = number("--causal", v, 0, 1) != 0;
    else if (arg == "--layout") layout = v;
    else if (arg == "--dtype") {
      const std::string dt = v;
      if (dt != "bf16" && dt != "fp16") usage("--dtype '" + dt + "' is not bf16 or fp16");
      p.attention.dtype = fr::parse_dtype(dt);
    } else if (arg == "--pass") pass = v;
    else if (arg == "--reps") cfg.reps = int(number("--reps", v, 1, 1000));
    else if (arg == "--warmups") cfg.warmups = int(number("--warmups", v, 0, 100));
    else if (arg == "--fwd-kernel") fwd_kernel = v;
    else if (arg == "--bwd-kernel") bwd_kernel = v;
    else if (arg == "--csv") csv_path = v;
    else if (arg == "--label") label = v;
    else if (arg == "--single-fwd-ms" || arg == "--single-bwd-ms") {
      char* end = nullptr;
      const double ms = std::strtod(v, &end);
      if (!end || *end || !(ms > 0)) usage(arg + " '" + v + "' is not a positive number of milliseconds");
      given_single[arg == "--single-fwd-ms" ? 0 : 1] = ms;
      cfg.single = false;
    }
    else usage("'" + arg + "' is unknown");
  }
  if (!have_gpus || !have_seq) usage("--gpus and --seq are required");
  if (pass != "fwd" && pass != "bwd" && pass != "both") usage("--pass '" + pass + "' is not fwd, bwd or both");
  cfg.forward = pass != "bwd";
  cfg.backward = pass != "fwd";
  try {
    p.layout = layout.empty() ? (p.attention.causal ? fr::ShardLayout::zigzag : fr::ShardLayout::contiguous)
                              : fr::parse_layout(layout);
    fc::check_context_parallel_problem(p);
    std::string why;
    if (!fc::device_available(&why)) {
      std::fprintf(stderr, "error: bench_cuda_context_parallel needs CUDA GPUs: %s\n", why.c_str());
      return 1;
    }
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || std::size_t(count) < p.gpus) {
      std::fprintf(stderr, "error: --gpus %zu but this machine has %d GPUs\nhint: --gpus %d or fewer\n", p.gpus, count,
                   count);
      return 1;
    }
    if (fwd_kernel == "fastest") cfg.forward_kernel = fc::fastest_forward_kernel();
    else if (fwd_kernel == "mma") cfg.forward_kernel = fc::FastForwardKernel::mma_sync;
    else if (fwd_kernel == "wgmma") cfg.forward_kernel = fc::FastForwardKernel::wgmma;
    else if (fwd_kernel == "tma-ws") cfg.forward_kernel = fc::FastForwardKernel::tma_ws;
    else usage("--fwd-kernel '" + fwd_kernel + "' is not fastest, mma, wgmma or tma-ws");
    if (bwd_kernel == "fastest") cfg.backward_kernel = fc::fastest_backward_kernel();
    else if (bwd_kernel == "mma") cfg.backward_kernel = fc::FastBackwardKernel::mma_sync;
    else if (bwd_kernel == "wgmma-ws") cfg.backward_kernel = fc::FastBackwardKernel::wgmma_ws;
    else usage("--bwd-kernel '" + bwd_kernel + "' is not fastest, mma or wgmma-ws");

    std::vector<int> devices;
    for (std::size_t r = 0; r < p.gpus; ++r) devices.push_back(int(r));
    const fc::LocalRing ring(devices);
    auto passes = fc::bench_context_parallel(cfg, ring);
    for (auto& r : passes)
      if (r.single_ms < 0) r.single_ms = given_single[r.pass == fr::RingPass::forward ? 0 : 1];

    FILE* csv = nullptr;
    if (!csv_path.empty()) {
      FILE* probe = std::fopen(csv_path.c_str(), "r");
      const bool fresh = probe == nullptr;
      if (probe) std::fclose(probe);
      csv = std::fopen(csv_path.c_str(), "a");
      if (!csv) {
        std::fprintf(stderr, "error: cannot write %s\n", csv_path.c_str());
        return 1;
      }
      if (fresh)
        std::fprintf(csv,
                     "date,device,label,gpus,layout,causal,N,B,H,H_kv,d,dtype,pass,kernel,ring_ms,ring_min_ms,ring_max_ms,"
                     "ring_tflops_per_gpu,single_ms,single_tflops,strong_efficiency,model_bytes_per_gpu,"
                     "counted_bytes_per_gpu,counted_equals_model,max_exchange_ms,max_step_compute_ms,exposed_ms\n");
    }
    // The name alone, as the other result files have it (the description's "(132 SMs, …)" holds a comma).
    const std::string description = fc::device_description();
    const std::string device = description.substr(0, description.find(" ("));
    const std::string date = utc_now();
    bool all_equal = true;
    for (const auto& r : passes) {
      const bool fwd = r.pass == fr::RingPass::forward;
      const char* kernel = fwd ? fc::to_string(cfg.forward_kernel) : fc::to_string(cfg.backward_kernel);
      const double G = double(p.gpus);
      const double ring_tf = r.flops / (r.ring_ms * 1e-3) / G / 1e12;
      const double single_tf = r.single_ms > 0 ? r.flops / (r.single_ms * 1e-3) / 1e12 : -1;
      const double eff = r.single_ms > 0 ? r.single_ms / (G * r.ring_ms) : -1;
      all_equal = all_equal && r.counted_equals_model;
      std::printf("%s G=%zu %s%s N=%zu H=%zu H_kv=%zu d=%zu: ring %.3f ms (%.1f TFLOP/s per GPU)", fwd ? "fwd" : "bwd",
                  p.gpus, fr::layout_name(p.layout).data(), p.attention.causal ? " causal" : "", p.attention.seq,
                  p.attention.heads, p.kv_heads(), p.attention.head_dim, r.ring_ms, ring_tf);
      if (r.single_ms > 0) std::printf(", one GPU %.3f ms (%.1f TFLOP/s), efficiency %.3f", r.single_ms, single_tf, eff);
      std::printf("; sent per GPU %llu B, model %llu B: %s; longest exchange %.3f ms, step %.3f ms, exposed %.3f ms\n",
                  (unsigned long long)r.counted_bytes, (unsigned long long)r.model_bytes,
                  r.counted_equals_model ? "equal" : "DIFFERENT", r.exchange_ms_max, r.compute_ms_max, r.exposed_ms);
      if (csv)
        std::fprintf(csv, "%s,%s,%s,%zu,%s,%d,%zu,%zu,%zu,%zu,%zu,%s,%s,%s,%.4f,%.4f,%.4f,%.1f,%.4f,%.1f,%.4f,%llu,%llu,%d,%.4f,%.4f,%.4f\n",
                     date.c_str(), device.c_str(), label.c_str(), p.gpus, fr::layout_name(p.layout).data(),
                     int(p.attention.causal), p.attention.seq, p.attention.batch, p.attention.heads, p.kv_heads(),
                     p.attention.head_dim, fr::dtype_name(p.attention.dtype).data(), fwd ? "fwd" : "bwd", kernel,
                     r.ring_ms, r.ring_min_ms, r.ring_max_ms, ring_tf, r.single_ms, single_tf, eff,
                     (unsigned long long)r.model_bytes, (unsigned long long)r.counted_bytes,
                     int(r.counted_equals_model), r.exchange_ms_max, r.compute_ms_max, r.exposed_ms);
    }
    if (csv) std::fclose(csv);
    return all_equal ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
