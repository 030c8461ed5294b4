// Fuzz target: the STREAM block-mask reader (reference/src/stream/stream_mask.cpp). The first four
// bytes choose the geometry (T, b_q, b_k) and the format (bit 0 of byte 4: .npy or text); the rest
// is the file. A mask that loads is then queried everywhere its users query it. Every input must
// end in a mask or a StreamError; anything else is a bug.
#include "flashlab/reference/stream.hpp"

#include <cstdint>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace rs = flashlab::ref::stream;
  if (size < 4) return 0;
  const rs::Geometry g{1 + std::size_t(data[0]) % 200, 1 + std::size_t(data[1]) % 16, 1 + std::size_t(data[2]) % 16};
  const bool npy = data[3] & 1;
  const std::string_view file(reinterpret_cast<const char*>(data) + 4, size - 4);
  try {
    const rs::BlockMask mask = rs::parse_block_mask(file, "fuzz.mask", npy, g, std::uint64_t{1} << 20);
    const std::size_t nk = g.n_k();
    for (std::size_t q = 0; q < g.n_q(); ++q) {
      std::size_t valid = 0;
      for (std::size_t r = 0; r < nk; ++r) valid += mask.valid(q, r) ? 1 : 0;
      if (valid != mask.count_valid(q)) __builtin_trap();
      const auto first = mask.first_valid(q, 0, nk - 1), last = mask.last_valid(q, 0, nk - 1);
      if ((first < 0) != (valid == 0) || (last < 0) != (valid == 0) || first > last) __builtin_trap();
    }
    for (std::size_t t = 0; t < g.T; t += 7) (void)mask.token_valid(t, t / 2);
  } catch (const rs::StreamError&) {
    // A refusal with a message naming the file and the position: the expected outcome.
  }
  return 0;
}
