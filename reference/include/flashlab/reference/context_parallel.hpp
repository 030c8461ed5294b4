/// @file context_parallel.hpp
/// @brief Context-parallel (ring) attention on G ranks, simulated in one process: the sequence
///        sharded over the ranks, K/V blocks passed around a ring, partial outputs merged by LSE;
///        the backward passes dK/dV around the ring too. Also the model of the bytes each rank
///        sends per step and the compute each step can hide them behind.
///
/// The sharding. The padded sequence (see below) is cut into `chunks()` equal chunks of
/// c = chunk_len() rows: G chunks for the contiguous layout (rank r holds chunk r) and 2G for
/// the zigzag layout (rank r holds chunks r and 2G − 1 − r, so that under a causal mask every
/// rank has the same work: an early chunk that sees little and a late one that sees much). A
/// rank's local tensors are its chunks in slot order, each `[B, c, H, d]` on its own.
///
/// The ring. At step s = 0 … G − 1 rank r holds the K/V chunks of rank (r − s) mod G
/// (ring_source()): it computes its queries against them while passing them on to rank r + 1
/// and receiving the next from rank r − 1. Every (query chunk, key chunk) pair is one block
/// (ring_blocks()): `full` when every query of the chunk may see every key, `diagonal` when the
/// chunks are the same one and the causal mask cuts it (causal with offset 0, N_k = N), and
/// left out when the mask hides it whole. Chunk boundaries line up, so no other case exists:
/// this is why the blocks are whole chunks, and why the fast GPU kernels (N_k = N only) can run
/// every block as it is. Each block gives a partial O_s and LSE_s for its query chunk; the
/// partials are merged in step order by LSE, base 2 as everywhere in flashlab:
///   LSE = log2(2^LSE_a + 2^LSE_b),  O = 2^(LSE_a − LSE)·O_a + 2^(LSE_b − LSE)·O_b
/// (merge_partial()).
///
/// The backward runs the same blocks with the final O and LSE of the forward: a block's P_ij =
/// 2^(S_ij − LSE_i) is then already the global softmax, so its dQ, dK, dV are exact parts of the
/// sums. dQ stays on its rank; dK and dV of a K/V chunk travel with it as accumulators: rank r
/// adds its part at step s and passes the sum on, and one more hop after the last step brings
/// each sum home (G hops for dK/dV, G − 1 for K/V).
///
/// Padding rule. N need not divide into the chunks: the sequence is padded at its end to
/// chunks() · c rows (c = ⌈N / chunks()⌉). Padded queries are computed like any other row and
/// dropped; padded keys are masked: under a causal mask they come after every real query, so
/// the mask already hides them; without one a block whose key chunk holds padding sees only its
/// `valid_keys`. A chunk of padding only takes part in no block. (The GPU ring takes N that
/// divides evenly; see docs/context-parallel.md.)
///
/// GQA: K and V have H_kv heads (H_kv divides H); query head h reads K/V head h / (H / H_kv).
/// Only H_kv heads travel; each block expands them to H heads for the single-device reference
/// and sums the H / H_kv heads' dK, dV back into one.
///
/// Bytes on the link. K and V travel in the problem's dtype; dK and dV travel as fp32 sums (fp64
/// when the dtype is), so that a sum passed G times is rounded once, at the end. The simulation
/// counts every byte it copies from one rank to another (RankStep); ring_link_bytes() states
/// the same numbers in closed form, and tests assert they are equal.
#pragma once

#include "flashlab/reference/attention.hpp"
#include "flashlab/reference/attention_problem.hpp"
#include "flashlab/reference/tensor.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace flashlab::ref {

/// How the sequence is cut among the ranks.
enum class ShardLayout {
  contiguous,  ///< G chunks: rank r holds chunk r (causal work grows with r)
  zigzag       ///< 2G chunks: rank r holds chunks r and 2G − 1 − r (causal work equal on every rank)
};

/// "contiguous" or "zigzag".
std::string_view layout_name(ShardLayout layout);
/// Parses "contiguous" | "zigzag"; throws std::invalid_argument naming the choices.
ShardLayout parse_layout(std::string_view name);

/// Largest number of ranks ContextParallelProblem::validate() accepts.
inline constexpr std::size_t kMaxRanks = 1024;

/// One context-parallel attention problem: the whole (unsharded) attention problem, the number
/// of K/V heads and how the sequence is cut among G ranks.
struct ContextParallelProblem {
  /// The whole problem: B, N (the global sequence), H, d, causal, scale, dtype. Self-attention
  /// only (`seq_k` 0). Br and Bc tile the single-device reference each block runs on.
  AttentionProblem attention;
  std::size_t heads_kv = 0;  ///< H_kv, heads of K and V (0 means H); must divide H
  std::size_t gpus = 1;      ///< G, ranks of the ring
  ShardLayout layout = ShardLayout::zigzag;  ///< how the sequence is cut

  /// H_kv (`heads_kv`, or H when it is 0).
  [[nodiscard]] std::size_t kv_heads() const { return heads_kv ? heads_kv : attention.heads; }
  /// H / H_kv, the query heads that share one K/V head.
  [[nodiscard]] std::size_t group() const { return attention.heads / kv_heads(); }
  /// Chunks of the padded sequence: G (contiguous) or 2G (zigzag).
  [[nodiscard]] std::size_t chunks() const { return layout == ShardLayout::zigzag ? 2 * gpus : gpus; }
  /// Chunks per rank: 1 (contiguous) or 2 (zigzag).
  [[nodiscard]] std::size_t chunks_per_rank() const { return layout == ShardLayout::zigzag ? 2 : 1; }
  /// c, rows per chunk: ⌈N / chunks()⌉.
  [[nodiscard]] std::size_t chunk_len() const { return (attention.seq + chunks() - 1) / chunks(); }
  /// The padded sequence length chunks() · c (≥ N).
  [[nodiscard]] std::size_t padded_seq() const { return chunks() * chunk_len(); }
  /// N_local, rows per rank: chunks_per_rank() · c.
  [[nodiscard]] std::size_t local_seq() const { return chunks_per_rank() * chunk_len(); }
  /// The global chunk in `slot` (0 or 1) of `rank`: r; or, zigzag slot 1, 2G − 1 − r.
  [[nodiscard]] std::size_t chunk_of(std::size_t rank, std::size_t slot) const {
    return slot == 0 ? rank : 2 * gpus - 1 - rank;
  }
  /// Rows of global chunk `chunk` that lie inside the sequence (the rest is padding).
  [[nodiscard]] std::size_t valid_rows(std::size_t chunk) const;
  /// The checks of AttentionProblem::validate() plus: `seq_k` 0 or N, H_kv dividing H, G from 1
  /// to kMaxRanks. Throws ProblemError naming the field ("gpus", "heads_kv", "seq_k", or the
  /// attention problem's).
  void validate() const;
  /// One line such as "G=4 zigzag B=1 N=64 H=4 H_kv=2 d=16 causal fp32" for reports.
  [[nodiscard]] std::string str() const;
};

/// The rank whose K/V chunks rank `rank` holds at ring step `step`: (rank − step) mod G.
std::size_t ring_source(std::size_t gpus, std::size_t rank, std::size_t step);

/// How the mask cuts one (query chunk, key chunk) block.
enum class BlockKind {
  full,     ///< every query of the chunk may see every valid key: no causal mask
  diagonal  ///< the same chunk on both sides: causal with offset 0 (key j visible iff j ≤ i)
};

/// "full" or "diagonal".
std::string_view block_kind_name(BlockKind kind);

/// One block a rank computes at one step: its queries of one slot against the held keys of one slot.
struct RingBlock {
  std::size_t q_slot = 0;      ///< slot of the query chunk on the computing rank
  std::size_t kv_slot = 0;     ///< slot of the key chunk on its owner (ring_source())
  std::size_t q_chunk = 0;     ///< global index of the query chunk
  std::size_t kv_chunk = 0;    ///< global index of the key chunk
  BlockKind kind = BlockKind::full;  ///< how the causal mask cuts it
  std::size_t valid_keys = 0;  ///< keys of the key chunk inside the sequence (c unless it holds padding)
};

/// The blocks rank `rank` computes at step `step`, in the order it runs them (query slot, then
/// key slot); blocks the mask hides whole, and chunks of padding only, are left out.
std::vector<RingBlock> ring_blocks(const ContextParallelProblem& problem, std::size_t rank, std::size_t step);

/// The single-device attention problem of one block: B, c queries, H heads, d, the tiles, the
/// scale resolved; `seq_k` = valid_keys when a `full` block holds padded keys; causal for a
/// `diagonal` block.
AttentionProblem block_problem(const ContextParallelProblem& problem, const RingBlock& block);

/// Merges a partial result into a running one for one query row of `d` values, in base 2:
/// LSE ← log2(2^LSE + 2^LSE_s), O ← 2^(LSE_old − LSE)·O + 2^(LSE_s − LSE)·O_s. A partial with
/// LSE_s = −inf (its keys all masked) leaves the running row as it is, whatever O_s holds;
/// a running row with LSE = −inf (nothing seen yet) becomes the partial. Exact for ±800-sized
/// LSE values: only differences of LSE are exponentiated.
template <typename T>
void merge_partial(T& LSE, T* O, T LSE_s, const T* O_s, std::size_t d);

/// `[B, N, H_kv, d]` → `[B, N, H_kv · group, d]`: query head h reads K/V head h / group.
template <typename T>
Tensor<T> expand_kv_heads(const Tensor<T>& kv, std::size_t group);

/// `[B, N, H, d]` → `[B, N, H / group, d]`: the sum of each group of `group` consecutive heads
/// (the gradient of expand_kv_heads()).
template <typename T>
Tensor<T> sum_kv_heads(const Tensor<T>& grad, std::size_t group);

/// Rank `rank`'s chunks of a global `[B, N, Hx, d]` tensor (Hx = H or H_kv), one `[B, c, Hx, d]`
/// tensor per slot; rows past N are zero. For double, float and std::uint16_t (16-bit bit patterns).
template <typename T>
std::vector<Tensor<T>> shard_rows(const ContextParallelProblem& problem, const Tensor<T>& global, std::size_t rank);

/// The global `[B, N, Hx, d]` tensor from every rank's chunks (`per_rank[r][slot]`), padding
/// dropped. For double, float and std::uint16_t.
template <typename T>
Tensor<T> unshard_rows(const ContextParallelProblem& problem, const std::vector<std::vector<Tensor<T>>>& per_rank);

/// Rank `rank`'s chunks of a global `[B, H, N]` statistic (LSE, D), one `[B, H, c]` vector per
/// slot; rows past N are zero.
template <typename T>
std::vector<std::vector<T>> shard_stats(const ContextParallelProblem& problem, const std::vector<T>& global,
                                        std::size_t rank);

/// The global `[B, H, N]` statistic from every rank's chunks, padding dropped.
template <typename T>
std::vector<T> unshard_stats(const ContextParallelProblem& problem, const std::vector<std::vector<std::vector<T>>>& per_rank);

/// Bytes of each tensor on a link (sent or received by one rank in one step).
struct LinkBytes {
  std::uint64_t K = 0;   ///< key rows, problem dtype
  std::uint64_t V = 0;   ///< value rows, problem dtype
  std::uint64_t dK = 0;  ///< dK accumulator (fp32, or fp64 for an fp64 problem)
  std::uint64_t dV = 0;  ///< dV accumulator (fp32, or fp64 for an fp64 problem)
  /// K + V + dK + dV.
  [[nodiscard]] std::uint64_t total() const { return K + V + dK + dV; }
  /// Equal when every tensor's bytes are.
  friend bool operator==(const LinkBytes&, const LinkBytes&) = default;
};

/// What one rank did in one step, as the simulation counted it.
struct RankStep {
  std::size_t step = 0;        ///< ring step (the backward's step G is the last dK/dV hop, no compute)
  std::size_t rank = 0;        ///< the rank
  std::size_t kv_source = 0;   ///< the rank whose K/V chunks it computed with (ring_source())
  std::size_t blocks = 0;      ///< blocks computed (ring_blocks())
  std::uint64_t flops = 0;     ///< FLOPs the blocks' tile loops counted
  LinkBytes sent;              ///< bytes copied to rank + 1 during this step
  LinkBytes received;          ///< bytes copied from rank − 1 during this step
};

/// Output of the simulated context-parallel forward.
template <typename T>
struct ContextParallelForward {
  Tensor<T> O;              ///< `[B, N, H, d]`, unsharded
  std::vector<T> LSE;       ///< `[B, H, N]`, base 2, unsharded
  std::vector<RankStep> steps;  ///< per step, per rank (step-major)
};

/// Output of the simulated context-parallel backward.
template <typename T>
struct ContextParallelGradients {
  Tensor<T> dQ;             ///< `[B, N, H, d]`, unsharded
  Tensor<T> dK;             ///< `[B, N, H_kv, d]`, unsharded
  Tensor<T> dV;             ///< `[B, N, H_kv, d]`, unsharded
  std::vector<RankStep> steps;  ///< per step (0 … G), per rank (step-major)
};

/// The ring forward on G simulated ranks: Q `[B, N, H, d]`, K and V `[B, N, H_kv, d]` are
/// sharded, each rank runs its blocks step by step with flash_forward_fa2() and merges them by
/// LSE, K/V chunks are copied from rank to rank (and counted), and O, LSE are gathered back.
template <typename T>
ContextParallelForward<T> context_parallel_forward(const ContextParallelProblem& problem, const Tensor<T>& Q,
                                                   const Tensor<T>& K, const Tensor<T>& V);

/// The ring backward for the loss L = Σ O∘dO on G simulated ranks, from the forward's O and LSE:
/// each block runs flash_backward_two_kernel() with the final O and LSE of its queries, dQ is
/// summed on its rank, dK and dV travel around the ring with their K/V chunk (and are counted).
template <typename T>
ContextParallelGradients<T> context_parallel_backward(const ContextParallelProblem& problem, const Tensor<T>& Q,
                                                      const Tensor<T>& K, const Tensor<T>& V, const Tensor<T>& O,
                                                      const std::vector<T>& LSE, const Tensor<T>& dO);

/// Which pass of the ring a model describes.
enum class RingPass {
  forward,  ///< steps 0 … G − 1: K/V passed on while the blocks run
  backward  ///< steps 0 … G: K/V passed on, dK/dV of the step before passed on; step G is the last dK/dV hop
};

/// Bytes every rank sends (and receives: the ring is symmetric) during step `step` of `pass`:
/// forward, K and V of N_local rows and H_kv heads at steps 0 … G − 2 (nothing at the last
/// step); backward, the same K/V plus the dK/dV accumulators of step − 1 at steps 1 … G.
LinkBytes ring_link_bytes(const ContextParallelProblem& problem, RingPass pass, std::size_t step);

/// Number of steps of `pass`: G forward, G + 1 backward (the last dK/dV hop).
std::size_t ring_steps(const ContextParallelProblem& problem, RingPass pass);

/// The FLOPs of one block by the convention flashlab's TFLOP/s use (docs/cuda.md): a full block
/// 4·B·H·c·valid_keys·d, a diagonal one half of 4·B·H·c²·d; the backward 2.5 times that.
std::uint64_t block_flops(const ContextParallelProblem& problem, const RingBlock& block, RingPass pass);

/// One step of the model: what every rank sends and the compute of the busiest and the idlest rank.
struct RingStepModel {
  std::size_t step = 0;          ///< ring step
  LinkBytes sent;                ///< bytes each rank sends (and receives) during the step
  std::uint64_t flops_max = 0;   ///< FLOPs of the busiest rank (block_flops() summed)
  std::uint64_t flops_min = 0;   ///< FLOPs of the idlest rank
  double compute_s = 0;          ///< flops_max at the compute rate
  double link_s = 0;             ///< sent.total() at the link bandwidth
  /// The step's time with the transfer overlapping the compute: max(compute_s, link_s).
  [[nodiscard]] double step_s() const { return compute_s > link_s ? compute_s : link_s; }
  /// True when the transfer fits in the busiest rank's compute (nothing to hide counts as hidden).
  [[nodiscard]] bool hidden() const { return link_s <= compute_s; }
};

/// The model of a pass, step by step: bytes from ring_link_bytes(), FLOPs from block_flops()
/// over ring_blocks() of every rank, times at `link_bytes_per_s` (one direction of one link)
/// and `flops_per_s`. Throws std::invalid_argument for a rate that is not positive and finite.
std::vector<RingStepModel> ring_model(const ContextParallelProblem& problem, RingPass pass, double link_bytes_per_s,
                                      double flops_per_s);

/// True when `counted` (a simulation's RankStep list of the same pass) holds, for every rank and
/// step, exactly the bytes ring_link_bytes() states for sending and for receiving. `why`, if
/// given, receives the first difference.
bool counted_equals_model(const ContextParallelProblem& problem, RingPass pass, const std::vector<RankStep>& counted,
                          std::string* why = nullptr);

}  // namespace flashlab::ref
