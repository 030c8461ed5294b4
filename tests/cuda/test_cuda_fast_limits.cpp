// The fast kernels' limits for grouped K/V (H_kv < H), N_k ≠ N, windows and packed sequences, as the
// attention front door (cuda/src/attention/front_door.cpp) states them: the forward takes them, the
// backward and the plain wgmma forward refuse them by name (but for windows, which the atomic
// backward's mma and wgmma-ws kernels take, and packed sequences, which its mma kernel takes), and
// the 32-bit element counts of Q and of K/V are checked there.
// Every check here is on the problem alone, before any device call: this executable needs no GPU
// (it runs wherever the CUDA targets are built; the CPU-only build has no front door to call).
#include <catch2/catch.hpp>

#include "flashlab/cuda/fast_attention.hpp"
#include "flashlab/reference/attention_problem.hpp"

#include <cstddef>
#include <string>
#include <utility>
#include <vector>
#include <cstdint>

namespace fc = flashlab::cuda;
namespace fr = flashlab::ref;

namespace {
constexpr fr::Dtype kBf16 = fr::Dtype::bf16;
constexpr fc::FastForwardKernel kMma = fc::FastForwardKernel::mma_sync;
}  // namespace

TEST_CASE("the front door takes grouped K/V and N_k != N for the forward and the backward but wgmma-ws-det",
          "[fast][fast-gqa][errors]") {
  fr::AttentionProblem p;
  p.batch = 2;
  p.seq = 100;
  p.seq_k = 300;
  p.heads = 32;
  p.heads_kv = 8;
  p.head_dim = 128;
  p.causal = true;
  p.dtype = kBf16;
  CHECK_NOTHROW(fc::check_fast_problem(p));
  CHECK(fc::fast_forward_tiles(p, kMma).Br == 128);
  // The atomic design's workspace follows Q's shape, the two-kernel design's is D alone (B·H·N
  // floats); the deterministic wgmma-ws kernel refuses them by name, pointing to the two-kernel design.
  CHECK(fc::fast_attention_backward_workspace_bytes(fr::Algorithm::bwd_atomic, p) > 0);
  CHECK(fc::fast_attention_backward_workspace_bytes(fr::Algorithm::bwd_two_kernel, p) == 2 * 32 * 100 * sizeof(float));
  const std::vector<std::uint16_t> none16;
  const std::vector<float> none32;
  CHECK_THROWS_WITH(fc::fast_attention_backward(fr::Algorithm::bwd_atomic, p, none16, none16, none16, none16, none16,
                                                none32, fc::FastBackwardKernel::wgmma_ws_deterministic),
                    Catch::Contains("fast backward: heads_kv (H_kv) = 8 (differs from heads (H) = 32) is not "
                                    "supported by the wgmma-ws-det kernel") &&
                        Catch::Contains("hint: design bwd_two_kernel for bit-reproducible gradients"));
  CHECK_THROWS_WITH(fc::fast_forward_tiles(p, fc::FastForwardKernel::wgmma),
                    Catch::Contains("wgmma forward: heads_kv (H_kv) = 8 differs from heads (H) = 32") &&
                        Catch::Contains("hint: use the tma-ws or mma forward kernel"));
  p.heads_kv = 0;
  CHECK(fc::fast_attention_backward_workspace_bytes(fr::Algorithm::bwd_two_kernel, p) == 2 * 32 * 100 * sizeof(float));
  CHECK_THROWS_WITH(fc::fast_attention_backward(fr::Algorithm::bwd_atomic, p, none16, none16, none16, none16, none16,
                                                none32, fc::FastBackwardKernel::wgmma_ws_deterministic),
                    Catch::Contains("fast backward: seq_k (N_k) = 300 (differs from seq (N) = 100) is not supported "
                                    "by the wgmma-ws-det kernel"));
  CHECK(fc::fast_attention_backward_workspace_bytes(fr::Algorithm::bwd_atomic, p) ==
        fc::fast_attention_backward_workspace_bytes(fr::Algorithm::bwd_atomic, [&] {
          fr::AttentionProblem q = p;
          q.seq_k = 0;
          return q;
        }()));
  CHECK_THROWS_WITH(fc::fast_forward_tiles(p, fc::FastForwardKernel::wgmma),
                    Catch::Contains("wgmma forward: seq_k (N_k) = 300 differs from seq (N) = 100"));
  p.seq_k = 0;
  CHECK(fc::fast_attention_backward_workspace_bytes(fr::Algorithm::bwd_two_kernel, p) > 0);
  // 32-bit indexing: Q's and K/V's element counts, each named.
  p.seq_k = std::size_t(1) << 20;  // B·N_k·H_kv·d = 2 · 2^20 · 8 · 128 = 2^31
  p.heads_kv = 8;
  CHECK_THROWS_WITH(fc::check_fast_problem(p),
                    Catch::Contains("B·N_k·H_kv·d = 2147483648") && Catch::Contains("is not below 2^31") &&
                        Catch::Contains("hint:"));
  p.seq_k = (std::size_t(1) << 20) - 1;
  CHECK_NOTHROW(fc::check_fast_problem(p));
  p.seq = std::size_t(1) << 18;  // B·N·H·d = 2 · 2^18 · 32 · 128 = 2^31
  CHECK_THROWS_WITH(fc::check_fast_problem(p), Catch::Contains("B·N·H·d = 2147483648 is not below 2^31"));
}

TEST_CASE("the front door takes packed sequences for the mma and tma-ws forwards and refuses them elsewhere",
          "[fast][fast-varlen][errors]") {
  fr::AttentionProblem p;
  p.heads = 32;
  p.heads_kv = 8;
  p.head_dim = 128;
  p.causal = true;
  p.dtype = kBf16;
  p.set_packed(fr::PackedSequences({0, 40, 100}, {0, 70, 70}));
  CHECK_NOTHROW(fc::check_fast_problem(p));
  CHECK(fc::fast_forward_tiles(p, kMma).Br == 128);
  // The atomic backward takes them (its workspace: D [H, total_q], then whole query tiles of each
  // sequence, (total_q + 128·B)·H·d floats) on the fastest kernel, the two-kernel design too (D
  // alone); the deterministic wgmma-ws kernel, the split-KV and the plain wgmma forwards refuse them
  // by name.
  CHECK(fc::fast_attention_backward_workspace_bytes(fr::Algorithm::bwd_atomic, p) ==
        (32 * 100 * 4 + 255) / 256 * 256 + std::size_t(100 + 2 * 128) * 32 * 128 * 4);
  CHECK(fc::fast_attention_backward_workspace_bytes(fr::Algorithm::bwd_two_kernel, p) == 32 * 100 * sizeof(float));
  const std::vector<std::uint16_t> none16;
  const std::vector<float> none32;
  CHECK_THROWS_WITH(fc::fast_attention_backward(fr::Algorithm::bwd_atomic, p, none16, none16, none16, none16, none16,
                                                none32, fc::FastBackwardKernel::wgmma_ws_deterministic),
                    Catch::Contains("fast backward: cu_seqlens (2 packed sequences) are not supported by the "
                                    "wgmma-ws-det kernel") &&
                        Catch::Contains("hint:"));
  for (auto kernel : {fc::FastForwardKernel::wgmma, fc::FastForwardKernel::split_kv})
    CHECK_THROWS_WITH(fc::fast_forward_tiles(p, kernel),
                      Catch::Contains("cu_seqlens (packed sequences) are not supported") &&
                          Catch::Contains("hint: use the tma-ws or mma forward kernel"));
  // The lists on the device: the totals are checked against the problem's own lists when it has them.
  const fc::FastPackedSequences lists{nullptr, nullptr, 100, 70};
  CHECK_NOTHROW(fc::check_fast_packed(p, lists));
  CHECK_THROWS_WITH(fc::check_fast_packed(p, {nullptr, nullptr, 99, 70}),
                    Catch::Contains("packed.total_q = 99 differs from the problem's cu_seqlens_q, which ends at 100"));
  CHECK_THROWS_WITH(fc::check_fast_packed(p, {nullptr, nullptr, 100, 0}),
                    Catch::Contains("packed.total_k = 0 is not 1") && Catch::Contains("hint:"));
  // Without host lists the problem is dense-shaped: B, the longest lengths (or more), the totals.
  fr::AttentionProblem shape = p;
  shape.packed.reset();
  shape.batch = 1000;
  shape.seq = 1 << 16;
  shape.seq_k = 1 << 16;
  CHECK_NOTHROW(fc::check_fast_packed(shape, {nullptr, nullptr, 100000, 100000}));  // B·N·H·d is not the size
  CHECK_THROWS_WITH(fc::check_fast_packed(shape, {nullptr, nullptr, 1 << 19, 100}),
                    Catch::Contains("total_q·H·d = 2147483648 is not below 2^31"));
  CHECK_THROWS_WITH(fc::check_fast_packed(shape, {nullptr, nullptr, 100, 1 << 21}),
                    Catch::Contains("total_k·H_kv·d = 2147483648 is not below 2^31"));
  // The packed backward's workspace from the device lists' totals (B·N·H·d is not its size either).
  CHECK(fc::fast_attention_backward_workspace_bytes(fr::Algorithm::bwd_atomic, shape,
                                                    {nullptr, nullptr, 100000, 100000}) ==
        std::size_t(32) * 100000 * 4 + std::size_t(100000 + 1000 * 128) * 32 * 128 * 4);
  CHECK(fc::fast_attention_backward_workspace_bytes(fr::Algorithm::bwd_two_kernel, shape,
                                                    {nullptr, nullptr, 100000, 100000}) == std::size_t(32) * 100000 * 4);
  CHECK_THROWS_WITH(fc::fast_attention_backward_workspace_bytes(fr::Algorithm::bwd_atomic, shape,
                                                                {nullptr, nullptr, 1 << 19, 100}),
                    Catch::Contains("total_q·H·d = 2147483648 is not below 2^31"));
  // Causal, the packed backward's key tiles are a grid dimension of at most 65535.
  fr::AttentionProblem one;
  one.head_dim = 64;
  one.causal = true;
  one.dtype = kBf16;
  one.seq = 100;
  one.seq_k = 9000000;
  CHECK_NOTHROW(fc::fast_attention_backward_workspace_bytes(fr::Algorithm::bwd_atomic, one,
                                                            {nullptr, nullptr, 100, 8388352}));
  CHECK_THROWS_WITH(fc::fast_attention_backward_workspace_bytes(fr::Algorithm::bwd_atomic, one,
                                                                {nullptr, nullptr, 100, 9000000}),
                    Catch::Contains("causal packed sequences with total_k = 9000000 and B = 1 make 70313 key tiles") &&
                        Catch::Contains("hint:"));
  one.causal = false;
  CHECK_NOTHROW(fc::fast_attention_backward_workspace_bytes(fr::Algorithm::bwd_atomic, one,
                                                            {nullptr, nullptr, 100, 9000000}));
  // d = 256: the dense forwards take it, the packed ones not yet.
  p.head_dim = 256;
  CHECK_THROWS_WITH(fc::check_fast_problem(p),
                    Catch::Contains("cu_seqlens (packed sequences) with head_dim (d) = 256") && Catch::Contains("hint:"));
  shape.head_dim = 256;
  CHECK_THROWS_WITH(fc::check_fast_packed(shape, lists), Catch::Contains("head_dim (d) = 256"));
}

TEST_CASE("the front door takes windows for the forward and the backward, and refuses them for wgmma-ws-det, wgmma and split-KV",
          "[fast][fast-window][errors]") {
  fr::AttentionProblem p;
  p.seq = 300;
  p.seq_k = 500;
  p.heads = 8;
  p.heads_kv = 2;
  p.head_dim = 64;
  p.dtype = kBf16;
  p.window_left = 128;
  p.window_right = 0;
  CHECK_NOTHROW(fc::check_fast_problem(p));
  CHECK(fc::fast_forward_tiles(p, kMma).Br == 128);
  // The backward: the atomic design's mma and wgmma-ws kernels and the two-kernel design take the
  // window, grouped K/V and N_k ≠ N (their workspace queries too); the deterministic wgmma-ws kernel
  // names the window first.
  const auto atomic = fr::Algorithm::bwd_atomic, two_kernel = fr::Algorithm::bwd_two_kernel;
  CHECK(fc::fast_attention_backward_workspace_bytes(two_kernel, p) == 8 * 300 * sizeof(float));
  CHECK(fc::fast_attention_backward_workspace_bytes(atomic, p) > 0);
  const std::vector<std::uint16_t> x;
  const std::vector<float> lse;
  CHECK_THROWS_WITH(
      fc::fast_attention_backward(atomic, p, x, x, x, x, x, lse, fc::FastBackwardKernel::wgmma_ws_deterministic),
      Catch::Contains("fast backward: window (128,0) is not supported by the wgmma-ws-det kernel") &&
          Catch::Contains("hint: design bwd_two_kernel for bit-reproducible gradients, or bwd_atomic with kernel mma "
                          "or wgmma-ws"));
  CHECK_THROWS_WITH(fc::fast_attention_backward(two_kernel, p, x, x, x, x, x, lse), Catch::Contains("Q has 0 elements"));
  // The mma kernel takes the problem: the empty inputs are what it refuses, by name.
  CHECK_THROWS_WITH(fc::fast_attention_backward(atomic, p, x, x, x, x, x, lse, fc::FastBackwardKernel::mma_sync),
                    Catch::Contains("Q has 0 elements"));
  p.seq_k = 0;
  p.heads_kv = 0;
  CHECK(fc::fast_attention_backward_workspace_bytes(two_kernel, p) == 8 * 300 * sizeof(float));
  CHECK_THROWS_WITH(
      fc::fast_attention_backward(atomic, p, x, x, x, x, x, lse, fc::FastBackwardKernel::wgmma_ws_deterministic),
      Catch::Contains("fast backward: window (128,0) is not supported by the wgmma-ws-det kernel") &&
          Catch::Contains("the bwd_two_kernel design (deterministic too: no atomics) and the bwd_atomic design's mma "
                          "and wgmma-ws kernels take windows"));
  CHECK(fc::fast_attention_backward_workspace_bytes(atomic, p) > 0);
  CHECK_THROWS_WITH(fc::fast_forward_tiles(p, fc::FastForwardKernel::wgmma),
                    Catch::Contains("wgmma forward: window (128,0) is not supported") &&
                        Catch::Contains("hint: use the tma-ws or mma forward kernel"));
  CHECK_THROWS_WITH(fc::fast_forward_tiles(p, fc::FastForwardKernel::split_kv),
                    Catch::Contains("split-KV forward: window (128,0) is not supported") &&
                        Catch::Contains("hint: use the tma-ws or mma forward kernel"));
  // Either side alone is a window too; the problem's own limits still hold (−1 … 2^31 − 1).
  p.window_left = -1;
  p.window_right = 5;
  CHECK_NOTHROW(fc::check_fast_problem(p));
  CHECK_THROWS_WITH(
      fc::fast_attention_backward(atomic, p, x, x, x, x, x, lse, fc::FastBackwardKernel::wgmma_ws_deterministic),
      Catch::Contains("window (-1,5)"));
  CHECK(fc::fast_attention_backward_workspace_bytes(two_kernel, p) > 0);
  CHECK(fc::fast_attention_backward_workspace_bytes(atomic, p) > 0);
  p.window_right = -2;
  CHECK_THROWS_WITH(fc::check_fast_problem(p), Catch::Contains("window_right"));
  p.window_right = -1;
  CHECK(fc::fast_attention_backward_workspace_bytes(fr::Algorithm::bwd_two_kernel, p) > 0);
}

TEST_CASE("the split-KV forward's tiles count packed rows: the query rows of the heads sharing a K/V head",
          "[fast][fast-splitkv][errors]") {
  const auto split_kv = fc::FastForwardKernel::split_kv;
  fr::AttentionProblem p;
  p.seq = 1;
  p.seq_k = 65536;
  p.heads = 32;
  p.heads_kv = 8;
  p.head_dim = 128;
  p.dtype = kBf16;
  CHECK(std::string(fc::to_string(split_kv)) == "splitkv");
  CHECK(fc::fast_forward_tiles(128, split_kv).Br == 16);
  CHECK(fc::fast_forward_tiles(p, split_kv).Br == 16);  // 4 heads × 1 row
  CHECK(fc::fast_forward_tiles(p, split_kv).Bc == 64);
  p.seq = 4;  // 4 heads × 4 rows = 16 packed rows: still one m16 tile
  CHECK(fc::fast_forward_tiles(p, split_kv).Br == 16);
  p.seq = 5;  // 20 packed rows
  CHECK(fc::fast_forward_tiles(p, split_kv).Br == 64);
  p.head_dim = 96;  // the fast kernels' one limit on d, stated once
  CHECK_THROWS_WITH(fc::fast_forward_tiles(p, split_kv), Catch::Contains("head_dim (d) = 96 is not 64, 128 or 256"));
}

TEST_CASE("d = 256: the mma and tma-ws forwards and the atomic mma, wgmma-ws and wgmma-ws-det backwards take it, "
          "the other fast "
          "kernels name their limit",
          "[fast][fast-d256][errors]") {
  fr::AttentionProblem p;
  p.seq = 8;
  p.head_dim = 256;
  p.dtype = kBf16;
  CHECK_NOTHROW(fc::check_fast_problem(p));
  CHECK(fc::fast_forward_tiles(256, fc::FastForwardKernel::mma_sync).Br == 128);
  CHECK(fc::fast_forward_tiles(256, fc::FastForwardKernel::mma_sync).Bc == 64);
  CHECK(fc::fast_forward_tiles(256, fc::FastForwardKernel::tma_ws).Br == 128);
  CHECK(fc::fast_forward_tiles(256, fc::FastForwardKernel::tma_ws).Bc == 80);  // two stages fit the SRAM
  CHECK(fc::fast_forward_tiles(128, fc::FastForwardKernel::tma_ws).Bc == 128);
  CHECK_THROWS_WITH(fc::fast_forward_tiles(256, fc::FastForwardKernel::split_kv),
                    Catch::Contains("split-KV forward: head_dim (d) = 256 is not supported: it takes d = 64 and 128") &&
                        Catch::Contains("hint: d = 256 runs on the mma and tma-ws forwards"));
  CHECK_THROWS_WITH(fc::fast_forward_tiles(p, fc::FastForwardKernel::split_kv),
                    Catch::Contains("split-KV forward: head_dim (d) = 256"));
  CHECK_THROWS_WITH(fc::fast_forward_tiles(p, fc::FastForwardKernel::wgmma),
                    Catch::Contains("wgmma forward: head_dim (d) = 256 is not supported"));
  // The atomic design's workspace: D, then whole 128-row tiles of the fp32 dQ accumulator, then
  // the order counters (one per 64 rows).
  CHECK(fc::fast_attention_backward_workspace_bytes(fr::Algorithm::bwd_atomic, p) ==
        256 + 128 * 256 * sizeof(float) + sizeof(int));
  CHECK_THROWS_WITH(fc::fast_attention_backward_workspace_bytes(fr::Algorithm::bwd_two_kernel, p),
                    Catch::Contains("fast backward: head_dim (d) = 256 is not supported by the bwd_two_kernel design") &&
                        Catch::Contains("hint: design bwd_atomic; kernel wgmma-ws-det for bit-reproducible gradients"));
  // The fixed-order wgmma-ws kernel takes d = 256 (attention_bwd_d256_ws.cu) with a window, grouped
  // K/V and N_k != N: the checks pass, the call stops at its missing workspace (or, in a build
  // without sm_90a, at the kernel's absence); at d = 128 it refuses the window by name.
  const auto det = fc::FastBackwardKernel::wgmma_ws_deterministic;
  const std::string after_checks =
      fc::fast_forward_wgmma_built() ? "needs a workspace" : "wgmma-ws backward kernel is not in this build";
  fr::AttentionProblem banded = p;
  banded.heads = 4;
  banded.heads_kv = 2;
  banded.seq_k = 12;
  banded.window_left = 3;
  for (const fr::AttentionProblem& q : {p, banded})
    CHECK_THROWS_WITH(fc::fast_attention_backward_device(fr::Algorithm::bwd_atomic, q, nullptr, nullptr, nullptr,
                                                         nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                                         nullptr, det),
                      Catch::Contains(after_checks));
  banded.head_dim = 128;
  CHECK_THROWS_WITH(fc::fast_attention_backward_device(fr::Algorithm::bwd_atomic, banded, nullptr, nullptr, nullptr,
                                                       nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                                       nullptr, det),
                    Catch::Contains("is not supported by the wgmma-ws-det kernel"));
  p.head_dim = 512;
  CHECK_THROWS_WITH(fc::check_fast_problem(p), Catch::Contains("head_dim (d) = 512 is not 64, 128 or 256"));
}
