// bench_attention — CPU attention forward: naive Eigen (two big GEMMs, S and P materialised) vs
// flash FA2 (Br × Bc tiles, online softmax) vs FA1, float32, one thread.
//
// Manual. `bench_attention [N] [d] [runs] [Br] [Bc]` (defaults 4096 64 7 64 64, one head). Each
// algorithm runs once to warm up, then `runs` times; the median wall time is printed with the
// command line. The target: flash forward within 2× the naive forward at N = 4096,
// d = 64. Notes: the naive version runs two large Eigen GEMMs but writes and re-reads the N × N
// matrices S and P (64 MiB each at N = 4096 in float32), which do not fit in cache; the flash loop
// runs Tr·Tc small GEMMs on tiles that stay in cache and rescales its accumulator per tile. Which
// one wins depends on the machine; the figures in docs/attention.md are from the build machine.
#include "flashlab/reference/attention.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

using namespace flashlab::ref;

namespace {

double median_ms(int runs, const std::function<void()>& body) {
  body();  // warm-up (allocations, page faults)
  std::vector<double> ms;
  for (int r = 0; r < runs; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    body();
    const auto t1 = std::chrono::steady_clock::now();
    ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

std::size_t arg(int argc, char** argv, int i, std::size_t fallback) {
  if (argc <= i) return fallback;
  const long long v = std::atoll(argv[i]);
  if (v < 1) {
    std::cerr << "error: argument " << i << " ('" << argv[i] << "') must be a positive integer\n"
              << "hint: bench_attention [N] [d] [runs] [Br] [Bc]\n";
    std::exit(2);
  }
  return static_cast<std::size_t>(v);
}

}  // namespace

int main(int argc, char** argv) {
  AttentionProblem cfg;
  cfg.seq = arg(argc, argv, 1, 4096);
  cfg.head_dim = arg(argc, argv, 2, 64);
  const int runs = static_cast<int>(arg(argc, argv, 3, 7));
  cfg.Br = arg(argc, argv, 4, kDefaultBr);
  cfg.Bc = arg(argc, argv, 5, kDefaultBc);
  cfg.heads = 1;
  cfg.batch = 1;
  cfg.validate();

  std::cout << "command: bench_attention " << cfg.seq << " " << cfg.head_dim << " " << runs << " " << cfg.Br << " "
            << cfg.Bc << "\n";
  std::cout << "config:  " << cfg.str() << ", float32 arithmetic, one thread, median of " << runs << " runs\n";

  Tensor<float> Q(cfg.q_shape()), K(cfg.kv_shape()), V(cfg.kv_shape());
  fill_normal(Q, 1);
  fill_normal(K, 2);
  fill_normal(V, 3);

  float sink = 0.0f;  // keeps the results alive
  const double naive = median_ms(runs, [&] { sink += naive_forward(cfg, Q, K, V).O.data()[0]; });
  const double fa2 = median_ms(runs, [&] { sink += flash_forward_fa2(cfg, Q, K, V).O.data()[0]; });
  const double fa1 = median_ms(runs, [&] { sink += flash_forward_fa1(cfg, Q, K, V).O.data()[0]; });

  const auto total = [](const Traffic& t) { return t.total_read_bytes() + t.total_write_bytes(); };
  std::cout << "naive forward (Eigen, S and P materialised): " << naive << " ms   modelled HBM bytes "
            << total(attention_traffic_formula(Algorithm::naive_fwd, cfg)) << "\n";
  std::cout << "flash forward FA2 (Br x Bc tiles):           " << fa2 << " ms   modelled HBM bytes "
            << total(attention_traffic_formula(Algorithm::fa2_fwd, cfg)) << "\n";
  std::cout << "flash forward FA1 (KV outer):                " << fa1 << " ms   modelled HBM bytes "
            << total(attention_traffic_formula(Algorithm::fa1_fwd, cfg)) << "\n";
  std::cout << "FA2 / naive time: " << fa2 / naive << "  (target: at most 2)\n";
  std::cout << "(checksum " << sink << ")\n";
  return 0;
}
