// STREAM sharded over G GPUs, simulated in one process (stream_shards.hpp). Every query block is
// refined by the same function stream_estimate runs (detail::refine_query_block), with a score
// that also records where its key block lives; the schemes' bytes follow from those records:
//   keys_visible     rank s receives the remote key blocks C_blk lets its query blocks see
//   keys_scored      rank s receives the distinct remote key blocks its query blocks score
//   queries_to_keys  Q_q goes once to each other rank holding one of q's representatives; per
//                    remote score a request (r) goes out and a reply (score, r) comes back
// and the application receives V (and, for queries_to_keys, K) of the distinct remote kept
// blocks. Sets are per rank bitmaps over key blocks (n_k bits), never T × T.
#include "flashlab/reference/stream_shards.hpp"

#include "stream_detail.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace flashlab::ref::stream {

namespace {

constexpr std::uint64_t kIndexBytes = 4;  // a block index on the link (int32)
constexpr std::uint64_t kScoreBytes = 4;  // a score on the link (fp32, as the GPU kernels keep it)

double no_nan(double s) { return std::isnan(s) ? -std::numeric_limits<double>::infinity() : s; }

// Owner rank of block b among shards whose [begin, end) ranges are given by `first`/`last`.
template <typename Begin>
std::size_t owner_of(const std::vector<RankShard>& shards, std::size_t b, Begin begin) {
  // The shards are in order and cover every block: the last shard whose begin ≤ b.
  std::size_t lo = 0, hi = shards.size();
  while (hi - lo > 1) {
    const std::size_t mid = (lo + hi) / 2;
    if (begin(shards[mid]) <= b) lo = mid;
    else hi = mid;
  }
  return lo;
}

// One worker's records: per rank, which key blocks its query blocks scored / kept remotely and
// to which ranks each of its query blocks travelled.
struct Records {
  std::vector<std::vector<bool>> scored, kept;      // [rank][r]
  std::vector<RankLinkBytes> by_key, by_query;
  Records(std::size_t gpus, std::size_t n_k)
      : scored(gpus, std::vector<bool>(n_k)), kept(gpus, std::vector<bool>(n_k)), by_key(gpus), by_query(gpus) {}
};

void add(RankLinkBytes& a, const RankLinkBytes& b) {
  a.estimate_in += b.estimate_in;
  a.estimate_out += b.estimate_out;
  a.apply_in += b.apply_in;
  a.apply_out += b.apply_out;
  a.scores_local += b.scores_local;
  a.scores_remote += b.scores_remote;
  a.scores_computed += b.scores_computed;
}

}  // namespace

const char* shard_scheme_name(ShardScheme s) {
  switch (s) {
    case ShardScheme::keys_visible: return "keys_visible";
    case ShardScheme::keys_scored: return "keys_scored";
    case ShardScheme::queries_to_keys: return "queries_to_keys";
  }
  return "?";
}

std::vector<RankShard> shard_sequence(const Geometry& g, std::size_t gpus) {
  g.check();
  if (gpus == 0) throw StreamError("gpus must be at least 1");
  // Boundaries at multiples of lcm(b_q, b_k): every block lies inside one rank's tokens.
  const std::size_t unit = std::lcm(g.bq, g.bk), units = (g.T + unit - 1) / unit;
  std::vector<RankShard> out(gpus);
  for (std::size_t s = 0; s < gpus; ++s) {
    RankShard& r = out[s];
    r.token_begin = std::min(g.T, units * s / gpus * unit);
    r.token_end = std::min(g.T, units * (s + 1) / gpus * unit);
    r.q_begin = (r.token_begin + g.bq - 1) / g.bq;
    r.q_end = (r.token_end + g.bq - 1) / g.bq;
    r.r_begin = (r.token_begin + g.bk - 1) / g.bk;
    r.r_end = (r.token_end + g.bk - 1) / g.bk;
  }
  return out;
}

const char* shard_layout_name(ShardLayout layout) {
  return layout == ShardLayout::zigzag ? "zigzag" : "contiguous";
}

ShardLayout parse_shard_layout(const std::string& name) {
  if (name == "contiguous") return ShardLayout::contiguous;
  if (name == "zigzag") return ShardLayout::zigzag;
  throw StreamError("unknown shard layout '" + name + "' (hint: contiguous or zigzag)");
}

std::vector<std::vector<RankShard>> shard_layout(const Geometry& g, std::size_t gpus, ShardLayout layout,
                                                 std::size_t folds) {
  if (folds == 0) throw StreamError("shard layout: folds must be at least 1 (hint: 1 is plain zigzag)");
  if (folds > 1 && layout != ShardLayout::zigzag)
    throw StreamError("shard layout: folds apply to the zigzag layout only (hint: folds 1, or the zigzag layout)");
  const bool zigzag = layout == ShardLayout::zigzag && gpus > 1;
  const std::size_t pass = 2 * gpus;  // chunks dealt per fold
  const std::vector<RankShard> chunks = shard_sequence(g, zigzag ? folds * pass : gpus);
  std::vector<std::vector<RankShard>> out(gpus);
  for (std::size_t c = 0; c < chunks.size(); ++c) {
    if (chunks[c].token_end == chunks[c].token_begin) continue;
    // Zigzag pairs an early (cheap, short wait) chunk with a late (dear, long wait) one, in every fold.
    const std::size_t j = c % pass;
    const std::size_t rank = !zigzag ? c : j < gpus ? j : pass - 1 - j;
    out[rank].push_back(chunks[c]);
  }
  for (auto& r : out)
    std::sort(r.begin(), r.end(), [](const RankShard& a, const RankShard& b) { return a.token_begin < b.token_begin; });
  return out;
}

namespace {

// The rank holding each key block under a layout (every block lies in one chunk).
std::vector<std::size_t> key_block_owners(const Geometry& g, const std::vector<std::vector<RankShard>>& ranks) {
  std::vector<std::size_t> owner(g.n_k(), 0);
  for (std::size_t s = 0; s < ranks.size(); ++s)
    for (const RankShard& c : ranks[s])
      for (std::size_t r = c.r_begin; r < c.r_end; ++r) owner[r] = s;
  return owner;
}

}  // namespace

std::vector<LayoutRows> layout_exchange_rows(const Geometry& g, std::size_t gpus, ShardLayout layout,
                                             std::size_t folds) {
  const auto ranks = shard_layout(g, gpus, layout, folds);
  const auto owner = key_block_owners(g, ranks);
  std::vector<LayoutRows> out(gpus);
  for (std::size_t s = 0; s < gpus; ++s) {
    out[s].chunks = ranks[s].size();
    for (const RankShard& c : ranks[s]) out[s].q_blocks += c.q_end - c.q_begin;
    if (ranks[s].empty()) continue;
    const std::size_t first = ranks[s].front().r_begin, last = ranks[s].back().r_end;
    for (std::size_t r = 0; r < last; ++r) {
      if (owner[r] == s) continue;
      const std::uint64_t rows = g.k_rows(r);
      out[s].rows_in += rows;
      out[owner[r]].rows_out += rows;
      if (r < first) out[s].rows_first += rows;
    }
  }
  return out;
}

std::vector<ChunkTransfer> layout_transfers(const Geometry& g, std::size_t gpus, ShardLayout layout,
                                            std::size_t folds) {
  const auto ranks = shard_layout(g, gpus, layout, folds);
  std::vector<std::pair<RankShard, std::size_t>> all;  // every chunk with its rank
  for (std::size_t s = 0; s < gpus; ++s)
    for (const RankShard& c : ranks[s]) all.push_back({c, s});
  std::sort(all.begin(), all.end(),
            [](const auto& x, const auto& y) { return x.first.token_begin < y.first.token_begin; });
  std::vector<ChunkTransfer> out;
  for (const auto& [c, src] : all)
    for (std::size_t dst = 0; dst < gpus; ++dst) {
      const auto& mine = ranks[dst];
      if (dst == src || mine.empty() || c.token_end > mine.back().token_end) continue;
      std::size_t tier = 0;  // dst's first chunk that starts at or after c
      while (mine[tier].token_begin < c.token_end) ++tier;
      out.push_back({src, dst, c, tier});
    }
  return out;
}

std::uint64_t SchemeTraffic::max_in() const {
  std::uint64_t m = 0;
  for (const auto& r : ranks) m = std::max(m, r.estimate_in + r.apply_in);
  return m;
}

std::uint64_t SchemeTraffic::total() const {
  std::uint64_t t = 0;
  for (const auto& r : ranks) t += r.estimate_in + r.apply_in;
  return t;
}

std::uint64_t keys_visible_causal_bytes(const RankShard& shard, std::size_t d, std::size_t link_elem_bytes) {
  return std::uint64_t(shard.token_begin) * d * link_elem_bytes;
}

std::vector<RankLinkBytes> keys_visible_causal_traffic(const Geometry& g, std::size_t gpus,
                                                       const std::vector<std::int64_t>& indices, std::size_t k,
                                                       std::size_t d, std::size_t link_elem_bytes,
                                                       ShardLayout layout, std::size_t folds) {
  const auto ranks = shard_layout(g, gpus, layout, folds);
  const std::size_t n_q = g.n_q(), n_k = g.n_k();
  if (indices.size() != n_q * k)
    throw StreamError("keys_visible_causal_traffic: I has " + std::to_string(indices.size()) + " entries, expected n_q·k = " +
                      std::to_string(n_q * k) + " (hint: one head's [n_q, k] rows)");
  const std::uint64_t e = link_elem_bytes;
  const auto key_bytes = [&](std::size_t r) { return std::uint64_t(g.k_rows(r)) * d * e; };
  const auto owner = key_block_owners(g, ranks);
  std::vector<RankLinkBytes> out(gpus);
  std::vector<bool> kept(n_k);
  for (std::size_t s = 0; s < gpus; ++s) {
    if (ranks[s].empty()) continue;  // a rank without query blocks receives nothing
    const std::size_t last = ranks[s].back().r_end;
    for (std::size_t r = 0; r < last; ++r) {  // the estimate: every remote key block before its last
      if (owner[r] == s) continue;
      out[s].estimate_in += key_bytes(r);
      out[owner[r]].estimate_out += key_bytes(r);
    }
    std::fill(kept.begin(), kept.end(), false);
    for (const RankShard& c : ranks[s])
      for (std::size_t i = c.q_begin * k; i < c.q_end * k; ++i) {
        const std::int64_t r = indices[i];
        if (r < -1 || r >= std::int64_t(n_k))
          throw StreamError("keys_visible_causal_traffic: I entry " + std::to_string(r) + " at position " +
                            std::to_string(i) + " is not a key block (hint: −1 or 0 … n_k − 1)");
        if (r >= 0 && owner[std::size_t(r)] != s) kept[std::size_t(r)] = true;
      }
    for (std::size_t r = 0; r < n_k; ++r)  // the application: V of the kept remote blocks
      if (kept[r]) {
        out[s].apply_in += key_bytes(r);
        out[owner[r]].apply_out += key_bytes(r);
      }
  }
  return out;
}

template <typename S>
ShardedEstimate stream_estimate_sharded(const Mat<S>& Q, const Mat<S>& K, const BlockMask& mask,
                                        const EstimateParams& params, std::size_t gpus,
                                        std::size_t link_elem_bytes) {
  if (link_elem_bytes != 1 && link_elem_bytes != 2 && link_elem_bytes != 4 && link_elem_bytes != 8)
    throw StreamError("link_elem_bytes must be 1, 2, 4 or 8 (got " + std::to_string(link_elem_bytes) + ")");
  const Geometry g = mask.geometry();
  const std::vector<RankShard> shards = shard_sequence(g, gpus);
  // The single-GPU estimate gives I and the HBM traffic; the simulation below must agree with it.
  ShardedEstimate out{stream_estimate(Q, K, mask, params), shards, {}};
  const std::size_t n_q = g.n_q(), n_k = g.n_k(), k = params.k, d = std::size_t(Q.cols());
  const std::uint64_t e = link_elem_bytes;
  const auto q_owner = [&](std::size_t q) { return owner_of(shards, q, [](const RankShard& r) { return r.q_begin; }); };
  const auto r_owner = [&](std::size_t r) { return owner_of(shards, r, [](const RankShard& s) { return s.r_begin; }); };
  const auto key_bytes = [&](std::size_t r) { return std::uint64_t(g.k_rows(r)) * d * e; };

  const std::size_t threads = std::max<std::size_t>(1, std::min(params.threads, n_q));
  std::vector<Records> rec;
  rec.reserve(threads);
  for (std::size_t w = 0; w < threads; ++w) rec.emplace_back(gpus, n_k);
  std::vector<std::int64_t> I(n_q * k, -1);
  detail::parallel_for(n_q, threads, [&](std::size_t q_begin, std::size_t q_end, std::size_t w) {
    Records& R = rec[w];
    Mat<S> tile;
    std::vector<Candidate> cur, next;
    std::vector<bool> visited(gpus);  // ranks this query block travelled to (queries_to_keys)
    for (std::size_t q = q_begin; q < q_end; ++q) {
      const std::size_t o = q_owner(q);
      std::fill(visited.begin(), visited.end(), false);
      auto score = [&](std::int64_t r, std::size_t /*round*/) {
        detail::qk_tile(Q, K, g, q, std::size_t(r), tile);
        const std::size_t h = r_owner(std::size_t(r));
        if (h == o) {
          ++R.by_key[o].scores_local;
          ++R.by_key[o].scores_computed;
          ++R.by_query[o].scores_local;
          ++R.by_query[o].scores_computed;
        } else {
          ++R.by_key[o].scores_remote;
          ++R.by_key[o].scores_computed;
          ++R.by_query[o].scores_remote;
          ++R.by_query[h].scores_computed;  // scored where K_r lives
          R.scored[o][std::size_t(r)] = true;
          if (!visited[h]) {  // Q_q travels to rank h once
            visited[h] = true;
            const std::uint64_t qb = std::uint64_t(g.q_rows(q)) * d * e;
            R.by_query[o].estimate_out += qb;
            R.by_query[h].estimate_in += qb;
          }
          // the request (r) and the reply (score, r)
          R.by_query[o].estimate_out += kIndexBytes;
          R.by_query[h].estimate_in += kIndexBytes;
          R.by_query[h].estimate_out += kScoreBytes + kIndexBytes;
          R.by_query[o].estimate_in += kScoreBytes + kIndexBytes;
        }
        return no_nan(detail::masked_max(tile, g, q, std::size_t(r)));
      };
      detail::refine_query_block(mask, q, k, score, cur, next, nullptr);
      for (std::size_t j = 0; j < cur.size(); ++j) {
        I[q * k + j] = cur[j].r;
        const auto r = std::size_t(cur[j].r);
        if (r_owner(r) != o) R.kept[o][r] = true;
      }
    }
  });
  if (I != out.result.indices)
    throw std::logic_error("stream_estimate_sharded: the sharded refinement disagrees with stream_estimate");

  // Merge the workers' records (bitmaps OR, counters add).
  Records all(gpus, n_k);
  for (const Records& R : rec) {
    for (std::size_t s = 0; s < gpus; ++s) {
      for (std::size_t r = 0; r < n_k; ++r) {
        if (R.scored[s][r]) all.scored[s][r] = true;
        if (R.kept[s][r]) all.kept[s][r] = true;
      }
      add(all.by_key[s], R.by_key[s]);
      add(all.by_query[s], R.by_query[s]);
    }
  }

  SchemeTraffic visible{ShardScheme::keys_visible, 1, std::vector<RankLinkBytes>(gpus)};
  SchemeTraffic by_key{ShardScheme::keys_scored, g.n_it() + 1, all.by_key};
  SchemeTraffic by_query{ShardScheme::queries_to_keys, g.n_it() + 1, all.by_query};
  for (std::size_t s = 0; s < gpus; ++s) {
    const RankShard& sh = shards[s];
    // keys_visible: the union over the rank's query blocks of the remote blocks each may see.
    // Causal only: every key block before the rank's own (the key blocks after its last query
    // token are masked). With a user mask, the union of the rows' valid blocks.
    std::vector<bool> seen(n_k);
    if (sh.q_begin == sh.q_end) {
      // a rank without query blocks sees nothing
    } else if (!mask.has_user_mask()) {
      for (std::size_t r = 0; r < sh.r_begin; ++r) seen[r] = true;
    } else {
      for (std::size_t q = sh.q_begin; q < sh.q_end; ++q) {
        const std::size_t last_c = mask.causal_last(q);
        for (std::int64_t r = mask.first_valid(q, 0, last_c); r >= 0;
             r = std::size_t(r) < last_c ? mask.first_valid(q, std::size_t(r) + 1, last_c) : -1)
          if (r_owner(std::size_t(r)) != s) seen[std::size_t(r)] = true;
      }
    }
    visible.ranks[s].scores_local = by_key.ranks[s].scores_local + by_key.ranks[s].scores_remote;
    visible.ranks[s].scores_computed = visible.ranks[s].scores_local;
    for (std::size_t r = 0; r < n_k; ++r) {
      const std::size_t h = r_owner(r);
      if (seen[r]) {
        visible.ranks[s].estimate_in += key_bytes(r);
        visible.ranks[h].estimate_out += key_bytes(r);
      }
      if (all.scored[s][r]) {  // keys_scored: request r, receive K_r
        by_key.ranks[s].estimate_out += kIndexBytes;
        by_key.ranks[h].estimate_in += kIndexBytes;
        by_key.ranks[s].estimate_in += key_bytes(r);
        by_key.ranks[h].estimate_out += key_bytes(r);
      }
      if (all.kept[s][r]) {  // the application: V_r (K_r too where the estimate did not bring it)
        for (SchemeTraffic* t : {&visible, &by_key, &by_query}) {
          const std::uint64_t b = t == &by_query ? 2 * key_bytes(r) : key_bytes(r);
          t->ranks[s].apply_in += b;
          t->ranks[h].apply_out += b;
        }
      }
    }
  }
  out.schemes = {visible, by_key, by_query};
  return out;
}

template ShardedEstimate stream_estimate_sharded<float>(const Mat<float>&, const Mat<float>&, const BlockMask&,
                                                        const EstimateParams&, std::size_t, std::size_t);
template ShardedEstimate stream_estimate_sharded<double>(const Mat<double>&, const Mat<double>&, const BlockMask&,
                                                         const EstimateParams&, std::size_t, std::size_t);

}  // namespace flashlab::ref::stream
