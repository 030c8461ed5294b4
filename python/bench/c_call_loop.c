/* c_call_loop.c — flashlab's C ABI timed from C: the baseline of the Python package's costs
 * (bench_attention.py --c-loop).
 *
 * 1. Host time of one flashlab_attention_forward call: the empty-work shape of bench_attention.py
 *    (B = H = N = 1, d = 64, bf16) on device memory, default stream; 1000 calls, each timed alone
 *    with CLOCK_MONOTONIC, the stream synchronised every 100 calls outside the timed calls; the
 *    median and quartiles in microseconds.
 * 2. With arguments B H N d, the forward and backward through the ABI at that shape (bf16,
 *    non-causal and causal) timed as `flashlab bench attention` times its kernels: 3 warm-up + 30
 *    calls, each alone between CUDA events, L2 flushed (a 256 MiB memset) before each; medians in ms.
 *
 * Build (the CUDA build does: target c_call_loop), or by hand against a CUDA build's library:
 *   cc -O2 -std=c11 python/bench/c_call_loop.c -Icapi/include -I/usr/local/cuda/include \
 *      -Lbuild/cuda/capi -lflashlab -L/usr/local/cuda/lib64 -lcudart_static -ldl -lpthread -lrt
 * Usage: c_call_loop [B H N d]
 */
#define _POSIX_C_SOURCE 199309L /* clock_gettime under -std=c11 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "flashlab.h"

enum { CALLS = 1000, SYNC_EVERY = 100, WARMUP = 3, REPS = 30 };

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static void* device_alloc(size_t bytes) {
  void* p = NULL;
  if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
    fprintf(stderr, "error: cudaMalloc(%zu) failed\n", bytes);
    exit(3);
  }
  cudaMemset(p, 0, bytes);
  return p;
}

static void check(flashlab_status s) {
  if (s != FLASHLAB_OK) {
    fprintf(stderr, "error: %s\n", flashlab_last_error());
    exit(3);
  }
}

static flashlab_tensor tensor(void* p) {
  flashlab_tensor t = {p, {0, 0, 0}};
  return t;
}

static void host_time(void) {
  void *q = device_alloc(128), *k = device_alloc(128), *v = device_alloc(128), *o = device_alloc(128);
  void* lse = device_alloc(4);
  flashlab_attention_problem p = flashlab_attention_defaults();
  p.seq_q = 1;
  p.head_dim = 64;
  p.dtype = FLASHLAB_DTYPE_BF16;
  static double us[CALLS];
  for (int i = 0; i < 100 + CALLS; ++i) {
    if (i % SYNC_EVERY == 0) cudaStreamSynchronize(NULL);
    double t0 = now_us();
    flashlab_status s = flashlab_attention_forward(&p, FLASHLAB_DEVICE_CUDA, tensor(q), tensor(k), tensor(v),
                                                   tensor(o), lse, NULL, 0, NULL);
    double t1 = now_us();
    check(s);
    if (i >= 100) us[i - 100] = t1 - t0; /* the first 100 calls warm up */
  }
  cudaStreamSynchronize(NULL);
  qsort(us, CALLS, sizeof us[0], cmp);
  printf("median_us %.3f\nq1_us %.3f\nq3_us %.3f\n", 0.5 * (us[CALLS / 2 - 1] + us[CALLS / 2]), us[CALLS / 4],
         us[3 * CALLS / 4]);
}

/* Median ms of the forward (backward = 0) or the backward at one shape, L2 flushed before each call. */
static double device_time(flashlab_attention_problem p, int backward, void* flush, size_t flush_bytes) {
  const size_t n = (size_t)p.batch * p.seq_q * p.heads * p.head_dim * 2, nl = (size_t)p.batch * p.heads * p.seq_q * 4;
  void *q = device_alloc(n), *k = device_alloc(n), *v = device_alloc(n), *o = device_alloc(n), *lse = device_alloc(nl);
  void *d_o = device_alloc(n), *dq = device_alloc(n), *dk = device_alloc(n), *dv = device_alloc(n);
  size_t ws_bytes = 0;
  check(flashlab_attention_backward_workspace_size(&p, FLASHLAB_DEVICE_CUDA, &ws_bytes));
  void* ws = device_alloc(ws_bytes);
  check(flashlab_attention_forward(&p, FLASHLAB_DEVICE_CUDA, tensor(q), tensor(k), tensor(v), tensor(o), lse, NULL, 0,
                                   NULL));
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  double ms[REPS];
  for (int r = 0; r < WARMUP + REPS; ++r) {
    cudaMemsetAsync(flush, r & 0xff, flush_bytes, NULL);
    cudaEventRecord(e0, NULL);
    if (backward)
      check(flashlab_attention_backward(&p, FLASHLAB_DEVICE_CUDA, tensor(q), tensor(k), tensor(v), tensor(o), lse,
                                        tensor(d_o), tensor(dq), tensor(dk), tensor(dv), ws, ws_bytes, NULL));
    else
      check(flashlab_attention_forward(&p, FLASHLAB_DEVICE_CUDA, tensor(q), tensor(k), tensor(v), tensor(o), lse,
                                       NULL, 0, NULL));
    cudaEventRecord(e1, NULL);
    cudaEventSynchronize(e1);
    float t = 0.f;
    cudaEventElapsedTime(&t, e0, e1);
    if (r >= WARMUP) ms[r - WARMUP] = t;
  }
  qsort(ms, REPS, sizeof ms[0], cmp);
  void* all[] = {q, k, v, o, lse, d_o, dq, dk, dv, ws};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) cudaFree(all[i]);
  return 0.5 * (ms[REPS / 2 - 1] + ms[REPS / 2]);
}

int main(int argc, char** argv) {
  host_time();
  if (argc == 5) {
    flashlab_attention_problem p = flashlab_attention_defaults();
    p.batch = atoll(argv[1]);
    p.heads = atoll(argv[2]);
    p.seq_q = atoll(argv[3]);
    p.head_dim = atoll(argv[4]);
    p.dtype = FLASHLAB_DTYPE_BF16;
    const size_t flush_bytes = (size_t)256 << 20;
    void* flush = device_alloc(flush_bytes);
    for (int causal = 0; causal <= 1; ++causal) {
      p.causal = causal;
      printf("abi_ms fwd %d %.6f\n", causal, device_time(p, 0, flush, flush_bytes));
      printf("abi_ms bwd %d %.6f\n", causal, device_time(p, 1, flush, flush_bytes));
    }
  }
  return 0;
}
