// The tile assembler goes through the toy machine's front end: the same limits and the same
// messages for lines, loops and index expressions, plus its own operands. Hostile inputs are
// generated here; each ends in one located diagnostic, fast.
#include <catch2/catch.hpp>

#include <string>

#include "flashlab/lessons/tile.hpp"
#include "flashlab/toymachine/assembler.hpp"
#include "flashlab/toymachine/frontend.hpp"
#include "flashlab/toymachine/machine.hpp"

using namespace flashlab::lessons;
namespace toy = flashlab::toy;

namespace {

std::string repeat(const std::string& s, std::size_t n) {
  std::string out;
  for (std::size_t i = 0; i < n; ++i) out += s;
  return out;
}

toy::Diagnostic only_error(const std::string& text) {
  const auto p = tile::assemble_tiles(text, tile::lesson_shape(3), "h.trace");
  REQUIRE(p.diagnostics.size() == 1);
  CHECK(p.code.empty());
  return p.diagnostics[0];
}

}  // namespace

TEST_CASE("tile front end: deep nesting, huge loops and overflow are located errors", "[tile][frontend][hostile]") {
  const auto parens = only_error("LOAD Q[" + repeat("(", 100000) + "0" + repeat(")", 100000) + "], R0\n");
  CHECK(parens.col == 8 + toy::kMaxNesting);
  CHECK(parens.message.rfind("index expression nested deeper than 32 levels", 0) == 0);
  std::string loops;
  for (int k = 0; k < 100000; ++k) loops += "for v" + std::to_string(k) + " in 0..1\n";
  const auto deep = only_error(loops + "LOAD Q[0], R0\n" + repeat("end\n", 100000));
  CHECK(deep.line == toy::kMaxNesting + 1);
  CHECK(deep.message == "loops nested deeper than 32 levels");
  const auto big = only_error("for i in 0..9223372036854775807\n  LOAD Q[0], R0\nend\n");
  CHECK(big.message == "the loops expand to more than 1000000 instructions");
  const auto spin = only_error("for i in 0..1000000000\n  for j in 1..0\n    LOAD Q[0], R0\n  end\nend\n");
  CHECK(spin.message == "the loops iterate more than 1000000 times");
  const auto ovf = only_error("LOAD Q[3037000500*3037000500], R0\n");
  CHECK(ovf.col == 18);
  CHECK(ovf.message == "index arithmetic overflows in index '3037000500*3037000500' (with n = 3)");
  const auto neg = only_error("LOAD Q[-(-9223372036854775807-1)], R0\n");
  CHECK(neg.message.rfind("index arithmetic overflows", 0) == 0);
  // An empty loop a billion times is nothing at all.
  const auto empty = tile::assemble_tiles("for i in 0..1000000000\nend\n", tile::lesson_shape(3), "e.trace");
  CHECK(empty.ok());
  CHECK(empty.code.empty());
}

TEST_CASE("tile front end: a register number of any length is an error, not an exception", "[tile][frontend][hostile]") {
  const auto huge = only_error("LOAD Q[0], R99999999999999999999\n");
  CHECK(huge.message == "no register R99999999999999999999");
  CHECK(huge.hint == "this tile machine has 4 tile registers, R0..R3");
  const auto attn = tile::assemble_tiles("ATTN R0, R1, R2, R4294967296\n", tile::lesson_shape(3), "a.trace");
  REQUIRE(attn.diagnostics.size() == 1);
  CHECK(attn.diagnostics[0].col == 18);
}

TEST_CASE("tile front end: loop and line errors read the same as the toy machine's", "[tile][frontend]") {
  const toy::Machine m = toy::builtin_machine("matmul3");
  for (const std::string text : {"for i in 0..n-1\n", "end\n", "for in 0..1\nend\n", "for i in 0..\nend\n",
                                 "for i in 0..1\n for i in 0..1\n end\nend\n", "1.. LOAD\n", "$ LOAD\n"}) {
    INFO(text);
    const auto toy_diag = toy::assemble(text, m, "same.trace").diagnostics;
    const auto tile_diag = tile::assemble_tiles(text, tile::lesson_shape(3), "same.trace").diagnostics;
    REQUIRE(toy_diag.size() == tile_diag.size());
    for (std::size_t k = 0; k < toy_diag.size(); ++k)
      CHECK(toy::format_diagnostic(toy_diag[k]) == toy::format_diagnostic(tile_diag[k]));
  }
}
