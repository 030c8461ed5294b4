// The tile model (the toy-machine lesson "Element is Tile" / loop orders) and the progress file.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "flashlab/lessons/checker.hpp"
#include "flashlab/lessons/progress.hpp"
#include "flashlab/lessons/tile.hpp"

using namespace flashlab::lessons;

TEST_CASE("tile: both loop orders compute softmax(QK^T)V and move the lesson text's tile counts", "[tile]") {
  const char* fa2 =
      "for i in 0..n-1\n LOAD Q[i], R0\n LOAD O[i], R3\n for j in 0..n-1\n  LOAD K[j], R1\n  LOAD V[j], R2\n"
      "  ATTN R0, R1, R2, R3\n end\n STORE R3, O[i]\nend\n";
  const char* fa1 =
      "for j in 0..n-1\n LOAD K[j], R1\n LOAD V[j], R2\n for i in 0..n-1\n  LOAD Q[i], R0\n  LOAD O[i], R3\n"
      "  ATTN R0, R1, R2, R3\n  STORE R3, O[i]\n end\nend\n";
  for (int n : {1, 2, 4, 7}) {
    tile::TileShape shape = tile::lesson_shape(n);
    const auto in = tile::random_tile_inputs(shape, 11);
    const auto want = tile::naive_attention(in.q, in.k, in.v, n * shape.rows, shape.d);
    for (const char* text : {fa2, fa1}) {
      const auto prog = tile::assemble_tiles(text, shape, "t");
      REQUIRE(prog.ok());
      const auto run = tile::run_tiles(prog, shape, in.q, in.k, in.v);
      REQUIRE(!run.fault);
      for (std::size_t e = 0; e < want.size(); ++e) CHECK(run.out[e] == Approx(want[e]).epsilon(1e-12));
      const auto N = static_cast<std::uint64_t>(n);
      const bool inner = text == fa2;
      CHECK(run.counters.loads.at('Q') == (inner ? N : N * N));
      CHECK(run.counters.loads.at('K') == (inner ? N * N : N));
      CHECK(run.counters.loads.at('V') == (inner ? N * N : N));
      CHECK(run.counters.loads.at('O') == (inner ? N : N * N));
      CHECK(run.counters.stores.at('O') == (inner ? N : N * N));
      CHECK(run.counters.attn == N * N);
    }
  }
}

TEST_CASE("tile: the assembler locates its errors", "[tile][errors]") {
  const auto shape = tile::lesson_shape(3);
  auto p = tile::assemble_tiles("LOAD Q[0], R9\nSTORE R0, Q[1]\nATTN R0, R1\nfor i in 0..n\n", shape, "x.trace");
  REQUIRE(p.diagnostics.size() == 4);
  CHECK(p.diagnostics[0].line == 1);
  CHECK(p.diagnostics[0].message == "no register R9");
  CHECK(p.diagnostics[1].message == "only O is written: Q is an input");
  CHECK(p.diagnostics[2].message == "ATTN takes 4 operands, got 2");
  CHECK(p.diagnostics[3].message == "'for' without a matching 'end'");
  auto q = tile::assemble_tiles("LOAD Q[i+], R0\n", shape, "y.trace");
  REQUIRE(!q.ok());
  CHECK(q.diagnostics[0].file == "y.trace");
  auto r = tile::run_tiles(tile::assemble_tiles("LOAD Q[5], R0\n", shape, "z"), shape,
                           tile::random_tile_inputs(shape, 1).q, tile::random_tile_inputs(shape, 1).k,
                           tile::random_tile_inputs(shape, 1).v);
  REQUIRE(r.fault);
  CHECK_THAT(*r.fault, Catch::Contains("Q[5] is out of range"));
}

TEST_CASE("progress: XDG_STATE_HOME, round trip, missing file", "[progress]") {
  const auto dir = std::filesystem::temp_directory_path() / ("flashlab_progress_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  ::setenv("XDG_STATE_HOME", dir.c_str(), 1);
  const auto path = progress_path();
  CHECK(path == dir / "flashlab" / "progress");
  CHECK(load_progress(path).trace_passed.empty());
  Progress p;
  p.trace_passed["1"] = "7 cycles, 4 LOADs";
  p.answers_passed["4"] = "answered";
  p.hints_seen["2"] = 2;
  save_progress(path, p);
  const Progress q = load_progress(path);
  CHECK(q.trace_passed.at("1") == "7 cycles, 4 LOADs");
  CHECK(q.answers_passed.count("4") == 1);
  CHECK(q.hints_seen.at("2") == 2);
  ::unsetenv("XDG_STATE_HOME");
  const char* home = std::getenv("HOME");
  if (home) CHECK(progress_path() == std::filesystem::path(home) / ".local" / "state" / "flashlab" / "progress");
  std::filesystem::remove_all(dir);
}

TEST_CASE("tile: the lesson text's cost-comparison table, measured", "[tile]") {
  const std::string t = flashlab::lessons::loop_order_table(4);
  INFO(t);
  CHECK_THAT(t, Catch::Contains("Q loads     4 (n)                 16 (n²)"));
  CHECK_THAT(t, Catch::Contains("KV loads    16 (n²)               4 (n)"));
  CHECK_THAT(t, Catch::Contains("O loads     4 (n)                 16 (n²)"));
  CHECK_THAT(t, Catch::Contains("O stores    4 (n)                 16 (n²)"));
}
