// l2_flush_check.cu — what an L2 flush leaves behind, measured: the launch timer of the benchmarks
// (core/bench_timing.hpp) with each flush (none, the memset alone = dirty, memset + read-back =
// clean) times an empty kernel, a read of X bytes (16-byte loads through L2, as a decoding step
// streams K and V), a device-to-device copy of X bytes (two cudaMemcpyAsync halves, as the
// --kv-copy anchor of `flashlab bench attention`) and a memset of X bytes.
//
// Why: after the memset flush L2 holds up to its size of dirty lines; a timed launch that reads
// evicts them and pays their write-back inside its events, one that writes leaves as many of its
// own behind at its stop event. The rows show how much each flush charges each kind of launch.
//
// Usage: bench_l2_flush [--reps R] [--csv]   (one GPU; X = 64 MiB, 128 MiB, 512 MiB, 2 GiB)
// Output, one row per (flush, operation, X): flush,op,bytes,median_us,min_us,max_us,tbps, where tbps
// counts the bytes read (read), read + written (copy) or written (memset) over the median.
#include "core/bench_timing.hpp"
#include "core/common.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

namespace fcd = flashlab::cuda::detail;

namespace {

__global__ void empty_kernel() {}

/// Reads n 16-byte words (grid-stride, L2-cached), xors them; writes only if the xor is a value
/// the inputs cannot give, so the loads stay and nothing is written.
__global__ void read_kernel(const uint4* __restrict__ x, std::size_t n, unsigned* __restrict__ sink) {
  unsigned acc = 0;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcg(x + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;  // the buffer holds 0x01 bytes: the xor is 0 or 0x01010101
}

struct Row {
  std::string flush, op;
  std::size_t bytes;
  fcd::LaunchTimes t;
  double moved;  // bytes that count for the rate
};

}  // namespace

int main(int argc, char** argv) {
  int reps = 30;
  bool csv = false;
  for (int a = 1; a < argc; ++a) {
    if (!std::strcmp(argv[a], "--reps") && a + 1 < argc) reps = std::atoi(argv[++a]);
    else if (!std::strcmp(argv[a], "--csv")) csv = true;
    else {
      std::fprintf(stderr, "error: unknown argument '%s'\nhint: bench_l2_flush [--reps R] [--csv]\n", argv[a]);
      return 2;
    }
  }
  if (reps < 1) {
    std::fprintf(stderr, "error: --reps %d must be >= 1\n", reps);
    return 2;
  }
  try {
    const std::vector<std::size_t> sizes = {std::size_t(64) << 20, std::size_t(128) << 20, std::size_t(512) << 20,
                                            std::size_t(2048) << 20};
    const std::size_t max_bytes = sizes.back();
    fcd::DeviceBuffer<unsigned char> src(max_bytes), dst(max_bytes);
    fcd::DeviceBuffer<unsigned> sink(1);
    FLASHLAB_CUDA_CHECK(cudaMemset(src.get(), 1, max_bytes));
    int sms = 0;
    FLASHLAB_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const std::size_t flush_bytes = std::size_t(256) << 20;
    struct Flush {
      const char* name;
      std::size_t bytes;
      fcd::L2Flush mode;
    };
    const Flush flushes[] = {{"none", 0, fcd::L2Flush::clean},
                             {"dirty", flush_bytes, fcd::L2Flush::dirty},
                             {"clean", flush_bytes, fcd::L2Flush::clean}};
    std::vector<Row> rows;
    for (const Flush& f : flushes) {
      fcd::LaunchTimer timer(f.bytes, f.mode);
      rows.push_back({f.name, "empty", 0, timer.time(3, reps, [](int) { empty_kernel<<<1, 32>>>(); }), 0.0});
      for (std::size_t x : sizes) {
        rows.push_back({f.name, "read", x, timer.time(3, reps, [&](int) {
                          read_kernel<<<unsigned(8 * sms), 256>>>(reinterpret_cast<const uint4*>(src.get()), x / 16,
                                                                  sink.get());
                        }),
                        double(x)});
        rows.push_back({f.name, "copy", x, timer.time(3, reps, [&](int) {
                          FLASHLAB_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.get(), x / 2, cudaMemcpyDeviceToDevice));
                          FLASHLAB_CUDA_CHECK(cudaMemcpyAsync(dst.get() + x / 2, src.get() + x / 2, x / 2,
                                                              cudaMemcpyDeviceToDevice));
                        }),
                        2.0 * double(x)});
        rows.push_back({f.name, "memset", x, timer.time(3, reps, [&](int r) {
                          FLASHLAB_CUDA_CHECK(cudaMemsetAsync(dst.get(), r & 0xff, x));
                        }),
                        double(x)});
      }
    }
    FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
    std::printf(csv ? "flush,op,bytes,median_us,min_us,max_us,tbps\n"
                    : "flush  op      bytes         median_us   min_us   max_us   TB/s\n");
    for (const Row& r : rows) {
      const double tbps = r.moved > 0 ? r.moved / (r.t.median_ms * 1e-3) / 1e12 : 0.0;
      std::printf(csv ? "%s,%s,%zu,%.2f,%.2f,%.2f,%.3f\n" : "%-6s %-7s %-12zu %9.2f %8.2f %8.2f %6.3f\n",
                  r.flush.c_str(), r.op.c_str(), r.bytes, 1e3 * r.t.median_ms, 1e3 * r.t.min_ms, 1e3 * r.t.max_ms,
                  tbps);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
