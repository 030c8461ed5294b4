// `flashlab bench stream`, end to end on the CPU machine: help, bad flags (usage errors naming the
// flag, in every build), and the refusal where nothing can be timed (no CUDA in the build, or no
// GPU). The timing itself needs a GPU: it runs on the device (cuda/RESULTS.md §8).
#include <catch2/catch.hpp>

#include "run_cli.hpp"

#include <string>

using flashlab::test::expect_usage_error;
using flashlab::test::run_cli;
using flashlab::test::run_gpu_command;

TEST_CASE("cli bench stream: --help names the method and every flag", "[cli][bench]") {
  const auto r = run_cli("bench stream --help");
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("Usage: flashlab bench stream") && Catch::Contains("CUDA events") &&
                        Catch::Contains("L2") && Catch::Contains("median") && Catch::Contains("beyond"));
  for (const char* flag : {"--pass", "--kernel", "--seq", "--dim", "--k", "--heads", "--block-m", "--block-n", "--dtype", "--group",
                           "--reps", "--warmup", "--check-indices", "--traffic", "--csv", "--gpus", "--layout",
                           "--exchange", "--folds", "--schedule", "--comm-priority", "--transport", "--timeline"}) {
    INFO(flag);
    CHECK_THAT(r.out, Catch::Contains(flag));
  }
  CHECK_THAT(r.out, Catch::Contains("32768,65536,131072,262144,524288,1048576"));  // the default sweep
  // Every flag is in the usage line too, and the sweep says which combinations of lists it skips.
  CHECK_THAT(r.out.substr(0, r.out.find("\n\n")), Catch::Contains("[--group G]") && Catch::Contains("[--folds F"));
  CHECK_THAT(r.out, Catch::Contains("contiguous with --exchange pieces or --folds above 1 is skipped"));
}

TEST_CASE("cli bench stream: bad flags are usage errors naming the flag", "[cli][bench][errors]") {
  expect_usage_error("bench stream --pass sideways", "--pass 'sideways'");
  expect_usage_error("bench stream --kernel quick", "--kernel 'quick'");
  expect_usage_error("bench stream --seq 1024,x", "--seq: 'x'");
  expect_usage_error("bench stream --seq 0", "--seq: '0'");
  expect_usage_error("bench stream --seq 16777216", "--seq");  // past the 8M cap
  expect_usage_error("bench stream --k 0", "--k: '0'");
  expect_usage_error("bench stream --dim 64,abc", "--dim: 'abc'");
  expect_usage_error("bench stream --heads 0", "--heads 0 is out of range");
  expect_usage_error("bench stream --block-m 256", "--block-m 256 is out of range");
  expect_usage_error("bench stream --group 3", "--group 3 is out of range");
  expect_usage_error("bench stream --reps 0", "--reps 0 is out of range");
  expect_usage_error("bench stream --warmup -1", "--warmup");
  expect_usage_error("bench stream --dtype fp32", "--dtype 'fp32'");
  expect_usage_error("bench stream --frobnicate", "frobnicate");
  // The launch-by-launch check of I and the CUPTI bytes belong to the fast bf16 estimate alone.
  expect_usage_error("bench stream --check-indices", "--check-indices checks the fast bf16 estimate");
  expect_usage_error("bench stream --kernel fast --check-indices", "--check-indices checks the fast bf16 estimate");
  expect_usage_error("bench stream --kernel fast --pass estimate --traffic", "--traffic measures the fast estimate");
  expect_usage_error("bench stream --kernel clear --pass trace", "--pass trace times the fast trace");
  // The fast kernels' tiles are fixed: any other block size is refused at the flags, in every build.
  expect_usage_error("bench stream --block-m 32", "--kernel fast takes --block-m 64 --block-n 64");
  expect_usage_error("bench stream --kernel fast --block-n 128", "--kernel fast takes --block-m 64 --block-n 64");
  // The sharded run's layout and K exchange: only with --gpus, known names, pieces only for zigzag.
  expect_usage_error("bench stream --layout zigzag", "--layout applies to --gpus");
  expect_usage_error("bench stream --exchange pieces", "--exchange applies to --gpus");
  expect_usage_error("bench stream --gpus 2 --layout contiguous,spiral", "--layout 'spiral' is unknown");
  expect_usage_error("bench stream --gpus 2 --layout zigzag --exchange whole,bits", "--exchange 'bits' is unknown");
  expect_usage_error("bench stream --gpus 2 --layout contiguous --exchange pieces", "--exchange pieces splits the K exchange of the zigzag");
  // Folds, the schedule and the exchange's priority: only with --gpus, known values, folds only for zigzag.
  expect_usage_error("bench stream --folds 2", "--folds applies to --gpus");
  expect_usage_error("bench stream --schedule overlap", "--schedule applies to --gpus");
  expect_usage_error("bench stream --comm-priority high", "--comm-priority applies to --gpus");
  expect_usage_error("bench stream --timeline", "--timeline applies to --gpus");
  expect_usage_error("bench stream --gpus 2 --folds 0", "--folds: '0'");
  expect_usage_error("bench stream --gpus 2 --folds 17", "--folds");
  expect_usage_error("bench stream --gpus 2 --layout contiguous --folds 1,2", "--folds deals the zigzag layout");
  // The defaults (pieces, 8 folds) split zigzag's exchange and chunks: contiguous alone takes whole
  // and 1, not the errors above (what follows depends on the build and the GPUs: a refusal or the run).
  for (const char* cmd : {"bench stream --gpus 2 --layout contiguous --seq 4096 --dim 64 --k 4 --reps 1 --warmup 0",
                          "bench stream --gpus 2 --layout contiguous --exchange whole --seq 4096 --dim 64 --k 4 --reps 1 --warmup 0",
                          "bench stream --gpus 2 --layout contiguous --folds 1 --seq 4096 --dim 64 --k 4 --reps 1 --warmup 0"}) {
    INFO(cmd);
    const auto r = run_cli(cmd);
    CHECK_THAT(r.out + r.err, !Catch::Contains("--folds deals") && !Catch::Contains("--exchange pieces splits"));
  }
  expect_usage_error("bench stream --gpus 2 --schedule serial,eager", "--schedule 'eager' is unknown");
  expect_usage_error("bench stream --gpus 2 --comm-priority urgent", "--comm-priority 'urgent' is unknown");
  expect_usage_error("bench stream --transport copy", "--transport applies to --gpus");
  expect_usage_error("bench stream --gpus 2 --transport nccl,pigeon", "--transport 'pigeon' is unknown");
  // T: 8M on one GPU's sweep, 16M dealt over GPUs (bf16), weak scaling's total included.
  expect_usage_error("bench stream --seq 16777216", "from 1 to 8388608");
  expect_usage_error("bench stream --gpus 4 --seq 16777217", "from 1 to 16777216");
  expect_usage_error("bench stream --gpus 4 --scaling weak --seq 8388608", "past 16777216 tokens");
}

TEST_CASE("cli bench stream: without CUDA, or without a GPU, it says so and exits non-zero", "[cli][bench][errors]") {
  const auto r = run_gpu_command("bench stream --seq 4096 --dim 64 --k 4 --reps 1 --warmup 0");
  if (r.exit_code == 0)  // a GPU: the fast estimate and apply rows
    CHECK_THAT(r.out, Catch::Contains("device:") && Catch::Contains("estimate") && Catch::Contains("apply"));
}
