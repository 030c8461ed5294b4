/**
 * @file flashlab.h
 * @brief flashlab's C ABI: attention, Multi-Token Attention and STREAM sparse tracing on the
 *        caller's memory, from C or any language with a C foreign-function interface.
 *
 * One shared library, `libflashlab.so`, exports exactly the `flashlab_*` symbols declared here.
 * Every entry point sits on its family's front door (the C++ APIs of reference/ and cuda/) and
 * adds no algorithm: it checks the arguments, converts them to the family's problem type and
 * calls it.
 *
 * **Devices.** Each call names where its pointers live (`flashlab_device`):
 * - `FLASHLAB_DEVICE_CPU`: host memory, the CPU reference (Eigen), dtype f32 or f64. Present in
 *   every build. The reference copies strided inputs into its own dense tensors and the results
 *   back, so any strides are honoured.
 * - `FLASHLAB_DEVICE_CUDA`: device memory, the fast kernels (bf16 or f16 in, fp32 statistics;
 *   the STREAM trace also takes f32, on the clear fp32 kernels),
 *   launched on the given `cudaStream_t` (passed as `void*`; NULL is the legacy default stream).
 *   Only in builds with the CUDA kernels (flashlab_has_cuda()); elsewhere the call returns
 *   FLASHLAB_ERROR_UNSUPPORTED. A CUDA call performs no host copy and no device-wide
 *   synchronisation; its scratch is the caller's workspace (the size queries), and only the
 *   Hopper attention forward's split tail draws a few KiB from a stream-ordered pool the library
 *   owns. So it may be captured in a CUDA graph and called from several threads on several
 *   streams at once. It returns after the launches; errors found at launch are reported, errors
 *   of the kernels themselves surface at the caller's next synchronisation, as for any CUDA
 *   library. Tensors, statistics, W, dW, indices and edges must be device memory (cudaMalloc,
 *   cudaMallocAsync or managed; refused with FLASHLAB_ERROR_INVALID_ARGUMENT otherwise); 16-bit
 *   tensors must start on a 16-byte boundary and workspaces on a 256-byte one (cudaMalloc's
 *   pointers are).
 *
 * **Errors.** Every function returns a flashlab_status. On anything but FLASHLAB_OK,
 * flashlab_last_error() returns a message for the calling thread that names the function, the
 * argument (or struct field), its value, the limit and a hint. No C++ exception crosses this
 * boundary, and a refused call leaves the CUDA context usable: arguments are checked before any
 * launch.
 *
 * **Layouts.** Tensors are described by flashlab_tensor: a pointer and the strides, in
 * elements, of the leading dimensions; the last dimension (the head dim) is always contiguous.
 * Attention and MTA tensors are `[B, N, H, d]` (FlashAttention's layout). Statistics (LSE) are
 * `[B, H, N]`, contiguous, LSE in base 2 of the base-2 scores:
 * LSE_i = log2 Σ_j 2^(S_ij · scale · log2 e). STREAM tensors are one head, `[T, d]`.
 * A stride of 0 means "contiguous in the documented layout" (each 0 independently); a negative
 * stride, or output strides that make two elements share memory, are refused with
 * FLASHLAB_ERROR_INVALID_ARGUMENT. A kernel that cannot take the strides given refuses them with
 * FLASHLAB_ERROR_UNSUPPORTED (the message names the tensor and the stride): the CUDA kernels read
 * and write their tensors contiguous (a dimension of extent 1 may have any stride).
 *
 * **Element types.** Q, K, V, O, dO, dQ, dK, dV have the problem's dtype. Statistics (LSE), MTA
 * kernels W and their gradient dW are `float`, except with dtype FLASHLAB_DTYPE_F64 (CPU), where
 * they are `double` so that a float64 reference stays float64 end to end: hence `void*` for them.
 *
 * **Versioning.** Problem structs start with `struct_size` (set it to sizeof the struct, or use
 * the `flashlab_*_defaults()` initialisers); fields are only ever appended, so a caller built
 * against an older header keeps working: a struct_size of an earlier minor version's struct is
 * read as that struct, the fields appended since taking their defaults (those of
 * `flashlab_*_defaults()`). Any other struct_size below this version's size is refused
 * (FLASHLAB_ERROR_INVALID_ARGUMENT); a larger one (a newer header) is accepted when every byte
 * past the fields this library knows is zero, else refused with FLASHLAB_ERROR_UNSUPPORTED.
 * FLASHLAB_ABI_VERSION changes only when an existing field or function changes meaning;
 * FLASHLAB_ABI_MINOR counts the additions (fields appended, functions added) within it.
 */
#ifndef FLASHLAB_H
#define FLASHLAB_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** The ABI this header describes; flashlab_abi_version() returns the library's. */
#define FLASHLAB_ABI_VERSION 1
/** Additions within FLASHLAB_ABI_VERSION: 1 appended the window and packed-sequence fields of
 *  flashlab_attention_problem and let flashlab_stream_trace() run on CUDA; 2 added
 *  flashlab_attention_call with flashlab_attention_forward_call() and
 *  flashlab_attention_backward_call(); 3 added the context-parallel ring (flashlab_ring_*). */
#define FLASHLAB_ABI_MINOR 3

/** Marks the exported symbols (the library is built with hidden visibility otherwise). */
#if defined(FLASHLAB_BUILDING_LIBRARY)
#define FLASHLAB_API __attribute__((visibility("default")))
#else
#define FLASHLAB_API
#endif

/** Outcome of every call. */
typedef enum flashlab_status {
  FLASHLAB_OK = 0,                     /**< success */
  FLASHLAB_ERROR_INVALID_ARGUMENT = 1, /**< a NULL pointer, a bad shape, a value out of range */
  FLASHLAB_ERROR_UNSUPPORTED = 2,      /**< valid, but not on this device, dtype or build */
  FLASHLAB_ERROR_CUDA = 3,             /**< a CUDA runtime call failed (message names it) */
  FLASHLAB_ERROR_OUT_OF_MEMORY = 4,    /**< an allocation failed */
  FLASHLAB_ERROR_INTERNAL = 5          /**< a bug: please report the message */
} flashlab_status;

/** Where a call's pointers live and which kernels run. */
typedef enum flashlab_device {
  FLASHLAB_DEVICE_CPU = 0,  /**< host memory, the CPU reference */
  FLASHLAB_DEVICE_CUDA = 1  /**< device memory, the CUDA kernels, on a stream */
} flashlab_device;

/** Element type of Q, K, V, O and their gradients. */
typedef enum flashlab_dtype {
  FLASHLAB_DTYPE_F32 = 0,  /**< float (CPU) */
  FLASHLAB_DTYPE_F64 = 1,  /**< double (CPU); statistics, W and dW double too */
  FLASHLAB_DTYPE_BF16 = 2, /**< bfloat16 bit patterns (CUDA) */
  FLASHLAB_DTYPE_F16 = 3   /**< IEEE binary16 bit patterns (CUDA) */
} flashlab_dtype;

/** A tensor: its data and the strides (in elements) of its leading dimensions. For
 *  `[B, N, H, d]` tensors: stride[0] batch, stride[1] sequence, stride[2] head; 0 = contiguous.
 *  For STREAM's `[T, d]`: stride[1] is the row stride; stride[0] and stride[2] must be 0. */
typedef struct flashlab_tensor {
  void* data;         /**< first element (const for inputs) */
  int64_t stride[3];  /**< strides of the three leading dimensions, elements; 0 = contiguous */
} flashlab_tensor;

/** The library's ABI version (FLASHLAB_ABI_VERSION it was built with). */
FLASHLAB_API int flashlab_abi_version(void);
/** The library's version string, e.g. "0.1.0". */
FLASHLAB_API const char* flashlab_version(void);
/** 1 when this build has the CUDA kernels (FLASHLAB_DEVICE_CUDA works), else 0. */
FLASHLAB_API int flashlab_has_cuda(void);
/** The message of the calling thread's most recent call that returns a flashlab_status: its
 *  failure, or "" when it succeeded. Valid until that thread's next flashlab call. */
FLASHLAB_API const char* flashlab_last_error(void);
/** The name of a status, e.g. "FLASHLAB_ERROR_UNSUPPORTED" ("FLASHLAB_STATUS_UNKNOWN" for a value
 *  that is none). */
FLASHLAB_API const char* flashlab_status_name(flashlab_status status);

/* ---------------------------------------------------------------------------------------------
 * Attention: O = softmax(scale · Q Kᵀ + mask) V, forward and backward.
 * ------------------------------------------------------------------------------------------- */

/** One attention problem. Build with flashlab_attention_defaults(), then set the fields.
 *
 *  **Grouped-query attention**: `heads_kv` = H_kv divides H; query head h reads key/value head
 *  h / (H / H_kv) (H_kv = 1 is multi-query attention); dK and dV are sums over each group.
 *
 *  **The mask** (per sequence, i and j counted from its first query and key, diagonal
 *  bottom-right aligned with offset = N_k − N): query i sees key j iff 0 ≤ j < N_k and, when
 *  `causal`, j ≤ i + offset; when `window_left` ≥ 0, j ≥ i + offset − window_left; when
 *  `window_right` ≥ 0, j ≤ i + offset + window_right (FlashAttention's `window_size`). A row that
 *  sees no key gets O = 0, LSE = −∞ and zero gradients.
 *
 *  **Packed sequences** (FlashAttention's varlen interface): set `cu_seqlens_q` and
 *  `cu_seqlens_k` to the B + 1 prefix sums of the query and key lengths (int32, in the call's
 *  memory: host for FLASHLAB_DEVICE_CPU, device memory for FLASHLAB_DEVICE_CUDA, as FlashAttention's
 *  varlen call takes them), `batch` to B, `seq_q` and `seq_k` to max_seqlen_q and max_seqlen_k (at
 *  least the longest query and key sequence), `total_q` and `total_k` to the rows of the packed
 *  tensors. On CUDA the forward's kernels read the lists on the device and the library never
 *  copies them to the host, so it checks their contents nowhere: lists that break the rules below
 *  give undefined results there (the CPU checks them and names the entry); the CUDA backward takes
 *  them too (deterministic = 1: the two-kernel design, no atomics, bit-reproducible; 0: dQ
 *  summed with atomics, faster). Sequence b owns query rows cu_seqlens_q[b] … cu_seqlens_q[b+1] − 1 and
 *  key rows cu_seqlens_k[b] … cu_seqlens_k[b+1] − 1. Tensors are then `[total_q, H, d]` (q, o,
 *  d_o, dq) and `[total_k, H_kv, d]` (k, v, dk, dv), given as flashlab_tensor with stride[1] the
 *  row stride and stride[2] the head stride (stride[0] is not read); LSE is `[H, total_q]`. Each
 *  list starts at 0, never decreases (a repeated entry is an empty sequence) and ends at the
 *  total. */
typedef struct flashlab_attention_problem {
  size_t struct_size;     /**< sizeof(flashlab_attention_problem) */
  int64_t batch;          /**< B (≥ 1): sequences */
  int64_t seq_q;          /**< N, queries (≥ 1); packed: max_seqlen_q */
  int64_t seq_k;          /**< N_k, keys and values; 0 means N_k = N; packed: max_seqlen_k */
  int64_t heads;          /**< H, query heads (≥ 1) */
  int64_t heads_kv;       /**< H_kv, key/value heads, dividing H; 0 means H_kv = H */
  int64_t head_dim;       /**< d (≥ 1; the CUDA kernels take 64, 128 and 256; packed sequences 64 and 128) */
  double scale;           /**< softmax scale; 0 means 1/√d */
  int causal;             /**< 1: query i sees key j iff j ≤ i + N_k − N (bottom-right aligned); 0 or 1 */
  flashlab_dtype dtype;   /**< element type of Q, K, V, O, dO, dQ, dK, dV */
  int deterministic;      /**< backward: 1 = bit-reproducible dQ, dK, dV (fixed summation order; the CPU always is) */
  /* Appended in FLASHLAB_ABI_MINOR 1: a caller built without them gets the defaults below. */
  int64_t window_left;    /**< keys seen left of the diagonal; −1 (the default) unbounded, else 0 … 2^31 − 1 */
  int64_t window_right;   /**< keys seen right of the diagonal; −1 (the default) unbounded, else 0 … 2^31 − 1 */
  const int32_t* cu_seqlens_q; /**< packed: B + 1 query prefix sums; NULL (the default): dense `[B, N, H, d]` */
  const int32_t* cu_seqlens_k; /**< packed: B + 1 key prefix sums; NULL exactly when cu_seqlens_q is */
  int64_t total_q;        /**< packed: rows of q (= cu_seqlens_q[B]); 0 when dense */
  int64_t total_k;        /**< packed: rows of k and v (= cu_seqlens_k[B]); 0 when dense */
} flashlab_attention_problem;

/** A problem with every field at its default: B = 1, H = 1, N_k = N, H_kv = H, scale 1/√d,
 *  not causal, bf16, not deterministic, no window (−1, −1), dense; seq_q and head_dim 0 (to be
 *  set). */
FLASHLAB_API flashlab_attention_problem flashlab_attention_defaults(void);

/** Checks `problem` for `device` without running anything: FLASHLAB_OK, or the status and
 *  message the forward would give for the problem (tensors are not looked at). */
FLASHLAB_API flashlab_status flashlab_attention_check(const flashlab_attention_problem* problem,
                                                      flashlab_device device);

/** Bytes of scratch flashlab_attention_forward() needs in `*bytes`: 0 on the CPU; on CUDA
 *  4·B·H·N, the room for LSE, used only when the forward's `lse` is NULL (the kernels always
 *  write LSE), so a caller that passes `lse` may pass no workspace. */
FLASHLAB_API flashlab_status flashlab_attention_forward_workspace_size(
    const flashlab_attention_problem* problem, flashlab_device device, size_t* bytes);

/** Forward pass. q `[B, N, H, d]`, k and v `[B, N_k, H_kv, d]`, o `[B, N, H, d]` (written),
 *  lse `[B, H, N]` contiguous (written; may be NULL when not wanted); packed sequences as the
 *  problem's comment says. A row that sees no key (causal with N > N_k, a window that misses
 *  every key) gets O = 0 and LSE = −∞. `workspace` holds at least the size query's
 *  bytes (NULL if 0); `stream` is a cudaStream_t for CUDA, ignored on the CPU. On CUDA the kernel
 *  the front door chooses for the problem runs: split-KV for few query rows against many keys
 *  (dense, no window, d = 64 or 128), else the fastest built for the device (the TMA +
 *  warp-specialised one on an H100/H200). */
FLASHLAB_API flashlab_status flashlab_attention_forward(const flashlab_attention_problem* problem,
                                                        flashlab_device device, flashlab_tensor q,
                                                        flashlab_tensor k, flashlab_tensor v,
                                                        flashlab_tensor o, void* lse, void* workspace,
                                                        size_t workspace_bytes, void* stream);

/** Bytes of scratch flashlab_attention_backward() needs in `*bytes` (0 on the CPU). */
FLASHLAB_API flashlab_status flashlab_attention_backward_workspace_size(
    const flashlab_attention_problem* problem, flashlab_device device, size_t* bytes);

/** Backward pass of L = Σ O∘dO: from q, k, v, the forward's o and lse, and d_o, writes dq
 *  `[B, N, H, d]`, dk and dv `[B, N_k, H_kv, d]`. `workspace` as the size query says (the
 *  first B·H·N floats of a CUDA workspace hold D_i = rowsum(dO_i ∘ O_i) on return). On CUDA,
 *  deterministic = 0 runs the fastest backward (dQ summed with atomics), 1 one whose dQ, dK, dV
 *  are bit-reproducible (the fixed-order Hopper kernel on a dense problem with H_kv = H, N_k = N
 *  and no window, or any dense problem at d = 256, else the two-kernel design; docs/capi.md states
 *  the choice); both take grouped K/V, N_k ≠ N and windows. At d = 256, deterministic = 1 needs
 *  the Hopper kernel (an H100/H200 and a build with sm_90a): elsewhere it is refused
 *  (FLASHLAB_ERROR_UNSUPPORTED). */
FLASHLAB_API flashlab_status flashlab_attention_backward(
    const flashlab_attention_problem* problem, flashlab_device device, flashlab_tensor q,
    flashlab_tensor k, flashlab_tensor v, flashlab_tensor o, const void* lse, flashlab_tensor d_o,
    flashlab_tensor dq, flashlab_tensor dk, flashlab_tensor dv, void* workspace,
    size_t workspace_bytes, void* stream);

/** One attention call's arguments in one struct (added in FLASHLAB_ABI_MINOR 2): those of
 *  flashlab_attention_forward() and flashlab_attention_backward(), same meaning and rules, for a
 *  caller to whom passing eleven to fourteen arguments costs more than setting a few fields. An
 *  interpreter's foreign-function interface converts, and copies by value, every argument of
 *  every call; with this struct such a caller keeps one per thread, sets the pointers that
 *  change, and passes one pointer. Zero it and set `struct_size`; it versions as the problem
 *  structs do (see "Versioning"). The forward reads the fields up to `lse`, the workspace and the
 *  stream; the backward all of them. */
typedef struct flashlab_attention_call {
  size_t struct_size;                         /**< sizeof(flashlab_attention_call) */
  const flashlab_attention_problem* problem;  /**< the problem, as for flashlab_attention_forward() */
  flashlab_device device;                     /**< where the pointers live */
  flashlab_tensor q;                          /**< queries `[B, N, H, d]` */
  flashlab_tensor k;                          /**< keys `[B, N_k, H_kv, d]` */
  flashlab_tensor v;                          /**< values `[B, N_k, H_kv, d]` */
  flashlab_tensor o;                          /**< forward: written; backward: the forward's O, read */
  void* lse;                                  /**< forward: written (may be NULL); backward: read */
  flashlab_tensor d_o;                        /**< backward: dO, read */
  flashlab_tensor dq;                         /**< backward: dQ, written */
  flashlab_tensor dk;                         /**< backward: dK, written */
  flashlab_tensor dv;                         /**< backward: dV, written */
  void* workspace;                            /**< scratch, as the call's size query says (NULL if 0) */
  size_t workspace_bytes;                     /**< bytes at `workspace` */
  void* stream;                               /**< cudaStream_t for CUDA; ignored on the CPU */
} flashlab_attention_call;

/** flashlab_attention_forward() with its arguments in `call`: the same checks, kernels and
 *  results; messages name this function and the fields as the forward names its arguments. */
FLASHLAB_API flashlab_status flashlab_attention_forward_call(const flashlab_attention_call* call);

/** flashlab_attention_backward() with its arguments in `call`, as flashlab_attention_forward_call(). */
FLASHLAB_API flashlab_status flashlab_attention_backward_call(const flashlab_attention_call* call);

/* ---------------------------------------------------------------------------------------------
 * Multi-Token Attention: a cq × ck convolution over the (query, key) scores, causal.
 * ------------------------------------------------------------------------------------------- */

/** Query rows the MTA decode computes: the last min(FLASHLAB_MTA_DECODE_ROWS, N) tokens. */
#define FLASHLAB_MTA_DECODE_ROWS 16

/** One MTA problem. Build with flashlab_mta_defaults(). */
typedef struct flashlab_mta_problem {
  size_t struct_size;    /**< sizeof(flashlab_mta_problem) */
  int64_t batch;         /**< B */
  int64_t seq;           /**< N (queries = keys) */
  int64_t heads;         /**< H */
  int64_t head_dim;      /**< d (the CUDA kernels take 64 or 128) */
  int64_t cq;            /**< kernel rows (past queries + the row itself; CUDA and the decode: ≤ 16) */
  int64_t ck;            /**< kernel columns, odd (CUDA: ≤ 15) */
  double scale;          /**< softmax scale; 0 means 1/√d */
  flashlab_dtype dtype;  /**< element type of Q, K, V, O and their gradients */
} flashlab_mta_problem;

/** Defaults: B = 1, H = 1, cq = ck = 1, scale 1/√d, bf16; seq, head_dim 0 (to be set). */
FLASHLAB_API flashlab_mta_problem flashlab_mta_defaults(void);

/** Scratch of the MTA forward (`*bytes`; 0). */
FLASHLAB_API flashlab_status flashlab_mta_forward_workspace_size(const flashlab_mta_problem* problem,
                                                                 flashlab_device device, size_t* bytes);
/** MTA forward: q, k, v, o `[B, N, H, d]`; w `[H, cq, ck]` contiguous; lse `[B, H, N]` (written,
 *  not NULL: the backward needs it). */
FLASHLAB_API flashlab_status flashlab_mta_forward(const flashlab_mta_problem* problem, flashlab_device device,
                                                  flashlab_tensor q, flashlab_tensor k, flashlab_tensor v,
                                                  const void* w, flashlab_tensor o, void* lse,
                                                  void* workspace, size_t workspace_bytes, void* stream);
/** Scratch of the MTA backward (`*bytes`; 0 on the CPU). */
FLASHLAB_API flashlab_status flashlab_mta_backward_workspace_size(const flashlab_mta_problem* problem,
                                                                  flashlab_device device, size_t* bytes);
/** MTA backward: gradients dq, dk, dv `[B, N, H, d]` and dw `[H, cq, ck]` (overwritten, summed
 *  over the batch) from the forward's o and lse. */
FLASHLAB_API flashlab_status flashlab_mta_backward(const flashlab_mta_problem* problem, flashlab_device device,
                                                   flashlab_tensor q, flashlab_tensor k, flashlab_tensor v,
                                                   const void* w, flashlab_tensor o, const void* lse,
                                                   flashlab_tensor d_o, flashlab_tensor dq, flashlab_tensor dk,
                                                   flashlab_tensor dv, void* dw, void* workspace,
                                                   size_t workspace_bytes, void* stream);
/** Scratch of the MTA decode (`*bytes`; 0 on the CPU, the per-split partials on CUDA). */
FLASHLAB_API flashlab_status flashlab_mta_decode_workspace_size(const flashlab_mta_problem* problem,
                                                                flashlab_device device, size_t* bytes);
/** MTA decode: the outputs of the last R = min(FLASHLAB_MTA_DECODE_ROWS, N) query rows, each
 *  against its keys 0 … i, keys split across the device and the splits merged (on the CPU the
 *  reference's split-K inference, row by row). q, k, v `[B, N, H, d]` (of q only rows
 *  N − R − cq + 1 … N − 1 are read); o `[B, R, H, d]` (written; row r is token N − R + r);
 *  cq ≤ 16. Equal to the forward's last R rows up to rounding. */
FLASHLAB_API flashlab_status flashlab_mta_decode(const flashlab_mta_problem* problem, flashlab_device device,
                                                 flashlab_tensor q, flashlab_tensor k, flashlab_tensor v,
                                                 const void* w, flashlab_tensor o, void* workspace,
                                                 size_t workspace_bytes, void* stream);

/* ---------------------------------------------------------------------------------------------
 * STREAM sparse tracing: hierarchical top-k key-block selection, sparse attention, edges.
 * ------------------------------------------------------------------------------------------- */

/** One STREAM problem (one head of T tokens). Build with flashlab_stream_defaults(). */
typedef struct flashlab_stream_problem {
  size_t struct_size;      /**< sizeof(flashlab_stream_problem) */
  int64_t tokens;          /**< T */
  int64_t head_dim;        /**< d (the CUDA kernels take 64 or 128) */
  int64_t block_q;         /**< b_q, query-block size (CUDA: 64) */
  int64_t block_k;         /**< b_k, key-block size (CUDA: 64) */
  int64_t k_blocks;        /**< k, key blocks kept per query block */
  flashlab_dtype dtype;    /**< element type of Q, K, V, O (the CUDA estimate: bf16; the CUDA trace also f32) */
  /** Optional user block mask, n_q × n_k bytes 0/1 on the host; NULL = causal only. The CUDA
   *  estimate takes the causal mask only (a user mask is refused with
   *  FLASHLAB_ERROR_UNSUPPORTED: its kernel reads the mask packed in device memory, which only a
   *  host-to-device copy could make from these bytes, and no CUDA call copies); the CUDA apply and
   *  trace read only `indices`. */
  const uint8_t* mask;
} flashlab_stream_problem;

/** Defaults: b_q = b_k = 64, k = 8, bf16, causal only; tokens, head_dim 0 (to be set). */
FLASHLAB_API flashlab_stream_problem flashlab_stream_defaults(void);

/** n_q = ⌈T / b_q⌉ in `*n_q` (rows of the index tensor). */
FLASHLAB_API flashlab_status flashlab_stream_query_blocks(const flashlab_stream_problem* problem,
                                                          int64_t* n_q);
/** Scratch of the estimate (`*bytes`; 0). */
FLASHLAB_API flashlab_status flashlab_stream_estimate_workspace_size(const flashlab_stream_problem* problem,
                                                                     flashlab_device device, size_t* bytes);
/** Mask estimation: q, k `[T, d]` → indices int64 `[n_q, k]` (−1 = empty entry; the reference's
 *  and the kernels' index type), exactly the reference's order τ. */
FLASHLAB_API flashlab_status flashlab_stream_estimate(const flashlab_stream_problem* problem,
                                                      flashlab_device device, flashlab_tensor q,
                                                      flashlab_tensor k, int64_t* indices, void* workspace,
                                                      size_t workspace_bytes, void* stream);
/** Scratch of the application (`*bytes`; 0). */
FLASHLAB_API flashlab_status flashlab_stream_apply_workspace_size(const flashlab_stream_problem* problem,
                                                                  flashlab_device device, size_t* bytes);
/** Mask application: sparse attention of q over the key blocks in `indices` (the paper's
 *  unscaled logits: scale q beforehand), o `[T, d]` written. The CPU checks `indices` against
 *  the validity invariant (as the estimate writes them); the CUDA kernel trusts them (device
 *  memory: checking would need a copy), so pass what an estimate wrote. */
FLASHLAB_API flashlab_status flashlab_stream_apply(const flashlab_stream_problem* problem, flashlab_device device,
                                                   flashlab_tensor q, flashlab_tensor k, flashlab_tensor v,
                                                   const int64_t* indices, flashlab_tensor o, void* workspace,
                                                   size_t workspace_bytes, void* stream);

/** One edge record: query block q reads key block r (slot j of I[q, :]) with three weights. */
typedef struct flashlab_stream_edge {
  int32_t q;          /**< query block */
  int32_t r;          /**< key block */
  int32_t slot;       /**< position in I[q, :] */
  float score;        /**< representative score: max token-valid ⟨q, k⟩ */
  float mass;         /**< Σ p over the block pair under the sparse softmax */
  float value_norm;   /**< ‖Σ p·V‖₂ over the block pair */
} flashlab_stream_edge;

/** Scratch of the trace (`*bytes`): 0 on the CPU and for a BF16/F16 trace on CUDA; an F32 trace
 *  on CUDA needs the per-row softmax statistics, room for O and the kernel's wide records before
 *  they are narrowed into `edges`. */
FLASHLAB_API flashlab_status flashlab_stream_trace_workspace_size(const flashlab_stream_problem* problem,
                                                                  flashlab_device device, size_t* bytes);
/** Edge records of a trace, one per entry of `indices` in row-major (q, slot) order: n_q·k
 *  records in `edges`; an empty entry (−1) gives r = −1 and zero weights. Also writes o `[T, d]`
 *  unless o.data is NULL. On the CPU everything is host memory. On CUDA q, k, v, o, `indices` and
 *  `edges` are device memory, everything runs on `stream` with no host copy, and `indices` are
 *  trusted as in flashlab_stream_apply(): BF16 or F16 run the fast trace on tensor cores (the
 *  fast apply's limits; O from the fast apply), F32 the clear fp32 kernels (k ≤ 65535; `workspace`
 *  holds the size query's bytes). The records agree with the CPU's on the same values up to the
 *  rounding of the kernels' arithmetic (fp32 sums in another order; the fast trace rounds P to
 *  the input dtype before P·V, as the fast apply does). */
FLASHLAB_API flashlab_status flashlab_stream_trace(const flashlab_stream_problem* problem, flashlab_device device,
                                                   flashlab_tensor q, flashlab_tensor k, flashlab_tensor v,
                                                   const int64_t* indices, flashlab_tensor o,
                                                   flashlab_stream_edge* edges, void* workspace,
                                                   size_t workspace_bytes, void* stream);

/* ---------------------------------------------------------------------------------------------
 * Context parallelism: one attention problem over G GPUs, a rank per GPU, K/V passed around a
 * ring over NCCL while the fast kernels work on the block in hand; partial outputs merged by LSE.
 * ------------------------------------------------------------------------------------------- */

/** Bytes of a ring's id (NCCL's unique id): made by one rank, given to every rank. */
#define FLASHLAB_RING_ID_BYTES 128

/** How the sequence of N rows is cut among the G ranks. */
typedef enum flashlab_ring_layout {
  /** 2G chunks of c = N / 2G rows; rank r holds chunks r and 2G − 1 − r, so that every rank has
   *  the same causal work (the layout for causal attention). */
  FLASHLAB_RING_ZIGZAG = 0,
  /** G chunks of c = N / G rows; rank r holds chunk r. */
  FLASHLAB_RING_CONTIGUOUS = 1
} flashlab_ring_layout;

/** One rank's end of a ring: its NCCL communicator on the device that was current when it was
 *  made. Opaque; made by flashlab_ring_create(), released by flashlab_ring_destroy(). */
typedef struct flashlab_ring flashlab_ring;

/** 1 when this build has the ring (CUDA and NCCL), else 0; without it every flashlab_ring_*
 *  call returns FLASHLAB_ERROR_UNSUPPORTED. */
FLASHLAB_API int flashlab_has_ring(void);

/** Writes a new ring id to `id` (FLASHLAB_RING_ID_BYTES bytes). One rank makes it and sends it to
 *  the others over the caller's own channel (a torch.distributed broadcast, MPI, a file). */
FLASHLAB_API flashlab_status flashlab_ring_unique_id(unsigned char* id);

/** Makes this process's (or thread's) rank `rank` of a ring of `gpus` ranks from `id`, on the
 *  current CUDA device, in `*ring`. Collective: every rank calls it with the same id and `gpus`,
 *  and it returns once all have. One rank (`gpus` 1) needs no NCCL communicator and makes none.
 *  NVLink multicast stays off (NCCL_NVLS_ENABLE=0 unless the environment sets it). */
FLASHLAB_API flashlab_status flashlab_ring_create(const unsigned char* id, int gpus, int rank,
                                                  flashlab_ring** ring);

/** Releases a ring made by flashlab_ring_create() (NULL: nothing), after the work enqueued on
 *  it has finished. */
FLASHLAB_API flashlab_status flashlab_ring_destroy(flashlab_ring* ring);

/** Bytes of scratch one rank of flashlab_ring_forward() (`backward` 0) or
 *  flashlab_ring_backward() (`backward` 1) needs in `*bytes`, for the whole problem `problem`
 *  over `gpus` ranks cut by `layout`. */
FLASHLAB_API flashlab_status flashlab_ring_workspace_size(const flashlab_attention_problem* problem,
                                                          flashlab_ring_layout layout, int gpus,
                                                          int backward, size_t* bytes);

/** One rank of the ring forward. `problem` is the whole problem: B, N (the whole sequence, a
 *  multiple of the layout's chunks), H, H_kv, d, causal, scale, a 16-bit dtype; dense, N_k = N,
 *  no window. The rank's tensors are contiguous device memory in its local layout, its chunks one
 *  after the other (zigzag: chunk r, then chunk 2G − 1 − r; for B = 1 simply `[1, N / G, H, d]`):
 *  q and o `[chunks][B, c, H, d]`, k and v `[chunks][B, c, H_kv, d]`, lse `[chunks][B, H, c]`
 *  float, base 2 (written). Enqueued on `stream` (a cudaStream_t on the ring's device; NULL the
 *  default stream) and on a stream of the ring's own for NCCL; returns without synchronising.
 *  Every rank must call it with the same problem. */
FLASHLAB_API flashlab_status flashlab_ring_forward(const flashlab_attention_problem* problem,
                                                   flashlab_ring_layout layout, flashlab_ring* ring,
                                                   const void* q, const void* k, const void* v, void* o,
                                                   float* lse, void* workspace, size_t workspace_bytes,
                                                   void* stream);

/** One rank of the ring backward of L = Σ O∘dO, as flashlab_ring_forward(): from q, k, v, the
 *  forward's o and lse and d_o (local layout) writes dq `[chunks][B, c, H, d]`, dk and dv
 *  `[chunks][B, c, H_kv, d]` (the rank's own K/V rows, summed over every rank's queries).
 *  `deterministic` 1 is taken where the deterministic Hopper backward is. */
FLASHLAB_API flashlab_status flashlab_ring_backward(const flashlab_attention_problem* problem,
                                                    flashlab_ring_layout layout, flashlab_ring* ring,
                                                    const void* q, const void* k, const void* v,
                                                    const void* o, const float* lse, const void* d_o,
                                                    void* dq, void* dk, void* dv, void* workspace,
                                                    size_t workspace_bytes, void* stream);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* FLASHLAB_H */
