// `flashlab traffic ring`: the model of the bytes between GPUs of context-parallel attention,
// step by step, beside the CPU simulation's count of what its ring copied; its CSV and JSON
// forms; the refusals of bad flags.
#include <catch2/catch.hpp>

#include <algorithm>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "run_cli.hpp"

using flashlab::test::expect_usage_error;
using flashlab::test::run_cli;

namespace {

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

}  // namespace

TEST_CASE("cli traffic ring: a small ring is simulated and its bytes equal the model", "[cli][ring]") {
  const auto r = run_cli("traffic ring --gpus 4 --seq 256 --heads 4 --heads-kv 2 --dim 64 --causal");
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("ring attention on 4 GPUs (zigzag, causal)") != std::string::npos);
  CHECK(r.out.find("each GPU holds 2 chunks of 32 rows (N_local = 64)") != std::string::npos);
  CHECK(r.out.find("\nforward\n") != std::string::npos);
  CHECK(r.out.find("\nbackward\n") != std::string::npos);
  CHECK(r.out.find("(dK/dV home)") != std::string::npos);
  CHECK(r.out.find("counted == model: yes") != std::string::npos);
  // K per step: 64 rows x 2 heads x 64 x 2 bytes = 16384 bytes, and V as much: 32.8 kB sent per GPU.
  CHECK(r.out.find("32.8 kB") != std::string::npos);
}

TEST_CASE("cli traffic ring: CSV has one row per pass and step with the model's bytes", "[cli][ring]") {
  const auto r = run_cli("traffic ring --gpus 4 --seq 64 --heads 4 --heads-kv 2 --dim 16 --causal --csv");
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const auto rows = lines(r.out);
  REQUIRE(rows.size() == 1 + 4 + 5);  // header, forward steps 0..3, backward steps 0..4
  // The shared writer: the problem, the rates and the verdict repeated in front of every step.
  CHECK(rows[0].rfind("problem.gpus,problem.layout,", 0) == 0);
  const std::string steps = "steps.pass,steps.step,steps.kv_source_of_gpu0,steps.sent_K,steps.sent_V,steps.sent_dK,"
                            "steps.sent_dV,steps.sent_bytes,";
  const auto at = rows[0].find(steps);
  REQUIRE(at != std::string::npos);
  CHECK(rows[0].find(",counted_equals_model,") < at);
  // The step columns start at the same field in every row: cut the fields before them.
  const auto fields_before = std::count(rows[0].begin(), rows[0].begin() + std::ptrdiff_t(at), ',');
  const auto tail = [&](const std::string& row) {
    std::size_t p = 0;
    for (long i = 0; i < fields_before; ++i) p = row.find(',', p) + 1;
    return row.substr(p);
  };
  CHECK(rows[1].find("4,zigzag,") == 0);
  CHECK(rows[1].find(",true,") != std::string::npos);  // counted == model
  // N_local = 16 rows x 2 K/V heads x 16 x 2 bytes = 1024 bytes of K; the dK sums travel in fp32.
  CHECK(tail(rows[1]).rfind("forward,0,0,1024,1024,0,0,2048,", 0) == 0);
  CHECK(tail(rows[2]).rfind("forward,1,3,1024,1024,0,0,2048,", 0) == 0);
  CHECK(tail(rows[4]).rfind("forward,3,1,0,0,0,0,0,", 0) == 0);
  CHECK(tail(rows[7]).rfind("backward,2,2,1024,1024,2048,2048,6144,", 0) == 0);
  CHECK(tail(rows[9]).rfind("backward,4,,0,0,2048,2048,4096,", 0) == 0);  // dK/dV home: no K/V source
}

TEST_CASE("cli traffic ring: JSON says whether the count equals the model", "[cli][ring]") {
  const auto r = run_cli("traffic ring --gpus 3 --seq 30 --heads 2 --dim 8 --json --pass fwd");
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("\"counted_equals_model\": true") != std::string::npos);
  CHECK(r.out.find("\"layout\": \"contiguous\"") != std::string::npos);  // the default without --causal
  CHECK(r.out.find("\"pass\": \"forward\"") != std::string::npos);
  CHECK(r.out.find("\"pass\": \"backward\"") == std::string::npos);
}

TEST_CASE("cli traffic ring: N that does not divide into the chunks is padded, and still counts", "[cli][ring]") {
  const auto r = run_cli("traffic ring --gpus 4 --seq 37 --heads 2 --heads-kv 1 --dim 8 --causal");
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("padded at its end to 40 rows") != std::string::npos);
  CHECK(r.out.find("counted == model: yes") != std::string::npos);
}

TEST_CASE("cli traffic ring: at long sequences the ring hides the link and the simulation is left out", "[cli][ring]") {
  const auto r = run_cli("traffic ring --gpus 4 --seq 524288 --heads 16 --dim 128 --causal");
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("the ring hides the communication: yes") != std::string::npos);
  CHECK(r.out.find("counted == model: not run") != std::string::npos);
  CHECK(std::regex_search(r.out, std::regex("--seq [0-9]+ or less shows the count")));
  // ...and at short ones it does not (370 GB/s against 600 TFLOP/s: N_local below ~3200 rows)
  const auto s = run_cli("traffic ring --gpus 4 --seq 4096 --heads 16 --dim 128 --causal --pass fwd");
  REQUIRE(s.exit_code == 0);
  CHECK(s.out.find("the ring hides the communication: no") != std::string::npos);
  // a faster link hides it
  const auto f = run_cli("traffic ring --gpus 4 --seq 4096 --heads 16 --dim 128 --causal --pass fwd --link-gbps 4000");
  REQUIRE(f.exit_code == 0);
  CHECK(f.out.find("the ring hides the communication: yes") != std::string::npos);
}

TEST_CASE("cli traffic ring: bad flags are usage errors naming the flag", "[cli][ring][errors]") {
  expect_usage_error("traffic ring --seq 1024", "--gpus is required");
  expect_usage_error("traffic ring --gpus 4", "--seq is required");
  expect_usage_error("traffic ring --gpus 0 --seq 1024", "gpus");
  expect_usage_error("traffic ring --gpus 4 --seq 1024 --heads 6 --heads-kv 4", "--heads-kv 4 does not divide --heads 6");
  expect_usage_error("traffic ring --gpus 4 --seq 1024 --layout ring", "--layout 'ring' is unknown");
  expect_usage_error("traffic ring --gpus 4 --seq 1024 --dtype fp8", "--dtype 'fp8' is unknown");
  expect_usage_error("traffic ring --gpus 4 --seq 1024 --pass up", "--pass 'up' is unknown");
  expect_usage_error("traffic ring --gpus 4 --seq 1024 --link-gbps 0", "--link-gbps");
  expect_usage_error("traffic ring --gpus 4 --seq 1024 --tflops -5", "--tflops");
  expect_usage_error("traffic ring --gpus 4 --seq 1024 --csv --json", "--json and --csv exclude each other");
  expect_usage_error("traffic ring --gpus 4 --seq 1024 --device tpu", "--device 'tpu' is unknown");
#ifdef FLASHLAB_TEST_HAVE_CUDA
  // Refused before any GPU is touched: by the ring's dtype rule, or by a build without NCCL.
  expect_usage_error("traffic ring --gpus 4 --seq 1024 --device cuda --dtype fp32", "--device cuda");
#else
  expect_usage_error("traffic ring --gpus 4 --seq 1024 --device cuda", "built without CUDA");
#endif
}

TEST_CASE("cli traffic ring: the recorded measurement stands beside the model for the shapes it holds", "[cli][ring]") {
  const std::string shape = "traffic ring --gpus 4 --seq 524288 --heads 16 --dim 128 --causal";
  const auto text = run_cli(shape);
  REQUIRE(text.exit_code == 0);
  // One line per pass: the bytes handed to NCCL equal the model's, and the times beside it.
  const std::regex measured("measured \\(recorded, 4 x [^,]+, 20[0-9-]+ [0-9:]+\\): ring [0-9.]+ ms \\(the model "
                            "[0-9.]+\\); sent per GPU [0-9.]+ GB, the model [0-9.]+ GB: equal");
  const auto lines = std::distance(std::sregex_iterator(text.out.begin(), text.out.end(), measured), std::sregex_iterator());
  CHECK(lines == 2);
  CHECK_THAT(text.out, !Catch::Contains("no recorded run"));
  const auto json = run_cli(shape + " --json");
  REQUIRE(json.exit_code == 0);
  CHECK_THAT(json.out, Catch::Contains("\"source\": \"recorded\"") && Catch::Contains("\"counted_equals_model\": true"));
  // Another shape: the model alone, and the shapes that were recorded.
  const auto other = run_cli("traffic ring --gpus 4 --seq 131072 --heads 16 --heads-kv 4 --dim 128 --causal");
  REQUIRE(other.exit_code == 0);
  CHECK_THAT(other.out, Catch::Contains("measured: no recorded run of this shape") &&
                            Catch::Contains("--gpus 4 --seq 524288 --heads 16 --heads-kv 16 --dim 128 --causal"));
  CHECK_THAT(other.out, !Catch::Contains("measured (recorded"));
}
