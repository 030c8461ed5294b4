// cuda/src/core/hopper.cuh — small named wrappers of Hopper's (sm_90a) asynchronous instructions, shared by
// the wgmma forward (attention_fwd_wgmma.cu), the TMA + warp-specialised forward (attention_fwd_ws.cu)
// and backward (attention_bwd_ws.cu): warpgroup MMA (wgmma) and its shared-memory matrix descriptors,
// mbarriers, TMA tile loads and stores (cp.async.bulk.tensor), register reallocation
// (setmaxnreg), named barriers; and on
// the host, the tensor map of one head's [N, d] slice of a [B, N, H, d] tensor.
// Each device wrapper follows the PTX ISA section named in its comment. Internal to cuda/src; only
// files compiled for sm_90a include it (elsewhere the device wrappers compile to nothing: the
// kernels that use them trap and are never launched).
#pragma once

#include "core/common.hpp"

#include <cuda.h>  // CUtensorMap and cuTensorMapEncodeTiled's types only: libcuda is not linked
#include <cuda_runtime.h>

#include <cstdint>

namespace flashlab::cuda::detail {

// Only sm_90a has wgmma and setmaxnreg. __CUDA_ARCH_FEAT_SM90_ALL is nvcc's macro for "compute_90a".
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FLASHLAB_WGMMA_OK 1
#else
#define FLASHLAB_WGMMA_OK 0
#endif

// ----------------------------------------------------------------------------- wgmma
/// Registers written before this point (accumulators, A fragments) are ready for wgmma
/// ("Asynchronous Warpgroup Level Matrix Multiply-Accumulate: wgmma.fence").
__device__ __forceinline__ void wg_fence() {
#if FLASHLAB_WGMMA_OK
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
/// Close the current group of issued wgmma ops ("wgmma.commit_group").
__device__ __forceinline__ void wg_commit() {
#if FLASHLAB_WGMMA_OK
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
/// Wait until at most kPending groups of this warpgroup are still running ("wgmma.wait_group").
template <int kPending>
__device__ __forceinline__ void wg_wait() {
#if FLASHLAB_WGMMA_OK
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#endif
}
/// The compiler must not move reads/writes of accumulator registers across a wgmma fence/wait
/// (the asm blocks above only order memory): tie every register to an empty asm.
template <int kN>
__device__ __forceinline__ void reg_fence(float (&a)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(a[i])::"memory");
}
/// reg_fence for 16-bit A fragments held in registers (inputs of wgmma until the wait after it).
template <int kN>
__device__ __forceinline__ void reg_fence_u(uint32_t (&a)[kN][4]) {
#pragma unroll
  for (int i = 0; i < kN; ++i)
#pragma unroll
    for (int k = 0; k < 4; ++k) asm volatile("" : "+r"(a[i][k])::"memory");
}

/// Shared-memory matrix descriptor ("Matrix Descriptor Format", sm_90): start address >> 4 in
/// bits 0–13, leading byte offset >> 4 in 16–29, stride byte offset >> 4 in 32–45, base offset
/// 0 (tiles are 1024-byte aligned), swizzle mode in 62–63 (1 = 128-byte swizzle).
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((addr & 0x3FFFFu) >> 4) | (uint64_t(lbo >> 4) << 16) | (uint64_t(sbo >> 4) << 32) |
         (uint64_t(1) << 62);
}

/// `desc` (smem_desc) with its start address `bytes` further on: one 32-bit add on the address
/// field, where smem_desc of the new address masks, shifts and merges again. `bytes`: a multiple
/// of 16 that keeps the address inside SRAM (below 256 KiB: no carry out of the 14-bit field).
__device__ __forceinline__ uint64_t desc_plus(uint64_t desc, uint32_t bytes) {
  return (desc & 0xFFFFFFFF00000000ull) | uint32_t(uint32_t(desc) + (bytes >> 4));
}

// Operand lists of the accumulator registers (written once here, read by the wrappers below).
#define FL_D32                                                                                            \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
  "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define FL_D64                                                                                              \
  FL_D32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, " \
         "%51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define FL_ACC8(d, i)                                                                                  \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
      "+f"(d[i + 7])
#define FL_ACC32(d) FL_ACC8(d, 0), FL_ACC8(d, 8), FL_ACC8(d, 16), FL_ACC8(d, 24)
#define FL_ACC64(d) FL_ACC32(d), FL_ACC8(d, 32), FL_ACC8(d, 40), FL_ACC8(d, 48), FL_ACC8(d, 56)

/// D[64×128] (+)= A[64×16] · B[16×128], A and B K-major in SRAM (descriptors) ("wgmma.mma_async").
/// Used for S = Q Kᵀ.
#define FL_WGMMA_SS_N128(TY)                                                                  \
  asm volatile(                                                                               \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                            \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " {" FL_D64 "}, %64, %65, p, 1, 1, 0, 0;\n}\n" \
      : FL_ACC64(d)                                                                           \
      : "l"(desc_a), "l"(desc_b), "r"(accumulate))
template <bool kBf16>
__device__ __forceinline__ void wgmma_ss_n128(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int accumulate) {
#if FLASHLAB_WGMMA_OK
  if constexpr (kBf16) FL_WGMMA_SS_N128("bf16");
  else FL_WGMMA_SS_N128("f16");
#endif
}

/// D[64×N] (+)= A[64×16] (registers) · B[16×N], B MN-major in SRAM (imm-trans-b = 1). O += P V.
#define FL_WGMMA_RS_N128(TY)                                                                           \
  asm volatile(                                                                                        \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                                     \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " {" FL_D64                             \
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"                                                 \
      : FL_ACC64(d)                                                                                    \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate))
#define FL_WGMMA_RS_N64(TY)                                                                            \
  asm volatile(                                                                                        \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                                     \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " {" FL_D32                              \
      "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"                                                 \
      : FL_ACC32(d)                                                                                    \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate))
// n = 256 (d = 256): 128 accumulator registers, the largest n of a 16-bit wgmma.
#define FL_D128                                                                                           \
  FL_D64 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, "  \
         "%82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, " \
         "%101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, "   \
         "%117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define FL_ACC128(d)                                                                                        \
  FL_ACC64(d), FL_ACC8(d, 64), FL_ACC8(d, 72), FL_ACC8(d, 80), FL_ACC8(d, 88), FL_ACC8(d, 96), FL_ACC8(d, 104), \
      FL_ACC8(d, 112), FL_ACC8(d, 120)
#define FL_WGMMA_RS_N256(TY)                                                                           \
  asm volatile(                                                                                        \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"                                                    \
      "wgmma.mma_async.sync.aligned.m64n256k16.f32." TY "." TY " {" FL_D128                            \
      "}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"                                             \
      : FL_ACC128(d)                                                                                   \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate))
template <bool kBf16, int kN>
__device__ __forceinline__ void wgmma_rs(float (&d)[kN / 2], const uint32_t (&a)[4], uint64_t desc_b, int accumulate) {
#if FLASHLAB_WGMMA_OK
  if constexpr (kN == 128) {
    if constexpr (kBf16) FL_WGMMA_RS_N128("bf16");
    else FL_WGMMA_RS_N128("f16");
  } else if constexpr (kN == 256) {
    if constexpr (kBf16) FL_WGMMA_RS_N256("bf16");
    else FL_WGMMA_RS_N256("f16");
  } else {
    static_assert(kN == 64, "P·V wgmma: n = d ∈ {64, 128, 256}");
    if constexpr (kBf16) FL_WGMMA_RS_N64("bf16");
    else FL_WGMMA_RS_N64("f16");
  }
#endif
}

/// D[64×N] (+)= A[64×16] · B[16×N], both from SRAM, each K-major (kTrans = false) or MN-major
/// (kTrans = true: imm-trans-a / imm-trans-b = 1, the operand stored [k][m] or [k][n]), N ∈ {32,
/// 64, 128}. The backward's Sᵀ = K_j Q_iᵀ (both K-major) and dQ_i = dS_ij K_j (dSᵀ and K_j stored
/// [key][·]: both MN-major).
#define FL_D16 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define FL_ACC16(d) FL_ACC8(d, 0), FL_ACC8(d, 8)
// The accumulator operand list comes last (__VA_ARGS__: it contains commas).
#define FL_WGMMA_SS_T(TY, N, DLIST, IA, IB, IP, TA, TB, ...)                                             \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " IP ", 0;\n"                                             \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " {" DLIST "}, " IA ", " IB \
               ", p, 1, 1, " #TA ", " #TB ";\n}\n"                                                         \
               : __VA_ARGS__                                                                               \
               : "l"(desc_a), "l"(desc_b), "r"(accumulate))
#define FL_WGMMA_SS_T_TYPES(N, DLIST, IA, IB, IP, TA, TB, ...)                       \
  if constexpr (kBf16) FL_WGMMA_SS_T("bf16", N, DLIST, IA, IB, IP, TA, TB, __VA_ARGS__); \
  else FL_WGMMA_SS_T("f16", N, DLIST, IA, IB, IP, TA, TB, __VA_ARGS__)
template <bool kBf16, int kN, bool kTransA, bool kTransB>
__device__ __forceinline__ void wgmma_ss_t(float (&d)[kN / 2], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  static_assert(kTransA == kTransB, "instantiated: both K-major or both MN-major");
#if FLASHLAB_WGMMA_OK
  if constexpr (kN == 128) {
    if constexpr (kTransA) FL_WGMMA_SS_T_TYPES(128, FL_D64, "%64", "%65", "%66", 1, 1, FL_ACC64(d));
    else FL_WGMMA_SS_T_TYPES(128, FL_D64, "%64", "%65", "%66", 0, 0, FL_ACC64(d));
  } else if constexpr (kN == 64) {
    if constexpr (kTransA) FL_WGMMA_SS_T_TYPES(64, FL_D32, "%32", "%33", "%34", 1, 1, FL_ACC32(d));
    else FL_WGMMA_SS_T_TYPES(64, FL_D32, "%32", "%33", "%34", 0, 0, FL_ACC32(d));
  } else {
    static_assert(kN == 32, "wgmma_ss_t: N ∈ {32, 64, 128}");
    if constexpr (kTransA) FL_WGMMA_SS_T_TYPES(32, FL_D16, "%16", "%17", "%18", 1, 1, FL_ACC16(d));
    else FL_WGMMA_SS_T_TYPES(32, FL_D16, "%16", "%17", "%18", 0, 0, FL_ACC16(d));
  }
#endif
}

// ----------------------------------------------------------------------------- mbarrier
// An mbarrier is a 64-bit word in SRAM counting arrivals (and, for TMA, expected transaction
// bytes) of its current phase; waiters name the phase by its parity (0, 1, 0, ...).

/// Initialise the mbarrier at `bar` to expect `count` arrivals per phase ("mbarrier.init").
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
#if FLASHLAB_WGMMA_OK
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}
/// Make the mbarrier initialisations of this thread visible to the async proxy (TMA) and the
/// other threads (after the next barrier) ("Parallel Synchronization and Communication
/// Instructions: fence", fence.mbarrier_init).
__device__ __forceinline__ void mbar_fence_init() {
#if FLASHLAB_WGMMA_OK
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
/// One arrival on `bar` that also raises the phase's expected transaction count by `bytes`
/// ("mbarrier.expect_tx", the .expect_tx form of mbarrier.arrive): the phase completes when
/// every arrival came AND that many bytes were delivered by complete_tx (the TMA loads).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
#if FLASHLAB_WGMMA_OK
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#endif
}
/// One arrival on `bar` ("mbarrier.arrive"); release semantics: this thread's earlier reads and
/// writes happen before the phase completes.
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
#if FLASHLAB_WGMMA_OK
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#endif
}
/// `count` arrivals on `bar` at once ("mbarrier.arrive" with a count), release semantics as mbar_arrive.
__device__ __forceinline__ void mbar_arrive_count(uint32_t bar, uint32_t count) {
#if FLASHLAB_WGMMA_OK
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}
/// Block until the phase of parity `parity` of `bar` has completed ("mbarrier.test_wait /
/// mbarrier.try_wait", the .parity form, in a loop: try_wait may give up after a time-out).
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
#if FLASHLAB_WGMMA_OK
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
#endif
}

// ----------------------------------------------------------------------------- TMA
/// Load one box of a 4-D tensor map (coordinates c0 innermost .. c3) into SRAM at `dst`, in the
/// map's swizzle; the bytes are credited to `bar` with complete_tx ("Data Movement and Conversion
/// Instructions: cp.async.bulk.tensor", tile mode). Elements outside the tensor are written as
/// zeros (and still counted). Issued by one thread.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, int c3,
                                            uint32_t bar) {
#if FLASHLAB_WGMMA_OK
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
#endif
}
/// Store one box of SRAM at `src` (in the map's swizzle) to a 4-D tensor map at coordinates c0
/// innermost .. c3; elements outside the tensor are not written ("cp.async.bulk.tensor", global ←
/// shared::cta, bulk_group completion). Issued by one thread after the box's SRAM writes were made
/// visible to the async proxy (fence_proxy_async_smem) and to it (a barrier); then bulk_commit().
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2, int c3) {
#if FLASHLAB_WGMMA_OK
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
#endif
}
/// Close this thread's bulk group of stores issued since the last commit ("cp.async.bulk.commit_group").
__device__ __forceinline__ void bulk_commit() {
#if FLASHLAB_WGMMA_OK
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}
/// Wait until at most kPending of this thread's bulk groups still READ their SRAM source (their
/// writes may still be on the way): the SRAM may then be overwritten ("cp.async.bulk.wait_group.read").
template <int kPending>
__device__ __forceinline__ void bulk_wait_read() {
#if FLASHLAB_WGMMA_OK
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
#endif
}
/// Wait until at most kPending of this thread's bulk groups are incomplete ("cp.async.bulk.wait_group").
template <int kPending>
__device__ __forceinline__ void bulk_wait() {
#if FLASHLAB_WGMMA_OK
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}
/// Order this thread's earlier generic-proxy SRAM writes before later async-proxy accesses (a TMA
/// store reading them) ("fence.proxy.async.shared::cta").
__device__ __forceinline__ void fence_proxy_async_smem() {
#if FLASHLAB_WGMMA_OK
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
/// Fetch the tensor map (a kernel parameter) into the TMA unit's cache ahead of the first load
/// ("prefetch.tensormap").
__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap* map) {
#if FLASHLAB_WGMMA_OK
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
#endif
}

// ----------------------------------------------------------------------------- registers, barriers
/// Lower this warpgroup's per-thread register limit to kRegs, returning the rest to the block's
/// pool ("setmaxnreg", .dec). Executed by all threads of the warpgroup.
template <int kRegs>
__device__ __forceinline__ void regs_release() {
#if FLASHLAB_WGMMA_OK
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}
/// Raise this warpgroup's per-thread register limit to kRegs from the pool ("setmaxnreg", .inc;
/// waits until enough registers were released).
template <int kRegs>
__device__ __forceinline__ void regs_claim() {
#if FLASHLAB_WGMMA_OK
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}
/// Wait at named barrier `id` until `threads` threads arrived or synced there ("bar.sync").
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
/// Arrive at named barrier `id` (counted towards `threads`) without waiting ("bar.arrive").
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// ----------------------------------------------------------------------------- wide S tiles
/// D[64×N] (+)= A[64×16] · B[16×N], A and B K-major in SRAM (descriptors), for the key tiles
/// other than 128: N ∈ {144, 176, 192}, and 80 at d = 256 ("wgmma.mma_async": n may be any
/// multiple of 8 up to 256 for 16-bit inputs; the accumulator is N/2 fp32 registers per thread in
/// the m64nN layout). S = Q Kᵀ with
/// Bc = N keys; wgmma_ss_n128 above is the Bc = 128 one.
#define FL_D72 FL_D64 ", %64, %65, %66, %67, %68, %69, %70, %71"
#define FL_D88 FL_D72 ", %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87"
#define FL_D96 FL_D88 ", %88, %89, %90, %91, %92, %93, %94, %95"
#define FL_ACC72(d) FL_ACC64(d), FL_ACC8(d, 64)
#define FL_ACC88(d) FL_ACC72(d), FL_ACC8(d, 72), FL_ACC8(d, 80)
#define FL_ACC96(d) FL_ACC88(d), FL_ACC8(d, 88)
#define FL_D40 FL_D32 ", %32, %33, %34, %35, %36, %37, %38, %39"
#define FL_ACC40(d) FL_ACC32(d), FL_ACC8(d, 32)
template <bool kBf16, int kN>
__device__ __forceinline__ void wgmma_ss_wide(float (&d)[kN / 2], uint64_t desc_a, uint64_t desc_b, int accumulate) {
#if FLASHLAB_WGMMA_OK
  if constexpr (kN == 80) {  // d = 256: the key tile that leaves room for O_i's 128 registers
    FL_WGMMA_SS_T_TYPES(80, FL_D40, "%40", "%41", "%42", 0, 0, FL_ACC40(d));
  } else if constexpr (kN == 144) {
    FL_WGMMA_SS_T_TYPES(144, FL_D72, "%72", "%73", "%74", 0, 0, FL_ACC72(d));
  } else if constexpr (kN == 176) {
    FL_WGMMA_SS_T_TYPES(176, FL_D88, "%88", "%89", "%90", 0, 0, FL_ACC88(d));
  } else {
    static_assert(kN == 192, "wgmma_ss_wide: N ∈ {80, 144, 176, 192}");
    FL_WGMMA_SS_T_TYPES(192, FL_D96, "%96", "%97", "%98", 0, 0, FL_ACC96(d));
  }
#endif
}

// ----------------------------------------------------------------------------- host: tensor maps
/// The TMA descriptor of one head's rows of a 16-bit [B, N, H, d] tensor at `base` (device
/// pointer): a 4-D map (d, H, N, B), box = 64 columns × 1 head × `box_rows` tokens × 1 batch, stored
/// in SRAM with the 128-byte swizzle (64 16-bit columns = one 128-byte swizzle row, so a [rows][d]
/// tile is d/64 such boxes). Tokens ≥ N read as zeros. cuTensorMapEncodeTiled is taken from the
/// driver through the runtime (no libcuda link: binaries still start without a driver). Throws
/// CudaError when the driver lacks it or refuses the map.
CUtensorMap make_head_tile_map(const void* base, const Problem& p, int box_rows);

/// make_head_tile_map() of a K or V tensor of the forward, [B, N_k, H_kv, d] (p.seq_k tokens of
/// p.heads_kv heads; tokens ≥ N_k read as zeros).
CUtensorMap make_kv_tile_map(const void* base, const Problem& p, int box_rows);

}  // namespace flashlab::cuda::detail
