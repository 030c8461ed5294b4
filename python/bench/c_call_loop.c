/* c_call_loop.c — the host time of one flashlab_attention_forward call from C: the baseline the
 * Python package's per-call overhead is measured against (bench_attention.py --c-loop).
 *
 * The empty-work shape of bench_attention.py (B = H = N = 1, d = 64, bf16) on device memory, on
 * the default stream; 1000 calls, each timed alone with CLOCK_MONOTONIC, the stream synchronised
 * every 100 calls outside the timed calls; prints the median and the quartiles in microseconds.
 *
 * Build (against the CUDA build's library):
 *   cc -O2 -std=c11 python/bench/c_call_loop.c -Icapi/include -I/usr/local/cuda/include \
 *      -Lbuild/cuda/capi -lflashlab -L/usr/local/cuda/lib64 -lcudart -o c_call_loop
 */
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

int main(void) {
  void *q, *k, *v, *o;
  float* lse;
  if (cudaMalloc(&q, 128) || cudaMalloc(&k, 128) || cudaMalloc(&v, 128) || cudaMalloc(&o, 128) ||
      cudaMalloc((void**)&lse, 4)) {
    fprintf(stderr, "error: cudaMalloc failed\n");
    return 3;
  }
  cudaMemset(q, 0, 128);
  cudaMemset(k, 0, 128);
  cudaMemset(v, 0, 128);
  flashlab_attention_problem p = flashlab_attention_defaults();
  p.seq_q = 1;
  p.head_dim = 64;
  p.dtype = FLASHLAB_DTYPE_BF16;
  flashlab_tensor tq = {q, {0, 0, 0}}, tk = {k, {0, 0, 0}}, tv = {v, {0, 0, 0}}, to = {o, {0, 0, 0}};
  static double us[CALLS];
  for (int i = 0; i < 100 + CALLS; ++i) {
    if (i % SYNC_EVERY == 0) cudaStreamSynchronize(NULL);
    double t0 = now_us();
    flashlab_status s = flashlab_attention_forward(&p, FLASHLAB_DEVICE_CUDA, tq, tk, tv, to, lse, NULL, 0, NULL);
    double t1 = now_us();
    if (s != FLASHLAB_OK) {
      fprintf(stderr, "error: %s\n", flashlab_last_error());
      return 3;
    }
    if (i >= 100) us[i - 100] = t1 - t0;  /* the first 100 calls warm up */
  }
  cudaStreamSynchronize(NULL);
  qsort(us, CALLS, sizeof us[0], cmp);
  printf("median_us %.3f\nq1_us %.3f\nq3_us %.3f\n", 0.5 * (us[CALLS / 2 - 1] + us[CALLS / 2]), us[CALLS / 4],
         us[3 * CALLS / 4]);
  return 0;
}
