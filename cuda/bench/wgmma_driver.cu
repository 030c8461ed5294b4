// wgmma_driver.cu — standalone test + timing driver for the wgmma forward
// (cuda/src/attention_fwd_wgmma.cu) that can pick its schedule at run time (wgmma_forward_launch's
// variant), with its own threaded float64 reference. Not part of the CMake build (the wired checks
// are tests/cuda/test_cuda_fast.cpp [fast-wgmma] and `flashlab bench attention --fwd-kernel wgmma`).
// Build (from the repo root, after building flashlab_cuda in BUILD):
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -Icuda/src -Icuda/include \
//        -Ireference/include --expt-relaxed-constexpr cuda/bench/wgmma_driver.cu \
//        BUILD/cuda/libflashlab_cuda.a BUILD/reference/libflashlab_reference_core.a -o wgmma_driver
// Usage: wgmma_driver test    correctness vs a float64 reference (own, threaded), all shapes, both schedules
//        wgmma_driver small   small shapes only (for compute-sanitizer)
//        wgmma_driver bench out.csv [variant]
//                             timings (variant 0 = plain, 2 = overlapped schedule; default 2) in the
//                             `flashlab bench attention --csv` format (for cuda/bench/sdpa_bench.py),
//                             then sampled rows vs float64 and a NaN scan on fresh inputs per shape
// Errors as tests/cuda/test_cuda_fast.cpp: max|O − O_ref| / max|O_ref| ≤ 1e-2 and ≤ 2× the error of
// O_ref merely rounded to 16 bits (+1e-7); LSE (base 2) error vs max ≤ 1e-4; any NaN fails.
#include "common.hpp"
#include "launchers.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace fd = flashlab::cuda::detail;

#define CK(x)                                                                                     \
  do {                                                                                            \
    cudaError_t e_ = (x);                                                                         \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", #x, __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(2);                                                                               \
    }                                                                                             \
  } while (0)

static uint16_t to16(float f, bool bf16) {
  if (bf16) {
    __nv_bfloat16 h = __float2bfloat16_rn(f);
    uint16_t u;
    std::memcpy(&u, &h, 2);
    return u;
  }
  __half h = __float2half_rn(f);
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}
static float from16(uint16_t u, bool bf16) {
  if (bf16) {
    __nv_bfloat16 h;
    std::memcpy(&h, &u, 2);
    return __bfloat162float(h);
  }
  __half h;
  std::memcpy(&h, &u, 2);
  return __half2float(h);
}

struct Case {
  int B, N, H, d;
  bool causal, bf16;
};

struct Host {
  std::vector<uint16_t> q, k, v;
  std::vector<double> qd, kd, vd;  // the same values, exactly (the rounded inputs)
};

static Host make_inputs(const Case& c, unsigned seed) {
  const std::size_t n = std::size_t(c.B) * c.N * c.H * c.d;
  Host h;
  h.q.resize(n), h.k.resize(n), h.v.resize(n), h.qd.resize(n), h.kd.resize(n), h.vd.resize(n);
  // N(0, 1) values, generated in parallel chunks (one generator per chunk: reproducible for a seed).
  auto fill = [&](std::vector<uint16_t>& b, std::vector<double>& dv, unsigned salt) {
    const int nt = std::max(1u, std::min(32u, std::thread::hardware_concurrency()));
    const std::size_t chunk = (n + nt - 1) / nt;
    std::vector<std::thread> th;
    for (int w = 0; w < nt; ++w)
      th.emplace_back([&, w] {
        std::mt19937 rng(seed * 1000003u + salt * 7919u + unsigned(w));
        std::normal_distribution<float> nd(0.f, 1.f);
        for (std::size_t i = std::size_t(w) * chunk; i < std::min(n, std::size_t(w + 1) * chunk); ++i) {
          b[i] = to16(nd(rng), c.bf16);
          dv[i] = from16(b[i], c.bf16);
        }
      });
    for (auto& t : th) t.join();
  };
  fill(h.q, h.qd, 1);
  fill(h.k, h.kd, 2);
  fill(h.v, h.vd, 3);
  return h;
}

/// float64 reference for the listed rows of every (b, h): O rows [B,N,H,d], LSE base 2 [B,H,N].
static void reference(const Case& c, const Host& h, const std::vector<int>& rows, std::vector<double>& O,
                      std::vector<double>& L) {
  const std::size_t stride = std::size_t(c.H) * c.d;
  const double scale = 1.0 / std::sqrt(double(c.d));
  O.assign(std::size_t(c.B) * c.H * rows.size() * c.d, 0.0);
  L.assign(std::size_t(c.B) * c.H * rows.size(), 0.0);
  const int jobs = c.B * c.H * int(rows.size());
  const int nt = std::max(1u, std::min(32u, std::thread::hardware_concurrency()));
  std::vector<std::thread> th;
  for (int w = 0; w < nt; ++w)
    th.emplace_back([&, w] {
      std::vector<double> s(c.N);
      for (int job = w; job < jobs; job += nt) {
        const int ri = job % int(rows.size()), bh = job / int(rows.size());
        const int b = bh / c.H, hh = bh % c.H, i = rows[ri];
        const double* q = h.qd.data() + (std::size_t(b) * c.N + i) * stride + std::size_t(hh) * c.d;
        const int last = c.causal ? i : c.N - 1;
        double m = -INFINITY;
        for (int j = 0; j <= last; ++j) {
          const double* k = h.kd.data() + (std::size_t(b) * c.N + j) * stride + std::size_t(hh) * c.d;
          double acc = 0;
          for (int e = 0; e < c.d; ++e) acc += q[e] * k[e];
          s[j] = acc * scale;
          m = std::max(m, s[j]);
        }
        double l = 0;
        double* o = O.data() + std::size_t(job) * c.d;
        for (int j = 0; j <= last; ++j) {
          const double pj = std::exp(s[j] - m);
          l += pj;
          const double* v = h.vd.data() + (std::size_t(b) * c.N + j) * stride + std::size_t(hh) * c.d;
          for (int e = 0; e < c.d; ++e) o[e] += pj * v[e];
        }
        for (int e = 0; e < c.d; ++e) o[e] /= l;
        L[job] = (m + std::log(l)) / std::log(2.0);
      }
    });
  for (auto& t : th) t.join();
}

struct Dev {
  void *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  float* lse = nullptr;
  std::size_t n = 0, stats = 0;
  Dev(const Case& c, const Host& h) {
    n = std::size_t(c.B) * c.N * c.H * c.d;
    stats = std::size_t(c.B) * c.H * c.N;
    CK(cudaMalloc(&q, n * 2));
    CK(cudaMalloc(&k, n * 2));
    CK(cudaMalloc(&v, n * 2));
    CK(cudaMalloc(&o, n * 2));
    CK(cudaMalloc(&lse, stats * 4));
    CK(cudaMemcpy(q, h.q.data(), n * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(k, h.k.data(), n * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(v, h.v.data(), n * 2, cudaMemcpyHostToDevice));
    CK(cudaMemset(o, 0xff, n * 2));  // NaN poison: every output must be written
    CK(cudaMemset(lse, 0xff, stats * 4));
  }
  ~Dev() {
    cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(o), cudaFree(lse);
  }
};

static fd::Problem problem(const Case& c) {
  fd::Problem p;
  p.batch = c.B, p.seq = c.N, p.heads = c.H, p.head_dim = c.d, p.causal = c.causal;
  p.block_m = 128, p.block_n = 128;
  p.scale = float(1.0 / std::sqrt(double(c.d)));
  p.scale_log2 = float(double(p.scale) * 1.4426950408889634);
  return p;
}

/// Runs once, compares the given rows (all rows when `rows` is empty) with float64; true = pass.
static bool check(const Case& c, int variant, bool all_rows, const char* tag) {
  const Host h = make_inputs(c, 1234u + unsigned(c.N) * 7u + unsigned(c.d) + (c.causal ? 1u : 0u));
  Dev dv(c, h);
  const fd::Problem p = problem(c);
  CK(fd::wgmma_forward_launch(p, c.bf16, dv.q, dv.k, dv.v, dv.o, dv.lse, nullptr, variant));
  CK(cudaDeviceSynchronize());
  std::vector<uint16_t> o(dv.n);
  std::vector<float> lse(dv.stats);
  CK(cudaMemcpy(o.data(), dv.o, dv.n * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(lse.data(), dv.lse, dv.stats * 4, cudaMemcpyDeviceToHost));
  std::size_t nan = 0;
  for (auto u : o) nan += std::isnan(from16(u, c.bf16)) ? 1 : 0;
  for (auto x : lse) nan += std::isnan(x) ? 1 : 0;
  std::vector<int> rows;
  if (all_rows) {
    for (int i = 0; i < c.N; ++i) rows.push_back(i);
  } else {  // first, last, and spread rows (and both sides of every 128-row tile edge it hits)
    for (int i = 0; i < c.N; i += std::max(1, c.N / 48)) rows.push_back(i);
    for (int i : {1, 63, 64, 127, 128, c.N - 2, c.N - 1})
      if (i >= 0 && i < c.N) rows.push_back(i);
  }
  std::vector<double> Oref, Lref;
  reference(c, h, rows, Oref, Lref);
  const std::size_t stride = std::size_t(c.H) * c.d;
  double max_ref = 0, max_err = 0, max_floor = 0, max_lref = 0, max_lerr = 0;
  for (int b = 0; b < c.B; ++b)
    for (int hh = 0; hh < c.H; ++hh)
      for (std::size_t ri = 0; ri < rows.size(); ++ri) {
        const int i = rows[ri];
        const std::size_t job = (std::size_t(b) * c.H + hh) * rows.size() + ri;
        for (int e = 0; e < c.d; ++e) {
          const double r = Oref[job * c.d + e];
          const double got = from16(o[(std::size_t(b) * c.N + i) * stride + std::size_t(hh) * c.d + e], c.bf16);
          max_ref = std::max(max_ref, std::fabs(r));
          const double err = std::fabs(got - r);
          max_err = std::isnan(err) ? INFINITY : std::max(max_err, err);
          max_floor = std::max(max_floor, std::fabs(double(from16(to16(float(r), c.bf16), c.bf16)) - r));
        }
        const double lr = Lref[job];
        const double lg = lse[(std::size_t(b) * c.H + hh) * c.N + i];
        max_lref = std::max(max_lref, std::fabs(lr));
        const double le = std::fabs(lg - lr);
        max_lerr = std::isnan(le) ? INFINITY : std::max(max_lerr, le);
      }
  const double eO = max_err / max_ref, eF = max_floor / max_ref, eL = max_lerr / max_lref;
  const bool ok = nan == 0 && eO <= 1e-2 && eO <= 2 * eF + 1e-7 && eL <= 1e-4;
  std::printf("%s %-4s d=%3d %-6s B=%d N=%5d H=%2d rows=%-5s v%d: O err %.3e (16-bit floor %.3e) LSE err %.3e NaN %zu  %s\n",
              tag, c.bf16 ? "bf16" : "fp16", c.d, c.causal ? "causal" : "full", c.B, c.N, c.H,
              all_rows ? "all" : "some", variant, eO, eF, eL, nan, ok ? "PASS" : "FAIL");
  std::fflush(stdout);
  return ok;
}

static int run_tests(bool small) {
  int fails = 0;
  // Descriptor-convention probe: if the first case fails, show the swapped V descriptor too.
  const Case probe{1, 256, 1, 128, false, true};
  if (!check(probe, 0, true, "probe")) check(probe, 1, true, "probe");
  std::vector<Case> cases;
  const std::vector<int> Ns = small ? std::vector<int>{1, 17, 130} : std::vector<int>{1, 17, 128, 1000, 4096};
  for (int bf = 1; bf >= 0; --bf)
    for (int d : {128, 64})
      for (int causal : {0, 1})
        for (int N : Ns) {
          if (!bf && N == 4096) continue;  // fp16: the smaller shapes suffice
          const int B = N <= 128 ? 2 : 1, H = N >= 4096 ? 2 : 3;
          cases.push_back({B, N, H, d, causal != 0, bf != 0});
        }
  for (int variant : {0, 2})  // plain schedule, overlapped schedule
    for (const auto& c : cases) fails += check(c, variant, true, "test") ? 0 : 1;
  std::printf("%s: %d of %zu checks failed\n", small ? "small" : "test", fails, 2 * cases.size());
  return fails;
}

static int run_bench(const char* csv_path, int variant) {
  FILE* f = std::fopen(csv_path, "w");
  if (!f) return 3;
  std::fprintf(f, "dtype,pass,d,causal,N,H,B,ms,min_ms,max_ms,tflops,gbps\n");
  void* flush = nullptr;
  const std::size_t flush_bytes = 256u << 20;
  CK(cudaMalloc(&flush, flush_bytes));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  int fails = 0;
  struct B {
    int d, causal, N;
  };
  const std::vector<B> shapes = {{128, 0, 8192}, {128, 0, 16384}, {128, 1, 8192}, {128, 1, 16384},
                                 {64, 0, 8192},  {64, 0, 16384},  {64, 1, 16384}};
  for (const auto& s : shapes) {
    const Case c{1, s.N, 16, s.d, s.causal != 0, true};
    const Host h = make_inputs(c, 99u + unsigned(s.N) + unsigned(s.d));
    Dev dv(c, h);
    const fd::Problem p = problem(c);
    for (int w = 0; w < 3; ++w) CK(fd::wgmma_forward_launch(p, true, dv.q, dv.k, dv.v, dv.o, dv.lse, nullptr, variant));
    CK(cudaDeviceSynchronize());
    std::vector<float> ms;
    for (int r = 0; r < 30; ++r) {
      CK(cudaMemsetAsync(flush, r & 0xff, flush_bytes));  // evict L2, outside the timed range
      CK(cudaEventRecord(e0));
      CK(fd::wgmma_forward_launch(p, true, dv.q, dv.k, dv.v, dv.o, dv.lse, nullptr, variant));
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float t = 0;
      CK(cudaEventElapsedTime(&t, e0, e1));
      ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    const double med = ms[ms.size() / 2];
    const double flops = 4.0 * double(c.N) * c.N * c.d * c.H * c.B * (c.causal ? 0.5 : 1.0);
    const double bytes = 4.0 * double(c.N) * c.H * c.d * c.B * 2.0;
    std::fprintf(f, "bf16,fwd,%d,%d,%d,%d,%d,%.6f,%.6f,%.6f,%.3f,%.1f\n", c.d, int(c.causal), c.N, c.H, c.B, med,
                 double(ms.front()), double(ms.back()), flops / (med * 1e-3) / 1e12, bytes / (med * 1e-3) / 1e9);
    std::fflush(f);  // rows survive a time-out
    std::printf("bench v%d bf16 d=%d %s N=%d H=16: median %.4f ms (min %.4f max %.4f) = %.1f TFLOP/s\n", variant, c.d,
                c.causal ? "causal" : "full", c.N, med, double(ms.front()), double(ms.back()),
                flops / (med * 1e-3) / 1e12);
    std::fflush(stdout);
    // The bench shape once more on fresh inputs: sampled rows vs float64 + NaN scan of everything.
    fails += check(c, variant, false, "bench-check") ? 0 : 1;
  }
  std::fclose(f);
  cudaFree(flush);
  return fails;
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "test";
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    std::printf("no CUDA device; skipped\n");
    return 0;
  }
  std::printf("device %s sm_%d%d\n", prop.name, prop.major, prop.minor);
  if (prop.major != 9) {
    std::printf("needs an sm_90 device; skipped\n");
    return 0;
  }
  if (mode == "test") return run_tests(false) ? 1 : 0;
  if (mode == "small") return run_tests(true) ? 1 : 0;
  if (mode == "bench") return run_bench(argc > 2 ? argv[2] : "ours.csv", argc > 3 ? std::atoi(argv[3]) : 2) ? 1 : 0;
  std::fprintf(stderr, "usage: %s test|small|bench [out.csv]\n", argv[0]);
  return 2;
}
