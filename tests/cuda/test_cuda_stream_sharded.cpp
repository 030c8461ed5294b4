// GPU tests of STREAM with the sequence sharded over G GPUs (flashlab/cuda/stream_sharded.hpp): I
// and its scores bitwise the single-GPU fast estimate's, O bitwise the single-GPU fast apply's on
// the same I, on random N(0, 1) and small-integer (tied) inputs, T not a multiple of 64 nor of the
// shard size, d = 64 and 128, H = 1 and 2, G = 2 (3 and 4 where the machine has 4 GPUs), ranks that
// hold no query block; each under the contiguous layout, the zigzag layout, zigzag with the K
// exchange in pieces (tiers), folded zigzag (2, 3, 4, 8 folds) and with the chunks on streams of their
// own (overlap; at 8 folds more chunks than streams), and with the rows moved by the copy engines instead
// of NCCL; each run's timeline in the order its waits impose; the refusals. Every K and V row a rank does not hold is poisoned with NaN
// before the run, so a row the exchange missed shows as a difference (or a NaN output).
// Own executable (CTest label gpu): it needs at least 2 GPUs and says SKIPPED (exit 77) with fewer.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "flashlab/cuda/context_parallel.hpp"
#include "flashlab/cuda/dtype16.hpp"
#include "flashlab/cuda/options.hpp"
#include "flashlab/cuda/stream_fast_estimate.hpp"
#include "flashlab/cuda/stream_sharded.hpp"

#include "gpu_test_util.hpp"
#include "multi_gpu_test.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <string>

namespace fc = flashlab::cuda;
namespace gs = flashlab::cuda::stream;
namespace rs = flashlab::ref::stream;
using flashlab::test::fresh_seed;

namespace {

using flashlab::test::device_count;
using flashlab::test::ring_of;

std::vector<int> ring_sizes() {
  std::vector<int> out{2};
  if (device_count() >= 4) out.insert(out.end(), {3, 4});
  return out;
}

/// bf16 bits of T·H·d values: N(0, 1), or integers in [−lo, lo] (exact scores, many ties).
std::vector<std::uint16_t> inputs(std::size_t n, std::mt19937_64& rng, int lo) {
  std::vector<std::uint16_t> x(n);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_int_distribution<int> ints(-lo, lo);
  for (auto& v : x) v = fc::float_to_bf16(lo > 0 ? float(ints(rng)) : normal(rng));
  return x;
}

bool has_nan(const std::vector<std::uint16_t>& bf16) {
  for (auto v : bf16)
    if (std::isnan(fc::bf16_to_float(v))) return true;
  return false;
}

/// The layouts, exchange orders, folds and schedules every sharded check runs under.
struct Variant {
  rs::ShardLayout layout;
  bool pieces;
  std::size_t folds;
  bool overlap;
  bool copy = false;  ///< the exchange by copy engines
};
constexpr Variant kVariants[] = {
    {rs::ShardLayout::contiguous, false, 1, false}, {rs::ShardLayout::zigzag, false, 1, false},
    {rs::ShardLayout::zigzag, true, 1, false},      {rs::ShardLayout::contiguous, false, 1, true},
    {rs::ShardLayout::zigzag, false, 1, true},      {rs::ShardLayout::zigzag, true, 2, true},
    {rs::ShardLayout::zigzag, true, 3, false},      {rs::ShardLayout::zigzag, true, 4, true},
    {rs::ShardLayout::contiguous, false, 1, false, true}, {rs::ShardLayout::zigzag, true, 2, true, true},
    {rs::ShardLayout::zigzag, true, 3, false, true},      {rs::ShardLayout::zigzag, true, 4, true, true},
    {rs::ShardLayout::zigzag, true, 8, true, true}};  // the defaults: more chunks than compute streams

std::string name(const Variant& x) {
  return std::string(rs::shard_layout_name(x.layout)) + (x.pieces ? " pieces" : " whole") + " folds " +
         std::to_string(x.folds) + (x.overlap ? " overlap" : " serial") + (x.copy ? " copy engines" : " nccl");
}

gs::ShardedStreamProblem problem(std::size_t T, std::size_t H, std::size_t d, std::size_t k, const Variant& x) {
  gs::ShardedStreamProblem p{T, H, d, k, x.layout, x.pieces};
  p.folds = x.folds;
  p.overlap = x.overlap;
  p.copy_engines = x.copy;
  return p;
}

/// The sharded run against the single-GPU entries on the same inputs: I and scores, then O.
void check_against_one_gpu(std::size_t T, std::size_t H, std::size_t d, std::size_t k, int lo, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto Q = inputs(T * H * d, rng, lo), K = inputs(T * H * d, rng, lo), V = inputs(T * H * d, rng, lo);
  const gs::HostHeads16 q{Q.data(), H, d}, kk{K.data(), H, d}, v{V.data(), H, d};
  const rs::BlockMask mask(rs::Geometry{T, 64, 64});
  const gs::EstimateOutput one = gs::stream_fast_estimate(q, kk, mask, k);
  const auto O_one = gs::stream_fast_apply(flashlab::ref::Dtype::bf16, q, kk, v, mask, one.indices, k, 1);
  REQUIRE_FALSE(has_nan(O_one));
  for (const int G : ring_sizes())
    for (const Variant& x : kVariants) {
      INFO("T=" << T << " H=" << H << " d=" << d << " k=" << k << (lo > 0 ? " integers" : " normal") << " G=" << G
                << " " << name(x));
      const gs::ShardedStreamOutput out = gs::stream_sharded_host(problem(T, H, d, k, x), ring_of(G), q, kk, v);
      std::size_t bad = 0;
      for (std::size_t i = 0; i < one.indices.size(); ++i)
        if (out.indices[i] != one.indices[i] || std::memcmp(&out.scores[i], &one.scores[i], sizeof(float)) != 0)
          if (bad++ < 3)
            UNSCOPED_INFO("row " << i / k << " slot " << i % k << ": sharded " << out.indices[i] << " (" << out.scores[i]
                                 << "), one GPU " << one.indices[i] << " (" << one.scores[i] << ")");
      CHECK(bad == 0);
      CHECK(out.indices == one.indices);
      CHECK_FALSE(has_nan(out.O));
      CHECK(out.O == O_one);  // bitwise: the same kernel on the same rows of I, Q, K, V
    }
}

}  // namespace

TEST_CASE("cuda stream sharded: I and O bitwise one GPU's on random and tied inputs", "[gpu][stream-gpus]") {
  const auto seed = fresh_seed();
  INFO("seed " << seed);
  struct Case { std::size_t T, H, d, k; int lo; };
  // Ragged T everywhere but one; 4097 leaves a one-token last block; 64 and 1 leave ranks without
  // query blocks; integers in [−1, 1] make many equal block maxima (τ's r rule decides them).
  const Case cases[] = {{1000, 1, 64, 4, 0},   {4097, 1, 128, 16, 1}, {20000, 1, 128, 16, 0}, {20000, 1, 64, 8, 1},
                        {65536, 1, 128, 16, 0}, {70001, 1, 64, 16, 2}, {9000, 2, 128, 8, 0},  {64, 1, 64, 2, 1},
                        {1, 1, 128, 1, 0},     {3000, 1, 64, 128, 1}};
  std::uint64_t s = seed;
  for (const Case& c : cases) check_against_one_gpu(c.T, c.H, c.d, c.k, c.lo, s++);
}

TEST_CASE("cuda stream sharded: the bytes handed to NCCL and the model's", "[gpu][stream-gpus]") {
  // keys_visible moves every remote K row before the rank's last chunk; this implementation every
  // such V row too, which is at least the model's V of the kept blocks.
  const std::size_t T = 20000, d = 64, k = 8;
  std::mt19937_64 rng(7);
  const auto Q = inputs(T * d, rng, 0), K = inputs(T * d, rng, 0), V = inputs(T * d, rng, 0);
  const rs::Geometry geo{T, 64, 64};
  for (const int G : ring_sizes())
    for (const Variant& x : kVariants) {
      INFO("G=" << G << " " << name(x));
      const gs::ShardedStreamProblem p = problem(T, 1, d, k, x);
      const gs::ShardedStreamOutput out =
          gs::stream_sharded_host(p, ring_of(G), {Q.data(), 1, d}, {K.data(), 1, d}, {V.data(), 1, d});
      const auto bytes = gs::sharded_bytes(p, std::size_t(G), out.indices);
      const auto shards = gs::fast_stream_shards(T, std::size_t(G));
      const auto rows = rs::layout_exchange_rows(geo, std::size_t(G), x.layout, x.folds);
      std::uint64_t sent = 0, received = 0;
      for (std::size_t g = 0; g < bytes.size(); ++g) {
        INFO("rank " << g);
        CHECK(bytes[g].received == 2 * rows[g].rows_in * d * 2);
        if (x.layout == rs::ShardLayout::contiguous)
          CHECK(bytes[g].received == 2 * rs::keys_visible_causal_bytes(shards[g], d, 2));
        CHECK(bytes[g].model_received >= rows[g].rows_in * d * 2);
        CHECK(bytes[g].received >= bytes[g].model_received);
        CHECK(bytes[g].sent >= bytes[g].model_sent);
        sent += bytes[g].sent;
        received += bytes[g].received;
      }
      CHECK(sent == received);
      if (x.layout == rs::ShardLayout::contiguous) {
        CHECK(bytes.front().received == 0);
        CHECK(bytes.back().sent == 0);
      } else {  // zigzag: rank 0 holds the last chunk, so it receives every row it does not hold
        // The layout held by name: a range-for over an element of the returned temporary would
        // read it after its destruction.
        const auto layout = rs::shard_layout(geo, std::size_t(G), x.layout, x.folds);
        std::size_t own = 0;
        for (const auto& c : layout[0]) own += c.token_end - c.token_begin;
        CHECK(bytes.front().received == 2 * (T - own) * d * 2);
      }
    }
}

TEST_CASE("cuda stream sharded: each run's timeline keeps the order its waits impose", "[gpu][stream-gpus]") {
  // A chunk's estimate after the K group it needs, its apply after its estimate and after V: what the
  // enqueue (one host thread per rank with the copy engines) must keep, read from the run's events.
  const std::size_t T = 20000;
  const rs::Geometry geo{T, 64, 64};
  constexpr float kTick = 1e-3f;  // ms: two events recorded in order may read equal
  for (const int G : ring_sizes())
    for (const Variant& x : kVariants) {
      INFO("G=" << G << " " << name(x));
      const gs::ShardedStreamProblem p = problem(T, 1, 64, 8, x);
      const gs::ShardedBenchRow row = gs::bench_stream_sharded(p, ring_of(G), 1, 0, 11);
      const auto layout = rs::shard_layout(geo, std::size_t(G), x.layout, x.folds);
      const auto transfers = rs::layout_transfers(geo, std::size_t(G), x.layout, x.folds);
      REQUIRE(row.ranks.size() == std::size_t(G));
      for (std::size_t g = 0; g < row.ranks.size(); ++g) {
        INFO("rank " << g);
        const gs::ShardedRankTimes& t = row.ranks[g];
        REQUIRE(t.chunk_spans.size() == layout[g].size());
        bool receives = false;
        for (const auto& tr : transfers) receives = receives || tr.dst == g;
        CHECK(t.k_group_landed_ms.empty() == !receives);
        for (std::size_t i = 1; i < t.k_group_landed_ms.size(); ++i)
          CHECK(t.k_group_landed_ms[i] >= t.k_group_landed_ms[i - 1] - kTick);
        float last = 0.f;
        for (std::size_t c = 0; c < t.chunk_spans.size(); ++c) {
          INFO("chunk " << c);
          const auto& span = t.chunk_spans[c];
          CHECK(span.estimate_begin >= 0.f);
          CHECK(span.estimate_end >= span.estimate_begin - kTick);
          CHECK(span.apply_begin >= span.estimate_end - kTick);
          CHECK(span.apply_end >= span.apply_begin - kTick);
          last = std::max(last, span.apply_end);
          // The K group chunk c waits for: with pieces tier c's (when some row of tiers 0 … c comes in),
          // else the one group (when the rank receives any row).
          bool waits = false;
          for (const auto& tr : transfers) waits = waits || (tr.dst == g && (!x.pieces || tr.tier <= c));
          if (waits) CHECK(span.estimate_begin >= t.k_group_landed_ms[x.pieces ? c : 0] - kTick);
          if (receives) CHECK(span.apply_begin >= t.v_exchange_ms - kTick);
        }
        CHECK(std::abs(t.total_ms - last) <= kTick);
      }
    }
}

TEST_CASE("cuda stream sharded: refusals", "[gpu][stream-gpus]") {
  const auto& ring = ring_of(2);
  CHECK_THROWS_AS(gs::ShardedStream({1000, 1, 96, 8}, ring), rs::StreamError);
  CHECK_THROWS_AS(gs::ShardedStream({1000, 1, 64, 0}, ring), rs::StreamError);
  CHECK_THROWS_AS(gs::ShardedStream({1000, 1, 64, 129}, ring), rs::StreamError);
  CHECK_THROWS_WITH(gs::ShardedStream(problem(1000, 1, 64, 8, {rs::ShardLayout::contiguous, false, 2, false}), ring),
                    Catch::Contains("zigzag layout only"));
  gs::ShardedStream run({1000, 1, 64, 8}, ring);
  CHECK_THROWS_WITH(run.run({}), Catch::Contains("buffer sets for 2 ranks"));
  CHECK_THROWS_WITH(run.run(std::vector<gs::ShardedStreamBuffers>(2)), Catch::Contains("lacks a Q, K, V, I or O"));
  // The range entries: a range past n_q, an empty one, a user mask.
  const rs::Geometry g{1000, 64, 64};
  int dummy = 0;
  void* p = &dummy;
  auto* I = reinterpret_cast<long long*>(p);
  CHECK_THROWS_WITH(gs::stream_fast_estimate_shard_device(rs::BlockMask(g), 1, 64, 4, {16, 0}, p, p, I, nullptr,
                                                          nullptr),
                    Catch::Contains("query-block range starts"));
  CHECK_THROWS_WITH(gs::stream_fast_estimate_shard_device(rs::BlockMask(g), 1, 64, 4, {10, 7}, p, p, I, nullptr,
                                                          nullptr),
                    Catch::Contains("runs past n_q"));
  std::vector<std::uint8_t> user(g.n_q() * g.n_k(), 1);
  CHECK_THROWS_WITH(gs::stream_fast_estimate_shard_device(rs::BlockMask(g, user), 1, 64, 4, {0, 4}, p, p, I, nullptr,
                                                          nullptr),
                    Catch::Contains("causal-only"));
  CHECK_THROWS_WITH(gs::stream_fast_apply_shard_device({1000, 1, 64, 4, flashlab::ref::Dtype::bf16, 1}, {3, 14}, p, p,
                                                       p, reinterpret_cast<const std::int64_t*>(p), p),
                    Catch::Contains("runs past n_q"));
}

int main(int argc, char* argv[]) {
  return flashlab::test::multi_gpu_test_main("test_cuda_stream_sharded", "2 or 4", argc, argv);
}
