// attention_fwd_tc.cu — fast FlashAttention forward on tensor cores.
//
// What it does: the same algorithm, loop order and names as attention_fa2_fwd.cu (FA2 order, one
// thread block per query tile Q_i, inner loop over key tiles K_j, V_j, online softmax in base 2,
// LSE_i = m_i + log2(l_i) saved in fp32), but with bf16 or fp16 inputs and the work done by
// `mma.sync.aligned.m16n8k16` (fp32 accumulation):
//   - Tiles (FastConfig below, one tuple per head dim and causal flag, chosen by measurement; what
//     was measured: docs/optimisation.md, the mma.sync forward); Br = 128 and Bc = 64 everywhere:
//       d = 128, non-causal: 4 warps × 32 query rows (two m16 tiles share every K_j/V_j fragment:
//                half the SRAM bytes per mma), Q_i re-read from SRAM, 2 blocks/SM (the register
//                budget of 2 blocks, no spills, 96 KiB SRAM each), lazy rescale (below), cp.async
//                addresses from one per-thread base (TileLoader);
//       d = 128, causal:     8 warps × 16 query rows, Q_i in registers, 1 block/SM (thinner warps
//                skip more of the masked triangle);
//       d = 64:              4 warps × 32 query rows, Q_i in registers, 2 blocks/SM (48 KiB SRAM);
//       d = 256 (both):      8 warps × 16 query rows, Q_i from SRAM, 1 block/SM (192 KiB SRAM),
//                lazy rescale: O_i alone is 128 registers per thread.
//     Each warp owns its query rows of Q_i, S_ij, P_ij and O_i for the whole loop.
//   - Q_i: HBM → SRAM once (cp.async), then SRAM → registers (ldmatrix) as mma A fragments, once
//     (Q in registers) or at every k-step of S = Q Kᵀ (Q from SRAM, when registers are short).
//   - K_j, V_j: HBM → SRAM with cp.async, two stages: K_{j+1}, V_{j+1} are in flight while step j
//     computes; one __syncthreads() per step (FA2's split schedule, one K and one V buffer with two
//     barriers per step, was slower). SRAM tiles are XOR-swizzled in 16-byte chunks
//     (chunk ^ (row & 7)) so both the cp.async writes and the ldmatrix reads of 8 rows hit 8
//     different bank groups (no padding).
//   - S_ij = Q_i K_jᵀ and P_ij live in registers only (mma C fragments); P_ij is rounded to 16 bits
//     in registers and reused directly as the A fragment of O_i += P_ij V_j (V_j via ldmatrix.trans).
//   - Scores stay raw; the base-2 scale is folded into one FMA: P = 2^(S·scale·log2 e − m_i) (ex2).
//   - l_i is kept per thread (partial row sums) and reduced across the 4 threads of a row only at
//     the end; 1/l_i is applied once at the end (deferred normalisation), guarded: l_i = 0 (a fully
//     masked row) gives O_i = 0 and LSE_i = −inf.
//   - Lazy rescale (d = 128 non-causal): acc = diag(α)·acc is skipped in a step where no row of
//     the warp got a new maximum (one warp vote; α = 2^0 = 1 exactly, so results are identical).
//   - Causal: key tiles right of the block's last row are never loaded; inside the loop a warp
//     whose rows see none of a tile skips its math; the mask is applied only on tiles that need
//     it (diagonal tiles, and the ragged last tile where keys ≥ N get −inf). Causal blocks run the
//     longest (bottom) query tiles first.
//   - Out-of-sequence rows of Q_i, K_j, V_j are zero-filled by cp.async (src-size 0), so no stale or
//     uninitialised SRAM (a possible NaN) reaches P·V.
//   - Grouped K/V and N_k ≠ N: K and V are [B, N_k, H_kv, d], loaded from K/V head h / (H / H_kv)
//     with their own row stride (H_kv·d); key tiles run to N_k; causal is bottom-right aligned
//     (query i sees keys ≤ i + N_k − N), so a block above the diagonal's start (N > N_k) runs no
//     key tile and stores O = 0, LSE = −inf.
//   - Sliding windows (kWindow, on the causal tuple): query i sees keys i + lo ≤ j ≤ i + hi
//     (Problem::window_lo, window_hi: the reference's band with N_k − N folded in). A block's key
//     tiles run from the tile of its first row's left edge to that of its last row's right edge,
//     so tiles outside the band on either side are never loaded; a warp skips the math of a tile
//     its rows miss on either side, and masks a tile the band crosses on both edges.
//   - Packed sequences (kPacked, Problem::packed(): FlashAttention's varlen layout, Q and O
//     [1, total_q, H, d], K and V [1, total_k, H_kv, d], LSE [1, H, total_q]): one block per query
//     tile of one sequence and head, in the packed numbering (packed.cuh: no tile of padding, the
//     lists read on the device), with that sequence's N, N_k, offset len_k − len_q and first rows;
//     the cp.async loads zero-fill past the sequence's own last query and key, so no row of the
//     next sequence reaches SRAM (a non-finite value there cannot reach P·V as 0·inf).
// It never produces S or P outside registers; O is written once in the input dtype, LSE in fp32.
// Instantiations: d ∈ {64, 128, 256} × {bf16, fp16} × {causal, not, window}, and at d = 64 and 128
// × {dense, packed}: the launch picks the causal instantiation from the run-time flag (each has its
// own tuple; inside the kernel it is constexpr), a window (Problem::windowed()) the window one, on
// the causal tuple, and packed sequences the packed one.
//
// Why not more: this is mma.sync, not Hopper's wgmma/TMA (attention_fwd_wgmma.cu is); the
// exp2/softmax phase of a warp does not overlap its own mma phase, and O is stored straight from
// registers (4-byte stores) rather than staged through SRAM. Interleaving exp2 with P·V as FA2's
// Triton kernel does, a one-step-ahead S pipeline, freeing registers earlier (P packed right after
// exp2, 32-key sub-tiles) were each measured slower under the 255-register cap and are not kept.
//
// How to run: through the attention front door (front_door.cpp): fast_attention_forward_device(...)
// on device pointers, or fast_attention_forward(problem, kernel, Q, K, V) on host vectors;
// `bench_cuda_attention` and `flashlab bench attention` time it.

#include "core/common.hpp"
#include "attention/launchers.hpp"
#include "core/tensor_core.cuh"
#include "attention/packed.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstring>
#include <stdexcept>
#include <string>

namespace flashlab::cuda::detail {
namespace {

// ----------------------------------------------------------------------------- tile parameters
/// One configuration: warps, m16 tiles per warp, BLOCK_N, Q from SRAM, min blocks per SM, stages,
/// lazy rescale, loader kind.
template <int kWarps_, int kMT_, int kBlockN_, int kQSmem_, int kMinBlocks_, int kStages_, int kLazy_ = 0,
          int kLoader_ = 0>
struct FastConfig {
  static constexpr int kWarps = kWarps_;
  static constexpr int kMT = kMT_;  // m16 tiles per warp: 16·kMT query rows per warp
  static constexpr int BLOCK_N = kBlockN_;
  // Keep Q_i's mma fragments in registers for the whole loop (true), or re-read them from SRAM
  // with ldmatrix at every k-step (false: fewer registers).
  static constexpr bool kQInRegs = kQSmem_ == 0;
  static constexpr int kMinBlocks = kMinBlocks_;
  // K_j/V_j buffers in SRAM (tile j + kStages − 1 is in flight while tile j computes).
  static constexpr int kStages = kStages_;
  static_assert(kStages >= 2, "at least double buffering");
  // Skip acc = diag(alpha)·acc when no row maximum of the warp moved (alpha = 1 exactly).
  static constexpr bool kLazyRescale = kLazy_ != 0;
  // cp.async addresses: per chunk from the thread index (0), or one per-thread base (1).
  static constexpr bool kLoaderBase = kLoader_ != 0;
};
template <int HEAD_DIM, bool kCausal>
struct FastTraitsBase;
// The measured-best tuples (warps, m16 tiles per warp, Bc, Q from SRAM, min blocks per SM, stages,
// lazy rescale, loader). Causal launches have their own tuple with the same Br and Bc: a warp
// skips key tiles left of its rows, so thinner warps skip more on the diagonal.
template <>
struct FastTraitsBase<64, false> : FastConfig<4, 2, 64, 0, 2, 2> {};
template <>
struct FastTraitsBase<128, false> : FastConfig<4, 2, 64, 1, 2, 2, 1, 1> {};
template <>
struct FastTraitsBase<64, true> : FastConfig<4, 2, 64, 0, 2, 2> {};
template <>
struct FastTraitsBase<128, true> : FastConfig<8, 1, 64, 0, 1, 2> {};
// d = 256: O_i alone is 128 fp32 registers per thread at 16 rows per warp, so 8 warps × 16 rows,
// Q_i re-read from SRAM (in registers it would take 64 more), 1 block/SM (192 KiB SRAM: Q_i
// 64 KiB + 2 stages × (K_j + V_j) 128 KiB), lazy rescale (each skipped rescale saves 128 FMULs).
template <>
struct FastTraitsBase<256, false> : FastConfig<8, 1, 64, 1, 1, 2, 1, 1> {};
template <>
struct FastTraitsBase<256, true> : FastConfig<8, 1, 64, 1, 1, 2, 1, 1> {};

template <int HEAD_DIM, bool kCausal_>
struct FastTraits : FastTraitsBase<HEAD_DIM, kCausal_> {
  using C = FastTraitsBase<HEAD_DIM, kCausal_>;
  static constexpr int kHeadDim = HEAD_DIM;
  static constexpr bool kCausal = kCausal_;
  static constexpr int kThreads = 32 * C::kWarps;
  static constexpr int BLOCK_M = 16 * C::kMT * C::kWarps;  // Br
  using C::kStages;
  static constexpr int kChunks = HEAD_DIM / 8;  // 16-byte chunks per row
  static constexpr int kTileQBytes = BLOCK_M * HEAD_DIM * 2;
  static constexpr int kTileKVBytes = C::BLOCK_N * HEAD_DIM * 2;
  static constexpr int kSmemBytes = kTileQBytes + 2 * kStages * kTileKVBytes;
};

/// This thread's share of the cp.async tile copies (rows ≥ N are zero-filled).
/// kLoaderBase = false: chunk idx = thread + k·threads of the tile, its row, column and swizzled
/// offset computed per chunk (the first version). kLoaderBase = true: thread τ always copies chunk
/// c = τ mod (d/8) of rows r = τ div (d/8) + k·R (R = threads / (d/8), a multiple of 8), so its
/// swizzled SRAM offset is one per-thread constant plus k·R rows (chunk ^ (row & 7) does not change
/// with k) and its HBM offset one per-thread constant plus (row0 + k·R)·stride. Which one is
/// faster depends on what else competes for registers, so it is a tuple field.
template <class T>
struct TileLoader {
  static constexpr int HEAD_DIM = T::kHeadDim;
  static constexpr int kRowsPerPass = T::kThreads / T::kChunks;  // R
  static_assert(T::kThreads % T::kChunks == 0 && kRowsPerPass % 8 == 0, "swizzle must be pass-invariant");
  std::size_t head;  // element offset of row 0 of this block's head (Q and O; K and V: its K/V head)
  int r;             // kLoaderBase: first row of this thread
  uint32_t soff;     // ... its swizzled SRAM byte offset inside a tile
  std::size_t goff;  // ... its element offset (row r, chunk c of this head)

  __device__ __forceinline__ TileLoader(std::size_t head_, std::size_t stride) : head(head_) {
    r = int(threadIdx.x) / T::kChunks;
    const int c = int(threadIdx.x) % T::kChunks;
    soff = swz<HEAD_DIM>(r, c);
    goff = head + std::size_t(r) * stride + 8 * c;
  }
  /// Issue cp.async for rows [row0, row0 + ROWS) of this block's head of `x` (the tensor's own
  /// pointer: a kernel parameter, so no register holds a per-tensor head pointer).
  template <int ROWS>
  __device__ __forceinline__ void load(uint32_t smem, const uint16_t* x, std::size_t stride, int row0,
                                       int N) const {
    static_assert(ROWS % kRowsPerPass == 0, "tile rows must divide among the passes");
    if constexpr (T::kLoaderBase) {
#pragma unroll
      for (int k = 0; k < ROWS / kRowsPerPass; ++k) {
        const int row = row0 + r + k * kRowsPerPass;
        const bool ok = row < N;
        // A zero-filled chunk reads nothing; its address still points inside the tensor.
        const uint16_t* src = ok ? x + goff + std::size_t(row0 + k * kRowsPerPass) * stride : x;
        cp_async16(smem + soff + uint32_t(k * kRowsPerPass * HEAD_DIM * 2), src, ok);
      }
    } else {
#pragma unroll
      for (int it = 0; it < ROWS * T::kChunks / T::kThreads; ++it) {
        const int idx = int(threadIdx.x) + it * T::kThreads;
        const int rr = idx / T::kChunks, c = idx % T::kChunks;
        const int row = row0 + rr;
        const bool ok = row < N;
        cp_async16(smem + swz<HEAD_DIM>(rr, c), x + head + std::size_t(ok ? row : 0) * stride + c * 8, ok);
      }
    }
  }
};

// ----------------------------------------------------------------------------- parts of the kernel
// Inlined into fast_fwd_kernel; each works on this warp's 16·kMT query rows (kMT m16 tiles; in
// each, this thread holds rows g and g + 8 of the mma fragments). The matrix products and the
// online softmax stay in the kernel's body: as separate inlined functions they compile to a
// different instruction schedule (checked on the cubin), and this kernel is tuned.

/// The masks (the Triton walkthrough, "Out-of-Sequence Masking"): keys ≥ N_k (`N`), and causal
/// keys > query row + N_k − N (`warp_diag0` = the warp's first row + N_k − N: the bottom-right
/// aligned diagonal; a window: + window_hi() instead) → −inf, so 2^(−inf) = 0 adds nothing to
/// l_i or acc; kWindow also keys < query row + window_lo() (`warp_lo0`: the warp's first row's).
/// Called only for tiles that straddle N_k or an edge.
template <class T, bool kWindow>
__device__ __forceinline__ void mask_scores(float (&s)[T::kMT][T::BLOCK_N / 8][4], int start_n, int N, int warp_diag0,
                                            int warp_lo0, int g, int t) {
  const float NEG_INF = __int_as_float(0xff800000);  // −inf
#pragma unroll
  for (int mt = 0; mt < T::kMT; ++mt)
#pragma unroll
    for (int n = 0; n < T::BLOCK_N / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = start_n + 8 * n + 2 * t + (e & 1);
        const int diag = warp_diag0 + 16 * mt + g + 8 * (e >> 1);
        if (col >= N || (T::kCausal && col > diag) || (kWindow && col < warp_lo0 + 16 * mt + g + 8 * (e >> 1)))
          s[mt][n][e] = NEG_INF;
      }
}

/// O_i = acc / l_i: registers → HBM (input dtype), rows below N of the head at `base`.
/// LSE_i = m_i + log2(l_i): registers → HBM, row r at LSE[stat + r].
/// l_i (per-thread partial sums) is first reduced over the quad. Guard: l_i = 0 (a row that saw
/// no key) stores O_i = 0 and LSE_i = −inf. kOutF32: O_i unrounded, fp32 at the same element
/// offsets (`O` then points to floats: the context-parallel ring's partials).
template <class T, bool kBf16, bool kOutF32 = false>
__device__ __forceinline__ void store_output(uint16_t* __restrict__ O, float* __restrict__ LSE,
                                             const float (&acc)[T::kMT][T::kHeadDim / 8][4],
                                             const float (&m_i)[T::kMT][2], const float (&l_i)[T::kMT][2],
                                             int N, std::size_t stat, std::size_t base, std::size_t stride,
                                             int warp_row0, int g, int t) {
  const float NEG_INF = __int_as_float(0xff800000);  // −inf
#pragma unroll
  for (int mt = 0; mt < T::kMT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = l_i[mt][r];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const float inv_l = l > 0.f ? 1.f / l : 0.f;
      const int row = warp_row0 + 16 * mt + g + 8 * r;
      if (row < N) {
        if constexpr (kOutF32) {
          float* out = reinterpret_cast<float*>(O) + base + std::size_t(row) * stride + 2 * t;
#pragma unroll
          for (int n = 0; n < T::kHeadDim / 8; ++n)
            *reinterpret_cast<float2*>(out + 8 * n) =
                make_float2(acc[mt][n][2 * r] * inv_l, acc[mt][n][2 * r + 1] * inv_l);
        } else {
          uint16_t* out = O + base + std::size_t(row) * stride + 2 * t;
#pragma unroll
          for (int n = 0; n < T::kHeadDim / 8; ++n)
            *reinterpret_cast<uint32_t*>(out + 8 * n) =
                pack2<kBf16>(acc[mt][n][2 * r] * inv_l, acc[mt][n][2 * r + 1] * inv_l);
        }
        if (t == 0) LSE[stat + row] = l > 0.f ? m_i[mt][r] + log2f(l) : NEG_INF;
      }
    }
}

// ----------------------------------------------------------------------------- the kernel
/// Grid (Tr, H, B), FastTraits::kThreads threads, FastTraits::kSmemBytes of dynamic SRAM:
/// [Q_i: Br × d][K_j: kStages × Bc × d][V_j: kStages × Bc × d], all swizzled. Q, O are
/// [B, N, H, d]; K, V [B, N_k, H_kv, d], head h reading K/V head h / (H / H_kv). kOwnKv = false
/// (H_kv = H, N_k = N): K and V take Q's head offset, row stride and length, so no register holds a
/// second copy (the d = 128 non-causal tuple uses all 255 registers: with K/V's own values ptxas
/// made 68 bytes of spill stores there); kOwnKv = true reads them from the problem. kWindow (with
/// kOwnKv and the causal tuple): the key tiles of the block's band, masks on both of its edges.
/// kPacked (with kOwnKv; Problem::packed()): grid (packed_tiles(Br), H, 1), each block one query
/// tile of one sequence (packed.cuh), that sequence's lengths, offset and rows; instantiations of
/// their own, so the dense ones compile as they did. kOutF32 (with kOwnKv, dense, no window): O
/// stored in fp32 (store_output), an instantiation of its own for the same reason.
template <class T, bool kBf16, bool kOwnKv, bool kWindow = false, bool kPacked = false, bool kOutF32 = false>
__global__ void __launch_bounds__(T::kThreads, T::kMinBlocks)
    fast_fwd_kernel(Problem p, const uint16_t* __restrict__ Q, const uint16_t* __restrict__ K,
                    const uint16_t* __restrict__ V, uint16_t* __restrict__ O, float* __restrict__ LSE,
                    PackedLists lists) {
  constexpr int HEAD_DIM = T::kHeadDim;
  constexpr bool causal = T::kCausal;  // == p.causal (the launch picks the instantiation)
  constexpr int BLOCK_M = T::BLOCK_M, BLOCK_N = T::BLOCK_N, kMT = T::kMT;
  constexpr int kKStepsQK = HEAD_DIM / 16;  // k-steps of S = Q Kᵀ (over d)
  constexpr int kNTilesS = BLOCK_N / 8;     // n8 tiles of S_ij per m16 tile
  constexpr int kKStepsPV = BLOCK_N / 16;   // k-steps of O += P V (over keys)
  constexpr int kNTilesO = HEAD_DIM / 8;    // n8 tiles of O_i per m16 tile
  const float NEG_INF = __int_as_float(0xff800000);  // −inf

  int N = p.seq, Nk = kOwnKv ? p.seq_k : N;
  // Causal: the bottom query tiles see the most keys; launch them first (better tail balance).
  const int i = causal ? int(gridDim.x) - 1 - int(blockIdx.x) : int(blockIdx.x);
  const int h = blockIdx.y, b = blockIdx.z;
  int row0 = i * BLOCK_M;
  const std::size_t stride = p.row_stride(), kv_stride = kOwnKv ? p.kv_row_stride() : stride;
  std::size_t base = p.head_offset(b, h), kv_base = kOwnKv ? p.kv_head_offset(b, p.kv_head(h)) : base;
  std::size_t stat = 0;  // packed: the sequence's first LSE row of head h (dense: p.stat_offset at the store)
  int offset = kOwnKv ? p.causal_offset() : 0;  // N_k − N
  static_assert(!kPacked || kOwnKv, "packed sequences have their own key lengths");
  if constexpr (kPacked) {
    // Packed sequences: tile i of the launch's numbering (packed_tile) is query tile row0 / Br of
    // sequence pt.b; N, N_k and the offset are that sequence's, its rows start at q_start
    // (k_start), and LSE is [1, H, total_q]. The loads stop at the sequence's own last row
    // (zero-filled past it), so no row of the next sequence reaches SRAM.
    const PackedTile pt = packed_tile(p, lists, i, BLOCK_M);
    if (pt.row0 >= pt.len_q) return;  // past the sequence's last query: at most one tile per sequence
    N = pt.len_q;
    Nk = pt.len_k;
    row0 = pt.row0;
    base = std::size_t(pt.q_start) * stride + std::size_t(h) * HEAD_DIM;
    kv_base = std::size_t(pt.k_start) * kv_stride + std::size_t(p.kv_head(h)) * HEAD_DIM;
    stat = std::size_t(h) * std::size_t(p.total_q) + std::size_t(pt.q_start);
    offset = Nk - N;
  }
  // The band's edges (kWindow): the sequence's (kPacked), or the problem's where they are read.
  auto lo_edge = [&] { return kPacked ? p.window_lo(offset) : p.window_lo(); };
  auto hi_edge = [&] { return kPacked ? p.window_hi(offset) : p.window_hi(); };
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, t = lane & 3;         // mma fragment coordinates: row group, thread in group
  const int warp_m0 = 16 * kMT * warp;           // this warp's first row inside Q_i
  const int warp_row0 = row0 + warp_m0;          // ... and in the sequence
  // Causal, bottom-right aligned: query row r sees keys ≤ r + N_k − N (the diagonal of the warp's
  // first row: warp_diag0). A window: r + window_hi() ≤ … and ≥ r + window_lo() (warp_lo0).
  const int warp_diag0 = warp_row0 + (kWindow ? hi_edge() : offset);
  const int warp_lo0 = kWindow ? warp_row0 + lo_edge() : 0;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t sQ = uint32_t(__cvta_generic_to_shared(smem_raw));
  const uint32_t sK = sQ + T::kTileQBytes;                // + stage · kTileKVBytes
  const uint32_t sV = sK + T::kStages * T::kTileKVBytes;  // + stage · kTileKVBytes

  // Causal: key tiles starting past this tile's last query row's diagonal are entirely masked —
  // skip them. None left (N > N_k, rows above the diagonal's start): the loop does not run, and
  // every row stores O = 0 and LSE = −inf.
  // A window: from the tile of the first row's left edge (j0) to that of the last row's right edge
  // (the rows' bands shift by one key per row: their union is one interval); none when the last
  // row's right edge is left of key 0 (the first row's left edge is never past N_k − 1).
  int j0 = 0, Tc;
  if constexpr (kWindow) {
    const int first = max(0, row0 + lo_edge()), last = min(Nk - 1, min(N, row0 + BLOCK_M) - 1 + hi_edge());
    j0 = last < first ? 0 : first / BLOCK_N;
    Tc = last < first ? 0 : last / BLOCK_N - j0 + 1;  // key tiles j0 .. j0 + Tc − 1
  } else {
    const int n_end = !causal ? Nk : kOwnKv ? max(0, min(Nk, row0 + BLOCK_M + offset)) : min(N, row0 + BLOCK_M);
    Tc = (n_end + BLOCK_N - 1) / BLOCK_N;
  }

  // ldmatrix row addresses. Every fragment this lane addresses has row ≡ lane (mod 8), so the
  // swizzle chunk ^ (row & 7) = (2·k) ^ x with x fixed per lane (chunk = 2·k + x-bit, disjoint
  // bits): address = lane base + compile-time row offset + ((32·k) ^ lane xor). Three bases and
  // three xors per lane instead of one precomputed register per (k-step, tile) address.
  constexpr int kRowBytes = HEAD_DIM * 2;
  const int mi = lane >> 3;  // which 8×8 matrix of an ldmatrix.x4 this lane addresses
  const uint32_t q_lane = sQ + uint32_t((warp_m0 + (lane & 15)) * kRowBytes);
  const uint32_t q_xor = uint32_t(((lane >> 4) ^ (lane & 7)) << 4);
  const uint32_t k_lane = sK + uint32_t(((lane & 7) + ((mi >> 1) << 3)) * kRowBytes);
  const uint32_t k_xor = uint32_t(((mi & 1) ^ (lane & 7)) << 4);
  const uint32_t v_lane = sV + uint32_t(((lane & 7) + ((mi & 1) << 3)) * kRowBytes);
  const uint32_t v_xor = uint32_t(((mi >> 1) ^ (lane & 7)) << 4);

  const TileLoader<T> ld(base, stride);
  const TileLoader<T> ld_kv = kOwnKv ? TileLoader<T>(kv_base, kv_stride) : ld;
  // Load Q_i, K_0, V_0: HBM → SRAM (one cp.async group), then K_s, V_s for the first stages
  // (one group each; an empty group where there is no tile, so the group count stays uniform).
  ld.template load<BLOCK_M>(sQ, Q, stride, row0, N);
  ld_kv.template load<BLOCK_N>(sK, K, kv_stride, j0 * BLOCK_N, Nk);
  ld_kv.template load<BLOCK_N>(sV, V, kv_stride, j0 * BLOCK_N, Nk);
  cp_async_commit();
#pragma unroll
  for (int st = 1; st < T::kStages - 1; ++st) {
    if (st < Tc) {
      ld_kv.template load<BLOCK_N>(sK + st * T::kTileKVBytes, K, kv_stride, (j0 + st) * BLOCK_N, Nk);
      ld_kv.template load<BLOCK_N>(sV + st * T::kTileKVBytes, V, kv_stride, (j0 + st) * BLOCK_N, Nk);
    }
    cp_async_commit();
  }

  // acc = 0 (unnormalised O_i), m_i = −inf, l_i = 0; per m16 tile, rows g and g + 8.
  float acc[kMT][kNTilesO][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int n = 0; n < kNTilesO; ++n) acc[mt][n][0] = acc[mt][n][1] = acc[mt][n][2] = acc[mt][n][3] = 0.f;
  float m_i[kMT][2], l_i[kMT][2];  // l_i: per-thread partial row sums (reduced over the quad at the end)
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) m_i[mt][0] = m_i[mt][1] = NEG_INF, l_i[mt][0] = l_i[mt][1] = 0.f;
  uint32_t q_frag[T::kQInRegs ? kMT : 1][T::kQInRegs ? kKStepsQK : 1][4];

  for (int j = 0; j < Tc; ++j) {
    const int start_n = (j0 + j) * BLOCK_N;
    const uint32_t stage_off = uint32_t((j % T::kStages) * T::kTileKVBytes);
    // kStages − 1 + j groups are committed; the (j+1)-th holds K_j, V_j: wait for it.
    cp_async_wait<T::kStages - 2>();
    // Every thread's cp.async of K_j, V_j (and Q_i) is now visible to all warps, and every warp
    // has finished step j − 1, so the stage it read may be refilled below.
    __syncthreads();
    // Load K_{j+S-1}, V_{j+S-1}: HBM → SRAM into the stage step j − 1 used, while step j computes.
    {
      const int jn = j + T::kStages - 1;
      if (jn < Tc) {
        const uint32_t next = uint32_t((jn % T::kStages) * T::kTileKVBytes);
        ld_kv.template load<BLOCK_N>(sK + next, K, kv_stride, (j0 + jn) * BLOCK_N, Nk);
        ld_kv.template load<BLOCK_N>(sV + next, V, kv_stride, (j0 + jn) * BLOCK_N, Nk);
      }
      cp_async_commit();
    }

    if constexpr (T::kQInRegs) {
      if (j == 0) {
        // Q_i: SRAM → registers once, as mma A fragments (16 rows × 16 cols per k-step).
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int kk = 0; kk < kKStepsQK; ++kk)
            ldsm_x4(q_lane + 16 * mt * kRowBytes + ((32 * kk) ^ q_xor), q_frag[mt][kk][0],
                    q_frag[mt][kk][1], q_frag[mt][kk][2], q_frag[mt][kk][3]);
      }
    }

    // A warp whose rows are all left of this key tile (causal) has nothing to add; a window's also
    // not when the tile ends before its first row's left edge.
    const bool warp_active = (!causal || start_n <= warp_diag0 + 16 * kMT - 1) &&
                             (!kWindow || start_n + BLOCK_N - 1 >= warp_lo0);
    if (warp_active) {
      float s[kMT][kNTilesS][4];
      // S_ij = Q_i K_jᵀ (raw scores, fp32, registers). B fragments of K_j via ldmatrix (non-trans),
      // each used by all kMT m16 tiles of the warp.
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int n = 0; n < kNTilesS; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < kKStepsQK; ++kk) {
        uint32_t qa[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          if constexpr (T::kQInRegs) {
#pragma unroll
            for (int e = 0; e < 4; ++e) qa[mt][e] = q_frag[mt][kk][e];
          } else {  // Q_i fragment of this k-step: SRAM → registers
            ldsm_x4(q_lane + 16 * mt * kRowBytes + ((32 * kk) ^ q_xor), qa[mt][0],
                    qa[mt][1], qa[mt][2], qa[mt][3]);
          }
        }
#pragma unroll
        for (int np = 0; np < kNTilesS / 2; ++np) {
          uint32_t b0, b1, b2, b3;  // keys 16·np + [0, 16), dims 16·kk + [0, 16)
          ldsm_x4(k_lane + stage_off + 16 * np * kRowBytes + ((32 * kk) ^ k_xor), b0, b1, b2, b3);
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            mma16816<kBf16>(s[mt][2 * np], qa[mt], b0, b1);
            mma16816<kBf16>(s[mt][2 * np + 1], qa[mt], b2, b3);
          }
        }
      }

      // Masks (keys ≥ N_k; causal: keys > query row + N_k − N; a window: its two edges) only on
      // tiles that straddle N_k or an edge (the left one: of the warp's last row).
      const bool need_mask = start_n + BLOCK_N > Nk || (causal && start_n + BLOCK_N - 1 > warp_diag0) ||
                             (kWindow && start_n < warp_lo0 + 16 * kMT - 1);
      if (need_mask) mask_scores<T, kWindow>(s, start_n, Nk, warp_diag0, warp_lo0, g, t);

      // Online softmax (base 2, as in the Triton walkthrough), rows r = g and g + 8 of each m16 tile:
      //   m_new = max(m_i, rowmax(S_ij)·scale·log2 e); P_ij = 2^(S_ij·scale·log2 e − m_new);
      //   alpha = 2^(m_i − m_new); l_i = l_i·alpha + rowsum(P_ij); acc = diag(alpha)·acc.
      float alpha[kMT][2] = {};  // all set below before use; = {} keeps the front end quiet
      bool max_moved = false;  // some row of this thread has a new maximum (alpha ≠ 1)
      // P_ij = 2^(S_ij·scale·log2 e − m_new) and its row sums, rows r = g, g + 8 of m16 tile mt;
      // l_i = l_i·alpha + rowsum.
      auto exp_rows = [&](int mt, int r) {
        // A row that has seen only masked scores keeps m = −inf; subtracting 0 instead keeps
        // 2^(−inf − m) = 0 rather than 2^(−inf + inf) = NaN.
        const float m_ref = m_i[mt][r] == NEG_INF ? 0.f : m_i[mt][r];
        float row_sum = 0.f;
#pragma unroll
        for (int n = 0; n < kNTilesS; ++n) {
          s[mt][n][2 * r] = ex2(fmaf(s[mt][n][2 * r], p.scale_log2, -m_ref));
          s[mt][n][2 * r + 1] = ex2(fmaf(s[mt][n][2 * r + 1], p.scale_log2, -m_ref));
          row_sum += s[mt][n][2 * r] + s[mt][n][2 * r + 1];
        }
        l_i[mt][r] = l_i[mt][r] * alpha[mt][r] + row_sum;
      };
      // Rows whose maximum did not move have alpha = 2^0 = 1 exactly: when that holds for all 32·kMT
      // rows of the warp (a warp vote), the kMT·d/2 multiplications of acc are skipped (lazy
      // rescale) — identical results. A row's maximum moves at step j with probability ~1/j for
      // random scores, so the skips grow along the loop (estimated ~40 % of the steps at N = 8192).
      auto rescale_acc = [&] {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int n = 0; n < kNTilesO; ++n) {
              acc[mt][n][2 * r] *= alpha[mt][r];
              acc[mt][n][2 * r + 1] *= alpha[mt][r];
            }
      };
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float raw_max = NEG_INF;
#pragma unroll
          for (int n = 0; n < kNTilesS; ++n) raw_max = fmaxf(raw_max, fmaxf(s[mt][n][2 * r], s[mt][n][2 * r + 1]));
          // The 4 threads of a quad hold one row between them.
          raw_max = fmaxf(raw_max, __shfl_xor_sync(0xffffffffu, raw_max, 1));
          raw_max = fmaxf(raw_max, __shfl_xor_sync(0xffffffffu, raw_max, 2));
          const float m_new = fmaxf(m_i[mt][r], raw_max * p.scale_log2);
          alpha[mt][r] = ex2(m_i[mt][r] - (m_new == NEG_INF ? 0.f : m_new));  // NaN guard: exp_rows
          max_moved |= m_new != m_i[mt][r];
          m_i[mt][r] = m_new;
          exp_rows(mt, r);
        }
      // (Deciding the vote before the exponentials, so that exp2 and the P·V mma share one basic
      // block, was measured slower, also with exp2 + P·V copied into both sides of the vote.)
      if (!T::kLazyRescale || __any_sync(0xffffffffu, max_moved)) rescale_acc();

      // acc += P_ij V_j: P_ij rounded to 16 bits in registers is the A fragment (C layout of two
      // n8 tiles = A layout of one k16 step); V_j B fragments via ldmatrix.trans, each used by
      // all kMT m16 tiles.
#pragma unroll
      for (int kk = 0; kk < kKStepsPV; ++kk) {
        uint32_t a[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          a[mt][0] = pack2<kBf16>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
          a[mt][1] = pack2<kBf16>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
          a[mt][2] = pack2<kBf16>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
          a[mt][3] = pack2<kBf16>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
        }
#pragma unroll
        for (int np = 0; np < kNTilesO / 2; ++np) {
          uint32_t b0, b1, b2, b3;  // keys 16·kk + [0, 16), dims 16·np + [0, 16)
          ldsm_x4_trans(v_lane + stage_off + 16 * kk * kRowBytes + ((32 * np) ^ v_xor), b0, b1, b2, b3);
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            mma16816<kBf16>(acc[mt][2 * np], a[mt], b0, b1);
            mma16816<kBf16>(acc[mt][2 * np + 1], a[mt], b2, b3);
          }
        }
      }
    }
  }
  cp_async_wait<0>();  // no copy may still be writing SRAM when the block exits (empty groups)

  store_output<T, kBf16, kOutF32>(O, LSE, acc, m_i, l_i, N, kPacked ? stat : p.stat_offset(b, h), base, stride, warp_row0, g,
                         t);
}

/// kWindow (a window, Problem::windowed(); on the causal tuple): K/V always from the problem.
/// Packed sequences (Problem::packed()): the kPacked instantiations.
template <int HEAD_DIM, bool kBf16, bool kCausal, bool kWindow = false>
void launch_fast_one(const Problem& p, const void* Q, const void* K, const void* V, void* O, float* LSE,
                     cudaStream_t stream, const PackedLists& lists) {
  using T = FastTraits<HEAD_DIM, kCausal>;
  static_assert(T::BLOCK_M == FastTraits<HEAD_DIM, !kCausal>::BLOCK_M &&
                    T::BLOCK_N == FastTraits<HEAD_DIM, !kCausal>::BLOCK_N,
                "causal and non-causal tuples share the tiles fast_forward_tiles() reports");
  const bool own_kv = p.heads_kv != p.heads || p.seq_k != p.seq;  // grouped K/V or N_k ≠ N
  // Packed sequences at d = 64 and 128 (the front door refuses them at d = 256: not built there).
  constexpr bool kPackedBuilt = HEAD_DIM != 256;
  auto kernel = kPackedBuilt && p.packed() ? &fast_fwd_kernel<T, kBf16, true, kWindow, kPackedBuilt>
                : kWindow  ? &fast_fwd_kernel<T, kBf16, true, kWindow>
                : own_kv   ? &fast_fwd_kernel<T, kBf16, true>
                           : &fast_fwd_kernel<T, kBf16, false>;
  // > 48 KiB of dynamic SRAM: opted in per device (set_smem keeps the record, thread-safe).
  set_smem(reinterpret_cast<const void*>(kernel), T::kSmemBytes, "fast_fwd_kernel", p);
  // Packed: packed_tiles() query tiles per head (every sequence's, and at most one past the end
  // of each), all in grid.x.
  const dim3 grid(p.packed() ? p.packed_tiles(T::BLOCK_M) : (p.seq + T::BLOCK_M - 1) / T::BLOCK_M, p.heads,
                  p.packed() ? 1 : p.batch);
  announce("fast_fwd_kernel");
  kernel<<<grid, T::kThreads, T::kSmemBytes, stream>>>(p, static_cast<const uint16_t*>(Q),
                                                       static_cast<const uint16_t*>(K),
                                                       static_cast<const uint16_t*>(V), static_cast<uint16_t*>(O), LSE,
                                                       lists);
  FLASHLAB_CUDA_CHECK_LAUNCH("fast_fwd_kernel");
}

template <int HEAD_DIM, bool kBf16>
void launch_fast(const Problem& p, const void* Q, const void* K, const void* V, void* O, float* LSE,
                 cudaStream_t stream, const PackedLists& lists) {
  if (p.windowed()) launch_fast_one<HEAD_DIM, kBf16, true, true>(p, Q, K, V, O, LSE, stream, lists);
  else if (p.causal) launch_fast_one<HEAD_DIM, kBf16, true>(p, Q, K, V, O, LSE, stream, lists);
  else launch_fast_one<HEAD_DIM, kBf16, false>(p, Q, K, V, O, LSE, stream, lists);
}

/// The fp32-O instantiation (launch_fast_mma_f32): K/V read with their own layout, no window.
template <int HEAD_DIM, bool kBf16, bool kCausal>
void launch_fast_f32(const Problem& p, const void* Q, const void* K, const void* V, float* O, float* LSE,
                     cudaStream_t stream) {
  using T = FastTraits<HEAD_DIM, kCausal>;
  auto kernel = &fast_fwd_kernel<T, kBf16, true, false, false, true>;
  set_smem(reinterpret_cast<const void*>(kernel), T::kSmemBytes, "fast_fwd_kernel", p);
  const dim3 grid((p.seq + T::BLOCK_M - 1) / T::BLOCK_M, p.heads, p.batch);
  announce("fast_fwd_kernel");
  kernel<<<grid, T::kThreads, T::kSmemBytes, stream>>>(p, static_cast<const uint16_t*>(Q),
                                                       static_cast<const uint16_t*>(K),
                                                       static_cast<const uint16_t*>(V), reinterpret_cast<uint16_t*>(O),
                                                       LSE, PackedLists{});
  FLASHLAB_CUDA_CHECK_LAUNCH("fast_fwd_kernel");
}

template <int HEAD_DIM, bool kBf16>
void launch_f32_causal(const Problem& p, const void* Q, const void* K, const void* V, float* O, float* LSE,
                       cudaStream_t stream) {
  if (p.causal) launch_fast_f32<HEAD_DIM, kBf16, true>(p, Q, K, V, O, LSE, stream);
  else launch_fast_f32<HEAD_DIM, kBf16, false>(p, Q, K, V, O, LSE, stream);
}

}  // namespace

void launch_fast_mma_f32(const Problem& p, bool bf16, const void* Q, const void* K, const void* V, float* O,
                         float* LSE, cudaStream_t stream) {
  if ((p.head_dim != 64 && p.head_dim != 128) || p.packed() || p.windowed())
    throw_cuda_error(cudaErrorInvalidValue, "mma forward, fp32 O: d = 64 or 128, dense, no window", __FILE__, __LINE__);
  if (p.head_dim == 64) {
    if (bf16) launch_f32_causal<64, true>(p, Q, K, V, O, LSE, stream);
    else launch_f32_causal<64, false>(p, Q, K, V, O, LSE, stream);
  } else {
    if (bf16) launch_f32_causal<128, true>(p, Q, K, V, O, LSE, stream);
    else launch_f32_causal<128, false>(p, Q, K, V, O, LSE, stream);
  }
}

void launch_fast_mma(const Problem& p, bool bf16, const void* Q, const void* K, const void* V, void* O, float* LSE,
                     cudaStream_t stream, const PackedLists& lists) {
  static_assert(kMmaBlockM == FastTraits<64, false>::BLOCK_M && kMmaBlockN == FastTraits<64, false>::BLOCK_N &&
                    kMmaBlockM == FastTraits<128, false>::BLOCK_M && kMmaBlockN == FastTraits<128, false>::BLOCK_N &&
                    kMmaBlockM == FastTraits<256, false>::BLOCK_M && kMmaBlockN == FastTraits<256, false>::BLOCK_N,
                "launchers.hpp reports the tiles of this file");
  if (p.head_dim == 64) {
    if (bf16) launch_fast<64, true>(p, Q, K, V, O, LSE, stream, lists);
    else launch_fast<64, false>(p, Q, K, V, O, LSE, stream, lists);
  } else if (p.head_dim == 128) {
    if (bf16) launch_fast<128, true>(p, Q, K, V, O, LSE, stream, lists);
    else launch_fast<128, false>(p, Q, K, V, O, LSE, stream, lists);
  } else {
    if (bf16) launch_fast<256, true>(p, Q, K, V, O, LSE, stream, lists);
    else launch_fast<256, false>(p, Q, K, V, O, LSE, stream, lists);
  }
}

}  // namespace flashlab::cuda::detail
