// `flashlab traffic mta` (the model; --device cuda measures on a GPU) and the `--device` flag of
// `flashlab mta`: what a machine without a GPU can check — the model table and CSV, the usage
// errors naming the flag, --device cpu handing over to the reference command.
#include <catch2/catch.hpp>

#include "run_cli.hpp"

#include <string>

using flashlab::test::expect_usage_error;
using flashlab::test::run_cli;

TEST_CASE("cli traffic mta: the model of every pass, table and CSV", "[cli][traffic][mta]") {
  const auto table = run_cli("traffic mta --seq 100 --heads 2 --dim 16 --cq 3 --ck 5 --block 32 --splits 3");
  REQUIRE(table.exit_code == 0);
  for (const char* word : {"fwd", "bwd", "infer", "model read", "W 3x5"}) CHECK_THAT(table.out, Catch::Contains(word));
  const auto csv = run_cli("traffic mta --pass fwd --seq 100 --heads 2 --dim 16 --cq 3 --ck 5 --block 32 --csv");
  REQUIRE(csv.exit_code == 0);
  CHECK_THAT(csv.out, Catch::StartsWith("pass,batch,seq,heads,dim,cq,ck,block,splits,model_read_bytes"));
  CHECK_THAT(csv.out, Catch::Contains("\nfwd,1,100,2,16,3,5,32,"));
}

TEST_CASE("cli traffic mta and mta --device: bad flags are usage errors naming the flag", "[cli][mta][errors]") {
  expect_usage_error("traffic mta --ck 4", "--ck 4 is even");
  expect_usage_error("traffic mta --pass both", "--pass 'both'");
  expect_usage_error("traffic mta --pass bwd --block 4 --ck 3", "block B = 4");
  expect_usage_error("traffic mta --pass infer --cq 17 --block 64", "--cq 17");
  expect_usage_error("traffic mta --device tpu", "--device 'tpu'");
  expect_usage_error("mta fwd --device tpu", "--device 'tpu'");
  expect_usage_error("mta fwd --device cuda --kernel quick", "--kernel 'quick' is unknown");
  expect_usage_error("mta fwd --device cuda --kernel fast --dtype fp32", "--dtype 'fp32' is unknown");
  expect_usage_error("mta infer --device cuda --kernel fast", "--kernel fast runs mta fwd and bwd");
#ifdef FLASHLAB_TEST_HAVE_CUDA
  // Checked before the GPU is looked for, so a build with CUDA refuses them on any machine.
  expect_usage_error("mta fwd --device cuda --ck 2", "--ck 2 is even");
  expect_usage_error("mta bwd --device cuda --block 4", "--block");
  expect_usage_error("mta fwd --device cuda --inputs /nonexistent-dir", "not a directory");
  expect_usage_error("mta fwd --device cuda --kernel fast --dim 96", "HEAD_DIM = 96 is not 64 or 128");
  expect_usage_error("mta bwd --device cuda --kernel fast --ck 17 --block 64", "ck = 17");
#else
  expect_usage_error("traffic mta --device cuda", "built without CUDA");
  expect_usage_error("mta fwd --device cuda", "built without CUDA");
#endif
}

TEST_CASE("cli mta --device cpu runs the reference command", "[cli][mta]") {
  const auto r = run_cli("mta fwd --device cpu --seq 20 --heads 1 --dim 8");
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("flashlab mta fwd: batch=1 N=20"));
}
