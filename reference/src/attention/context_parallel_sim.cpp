// Context-parallel attention on G ranks simulated in one process (context_parallel.hpp).
//
// Manual. Each rank is a set of tensors of its own: its query chunks, the K/V chunks it holds
// this step, its running O and LSE (forward) or dQ and the travelling dK/dV sums (backward).
// Nothing is shared between ranks except by the ring's copies, which are the only place bytes
// are counted as "sent" and "received", so the counts are what the ring moved. Every block is
// one call of the single-device reference (flash_forward_fa2, flash_backward_two_kernel) on a
// whole chunk pair, as the GPU ring launches one fast kernel per block.
//
// Loop of the forward, per step s (the GPU runs the copy of step s beside the blocks of step s):
//   every rank r: for each block of ring_blocks(r, s):
//       O_s, LSE_s = flash_forward_fa2(Q chunk, held K/V chunk expanded to H heads)
//       merge (O_s, LSE_s) into the running (O, LSE) of the query chunk, row by row
//   if s < G − 1: every rank copies its held K/V chunks to rank r + 1   (sent, received)
// Loop of the backward, per step s, with the final O and LSE:
//   every rank r: for each block: dQ_s, dK_s, dV_s = flash_backward_two_kernel(...)
//       dQ of the query chunk += dQ_s; part of the held chunk's dK, dV += dK_s, dV_s summed over the group
//   if s < G − 1: K/V chunks copied to rank r + 1
//   if s ≥ 1:     the dK/dV sums of step s − 1 copied to rank r + 1, which adds its part of step s
//   after step G − 1 (step G): the sums copied once more, home to the chunks' owners
#include "flashlab/reference/context_parallel.hpp"

#include "tiles.hpp"

#include <algorithm>

namespace flashlab::ref {

using detail::neg_inf;

namespace {

// The K/V chunks (or their dK/dV sums) one rank holds, one tensor per slot.
template <typename T>
struct ChunkPair {
  std::vector<Tensor<T>> K, V;
};

// The first `rows` rows of a chunk (a full block's valid keys), all heads.
template <typename T>
Tensor<T> first_rows(const Tensor<T>& t, std::size_t rows) {
  const Shape s = t.shape();
  if (rows == s.seq) return t;
  Tensor<T> out(Shape{s.batch, rows, s.heads, s.head_dim});
  for (std::size_t b = 0; b < s.batch; ++b) std::copy_n(&t.at(b, 0, 0, 0), rows * s.row_stride(), &out.at(b, 0, 0, 0));
  return out;
}

// dst rows [0, src rows) += src (src may hold fewer rows: a block's valid keys).
template <typename T>
void add_rows(Tensor<T>& dst, const Tensor<T>& src) {
  const Shape s = src.shape();
  for (std::size_t b = 0; b < s.batch; ++b) {
    T* d = &dst.at(b, 0, 0, 0);
    const T* p = &src.at(b, 0, 0, 0);
    for (std::size_t k = 0; k < s.seq * s.row_stride(); ++k) d[k] += p[k];
  }
}

template <typename T>
std::uint64_t numel(const std::vector<Tensor<T>>& chunks) {
  std::uint64_t n = 0;
  for (const auto& t : chunks) n += t.numel();
  return n;
}

template <typename T>
std::vector<Tensor<T>> zero_chunks(std::size_t slots, const Shape& s) {
  return std::vector<Tensor<T>>(slots, Tensor<T>(s));
}

// Copies every rank's pair to rank r + 1 (the ring's one transfer), counting the bytes at both
// ends: K/V as `kv` (true: dtype bytes into K and V; false: accumulator bytes into dK and dV).
template <typename T>
std::vector<ChunkPair<T>> pass_on(const std::vector<ChunkPair<T>>& held, bool kv, std::size_t element_bytes,
                                  std::vector<RankStep>& rows) {
  const std::size_t G = held.size();
  std::vector<ChunkPair<T>> next(G);
  for (std::size_t r = 0; r < G; ++r) {
    const std::size_t to = (r + 1) % G;
    next[to] = held[r];  // the copy: rank r → rank r + 1
    const std::uint64_t k = numel(held[r].K) * element_bytes, v = numel(held[r].V) * element_bytes;
    LinkBytes& sent = rows[r].sent;
    LinkBytes& received = rows[to].received;
    (kv ? sent.K : sent.dK) += k;
    (kv ? sent.V : sent.dV) += v;
    (kv ? received.K : received.dK) += k;
    (kv ? received.V : received.dV) += v;
  }
  return next;
}

template <typename T>
void check_operands(const ContextParallelProblem& problem, const Tensor<T>& Q, const Tensor<T>& K, const Tensor<T>& V) {
  problem.validate();
  const AttentionProblem& a = problem.attention;
  const Shape q{a.batch, a.seq, a.heads, a.head_dim}, kv{a.batch, a.seq, problem.kv_heads(), a.head_dim};
  detail::require_shape("Q", Q.shape(), q);
  detail::require_shape("K", K.shape(), kv);
  detail::require_shape("V", V.shape(), kv);
}

std::vector<RankStep> step_rows(const ContextParallelProblem& problem, std::size_t step) {
  std::vector<RankStep> rows(problem.gpus);
  for (std::size_t r = 0; r < problem.gpus; ++r) {
    rows[r].step = step;
    rows[r].rank = r;
    rows[r].kv_source = ring_source(problem.gpus, r, step);
  }
  return rows;
}

}  // namespace

template <typename T>
ContextParallelForward<T> context_parallel_forward(const ContextParallelProblem& problem, const Tensor<T>& Q,
                                                   const Tensor<T>& K, const Tensor<T>& V) {
  check_operands(problem, Q, K, V);
  const AttentionProblem& a = problem.attention;
  const std::size_t G = problem.gpus, slots = problem.chunks_per_rank(), c = problem.chunk_len();
  const std::size_t H = a.heads, d = a.head_dim, group = problem.group();
  const std::size_t kv_bytes = dtype_bytes(a.dtype);

  // Scatter: each rank's query chunks, its own K/V chunks, its running O = 0 and LSE = −inf.
  std::vector<std::vector<Tensor<T>>> Qr(G), O(G);
  std::vector<std::vector<std::vector<T>>> L(G);
  std::vector<ChunkPair<T>> held(G);
  for (std::size_t r = 0; r < G; ++r) {
    Qr[r] = shard_rows(problem, Q, r);
    held[r] = {shard_rows(problem, K, r), shard_rows(problem, V, r)};
    O[r] = zero_chunks<T>(slots, Shape{a.batch, c, H, d});
    L[r].assign(slots, std::vector<T>(a.batch * H * c, neg_inf<T>()));
  }

  ContextParallelForward<T> out;
  for (std::size_t s = 0; s < G; ++s) {
    std::vector<RankStep> rows = step_rows(problem, s);
    for (std::size_t r = 0; r < G; ++r) {
      const auto blocks = ring_blocks(problem, r, s);
      for (const RingBlock& blk : blocks) {
        const AttentionProblem p = block_problem(problem, blk);
        const Tensor<T> K_b = expand_kv_heads(first_rows(held[r].K[blk.kv_slot], p.n_k()), group);
        const Tensor<T> V_b = expand_kv_heads(first_rows(held[r].V[blk.kv_slot], p.n_k()), group);
        const AttentionForward<T> part = flash_forward_fa2(p, Qr[r][blk.q_slot], K_b, V_b);
        rows[r].flops += part.traffic.flops();
        // merge O_s, LSE_s into the query chunk's running O, LSE (base 2), row by row
        Tensor<T>& O_acc = O[r][blk.q_slot];
        std::vector<T>& LSE_acc = L[r][blk.q_slot];
        for (std::size_t b = 0; b < a.batch; ++b)
          for (std::size_t h = 0; h < H; ++h)
            for (std::size_t i = 0; i < c; ++i) {
              const std::size_t at = (b * H + h) * c + i;
              merge_partial(LSE_acc[at], &O_acc.at(b, i, h, 0), part.LSE[at], &part.O.at(b, i, h, 0), d);
            }
      }
      rows[r].blocks = blocks.size();
    }
    if (G > 1 && s + 1 < G) held = pass_on(held, true, kv_bytes, rows);  // K/V of step s + 1
    out.steps.insert(out.steps.end(), rows.begin(), rows.end());
  }
  // Gather: O and LSE back in global order, padding dropped.
  out.O = unshard_rows(problem, O);
  out.LSE = unshard_stats(problem, L);
  return out;
}

template <typename T>
ContextParallelGradients<T> context_parallel_backward(const ContextParallelProblem& problem, const Tensor<T>& Q,
                                                      const Tensor<T>& K, const Tensor<T>& V, const Tensor<T>& O,
                                                      const std::vector<T>& LSE, const Tensor<T>& dO) {
  check_operands(problem, Q, K, V);
  const AttentionProblem& a = problem.attention;
  detail::require_shape("O", O.shape(), Q.shape());
  detail::require_shape("dO", dO.shape(), Q.shape());
  detail::require_stats("LSE", LSE, a.batch * a.heads * a.seq);
  const std::size_t G = problem.gpus, slots = problem.chunks_per_rank(), c = problem.chunk_len();
  const std::size_t group = problem.group();
  const std::size_t kv_bytes = dtype_bytes(a.dtype);
  const std::size_t grad_bytes = std::max<std::size_t>(4, kv_bytes);
  const Shape q_chunk{a.batch, c, a.heads, a.head_dim}, kv_chunk{a.batch, c, problem.kv_heads(), a.head_dim};

  std::vector<std::vector<Tensor<T>>> Qr(G), Or(G), dOr(G), dQ(G);
  std::vector<std::vector<std::vector<T>>> Lr(G);
  std::vector<ChunkPair<T>> held(G), sums(G);  // sums: the dK/dV accumulators after the step before
  for (std::size_t r = 0; r < G; ++r) {
    Qr[r] = shard_rows(problem, Q, r);
    Or[r] = shard_rows(problem, O, r);
    dOr[r] = shard_rows(problem, dO, r);
    Lr[r] = shard_stats(problem, LSE, r);
    held[r] = {shard_rows(problem, K, r), shard_rows(problem, V, r)};
    dQ[r] = zero_chunks<T>(slots, q_chunk);
  }

  ContextParallelGradients<T> out;
  for (std::size_t s = 0; s < G; ++s) {
    std::vector<RankStep> rows = step_rows(problem, s);
    std::vector<ChunkPair<T>> part(G);  // this step's dK/dV of the held chunks, H_kv heads
    for (std::size_t r = 0; r < G; ++r) {
      part[r] = {zero_chunks<T>(slots, kv_chunk), zero_chunks<T>(slots, kv_chunk)};
      const auto blocks = ring_blocks(problem, r, s);
      for (const RingBlock& blk : blocks) {
        const AttentionProblem p = block_problem(problem, blk);
        const Tensor<T> K_b = expand_kv_heads(first_rows(held[r].K[blk.kv_slot], p.n_k()), group);
        const Tensor<T> V_b = expand_kv_heads(first_rows(held[r].V[blk.kv_slot], p.n_k()), group);
        const std::size_t q = blk.q_slot;
        const AttentionGradients<T> g =
            flash_backward_two_kernel(p, Qr[r][q], K_b, V_b, Or[r][q], Lr[r][q], dOr[r][q]);
        rows[r].flops += g.traffic.flops();
        add_rows(dQ[r][q], g.dQ);
        add_rows(part[r].K[blk.kv_slot], sum_kv_heads(g.dK, group));
        add_rows(part[r].V[blk.kv_slot], sum_kv_heads(g.dV, group));
      }
      rows[r].blocks = blocks.size();
    }
    if (G > 1 && s + 1 < G) held = pass_on(held, true, kv_bytes, rows);  // K/V of step s + 1
    // The sums of step s − 1 arrive from rank r − 1 (they belong to the chunks held now); add this step's part.
    std::vector<ChunkPair<T>> incoming = G > 1 && s >= 1 ? pass_on(sums, false, grad_bytes, rows) : std::move(part);
    if (G > 1 && s >= 1)
      for (std::size_t r = 0; r < G; ++r)
        for (std::size_t slot = 0; slot < slots; ++slot) {
          add_rows(incoming[r].K[slot], part[r].K[slot]);
          add_rows(incoming[r].V[slot], part[r].V[slot]);
        }
    sums = std::move(incoming);
    out.steps.insert(out.steps.end(), rows.begin(), rows.end());
  }
  if (G > 1) {  // step G: the last hop brings every sum home to its chunks' owner
    std::vector<RankStep> rows = step_rows(problem, G);
    sums = pass_on(sums, false, grad_bytes, rows);
    out.steps.insert(out.steps.end(), rows.begin(), rows.end());
  }
  std::vector<std::vector<Tensor<T>>> dK(G), dV(G);
  for (std::size_t r = 0; r < G; ++r) {
    dK[r] = std::move(sums[r].K);
    dV[r] = std::move(sums[r].V);
  }
  out.dQ = unshard_rows(problem, dQ);
  out.dK = unshard_rows(problem, dK);
  out.dV = unshard_rows(problem, dV);
  return out;
}

#define FLASHLAB_CP_SIM(T)                                                                                      \
  template ContextParallelForward<T> context_parallel_forward<T>(const ContextParallelProblem&, const Tensor<T>&, \
                                                                 const Tensor<T>&, const Tensor<T>&);           \
  template ContextParallelGradients<T> context_parallel_backward<T>(                                            \
      const ContextParallelProblem&, const Tensor<T>&, const Tensor<T>&, const Tensor<T>&, const Tensor<T>&,      \
      const std::vector<T>&, const Tensor<T>&);
FLASHLAB_CP_SIM(double)
FLASHLAB_CP_SIM(float)
#undef FLASHLAB_CP_SIM

}  // namespace flashlab::ref
