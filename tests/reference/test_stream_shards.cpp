// STREAM sharded over G simulated GPUs: the sharding covers every block once, the sharded
// refinement gives the single-GPU I for any G and thread count, and each scheme's link bytes obey
// what can be checked without the simulation (conservation, the closed form, limiting cases).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <numeric>

#include "flashlab/reference/stream_shards.hpp"
#include "test_stream_util.hpp"

using namespace flashlab::ref::stream;
using flashlab::test::stream::random_int_mat;
using flashlab::test::stream::random_mat;
using flashlab::test::stream::random_user_mask;

namespace {

const SchemeTraffic& scheme(const ShardedEstimate& s, ShardScheme which) {
  for (const auto& t : s.schemes)
    if (t.scheme == which) return t;
  FAIL("scheme missing");
  return s.schemes.front();
}

// Bytes sent equal bytes received, summed over ranks, estimate and application apart.
void check_conservation(const SchemeTraffic& t) {
  INFO(shard_scheme_name(t.scheme));
  std::uint64_t in = 0, out = 0, ain = 0, aout = 0;
  for (const auto& r : t.ranks) in += r.estimate_in, out += r.estimate_out, ain += r.apply_in, aout += r.apply_out;
  CHECK(in == out);
  CHECK(ain == aout);
}

}  // namespace

TEST_CASE("stream shards: the sharding covers every block once, at lcm(b_q, b_k) boundaries", "[stream][shards]") {
  for (const Geometry g : {Geometry{1000, 32, 48}, Geometry{4096, 64, 64}, Geometry{100, 64, 64}, Geometry{1, 16, 16}}) {
    for (std::size_t G : {1, 2, 3, 4, 8}) {
      INFO("T " << g.T << " b_q " << g.bq << " b_k " << g.bk << " G " << G);
      const auto shards = shard_sequence(g, G);
      REQUIRE(shards.size() == G);
      CHECK(shards.front().token_begin == 0);
      CHECK(shards.back().token_end == g.T);
      CHECK(shards.front().q_begin == 0);
      CHECK(shards.back().q_end == g.n_q());
      CHECK(shards.back().r_end == g.n_k());
      const std::size_t unit = std::lcm(g.bq, g.bk);
      for (std::size_t s = 0; s < G; ++s) {
        CHECK((shards[s].token_begin % unit == 0 || shards[s].token_begin == g.T));
        if (s > 0) {
          CHECK(shards[s].token_begin == shards[s - 1].token_end);
          CHECK(shards[s].q_begin == shards[s - 1].q_end);
          CHECK(shards[s].r_begin == shards[s - 1].r_end);
        }
      }
    }
  }
  CHECK_THROWS_WITH(shard_sequence(Geometry{64, 16, 16}, 0), Catch::Contains("gpus"));
}

TEST_CASE("stream shards: every G and thread count gives the single-GPU I", "[stream][shards]") {
  struct Case {
    Geometry g;
    std::size_t d, k;
    bool ints, user;
  };
  for (const Case& c : {Case{{1000, 32, 48}, 8, 3, false, false}, Case{{2048, 64, 64}, 16, 4, false, false},
                        Case{{1536, 32, 32}, 8, 2, true, false}, Case{{1200, 32, 16}, 8, 5, true, true},
                        Case{{777, 16, 16}, 4, 1, false, true}}) {
    INFO("T " << c.g.T << " b_q " << c.g.bq << " b_k " << c.g.bk << " k " << c.k << (c.ints ? " ties" : "")
              << (c.user ? " user mask" : ""));
    const auto Q = c.ints ? random_int_mat<double>(c.g.T, c.d, 11) : random_mat<double>(c.g.T, c.d, 11);
    const auto K = c.ints ? random_int_mat<double>(c.g.T, c.d, 12) : random_mat<double>(c.g.T, c.d, 12);
    const BlockMask mask = c.user ? BlockMask(c.g, random_user_mask(c.g, 13, 0.6)) : BlockMask(c.g);
    const EstimateResult single = stream_estimate(Q, K, mask, EstimateParams{c.k, 1});
    for (std::size_t G : {1, 2, 3, 4, 8}) {
      for (std::size_t threads : {1, 3}) {
        INFO("G " << G << " threads " << threads);
        const ShardedEstimate s = stream_estimate_sharded(Q, K, mask, EstimateParams{c.k, threads}, G);
        CHECK(s.result.indices == single.indices);
        REQUIRE(s.schemes.size() == 3);
        std::uint64_t scores = 0, computed = 0;
        for (const auto& r : scheme(s, ShardScheme::keys_scored).ranks) scores += r.scores_local + r.scores_remote;
        for (const auto& r : scheme(s, ShardScheme::queries_to_keys).ranks) computed += r.scores_computed;
        // Every score of the single-GPU estimate happens once, on the rank the scheme says.
        CHECK(scores == single.blocks_scored);
        CHECK(computed == single.blocks_scored);
        for (const auto& t : s.schemes) check_conservation(t);
        if (G == 1)
          for (const auto& t : s.schemes) CHECK(t.total() == 0);
      }
    }
  }
}

TEST_CASE("stream shards: keys_visible under a causal mask is every key row before the rank's own",
          "[stream][shards]") {
  const Geometry g{3000, 64, 32};
  const auto Q = random_mat<float>(g.T, 16, 3), K = random_mat<float>(g.T, 16, 4);
  for (std::size_t G : {2, 3, 4, 8}) {
    INFO("G " << G);
    const ShardedEstimate s = stream_estimate_sharded(Q, K, BlockMask(g), EstimateParams{4, 2}, G, 2);
    const SchemeTraffic& v = scheme(s, ShardScheme::keys_visible);
    CHECK(v.rounds == 1);
    for (std::size_t r = 0; r < G; ++r) CHECK(v.ranks[r].estimate_in == keys_visible_causal_bytes(s.shards[r], 16, 2));
    // The last rank receives the most: (G − 1)/G of K, as the sharding is even.
    CHECK(v.max_in() >= v.ranks.back().estimate_in);
    CHECK(scheme(s, ShardScheme::keys_scored).rounds == g.n_it() + 1);
  }
}

TEST_CASE("stream shards: the schemes' bytes in their limiting cases", "[stream][shards]") {
  const Geometry g{2048, 64, 64};
  const std::size_t d = 16;
  const auto Q = random_mat<double>(g.T, d, 5), K = random_mat<double>(g.T, d, 6);
  // k ≥ n_k: every valid block is its own branch from the start, so every visible block is scored
  // and kept: keys_scored brings exactly the K blocks keys_visible brings (plus one index each).
  {
    const ShardedEstimate s = stream_estimate_sharded(Q, K, BlockMask(g), EstimateParams{g.n_k(), 1}, 4);
    const auto& v = scheme(s, ShardScheme::keys_visible);
    const auto& ks = scheme(s, ShardScheme::keys_scored);
    for (std::size_t r = 0; r < 4; ++r) {
      const std::uint64_t blocks = v.ranks[r].estimate_in / (g.bk * d * 2);  // remote blocks it sees
      // It sends one request per such block besides the K blocks it serves, as under keys_visible;
      // what it receives beyond keys_visible's is the requests of others, 4 bytes each.
      CHECK(ks.ranks[r].estimate_out == v.ranks[r].estimate_out + 4 * blocks);
      CHECK(ks.ranks[r].estimate_in >= v.ranks[r].estimate_in);
      CHECK((ks.ranks[r].estimate_in - v.ranks[r].estimate_in) % 4 == 0);
      // the application needs V of every visible block, K already local in both key schemes
      CHECK(v.ranks[r].apply_in == v.ranks[r].estimate_in);
      CHECK(ks.ranks[r].apply_in == v.ranks[r].apply_in);
      CHECK(scheme(s, ShardScheme::queries_to_keys).ranks[r].apply_in == 2 * v.ranks[r].apply_in);
    }
  }
  // k = 1: at most n_it + 1 scores per query block.
  {
    const ShardedEstimate s = stream_estimate_sharded(Q, K, BlockMask(g), EstimateParams{1, 1}, 2);
    std::uint64_t scores = 0;
    for (const auto& r : scheme(s, ShardScheme::keys_scored).ranks) scores += r.scores_local + r.scores_remote;
    CHECK(scores <= g.n_q() * (g.n_it() + 1));
  }
  CHECK_THROWS_WITH(stream_estimate_sharded(Q, K, BlockMask(g), EstimateParams{2, 1}, 2, 3),
                    Catch::Contains("link_elem_bytes"));
  CHECK_THROWS_WITH(stream_estimate_sharded(Q, K, BlockMask(g), EstimateParams{2, 1}, 0), Catch::Contains("gpus"));
}

TEST_CASE("stream shards: keys_visible's bytes from a finished I equal the simulation's", "[stream][shards]") {
  // The sharded GPU run has I but not the simulation: the closed count from I must be the
  // simulation's keys_visible traffic exactly, rank by rank, on ragged T and with ties.
  for (const Geometry g : {Geometry{3000, 64, 64}, Geometry{1000, 32, 48}, Geometry{4097, 64, 64}}) {
    for (const bool ints : {false, true}) {
      const std::size_t d = 8, k = 4;
      const auto Q = ints ? random_int_mat<double>(g.T, d, 21) : random_mat<double>(g.T, d, 21);
      const auto K = ints ? random_int_mat<double>(g.T, d, 22) : random_mat<double>(g.T, d, 22);
      for (std::size_t G : {1, 2, 3, 4, 8}) {
        INFO("T " << g.T << " b_q " << g.bq << " b_k " << g.bk << " G " << G << (ints ? " ties" : ""));
        const ShardedEstimate s = stream_estimate_sharded(Q, K, BlockMask(g), EstimateParams{k, 1}, G, 2);
        const auto counted = keys_visible_causal_traffic(g, G, s.result.indices, k, d, 2);
        const auto& v = scheme(s, ShardScheme::keys_visible).ranks;
        REQUIRE(counted.size() == v.size());
        for (std::size_t r = 0; r < G; ++r) {
          INFO("rank " << r);
          CHECK(counted[r].estimate_in == v[r].estimate_in);
          CHECK(counted[r].estimate_out == v[r].estimate_out);
          CHECK(counted[r].apply_in == v[r].apply_in);
          CHECK(counted[r].apply_out == v[r].apply_out);
          CHECK(counted[r].estimate_in == keys_visible_causal_bytes(s.shards[r], d, 2));
        }
      }
    }
  }
  const Geometry g{512, 64, 64};
  std::vector<std::int64_t> I(g.n_q() * 2, -1);
  CHECK_THROWS_WITH(keys_visible_causal_traffic(g, 2, std::vector<std::int64_t>(3, -1), 2, 8, 2),
                    Catch::Contains("expected n_q·k"));
  I[5] = std::int64_t(g.n_k());
  CHECK_THROWS_WITH(keys_visible_causal_traffic(g, 2, I, 2, 8, 2), Catch::Contains("is not a key block"));
  CHECK_THROWS_WITH(keys_visible_causal_traffic(g, 0, I, 2, 8, 2), Catch::Contains("gpus"));
}

namespace {

// The rank holding token t under `ranks` (brute force over the chunks), gpus when none does.
std::size_t token_owner(const std::vector<std::vector<RankShard>>& ranks, std::size_t t) {
  for (std::size_t s = 0; s < ranks.size(); ++s)
    for (const RankShard& c : ranks[s])
      if (t >= c.token_begin && t < c.token_end) return s;
  return ranks.size();
}

}  // namespace

TEST_CASE("stream shards: the zigzag layout deals chunk g and 2G − 1 − g to rank g", "[stream][shards]") {
  for (const Geometry g : {Geometry{3000, 64, 64}, Geometry{4097, 64, 64}, Geometry{1000, 32, 48}, Geometry{64, 64, 64}}) {
    for (std::size_t G : {1, 2, 3, 4, 8}) {
      INFO("T " << g.T << " G " << G);
      const auto zz = shard_layout(g, G, ShardLayout::zigzag);
      const auto ct = shard_layout(g, G, ShardLayout::contiguous);
      REQUIRE(zz.size() == G);
      // Every query block in exactly one chunk of one rank; chunks in token order per rank.
      std::vector<int> seen(g.n_q());
      for (const auto& r : zz) {
        CHECK(r.size() <= (G == 1 ? 1u : 2u));
        for (std::size_t i = 0; i < r.size(); ++i) {
          CHECK(r[i].token_end > r[i].token_begin);
          if (i > 0) CHECK(r[i].token_begin >= r[i - 1].token_end);
          for (std::size_t q = r[i].q_begin; q < r[i].q_end; ++q) ++seen[q];
        }
      }
      CHECK(std::count(seen.begin(), seen.end(), 1) == std::ptrdiff_t(g.n_q()));
      if (G == 1) CHECK(zz == ct);
      // Against the 2G-way contiguous sharding: rank s holds shards s and 2G − 1 − s.
      const auto chunks = shard_sequence(g, 2 * G);
      for (std::size_t s = 0; s < G && G > 1; ++s) {
        std::vector<RankShard> want;
        for (const std::size_t c : {s, 2 * G - 1 - s})
          if (chunks[c].token_end > chunks[c].token_begin) want.push_back(chunks[c]);
        CHECK(zz[s] == want);
      }
      // The exchange rows against a token-by-token count, both layouts.
      for (const ShardLayout layout : {ShardLayout::contiguous, ShardLayout::zigzag}) {
        INFO(shard_layout_name(layout));
        const auto ranks = shard_layout(g, G, layout);
        const auto rows = layout_exchange_rows(g, G, layout);
        std::vector<std::uint64_t> in(G), out(G), first(G);
        for (std::size_t s = 0; s < G; ++s) {
          if (ranks[s].empty()) continue;
          for (std::size_t t = 0; t < ranks[s].back().token_end; ++t) {
            const std::size_t o = token_owner(ranks, t);
            REQUIRE(o < G);
            if (o == s) continue;
            ++in[s];
            ++out[o];
            if (t < ranks[s].front().token_begin) ++first[s];
          }
        }
        for (std::size_t s = 0; s < G; ++s) {
          INFO("rank " << s);
          CHECK(rows[s].rows_in == in[s]);
          CHECK(rows[s].rows_out == out[s]);
          CHECK(rows[s].rows_first == first[s]);
          CHECK(rows[s].chunks == ranks[s].size());
          if (layout == ShardLayout::contiguous && !ranks[s].empty())
            CHECK(rows[s].rows_in == keys_visible_causal_bytes(shard_sequence(g, G)[s], 1, 1));
        }
      }
    }
  }
  CHECK(parse_shard_layout("zigzag") == ShardLayout::zigzag);
  CHECK(parse_shard_layout("contiguous") == ShardLayout::contiguous);
  CHECK_THROWS_WITH(parse_shard_layout("ring"), Catch::Contains("'ring'") && Catch::Contains("hint"));
}

TEST_CASE("stream shards: zigzag moves more key rows in all, its first chunks wait for less", "[stream][shards]") {
  // T a multiple of 2G·64: chunk = T/2G. Contiguous: rank g receives g shards (G − 1 at most);
  // zigzag: rank g every chunk before 2G − 1 − g but its own, 2G − 2 − g chunks, its first g.
  const std::size_t G = 4, chunk = 64 * 10, T = 2 * G * chunk;
  const Geometry g{T, 64, 64};
  const auto ct = layout_exchange_rows(g, G, ShardLayout::contiguous);
  const auto zz = layout_exchange_rows(g, G, ShardLayout::zigzag);
  std::uint64_t ct_total = 0, zz_total = 0;
  for (std::size_t s = 0; s < G; ++s) {
    INFO("rank " << s);
    CHECK(ct[s].rows_in == s * 2 * chunk);
    CHECK(ct[s].rows_first == ct[s].rows_in);
    CHECK(zz[s].rows_in == (2 * G - 2 - s) * chunk);
    CHECK(zz[s].rows_first == s * chunk);
    CHECK(zz[s].q_blocks == ct[s].q_blocks);
    ct_total += ct[s].rows_in;
    zz_total += zz[s].rows_in;
  }
  CHECK(ct_total == 12 * chunk);
  CHECK(zz_total == 18 * chunk);
}

TEST_CASE("stream shards: keys_visible's bytes from I under the zigzag layout", "[stream][shards]") {
  // Every remote key row before the rank's last chunk (K) and V of the remote blocks its rows of I
  // keep, against a token-by-token count, on ragged T and with ties.
  for (const Geometry g : {Geometry{3000, 64, 64}, Geometry{4097, 64, 64}}) {
    for (const bool ints : {false, true}) {
      const std::size_t d = 8, k = 4;
      const auto Q = ints ? random_int_mat<double>(g.T, d, 31) : random_mat<double>(g.T, d, 31);
      const auto K = ints ? random_int_mat<double>(g.T, d, 32) : random_mat<double>(g.T, d, 32);
      const auto I = stream_estimate(Q, K, BlockMask(g), EstimateParams{k, 1}).indices;
      for (std::size_t G : {1, 2, 3, 4})
      for (std::size_t folds : {1, 2, 3}) {
        INFO("T " << g.T << " G " << G << " folds " << folds << (ints ? " ties" : ""));
        const auto ranks = shard_layout(g, G, ShardLayout::zigzag, folds);
        const auto counted = keys_visible_causal_traffic(g, G, I, k, d, 2, ShardLayout::zigzag, folds);
        const auto rows = layout_exchange_rows(g, G, ShardLayout::zigzag, folds);
        std::vector<std::uint64_t> apply_in(G), apply_out(G), est_out(G);
        for (std::size_t s = 0; s < G; ++s) {
          std::vector<bool> kept(g.n_k());
          for (const RankShard& c : ranks[s])
            for (std::size_t i = c.q_begin * k; i < c.q_end * k; ++i)
              if (I[i] >= 0) kept[std::size_t(I[i])] = true;
          for (std::size_t r = 0; r < g.n_k(); ++r) {
            const std::size_t o = token_owner(ranks, r * g.bk);
            if (!kept[r] || o == s) continue;
            apply_in[s] += g.k_rows(r) * d * 2;
            apply_out[o] += g.k_rows(r) * d * 2;
          }
        }
        for (std::size_t s = 0; s < G; ++s) {
          INFO("rank " << s);
          CHECK(counted[s].estimate_in == rows[s].rows_in * d * 2);
          CHECK(counted[s].estimate_out == rows[s].rows_out * d * 2);
          CHECK(counted[s].apply_in == apply_in[s]);
          CHECK(counted[s].apply_out == apply_out[s]);
        }
      }
    }
  }
}

TEST_CASE("stream shards: folded zigzag deals every fold as zigzag and sends its transfers in tiers", "[stream][shards]") {
  for (const Geometry g : {Geometry{3000, 64, 64}, Geometry{4097, 64, 64}, Geometry{1000, 32, 48}, Geometry{64, 64, 64},
                           Geometry{9000, 64, 64}}) {
    for (std::size_t G : {1, 2, 3, 4, 8})
      for (std::size_t folds : {1, 2, 3, 4}) {
        INFO("T " << g.T << " G " << G << " folds " << folds);
        const auto ranks = shard_layout(g, G, ShardLayout::zigzag, folds);
        REQUIRE(ranks.size() == G);
        // Every query block in exactly one chunk; chunks in token order per rank.
        std::vector<int> seen(g.n_q());
        for (const auto& r : ranks) {
          CHECK(r.size() <= (G == 1 ? 1u : 2 * folds));
          for (std::size_t i = 0; i < r.size(); ++i) {
            if (i > 0) CHECK(r[i].token_begin >= r[i - 1].token_end);
            for (std::size_t q = r[i].q_begin; q < r[i].q_end; ++q) ++seen[q];
          }
        }
        CHECK(std::count(seen.begin(), seen.end(), 1) == std::ptrdiff_t(g.n_q()));
        if (G == 1) CHECK(ranks == shard_layout(g, 1, ShardLayout::contiguous));
        // Against the 2·folds·G-way contiguous sharding: fold p deals chunks 2G·p + s and 2G·p + 2G − 1 − s to rank s.
        const auto chunks = shard_sequence(g, 2 * folds * G);
        for (std::size_t s = 0; s < G && G > 1; ++s) {
          std::vector<RankShard> want;
          for (std::size_t p = 0; p < folds; ++p)
            for (const std::size_t c : {2 * G * p + s, 2 * G * p + 2 * G - 1 - s})
              if (chunks[c].token_end > chunks[c].token_begin) want.push_back(chunks[c]);
          CHECK(ranks[s] == want);
        }
        // The transfers: token by token, every remote row before a rank's chunk i arrives in a
        // tier ≤ i, nothing else arrives, and the tier is the first chunk that needs it.
        const auto rows = layout_exchange_rows(g, G, ShardLayout::zigzag, folds);
        const auto moves = layout_transfers(g, G, ShardLayout::zigzag, folds);
        std::vector<std::vector<std::size_t>> tier_of(G, std::vector<std::size_t>(g.T, SIZE_MAX));
        std::vector<std::size_t> owner(g.T);
        for (std::size_t x = 0; x < g.T; ++x) owner[x] = token_owner(ranks, x);
        std::vector<std::uint64_t> in(G), first(G), out(G);
        for (std::size_t m = 0; m < moves.size(); ++m) {
          const ChunkTransfer& t = moves[m];
          REQUIRE(t.src < G);
          REQUIRE(t.dst < G);
          CHECK(t.src != t.dst);
          CHECK(std::count(ranks[t.src].begin(), ranks[t.src].end(), t.chunk) == 1);
          if (m > 0) {  // one global order: token order, then receiving rank
            const ChunkTransfer& p = moves[m - 1];
            CHECK((p.chunk.token_begin < t.chunk.token_begin || (p.chunk == t.chunk && p.dst < t.dst)));
          }
          const auto& mine = ranks[t.dst];
          REQUIRE(t.tier < mine.size());
          CHECK(mine[t.tier].token_begin >= t.chunk.token_end);
          if (t.tier > 0) CHECK(mine[t.tier - 1].token_begin < t.chunk.token_end);
          std::size_t twice = 0;  // rows this rank already received
          for (std::size_t x = t.chunk.token_begin; x < t.chunk.token_end; ++x) {
            twice += tier_of[t.dst][x] != SIZE_MAX;
            tier_of[t.dst][x] = t.tier;
          }
          CHECK(twice == 0);
          const std::uint64_t n = t.chunk.token_end - t.chunk.token_begin;
          in[t.dst] += n;
          out[t.src] += n;
          if (t.tier == 0) first[t.dst] += n;
        }
        for (std::size_t s = 0; s < G; ++s) {
          INFO("rank " << s);
          CHECK(rows[s].rows_in == in[s]);
          CHECK(rows[s].rows_out == out[s]);
          CHECK(rows[s].rows_first == first[s]);
          for (std::size_t i = 0; i < ranks[s].size(); ++i) {
            std::size_t missing = 0;
            for (std::size_t x = 0; x < ranks[s][i].token_begin; ++x)
              if (owner[x] != s && tier_of[s][x] > i) ++missing;
            CHECK(missing == 0);
          }
        }
      }
  }
  // Contiguous: one chunk per rank, every transfer in tier 0 (all the chunk waits for).
  const Geometry g{4097, 64, 64};
  for (const ChunkTransfer& t : layout_transfers(g, 4, ShardLayout::contiguous)) {
    CHECK(t.tier == 0);
    CHECK(t.src < t.dst);
  }
  CHECK_THROWS_WITH(shard_layout(g, 2, ShardLayout::zigzag, 0), Catch::Contains("folds must be at least 1"));
  CHECK_THROWS_WITH(shard_layout(g, 2, ShardLayout::contiguous, 2), Catch::Contains("zigzag layout only"));
  CHECK_THROWS_WITH(layout_transfers(g, 2, ShardLayout::contiguous, 2), Catch::Contains("hint"));
}
