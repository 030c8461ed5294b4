// `flashlab bench attention` (and the shared parts of `bench mta`), end to end on the CPU machine: help, bad flags (usage errors naming
// the flag, in every build), and what happens where it cannot time anything: a build without CUDA
// refuses with a usage error; a CUDA build on a machine without a GPU fails naming the CUDA error.
// The timing itself needs a GPU: it is run on the device (cuda/RESULTS.md §4 and §5; bench mta: §10 and §11).
#include <catch2/catch.hpp>

#include "run_cli.hpp"

#include <string>

using flashlab::test::expect_usage_error;
using flashlab::test::run_cli;
using flashlab::test::run_gpu_command;

TEST_CASE("cli bench: --help names the method and every flag", "[cli][bench]") {
  const auto r = run_cli("bench attention --help");
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("Usage: flashlab bench attention") && Catch::Contains("CUDA events") &&
                        Catch::Contains("L2 flushed") && Catch::Contains("median"));
  for (const char* flag : {"--seq", "--dim", "--heads", "--batch", "--causal", "--no-causal", "--both", "--dtype",
                           "--reps", "--warmup", "--csv", "--pass", "--bwd-design", "--fwd-kernel", "--bwd-kernel"}) {
    INFO(flag);
    CHECK_THAT(r.out, Catch::Contains(flag));
  }
  CHECK_THAT(r.out, Catch::Contains("1024,2048,4096,8192,16384"));  // the full sweep is the default
  // What the backward takes, as the front door states it (fast_attention.hpp): the two-kernel
  // design takes a window, grouped K/V and N_k != N too, and d = 256 is a --dim the sweep takes.
  CHECK_THAT(r.out, Catch::Contains("The backward takes those three on the two-kernel design and the atomic\n"
                                    "design's mma and wgmma-ws kernels (and at d = 256 on wgmma-ws-det)") &&
                        Catch::Contains("--dim takes 64, 128 and 256") &&
                        Catch::Contains("kernel but --bwd-kernel wgmma-ws-det takes them, at d = 64 and 128"));
  const auto top = run_cli("--help");
  CHECK_THAT(top.out, Catch::Contains("bench"));
}

TEST_CASE("cli bench: bad flags are usage errors naming the flag", "[cli][bench][errors]") {
  expect_usage_error("bench", "missing what to benchmark");
  expect_usage_error("bench nothing", "unknown bench subject 'nothing'");
  expect_usage_error("bench mta --ck 4", "--ck 4 is even");
  expect_usage_error("bench mta --kernel quick", "--kernel 'quick' is unknown");
  expect_usage_error("bench mta --pass backward", "--pass 'backward' is unknown");
  expect_usage_error("bench mta --reps 2", "--reps 2 is out of range");
  expect_usage_error("bench attention --seq 1024,x", "--seq: 'x'");
  expect_usage_error("bench attention --seq 0", "--seq: '0'");
  expect_usage_error("bench attention --seq 1024,,2048", "--seq: ''");
  expect_usage_error("bench attention --seq 1024,", "--seq");
  // The fast kernels' head dims, in every build (the CPU build too, before it says it has no CUDA).
  expect_usage_error("bench attention --dim 96", "--dim 96 is not 64, 128 or 256");
  expect_usage_error("bench attention --dim 64,96", "hint: the fast kernels are compiled for d = 64, 128 and 256; "
                                                    "flashlab attention fwd takes any d on the CPU");
#ifdef FLASHLAB_TEST_HAVE_CUDA
  expect_usage_error("bench attention --dim 256 --pass fwd --fwd-kernel splitkv",
                     "--dim 256: flashlab::cuda: split-KV forward: head_dim (d) = 256 is not supported");
#endif
  expect_usage_error("bench attention --dim 256 --bwd-design two-kernel",
                     "--dim 256: the fast backward at d = 256 is the atomic design's mma, wgmma-ws or wgmma-ws-det "
                     "kernel, not --bwd-design two-kernel");
  expect_usage_error("bench attention --dim 256 --bwd-design two-kernel", "wgmma-ws-det for bit-reproducible gradients");
  // wgmma-ws-det takes a window, grouped K/V and N_k != N at d = 256 only: a sweep with d = 128 is refused.
  expect_usage_error("bench attention --dim 128,256 --pass bwd --bwd-kernel wgmma-ws-det --window 5,5", "add --pass fwd");
  expect_usage_error("bench attention --dim 128,256 --pass bwd --bwd-kernel wgmma-ws-det --heads 4 --heads-kv 2",
                     "wgmma-ws-det at --dim 256");
  expect_usage_error("bench attention --fwd-kernel tma", "--fwd-kernel 'tma' is unknown");
  expect_usage_error("bench attention --bwd-kernel wgmma", "--bwd-kernel 'wgmma' is unknown");
  expect_usage_error("bench attention --bwd-design two-kernel --bwd-kernel wgmma-ws", "runs the atomic design only");
  expect_usage_error("bench attention --dim 64,abc", "--dim: 'abc'");
  expect_usage_error("bench attention --heads 0", "--heads 0 is out of range");
  expect_usage_error("bench attention --batch -1", "--batch");
  expect_usage_error("bench attention --reps 19", "--reps 19 is out of range");
  expect_usage_error("bench attention --reps many", "--reps");
  expect_usage_error("bench attention --warmup -1", "--warmup");
  expect_usage_error("bench attention --dtype fp32", "--dtype 'fp32'");
  expect_usage_error("bench attention --pass sideways", "--pass 'sideways'");
  expect_usage_error("bench attention --pass", "pass");
  expect_usage_error("bench attention --bwd-design fast", "--bwd-design 'fast'");
  expect_usage_error("bench attention --pass bwd --bwd-design Atomic", "--bwd-design 'Atomic'");
  expect_usage_error("bench attention --causal --both", "exclude each other");
  expect_usage_error("bench attention --causal --no-causal", "exclude each other");
  expect_usage_error("bench attention --frobnicate", "frobnicate");
  expect_usage_error("bench attention --heads 32 --heads-kv 5 --pass fwd", "--heads-kv 5 does not divide --heads 32");
  expect_usage_error("bench attention --heads-kv 0", "--heads-kv 0 is out of range");
  // The backward takes grouped K/V and N_k != N on every kernel but the fixed-order wgmma-ws one at
  // d = 64 and 128 (the two-kernel design, deterministic too, is the hint; at d = 256 it takes them).
  expect_usage_error("bench attention --heads 32 --heads-kv 8 --bwd-kernel wgmma-ws-det",
                     "--heads-kv 8 differs from --heads 32: the fast backward takes grouped K/V on the two-kernel "
                     "design, the atomic design's mma and wgmma-ws kernels, and wgmma-ws-det at --dim 256 "
                     "(--bwd-kernel wgmma-ws-det at --dim 64 and 128 takes H_kv = H)");
  expect_usage_error("bench attention --seq 1024 --seq-k 2048 --pass both --bwd-kernel wgmma-ws-det",
                     "--seq-k 2048 differs from N = 1024: the fast backward takes N_k != N on the two-kernel design, "
                     "the atomic design's mma and wgmma-ws kernels, and wgmma-ws-det at --dim 256 (--bwd-kernel "
                     "wgmma-ws-det at --dim 64 and 128 takes N_k = N)");
  expect_usage_error("bench attention --seq 1024 --seq-k 2048 --pass bwd --bwd-kernel wgmma-ws-det",
                     "hint: use --bwd-design two-kernel (deterministic too)");
  expect_usage_error("bench attention --seq-k 0", "--seq-k 0 is out of range");
  // Context parallelism: --gpus and its own flags.
  expect_usage_error("bench attention --gpus 0", "--gpus: '0'");
  expect_usage_error("bench attention --gpus 2,x", "--gpus: 'x'");
  expect_usage_error("bench attention --scaling weak", "--scaling is for --gpus");
  expect_usage_error("bench attention --layout zigzag", "--layout is for --gpus");
  expect_usage_error("bench attention --no-single", "--no-single is for --gpus");
  expect_usage_error("bench attention --gpus 2 --scaling linear", "--scaling 'linear' is unknown");
  expect_usage_error("bench attention --gpus 2 --layout spiral", "--layout 'spiral' is unknown");
  expect_usage_error("bench attention --gpus 2 --window 64,0", "--window does not go with --gpus");
  expect_usage_error("bench attention --gpus 2 --seq 1024 --seq-k 1024 --pass fwd", "--seq-k does not go with --gpus");
  expect_usage_error("bench attention --gpus 2 --kv-copy --pass fwd", "--kv-copy does not go with --gpus");
  expect_usage_error("bench attention --gpus 2 --flush-dirty", "--flush-dirty does not go with --gpus");
  expect_usage_error("bench attention --gpus 2 --bwd-kernel mma", "does not go with --gpus");
  expect_usage_error("bench attention --gpus 2 --reps 2", "--reps 2 is out of range");  // a ring: at least 3
#ifndef FLASHLAB_TEST_HAVE_CUDA
  expect_usage_error("bench attention --gpus 2", "--gpus: this build has no context-parallel ring");
#endif
  // The backward takes a window on every kernel but the fixed-order wgmma-ws one at d = 64 and 128.
  expect_usage_error("bench attention --window 128,0 --pass bwd --bwd-kernel wgmma-ws-det",
                     "--window 128,0: the fast backward takes a window on the two-kernel design, the atomic "
                     "design's mma and wgmma-ws kernels, and wgmma-ws-det at --dim 256 (--bwd-kernel wgmma-ws-det "
                     "at --dim 64 and 128 takes none)");
  expect_usage_error("bench attention --window 128,0 --pass bwd --bwd-kernel wgmma-ws-det", "or --dim 256 alone");
#ifndef FLASHLAB_TEST_HAVE_CUDA
  // The two-kernel design takes a window, grouped K/V and N_k != N: past the flags, to the GPU it needs.
  expect_usage_error("bench attention --window 128,0 --heads 8 --heads-kv 2 --seq 256 --seq-k 300 --pass bwd "
                     "--bwd-design two-kernel",
                     "built without CUDA");
#endif
  expect_usage_error("bench attention --window 128 --pass fwd", "--window takes two numbers");
  expect_usage_error("bench attention --window 128,-3 --pass fwd", "--window: '-3'");
}

TEST_CASE("cli bench: without CUDA, or without a GPU, it says so and exits non-zero", "[cli][bench][errors]") {
  // Small, valid flags: on a machine with a GPU (CUDA build) this would time one shape quickly.
  const auto r = run_gpu_command("bench attention --seq 128 --dim 64 --causal --reps 20 --warmup 1");
  if (r.exit_code == 0)  // a GPU: one row of the table
    CHECK_THAT(r.out, Catch::Contains("device:") && Catch::Contains("TFLOP/s") && Catch::Contains("bf16"));
  const auto mta = run_gpu_command("bench mta --seq 128 --dim 64 --reps 5 --warmup 0");
  if (mta.exit_code == 0) CHECK_THAT(mta.out, Catch::Contains("device:") && Catch::Contains("TFLOP/s"));
}

TEST_CASE("cli bench: --kernel and --dtype read alike on every GPU command", "[cli][bench][errors]") {
  // The bench sweeps default to the fast kernels, the checking commands to the clear ones: the
  // hint says which is the default, in the same words everywhere.
  const std::string fast_default = "hint: choose fast (the default) or clear",
                    clear_default = "hint: choose clear (the default) or fast",
                    bf16_default = "hint: choose bf16 (the default) or fp16";
  const std::string unknown_kernel = "error: --kernel 'quick' is unknown", unknown_dtype = "error: --dtype 'fp32' is unknown";
  const struct {
    std::string args, error, hint;
  } cases[] = {
      {"bench mta --kernel quick", unknown_kernel, fast_default},
      {"bench stream --kernel quick", unknown_kernel, fast_default},
      {"mta fwd --device cuda --kernel quick --seq 8 --dim 4", unknown_kernel, clear_default},
      {"stream estimate --device cuda --kernel quick --seq 256 --dim 8 --block-m 16 --block-n 16 --k 2", unknown_kernel,
       clear_default},
      {"stream needles --device cuda --kernel quick --seq 1024 --dim 8 --block-m 16 --block-n 16 --k 2", unknown_kernel,
       clear_default},
      {"bench attention --dtype fp32", unknown_dtype, bf16_default},
      {"bench mta --dtype fp32", unknown_dtype, bf16_default},
      {"bench stream --dtype fp32", unknown_dtype, bf16_default},
      {"mta fwd --device cuda --kernel fast --dtype fp32 --seq 8 --dim 4", unknown_dtype, bf16_default},
  };
  for (const auto& c : cases) {
    INFO(c.args);
    const auto r = run_cli(c.args);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Catch::Contains(c.error) && Catch::Contains(c.hint));
  }
  for (const char* args : {"bench mta --help", "bench stream --help"}) {
    INFO(args);
    CHECK_THAT(run_cli(args).out, Catch::Contains("--kernel fast|clear") && Catch::Contains("fast | clear: the fast"));
  }
}

#ifndef FLASHLAB_TEST_HAVE_CUDA
TEST_CASE("cli bench: every GPU command refuses a build without CUDA in the same words", "[cli][bench][errors]") {
  // One refusal (gpu_flags.hpp): the command, how to rebuild, and the way without a GPU where there is one.
  const std::string rebuild = "hint: rebuild with nvcc present (cmake --preset cuda, FLASHLAB_ENABLE_CUDA=ON)";
  const struct {
    std::string args, alternative;
  } cases[] = {
      {"bench attention", ""},
      {"bench mta", ""},
      {"bench stream", ""},
      {"mta fwd --device cuda --seq 8 --dim 4", "; or use --device cpu"},
      {"stream estimate --device cuda --seq 256 --dim 8 --block-m 16 --block-n 16 --k 2", "; or drop --device cuda"},
      {"stream needles --device cuda --seq 1024 --dim 8 --block-m 16 --block-n 16 --k 2", "; or use --device cpu"},
      {"traffic attention --seq 64 --device cuda", "; or use --device cpu for the model"},
      {"traffic mta --device cuda", "; or use --device cpu for the model"},
      {"traffic stream --device cuda", "; or run flashlab stream estimate|apply"},
      {"traffic levels --device cuda", "; or leave out --device cuda"},
  };
  for (const auto& c : cases) {
    INFO(c.args);
    const auto r = run_cli(c.args);
    CHECK(r.exit_code == 2);
    CHECK(r.out.empty());
    CHECK_THAT(r.err, Catch::Contains("error: this flashlab was built without CUDA (") && Catch::Contains(rebuild) &&
                          Catch::Contains(c.alternative));
  }
}
#endif
