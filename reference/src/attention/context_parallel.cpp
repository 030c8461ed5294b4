// Context-parallel attention, the parts every level shares (context_parallel.hpp): the problem's
// checks, the sharding and the ring schedule, the LSE merge, the GQA head expansion, and the
// model of the bytes on the link and the compute per step. The simulation that runs the ring
// is context_parallel_sim.cpp; the GPU ring (cuda/src/attention/) runs the same ring_blocks().
#include "flashlab/reference/context_parallel.hpp"

#include "tiles.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>

namespace flashlab::ref {

using detail::neg_inf;

std::string_view layout_name(ShardLayout layout) {
  return layout == ShardLayout::zigzag ? "zigzag" : "contiguous";
}

ShardLayout parse_layout(std::string_view name) {
  if (name == "zigzag") return ShardLayout::zigzag;
  if (name == "contiguous") return ShardLayout::contiguous;
  throw std::invalid_argument("layout '" + std::string(name) + "' is unknown (hint: zigzag or contiguous)");
}

std::size_t ContextParallelProblem::valid_rows(std::size_t chunk) const {
  const std::size_t c = chunk_len(), first = chunk * c;
  if (first >= attention.seq) return 0;
  return std::min(c, attention.seq - first);
}

void ContextParallelProblem::validate() const {
  attention.validate();
  if (attention.seq_k != 0 && attention.seq_k != attention.seq)
    throw ProblemError("seq_k", "context-parallel problem: seq_k (N_k) = " + std::to_string(attention.seq_k) +
                                    " differs from seq (N) = " + std::to_string(attention.seq) +
                                    " (hint: the ring shards one sequence for Q, K and V: self-attention only)");
  const std::size_t H = attention.heads;
  if (heads_kv > H || (heads_kv != 0 && H % heads_kv != 0))
    throw ProblemError("heads_kv", "context-parallel problem: heads_kv (H_kv) = " + std::to_string(heads_kv) +
                                       " does not divide heads (H) = " + std::to_string(H) +
                                       " (hint: each K/V head serves H / H_kv query heads; e.g. H_kv = 1, or H)");
  if (gpus == 0 || gpus > kMaxRanks)
    throw ProblemError("gpus", "context-parallel problem: gpus (G) = " + std::to_string(gpus) +
                                   " is outside 1 … " + std::to_string(kMaxRanks) +
                                   " (hint: the number of ranks in the ring, e.g. 2, 4 or 8)");
}

std::string ContextParallelProblem::str() const {
  std::ostringstream s;
  s << "G=" << gpus << " " << layout_name(layout) << " B=" << attention.batch << " N=" << attention.seq
    << " H=" << attention.heads << " H_kv=" << kv_heads() << " d=" << attention.head_dim
    << (attention.causal ? " causal" : "") << " " << dtype_name(attention.dtype);
  return s.str();
}

std::size_t ring_source(std::size_t gpus, std::size_t rank, std::size_t step) {
  return (rank + gpus - step % gpus) % gpus;
}

std::string_view block_kind_name(BlockKind kind) { return kind == BlockKind::diagonal ? "diagonal" : "full"; }

// Which blocks a rank computes at a step. Chunk a (queries) against chunk b (keys), positions
// [a·c, a·c + c) and [b·c, b·c + c): without a mask every pair is a full block; with the causal
// mask b < a is full (every key precedes every query), b = a is the diagonal block (causal, offset
// 0) and b > a is hidden whole. Chunks of padding only are left out on either side.
std::vector<RingBlock> ring_blocks(const ContextParallelProblem& problem, std::size_t rank, std::size_t step) {
  std::vector<RingBlock> blocks;
  const std::size_t src = ring_source(problem.gpus, rank, step);
  const std::size_t slots = problem.chunks_per_rank();
  for (std::size_t q_slot = 0; q_slot < slots; ++q_slot) {
    const std::size_t a = problem.chunk_of(rank, q_slot);
    if (problem.valid_rows(a) == 0) continue;
    for (std::size_t kv_slot = 0; kv_slot < slots; ++kv_slot) {
      const std::size_t b = problem.chunk_of(src, kv_slot);
      const std::size_t valid = problem.valid_rows(b);
      if (valid == 0) continue;
      if (problem.attention.causal && b > a) continue;
      const BlockKind kind = problem.attention.causal && b == a ? BlockKind::diagonal : BlockKind::full;
      blocks.push_back(RingBlock{q_slot, kv_slot, a, b, kind, valid});
    }
  }
  return blocks;
}

AttentionProblem block_problem(const ContextParallelProblem& problem, const RingBlock& block) {
  AttentionProblem p = problem.attention;
  const std::size_t c = problem.chunk_len();
  p.seq = c;
  // A diagonal block keeps its padded keys: they come after every real query of the chunk, so
  // the causal mask hides them already (only padded queries, which are dropped, see them).
  p.seq_k = block.kind == BlockKind::full && block.valid_keys < c ? block.valid_keys : 0;
  p.causal = block.kind == BlockKind::diagonal;
  p.scale = problem.attention.softmax_scale();
  return p;
}

template <typename T>
void merge_partial(T& LSE, T* O, T LSE_s, const T* O_s, std::size_t d) {
  if (LSE_s == neg_inf<T>()) return;  // the partial saw only masked keys: nothing to add (O_s unread)
  if (LSE == neg_inf<T>()) {          // nothing seen yet: the partial is the running result
    LSE = LSE_s;
    std::copy(O_s, O_s + d, O);
    return;
  }
  // Weights relative to the larger LSE, so only differences are exponentiated (no overflow at
  // LSE = ±800): w = 2^(LSE − m), w_s = 2^(LSE_s − m), LSE_new = m + log2(w + w_s).
  const T m = std::max(LSE, LSE_s);
  const T w = std::exp2(LSE - m), w_s = std::exp2(LSE_s - m), sum = w + w_s;
  const T a = w / sum, b = w_s / sum;  // 2^(LSE − LSE_new), 2^(LSE_s − LSE_new)
  for (std::size_t k = 0; k < d; ++k) O[k] = a * O[k] + b * O_s[k];
  LSE = m + std::log2(sum);
}

template <typename T>
Tensor<T> expand_kv_heads(const Tensor<T>& kv, std::size_t group) {
  if (group == 0) throw std::invalid_argument("expand_kv_heads: group is 0 (hint: H / H_kv, at least 1)");
  const Shape s = kv.shape();
  Tensor<T> out(Shape{s.batch, s.seq, s.heads * group, s.head_dim});
  for (std::size_t b = 0; b < s.batch; ++b)
    for (std::size_t n = 0; n < s.seq; ++n)
      for (std::size_t h = 0; h < s.heads * group; ++h)
        std::copy_n(&kv.at(b, n, h / group, 0), s.head_dim, &out.at(b, n, h, 0));
  return out;
}

template <typename T>
Tensor<T> sum_kv_heads(const Tensor<T>& grad, std::size_t group) {
  const Shape s = grad.shape();
  if (group == 0 || s.heads % group != 0)
    throw std::invalid_argument("sum_kv_heads: " + std::to_string(s.heads) + " heads do not split into groups of " +
                                std::to_string(group) + " (hint: group = H / H_kv)");
  Tensor<T> out(Shape{s.batch, s.seq, s.heads / group, s.head_dim});
  for (std::size_t b = 0; b < s.batch; ++b)
    for (std::size_t n = 0; n < s.seq; ++n)
      for (std::size_t h = 0; h < s.heads; ++h)
        for (std::size_t k = 0; k < s.head_dim; ++k) out.at(b, n, h / group, k) += grad.at(b, n, h, k);
  return out;
}

namespace {

void require_global_rows(const ContextParallelProblem& problem, const Shape& s, const char* what) {
  if (s.batch != problem.attention.batch || s.seq != problem.attention.seq || s.head_dim != problem.attention.head_dim)
    throw std::invalid_argument(std::string("context parallel: ") + what + " has shape " + detail::shape_text(s) +
                                ", expected [B, N, heads, d] with B = " + std::to_string(problem.attention.batch) +
                                ", N = " + std::to_string(problem.attention.seq) +
                                ", d = " + std::to_string(problem.attention.head_dim));
}

}  // namespace

template <typename T>
std::vector<Tensor<T>> shard_rows(const ContextParallelProblem& problem, const Tensor<T>& global, std::size_t rank) {
  problem.validate();
  require_global_rows(problem, global.shape(), "the tensor to shard");
  if (rank >= problem.gpus)
    throw std::invalid_argument("shard_rows: rank " + std::to_string(rank) + " is not below G = " +
                                std::to_string(problem.gpus));
  const Shape s = global.shape();
  const std::size_t c = problem.chunk_len(), row = s.row_stride();
  std::vector<Tensor<T>> out;
  for (std::size_t slot = 0; slot < problem.chunks_per_rank(); ++slot) {
    Tensor<T> t(Shape{s.batch, c, s.heads, s.head_dim});
    const std::size_t chunk = problem.chunk_of(rank, slot), valid = problem.valid_rows(chunk);
    for (std::size_t b = 0; b < s.batch && valid > 0; ++b)
      std::copy_n(&global.at(b, chunk * c, 0, 0), valid * row, &t.at(b, 0, 0, 0));
    out.push_back(std::move(t));
  }
  return out;
}

template <typename T>
Tensor<T> unshard_rows(const ContextParallelProblem& problem, const std::vector<std::vector<Tensor<T>>>& per_rank) {
  problem.validate();
  if (per_rank.size() != problem.gpus || per_rank.front().size() != problem.chunks_per_rank())
    throw std::invalid_argument("unshard_rows: expected " + std::to_string(problem.gpus) + " ranks of " +
                                std::to_string(problem.chunks_per_rank()) + " chunks");
  const Shape cs = per_rank.front().front().shape();
  const std::size_t c = problem.chunk_len(), row = cs.row_stride();
  Tensor<T> out(Shape{cs.batch, problem.attention.seq, cs.heads, cs.head_dim});
  for (std::size_t r = 0; r < problem.gpus; ++r)
    for (std::size_t slot = 0; slot < problem.chunks_per_rank(); ++slot) {
      const Tensor<T>& t = per_rank[r].at(slot);
      if (!(t.shape() == cs) || cs.seq != c)
        throw std::invalid_argument("unshard_rows: rank " + std::to_string(r) + " slot " + std::to_string(slot) +
                                    " has shape " + detail::shape_text(t.shape()) + ", expected " +
                                    detail::shape_text(Shape{cs.batch, c, cs.heads, cs.head_dim}));
      const std::size_t chunk = problem.chunk_of(r, slot), valid = problem.valid_rows(chunk);
      for (std::size_t b = 0; b < cs.batch && valid > 0; ++b)
        std::copy_n(&t.at(b, 0, 0, 0), valid * row, &out.at(b, chunk * c, 0, 0));
    }
  return out;
}

template <typename T>
std::vector<std::vector<T>> shard_stats(const ContextParallelProblem& problem, const std::vector<T>& global,
                                        std::size_t rank) {
  problem.validate();
  const std::size_t B = problem.attention.batch, H = problem.attention.heads, N = problem.attention.seq;
  const std::size_t c = problem.chunk_len();
  if (global.size() != B * H * N)
    throw std::invalid_argument("shard_stats: the statistic has " + std::to_string(global.size()) +
                                " elements, expected B*H*N = " + std::to_string(B * H * N));
  if (rank >= problem.gpus)
    throw std::invalid_argument("shard_stats: rank " + std::to_string(rank) + " is not below G = " +
                                std::to_string(problem.gpus));
  std::vector<std::vector<T>> out;
  for (std::size_t slot = 0; slot < problem.chunks_per_rank(); ++slot) {
    std::vector<T> v(B * H * c, T(0));
    const std::size_t chunk = problem.chunk_of(rank, slot), valid = problem.valid_rows(chunk);
    for (std::size_t bh = 0; bh < B * H; ++bh)
      std::copy_n(global.data() + bh * N + chunk * c, valid, v.data() + bh * c);
    out.push_back(std::move(v));
  }
  return out;
}

template <typename T>
std::vector<T> unshard_stats(const ContextParallelProblem& problem,
                             const std::vector<std::vector<std::vector<T>>>& per_rank) {
  problem.validate();
  const std::size_t B = problem.attention.batch, H = problem.attention.heads, N = problem.attention.seq;
  const std::size_t c = problem.chunk_len();
  if (per_rank.size() != problem.gpus)
    throw std::invalid_argument("unshard_stats: expected " + std::to_string(problem.gpus) + " ranks");
  std::vector<T> out(B * H * N, T(0));
  for (std::size_t r = 0; r < problem.gpus; ++r)
    for (std::size_t slot = 0; slot < problem.chunks_per_rank(); ++slot) {
      const std::vector<T>& v = per_rank[r].at(slot);
      if (v.size() != B * H * c)
        throw std::invalid_argument("unshard_stats: rank " + std::to_string(r) + " slot " + std::to_string(slot) +
                                    " has " + std::to_string(v.size()) + " elements, expected B*H*c = " +
                                    std::to_string(B * H * c));
      const std::size_t chunk = problem.chunk_of(r, slot), valid = problem.valid_rows(chunk);
      for (std::size_t bh = 0; bh < B * H; ++bh)
        std::copy_n(v.data() + bh * c, valid, out.data() + bh * N + chunk * c);
    }
  return out;
}

// ---------------------------------------------------------------------------------------------
// The model of the link: every rank sends what it holds to rank + 1 and receives the same from
// rank − 1, so one number per step describes every rank.
// ---------------------------------------------------------------------------------------------
std::size_t ring_steps(const ContextParallelProblem& problem, RingPass pass) {
  // One rank has no ring: nothing travels, and the backward needs no homeward hop.
  return pass == RingPass::backward && problem.gpus > 1 ? problem.gpus + 1 : problem.gpus;
}

LinkBytes ring_link_bytes(const ContextParallelProblem& problem, RingPass pass, std::size_t step) {
  problem.validate();
  const std::size_t G = problem.gpus;
  if (step >= ring_steps(problem, pass))
    throw std::invalid_argument("ring_link_bytes: step " + std::to_string(step) + " is past the last step " +
                                std::to_string(ring_steps(problem, pass) - 1));
  LinkBytes out;
  if (G == 1) return out;
  // N_local rows of H_kv heads: all the K (or V) rows one rank holds.
  const std::uint64_t elements = std::uint64_t(problem.attention.batch) * problem.local_seq() * problem.kv_heads() *
                                 problem.attention.head_dim;
  const std::uint64_t kv_bytes = elements * dtype_bytes(problem.attention.dtype);
  const std::uint64_t grad_bytes = elements * std::max<std::size_t>(4, dtype_bytes(problem.attention.dtype));
  if (step + 1 < G) out.K = out.V = kv_bytes;  // the K/V chunks of the next step
  if (pass == RingPass::backward && step >= 1) out.dK = out.dV = grad_bytes;  // the sums of the step before
  return out;
}

std::uint64_t block_flops(const ContextParallelProblem& problem, const RingBlock& block, RingPass pass) {
  const AttentionProblem& a = problem.attention;
  const std::uint64_t c = problem.chunk_len();
  const std::uint64_t full = 4ULL * a.batch * a.heads * a.head_dim * c *
                             (block.kind == BlockKind::diagonal ? c : std::uint64_t(block.valid_keys));
  const std::uint64_t forward = block.kind == BlockKind::diagonal ? full / 2 : full;
  return pass == RingPass::forward ? forward : forward * 5 / 2;
}

std::vector<RingStepModel> ring_model(const ContextParallelProblem& problem, RingPass pass, double link_bytes_per_s,
                                      double flops_per_s) {
  problem.validate();
  if (!(link_bytes_per_s > 0) || !std::isfinite(link_bytes_per_s))
    throw std::invalid_argument("ring_model: the link bandwidth must be positive and finite");
  if (!(flops_per_s > 0) || !std::isfinite(flops_per_s))
    throw std::invalid_argument("ring_model: the compute rate must be positive and finite");
  std::vector<RingStepModel> out;
  for (std::size_t s = 0; s < ring_steps(problem, pass); ++s) {
    RingStepModel m;
    m.step = s;
    m.sent = ring_link_bytes(problem, pass, s);
    m.flops_min = ~std::uint64_t(0);
    for (std::size_t r = 0; r < problem.gpus; ++r) {
      std::uint64_t f = 0;
      if (s < problem.gpus)  // the backward's last step is the homeward dK/dV hop alone
        for (const RingBlock& b : ring_blocks(problem, r, s)) f += block_flops(problem, b, pass);
      m.flops_max = std::max(m.flops_max, f);
      m.flops_min = std::min(m.flops_min, f);
    }
    m.compute_s = double(m.flops_max) / flops_per_s;
    m.link_s = double(m.sent.total()) / link_bytes_per_s;
    out.push_back(m);
  }
  return out;
}

bool counted_equals_model(const ContextParallelProblem& problem, RingPass pass, const std::vector<RankStep>& counted,
                          std::string* why) {
  const std::size_t steps = ring_steps(problem, pass);
  auto fail = [&](const std::string& text) {
    if (why) *why = text;
    return false;
  };
  if (counted.size() != steps * problem.gpus)
    return fail("counted " + std::to_string(counted.size()) + " rank-steps, the model has " +
                std::to_string(steps * problem.gpus));
  for (const RankStep& rs : counted) {
    if (rs.step >= steps || rs.rank >= problem.gpus) return fail("a counted step lies outside the ring");
    const LinkBytes want = ring_link_bytes(problem, pass, rs.step);
    if (!(rs.sent == want) || !(rs.received == want))
      return fail("step " + std::to_string(rs.step) + " rank " + std::to_string(rs.rank) + ": sent " +
                  std::to_string(rs.sent.total()) + " B, received " + std::to_string(rs.received.total()) +
                  " B, model " + std::to_string(want.total()) + " B each way");
  }
  return true;
}

#define FLASHLAB_CP(T)                                                                                            \
  template void merge_partial<T>(T&, T*, T, const T*, std::size_t);                                              \
  template Tensor<T> expand_kv_heads<T>(const Tensor<T>&, std::size_t);                                          \
  template Tensor<T> sum_kv_heads<T>(const Tensor<T>&, std::size_t);                                             \
  template std::vector<std::vector<T>> shard_stats<T>(const ContextParallelProblem&, const std::vector<T>&,       \
                                                      std::size_t);                                              \
  template std::vector<T> unshard_stats<T>(const ContextParallelProblem&,                                         \
                                           const std::vector<std::vector<std::vector<T>>>&);
// Rows are moved as they are: also for 16-bit bit patterns (the GPU ring's host side).
#define FLASHLAB_CP_ROWS(T)                                                                                       \
  template std::vector<Tensor<T>> shard_rows<T>(const ContextParallelProblem&, const Tensor<T>&, std::size_t);   \
  template Tensor<T> unshard_rows<T>(const ContextParallelProblem&, const std::vector<std::vector<Tensor<T>>>&);
FLASHLAB_CP(double)
FLASHLAB_CP(float)
FLASHLAB_CP_ROWS(double)
FLASHLAB_CP_ROWS(float)
FLASHLAB_CP_ROWS(std::uint16_t)
#undef FLASHLAB_CP
#undef FLASHLAB_CP_ROWS

}  // namespace flashlab::ref
