/* flashlab_example.c — flashlab's C ABI from C: attention forward and backward, Multi-Token
 * Attention forward, backward and decode, STREAM estimate, apply and trace; grouped-query attention
 * on the CPU.
 *
 *   flashlab_example [--seed S]         the CPU reference on host memory (every build)
 *   flashlab_example --cuda [--seed S]  also the CUDA kernels on device memory (CUDA builds)
 *       [--save DIR]                    and write the CUDA attention run's inputs and outputs
 *                                       as .npy (float32), for `flashlab attention --inputs DIR`
 *
 * CPU: every result is checked against a small float64 computation written here from the
 * definitions (naive attention and its gradients, the MTA convolution and its transpose, dense
 * attention over STREAM's kept blocks), with strided tensors where the ABI allows them. Exit 0
 * when every error is within its tolerance (float64 1e-12, float32 1e-5 of the largest value).
 *
 * CUDA: the same families on bf16 device tensors, all calls on one non-default stream, then the
 * same calls captured in a CUDA graph and replayed twice. The graph's results must equal the
 * stream's bit for bit (except MTA's dQ and dW, which the kernels sum with atomics: compared
 * within 1e-2) and the stream's must match the CPU reference on the same bf16-rounded values
 * within 1e-2 of the largest value (16-bit outputs; LSE within 1e-4), STREAM's indices exactly;
 * the STREAM trace gives the CPU's records: indices exactly, weights within 1e-5 of the largest
 * (f32, the clear kernels) or 1e-2 (bf16, the fast kernels).
 * Only flashlab.h (and, for --cuda, the CUDA runtime) is used. */
#include "flashlab.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef FLASHLAB_EXAMPLE_CUDA
#include <cuda_runtime_api.h>
#endif

static int g_failures = 0;

/* Every flashlab call goes through CALL: a failure prints the status and the library's message. */
#define CALL(expr)                                                                                   \
  do {                                                                                               \
    flashlab_status status_ = (expr);                                                                \
    if (status_ != FLASHLAB_OK) {                                                                    \
      fprintf(stderr, "%s:%d: %s\n  -> %s: %s\n", __FILE__, __LINE__, #expr,                         \
              flashlab_status_name(status_), flashlab_last_error());                                 \
      exit(1);                                                                                       \
    }                                                                                                \
  } while (0)

static void* xmalloc(size_t bytes) {
  void* p = calloc(bytes ? bytes : 1, 1);
  if (!p) {
    fprintf(stderr, "out of memory (%zu bytes)\n", bytes);
    exit(1);
  }
  return p;
}
#define NEW(type, n) ((type*)xmalloc(sizeof(type) * (size_t)(n)))

/* ---- inputs and comparisons ------------------------------------------------------------- */

static uint64_t g_state = 1;
/* splitmix64: a reproducible uniform value in [-1, 1). */
static double uniform(void) {
  uint64_t z = (g_state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return (double)(z >> 11) * 0x1p-52 - 1.0;
}
static double* random_array(size_t n) {
  double* x = NEW(double, n);
  for (size_t i = 0; i < n; ++i) x[i] = uniform();
  return x;
}

/* max |got − ref| / max |ref|; NaN, or an infinity the other side lacks, gives +inf. */
static double err_vs_max(const double* got, const double* ref, size_t n) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < n; ++i) {
    if (isnan(got[i]) || isnan(ref[i])) return INFINITY;
    if (isinf(got[i]) || isinf(ref[i])) {
      if (got[i] != ref[i]) return INFINITY;
      continue;
    }
    diff = fmax(diff, fabs(got[i] - ref[i]));
    scale = fmax(scale, fabs(ref[i]));
  }
  return diff / (scale > 0 ? scale : 1);
}

static void check(const char* what, double err, double tol) {
  const int ok = err <= tol;
  printf("  %-44s max error %.2e  (tolerance %.0e)  %s\n", what, err, tol, ok ? "ok" : "FAILED");
  if (!ok) ++g_failures;
}

static void check_true(const char* what, int ok) {
  printf("  %-44s %s\n", what, ok ? "ok" : "FAILED");
  if (!ok) ++g_failures;
}

static float* to_float(const double* x, size_t n) {
  float* y = NEW(float, n);
  for (size_t i = 0; i < n; ++i) y[i] = (float)x[i];
  return y;
}
static double* from_float(const float* x, size_t n) {
  double* y = NEW(double, n);
  for (size_t i = 0; i < n; ++i) y[i] = x[i];
  return y;
}

static flashlab_tensor tensor(void* data) {
  flashlab_tensor t;
  t.data = data;
  t.stride[0] = t.stride[1] = t.stride[2] = 0; /* contiguous */
  return t;
}

static size_t at4(int64_t b, int64_t n, int64_t h, int64_t c, int64_t N, int64_t H, int64_t d) {
  return (size_t)(((b * N + n) * H + h) * d + c);
}

/* ---- attention in float64, from the definition ------------------------------------------ */

typedef struct {
  int64_t B, N, Nk, H, d;
  double scale;
  int causal;
  int64_t Hkv; /* key/value heads, dividing H; 0 means H */
} AttnShape;

/* O, LSE (base 2, [B, H, N]) and, when d_o is given, dQ, dK, dV of softmax(scale·QKᵀ + mask) V,
 * causal bottom-right aligned (query i sees key j ≤ i + N_k − N); a row that sees no key gets
 * O = 0, LSE = −∞ and no gradient. K, V, dK, dV have H_kv heads: query head h reads key/value
 * head h / (H / H_kv), and dK, dV sum over the query heads that share one. */
static void ref_attention(const AttnShape* s, const double* q, const double* k, const double* v, const double* d_o,
                          double* o, double* lse, double* dq, double* dk, double* dv) {
  const int64_t B = s->B, N = s->N, Nk = s->Nk, H = s->H, d = s->d, Hkv = s->Hkv ? s->Hkv : s->H;
  double* p = NEW(double, Nk);
  double* dp = NEW(double, Nk);
  if (d_o) {
    memset(dq, 0, sizeof(double) * (size_t)(B * N * H * d));
    memset(dk, 0, sizeof(double) * (size_t)(B * Nk * Hkv * d));
    memset(dv, 0, sizeof(double) * (size_t)(B * Nk * Hkv * d));
  }
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < N; ++i) {
        const int64_t g = h / (H / Hkv); /* the key/value head of query head h */
        const int64_t last = s->causal ? i + Nk - N : Nk - 1; /* last visible key */
        double m = -INFINITY;
        for (int64_t j = 0; j <= last && j < Nk; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < d; ++c) dot += q[at4(b, i, h, c, N, H, d)] * k[at4(b, j, g, c, Nk, Hkv, d)];
          p[j] = s->scale * dot;
          m = fmax(m, p[j]);
        }
        for (int64_t c = 0; c < d; ++c) o[at4(b, i, h, c, N, H, d)] = 0;
        if (last < 0) {
          lse[(b * H + h) * N + i] = -INFINITY;
          continue;
        }
        double l = 0;
        for (int64_t j = 0; j <= last && j < Nk; ++j) l += exp(p[j] - m);
        for (int64_t j = 0; j <= last && j < Nk; ++j) {
          p[j] = exp(p[j] - m) / l;
          for (int64_t c = 0; c < d; ++c) o[at4(b, i, h, c, N, H, d)] += p[j] * v[at4(b, j, g, c, Nk, Hkv, d)];
        }
        lse[(b * H + h) * N + i] = (m + log(l)) / log(2.0);
        if (!d_o) continue;
        /* dP = dO Vᵀ, D = rowsum(P ∘ dP), dS = P ∘ (dP − D); dQ = scale·dS K, dK = scale·dSᵀ Q, dV = Pᵀ dO. */
        double D = 0;
        for (int64_t j = 0; j <= last && j < Nk; ++j) {
          dp[j] = 0;
          for (int64_t c = 0; c < d; ++c) dp[j] += d_o[at4(b, i, h, c, N, H, d)] * v[at4(b, j, g, c, Nk, Hkv, d)];
          D += p[j] * dp[j];
        }
        for (int64_t j = 0; j <= last && j < Nk; ++j) {
          const double ds = p[j] * (dp[j] - D);
          for (int64_t c = 0; c < d; ++c) {
            dq[at4(b, i, h, c, N, H, d)] += s->scale * ds * k[at4(b, j, g, c, Nk, Hkv, d)];
            dk[at4(b, j, g, c, Nk, Hkv, d)] += s->scale * ds * q[at4(b, i, h, c, N, H, d)];
            dv[at4(b, j, g, c, Nk, Hkv, d)] += p[j] * d_o[at4(b, i, h, c, N, H, d)];
          }
        }
      }
  free(p);
  free(dp);
}

/* ---- Multi-Token Attention in float64, from the definition -------------------------------- */

typedef struct {
  int64_t B, N, H, d, cq, ck;
  double scale;
} MtaShape;

/* S = scale·QKᵀ zeroed above the diagonal, Ŝ = Σ_a Σ_b W[a,b]·S[i+a−Pq, j+b−Pk] (zero outside),
 * −∞ above the diagonal, P = softmax(Ŝ), O = P V; LSE base 2 `[B, H, N]`. With d_o also the
 * gradients of ⟨O, dO⟩: dŜ = P∘(dP − D), dS its transposed convolution (zero above the diagonal),
 * dW = Σ dŜ·shifted S, dQ = scale·dS K, dK = scale·dSᵀ Q, dV = Pᵀ dO. */
static void ref_mta(const MtaShape* s, const double* q, const double* k, const double* v, const double* w,
                    const double* d_o, double* o, double* lse, double* dq, double* dk, double* dv, double* dw) {
  const int64_t N = s->N, H = s->H, d = s->d, cq = s->cq, ck = s->ck, pq = cq - 1, pk = (ck - 1) / 2;
  double* S = NEW(double, N * N);
  double* P = NEW(double, N * N);
  double* dP = NEW(double, N * N);
  double* dSh = NEW(double, N * N);
  if (d_o) {
    memset(dq, 0, sizeof(double) * (size_t)(s->B * N * H * d));
    memset(dk, 0, sizeof(double) * (size_t)(s->B * N * H * d));
    memset(dv, 0, sizeof(double) * (size_t)(s->B * N * H * d));
    memset(dw, 0, sizeof(double) * (size_t)(H * cq * ck));
  }
  for (int64_t b = 0; b < s->B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const double* W = w + h * cq * ck;
      for (int64_t i = 0; i < N; ++i)
        for (int64_t j = 0; j < N; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < d; ++c) dot += q[at4(b, i, h, c, N, H, d)] * k[at4(b, j, h, c, N, H, d)];
          S[i * N + j] = j <= i ? s->scale * dot : 0.0;
        }
      for (int64_t i = 0; i < N; ++i) {
        double m = -INFINITY, l = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double acc = 0;
          for (int64_t a = 0; a < cq; ++a)
            for (int64_t bb = 0; bb < ck; ++bb) {
              const int64_t r = i + a - pq, c = j + bb - pk;
              if (r >= 0 && r < N && c >= 0 && c < N) acc += W[a * ck + bb] * S[r * N + c];
            }
          P[i * N + j] = acc;
          m = fmax(m, acc);
        }
        for (int64_t j = 0; j <= i; ++j) l += exp(P[i * N + j] - m);
        for (int64_t j = 0; j < N; ++j) P[i * N + j] = j <= i ? exp(P[i * N + j] - m) / l : 0.0;
        lse[(b * H + h) * N + i] = (m + log(l)) / log(2.0);
        for (int64_t c = 0; c < d; ++c) {
          double acc = 0;
          for (int64_t j = 0; j <= i; ++j) acc += P[i * N + j] * v[at4(b, j, h, c, N, H, d)];
          o[at4(b, i, h, c, N, H, d)] = acc;
        }
      }
      if (!d_o) continue;
      for (int64_t i = 0; i < N; ++i) {
        double D = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double acc = 0;
          for (int64_t c = 0; c < d; ++c) acc += d_o[at4(b, i, h, c, N, H, d)] * v[at4(b, j, h, c, N, H, d)];
          dP[i * N + j] = acc;
          D += P[i * N + j] * acc;
        }
        for (int64_t j = 0; j < N; ++j) dSh[i * N + j] = j <= i ? P[i * N + j] * (dP[i * N + j] - D) : 0.0;
      }
      for (int64_t j = 0; j < N; ++j)
        for (int64_t c = 0; c < d; ++c) {
          double acc = 0;
          for (int64_t i = j; i < N; ++i) acc += P[i * N + j] * d_o[at4(b, i, h, c, N, H, d)];
          dv[at4(b, j, h, c, N, H, d)] += acc;
        }
      for (int64_t a = 0; a < cq; ++a)
        for (int64_t bb = 0; bb < ck; ++bb) {
          double acc = 0;
          for (int64_t i = 0; i < N; ++i)
            for (int64_t j = 0; j <= i; ++j) {
              const int64_t r = i + a - pq, c = j + bb - pk;
              if (r >= 0 && r < N && c >= 0 && c < N) acc += dSh[i * N + j] * S[r * N + c];
            }
          dw[(h * cq + a) * ck + bb] += acc;
        }
      for (int64_t r = 0; r < N; ++r)
        for (int64_t c = 0; c <= r; ++c) { /* dS[r, c]: S above the diagonal is a constant 0 */
          double ds = 0;
          for (int64_t a = 0; a < cq; ++a)
            for (int64_t bb = 0; bb < ck; ++bb) {
              const int64_t i = r - a + pq, j = c - bb + pk;
              if (i >= 0 && i < N && j >= 0 && j <= i) ds += W[a * ck + bb] * dSh[i * N + j];
            }
          for (int64_t x = 0; x < d; ++x) {
            dq[at4(b, r, h, x, N, H, d)] += s->scale * ds * k[at4(b, c, h, x, N, H, d)];
            dk[at4(b, c, h, x, N, H, d)] += s->scale * ds * q[at4(b, r, h, x, N, H, d)];
          }
        }
    }
  free(S);
  free(P);
  free(dP);
  free(dSh);
}

/* ---- STREAM in float64: dense attention over the kept blocks, and the checks of I -------- */

typedef struct {
  int64_t T, d, bq, bk, k;
} StreamShape;

/* Attention of every token t over the tokens s ≤ t of the key blocks its query block keeps in
 * `indices` (unscaled logits ⟨q_t, k_s⟩; a row with no such key is 0), and the three weights of
 * every kept (query block, key block) pair: max ⟨q_t, k_s⟩, Σ p, ‖Σ p·v_s‖. */
static void ref_stream(const StreamShape* s, const double* q, const double* k, const double* v,
                       const int64_t* indices, double* o, double* score, double* mass, double* norm) {
  const int64_t T = s->T, d = s->d, nk = (T + s->bk - 1) / s->bk;
  double* p = NEW(double, T);
  int64_t* slot_of = NEW(int64_t, nk);
  double* summary = NEW(double, d);
  const int64_t nq = (T + s->bq - 1) / s->bq;
  for (int64_t i = 0; i < nq * s->k; ++i) score[i] = -INFINITY, mass[i] = 0, norm[i] = 0;
  for (int64_t qb = 0; qb < nq; ++qb) {
    for (int64_t r = 0; r < nk; ++r) slot_of[r] = -1;
    for (int64_t j = 0; j < s->k; ++j)
      if (indices[qb * s->k + j] >= 0) slot_of[indices[qb * s->k + j]] = j;
    double* sums = NEW(double, s->k * d);
    for (int64_t t = qb * s->bq; t < (qb + 1) * s->bq && t < T; ++t) {
      double m = -INFINITY, l = 0;
      for (int64_t x = 0; x <= t; ++x) {
        if (slot_of[x / s->bk] < 0) continue;
        double dot = 0;
        for (int64_t c = 0; c < d; ++c) dot += q[t * d + c] * k[x * d + c];
        p[x] = dot;
        m = fmax(m, dot);
        double* sc = &score[qb * s->k + slot_of[x / s->bk]];
        *sc = fmax(*sc, dot);
      }
      for (int64_t c = 0; c < d; ++c) o[t * d + c] = 0;
      if (m == -INFINITY) continue;
      for (int64_t x = 0; x <= t; ++x)
        if (slot_of[x / s->bk] >= 0) l += exp(p[x] - m);
      for (int64_t x = 0; x <= t; ++x) {
        const int64_t j = slot_of[x / s->bk];
        if (j < 0) continue;
        const double px = exp(p[x] - m) / l;
        mass[qb * s->k + j] += px;
        for (int64_t c = 0; c < d; ++c) {
          o[t * d + c] += px * v[x * d + c];
          sums[j * d + c] += px * v[x * d + c];
        }
      }
    }
    for (int64_t j = 0; j < s->k; ++j) {
      double n2 = 0;
      for (int64_t c = 0; c < d; ++c) n2 += sums[j * d + c] * sums[j * d + c];
      norm[qb * s->k + j] = sqrt(n2);
      if (indices[qb * s->k + j] < 0) score[qb * s->k + j] = 0;
    }
    free(sums);
  }
  free(p);
  free(slot_of);
  free(summary);
}

/* The validity invariant under the causal mask: each row holds distinct, causally valid blocks
 * first, then −1 entries, min(k, valid blocks) of them non-empty. */
static int indices_valid(const StreamShape* s, const int64_t* I) {
  const int64_t nq = (s->T + s->bq - 1) / s->bq;
  for (int64_t qb = 0; qb < nq; ++qb) {
    const int64_t last_token = ((qb + 1) * s->bq - 1 < s->T - 1) ? (qb + 1) * s->bq - 1 : s->T - 1;
    const int64_t valid = last_token / s->bk + 1, want = valid < s->k ? valid : s->k;
    int64_t kept = 0;
    for (int64_t j = 0; j < s->k; ++j) {
      const int64_t r = I[qb * s->k + j];
      if (r < 0) continue;
      if (r >= valid || j != kept) return 0;
      for (int64_t i = 0; i < j; ++i)
        if (I[qb * s->k + i] == r) return 0;
      ++kept;
    }
    if (kept != want) return 0;
  }
  return 1;
}

/* ---- the CPU runs -------------------------------------------------------------------------- */

/* One CPU attention case: seeded inputs (q, d_o [B, N, H, d]; k, v [B, N_k, H_kv, d]), their
 * float64 results at scale 1/√d, and the problem that describes them. */
typedef struct {
  size_t nq, nkv, nst;
  double *q, *k, *v, *d_o, *o, *lse, *dq, *dk, *dv;
  flashlab_attention_problem p;
} AttnCase;

static AttnCase attn_case(AttnShape s) {
  AttnCase c;
  const int64_t Hkv = s.Hkv ? s.Hkv : s.H;
  c.nq = (size_t)(s.B * s.N * s.H * s.d), c.nkv = (size_t)(s.B * s.Nk * Hkv * s.d), c.nst = (size_t)(s.B * s.H * s.N);
  c.q = random_array(c.nq), c.k = random_array(c.nkv), c.v = random_array(c.nkv), c.d_o = random_array(c.nq);
  c.o = NEW(double, c.nq), c.lse = NEW(double, c.nst), c.dq = NEW(double, c.nq), c.dk = NEW(double, c.nkv);
  c.dv = NEW(double, c.nkv);
  s.scale = 1.0 / sqrt((double)s.d);
  ref_attention(&s, c.q, c.k, c.v, c.d_o, c.o, c.lse, c.dq, c.dk, c.dv);
  c.p = flashlab_attention_defaults();
  c.p.batch = s.B, c.p.seq_q = s.N, c.p.seq_k = s.Nk, c.p.heads = s.H, c.p.heads_kv = s.Hkv, c.p.head_dim = s.d;
  c.p.causal = s.causal;
  return c;
}

static void free_case(AttnCase* c) {
  free(c->q), free(c->k), free(c->v), free(c->d_o), free(c->o), free(c->lse), free(c->dq), free(c->dk), free(c->dv);
}

static void cpu_attention(void) {
  /* N > N_k and causal: the first N − N_k rows see no key (O = 0, LSE = −∞). Q and O are stored
   * head-major, [B, H, N, d], and described to the library by their strides. */
  const AttnShape s = {2, 23, 19, 2, 8, 0.0, 1, 0};
  const int64_t B = s.B, N = s.N, Nk = s.Nk, H = s.H, d = s.d;
  AttnCase c = attn_case(s);
  const size_t nq = c.nq, nkv = c.nkv, nst = c.nst;
  double *q = c.q, *k = c.k, *v = c.v, *d_o = c.d_o, *o = c.o, *lse = c.lse, *dq = c.dq, *dk = c.dk, *dv = c.dv;
  flashlab_attention_problem p = c.p;
  printf("attention, CPU reference: B=%lld N=%lld N_k=%lld H=%lld d=%lld causal, Q and O head-major (strided)\n",
         (long long)B, (long long)N, (long long)Nk, (long long)H, (long long)d);
  for (int f64 = 1; f64 >= 0; --f64) {
    p.dtype = f64 ? FLASHLAB_DTYPE_F64 : FLASHLAB_DTYPE_F32;
    const size_t el = f64 ? sizeof(double) : sizeof(float);
    const double tol = f64 ? 1e-12 : 1e-5;
    /* Q and O head-major: element (b, n, h, c) at ((b·H + h)·N + n)·d + c. */
    char *q_hm = NEW(char, nq * el), *o_hm = NEW(char, nq * el);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t c = 0; c < d; ++c) {
            const double x = q[at4(b, n, h, c, N, H, d)];
            const size_t at = (size_t)(((b * H + h) * N + n) * d + c);
            if (f64) ((double*)q_hm)[at] = x;
            else ((float*)q_hm)[at] = (float)x;
          }
    flashlab_tensor tq = tensor(q_hm), to = tensor(o_hm);
    tq.stride[0] = to.stride[0] = H * N * d;
    tq.stride[1] = to.stride[1] = d;
    tq.stride[2] = to.stride[2] = N * d;
    void *kk = f64 ? (void*)k : (void*)to_float(k, nkv), *vv = f64 ? (void*)v : (void*)to_float(v, nkv);
    void* oo = xmalloc(nq * el); /* O again, contiguous, for the backward */
    void* dd = f64 ? (void*)d_o : (void*)to_float(d_o, nq);
    void *L = xmalloc(nst * el), *gq = xmalloc(nq * el), *gk = xmalloc(nkv * el), *gv = xmalloc(nkv * el);
    CALL(flashlab_attention_forward(&p, FLASHLAB_DEVICE_CPU, tq, tensor(kk), tensor(vv), to, L, NULL, 0, NULL));
    double* got_o = NEW(double, nq);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t c = 0; c < d; ++c) {
            const size_t at = (size_t)(((b * H + h) * N + n) * d + c), ct = at4(b, n, h, c, N, H, d);
            got_o[ct] = f64 ? ((double*)o_hm)[at] : ((float*)o_hm)[at];
            if (f64) ((double*)oo)[ct] = got_o[ct];
            else ((float*)oo)[ct] = (float)got_o[ct];
          }
    double* got_l = f64 ? (double*)L : from_float((float*)L, nst);
    CALL(flashlab_attention_backward(&p, FLASHLAB_DEVICE_CPU, tq, tensor(kk), tensor(vv), tensor(oo), L, tensor(dd),
                                     tensor(gq), tensor(gk), tensor(gv), NULL, 0, NULL));
    double *got_dq = f64 ? (double*)gq : from_float((float*)gq, nq), *got_dk = f64 ? (double*)gk : from_float((float*)gk, nkv),
           *got_dv = f64 ? (double*)gv : from_float((float*)gv, nkv);
    char label[64];
    snprintf(label, sizeof label, "%s O", f64 ? "f64" : "f32");
    check(label, err_vs_max(got_o, o, nq), tol);
    snprintf(label, sizeof label, "%s LSE (-inf on the 4 unseeing rows)", f64 ? "f64" : "f32");
    check(label, err_vs_max(got_l, lse, nst), tol);
    snprintf(label, sizeof label, "%s dQ", f64 ? "f64" : "f32");
    check(label, err_vs_max(got_dq, dq, nq), tol);
    snprintf(label, sizeof label, "%s dK", f64 ? "f64" : "f32");
    check(label, err_vs_max(got_dk, dk, nkv), tol);
    snprintf(label, sizeof label, "%s dV", f64 ? "f64" : "f32");
    check(label, err_vs_max(got_dv, dv, nkv), tol);
    free(q_hm), free(o_hm), free(oo), free(L), free(gq), free(gk), free(gv), free(got_o);
    if (!f64) free(kk), free(vv), free(dd), free(got_l), free(got_dq), free(got_dk), free(got_dv);
  }
  free_case(&c);
}

static void cpu_attention_gqa(void) {
  /* Grouped-query attention: H = 6 query heads over H_kv = 2 key/value heads (groups of 3), causal
   * with N < N_k (query i sees keys up to i + N_k − N), float64. */
  const AttnShape s = {2, 13, 21, 6, 8, 0.0, 1, 2};
  AttnCase c = attn_case(s);
  const size_t nq = c.nq, nkv = c.nkv, nst = c.nst;
  double *q = c.q, *k = c.k, *v = c.v, *d_o = c.d_o;
  flashlab_attention_problem p = c.p;
  p.dtype = FLASHLAB_DTYPE_F64;
  printf("grouped-query attention, CPU reference, f64: B=%lld N=%lld N_k=%lld H=%lld H_kv=%lld d=%lld causal\n",
         (long long)s.B, (long long)s.N, (long long)s.Nk, (long long)s.H, (long long)s.Hkv, (long long)s.d);
  double *got_o = NEW(double, nq), *got_l = NEW(double, nst), *gq = NEW(double, nq), *gk = NEW(double, nkv),
         *gv = NEW(double, nkv);
  CALL(flashlab_attention_forward(&p, FLASHLAB_DEVICE_CPU, tensor(q), tensor(k), tensor(v), tensor(got_o), got_l, NULL,
                                  0, NULL));
  CALL(flashlab_attention_backward(&p, FLASHLAB_DEVICE_CPU, tensor(q), tensor(k), tensor(v), tensor(got_o), got_l,
                                   tensor(d_o), tensor(gq), tensor(gk), tensor(gv), NULL, 0, NULL));
  check("f64 O", err_vs_max(got_o, c.o, nq), 1e-12);
  check("f64 LSE", err_vs_max(got_l, c.lse, nst), 1e-12);
  check("f64 dQ", err_vs_max(gq, c.dq, nq), 1e-12);
  check("f64 dK (summed over each group)", err_vs_max(gk, c.dk, nkv), 1e-12);
  check("f64 dV (summed over each group)", err_vs_max(gv, c.dv, nkv), 1e-12);
  free_case(&c);
  free(got_o), free(got_l), free(gq), free(gk), free(gv);
}

static void cpu_mta(void) {
  const MtaShape s = {1, 29, 2, 8, 3, 3, 0.0};
  const int64_t N = s.N, H = s.H, d = s.d;
  const size_t n = (size_t)(s.B * N * H * d), nst = (size_t)(s.B * H * N), nw = (size_t)(H * s.cq * s.ck);
  MtaShape with_scale = s;
  with_scale.scale = 1.0 / sqrt((double)d);
  double *q = random_array(n), *k = random_array(n), *v = random_array(n), *w = random_array(nw), *d_o = random_array(n);
  double *o = NEW(double, n), *lse = NEW(double, nst), *dq = NEW(double, n), *dk = NEW(double, n), *dv = NEW(double, n),
         *dw = NEW(double, nw);
  ref_mta(&with_scale, q, k, v, w, d_o, o, lse, dq, dk, dv, dw);

  flashlab_mta_problem p = flashlab_mta_defaults();
  p.batch = s.B, p.seq = N, p.heads = H, p.head_dim = d, p.cq = s.cq, p.ck = s.ck, p.dtype = FLASHLAB_DTYPE_F64;
  printf("Multi-Token Attention, CPU reference, f64: B=%lld N=%lld H=%lld d=%lld, W %lldx%lld\n", (long long)s.B,
         (long long)N, (long long)H, (long long)d, (long long)s.cq, (long long)s.ck);
  double *got_o = NEW(double, n), *got_l = NEW(double, nst), *gq = NEW(double, n), *gk = NEW(double, n),
         *gv = NEW(double, n), *gw = NEW(double, nw);
  CALL(flashlab_mta_forward(&p, FLASHLAB_DEVICE_CPU, tensor(q), tensor(k), tensor(v), w, tensor(got_o), got_l, NULL, 0,
                            NULL));
  CALL(flashlab_mta_backward(&p, FLASHLAB_DEVICE_CPU, tensor(q), tensor(k), tensor(v), w, tensor(got_o), got_l,
                             tensor(d_o), tensor(gq), tensor(gk), tensor(gv), gw, NULL, 0, NULL));
  const int64_t R = N < FLASHLAB_MTA_DECODE_ROWS ? N : FLASHLAB_MTA_DECODE_ROWS;
  double* dec = NEW(double, s.B * R * H * d);
  CALL(flashlab_mta_decode(&p, FLASHLAB_DEVICE_CPU, tensor(q), tensor(k), tensor(v), w, tensor(dec), NULL, 0, NULL));
  double* want_dec = NEW(double, s.B * R * H * d);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t r = 0; r < R; ++r)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t c = 0; c < d; ++c) want_dec[at4(b, r, h, c, R, H, d)] = o[at4(b, N - R + r, h, c, N, H, d)];
  check("f64 O", err_vs_max(got_o, o, n), 1e-12);
  check("f64 LSE", err_vs_max(got_l, lse, nst), 1e-12);
  check("f64 dQ", err_vs_max(gq, dq, n), 1e-12);
  check("f64 dK", err_vs_max(gk, dk, n), 1e-12);
  check("f64 dV", err_vs_max(gv, dv, n), 1e-12);
  check("f64 dW", err_vs_max(gw, dw, nw), 1e-12);
  check("f64 decode: the last 16 rows of O", err_vs_max(dec, want_dec, (size_t)(s.B * R * H * d)), 1e-12);
  free(q), free(k), free(v), free(w), free(d_o), free(o), free(lse), free(dq), free(dk), free(dv), free(dw);
  free(got_o), free(got_l), free(gq), free(gk), free(gv), free(gw), free(dec), free(want_dec);
}

static void cpu_stream(void) {
  /* T = 200 in blocks of 16 (a partial last block), d = 8; Q's rows 11 elements apart (strided). */
  StreamShape s = {200, 8, 16, 16, 0};
  const int64_t T = s.T, d = s.d, nq = (T + s.bq - 1) / s.bq, nk = (T + s.bk - 1) / s.bk, row = d + 3;
  double *q = random_array((size_t)(T * d)), *k = random_array((size_t)(T * d)), *v = random_array((size_t)(T * d));
  double* q_strided = NEW(double, T * row);
  for (int64_t t = 0; t < T; ++t) memcpy(q_strided + t * row, q + t * d, sizeof(double) * (size_t)d);
  flashlab_tensor tq = tensor(q_strided);
  tq.stride[1] = row;
  flashlab_stream_problem p = flashlab_stream_defaults();
  p.tokens = T, p.head_dim = d, p.block_q = s.bq, p.block_k = s.bk, p.dtype = FLASHLAB_DTYPE_F64;
  int64_t n_q = 0;
  CALL(flashlab_stream_query_blocks(&p, &n_q));
  printf("STREAM, CPU reference, f64: T=%lld d=%lld b_q=b_k=%lld (n_q=%lld), Q rows %lld apart (strided)\n",
         (long long)T, (long long)d, (long long)s.bq, (long long)n_q, (long long)row);
  check_true("n_q = ceil(T / b_q)", n_q == nq);
  for (int pass = 0; pass < 2; ++pass) {
    /* k = n_k keeps every valid block: dense causal attention. k = 3: sparse. */
    s.k = pass == 0 ? nk : 3;
    p.k_blocks = s.k;
    int64_t* I = NEW(int64_t, nq * s.k);
    double *o = NEW(double, T * d), *got = NEW(double, T * d), *score = NEW(double, nq * s.k),
           *mass = NEW(double, nq * s.k), *norm = NEW(double, nq * s.k);
    flashlab_stream_edge* edges = NEW(flashlab_stream_edge, nq * s.k);
    CALL(flashlab_stream_estimate(&p, FLASHLAB_DEVICE_CPU, tq, tensor(k), I, NULL, 0, NULL));
    CALL(flashlab_stream_apply(&p, FLASHLAB_DEVICE_CPU, tq, tensor(k), tensor(v), I, tensor(got), NULL, 0, NULL));
    ref_stream(&s, q, k, v, I, o, score, mass, norm);
    char label[64];
    snprintf(label, sizeof label, "k=%lld estimate: I valid, min(k, valid) kept", (long long)s.k);
    check_true(label, indices_valid(&s, I));
    snprintf(label, sizeof label, "k=%lld apply O%s", (long long)s.k, pass == 0 ? " (= dense causal)" : "");
    check(label, err_vs_max(got, o, (size_t)(T * d)), 1e-12);
    /* The trace: the same O, and one record per entry of I with the three weights. */
    double* got2 = NEW(double, T * d);
    CALL(flashlab_stream_trace(&p, FLASHLAB_DEVICE_CPU, tq, tensor(k), tensor(v), I, tensor(got2), edges, NULL, 0, NULL));
    double *e_score = NEW(double, nq * s.k), *e_mass = NEW(double, nq * s.k), *e_norm = NEW(double, nq * s.k);
    int records_ok = 1;
    for (int64_t i = 0; i < nq * s.k; ++i) {
      records_ok &= edges[i].q == i / s.k && edges[i].slot == i % s.k && edges[i].r == I[i];
      e_score[i] = edges[i].score, e_mass[i] = edges[i].mass, e_norm[i] = edges[i].value_norm;
    }
    snprintf(label, sizeof label, "k=%lld trace: O equals the apply's", (long long)s.k);
    check_true(label, memcmp(got, got2, sizeof(double) * (size_t)(T * d)) == 0);
    snprintf(label, sizeof label, "k=%lld trace: records (q, slot, r = I)", (long long)s.k);
    check_true(label, records_ok);
    /* The records are float: float tolerance. */
    snprintf(label, sizeof label, "k=%lld trace: score", (long long)s.k);
    check(label, err_vs_max(e_score, score, (size_t)(nq * s.k)), 1e-6);
    snprintf(label, sizeof label, "k=%lld trace: mass", (long long)s.k);
    check(label, err_vs_max(e_mass, mass, (size_t)(nq * s.k)), 1e-6);
    snprintf(label, sizeof label, "k=%lld trace: value norm", (long long)s.k);
    check(label, err_vs_max(e_norm, norm, (size_t)(nq * s.k)), 1e-6);
    free(I), free(o), free(got), free(got2), free(score), free(mass), free(norm), free(edges), free(e_score), free(e_mass),
        free(e_norm);
  }
  free(q), free(k), free(v), free(q_strided);
}

/* ---- the CUDA runs ------------------------------------------------------------------------ */

#ifdef FLASHLAB_EXAMPLE_CUDA

#define CUDA_CHECK(expr)                                                                             \
  do {                                                                                               \
    cudaError_t err_ = (expr);                                                                       \
    if (err_ != cudaSuccess) {                                                                       \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(err_));       \
      exit(1);                                                                                       \
    }                                                                                                \
  } while (0)

/* Round to the nearest bfloat16 (ties to even) and widen back. */
static uint16_t to_bf16(double x) {
  const float f = (float)x;
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static double from_bf16(uint16_t b) {
  const uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
/* x rounded to bf16 in place; returns the device copy of the bf16 values. */
static void* upload_bf16(double* x, size_t n) {
  uint16_t* h = NEW(uint16_t, n);
  for (size_t i = 0; i < n; ++i) h[i] = to_bf16(x[i]), x[i] = from_bf16(h[i]);
  void* dev = NULL;
  CUDA_CHECK(cudaMalloc(&dev, n * 2));
  CUDA_CHECK(cudaMemcpy(dev, h, n * 2, cudaMemcpyHostToDevice));
  free(h);
  return dev;
}
static void* upload(const void* x, size_t bytes) {
  void* dev = NULL;
  CUDA_CHECK(cudaMalloc(&dev, bytes));
  CUDA_CHECK(cudaMemcpy(dev, x, bytes, cudaMemcpyHostToDevice));
  return dev;
}
static void* device_zeros(size_t bytes) {
  void* dev = NULL;
  CUDA_CHECK(cudaMalloc(&dev, bytes ? bytes : 1));
  CUDA_CHECK(cudaMemset(dev, 0, bytes ? bytes : 1));
  return dev;
}
static double* download_bf16(const void* dev, size_t n) {
  uint16_t* h = NEW(uint16_t, n);
  CUDA_CHECK(cudaMemcpy(h, dev, n * 2, cudaMemcpyDeviceToHost));
  double* x = NEW(double, n);
  for (size_t i = 0; i < n; ++i) x[i] = from_bf16(h[i]);
  free(h);
  return x;
}
static double* download_f32(const void* dev, size_t n) {
  float* h = NEW(float, n);
  CUDA_CHECK(cudaMemcpy(h, dev, n * 4, cudaMemcpyDeviceToHost));
  double* x = from_float(h, n);
  free(h);
  return x;
}
static int same_bytes(const void* a, const void* b, size_t bytes) {
  char* x = NEW(char, bytes);
  char* y = NEW(char, bytes);
  CUDA_CHECK(cudaMemcpy(x, a, bytes, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(y, b, bytes, cudaMemcpyDeviceToHost));
  const int same = memcmp(x, y, bytes) == 0;
  free(x), free(y);
  return same;
}

/* Writes `n` values as a float32 .npy file DIR/name of the given shape (format version 1.0: a
 * header padded to a multiple of 64 bytes, then the little-endian data). */
static void write_npy(const char* dir, const char* name, const double* x, size_t n, const int64_t* shape, int ndim) {
  char path[4096], dims[160] = "";
  snprintf(path, sizeof path, "%s/%s", dir, name);
  for (int i = 0; i < ndim; ++i) {
    char one[32];
    snprintf(one, sizeof one, i + 1 < ndim ? "%lld, " : ndim == 1 ? "%lld," : "%lld", (long long)shape[i]);
    strcat(dims, one);
  }
  char header[256];
  int len = snprintf(header, sizeof header, "{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }", dims);
  while ((10 + len + 1) % 64 != 0) header[len++] = ' ';
  header[len++] = '\n';
  FILE* f = fopen(path, "wb");
  if (!f) {
    fprintf(stderr, "error: --save: cannot write %s\nhint: --save takes an existing directory\n", path);
    exit(2);
  }
  const unsigned char magic[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(len & 0xff), (unsigned char)(len >> 8)};
  float* values = to_float(x, n);
  const int ok = fwrite(magic, 1, 10, f) == 10 && fwrite(header, 1, (size_t)len, f) == (size_t)len &&
                 fwrite(values, sizeof(float), n, f) == n;
  free(values);
  if (fclose(f) != 0 || !ok) {
    fprintf(stderr, "error: --save: writing %s failed\n", path);
    exit(2);
  }
}

/* Shapes of the CUDA runs: N and T not multiples of the kernels' tiles, causal, d = 64. */
static const AttnShape kAttn = {2, 100, 100, 2, 64, 0.0, 1, 0};
static const MtaShape kMta = {1, 100, 2, 64, 2, 3, 0.0};
static const StreamShape kStream = {300, 64, 64, 64, 3};

/* Every output of one run of all the calls. */
typedef struct {
  void *o, *lse, *dq, *dk, *dv, *ws_bwd;             /* attention */
  void *mo, *mlse, *mdq, *mdk, *mdv, *mdw, *ws_mbwd; /* MTA forward, backward */
  void *dec, *ws_dec;                                /* MTA decode */
  int64_t* idx;                                      /* STREAM estimate */
  void* so;                                          /* STREAM apply */
  void *to, *edges, *ws_trace;                       /* STREAM trace (f32, the clear kernels) */
  void *to16, *edges16;                              /* STREAM trace (bf16, the fast kernels) */
} Outputs;

typedef struct {
  flashlab_attention_problem ap;
  flashlab_mta_problem mp;
  flashlab_stream_problem sp;
  size_t n_attn, n_stat, n_mta, n_mstat, n_w, n_dec, n_tok, n_idx;
  size_t ws_bwd, ws_mbwd, ws_dec, ws_trace;
  void *q, *k, *v, *d_o;          /* attention inputs */
  void *mq, *mk, *mv, *mw, *mdo;  /* MTA inputs */
  void *sq, *sk, *sv;             /* STREAM inputs */
  void *tq, *tk, *tv;             /* STREAM trace inputs: the same values in f32 */
  flashlab_stream_problem tp;     /* the trace's problem: sp with dtype f32 */
} Inputs;

static void alloc_outputs(const Inputs* in, Outputs* out) {
  out->o = device_zeros(in->n_attn * 2), out->lse = device_zeros(in->n_stat * 4);
  out->dq = device_zeros(in->n_attn * 2), out->dk = device_zeros(in->n_attn * 2), out->dv = device_zeros(in->n_attn * 2);
  out->ws_bwd = device_zeros(in->ws_bwd);
  out->mo = device_zeros(in->n_mta * 2), out->mlse = device_zeros(in->n_mstat * 4);
  out->mdq = device_zeros(in->n_mta * 2), out->mdk = device_zeros(in->n_mta * 2), out->mdv = device_zeros(in->n_mta * 2);
  out->mdw = device_zeros(in->n_w * 4), out->ws_mbwd = device_zeros(in->ws_mbwd);
  out->dec = device_zeros(in->n_dec * 2), out->ws_dec = device_zeros(in->ws_dec);
  out->idx = (int64_t*)device_zeros(in->n_idx * 8), out->so = device_zeros(in->n_tok * 2);
  out->to = device_zeros(in->n_tok * 4), out->edges = device_zeros(in->n_idx * sizeof(flashlab_stream_edge));
  out->ws_trace = device_zeros(in->ws_trace);
  out->to16 = device_zeros(in->n_tok * 2), out->edges16 = device_zeros(in->n_idx * sizeof(flashlab_stream_edge));
}

/* Poisons every output with 0xFF bytes (NaN in bf16 and fp32): a result not written shows. */
static void poison_outputs(const Inputs* in, Outputs* out) {
  void* all[] = {out->o, out->lse, out->dq, out->dk, out->dv, out->mo, out->mlse, out->mdq,
                 out->mdk, out->mdv, out->mdw, out->dec, out->idx, out->so, out->to, out->edges,
                 out->to16, out->edges16};
  const size_t bytes[] = {in->n_attn * 2, in->n_stat * 4, in->n_attn * 2, in->n_attn * 2, in->n_attn * 2,
                          in->n_mta * 2,  in->n_mstat * 4, in->n_mta * 2, in->n_mta * 2, in->n_mta * 2,
                          in->n_w * 4,    in->n_dec * 2,  in->n_idx * 8, in->n_tok * 2, in->n_tok * 4,
                          in->n_idx * sizeof(flashlab_stream_edge), in->n_tok * 2,
                          in->n_idx * sizeof(flashlab_stream_edge)};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) CUDA_CHECK(cudaMemset(all[i], 0xFF, bytes[i]));
}

/* All the calls, in order, on `stream`: what the graph captures too. */
static void enqueue_all(const Inputs* in, Outputs* out, cudaStream_t stream) {
  const flashlab_device dev = FLASHLAB_DEVICE_CUDA;
  CALL(flashlab_attention_forward(&in->ap, dev, tensor(in->q), tensor(in->k), tensor(in->v), tensor(out->o), out->lse,
                                  NULL, 0, stream));
  CALL(flashlab_attention_backward(&in->ap, dev, tensor(in->q), tensor(in->k), tensor(in->v), tensor(out->o), out->lse,
                                   tensor(in->d_o), tensor(out->dq), tensor(out->dk), tensor(out->dv), out->ws_bwd,
                                   in->ws_bwd, stream));
  CALL(flashlab_mta_forward(&in->mp, dev, tensor(in->mq), tensor(in->mk), tensor(in->mv), in->mw, tensor(out->mo),
                            out->mlse, NULL, 0, stream));
  CALL(flashlab_mta_backward(&in->mp, dev, tensor(in->mq), tensor(in->mk), tensor(in->mv), in->mw, tensor(out->mo),
                             out->mlse, tensor(in->mdo), tensor(out->mdq), tensor(out->mdk), tensor(out->mdv), out->mdw,
                             out->ws_mbwd, in->ws_mbwd, stream));
  CALL(flashlab_mta_decode(&in->mp, dev, tensor(in->mq), tensor(in->mk), tensor(in->mv), in->mw, tensor(out->dec),
                           out->ws_dec, in->ws_dec, stream));
  CALL(flashlab_stream_estimate(&in->sp, dev, tensor(in->sq), tensor(in->sk), out->idx, NULL, 0, stream));
  CALL(flashlab_stream_apply(&in->sp, dev, tensor(in->sq), tensor(in->sk), tensor(in->sv), out->idx, tensor(out->so),
                             NULL, 0, stream));
  CALL(flashlab_stream_trace(&in->tp, dev, tensor(in->tq), tensor(in->tk), tensor(in->tv), out->idx, tensor(out->to),
                             (flashlab_stream_edge*)out->edges, out->ws_trace, in->ws_trace, stream));
  CALL(flashlab_stream_trace(&in->sp, dev, tensor(in->sq), tensor(in->sk), tensor(in->sv), out->idx, tensor(out->to16),
                             (flashlab_stream_edge*)out->edges16, NULL, 0, stream));
}

static int run_cuda(const char* save_dir) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    fprintf(stderr, "error: --cuda: no CUDA device is visible\n");
    return 1;
  }
  Inputs in;
  memset(&in, 0, sizeof in);
  /* Attention: B=2 N=100 H=2 d=64 causal bf16, deterministic backward (bit-reproducible dQ). */
  const AttnShape as = kAttn;
  in.ap = flashlab_attention_defaults();
  in.ap.batch = as.B, in.ap.seq_q = as.N, in.ap.heads = as.H, in.ap.head_dim = as.d, in.ap.causal = 1;
  in.ap.deterministic = 1;
  in.n_attn = (size_t)(as.B * as.N * as.H * as.d), in.n_stat = (size_t)(as.B * as.H * as.N);
  double *aq = random_array(in.n_attn), *ak = random_array(in.n_attn), *av = random_array(in.n_attn),
         *ado = random_array(in.n_attn);
  in.q = upload_bf16(aq, in.n_attn), in.k = upload_bf16(ak, in.n_attn), in.v = upload_bf16(av, in.n_attn);
  in.d_o = upload_bf16(ado, in.n_attn);
  CALL(flashlab_attention_backward_workspace_size(&in.ap, FLASHLAB_DEVICE_CUDA, &in.ws_bwd));
  /* MTA: B=1 N=100 H=2 d=64, W 2x3, bf16. */
  const MtaShape ms = kMta;
  in.mp = flashlab_mta_defaults();
  in.mp.batch = ms.B, in.mp.seq = ms.N, in.mp.heads = ms.H, in.mp.head_dim = ms.d, in.mp.cq = ms.cq, in.mp.ck = ms.ck;
  in.n_mta = (size_t)(ms.B * ms.N * ms.H * ms.d), in.n_mstat = (size_t)(ms.B * ms.H * ms.N);
  in.n_w = (size_t)(ms.H * ms.cq * ms.ck), in.n_dec = (size_t)(ms.B * FLASHLAB_MTA_DECODE_ROWS * ms.H * ms.d);
  double *mq = random_array(in.n_mta), *mk = random_array(in.n_mta), *mv = random_array(in.n_mta),
         *mw = random_array(in.n_w), *mdo = random_array(in.n_mta);
  in.mq = upload_bf16(mq, in.n_mta), in.mk = upload_bf16(mk, in.n_mta), in.mv = upload_bf16(mv, in.n_mta);
  in.mdo = upload_bf16(mdo, in.n_mta);
  float* mw32 = to_float(mw, in.n_w);
  for (size_t i = 0; i < in.n_w; ++i) mw[i] = mw32[i]; /* the reference sees the float W */
  in.mw = upload(mw32, in.n_w * 4);
  CALL(flashlab_mta_backward_workspace_size(&in.mp, FLASHLAB_DEVICE_CUDA, &in.ws_mbwd));
  CALL(flashlab_mta_decode_workspace_size(&in.mp, FLASHLAB_DEVICE_CUDA, &in.ws_dec));
  /* STREAM: T=300 d=64 b_q=b_k=64 k=3; Q, K small integers (scores exact: the same I as the CPU). */
  const StreamShape ss = kStream;
  in.sp = flashlab_stream_defaults();
  in.sp.tokens = ss.T, in.sp.head_dim = ss.d, in.sp.block_q = ss.bq, in.sp.block_k = ss.bk, in.sp.k_blocks = ss.k;
  in.n_tok = (size_t)(ss.T * ss.d);
  int64_t nq = 0;
  CALL(flashlab_stream_query_blocks(&in.sp, &nq));
  in.n_idx = (size_t)(nq * ss.k);
  double *sq = random_array(in.n_tok), *sk = random_array(in.n_tok), *sv = random_array(in.n_tok);
  for (size_t i = 0; i < in.n_tok; ++i) sq[i] = floor(2.5 * sq[i]), sk[i] = floor(2.5 * sk[i]);
  in.sq = upload_bf16(sq, in.n_tok), in.sk = upload_bf16(sk, in.n_tok), in.sv = upload_bf16(sv, in.n_tok);
  /* The trace (the clear fp32 kernels) on the same bf16-rounded values in f32, over the estimate's I. */
  in.tp = in.sp;
  in.tp.dtype = FLASHLAB_DTYPE_F32;
  float *sq32 = to_float(sq, in.n_tok), *sk32 = to_float(sk, in.n_tok), *sv32 = to_float(sv, in.n_tok);
  in.tq = upload(sq32, in.n_tok * 4), in.tk = upload(sk32, in.n_tok * 4), in.tv = upload(sv32, in.n_tok * 4);
  CALL(flashlab_stream_trace_workspace_size(&in.tp, FLASHLAB_DEVICE_CUDA, &in.ws_trace));

  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  Outputs direct, graphed;
  alloc_outputs(&in, &direct);
  alloc_outputs(&in, &graphed);
  poison_outputs(&in, &direct);
  poison_outputs(&in, &graphed);
  CUDA_CHECK(cudaDeviceSynchronize());

  printf("CUDA, bf16 device memory, one non-default stream\n");
  enqueue_all(&in, &direct, stream);
  CUDA_CHECK(cudaStreamSynchronize(stream));

  /* Against the CPU reference (f64) on the same bf16-rounded values. */
  {
    flashlab_attention_problem cp = in.ap;
    cp.dtype = FLASHLAB_DTYPE_F64;
    double *o = NEW(double, in.n_attn), *lse = NEW(double, in.n_stat), *dq = NEW(double, in.n_attn),
           *dk = NEW(double, in.n_attn), *dv = NEW(double, in.n_attn);
    CALL(flashlab_attention_forward(&cp, FLASHLAB_DEVICE_CPU, tensor(aq), tensor(ak), tensor(av), tensor(o), lse, NULL, 0,
                                    NULL));
    CALL(flashlab_attention_backward(&cp, FLASHLAB_DEVICE_CPU, tensor(aq), tensor(ak), tensor(av), tensor(o), lse,
                                     tensor(ado), tensor(dq), tensor(dk), tensor(dv), NULL, 0, NULL));
    double *g_o = download_bf16(direct.o, in.n_attn), *g_l = download_f32(direct.lse, in.n_stat),
           *g_dq = download_bf16(direct.dq, in.n_attn), *g_dk = download_bf16(direct.dk, in.n_attn),
           *g_dv = download_bf16(direct.dv, in.n_attn);
    printf("attention B=%lld N=%lld H=%lld d=%lld causal vs the CPU reference:\n", (long long)as.B, (long long)as.N,
           (long long)as.H, (long long)as.d);
    check("O", err_vs_max(g_o, o, in.n_attn), 1e-2);
    check("LSE", err_vs_max(g_l, lse, in.n_stat), 1e-4);
    check("dQ (deterministic)", err_vs_max(g_dq, dq, in.n_attn), 1e-2);
    check("dK", err_vs_max(g_dk, dk, in.n_attn), 1e-2);
    check("dV", err_vs_max(g_dv, dv, in.n_attn), 1e-2);
    if (save_dir) { /* the inputs as the kernels saw them (bf16 values), the outputs as they wrote them */
      const int64_t tok[4] = {as.B, as.N, as.H, as.d}, stat[3] = {as.B, as.H, as.N};
      write_npy(save_dir, "q.npy", aq, in.n_attn, tok, 4), write_npy(save_dir, "k.npy", ak, in.n_attn, tok, 4);
      write_npy(save_dir, "v.npy", av, in.n_attn, tok, 4), write_npy(save_dir, "do.npy", ado, in.n_attn, tok, 4);
      write_npy(save_dir, "o.npy", g_o, in.n_attn, tok, 4), write_npy(save_dir, "lse.npy", g_l, in.n_stat, stat, 3);
      write_npy(save_dir, "dq.npy", g_dq, in.n_attn, tok, 4), write_npy(save_dir, "dk.npy", g_dk, in.n_attn, tok, 4);
      write_npy(save_dir, "dv.npy", g_dv, in.n_attn, tok, 4);
      printf("  saved the inputs and outputs to %s\n", save_dir);
    }
    free(o), free(lse), free(dq), free(dk), free(dv), free(g_o), free(g_l), free(g_dq), free(g_dk), free(g_dv);
  }
  {
    flashlab_mta_problem cp = in.mp;
    cp.dtype = FLASHLAB_DTYPE_F64;
    double *o = NEW(double, in.n_mta), *lse = NEW(double, in.n_mstat), *dq = NEW(double, in.n_mta),
           *dk = NEW(double, in.n_mta), *dv = NEW(double, in.n_mta), *dw = NEW(double, in.n_w),
           *dec = NEW(double, in.n_dec);
    CALL(flashlab_mta_forward(&cp, FLASHLAB_DEVICE_CPU, tensor(mq), tensor(mk), tensor(mv), mw, tensor(o), lse, NULL, 0,
                              NULL));
    CALL(flashlab_mta_backward(&cp, FLASHLAB_DEVICE_CPU, tensor(mq), tensor(mk), tensor(mv), mw, tensor(o), lse,
                               tensor(mdo), tensor(dq), tensor(dk), tensor(dv), dw, NULL, 0, NULL));
    CALL(flashlab_mta_decode(&cp, FLASHLAB_DEVICE_CPU, tensor(mq), tensor(mk), tensor(mv), mw, tensor(dec), NULL, 0, NULL));
    double *g_o = download_bf16(direct.mo, in.n_mta), *g_l = download_f32(direct.mlse, in.n_mstat),
           *g_dq = download_bf16(direct.mdq, in.n_mta), *g_dk = download_bf16(direct.mdk, in.n_mta),
           *g_dv = download_bf16(direct.mdv, in.n_mta), *g_dw = download_f32(direct.mdw, in.n_w),
           *g_dec = download_bf16(direct.dec, in.n_dec);
    printf("MTA N=%lld H=%lld d=%lld W %lldx%lld vs the CPU reference:\n", (long long)ms.N, (long long)ms.H,
           (long long)ms.d, (long long)ms.cq, (long long)ms.ck);
    check("O", err_vs_max(g_o, o, in.n_mta), 1e-2);
    check("LSE", err_vs_max(g_l, lse, in.n_mstat), 1e-4);
    check("dQ", err_vs_max(g_dq, dq, in.n_mta), 1e-2);
    check("dK", err_vs_max(g_dk, dk, in.n_mta), 1e-2);
    check("dV", err_vs_max(g_dv, dv, in.n_mta), 1e-2);
    check("dW (fp32)", err_vs_max(g_dw, dw, in.n_w), 1e-2);
    check("decode: the last 16 rows", err_vs_max(g_dec, dec, in.n_dec), 1e-2);
    free(o), free(lse), free(dq), free(dk), free(dv), free(dw), free(dec);
    free(g_o), free(g_l), free(g_dq), free(g_dk), free(g_dv), free(g_dw), free(g_dec);
  }
  {
    flashlab_stream_problem cp = in.sp;
    cp.dtype = FLASHLAB_DTYPE_F64;
    int64_t *I = NEW(int64_t, in.n_idx), *g_I = NEW(int64_t, in.n_idx);
    double* o = NEW(double, in.n_tok);
    CALL(flashlab_stream_estimate(&cp, FLASHLAB_DEVICE_CPU, tensor(sq), tensor(sk), I, NULL, 0, NULL));
    CALL(flashlab_stream_apply(&cp, FLASHLAB_DEVICE_CPU, tensor(sq), tensor(sk), tensor(sv), I, tensor(o), NULL, 0, NULL));
    CUDA_CHECK(cudaMemcpy(g_I, direct.idx, in.n_idx * 8, cudaMemcpyDeviceToHost));
    double* g_o = download_bf16(direct.so, in.n_tok);
    printf("STREAM T=%lld d=%lld k=%lld vs the CPU reference:\n", (long long)ss.T, (long long)ss.d, (long long)ss.k);
    check_true("estimate: I equal to the CPU's", memcmp(I, g_I, in.n_idx * 8) == 0);
    check("apply O", err_vs_max(g_o, o, in.n_tok), 1e-2);
    /* The trace: the CPU's f32 trace on the same f32 values and the same I, record by record. */
    flashlab_stream_problem tp = in.tp;
    flashlab_stream_edge *e = NEW(flashlab_stream_edge, in.n_idx), *g_e = NEW(flashlab_stream_edge, in.n_idx);
    float* to = NEW(float, in.n_tok);
    CALL(flashlab_stream_trace(&tp, FLASHLAB_DEVICE_CPU, tensor(sq32), tensor(sk32), tensor(sv32), g_I, tensor(to), e,
                               NULL, 0, NULL));
    CUDA_CHECK(cudaMemcpy(g_e, direct.edges, in.n_idx * sizeof *g_e, cudaMemcpyDeviceToHost));
    double* g_to = download_f32(direct.to, in.n_tok);
    double* c_to = from_float(to, in.n_tok);
    double *w[3], *g_w[3];
    int ids_equal = 1;
    for (int f = 0; f < 3; ++f) w[f] = NEW(double, in.n_idx), g_w[f] = NEW(double, in.n_idx);
    for (size_t i = 0; i < in.n_idx; ++i) {
      ids_equal &= e[i].q == g_e[i].q && e[i].r == g_e[i].r && e[i].slot == g_e[i].slot;
      w[0][i] = e[i].score, w[1][i] = e[i].mass, w[2][i] = e[i].value_norm;
      g_w[0][i] = g_e[i].score, g_w[1][i] = g_e[i].mass, g_w[2][i] = g_e[i].value_norm;
    }
    printf("STREAM trace on CUDA (f32, the estimate's I, %zu records) vs the CPU's f32 trace:\n", in.n_idx);
    check_true("records (q, r, slot) equal to the CPU's", ids_equal);
    check("score", err_vs_max(g_w[0], w[0], in.n_idx), 1e-5);
    check("mass", err_vs_max(g_w[1], w[1], in.n_idx), 1e-5);
    check("value norm", err_vs_max(g_w[2], w[2], in.n_idx), 1e-5);
    check("O", err_vs_max(g_to, c_to, in.n_tok), 1e-5);
    /* The bf16 trace (the fast kernels) against the CPU's f64 trace on the same bf16 values: the
     * records' indices exactly, the weights within 1e-2 (P is rounded to bf16 before P·V, as in
     * the fast apply), and its O is the fast apply's, bit for bit. */
    flashlab_stream_problem tp64 = in.sp;
    tp64.dtype = FLASHLAB_DTYPE_F64;
    double* o64 = NEW(double, in.n_tok);
    CALL(flashlab_stream_trace(&tp64, FLASHLAB_DEVICE_CPU, tensor(sq), tensor(sk), tensor(sv), g_I, tensor(o64), e, NULL,
                               0, NULL));
    CUDA_CHECK(cudaMemcpy(g_e, direct.edges16, in.n_idx * sizeof *g_e, cudaMemcpyDeviceToHost));
    ids_equal = 1;
    for (size_t i = 0; i < in.n_idx; ++i) {
      ids_equal &= e[i].q == g_e[i].q && e[i].r == g_e[i].r && e[i].slot == g_e[i].slot;
      w[0][i] = e[i].score, w[1][i] = e[i].mass, w[2][i] = e[i].value_norm;
      g_w[0][i] = g_e[i].score, g_w[1][i] = g_e[i].mass, g_w[2][i] = g_e[i].value_norm;
    }
    printf("STREAM trace on CUDA (bf16, the fast kernels) vs the CPU's f64 trace on the same values:\n");
    check_true("records (q, r, slot) equal to the CPU's", ids_equal);
    check("score", err_vs_max(g_w[0], w[0], in.n_idx), 1e-2);
    check("mass", err_vs_max(g_w[1], w[1], in.n_idx), 1e-2);
    check("value norm", err_vs_max(g_w[2], w[2], in.n_idx), 1e-2);
    check_true("O equals the fast apply's, bitwise", same_bytes(direct.to16, direct.so, in.n_tok * 2));
    for (int f = 0; f < 3; ++f) free(w[f]), free(g_w[f]);
    free(I), free(g_I), free(o), free(g_o), free(e), free(g_e), free(to), free(g_to), free(c_to), free(o64);
  }

  /* The same calls captured in a graph, replayed twice: bit for bit the stream's results. */
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  enqueue_all(&in, &graphed, stream);
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  size_t nodes = 0;
  CUDA_CHECK(cudaGraphGetNodes(graph, NULL, &nodes));
  for (int replay = 0; replay < 2; ++replay) CUDA_CHECK(cudaGraphLaunch(exec, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  printf("CUDA graph of the same calls (%zu nodes), replayed twice, vs the stream's results:\n", nodes);
  check_true("attention O, LSE bitwise", same_bytes(direct.o, graphed.o, in.n_attn * 2) &&
                                             same_bytes(direct.lse, graphed.lse, in.n_stat * 4));
  check_true("attention dQ, dK, dV bitwise", same_bytes(direct.dq, graphed.dq, in.n_attn * 2) &&
                                                 same_bytes(direct.dk, graphed.dk, in.n_attn * 2) &&
                                                 same_bytes(direct.dv, graphed.dv, in.n_attn * 2));
  check_true("MTA O, LSE bitwise", same_bytes(direct.mo, graphed.mo, in.n_mta * 2) &&
                                       same_bytes(direct.mlse, graphed.mlse, in.n_mstat * 4));
  check_true("MTA dK, dV bitwise", same_bytes(direct.mdk, graphed.mdk, in.n_mta * 2) &&
                                       same_bytes(direct.mdv, graphed.mdv, in.n_mta * 2));
  {
    double *a = download_bf16(direct.mdq, in.n_mta), *b = download_bf16(graphed.mdq, in.n_mta);
    double *wa = download_f32(direct.mdw, in.n_w), *wb = download_f32(graphed.mdw, in.n_w);
    check("MTA dQ (atomic sums)", err_vs_max(b, a, in.n_mta), 1e-2);
    check("MTA dW (atomic sums)", err_vs_max(wb, wa, in.n_w), 1e-2);
    free(a), free(b), free(wa), free(wb);
  }
  check_true("MTA decode bitwise", same_bytes(direct.dec, graphed.dec, in.n_dec * 2));
  check_true("STREAM I, O bitwise", same_bytes(direct.idx, graphed.idx, in.n_idx * 8) &&
                                        same_bytes(direct.so, graphed.so, in.n_tok * 2));
  check_true("STREAM trace records, O bitwise (f32 and bf16)",
             same_bytes(direct.edges, graphed.edges, in.n_idx * sizeof(flashlab_stream_edge)) &&
                 same_bytes(direct.to, graphed.to, in.n_tok * 4) &&
                 same_bytes(direct.edges16, graphed.edges16, in.n_idx * sizeof(flashlab_stream_edge)) &&
                 same_bytes(direct.to16, graphed.to16, in.n_tok * 2));
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  CUDA_CHECK(cudaGraphDestroy(graph));
  CUDA_CHECK(cudaStreamDestroy(stream));
  free(aq), free(ak), free(av), free(ado), free(mq), free(mk), free(mv), free(mw), free(mdo), free(mw32);
  free(sq), free(sk), free(sv), free(sq32), free(sk32), free(sv32);
  return 0;
}
#endif

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0); /* results and errors in order, also into a log file */
  int cuda = 0;
  const char* save_dir = NULL;
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--cuda") == 0) cuda = 1;
    else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc) g_state = strtoull(argv[++i], NULL, 10);
    else if (strcmp(argv[i], "--save") == 0 && i + 1 < argc) save_dir = argv[++i];
    else {
      fprintf(stderr, "usage: %s [--cuda [--save DIR]] [--seed S]\n", argv[0]);
      return 2;
    }
  }
  if (save_dir && !cuda) {
    fprintf(stderr, "error: --save writes the CUDA run's tensors\nhint: add --cuda\n");
    return 2;
  }
  printf("libflashlab %s, ABI %d (header %d), CUDA kernels: %s\n", flashlab_version(), flashlab_abi_version(),
         FLASHLAB_ABI_VERSION, flashlab_has_cuda() ? "yes" : "no");
  if (flashlab_abi_version() != FLASHLAB_ABI_VERSION) {
    fprintf(stderr, "error: the library's ABI %d is not this header's %d\n", flashlab_abi_version(), FLASHLAB_ABI_VERSION);
    return 1;
  }
  cpu_attention();
  cpu_attention_gqa();
  cpu_mta();
  cpu_stream();
  if (cuda) {
#ifdef FLASHLAB_EXAMPLE_CUDA
    if (run_cuda(save_dir) != 0) return 1;
#else
    (void)save_dir;
    fprintf(stderr, "error: --cuda: this example was built without CUDA\n"
                    "hint: build it with the cuda preset (nvcc) and run it on a machine with an NVIDIA GPU\n");
    return 2;
#endif
  }
  if (g_failures) {
    fprintf(stderr, "error: %d check(s) failed (see above)\n", g_failures);
    return 1;
  }
  printf("all checks passed\n");
  return 0;
}
