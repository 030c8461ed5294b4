/* Every refusal of the C ABI, from C: NULL pointers, struct_size, bad shapes and values, dtypes
 * and devices a build or device lacks, tensor strides, workspaces, STREAM's indices and mask.
 * Each case checks the status, that the calling thread's message names the function and the
 * argument or field, carries a hint where one helps, and that a refused call wrote nothing.
 * Plain C11 on flashlab.h and libflashlab.so only; exit 0 when every case passes. */
#include "flashlab.h"

#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_checks = 0, g_failures = 0;

/* `call` must return `want` with a message containing the function name and each of `parts`. */
static void expect_(const char* file, int line, const char* text, flashlab_status got, flashlab_status want,
                    const char* function, const char* part1, const char* part2) {
  ++g_checks;
  const char* msg = flashlab_last_error();
  const int ok = got == want && strstr(msg, function) == msg && (!part1 || strstr(msg, part1)) &&
                 (!part2 || strstr(msg, part2));
  if (!ok) {
    ++g_failures;
    fprintf(stderr, "%s:%d: FAILED %s\n  status %s (wanted %s)\n  message: \"%s\"\n  wanted \"%s\" then \"%s\", \"%s\"\n",
            file, line, text, flashlab_status_name(got), flashlab_status_name(want), msg, function,
            part1 ? part1 : "", part2 ? part2 : "");
  }
}
#define EXPECT(call, want, function, part1, part2) \
  expect_(__FILE__, __LINE__, #call, (call), (want), (function), (part1), (part2))

static void expect_ok_(const char* file, int line, const char* text, flashlab_status got) {
  ++g_checks;
  if (got != FLASHLAB_OK || flashlab_last_error()[0] != '\0') {
    ++g_failures;
    fprintf(stderr, "%s:%d: FAILED %s: %s \"%s\" (wanted FLASHLAB_OK and an empty message)\n", file, line, text,
            flashlab_status_name(got), flashlab_last_error());
  }
}
#define EXPECT_OK(call) expect_ok_(__FILE__, __LINE__, #call, (call))

static void expect_true_(const char* file, int line, const char* text, int ok) {
  ++g_checks;
  if (!ok) {
    ++g_failures;
    fprintf(stderr, "%s:%d: FAILED %s\n", file, line, text);
  }
}
#define EXPECT_TRUE(cond) expect_true_(__FILE__, __LINE__, #cond, (cond))

static flashlab_tensor tensor(void* data) {
  flashlab_tensor t;
  t.data = data;
  t.stride[0] = t.stride[1] = t.stride[2] = 0;
  return t;
}

/* Buffers big enough for every problem below, filled with a pattern a refused call must keep. */
enum { kBig = 1 << 16 };
static float g_in[kBig], g_out[kBig], g_stat[kBig], g_w[64];
static int64_t g_idx[4096];

static int untouched(void) {
  for (int i = 0; i < kBig; ++i)
    if (g_out[i] != -7.0f) return 0;
  return 1;
}

static flashlab_attention_problem attention_f32(void) {
  flashlab_attention_problem p = flashlab_attention_defaults();
  p.seq_q = 5, p.head_dim = 4, p.dtype = FLASHLAB_DTYPE_F32;
  return p;
}

/* Packed sequences: the prefix sums' refusals, each naming the list and the entry. */
static void packed_cases(flashlab_attention_problem dense, flashlab_tensor in, flashlab_tensor out) {
  const char* fwd = "flashlab_attention_forward";
  const flashlab_device cpu = FLASHLAB_DEVICE_CPU;
  int32_t cu_q[4] = {0, 2, 3, 5}, cu_k[4] = {0, 1, 4, 6};
  flashlab_attention_problem p = dense;
  p.batch = 3, p.seq_q = 2, p.seq_k = 3, p.total_q = 5, p.total_k = 6, p.cu_seqlens_q = cu_q, p.cu_seqlens_k = cu_k;
  EXPECT_OK(flashlab_attention_check(&p, cpu));
  EXPECT_OK(flashlab_attention_forward(&p, cpu, in, in, in, out, g_stat, NULL, 0, NULL));
  for (int i = 0; i < kBig; ++i) g_out[i] = -7.0f;
  flashlab_attention_problem bad = p;
  bad.cu_seqlens_k = NULL;
  EXPECT(flashlab_attention_forward(&bad, cpu, in, in, in, out, g_stat, NULL, 0, NULL), FLASHLAB_ERROR_INVALID_ARGUMENT,
         fwd, "problem->cu_seqlens_k is NULL but cu_seqlens_q is set", "hint:");
  /* not increasing */
  int32_t down[4] = {0, 3, 2, 5};
  bad = p, bad.cu_seqlens_q = down, bad.seq_q = 3;
  EXPECT(flashlab_attention_forward(&bad, cpu, in, in, in, out, g_stat, NULL, 0, NULL), FLASHLAB_ERROR_INVALID_ARGUMENT,
         fwd, "problem->cu_seqlens_q: ", "cu_seqlens_q[2] = 2 is below cu_seqlens_q[1] = 3");
  /* not starting at 0 */
  int32_t late[4] = {1, 2, 3, 5};
  bad = p, bad.cu_seqlens_q = late;
  EXPECT(flashlab_attention_check(&bad, cpu), FLASHLAB_ERROR_INVALID_ARGUMENT, "flashlab_attention_check",
         "problem->cu_seqlens_q: ", "cu_seqlens_q[0] = 1 is not 0");
  /* the last entry is not the packed tensor's rows */
  bad = p, bad.total_k = 7;
  EXPECT(flashlab_attention_check(&bad, cpu), FLASHLAB_ERROR_INVALID_ARGUMENT, "flashlab_attention_check",
         "problem->cu_seqlens_k[3] = 6 differs from problem->total_k = 7", "hint:");
  /* negative */
  int32_t negative[4] = {0, -1, 4, 6};
  bad = p, bad.cu_seqlens_k = negative;
  EXPECT(flashlab_attention_check(&bad, cpu), FLASHLAB_ERROR_INVALID_ARGUMENT, "flashlab_attention_check",
         "problem->cu_seqlens_k[1] = -1 is negative", NULL);
  /* a sequence longer than max_seqlen (seq_q, seq_k) */
  bad = p, bad.seq_q = 1;
  EXPECT(flashlab_attention_check(&bad, cpu), FLASHLAB_ERROR_INVALID_ARGUMENT, "flashlab_attention_check",
         "problem->cu_seqlens_q holds a sequence of 2 queries, longer than problem->seq_q = 1", NULL);
  bad = p, bad.seq_k = 2;
  EXPECT(flashlab_attention_check(&bad, cpu), FLASHLAB_ERROR_INVALID_ARGUMENT, "flashlab_attention_check",
         "problem->cu_seqlens_k holds a sequence of 3 keys, longer than problem->seq_k = 2", NULL);
  /* totals beyond the lists' int32 entries, or set on a dense problem */
  bad = p, bad.total_q = (int64_t)1 << 31;
  EXPECT(flashlab_attention_check(&bad, cpu), FLASHLAB_ERROR_INVALID_ARGUMENT, "flashlab_attention_check",
         "problem->total_q = 2147483648 is above 2147483647", NULL);
  bad = dense, bad.total_q = 5;
  EXPECT(flashlab_attention_check(&bad, cpu), FLASHLAB_ERROR_INVALID_ARGUMENT, "flashlab_attention_check",
         "problem->total_q = 5 is above 0", "0 unless cu_seqlens are set");
#ifdef FLASHLAB_TEST_HAVE_CUDA
  /* On CUDA the lists are device memory, never read on the host: the forward and the backward
   * take them (the kernels read them), the totals are checked; the deterministic backward (the
   * two-kernel design) needs D alone, 4·H·total_q bytes. */
  bad = p, bad.dtype = FLASHLAB_DTYPE_BF16, bad.head_dim = 64;
  EXPECT_OK(flashlab_attention_check(&bad, FLASHLAB_DEVICE_CUDA));
  /* A backward workspace on CUDA is the size the device's kernel needs, so it asks the device: a
   * build with CUDA on a machine without a usable GPU gets a CUDA error naming the runtime call,
   * and the sizes are checked where a device answers. */
  size_t packed_bytes = 0;
  const int device = flashlab_attention_backward_workspace_size(&bad, FLASHLAB_DEVICE_CUDA, &packed_bytes) == FLASHLAB_OK;
  if (!device) {
    EXPECT(flashlab_attention_backward_workspace_size(&bad, FLASHLAB_DEVICE_CUDA, &packed_bytes), FLASHLAB_ERROR_CUDA,
           "flashlab_attention_backward_workspace_size", "cudaGetDevice", NULL);
    printf("no usable CUDA device: the CUDA backward workspace sizes are not checked\n");
  } else {
    EXPECT_OK(flashlab_attention_backward_workspace_size(&bad, FLASHLAB_DEVICE_CUDA, (size_t*)g_idx));
    bad.deterministic = 1;
    EXPECT_OK(flashlab_attention_backward_workspace_size(&bad, FLASHLAB_DEVICE_CUDA, &packed_bytes));
    EXPECT_TRUE(packed_bytes == 4 * (size_t)bad.heads * (size_t)bad.total_q);
    bad.deterministic = 0;
  }
  bad.total_k = 0;
  EXPECT(flashlab_attention_check(&bad, FLASHLAB_DEVICE_CUDA), FLASHLAB_ERROR_INVALID_ARGUMENT,
         "flashlab_attention_check", "problem->total_k = 0 is below 1", NULL);
  bad.total_k = 6, bad.cu_seqlens_k = NULL;
  EXPECT(flashlab_attention_check(&bad, FLASHLAB_DEVICE_CUDA), FLASHLAB_ERROR_INVALID_ARGUMENT,
         "flashlab_attention_check", "problem->cu_seqlens_k is NULL but cu_seqlens_q is set", "hint:");
  /* deterministic = 1 takes grouped K/V, N_k != N and windows (the two-kernel design, where the
   * fixed-order Hopper kernel refuses them): its workspace is D alone, 4·B·H·N bytes. d = 256 runs
   * on the fixed-order Hopper kernel (it takes all three there), whose workspace is the atomic
   * backward's; where that kernel does not run (no sm_90a build or device) it is refused naming
   * head_dim. */
  flashlab_attention_problem det = flashlab_attention_defaults();
  det.seq_q = 100, det.seq_k = 150, det.heads = 8, det.heads_kv = 2, det.head_dim = 64, det.causal = 1;
  det.window_left = 20, det.deterministic = 1;
  size_t det_bytes = 0;
  if (device) {
    EXPECT_OK(flashlab_attention_backward_workspace_size(&det, FLASHLAB_DEVICE_CUDA, &det_bytes));
    EXPECT_TRUE(det_bytes == 4 * 8 * 100);
    det.head_dim = 256;
    size_t atomic_bytes = 0;
    det.deterministic = 0;
    EXPECT_OK(flashlab_attention_backward_workspace_size(&det, FLASHLAB_DEVICE_CUDA, &atomic_bytes));
    det.deterministic = 1;
    if (flashlab_attention_backward_workspace_size(&det, FLASHLAB_DEVICE_CUDA, &det_bytes) == FLASHLAB_OK)
      EXPECT_TRUE(det_bytes == atomic_bytes);
    else
      EXPECT(flashlab_attention_backward_workspace_size(&det, FLASHLAB_DEVICE_CUDA, &det_bytes),
             FLASHLAB_ERROR_UNSUPPORTED, "flashlab_attention_backward_workspace_size", "head_dim (d) = 256", "hint:");
  }
#endif
}

/* A caller built with ABI minor version 0's header: its struct ends before window_left. The
 * library reads only those bytes (a copy of exactly that size, so a read past it would be out of
 * bounds) and gives the rest their defaults: the result equals the current struct's. */
static void old_struct_cases(void) {
  const flashlab_device cpu = FLASHLAB_DEVICE_CPU;
  flashlab_attention_problem p = attention_f32();
  p.causal = 1;
  const size_t old_size = offsetof(flashlab_attention_problem, window_left);
  unsigned char* old = malloc(old_size);
  memcpy(old, &p, old_size);
  memcpy(old, &old_size, sizeof old_size);
  static float o_new[5 * 4], o_old[5 * 4], l_new[5], l_old[5];
  EXPECT_OK(flashlab_attention_forward(&p, cpu, tensor(g_in), tensor(g_in), tensor(g_in), tensor(o_new), l_new, NULL, 0,
                                       NULL));
  EXPECT_OK(flashlab_attention_forward((const flashlab_attention_problem*)(const void*)old, cpu, tensor(g_in),
                                       tensor(g_in), tensor(g_in), tensor(o_old), l_old, NULL, 0, NULL));
  EXPECT_TRUE(memcmp(o_new, o_old, sizeof o_new) == 0 && memcmp(l_new, l_old, sizeof l_new) == 0);
  /* A size between the two versions' is neither: refused. */
  size_t between = old_size + 8;
  unsigned char mid[sizeof p];
  memcpy(mid, &p, sizeof p);
  memcpy(mid, &between, sizeof between);
  EXPECT(flashlab_attention_check((const flashlab_attention_problem*)(const void*)mid, cpu),
         FLASHLAB_ERROR_INVALID_ARGUMENT, "flashlab_attention_check", "problem->struct_size = ",
         "is no earlier version's size");
  free(old);
}

static void attention_cases(void) {
  const char* fwd = "flashlab_attention_forward";
  const flashlab_device cpu = FLASHLAB_DEVICE_CPU;
  flashlab_attention_problem p = attention_f32();
  flashlab_tensor in = tensor(g_in), out = tensor(g_out);

  EXPECT_OK(flashlab_attention_check(&p, cpu));
  EXPECT_OK(flashlab_attention_forward(&p, cpu, in, in, in, out, g_stat, NULL, 0, NULL));
  for (int i = 0; i < kBig; ++i) g_out[i] = -7.0f;

  /* NULL pointers */
  EXPECT(flashlab_attention_forward(NULL, cpu, in, in, in, out, g_stat, NULL, 0, NULL),
         FLASHLAB_ERROR_INVALID_ARGUMENT, fwd, "problem is NULL", "hint: pass a flashlab_attention_problem built with flashlab_attention_defaults()");
  EXPECT(flashlab_attention_forward(&p, cpu, tensor(NULL), in, in, out, g_stat, NULL, 0, NULL),
         FLASHLAB_ERROR_INVALID_ARGUMENT, fwd, "q.data is NULL", NULL);
  EXPECT(flashlab_attention_forward(&p, cpu, in, in, in, tensor(NULL), g_stat, NULL, 0, NULL),
         FLASHLAB_ERROR_INVALID_ARGUMENT, fwd, "o.data is NULL", NULL);
  EXPECT(flashlab_attention_backward(&p, cpu, in, in, in, in, NULL, in, out, out, out, NULL, 0, NULL),
         FLASHLAB_ERROR_INVALID_ARGUMENT, "flashlab_attention_backward", "lse is NULL", NULL);
  EXPECT(flashlab_attention_forward_workspace_size(&p, cpu, NULL), FLASHLAB_ERROR_INVALID_ARGUMENT,
         "flashlab_attention_forward_workspace_size", "bytes is NULL", NULL);

  /* struct_size */
  flashlab_attention_problem small = p;
  small.struct_size = sizeof small - 8;
  EXPECT(flashlab_attention_check(&small, cpu), FLASHLAB_ERROR_INVALID_ARGUMENT, "flashlab_attention_check",
         "problem->struct_size = ", "hint: set it to sizeof(flashlab_attention_problem)");
  {
    /* A newer caller's struct: larger, its unknown fields zero (accepted) or set (refused). */
    unsigned char newer[sizeof p + 16];
    memset(newer, 0, sizeof newer);
    memcpy(newer, &p, sizeof p);
    size_t size = sizeof newer;
    memcpy(newer, &size, sizeof size);
    EXPECT_OK(flashlab_attention_check((const flashlab_attention_problem*)(const void*)newer, cpu));
    newer[sizeof p + 3] = 1;
    EXPECT(flashlab_attention_check((const flashlab_attention_problem*)(const void*)newer, cpu),
           FLASHLAB_ERROR_UNSUPPORTED, "flashlab_attention_check", "problem->struct_size", "fields past the");
    size = 1u << 30;
    memcpy(newer, &size, sizeof size);
    EXPECT(flashlab_attention_check((const flashlab_attention_problem*)(const void*)newer, cpu),
           FLASHLAB_ERROR_INVALID_ARGUMENT, "flashlab_attention_check", "problem->struct_size = 1073741824", "is not the size");
  }

  /* fields */
  p = attention_f32(), p.seq_q = 0;
  EXPECT(flashlab_attention_forward(&p, cpu, in, in, in, out, g_stat, NULL, 0, NULL), FLASHLAB_ERROR_INVALID_ARGUMENT,
         fwd, "problem->seq_q = 0 is below 1", "hint:");
  p = attention_f32(), p.batch = -3;
  EXPECT(flashlab_attention_check(&p, cpu), FLASHLAB_ERROR_INVALID_ARGUMENT, "flashlab_attention_check",
         "problem->batch = -3", NULL);
  p = attention_f32(), p.head_dim = 0;
  EXPECT(flashlab_attention_check(&p, cpu), FLASHLAB_ERROR_INVALID_ARGUMENT, "flashlab_attention_check",
         "problem->head_dim = 0", NULL);
  p = attention_f32(), p.seq_k = -1;
  EXPECT(flashlab_attention_check(&p, cpu), FLASHLAB_ERROR_INVALID_ARGUMENT, "flashlab_attention_check",
         "problem->seq_k = -1", "0 means N_k = N");
  p = attention_f32(), p.scale = NAN;
  EXPECT(flashlab_attention_check(&p, cpu), FLASHLAB_ERROR_INVALID_ARGUMENT, "flashlab_attention_check",
         "problem->scale = nan", "0 means 1/sqrt(d)");
  p = attention_f32(), p.scale = -1.0;
  EXPECT(flashlab_attention_check(&p, cpu), FLASHLAB_ERROR_INVALID_ARGUMENT, "flashlab_attention_check",
         "problem->scale = -1", NULL);
  p = attention_f32(), p.causal = 2;
  EXPECT(flashlab_attention_check(&p, cpu), FLASHLAB_ERROR_INVALID_ARGUMENT, "flashlab_attention_check",
         "problem->causal = 2", NULL);
  p = attention_f32(), p.deterministic = -1;
  EXPECT(flashlab_attention_check(&p, cpu), FLASHLAB_ERROR_INVALID_ARGUMENT, "flashlab_attention_check",
         "problem->deterministic = -1", NULL);
  p = attention_f32(), p.dtype = (flashlab_dtype)9;
  EXPECT(flashlab_attention_check(&p, cpu), FLASHLAB_ERROR_INVALID_ARGUMENT, "flashlab_attention_check",
         "problem->dtype = 9 is not a flashlab_dtype", NULL);
  p = attention_f32(), p.heads = 4, p.heads_kv = 3;
  EXPECT(flashlab_attention_check(&p, cpu), FLASHLAB_ERROR_INVALID_ARGUMENT, "flashlab_attention_check",
         "problem->heads_kv: ", "heads_kv (H_kv) = 3 does not divide heads (H) = 4");
  p = attention_f32(), p.heads = 4, p.heads_kv = 2; /* grouped-query attention: the CPU takes it */
  EXPECT_OK(flashlab_attention_check(&p, cpu));
  p = attention_f32(), p.heads = 2, p.heads_kv = 4;
  EXPECT(flashlab_attention_check(&p, cpu), FLASHLAB_ERROR_INVALID_ARGUMENT, "flashlab_attention_check",
         "problem->heads_kv: ", "does not divide heads (H) = 2");
  /* windows: -1 (unbounded) or 0 ... 2^31 - 1 keys */
  p = attention_f32(), p.window_left = -2;
  EXPECT(flashlab_attention_check(&p, cpu), FLASHLAB_ERROR_INVALID_ARGUMENT, "flashlab_attention_check",
         "problem->window_left = -2 is below -1", "-1 means unbounded");
  p = attention_f32(), p.window_right = (int64_t)1 << 31;
  EXPECT(flashlab_attention_check(&p, cpu), FLASHLAB_ERROR_INVALID_ARGUMENT, "flashlab_attention_check",
         "problem->window_right = 2147483648 is above 2147483647", NULL);
  p = attention_f32(), p.window_left = 0, p.window_right = 0; /* each query sees its diagonal key only */
  EXPECT_OK(flashlab_attention_check(&p, cpu));
#ifdef FLASHLAB_TEST_HAVE_CUDA
  /* the CUDA forward takes windows too: the front door decides, as for every other field */
  p.dtype = FLASHLAB_DTYPE_BF16, p.head_dim = 64, p.window_left = 128, p.window_right = 0;
  EXPECT_OK(flashlab_attention_check(&p, FLASHLAB_DEVICE_CUDA));
#endif
  p = attention_f32(), p.batch = (int64_t)1 << 40, p.seq_q = (int64_t)1 << 40;
  EXPECT(flashlab_attention_check(&p, cpu), FLASHLAB_ERROR_INVALID_ARGUMENT, "flashlab_attention_check",
         "B·N·H·d is above 2^62", NULL);

  /* devices and dtypes */
  p = attention_f32();
  EXPECT(flashlab_attention_check(&p, (flashlab_device)7), FLASHLAB_ERROR_INVALID_ARGUMENT, "flashlab_attention_check",
         "device = 7 is not a flashlab_device", NULL);
  p.dtype = FLASHLAB_DTYPE_BF16;
  EXPECT(flashlab_attention_forward(&p, cpu, in, in, in, out, g_stat, NULL, 0, NULL), FLASHLAB_ERROR_UNSUPPORTED, fwd,
         "problem->dtype = FLASHLAB_DTYPE_BF16 on FLASHLAB_DEVICE_CPU", "hint: convert the tensors to float or double");
  p = attention_f32();
#ifdef FLASHLAB_TEST_HAVE_CUDA
  EXPECT_TRUE(flashlab_has_cuda() == 1);
  EXPECT(flashlab_attention_check(&p, FLASHLAB_DEVICE_CUDA), FLASHLAB_ERROR_UNSUPPORTED, "flashlab_attention_check",
         "problem->dtype = FLASHLAB_DTYPE_F32 on FLASHLAB_DEVICE_CUDA", "hint:");
#else
  EXPECT_TRUE(flashlab_has_cuda() == 0);
  EXPECT(flashlab_attention_forward(&p, FLASHLAB_DEVICE_CUDA, in, in, in, out, g_stat, NULL, 0, NULL),
         FLASHLAB_ERROR_UNSUPPORTED, fwd, "FLASHLAB_DEVICE_CUDA, but this libflashlab.so was built without CUDA",
         "hint: use FLASHLAB_DEVICE_CPU");
  EXPECT(flashlab_attention_backward_workspace_size(&p, FLASHLAB_DEVICE_CUDA, (size_t*)g_idx), FLASHLAB_ERROR_UNSUPPORTED,
         "flashlab_attention_backward_workspace_size", "built without CUDA", NULL);
#endif

  /* strides */
  flashlab_tensor bad = in;
  bad.stride[1] = -4;
  EXPECT(flashlab_attention_forward(&p, cpu, bad, in, in, out, g_stat, NULL, 0, NULL), FLASHLAB_ERROR_INVALID_ARGUMENT,
         fwd, "q.stride[1] = -4 is negative", NULL);
  bad = out;
  bad.stride[1] = 2; /* rows of d = 4 elements, 2 apart: outputs would overlap */
  EXPECT(flashlab_attention_forward(&p, cpu, in, in, in, bad, g_stat, NULL, 0, NULL), FLASHLAB_ERROR_INVALID_ARGUMENT,
         fwd, "o.stride[1] = 2 makes elements of the output share memory", "d = 4");
  bad = out;
  bad.stride[1] = (int64_t)1 << 61;
  EXPECT(flashlab_attention_forward(&p, cpu, in, in, in, bad, g_stat, NULL, 0, NULL), FLASHLAB_ERROR_INVALID_ARGUMENT,
         fwd, "o.stride[1] = 2305843009213693952 puts elements beyond 2^62 bytes", NULL);
  /* Inputs may repeat elements (a zero-extent step is a broadcast), and a stride of an extent-1
   * dimension is never used. */
  flashlab_tensor rows = in;
  rows.stride[0] = 12345;
  rows.stride[1] = 8;
  EXPECT_OK(flashlab_attention_forward(&p, cpu, rows, in, in, out, g_stat, NULL, 0, NULL));
  for (int i = 0; i < kBig; ++i) g_out[i] = -7.0f;

  packed_cases(p, in, out);

  EXPECT_TRUE(untouched()); /* every refusal above left the output alone */
}

/* The call-struct entries: the same results as the argument-list ones, bit for bit, and the same
 * refusals under their own names, plus the struct's own (NULL, struct_size). */
static void call_struct_cases(void) {
  const flashlab_device cpu = FLASHLAB_DEVICE_CPU;
  flashlab_attention_problem p = attention_f32();
  p.causal = 1;
  static float o_args[5 * 4], o_call[5 * 4], l_args[5], l_call[5];
  static float g_args[3][5 * 4], g_call[3][5 * 4];
  EXPECT_OK(flashlab_attention_forward(&p, cpu, tensor(g_in), tensor(g_in + 20), tensor(g_in + 40), tensor(o_args),
                                       l_args, NULL, 0, NULL));
  flashlab_attention_call c;
  memset(&c, 0, sizeof c);
  c.struct_size = sizeof c;
  c.problem = &p;
  c.device = cpu;
  c.q = tensor(g_in), c.k = tensor(g_in + 20), c.v = tensor(g_in + 40), c.o = tensor(o_call), c.lse = l_call;
  EXPECT_OK(flashlab_attention_forward_call(&c));
  EXPECT_TRUE(memcmp(o_args, o_call, sizeof o_args) == 0 && memcmp(l_args, l_call, sizeof l_args) == 0);

  EXPECT_OK(flashlab_attention_backward(&p, cpu, tensor(g_in), tensor(g_in + 20), tensor(g_in + 40), tensor(o_args),
                                        l_args, tensor(g_in + 60), tensor(g_args[0]), tensor(g_args[1]),
                                        tensor(g_args[2]), NULL, 0, NULL));
  c.d_o = tensor(g_in + 60), c.dq = tensor(g_call[0]), c.dk = tensor(g_call[1]), c.dv = tensor(g_call[2]);
  EXPECT_OK(flashlab_attention_backward_call(&c));
  EXPECT_TRUE(memcmp(g_args, g_call, sizeof g_args) == 0);

  /* Strides travel in the struct: a strided q gives the dense q's result. */
  static float q_strided[5 * 8], o_strided[5 * 4];
  for (int n = 0; n < 5; ++n)
    for (int i = 0; i < 4; ++i) q_strided[n * 8 + i] = g_in[n * 4 + i];
  c.q = tensor(q_strided), c.q.stride[1] = 8, c.o = tensor(o_strided);
  EXPECT_OK(flashlab_attention_forward_call(&c));
  EXPECT_TRUE(memcmp(o_args, o_strided, sizeof o_args) == 0);
  c.q = tensor(g_in), c.o = tensor(o_call);

  /* Refusals: the struct itself, then an argument inside it, named as the argument-list entry does. */
  EXPECT(flashlab_attention_forward_call(NULL), FLASHLAB_ERROR_INVALID_ARGUMENT, "flashlab_attention_forward_call",
         "call is NULL", "zeroed bytes and struct_size = sizeof(flashlab_attention_call)");
  flashlab_attention_call small = c;
  small.struct_size = sizeof small - 8;
  EXPECT(flashlab_attention_backward_call(&small), FLASHLAB_ERROR_INVALID_ARGUMENT, "flashlab_attention_backward_call",
         "call->struct_size = ", "set it to sizeof(flashlab_attention_call)");
  flashlab_attention_call bad = c;
  bad.problem = NULL;
  EXPECT(flashlab_attention_forward_call(&bad), FLASHLAB_ERROR_INVALID_ARGUMENT, "flashlab_attention_forward_call",
         "problem is NULL", NULL);
  bad = c, bad.o = tensor(NULL);
  EXPECT(flashlab_attention_forward_call(&bad), FLASHLAB_ERROR_INVALID_ARGUMENT, "flashlab_attention_forward_call",
         "o.data is NULL", NULL);
  bad = c, bad.lse = NULL;
  EXPECT(flashlab_attention_backward_call(&bad), FLASHLAB_ERROR_INVALID_ARGUMENT, "flashlab_attention_backward_call",
         "lse is NULL", NULL);
  bad = c, bad.dk.stride[1] = 2;
  EXPECT(flashlab_attention_backward_call(&bad), FLASHLAB_ERROR_INVALID_ARGUMENT, "flashlab_attention_backward_call",
         "dk.stride[1] = 2 makes elements of the output share memory", NULL);
  bad = c, bad.device = (flashlab_device)7;
  EXPECT(flashlab_attention_forward_call(&bad), FLASHLAB_ERROR_INVALID_ARGUMENT, "flashlab_attention_forward_call",
         "device = 7 is not a flashlab_device", NULL);
  {
    /* A newer caller's larger struct: accepted with its unknown bytes zero, refused otherwise. */
    unsigned char newer[sizeof c + 16];
    memset(newer, 0, sizeof newer);
    memcpy(newer, &c, sizeof c);
    size_t size = sizeof newer;
    memcpy(newer, &size, sizeof size);
    EXPECT_OK(flashlab_attention_forward_call((const flashlab_attention_call*)(const void*)newer));
    newer[sizeof c + 5] = 1;
    EXPECT(flashlab_attention_forward_call((const flashlab_attention_call*)(const void*)newer),
           FLASHLAB_ERROR_UNSUPPORTED, "flashlab_attention_forward_call", "call->struct_size", "fields past the");
  }
#ifndef FLASHLAB_TEST_HAVE_CUDA
  bad = c, bad.device = FLASHLAB_DEVICE_CUDA;
  EXPECT(flashlab_attention_forward_call(&bad), FLASHLAB_ERROR_UNSUPPORTED, "flashlab_attention_forward_call",
         "built without CUDA", NULL);
#endif
}

static flashlab_mta_problem mta_f32(void) {
  flashlab_mta_problem p = flashlab_mta_defaults();
  p.seq = 9, p.head_dim = 4, p.cq = 2, p.ck = 3, p.dtype = FLASHLAB_DTYPE_F32;
  return p;
}

static void mta_cases(void) {
  const flashlab_device cpu = FLASHLAB_DEVICE_CPU;
  flashlab_tensor in = tensor(g_in), out = tensor(g_out);
  flashlab_mta_problem p = mta_f32();
  EXPECT_OK(flashlab_mta_forward(&p, cpu, in, in, in, g_w, out, g_stat, NULL, 0, NULL));
  for (int i = 0; i < kBig; ++i) g_out[i] = -7.0f;

  EXPECT(flashlab_mta_forward(NULL, cpu, in, in, in, g_w, out, g_stat, NULL, 0, NULL), FLASHLAB_ERROR_INVALID_ARGUMENT,
         "flashlab_mta_forward", "problem is NULL", "flashlab_mta_defaults()");
  EXPECT(flashlab_mta_forward(&p, cpu, in, in, in, NULL, out, g_stat, NULL, 0, NULL), FLASHLAB_ERROR_INVALID_ARGUMENT,
         "flashlab_mta_forward", "w is NULL", NULL);
  EXPECT(flashlab_mta_forward(&p, cpu, in, in, in, g_w, out, NULL, NULL, 0, NULL), FLASHLAB_ERROR_INVALID_ARGUMENT,
         "flashlab_mta_forward", "lse is NULL", NULL);
  EXPECT(flashlab_mta_backward(&p, cpu, in, in, in, g_w, in, g_stat, in, out, out, out, NULL, NULL, 0, NULL),
         FLASHLAB_ERROR_INVALID_ARGUMENT, "flashlab_mta_backward", "dw is NULL", NULL);
  p.ck = 4;
  EXPECT(flashlab_mta_forward(&p, cpu, in, in, in, g_w, out, g_stat, NULL, 0, NULL), FLASHLAB_ERROR_INVALID_ARGUMENT,
         "flashlab_mta_forward", "problem->ck = 4 is even", "hint: ck must be odd");
  p = mta_f32(), p.cq = 0;
  EXPECT(flashlab_mta_forward_workspace_size(&p, cpu, (size_t*)g_idx), FLASHLAB_ERROR_INVALID_ARGUMENT,
         "flashlab_mta_forward_workspace_size", "problem->cq = 0 is below 1", NULL);
  p = mta_f32(), p.seq = 0;
  EXPECT(flashlab_mta_decode(&p, cpu, in, in, in, g_w, out, NULL, 0, NULL), FLASHLAB_ERROR_INVALID_ARGUMENT,
         "flashlab_mta_decode", "problem->seq = 0", NULL);
  p = mta_f32(), p.cq = 17, p.seq = 40;
  EXPECT(flashlab_mta_decode(&p, cpu, in, in, in, g_w, out, NULL, 0, NULL), FLASHLAB_ERROR_UNSUPPORTED,
         "flashlab_mta_decode", "problem->cq = 17 is above 16", "hint: run the forward");
  p = mta_f32(), p.struct_size = 3;
  EXPECT(flashlab_mta_forward(&p, cpu, in, in, in, g_w, out, g_stat, NULL, 0, NULL), FLASHLAB_ERROR_INVALID_ARGUMENT,
         "flashlab_mta_forward", "problem->struct_size = 3 is below sizeof(flashlab_mta_problem)", NULL);
  p = mta_f32(), p.dtype = FLASHLAB_DTYPE_F16;
  EXPECT(flashlab_mta_forward(&p, cpu, in, in, in, g_w, out, g_stat, NULL, 0, NULL), FLASHLAB_ERROR_UNSUPPORTED,
         "flashlab_mta_forward", "problem->dtype = FLASHLAB_DTYPE_F16 on FLASHLAB_DEVICE_CPU", NULL);
#ifndef FLASHLAB_TEST_HAVE_CUDA
  p = mta_f32();
  EXPECT(flashlab_mta_backward_workspace_size(&p, FLASHLAB_DEVICE_CUDA, (size_t*)g_idx), FLASHLAB_ERROR_UNSUPPORTED,
         "flashlab_mta_backward_workspace_size", "built without CUDA", "hint:");
#endif
  EXPECT_TRUE(untouched());
}

static flashlab_stream_problem stream_f32(void) {
  flashlab_stream_problem p = flashlab_stream_defaults();
  p.tokens = 40, p.head_dim = 4, p.block_q = 8, p.block_k = 8, p.k_blocks = 2, p.dtype = FLASHLAB_DTYPE_F32;
  return p;
}

static void stream_cases(void) {
  const flashlab_device cpu = FLASHLAB_DEVICE_CPU;
  flashlab_tensor in = tensor(g_in), out = tensor(g_out);
  flashlab_stream_problem p = stream_f32();
  int64_t n_q = 0;
  EXPECT_OK(flashlab_stream_query_blocks(&p, &n_q));
  EXPECT_TRUE(n_q == 5);
  EXPECT_OK(flashlab_stream_estimate(&p, cpu, in, in, g_idx, NULL, 0, NULL));
  EXPECT_OK(flashlab_stream_apply(&p, cpu, in, in, in, g_idx, out, NULL, 0, NULL));
  for (int i = 0; i < kBig; ++i) g_out[i] = -7.0f;

  EXPECT(flashlab_stream_query_blocks(NULL, &n_q), FLASHLAB_ERROR_INVALID_ARGUMENT, "flashlab_stream_query_blocks",
         "problem is NULL", "flashlab_stream_defaults()");
  EXPECT(flashlab_stream_query_blocks(&p, NULL), FLASHLAB_ERROR_INVALID_ARGUMENT, "flashlab_stream_query_blocks",
         "n_q is NULL", NULL);
  EXPECT(flashlab_stream_estimate(&p, cpu, in, in, NULL, NULL, 0, NULL), FLASHLAB_ERROR_INVALID_ARGUMENT,
         "flashlab_stream_estimate", "indices is NULL", NULL);
  p.block_q = 0;
  EXPECT(flashlab_stream_estimate(&p, cpu, in, in, g_idx, NULL, 0, NULL), FLASHLAB_ERROR_INVALID_ARGUMENT,
         "flashlab_stream_estimate", "problem->block_q = 0 is below 1", NULL);
  p = stream_f32(), p.k_blocks = 0;
  EXPECT(flashlab_stream_apply_workspace_size(&p, cpu, (size_t*)g_idx), FLASHLAB_ERROR_INVALID_ARGUMENT,
         "flashlab_stream_apply_workspace_size", "problem->k_blocks = 0", NULL);
  p = stream_f32();
  flashlab_tensor bad = in;
  bad.stride[0] = 3;
  EXPECT(flashlab_stream_estimate(&p, cpu, bad, in, g_idx, NULL, 0, NULL), FLASHLAB_ERROR_INVALID_ARGUMENT,
         "flashlab_stream_estimate", "q.stride[0] = 3 is not 0: STREAM tensors are [T, d]", NULL);
  bad = out;
  bad.stride[1] = 3;
  EXPECT(flashlab_stream_apply(&p, cpu, in, in, in, g_idx, bad, NULL, 0, NULL), FLASHLAB_ERROR_INVALID_ARGUMENT,
         "flashlab_stream_apply", "o.stride[1] = 3 makes elements of the output share memory", NULL);
  /* Indices that break the validity invariant: a duplicate, a future block. */
  int64_t I[10];
  memcpy(I, g_idx, sizeof I);
  I[3] = I[2];
  EXPECT(flashlab_stream_apply(&p, cpu, in, in, in, I, out, NULL, 0, NULL), FLASHLAB_ERROR_INVALID_ARGUMENT,
         "flashlab_stream_apply", "indices break the validity invariant", "hint: pass the indices flashlab_stream_estimate wrote");
  memcpy(I, g_idx, sizeof I);
  I[0] = 4;
  EXPECT(flashlab_stream_trace(&p, cpu, in, in, in, I, out, (flashlab_stream_edge*)g_stat, NULL, 0, NULL),
         FLASHLAB_ERROR_INVALID_ARGUMENT, "flashlab_stream_trace", "indices break the validity invariant", NULL);
  EXPECT(flashlab_stream_trace(&p, cpu, in, in, in, g_idx, out, NULL, NULL, 0, NULL), FLASHLAB_ERROR_INVALID_ARGUMENT,
         "flashlab_stream_trace", "edges is NULL", NULL);
  /* A user block mask must hold 0 or 1. */
  uint8_t mask[25];
  memset(mask, 1, sizeof mask);
  mask[7] = 2;
  p.mask = mask;
  EXPECT(flashlab_stream_estimate(&p, cpu, in, in, g_idx, NULL, 0, NULL), FLASHLAB_ERROR_INVALID_ARGUMENT,
         "flashlab_stream_estimate", "mask", NULL);
  p = stream_f32(), p.dtype = FLASHLAB_DTYPE_BF16;
  EXPECT(flashlab_stream_apply(&p, cpu, in, in, in, g_idx, out, NULL, 0, NULL), FLASHLAB_ERROR_UNSUPPORTED,
         "flashlab_stream_apply", "problem->dtype = FLASHLAB_DTYPE_BF16 on FLASHLAB_DEVICE_CPU", NULL);
#ifdef FLASHLAB_TEST_HAVE_CUDA
  p = stream_f32(), p.dtype = FLASHLAB_DTYPE_BF16;
  EXPECT(flashlab_stream_trace(&p, FLASHLAB_DEVICE_CUDA, in, in, in, g_idx, out, (flashlab_stream_edge*)g_stat, NULL, 0,
                               NULL),
         FLASHLAB_ERROR_UNSUPPORTED, "flashlab_stream_trace", "the CUDA trace refuses this problem", "block_k = 8");
  p = stream_f32(), p.dtype = FLASHLAB_DTYPE_F64; /* the CUDA trace takes F32 (clear) or BF16/F16 (fast) */
  EXPECT(flashlab_stream_trace_workspace_size(&p, FLASHLAB_DEVICE_CUDA, (size_t*)g_idx), FLASHLAB_ERROR_UNSUPPORTED,
         "flashlab_stream_trace_workspace_size", "problem->dtype = FLASHLAB_DTYPE_F64 on FLASHLAB_DEVICE_CUDA", NULL);
#else
  p = stream_f32();
  EXPECT(flashlab_stream_estimate(&p, FLASHLAB_DEVICE_CUDA, in, in, g_idx, NULL, 0, NULL), FLASHLAB_ERROR_UNSUPPORTED,
         "flashlab_stream_estimate", "built without CUDA", "hint:");
#endif
  EXPECT_TRUE(untouched());
}

/* The message is per thread: a failure in another thread leaves this thread's alone. */
static void* other_thread(void* arg) {
  (void)arg;
  flashlab_attention_problem p = attention_f32();
  p.head_dim = -9;
  const flashlab_status st = flashlab_attention_check(&p, FLASHLAB_DEVICE_CPU);
  const int ok = st == FLASHLAB_ERROR_INVALID_ARGUMENT && strstr(flashlab_last_error(), "problem->head_dim = -9") != NULL;
  return ok ? arg : (void*)&g_checks;
}

static void thread_cases(void) {
  flashlab_attention_problem p = attention_f32();
  p.seq_q = -5;
  EXPECT(flashlab_attention_check(&p, FLASHLAB_DEVICE_CPU), FLASHLAB_ERROR_INVALID_ARGUMENT, "flashlab_attention_check",
         "problem->seq_q = -5", NULL);
  pthread_t thread;
  void* result = &g_failures;
  EXPECT_TRUE(pthread_create(&thread, NULL, other_thread, NULL) == 0);
  EXPECT_TRUE(pthread_join(thread, &result) == 0);
  EXPECT_TRUE(result == NULL);
  EXPECT_TRUE(strstr(flashlab_last_error(), "problem->seq_q = -5") != NULL);
  /* A successful call clears the message. */
  p = attention_f32();
  EXPECT_OK(flashlab_attention_check(&p, FLASHLAB_DEVICE_CPU));
}

static void misc_cases(void) {
  EXPECT_TRUE(flashlab_abi_version() == FLASHLAB_ABI_VERSION);
  EXPECT_TRUE(strlen(flashlab_version()) > 0);
  EXPECT_TRUE(strcmp(flashlab_status_name(FLASHLAB_OK), "FLASHLAB_OK") == 0);
  EXPECT_TRUE(strcmp(flashlab_status_name(FLASHLAB_ERROR_INVALID_ARGUMENT), "FLASHLAB_ERROR_INVALID_ARGUMENT") == 0);
  EXPECT_TRUE(strcmp(flashlab_status_name(FLASHLAB_ERROR_UNSUPPORTED), "FLASHLAB_ERROR_UNSUPPORTED") == 0);
  EXPECT_TRUE(strcmp(flashlab_status_name(FLASHLAB_ERROR_CUDA), "FLASHLAB_ERROR_CUDA") == 0);
  EXPECT_TRUE(strcmp(flashlab_status_name(FLASHLAB_ERROR_OUT_OF_MEMORY), "FLASHLAB_ERROR_OUT_OF_MEMORY") == 0);
  EXPECT_TRUE(strcmp(flashlab_status_name(FLASHLAB_ERROR_INTERNAL), "FLASHLAB_ERROR_INTERNAL") == 0);
  EXPECT_TRUE(strcmp(flashlab_status_name((flashlab_status)42), "FLASHLAB_STATUS_UNKNOWN") == 0);
  const flashlab_attention_problem a = flashlab_attention_defaults();
  EXPECT_TRUE(a.struct_size == sizeof a && a.batch == 1 && a.heads == 1 && a.seq_k == 0 && a.heads_kv == 0 &&
              a.scale == 0.0 && a.dtype == FLASHLAB_DTYPE_BF16);
  const flashlab_stream_problem s = flashlab_stream_defaults();
  EXPECT_TRUE(s.struct_size == sizeof s && s.block_q == 64 && s.block_k == 64 && s.k_blocks == 8 && s.mask == NULL);
}

/* The ring: its problem's refusals name the field whatever the build; a build without the ring
 * (no CUDA or no NCCL) refuses every call with UNSUPPORTED and a hint. No GPU is touched here. */
static void ring_cases(void) {
  const char* size = "flashlab_ring_workspace_size";
  for (int i = 0; i < kBig; ++i) g_out[i] = -7.0f;
  flashlab_attention_problem p = flashlab_attention_defaults();
  p.seq_q = 4096, p.heads = 4, p.head_dim = 128;
  size_t bytes = 12345;
  EXPECT(flashlab_ring_workspace_size(NULL, FLASHLAB_RING_ZIGZAG, 2, 0, &bytes), FLASHLAB_ERROR_INVALID_ARGUMENT, size,
         "problem", NULL);
  EXPECT(flashlab_ring_workspace_size(&p, FLASHLAB_RING_ZIGZAG, 0, 0, &bytes), FLASHLAB_ERROR_INVALID_ARGUMENT, size,
         "gpus = 0", "hint");
  EXPECT(flashlab_ring_workspace_size(&p, (flashlab_ring_layout)7, 2, 0, &bytes), FLASHLAB_ERROR_INVALID_ARGUMENT,
         size, "layout = 7", "FLASHLAB_RING_ZIGZAG");
  EXPECT(flashlab_ring_workspace_size(&p, FLASHLAB_RING_ZIGZAG, 2, 2, &bytes), FLASHLAB_ERROR_INVALID_ARGUMENT, size,
         "backward = 2", NULL);
  flashlab_attention_problem q = p;
  q.seq_k = 1024;
  EXPECT(flashlab_ring_workspace_size(&q, FLASHLAB_RING_ZIGZAG, 2, 0, &bytes), FLASHLAB_ERROR_UNSUPPORTED, size,
         "problem->seq_k = 1024", "self-attention");
  q = p, q.window_left = 64;
  EXPECT(flashlab_ring_workspace_size(&q, FLASHLAB_RING_ZIGZAG, 2, 0, &bytes), FLASHLAB_ERROR_UNSUPPORTED, size,
         "window", "flashlab_attention_forward() and flashlab_attention_backward() take windows");
  q = p, q.heads_kv = 3;
  EXPECT(flashlab_ring_workspace_size(&q, FLASHLAB_RING_ZIGZAG, 2, 0, &bytes), FLASHLAB_ERROR_INVALID_ARGUMENT, size,
         "problem->heads_kv", NULL);
  EXPECT_TRUE(bytes == 12345);
  EXPECT_OK(flashlab_ring_destroy(NULL));
  if (!flashlab_has_ring()) {
    unsigned char id[FLASHLAB_RING_ID_BYTES];
    flashlab_ring* ring = NULL;
    EXPECT(flashlab_ring_unique_id(id), FLASHLAB_ERROR_UNSUPPORTED, "flashlab_ring_unique_id", "no context-parallel ring",
           "flashlab_has_ring()");
    EXPECT(flashlab_ring_create(id, 2, 0, &ring), FLASHLAB_ERROR_UNSUPPORTED, "flashlab_ring_create",
           "no context-parallel ring", "NCCL");
    EXPECT_TRUE(ring == NULL);
    EXPECT(flashlab_ring_workspace_size(&p, FLASHLAB_RING_ZIGZAG, 2, 0, &bytes), FLASHLAB_ERROR_UNSUPPORTED, size,
           "no context-parallel ring", NULL);
    EXPECT(flashlab_ring_forward(&p, FLASHLAB_RING_ZIGZAG, NULL, g_in, g_in, g_in, g_out, g_stat, NULL, 0, NULL),
           FLASHLAB_ERROR_UNSUPPORTED, "flashlab_ring_forward", "no context-parallel ring", NULL);
    EXPECT(flashlab_ring_backward(&p, FLASHLAB_RING_ZIGZAG, NULL, g_in, g_in, g_in, g_in, g_stat, g_in, g_out, g_out,
                                  g_out, NULL, 0, NULL),
           FLASHLAB_ERROR_UNSUPPORTED, "flashlab_ring_backward", "no context-parallel ring", NULL);
    EXPECT_TRUE(untouched());
  } else {
    EXPECT(flashlab_ring_unique_id(NULL), FLASHLAB_ERROR_INVALID_ARGUMENT, "flashlab_ring_unique_id", "id", NULL);
    EXPECT(flashlab_ring_forward(&p, FLASHLAB_RING_ZIGZAG, NULL, g_in, g_in, g_in, g_out, g_stat, NULL, 0, NULL),
           FLASHLAB_ERROR_INVALID_ARGUMENT, "flashlab_ring_forward", "ring", NULL);
  }
}

int main(void) {
  for (int i = 0; i < kBig; ++i) g_in[i] = (float)((i * 37) % 11) / 11.0f - 0.5f, g_stat[i] = 0.0f;
  for (int i = 0; i < 64; ++i) g_w[i] = 0.25f;
  attention_cases();
  old_struct_cases();
  call_struct_cases();
  mta_cases();
  stream_cases();
  thread_cases();
  misc_cases();
  ring_cases();
  printf("%d checks, %d failed\n", g_checks, g_failures);
  return g_failures ? 1 : 0;
}
