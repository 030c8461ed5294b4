// Closed-form traffic of the flash MTA paths. Every count is per (batch, head) unless noted and
// derived from the loop structure of the MTA kernels (docs/mta.md, "Traffic"); the tests hold the
// tile loops to these numbers.
#include "flashlab/reference/mta_traffic.hpp"

#include <algorithm>

namespace flashlab::ref::mta {

namespace {
using u64 = std::uint64_t;
u64 ceil_div(u64 a, u64 b) { return (a + b - 1) / b; }
}  // namespace

std::uint64_t tile_coverage(u64 n, u64 stride, u64 above, u64 below) {
  const u64 tiles = ceil_div(n, stride);
  // Every tile intersects [0, n) (its effective part does), so what padding cuts off at the
  // top and at the bottom are disjoint and can be subtracted separately.
  const u64 full = tiles * (stride + above + below);
  // Top: tile t starts at t·stride − above and loses max(0, above − t·stride) rows.
  const u64 mt = std::min(ceil_div(above, stride), tiles);
  const u64 top = mt * above - stride * (mt * (mt - (mt > 0 ? 1 : 0)) / 2);
  // Bottom: the last tile ends at tiles·stride + below = n + slack + below; each earlier tile
  // ends `stride` sooner.
  const u64 excess = tiles * stride - n + below;
  const u64 mb = std::min(ceil_div(excess, stride), tiles);
  const u64 bottom = mb * excess - stride * (mb * (mb - (mb > 0 ? 1 : 0)) / 2);
  return full - top - bottom;
}

Traffic forward_traffic(const Shape& shape, const Params& p, Dtype dtype) {
  const Tiling t = forward_tiling(shape.seq, p);
  const u64 n = shape.seq, d = shape.head_dim, heads = shape.batch * shape.heads, bsz = p.block;
  const u64 w = p.cq * p.ck;
  const u64 cover_r = tile_coverage(n, t.br, p.pq(), 0);         // Q/O rows loaded per key tile
  const u64 cover_c = tile_coverage(n, t.bc, p.pk(), p.pk());    // K/V rows loaded per query tile
  Traffic tr(dtype);
  for (const char* name : {"Q", "K", "V", "W", "O", "M", "L"}) tr.declare(name);
  tr.read("Q", heads * t.tc * cover_r * d);
  tr.read("K", heads * t.tr * cover_c * d);
  tr.read("V", heads * t.tr * cover_c * d);
  tr.read("W", heads * t.tr * w);
  // O: zero-initialised (N·d), read-modify-written per tile pair (full tile read, effective
  // rows written: the effective regions of the Tr tiles partition [0, N)), then normalised.
  tr.write("O", heads * (t.tc + 2) * n * d);
  tr.read("O", heads * (t.tc * cover_r + n) * d);
  tr.write("M", heads * n);
  tr.write("L", heads * n);
  tr.add_flops(heads * t.tr * t.tc * (4 * bsz * bsz * d + 2 * bsz * bsz * w));
  return tr;
}

Traffic backward_traffic(const Shape& shape, const Params& p, Dtype dtype) {
  const Tiling t = backward_tiling(shape.seq, p);
  const u64 n = shape.seq, d = shape.head_dim, heads = shape.batch * shape.heads, bsz = p.block;
  const u64 w = p.cq * p.ck;
  const u64 cover_r = tile_coverage(n, t.br, p.pq(), p.pq());         // centred doubled row halo
  const u64 cover_c = tile_coverage(n, t.bc, 2 * p.pk(), 2 * p.pk());  // doubled column halo
  Traffic tr(dtype);
  for (const char* name : {"Q", "K", "V", "W", "O", "dO", "M", "L", "D", "dQ", "dK", "dV", "dW"}) tr.declare(name);
  // Q and K: once per tile pair in each of the two loops.
  tr.read("Q", heads * 2 * t.tc * cover_r * d);
  tr.read("K", heads * 2 * t.tr * cover_c * d);
  tr.read("V", heads * 2 * t.tr * cover_c * d);
  tr.read("W", heads * (t.tr + t.tc) * w);
  tr.read("O", heads * n * d);  // preprocessing only
  // dO: preprocessing, once per row tile (dQ loop), once per tile pair (dK/dV loop).
  tr.read("dO", heads * (n + cover_r + t.tc * cover_r) * d);
  tr.write("D", heads * n);
  for (const char* stat : {"M", "L", "D"}) tr.read(stat, heads * (cover_r + t.tc * cover_r));
  // dQ: read-modify-write from the second key tile on, effective rows written, then scaled.
  tr.read("dQ", heads * ((t.tc - 1) * cover_r + n) * d);
  tr.write("dQ", heads * (t.tc + 1) * n * d);
  // dV and dK: read-modify-write from the second query tile on; dK is also scaled at the end.
  tr.read("dV", heads * (t.tr - 1) * cover_c * d);
  tr.write("dV", heads * t.tr * n * d);
  tr.read("dK", heads * ((t.tr - 1) * cover_c + n) * d);
  tr.write("dK", heads * (t.tr + 1) * n * d);
  // dW: zeroed once per head, then one atomic read-modify-write per row tile of every (b, h).
  tr.write("dW", shape.heads * w + heads * t.tr * w);
  tr.read("dW", heads * t.tr * w);
  tr.add_flops(heads * (2 * n * d + t.tr * t.tc * (14 * bsz * bsz * d + 10 * bsz * bsz * w)));
  return tr;
}

Traffic infer_traffic(const Shape& shape, const Params& p, Dtype dtype) {
  const Tiling t = forward_tiling(shape.seq, p);
  const u64 n = shape.seq, d = shape.head_dim, heads = shape.batch * shape.heads, bsz = p.block;
  const u64 w = p.cq * p.ck, splits = p.splits, rows = kInferQueryRows;
  // The splits together load each key tile once: the Tc tiles of the forward's column tiling.
  const u64 cover_c = tile_coverage(n, t.bc, p.pk(), p.pk());
  Traffic tr(dtype);
  for (const char* name : {"Q", "K", "V", "W", "O"}) tr.declare(name);
  tr.read("Q", heads * splits * std::min<u64>(rows, n) * d);
  tr.read("W", heads * splits * w);
  tr.read("K", heads * cover_c * d);
  tr.read("V", heads * cover_c * d);
  tr.write("O", heads * d);
  if (splits > 1) {
    tr.declare("O_s");
    tr.declare("M_s", 4);
    tr.declare("L_s", 4);
    for (const char* part : {"O_s", "M_s", "L_s"}) {
      const u64 elems = heads * splits * (part[0] == 'O' ? d : 1);
      tr.write(part, elems);
      tr.read(part, elems);
    }
  }
  tr.add_flops(heads * t.tc * (2 * rows * bsz * d + 2 * rows * bsz * w + 2 * bsz * d));
  return tr;
}

}  // namespace flashlab::ref::mta
