// `flashlab traffic stream-shards`: STREAM sharded over G simulated GPUs — the per-rank table, the
// schemes' bytes in its three output forms, and the refusals of bad flags.
#include <catch2/catch.hpp>

#include <sstream>
#include <string>

#include "run_cli.hpp"

using flashlab::test::expect_usage_error;
using flashlab::test::run_cli;

TEST_CASE("cli traffic stream-shards: the table, CSV and JSON of a small sharded estimate", "[cli][stream][shards]") {
  const auto r = run_cli("traffic stream-shards --gpus 3 --seq 2000 --dim 16 --block-m 32 --block-n 16 --k 4 --threads 2");
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("G = 3 GPUs") && Catch::Contains("keys_visible") &&
                        Catch::Contains("keys_scored") && Catch::Contains("queries_to_keys") &&
                        Catch::Contains("I equal to the single-GPU estimate: yes"));
  // Rank 0 holds the first keys: under the causal mask it needs nothing from the others.
  CHECK_THAT(r.out, Catch::Contains("[0, 672)"));

  const auto csv = run_cli("traffic stream-shards --gpus 3 --seq 2000 --dim 16 --block-m 32 --block-n 16 --k 4 --csv");
  REQUIRE(csv.exit_code == 0);
  std::istringstream in(csv.out);
  std::string line;
  std::getline(in, line);
  // The shared writer: the problem's fields, then each (scheme, rank) row's.
  CHECK(line.rfind("T,d,block_m,block_n,k,gpus,", 0) == 0);
  CHECK_THAT(line, Catch::Contains("rows.scheme,rows.rounds,rows.max_in_bytes,rows.total_bytes,rows.rank,rows.estimate_in_bytes,"));
  int rows = 0;
  while (std::getline(in, line)) rows += !line.empty();
  CHECK(rows == 9);  // three schemes × three ranks

  const auto json = run_cli("traffic stream-shards --gpus 2 --seq 512 --dim 8 --k 2 --json");
  REQUIRE(json.exit_code == 0);
  CHECK_THAT(json.out, Catch::Contains("\"indices_equal_single_gpu\": true") &&
                           Catch::Contains("\"scheme\": \"queries_to_keys\"") && Catch::Contains("\"max_in_bytes\""));
  // The same simulation on one GPU moves nothing.
  const auto one = run_cli("traffic stream-shards --gpus 1 --seq 512 --dim 8 --k 2 --json");
  CHECK_THAT(one.out, Catch::Contains("\"total_bytes\": 0"));
}

TEST_CASE("cli traffic stream-shards: bad flags are refused by name", "[cli][stream][shards][errors]") {
  expect_usage_error("traffic stream-shards --gpus 0", "--gpus");
  expect_usage_error("traffic stream-shards --link-bytes 3", "--link-bytes 3 is not an element size");
  expect_usage_error("traffic stream-shards --seq 1048576 --dim 1024", "at most 2^27");
  expect_usage_error("traffic stream-shards --csv --json", "--json and --csv exclude each other");
  expect_usage_error("traffic stream-shards --seed -1", "--seed -1 is out of range");
  expect_usage_error("traffic stream-shards --seq 100 --mask /nonexistent/mask.txt", "mask");
}
