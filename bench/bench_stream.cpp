// bench_stream — time and peak memory of STREAM mask estimation (the STREAM paper, §8 "Auxiliary memory
// bound"; the target: T = 131072, D = 64, b_q = b_k = 64, k = 8 with no T × T buffer).
//
// What it does: generates seeded normal Q, K (float storage: 2·T·D·4 bytes), records the peak RSS
// (getrusage ru_maxrss) after the inputs exist, runs stream_estimate `--reps` times and reports the
// median wall time and the peak RSS after. The difference is the estimator's auxiliary memory:
// I (n_q·k int64 + scores) and one b_q × b_k tile per thread. A T × T float score matrix would
// need 4·T² bytes (64 GiB at T = 131072) — the RSS shows none exists.
//
// Usage: bench_stream [--seq T] [--dim D] [--bq BQ] [--bk BK] [--k K] [--threads N] [--reps R]
// Defaults: the target configuration above, 2 threads, 3 repetitions. Honest notes: the scoring is an
// Eigen float GEMM per candidate tile (b_q × d by d × b_k); single-core GEMM speed dominates.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "flashlab/reference/stream.hpp"

namespace rs = flashlab::ref::stream;
using flashlab::ref::Mat;

namespace {

long peak_rss_kib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;  // KiB on Linux
}

Mat<float> random_mat(std::size_t rows, std::size_t cols, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  Mat<float> m(static_cast<Eigen::Index>(rows), static_cast<Eigen::Index>(cols));
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = dist(rng);
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t T = 131072, D = 64, bq = 64, bk = 64, k = 8, threads = 2, reps = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "error: %s needs a value\nhint: bench_stream [--seq T] [--dim D] [--bq BQ] [--bk BK] [--k K] [--threads N] [--reps R]\n", a.c_str());
      return 2;
    }
    char* end = nullptr;
    const unsigned long long v = std::strtoull(argv[i + 1], &end, 10);
    if (*end != '\0' || v == 0) {
      std::fprintf(stderr, "error: %s '%s' is not a positive integer\n", a.c_str(), argv[i + 1]);
      return 2;
    }
    ++i;
    if (a == "--seq") T = v;
    else if (a == "--dim") D = v;
    else if (a == "--bq") bq = v;
    else if (a == "--bk") bk = v;
    else if (a == "--k") k = v;
    else if (a == "--threads") threads = v;
    else if (a == "--reps") reps = v;
    else {
      std::fprintf(stderr, "error: unknown flag %s\n", a.c_str());
      return 2;
    }
  }

  const long rss_start = peak_rss_kib();
  const Mat<float> Q = random_mat(T, D, 1), K = random_mat(T, D, 2);
  const long rss_inputs = peak_rss_kib();
  const rs::BlockMask mask(rs::Geometry{T, bq, bk});

  std::vector<double> seconds;
  rs::EstimateResult res;
  for (std::size_t r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    res = rs::stream_estimate(Q, K, mask, rs::EstimateParams{k, threads});
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const long rss_end = peak_rss_kib();
  std::sort(seconds.begin(), seconds.end());
  const std::string violation = rs::validate_indices(res.indices, k, mask);
  const rs::Bounds b = rs::stream_bounds(mask.geometry(), D, k);
  const double io = double(res.traffic.find("Q")->read_elements + res.traffic.find("K")->read_elements);

  std::printf("bench_stream --seq %zu --dim %zu --bq %zu --bk %zu --k %zu --threads %zu --reps %zu\n", T, D, bq, bk,
              k, threads, reps);
  std::printf("  storage float32; n_q=%zu n_k=%zu n_it=%zu\n", b.n_q, b.n_k, b.n_it);
  std::printf("  estimate time: median %.3f s (min %.3f, max %.3f) over %zu runs\n", seconds[seconds.size() / 2],
              seconds.front(), seconds.back(), reps);
  std::printf("  peak RSS: start %.1f MiB, after inputs %.1f MiB, after estimate %.1f MiB (auxiliary %.1f MiB)\n",
              rss_start / 1024.0, rss_inputs / 1024.0, rss_end / 1024.0, (rss_end - rss_inputs) / 1024.0);
  std::printf("  a dense T x T float score matrix would need %.1f GiB\n", 4.0 * double(T) * double(T) / (1ull << 30));
  std::printf("  blocks scored %llu (max per query block %llu); IO_est %.4g B vs paper upper %.4g B (ratio %.3f), "
              "lower %.4g B\n",
              static_cast<unsigned long long>(res.blocks_scored),
              static_cast<unsigned long long>(res.max_blocks_scored_per_q), io * 4, b.io_upper_paper * 4,
              io / b.io_upper_paper, b.io_lower * 4);
  std::printf("  flops %.4g (%.2f GFLOP/s); checksum 0x%016llx; validity invariant %s\n",
              double(res.traffic.flops()), double(res.traffic.flops()) / seconds[seconds.size() / 2] * 1e-9,
              static_cast<unsigned long long>(rs::indices_checksum(res.indices)),
              violation.empty() ? "holds" : violation.c_str());
  return violation.empty() ? 0 : 1;
}
