// bench_stream_estimate.cpp — a standalone timer of the fast bf16 STREAM estimate over a sweep of
// T × d × k (one head, b_q = b_k = 64, causal), through flashlab::cuda::stream::
// time_stream_fast_estimate (stream_fast_estimate.hpp): seeded random inputs made on the device,
// L2 flushed before every launch, CUDA events, median/min/max; I checked equal after every launch.
//
// Usage: bench_cuda_stream_estimate [--seq 32768,1048576] [--dim 64,128] [--k 8,16,32]
//        [--heads 1] [--reps 10] [--warmup 2] [--traffic] [--csv out.csv]
// --traffic also measures one launch per shape with CUPTI (measure_fast_estimate_traffic: L2 → SM
// and DRAM bytes after an L2 flush; needs the performance counters) and prints the bandwidths
// they imply over the median time.
#include "flashlab/cuda/options.hpp"
#include "flashlab/cuda/profiler.hpp"
#include "flashlab/cuda/stream_fast_estimate.hpp"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <sstream>
#include <string>
#include <vector>

namespace fs = flashlab::cuda::stream;

namespace {

std::vector<long long> parse_list(const char* s) {
  std::vector<long long> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(std::atoll(item.c_str()));
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<long long> seqs{32768, 131072, 1048576}, dims{128}, ks{8};
  long long heads = 1;
  int reps = 10, warmup = 2;
  const char* csv_path = nullptr;
  bool traffic = false;
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    const bool has_value = a + 1 < argc;
    if (arg == "--csv" && has_value) csv_path = argv[++a];
    else if (arg == "--reps" && has_value) reps = std::atoi(argv[++a]);
    else if (arg == "--warmup" && has_value) warmup = std::atoi(argv[++a]);
    else if (arg == "--heads" && has_value) heads = std::atoll(argv[++a]);
    else if (arg == "--seq" && has_value) seqs = parse_list(argv[++a]);
    else if (arg == "--dim" && has_value) dims = parse_list(argv[++a]);
    else if (arg == "--k" && has_value) ks = parse_list(argv[++a]);
    else if (arg == "--traffic") traffic = true;
    else {
      std::fprintf(stderr, "error: unknown or incomplete argument '%s' (hint: --seq a,b --dim 64,128 --k 8,16 "
                           "--heads H --reps R --warmup W --csv F)\n", arg.c_str());
      return 2;
    }
  }
  for (const auto* list : {&seqs, &dims, &ks})
    for (const long long v : *list)
      if (v < 1) {
        std::fprintf(stderr, "error: --seq, --dim and --k values must be positive (got %lld)\n", v);
        return 2;
      }
  if (heads < 1 || reps < 1 || warmup < 0) {
    std::fprintf(stderr, "error: --heads and --reps must be at least 1, --warmup at least 0\n");
    return 2;
  }
  FILE* csv = csv_path ? std::fopen(csv_path, "w") : nullptr;
  if (csv_path && !csv) {
    std::fprintf(stderr, "error: cannot write %s\n", csv_path);
    return 1;
  }
  try {
    std::string why;
    if (!flashlab::cuda::device_available(&why)) {
      std::fprintf(stderr, "error: bench_cuda_stream_estimate needs a CUDA device: %s\n", why.c_str());
      return 1;
    }
    const std::string device = flashlab::cuda::device_description();
    std::printf("device: %s\n", device.c_str());
    if (csv) std::fprintf(csv, "kernel,dtype,T,H,d,bq,bk,k,ms,min_ms,max_ms,extra_bytes,same_every_launch,checksum,"
                          "l2_read_bytes,dram_read_bytes\n");
    std::printf("%9s %3s %4s %4s %10s %10s %10s %12s %5s %18s\n", "T", "H", "d", "k", "ms", "min", "max", "extra B",
                "same", "checksum of I");
    for (const long long d : dims)
      for (const long long k : ks)
        for (const long long T : seqs) {
          const fs::FastEstimateTiming r = fs::time_stream_fast_estimate(std::size_t(T), std::size_t(heads),
                                                                         std::size_t(d), std::size_t(k), reps, warmup,
                                                                         0x5eed + std::uint64_t(T));
          std::printf("%9zu %3zu %4zu %4zu %10.3f %10.3f %10.3f %12zu %5s 0x%016llx", r.T, r.heads, r.d, r.k,
                      r.median_ms, r.min_ms, r.max_ms, r.extra_bytes, r.same_every_launch ? "yes" : "NO",
                      static_cast<unsigned long long>(r.indices_checksum));
          flashlab::cuda::KernelCounters c;
          if (traffic) {
            c = fs::measure_fast_estimate_traffic(std::size_t(T), std::size_t(heads), std::size_t(d), std::size_t(k),
                                                  0x5eed + std::uint64_t(T));
            std::printf("  L2->SM %.3f GB (%.2f TB/s), DRAM %.3f GB (%.2f TB/s), one launch %.3f ms", c.l2_read_bytes / 1e9,
                        c.l2_read_bytes / (r.median_ms * 1e9), c.dram_read_bytes / 1e9,
                        c.dram_read_bytes / (r.median_ms * 1e9), c.duration_ns / 1e6);
          }
          std::printf("\n");
          std::fflush(stdout);
          if (csv)
            std::fprintf(csv, "fast,bf16,%zu,%zu,%zu,64,64,%zu,%.4f,%.4f,%.4f,%zu,%d,0x%016llx,%.0f,%.0f\n", r.T,
                         r.heads, r.d, r.k, r.median_ms, r.min_ms, r.max_ms, r.extra_bytes,
                         r.same_every_launch ? 1 : 0, static_cast<unsigned long long>(r.indices_checksum),
                         traffic ? c.l2_read_bytes : -1.0, traffic ? c.dram_read_bytes : -1.0);
        }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    if (csv) std::fclose(csv);
    return 1;
  }
  if (csv) std::fclose(csv);
  return 0;
}
