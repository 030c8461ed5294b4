// bench_attention_fast.cpp — a thin driver over flashlab::cuda::bench_attention_forward
// (cuda/src/attention/bench.cpp), the same harness as `flashlab bench attention`, which is the command to
// use (it validates its flags and prints a table or CSV). This program is a small standalone
// timer of the forward, handy when trying a new tile tuple without rebuilding the CLI.
//
// Method, see flashlab/cuda/bench.hpp: per shape 3 warm-ups, then --reps (default 30)
// launches each timed alone with CUDA events, L2 flushed before each, inputs rotated over 3 sets;
// median/min/max ms, TFLOP/s (4·N²·d·H·B, halved for causal), effective GB/s (Q, K, V, O, LSE).
//
// Usage: bench_cuda_attention [--csv out.csv] [--reps 30] [--seq 1024,2048] [--dim 64,128]
//        [--causal 0,1] [--dtype bf16|fp16]
#include "flashlab/cuda/bench.hpp"
#include "flashlab/cuda/options.hpp"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <sstream>
#include <string>
#include <vector>

namespace fc = flashlab::cuda;

namespace {

std::vector<int> parse_list(const char* s) {
  std::vector<int> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(std::atoi(item.c_str()));
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  fc::AttentionBenchConfig b;
  const char* csv_path = nullptr;
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    const bool has_value = a + 1 < argc;
    if (arg == "--csv" && has_value) csv_path = argv[++a];
    else if (arg == "--reps" && has_value) b.reps = std::atoi(argv[++a]);
    else if (arg == "--seq" && has_value) b.seqs = parse_list(argv[++a]);
    else if (arg == "--dim" && has_value) b.head_dims = parse_list(argv[++a]);
    else if (arg == "--causal" && has_value) {
      b.causal.clear();
      for (int c : parse_list(argv[++a])) b.causal.push_back(c != 0);
    } else if (arg == "--dtype" && has_value) {
      const std::string dt = argv[++a];
      b.dtype = dt == "fp16" ? flashlab::ref::Dtype::fp16 : flashlab::ref::Dtype::bf16;
    } else {
      std::fprintf(stderr, "error: unknown or incomplete argument '%s' (hint: --csv F --reps R --seq a,b --dim 64,128 --causal 0,1 --dtype bf16; or use `flashlab bench attention`)\n", arg.c_str());
      return 2;
    }
  }
  FILE* csv = csv_path ? std::fopen(csv_path, "w") : nullptr;
  if (csv_path && !csv) {
    std::fprintf(stderr, "error: cannot write %s\n", csv_path);
    return 1;
  }
  const char* dt = b.dtype == flashlab::ref::Dtype::bf16 ? "bf16" : "fp16";
  try {
    std::string why;
    if (!fc::device_available(&why)) {
      std::fprintf(stderr, "error: bench_cuda_attention needs a CUDA device: %s\n", why.c_str());
      return 1;
    }
    std::printf("device: %s\n", fc::device_description().c_str());
    if (csv) std::fprintf(csv, "dtype,d,causal,N,H,B,ms,min_ms,max_ms,tflops,gbps\n");
    std::printf("%-5s %4s %6s %6s %10s %9s %9s\n", "dtype", "d", "causal", "N", "ms", "TFLOP/s", "GB/s");
    fc::bench_attention_forward(b, [&](const fc::AttentionBenchRow& r) {
      const auto& c = r.attention.problem;
      std::printf("%-5s %4zu %6d %6zu %10.4f %9.1f %9.1f\n", dt, c.head_dim, int(c.causal), c.seq, r.median_ms,
                  r.tflops, r.gbps);
      std::fflush(stdout);
      if (csv)
        std::fprintf(csv, "%s,%zu,%d,%zu,%zu,%zu,%.6f,%.6f,%.6f,%.3f,%.1f\n", dt, c.head_dim, int(c.causal), c.seq,
                     c.heads, c.batch, r.median_ms, r.min_ms, r.max_ms, r.tflops, r.gbps);
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    if (csv) std::fclose(csv);
    return 1;
  }
  if (csv) std::fclose(csv);
  return 0;
}
