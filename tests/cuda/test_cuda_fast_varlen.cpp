// The fast forwards on packed variable-length sequences (FlashAttention's varlen layout: Q, O
// [1, total_q, H, d], K, V [1, total_k, H_kv, d], LSE [1, H, total_q], prefix sums cu_seqlens_q
// and cu_seqlens_k) against the float64 reference flashlab::ref::naive_forward<double>, which
// runs every sequence with its own lengths and mask (attention_problem.hpp), on both kernels that
// take them: mma_sync (attention_fwd_tc.cu) and tma_ws (attention_fwd_ws.cu) where it runs.
//
// Inputs, metric and the check: fast_forward_check.hpp (O within 2× the rounding floor, LSE within
// 1e-4; rows that see no key O = 0 exactly and LSE = −inf, their number also counted from the
// rule; the host wrapper poisons O and LSE with NaN, so a row no unit writes fails).
// Shapes: ragged lengths with length-1 sequences, sequences without queries, sequences without keys
// (every row O = 0), lengths that are and are not multiples of the tiles (64, 128, 192), N_k ≠ N per
// sequence (causal rows above the diagonal's start), causal and not, windows, grouped K/V with
// groups of 4 and 32, d = 64 and 128, bf16 and fp16, work lists longer than the GPU (tma-ws blocks
// walking units of unequal lengths, units without keys anywhere in the list). Causal tma-ws lists
// with fewer than 8 units in flight per K/V head run in stripes over all sequences (attention_fwd_ws.cu,
// WsSchedule::striped_unit, rows aligned to each sequence's keys): the ragged, N_k ≠ N, grouped,
// chunked-prefill and long cases below take them. The entry on device
// memory: a packed problem without its device lists, a null or misaligned list, totals that
// differ from the problem's lists and a kernel without packed sequences are refused by name. Tags: [fast][fast-varlen]; small shapes also
// [fast-varlen-sanitize] for compute-sanitizer.
#include <catch2/catch.hpp>

#include "fast_forward_check.hpp"
#include "varlen_case.hpp"

#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace fc = flashlab::cuda;
namespace fr = flashlab::ref;

namespace {

constexpr fr::Dtype kBf16 = fr::Dtype::bf16, kFp16 = fr::Dtype::fp16;

using flashlab::test::lengths_str;
using flashlab::test::prefix_sums;
using flashlab::test::VarlenCase;

/// The kernels that take packed sequences: mma_sync everywhere, tma_ws where it is built and runs.
std::vector<fc::FastForwardKernel> kernels() {
  std::vector<fc::FastForwardKernel> k = {fc::FastForwardKernel::mma_sync};
  if (fc::fastest_forward_kernel() == fc::FastForwardKernel::tma_ws) k.push_back(fc::FastForwardKernel::tma_ws);
  else WARN("tma-ws forward not in this build or not on this device: mma_sync only");
  return k;
}

void check_varlen(const VarlenCase& c, const std::vector<fc::FastForwardKernel>& on) {
  // The dense check's problem (heads, mask, dtype), its B, N and N_k then from the sequences.
  fr::AttentionProblem cfg = flashlab::test::forward_problem(
      {1, 1, 1, c.heads, c.heads_kv, c.head_dim, c.causal, c.dtype, c.window_left, c.window_right});
  const std::vector<int>& len_k = c.len_k.empty() ? c.len_q : c.len_k;
  cfg.set_packed(fr::PackedSequences(prefix_sums(c.len_q), prefix_sums(len_k)));
  const bool window = c.window_left >= 0 || c.window_right >= 0;
  const std::string shape = std::string(c.dtype == kBf16 ? "bf16" : "fp16") + " len_q=" + lengths_str(c.len_q) +
                            " len_k=" + lengths_str(len_k) + " H=" + std::to_string(c.heads) +
                            " H_kv=" + std::to_string(c.heads_kv) + " d=" + std::to_string(c.head_dim) +
                            (c.causal ? " causal" : "") +
                            (window ? " window=" + std::to_string(c.window_left) + "," + std::to_string(c.window_right)
                                    : "");
  flashlab::test::check_forward_problem(cfg, shape, on);
}

void report(const char* name) { flashlab::test::report_worst_ratio(name); }

/// `count` elements of T in device memory, freed on scope exit.
template <typename T>
struct DeviceArray {
  T* p = nullptr;
  explicit DeviceArray(std::size_t count) {
    const cudaError_t err = cudaMalloc(reinterpret_cast<void**>(&p), count * sizeof(T));
    if (err != cudaSuccess) FAIL("cudaMalloc: " << cudaGetErrorString(err));
  }
  ~DeviceArray() { cudaFree(p); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get() const { return p; }
};

}  // namespace

// Small shapes for compute-sanitizer (memcheck, racecheck): a length-1 sequence, one without
// queries, one without keys, ragged ends inside a tile, rows above the diagonal's start, a window,
// grouped K/V, both head dims and kernels; the striped causal list (tma-ws: fewer than 8 units in
// flight per K/V head, 5 sequences × 4 heads, stripes of 2 tiles).
TEST_CASE("fast forward, packed sequences, sanitizer shapes", "[fast][fast-varlen][fast-varlen-sanitize]") {
  const auto on = kernels();
  check_varlen({{1, 130, 0, 77}, {}, 4, 2, 64, true}, on);
  check_varlen({{5, 200, 1, 90}, {300, 0, 70, 33}, 4, 1, 128, true}, on);
  check_varlen({{64, 3, 150}, {100, 129, 150}, 2, 2, 128, false, 20, 5}, on);
  check_varlen({{1, 130, 0, 77, 200}, {}, 4, 4, 128, true}, on);
  report("varlen sanitizer shapes");
}

TEST_CASE("fast forward, packed self-attention with ragged lengths equals the float64 reference",
          "[fast][fast-varlen]") {
  const auto on = kernels();
  for (int d : {64, 128})
    for (bool causal : {false, true}) {
      check_varlen({{1, 129, 0, 257, 613}, {}, 4, 4, d, causal}, on);          // lengths 1 and 0, ragged
      check_varlen({{128, 64, 192, 256, 1}, {}, 2, 2, d, causal}, on);         // whole tiles of 64, 128, 192
      check_varlen({{1, 1, 1, 1, 1, 1, 1, 1, 1}, {}, 3, 3, d, causal}, on);     // nine single tokens
      check_varlen({{1000}, {}, 2, 2, d, causal}, on);                         // one sequence
    }
  check_varlen({{1, 129, 0, 257, 613}, {}, 4, 4, 128, true, -1, -1, kFp16}, on);
  check_varlen({{333, 17, 700}, {}, 2, 2, 64, false, -1, -1, kFp16}, on);
  report("varlen self-attention");
}

TEST_CASE("fast forward, packed sequences with N_k != N per sequence and sequences without keys",
          "[fast][fast-varlen]") {
  const auto on = kernels();
  for (int d : {64, 128})
    for (bool causal : {false, true}) {
      // Decode-like rows (1 and 5 queries against long caches), a sequence without keys, and
      // causal rows above the diagonal's start (len_q > len_k: 300 queries, 77 keys).
      check_varlen({{1, 5, 200, 300, 64}, {1000, 517, 0, 77, 64}, 4, 4, d, causal}, on);
      // Every sequence without keys but one.
      check_varlen({{100, 7, 250}, {0, 0, 129}, 2, 2, d, causal}, on);
    }
  check_varlen({{1, 5, 200, 300}, {1000, 517, 0, 77}, 4, 4, 128, true, -1, -1, kFp16}, on);
  report("varlen cross");
}

TEST_CASE("fast forward, packed sequences with grouped K/V and windows", "[fast][fast-varlen]") {
  const auto on = kernels();
  for (int d : {64, 128}) {
    check_varlen({{300, 1, 77, 520}, {}, 32, 8, d, true}, on);                 // groups of 4
    check_varlen({{300, 1, 77, 520}, {400, 9, 77, 100}, 32, 1, d, false}, on);  // groups of 32 (one K/V head)
    check_varlen({{700, 65, 300}, {}, 8, 2, d, true, 128, 0}, on);             // causal sliding window
    check_varlen({{500, 200, 1}, {600, 100, 50}, 4, 4, d, false, 30, 17}, on);  // two-sided band, N_k ≠ N
    check_varlen({{400, 129}, {100, 600}, 4, 1, d, false, 10, 5}, on);         // rows whose band misses every key
  }
  check_varlen({{700, 65, 300}, {}, 8, 2, 64, true, 128, 0, kFp16}, on);
  report("varlen gqa and windows");
}

TEST_CASE("fast forward, packed sequences on work lists longer than the GPU", "[fast][fast-varlen]") {
  const auto on = kernels();
  // 16 sequences of mixed lengths, 16 heads: 700 to 800 units of unequal lengths per launch;
  // sequences without keys and causal top tiles without keys in the middle of each block's list.
  const std::vector<int> lq = {500, 1, 233, 129, 700, 64, 0, 300, 111, 384, 5, 400, 77, 213, 600, 256};
  const std::vector<int> lk = {500, 9, 0, 129, 750, 300, 40, 100, 111, 384, 600, 0, 77, 260, 600, 100};
  for (int d : {64, 128})
    for (bool causal : {false, true}) {
      check_varlen({lq, {}, 16, 16, d, causal}, on);
      check_varlen({lq, lk, 16, 4, d, causal}, on);
    }
  check_varlen({lq, lk, 16, 2, 128, true, 256, 0}, on);
  // Causal with few units per K/V head: the striped list (WsSchedule::striped_unit) up to 32
  // sequences (groups of 4: stripes of 2 tile rows, 32 entries each, that every block's lookups walk
  // on through); beyond, 40 sequences on the packed numbering's order (launch_ws_one). Lengths 0 to
  // 600, every fifth one empty.
  std::vector<int> many(40);
  for (int i = 0; i < 40; ++i) many[i] = i % 5 == 0 ? 0 : (i * 37) % 600 + 1;
  check_varlen({std::vector<int>(many.begin(), many.begin() + 32), {}, 8, 2, 64, true}, on);
  check_varlen({many, {}, 8, 2, 128, true}, on);
  // Chunked prefill: chunks of queries after prefixes of keys, striped by each tile's row aligned to
  // its keys (m + ⌊(len_k − len_q)/Br⌋), not by m.
  const std::vector<int> chunk_q = {256, 300, 129, 256, 1, 200, 64};
  const std::vector<int> chunk_k = {2300, 1500, 129, 4000, 777, 200, 1000};
  for (int d : {64, 128}) check_varlen({chunk_q, chunk_k, 8, 2, d, true}, on);
  report("varlen long");
}

TEST_CASE("fast forward, packed keys of mean length >= 3072 (tma-ws: Bc = 192 at d = 128 without a mask)",
          "[fast][fast-varlen]") {
  const auto on = kernels();
  // total_k / B ≥ 3072: the tma-ws forward's key tiles of 192 (fwd_ws_config.hpp); lengths that are
  // not multiples of 192 (each sequence's own ragged last tile), a sequence without queries, a
  // one-query row, grouped K/V.
  check_varlen({{64, 1, 300, 0}, {4000, 3500, 5000, 100}, 4, 4, 128, false}, on);
  check_varlen({{64, 1, 300, 0}, {4000, 3500, 5000, 100}, 4, 2, 128, false, -1, -1, kFp16}, on);
  check_varlen({{3100}, {}, 2, 1, 128, false}, on);
  report("varlen wide key tiles");
}

TEST_CASE("fast forward, packed sequences on the compacted work list (tma-ws: d = 64 without a mask, B <= 16)",
          "[fast][fast-varlen]") {
  const auto on = kernels();
  // Three consumer warpgroups (at least 2.5 rounds of 192-row units on 132 SMs: 10 tiles x 40 heads)
  // and at most 16 sequences: the compacted list (fwd_ws_config.hpp, ws_compact_packed), its spare
  // places at the end. A sequence without queries, one without keys, a one-query row, lengths that
  // are not multiples of 192 or 128, grouped K/V; then self-attention in fp16; then lengths packed
  // shortest first with ties (the list runs the most keys first, ties in packed order).
  check_varlen({{400, 1, 0, 500, 77}, {450, 30, 200, 0, 77}, 40, 10, 64, false}, on);
  check_varlen({{193, 600, 1, 191}, {}, 48, 48, 64, false, -1, -1, kFp16}, on);
  check_varlen({{1, 77, 300, 300, 600, 0}, {}, 40, 40, 64, false}, on);
  report("varlen compacted list");
}

TEST_CASE("fast forward on device memory refuses packed calls it cannot run, by name", "[fast][fast-varlen]") {
  fr::AttentionProblem cfg;
  cfg.heads = 2;
  cfg.head_dim = 64;
  cfg.dtype = kBf16;
  cfg.set_packed(fr::PackedSequences(std::vector<std::int32_t>{0, 3, 10}));
  const std::size_t q_numel = 10 * 2 * 64;
  DeviceArray<std::uint16_t> q(q_numel), k(q_numel), v(q_numel), o(q_numel);
  DeviceArray<float> lse(2 * 10);
  DeviceArray<std::int32_t> cu(3);
  const fc::FastForwardKernel kernel = fc::FastForwardKernel::mma_sync;
  // The lists are device data: the dense overload refuses a packed problem, naming cu_seqlens.
  REQUIRE_THROWS_WITH(fc::fast_attention_forward_device(cfg, kernel, q.get(), k.get(), v.get(), o.get(), lse.get()),
                      Catch::Contains("cu_seqlens") && Catch::Contains("FastPackedSequences"));
  // A null or misaligned list.
  fc::FastPackedSequences packed{nullptr, cu.get(), 10, 10};
  REQUIRE_THROWS_WITH(
      fc::fast_attention_forward_device(cfg, packed, kernel, q.get(), k.get(), v.get(), o.get(), lse.get()),
      Catch::Contains("packed.cu_seqlens_q"));
  const auto* odd = reinterpret_cast<const std::int32_t*>(reinterpret_cast<const char*>(cu.get()) + 2);
  packed = {cu.get(), odd, 10, 10};
  REQUIRE_THROWS_WITH(
      fc::fast_attention_forward_device(cfg, packed, kernel, q.get(), k.get(), v.get(), o.get(), lse.get()),
      Catch::Contains("packed.cu_seqlens_k"));
  // Totals that differ from the problem's own lists.
  packed = {cu.get(), cu.get(), 11, 10};
  REQUIRE_THROWS_WITH(
      fc::fast_attention_forward_device(cfg, packed, kernel, q.get(), k.get(), v.get(), o.get(), lse.get()),
      Catch::Contains("packed.total_q = 11") && Catch::Contains("cu_seqlens_q"));
  // Kernels without packed sequences.
  packed = {cu.get(), cu.get(), 10, 10};
  REQUIRE_THROWS_WITH(fc::fast_attention_forward_device(cfg, packed, fc::FastForwardKernel::split_kv, q.get(), k.get(),
                                                        v.get(), o.get(), lse.get()),
                      Catch::Contains("cu_seqlens"));
}
