// cuda/src/core/tensor_core.cuh — the tensor-core building blocks the fast kernels share
// (attention_fwd_tc.cu, attention_bwd_tc.cu, attention_bwd_tc_atomic.cu): swizzled SRAM addressing,
// cp.async, ldmatrix, mma.sync m16n8k16 (bf16/fp16 in, fp32 accumulate), packing to 16 bits, exp2,
// bulk asynchronous fp32 reductions SRAM → global (sm_90).
// Internal to cuda/src; device code only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

namespace flashlab::cuda::detail {

/// Byte offset of 16-byte chunk `chunk` of row `row` in a [rows][HEAD_DIM] 16-bit SRAM tile,
/// XOR-swizzled: 8 consecutive rows put the same logical chunk in 8 different bank groups.
template <int HEAD_DIM>
__device__ __forceinline__ uint32_t swz(int row, int chunk) {
  return uint32_t(row * (HEAD_DIM * 2) + ((chunk ^ (row & 7)) << 4));
}

/// 16 bytes HBM → SRAM without staging in registers; `valid == false` writes 16 zero bytes.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
/// Wait until at most `kPending` of this thread's committed cp.async groups are still in flight
/// (the older ones have landed; other threads see them only after a barrier).
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

/// Four 8×8 16-bit matrices SRAM → registers; lane l gives the row address of matrix l/8.
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
/// Same, each matrix transposed on the way (a row-major [k][n] tile as the B operand, e.g. V_j in P·V).
__device__ __forceinline__ void ldsm_x4_trans(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                              uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

/// D = A·B + D, A 16×16 (4 regs), B 16×8 (2 regs), D 16×8 fp32 (4 regs).
template <bool kBf16>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (kBf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

/// Two floats → two 16-bit values in one register, `lo` in the low half (the lower column).
template <bool kBf16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t r;
  if constexpr (kBf16) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    memcpy(&r, &v, 4);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    memcpy(&r, &v, 4);
  }
  return r;
}

/// 2^x with the hardware approximation (relative error ~2^-22); 2^(−inf) = +0.
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// ---- Bulk asynchronous reduction (sm_90; PTX ISA 8.0, plain sm_90 — ptxas accepts it for
// -gencode arch=compute_90,code=sm_90). The copy/reduce is carried out by the SM's bulk-copy (TMA)
// unit, not by the issuing warp's load/store path, and runs in the async proxy. Used for the atomic
// backward's dQ partials (attention_bwd_tc_atomic.cu).

/// Make this thread's earlier ordinary (generic-proxy) writes to shared memory visible to later
/// async-proxy reads of it (a bulk copy issued after a barrier reads what every writer fenced).
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/// dst[0 .. bytes/4) += src[0 .. bytes/4) in fp32: SRAM (src, shared::cta address) → global
/// (dst), performed asynchronously in L2; bytes a multiple of 16, both addresses 16-byte aligned.
/// Completion is tracked per thread by bulk groups (bulk_commit_group / bulk_wait_group_read).
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst), "r"(src),
               "r"(bytes)
               : "memory");
}
/// Close this thread's bulk group (its bulk operations issued since the last commit).
__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
/// Wait until at most N of this thread's bulk groups still READ their shared-memory source (the
/// source may be overwritten afterwards; the global side may still be in flight).
template <int N>
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
/// Wait until at most N of this thread's bulk groups are still pending at all (writes performed).
template <int N>
__device__ __forceinline__ void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace flashlab::cuda::detail
