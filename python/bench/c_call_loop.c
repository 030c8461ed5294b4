/* c_call_loop.c — the host time of one flashlab_attention_forward call from C: the baseline the
 * Python package's per-call cost is measured against (bench_attention.py --c-loop).
 *
 * The empty-work shape of bench_attention.py (B = H = N = 1, d = 64, bf16) on device memory, on
 * the default stream; 1000 calls, each timed alone with CLOCK_MONOTONIC, the stream synchronised
 * every 100 calls outside the timed calls; prints the median and the quartiles in microseconds.
 *
 * Build (the CUDA build does: target c_call_loop), or by hand against a CUDA build's library:
 *   cc -O2 -std=c11 python/bench/c_call_loop.c -Icapi/include -I/usr/local/cuda/include \
 *      -Lbuild/cuda/capi -lflashlab -L/usr/local/cuda/lib64 -lcudart_static -ldl -lpthread -lrt
 */
#define _POSIX_C_SOURCE 199309L /* clock_gettime under -std=c11 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "flashlab.h"

enum { CALLS = 1000, SYNC_EVERY = 100 };

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

int main(void) {
  host_time();
  return 0;
}
