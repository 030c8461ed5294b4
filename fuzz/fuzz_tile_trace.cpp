// libFuzzer target: the lessons' tile assembler (the shared trace front end plus the tile
// operands) and the tile machine. The first byte picks n; the rest is the trace. Anything may be
// rejected with diagnostics or end in a fault; nothing may crash, hang or throw.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "flashlab/lessons/tile.hpp"
#include "flashlab/toymachine/diagnostic.hpp"

namespace tile = flashlab::lessons::tile;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const tile::TileShape shape = tile::lesson_shape(1 + data[0] % 6);
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  const auto program = tile::assemble_tiles(text, shape, "fuzz.trace");
  for (const auto& d : program.diagnostics) (void)flashlab::toy::format_diagnostic(d);
  if (!program.ok() || program.code.size() > 20'000) return 0;
  const auto in = tile::random_tile_inputs(shape, 1);
  (void)tile::run_tiles(program, shape, in.q, in.k, in.v);
  return 0;
}
