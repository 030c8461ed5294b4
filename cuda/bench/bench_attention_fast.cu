// bench_attention_fast.cu — times the fast tensor-core forward (cuda/src/attention_fwd_tc.cu).
//
// Method (issue 7): bf16, B = 1, H = 16, N ∈ {1024 … 16384}, d ∈ {64, 128}, causal and not. Per
// shape: 3 warm-up launches, then `--reps` (default 30) timed launches, each timed alone with CUDA
// events, the L2 flushed before each (a 256 MiB memset outside the timed range) and the inputs
// rotated over 3 independent Q/K/V sets. Reports the median: ms, TFLOP/s (fwd FLOPs = 4·N²·d·H,
// halved for causal), and effective GB/s (Q, K, V read once + O written once, per the ideal model).
// `--csv FILE` also writes the rows for cuda/bench/sdpa_bench.py, which runs PyTorch SDPA on the
// same shapes and prints our/their ratios.
//
// Usage: bench_cuda_attention [--csv out.csv] [--reps 30] [--seq 1024,2048] [--dim 64,128]
//        [--causal 0,1] [--dtype bf16|fp16]
#include "flashlab/cuda/fast_attention.hpp"
#include "flashlab/cuda/options.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace fc = flashlab::cuda;

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "error: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

std::vector<int> parse_list(const char* s) {
  std::vector<int> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(std::atoi(item.c_str()));
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> seqs = {1024, 2048, 4096, 8192, 16384}, dims = {64, 128}, causals = {0, 1};
  int reps = 30;
  const char* csv_path = nullptr;
  fc::FastDtype dtype = fc::FastDtype::bf16;
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    const bool has_value = a + 1 < argc;
    if (arg == "--csv" && has_value) csv_path = argv[++a];
    else if (arg == "--reps" && has_value) reps = std::max(1, std::atoi(argv[++a]));
    else if (arg == "--seq" && has_value) seqs = parse_list(argv[++a]);
    else if (arg == "--dim" && has_value) dims = parse_list(argv[++a]);
    else if (arg == "--causal" && has_value) causals = parse_list(argv[++a]);
    else if (arg == "--dtype" && has_value) dtype = std::strcmp(argv[++a], "fp16") == 0 ? fc::FastDtype::fp16 : fc::FastDtype::bf16;
    else {
      std::fprintf(stderr, "error: unknown or incomplete argument '%s' (hint: --csv F --reps R --seq a,b --dim 64,128 --causal 0,1 --dtype bf16)\n", arg.c_str());
      return 2;
    }
  }
  std::string why;
  if (!fc::device_available(&why)) {
    std::fprintf(stderr, "error: bench_cuda_attention needs a CUDA device: %s\n", why.c_str());
    return 1;
  }
  std::printf("device: %s\n", fc::device_description().c_str());
  const int H = 16, B = 1, kSets = 3, kWarm = 3;
  const std::size_t flush_bytes = std::size_t(256) << 20;
  void* flush = nullptr;
  check(cudaMalloc(&flush, flush_bytes), "cudaMalloc flush");

  FILE* csv = csv_path ? std::fopen(csv_path, "w") : nullptr;
  if (csv_path && !csv) {
    std::fprintf(stderr, "error: cannot write %s\n", csv_path);
    return 1;
  }
  if (csv) std::fprintf(csv, "dtype,d,causal,N,H,B,ms,tflops,gbps\n");
  std::printf("%-5s %4s %6s %6s %10s %9s %9s\n", "dtype", "d", "causal", "N", "ms", "TFLOP/s", "GB/s");

  cudaEvent_t e0, e1;
  check(cudaEventCreate(&e0), "event");
  check(cudaEventCreate(&e1), "event");
  // One pool of random 16-bit values, made once; input buffer k is uploaded from offset 997·k, so
  // the 3 sets × (Q, K, V) differ without drawing 9 · B·N·H·d normals per shape.
  std::size_t max_numel = 0;
  for (int d : dims)
    for (int N : seqs) max_numel = std::max(max_numel, std::size_t(B) * N * H * d);
  std::vector<std::uint16_t> pool(max_numel + 997 * 3 * kSets);
  {
    std::mt19937 rng(1234);
    std::normal_distribution<float> normal(0.f, 1.f);
    for (auto& x : pool)
      x = dtype == fc::FastDtype::bf16 ? fc::float_to_bf16(normal(rng)) : fc::float_to_fp16(normal(rng));
  }
  for (int d : dims)
    for (int causal : causals)
      for (int N : seqs) {
        const std::size_t numel = std::size_t(B) * N * H * d;
        std::vector<void*> bufs;  // kSets × (Q, K, V)
        for (int k = 0; k < 3 * kSets; ++k) {
          void* p = nullptr;
          check(cudaMalloc(&p, numel * 2), "cudaMalloc input");
          check(cudaMemcpy(p, pool.data() + 997 * k, numel * 2, cudaMemcpyHostToDevice), "upload");
          bufs.push_back(p);
        }
        void* O = nullptr;
        float* LSE = nullptr;
        check(cudaMalloc(&O, numel * 2), "cudaMalloc O");
        check(cudaMalloc(&LSE, std::size_t(B) * H * N * sizeof(float)), "cudaMalloc LSE");
        fc::FastForwardConfig cfg;
        cfg.batch = B;
        cfg.seq = N;
        cfg.heads = H;
        cfg.head_dim = d;
        cfg.causal = causal != 0;
        cfg.dtype = dtype;
        std::vector<float> times;
        for (int r = 0; r < kWarm + reps; ++r) {
          const int set = r % kSets;
          check(cudaMemsetAsync(flush, r & 0xff, flush_bytes), "L2 flush");  // outside the timed range
          check(cudaEventRecord(e0), "record");
          fc::fast_attention_forward_device(cfg, bufs[3 * set], bufs[3 * set + 1], bufs[3 * set + 2], O, LSE);
          check(cudaEventRecord(e1), "record");
          check(cudaEventSynchronize(e1), "sync");
          float ms = 0.f;
          check(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
          if (r >= kWarm) times.push_back(ms);
        }
        check(cudaGetLastError(), "after the runs");
        std::sort(times.begin(), times.end());
        const double ms = times[times.size() / 2];
        const double flops = 4.0 * double(N) * N * d * H * B * (causal ? 0.5 : 1.0);
        const double tflops = flops / (ms * 1e-3) / 1e12;
        const double gbps = 4.0 * double(numel) * 2 / (ms * 1e-3) / 1e9;
        const char* dt = dtype == fc::FastDtype::bf16 ? "bf16" : "fp16";
        std::printf("%-5s %4d %6d %6d %10.4f %9.1f %9.1f\n", dt, d, causal, N, ms, tflops, gbps);
        std::fflush(stdout);
        if (csv) std::fprintf(csv, "%s,%d,%d,%d,%d,%d,%.6f,%.3f,%.1f\n", dt, d, causal, N, H, B, ms, tflops, gbps);
        for (void* p : bufs) check(cudaFree(p), "free");
        check(cudaFree(O), "free");
        check(cudaFree(LSE), "free");
      }
  if (csv) std::fclose(csv);
  check(cudaFree(flush), "free");
  return 0;
}
