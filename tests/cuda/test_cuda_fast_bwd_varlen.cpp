// The fast atomic backward on packed variable-length sequences (FlashAttention's varlen layout:
// Q, O, dO, dQ [1, total_q, H, d], K, V, dK, dV [1, total_k, H_kv, d], LSE, D [1, H, total_q], the
// prefix sums cu_seqlens_q and cu_seqlens_k) against the float64 reference
// flashlab::ref::naive_backward<double>, which runs every sequence with its own lengths and mask
// (attention_problem.hpp), on the kernels that take them: every case on mma_sync
// (attention_bwd_tc_atomic.cu), where it runs (sm_90a built, an sm_90 device) on wgmma_ws
// (attention_bwd_ws.cu), and on the two-kernel design (attention_bwd_tc.cu), run twice, its dQ, dK,
// dV required to be the same bits (it has no atomics); each printed line names its kernel.
//
// Inputs: fresh normal Q, K, V, dO rounded to the dtype (the reference gets the rounded values); O
// and LSE from the packed mma forward of the same problem. Metric and bound as the other backward
// tests (fast_backward_check.hpp): max|got − ref| / max|ref| per gradient within max(1e-2, 2 × the
// rounding floor of the float64 gradient), NaN failing; D within 1e-2. Rows that see no key of
// their sequence by the mask's rule (a sequence without keys, causal rows above the diagonal's
// start, a band past every key) must get dQ exactly 0, and keys no query of their sequence sees
// (a sequence without queries, keys past the band) dK = dV exactly 0; they are found from the rule,
// not from the reference's zeros. The host wrapper poisons every output and the workspace with NaN,
// so a row no block writes fails. Shapes: ragged lengths with length-0 and length-1 sequences,
// len_k ≠ len_q per sequence, causal and not, windows, grouped K/V (groups of 4 and 32), d = 64
// and 128, bf16 and fp16, lengths that are and are not multiples of the tiles, 151 sequences whose
// work items outnumber the SMs (the packed wgmma_ws blocks each run several), and the same lengths
// without a window and under one wider than every sequence (wgmma_ws: its plain or causal traits,
// then its band). The kernel without
// packed sequences refuses them by name (wgmma-ws-det). Tags: [fast-bwd][fast-bwd-varlen]; small
// shapes also [fast-bwd-varlen-sanitize] for compute-sanitizer.
#include <catch2/catch.hpp>

#include "fast_backward_check.hpp"
#include "varlen_case.hpp"

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

namespace fc = flashlab::cuda;
namespace fr = flashlab::ref;
namespace ft = flashlab::test;

namespace {

constexpr fr::Dtype kBf16 = fr::Dtype::bf16, kFp16 = fr::Dtype::fp16;

using flashlab::test::lengths_str;
using flashlab::test::prefix_sums;
using flashlab::test::VarlenCase;

/// The kernels every case runs on: mma_sync, and wgmma_ws where it runs.
std::vector<fc::FastBackwardKernel> varlen_kernels() {
  std::vector<fc::FastBackwardKernel> kernels{fc::FastBackwardKernel::mma_sync};
  if (fc::fastest_backward_kernel() == fc::FastBackwardKernel::wgmma_ws)
    kernels.push_back(fc::FastBackwardKernel::wgmma_ws);
  return kernels;
}

/// The packed problem of case `c`.
fr::AttentionProblem packed_problem(const VarlenCase& c) {
  fr::AttentionProblem cfg = ft::attention_problem(fr::Shape{1, 1, std::size_t(c.heads), std::size_t(c.head_dim)},
                                                   c.causal, c.dtype);
  cfg.heads_kv = c.heads_kv == c.heads ? 0 : std::size_t(c.heads_kv);
  cfg.window_left = c.window_left;
  cfg.window_right = c.window_right;
  cfg.set_packed(fr::PackedSequences(prefix_sums(c.len_q), prefix_sums(c.len_k.empty() ? c.len_q : c.len_k)));
  return cfg;
}

void check_varlen_backward(const VarlenCase& c) {
  const unsigned long long seed = ft::fresh_seed();
  const fr::AttentionProblem cfg = packed_problem(c);
  const bool window = c.window_left >= 0 || c.window_right >= 0;
  const std::string label = std::string(c.dtype == kBf16 ? "bf16" : "fp16") + " len_q=" + lengths_str(c.len_q) +
                            " len_k=" + lengths_str(c.len_k.empty() ? c.len_q : c.len_k) +
                            " H=" + std::to_string(c.heads) + " H_kv=" + std::to_string(c.heads_kv) +
                            " d=" + std::to_string(c.head_dim) + (c.causal ? " causal" : "") +
                            (window ? " window=" + std::to_string(c.window_left) + "," + std::to_string(c.window_right)
                                    : std::string());
  INFO(label << " seed=" << seed << " (rerun with FLASHLAB_TEST_SEED)");
  const fr::Shape q = cfg.q_shape(), kv = cfg.kv_shape();
  const ft::BwdInputs in = ft::bwd_inputs(q, kv, seed, c.dtype);
  const auto ref = fr::naive_backward<double>(cfg, in.Qd, in.Kd, in.Vd, in.dOd);
  const auto fwd = fc::fast_attention_forward(cfg, fc::FastForwardKernel::mma_sync, in.Q, in.K, in.V);
  // The packed rows without a key and the packed keys without a query, by each sequence's rule.
  const std::size_t total_q = q.seq, total_k = kv.seq;
  std::vector<char> row_keyless(total_q), key_unseen(total_k, 1);
  for (std::size_t b = 0; b < cfg.batch; ++b) {
    const fr::SequenceSpan s = cfg.sequence(b);
    for (std::size_t i = 0; i < s.q_len; ++i) {
      const fr::KeyRange r = cfg.visible_keys(s, (long long)i);
      row_keyless[s.q_start + i] = r.empty();
      for (long long j = r.first; j < r.end; ++j) key_unseen[s.k_start + std::size_t(j)] = 0;
    }
  }
  const std::size_t q_row = std::size_t(c.heads) * c.head_dim, kv_row = std::size_t(c.heads_kv) * c.head_dim;
  auto run = [&](fr::Algorithm design, fc::FastBackwardKernel kernel) {
    const bool two_kernel = design == fr::Algorithm::bwd_two_kernel;
    INFO("design " << fr::algorithm_name(design) << ", kernel " << fc::to_string(kernel));
    const auto got = fc::fast_attention_backward(design, cfg, in.Q, in.K, in.V, fwd.O, in.dO, fwd.LSE, kernel);
    std::printf("  %-8s %-72s", two_kernel ? "two-kern" : fc::to_string(kernel), label.c_str());
    ft::check_gradient("dQ", got.dQ, ref.dQ, c.dtype, 1, int(total_q), q_row, row_keyless);
    ft::check_gradient("dK", got.dK, ref.dK, c.dtype, 1, int(total_k), kv_row, key_unseen);
    ft::check_gradient("dV", got.dV, ref.dV, c.dtype, 1, int(total_k), kv_row, key_unseen);
    const double eD = fr::max_error_vs_max(got.D.data(), ref.D_from_O.data(), got.D.size());
    std::printf("  D %.2e", eD);
    CHECK(eD <= 1e-2);
    if (two_kernel) {  // no atomics: a rerun (outputs poisoned again) gives the same bits
      const auto again = fc::fast_attention_backward(design, cfg, in.Q, in.K, in.V, fwd.O, in.dO, fwd.LSE, kernel);
      const std::size_t diff = ft::differing_bits(got.dQ, again.dQ) + ft::differing_bits(got.dK, again.dK) +
                               ft::differing_bits(got.dV, again.dV);
      std::printf("  rerun: %zu bits differ", diff);
      CHECK(diff == 0);
    }
    std::printf("\n");
  };
  for (const fc::FastBackwardKernel kernel : varlen_kernels()) run(fr::Algorithm::bwd_atomic, kernel);
  run(fr::Algorithm::bwd_two_kernel, fc::FastBackwardKernel::mma_sync);
}

/// `count` short sequences (1 … 11 queries, 1 … 13 keys, every 37th without queries), then one
/// of `tail_q` queries and `tail_k` keys, H = 4, H_kv = 2. With 150 of them: 306 (key tile, K/V
/// head) work items, more than a GPU has SMs, so each persistent block of the packed wgmma_ws
/// kernel runs several in a row (attention_bwd_ws.cu), of one step, of none and of several.
VarlenCase many_items(int count, int tail_q, int tail_k, int head_dim, bool causal) {
  VarlenCase c{{}, {}, 4, 2, head_dim, causal};
  for (int i = 0; i < count; ++i) {
    c.len_q.push_back(i % 37 == 5 ? 0 : 1 + 7 * i % 11);
    c.len_k.push_back(1 + 5 * i % 13);
  }
  c.len_q.push_back(tail_q);
  c.len_k.push_back(tail_k);
  return c;
}

}  // namespace

// Small shapes for compute-sanitizer (memcheck, racecheck): a length-1 sequence, one without
// queries, one without keys, ragged ends inside a tile, rows above the diagonal's start, a window,
// grouped K/V, both head dims, and more work items than SMs (persistent blocks running several).
TEST_CASE("fast backward, packed sequences, sanitizer shapes", "[fast-bwd][fast-bwd-varlen][fast-bwd-varlen-sanitize]") {
  check_varlen_backward({{1, 130, 0, 77}, {}, 4, 2, 64, true});
  check_varlen_backward({{5, 200, 1, 90}, {300, 0, 70, 33}, 4, 1, 128, true});
  check_varlen_backward({{64, 3, 150}, {100, 129, 150}, 2, 2, 128, false, 20, 5});
  check_varlen_backward({{2, 190, 1, 64}, {129, 64, 0, 1}, 4, 2, 64, false});  // no mask but the ends
  check_varlen_backward(many_items(150, 300, 330, 128, true));                   // several items a block
  ft::report_backward_ratio("varlen backward sanitizer shapes");
}

TEST_CASE("fast backward, packed self-attention with ragged lengths equals the float64 reference",
          "[fast-bwd][fast-bwd-varlen]") {
  for (int d : {64, 128})
    for (bool causal : {false, true}) {
      check_varlen_backward({{1, 129, 0, 257, 613}, {}, 4, 4, d, causal});   // lengths 1 and 0, ragged
      check_varlen_backward({{128, 64, 192, 256, 1}, {}, 2, 2, d, causal});  // whole tiles of 64 and 128
      check_varlen_backward({{1, 1, 1, 1, 1, 1, 1}, {}, 3, 3, d, causal});   // single tokens
    }
  check_varlen_backward({{1, 129, 0, 257, 613}, {}, 4, 4, 128, true, -1, -1, kFp16});
  check_varlen_backward({{333, 17, 700}, {}, 2, 2, 64, false, -1, -1, kFp16});
  ft::report_backward_ratio("varlen backward self-attention");
}

TEST_CASE("fast backward, packed sequences with len_k != len_q and sequences without keys or queries",
          "[fast-bwd][fast-bwd-varlen]") {
  for (int d : {64, 128})
    for (bool causal : {false, true}) {
      // Decode-like rows against long caches, a sequence without keys, causal rows above the
      // diagonal's start (300 queries, 77 keys), a sequence without queries (keys no query sees).
      check_varlen_backward({{1, 5, 200, 300, 0, 64}, {1000, 517, 0, 77, 90, 64}, 4, 4, d, causal});
      check_varlen_backward({{100, 7, 250}, {0, 0, 129}, 2, 2, d, causal});  // every sequence without keys but one
    }
  check_varlen_backward({{1, 5, 200, 300}, {1000, 517, 0, 77}, 4, 4, 128, true, -1, -1, kFp16});
  ft::report_backward_ratio("varlen backward cross");
}

TEST_CASE("fast backward, packed sequences with grouped K/V and windows", "[fast-bwd][fast-bwd-varlen]") {
  for (int d : {64, 128}) {
    check_varlen_backward({{300, 1, 77, 520}, {}, 16, 4, d, true});                 // groups of 4
    check_varlen_backward({{300, 1, 77, 520}, {400, 9, 77, 100}, 32, 1, d, false});  // groups of 32
    check_varlen_backward({{700, 65, 300}, {}, 8, 2, d, true, 128, 0});             // causal sliding window
    check_varlen_backward({{500, 200, 1}, {600, 100, 50}, 4, 4, d, false, 30, 17});  // two-sided band, len_k ≠ len_q
    check_varlen_backward({{400, 129}, {100, 600}, 4, 1, d, false, 10, 5});         // rows whose band misses every key
  }
  check_varlen_backward({{700, 65, 300}, {}, 8, 2, 64, true, 128, 0, kFp16});
  ft::report_backward_ratio("varlen backward gqa and windows");
}

// Without a window the packed wgmma_ws kernel runs the plain or causal traits (each sequence's
// diagonal at its own offset len_k − len_q), with one the band: the same lengths on both, with a
// window wider than every sequence (the band, masking nothing more), grouped K/V, sequences of
// several key and query tiles whose boxes run into the next sequence's rows, len_k below and above
// len_q in one launch (causal rows above the diagonal's start; keys before the first query's).
TEST_CASE("fast backward, packed sequences without a window and the same under an unbounding window",
          "[fast-bwd][fast-bwd-varlen]") {
  for (int d : {64, 128}) {
    for (bool causal : {false, true})
      check_varlen_backward({{640, 1, 383, 129, 256}, {300, 2, 900, 129, 256}, 4, 2, d, causal});
    check_varlen_backward({{640, 1, 383, 129, 256}, {300, 2, 900, 129, 256}, 4, 2, d, false, 1000, 1000});
    check_varlen_backward({{640, 1, 383, 129, 256}, {300, 2, 900, 129, 256}, 4, 2, d, true, 1000, 0});
  }
  ft::report_backward_ratio("varlen backward without a window");
}

TEST_CASE("packed sequences: the backward kernel without them refuses them by name",
          "[fast-bwd][fast-bwd-varlen]") {
  const fr::AttentionProblem cfg = packed_problem({{3, 7}, {}, 2, 2, 64, true});
  const std::size_t numel = cfg.q_shape().numel();
  const std::vector<std::uint16_t> x(numel, 0);
  const std::vector<float> lse(cfg.stat_numel(), 0.f);
  // The two-kernel design takes them: its workspace is D alone, H·total_q floats.
  CHECK(fc::fast_attention_backward_workspace_bytes(fr::Algorithm::bwd_two_kernel, cfg) == 2 * 10 * sizeof(float));
  const auto det = fc::FastBackwardKernel::wgmma_ws_deterministic;
  REQUIRE_THROWS_WITH(fc::fast_attention_backward(fr::Algorithm::bwd_atomic, cfg, x, x, x, x, x, lse, det),
                      Catch::Contains("cu_seqlens") && Catch::Contains(fc::to_string(det)) &&
                          Catch::Contains("design bwd_two_kernel"));
  // Packed sequences run on the fastest backward kernel, as dense ones (d = 64 here).
  CHECK(fc::fastest_backward_kernel(cfg) == fc::fastest_backward_kernel());
  // The dense device entry refuses a packed problem, naming the overload with the device lists.
  REQUIRE_THROWS_WITH(fc::fast_attention_backward_device(fr::Algorithm::bwd_atomic, cfg, nullptr, nullptr, nullptr,
                                                         nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                                         nullptr),
                      Catch::Contains("cu_seqlens") && Catch::Contains("FastPackedSequences"));
  // The packed device entry's workspaces (the lists are not read for them): the two-kernel design
  // D alone, the atomic one D and the dQ accumulator's whole tiles.
  const fc::FastPackedSequences none{nullptr, nullptr, 10, 10};
  CHECK(fc::fast_attention_backward_workspace_bytes(fr::Algorithm::bwd_two_kernel, cfg, none) == 2 * 10 * sizeof(float));
  CHECK(fc::fast_attention_backward_workspace_bytes(fr::Algorithm::bwd_atomic, cfg, none) >=
        (10 + 2 * 128) * 2 * 64 * sizeof(float));
}
