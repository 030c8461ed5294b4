// Counted traffic of the flash MTA loops equals the closed-form formulas of mta_traffic.hpp,
// tensor by tensor (elements read, elements written, bytes) and in flops.
#include <catch2/catch.hpp>

#include "flashlab/reference/mta_traffic.hpp"
#include "test_mta_util.hpp"

#include <algorithm>
#include <vector>

using namespace flashlab::ref;
using mta_test::make_inputs;

namespace {

void check_same(const Traffic& counted, const Traffic& formula) {
  CHECK(counted.tensors().size() == formula.tensors().size());
  for (const auto& f : formula.tensors()) {
    INFO("tensor " << f.name);
    const auto* c = counted.find(f.name);
    REQUIRE(c != nullptr);
    CHECK(c->read_elements == f.read_elements);
    CHECK(c->write_elements == f.write_elements);
    CHECK(c->element_bytes == f.element_bytes);
  }
  CHECK(counted.flops() == formula.flops());
  CHECK(counted.total_read_bytes() == formula.total_read_bytes());
  CHECK(counted.total_write_bytes() == formula.total_write_bytes());
}

// The definition of tile_coverage, by brute force.
std::uint64_t coverage_by_loop(long long n, long long stride, long long above, long long below) {
  std::uint64_t total = 0;
  for (long long t = 0; t * stride < n; ++t) {
    const long long lo = std::max(t * stride - above, 0LL), hi = std::min(t * stride + stride + below, n);
    total += std::uint64_t(hi - lo);
  }
  return total;
}

}  // namespace

TEST_CASE("mta traffic: tile_coverage by hand and against its definition", "[mta][traffic]") {
  // N = 10, Br = 3, Pq = 1: tiles [−1,3) [2,6) [5,9) [8,12) load 3 + 4 + 4 + 2 = 13 rows.
  CHECK(mta::tile_coverage(10, 3, 1, 0) == 13);
  // N = 10, Bc = 2, Pk = 2 each side: tiles of 6 at −2, 0, 2, 4, 6 → 4 + 6 + 6 + 6 + 4 = 26.
  CHECK(mta::tile_coverage(10, 2, 2, 2) == 26);
  // No halo: the effective tiles partition [0, N).
  CHECK(mta::tile_coverage(37, 5, 0, 0) == 37);
  for (long long n = 1; n <= 30; ++n)
    for (long long s = 1; s <= 9; ++s)
      for (long long a = 0; a <= 10; ++a)
        for (long long b = 0; b <= 10; ++b) {
          INFO("n=" << n << " stride=" << s << " above=" << a << " below=" << b);
          REQUIRE(mta::tile_coverage(std::uint64_t(n), std::uint64_t(s), std::uint64_t(a), std::uint64_t(b)) ==
                  coverage_by_loop(n, s, a, b));
        }
}

TEST_CASE("mta traffic: counted equals the formulas (ragged tails included)", "[mta][traffic]") {
  struct Case {
    Shape shape;
    std::size_t cq, ck, block, splits;
  };
  const std::vector<Case> cases = {
      {Shape{1, 17, 1, 4}, 1, 1, 4, 1},   {Shape{2, 23, 3, 2}, 2, 3, 7, 3}, {Shape{1, 31, 2, 3}, 3, 5, 11, 2},
      {Shape{1, 5, 1, 8}, 3, 3, 16, 4},   {Shape{1, 1, 1, 1}, 2, 5, 9, 1},  {Shape{2, 40, 1, 5}, 3, 1, 6, 7},
      {Shape{1, 12, 2, 3}, 1, 3, 8, 12}};
  for (const auto& cs : cases) {
    INFO("shape " << mta_test::shape_text(cs.shape) << " cq=" << cs.cq << " ck=" << cs.ck << " B=" << cs.block
                  << " splits=" << cs.splits);
    const auto in = make_inputs(cs.shape, cs.cq, cs.ck, 5);
    mta::Params p;
    p.cq = cs.cq;
    p.ck = cs.ck;
    p.block = cs.block;
    p.splits = cs.splits;
    for (Dtype dt : {Dtype::fp32, Dtype::bf16}) {
      Traffic fwd(dt), bwd(dt), inf(dt);
      const auto f = mta::flash_forward(in.q, in.k, in.v, in.w, p, &fwd);
      mta::flash_backward(in.q, in.k, in.v, in.w, f.o, f.m, f.l, in.d_o, p, &bwd);
      mta::flash_infer(in.q, in.k, in.v, in.w, p, &inf);
      {
        INFO("forward");
        check_same(fwd, mta::forward_traffic(cs.shape, p, dt));
      }
      {
        INFO("backward");
        check_same(bwd, mta::backward_traffic(cs.shape, p, dt));
      }
      {
        INFO("inference");
        check_same(inf, mta::infer_traffic(cs.shape, p, dt));
      }
    }
  }
}

TEST_CASE("mta traffic: the halo is recomputed, and without halo Q is read once per key tile", "[mta][traffic]") {
  const Shape s{1, 30, 1, 4};
  mta::Params p;
  p.block = 6;
  const auto t = mta::forward_tiling(30, p);  // cq = ck = 1: no halo, Br = Bc = 6, Tr = Tc = 5
  const auto plain = mta::forward_traffic(s, p);
  CHECK(plain.find("Q")->read_elements == t.tc * 30 * 4);
  CHECK(plain.find("K")->read_elements == t.tr * 30 * 4);
  p.cq = 3;
  p.ck = 3;  // Br = 4, Bc = 4: tiles of 6 rows overlap by 2
  const auto halo = mta::forward_traffic(s, p);
  const auto th = mta::forward_tiling(30, p);
  CHECK(th.br == 4);
  CHECK(th.tr == 8);
  // Each K tile loads B = 6 rows where it owns 4 (2 at the edges are padding):
  // 8 tiles × 6 − 1 (above row 0) − (8·4 + 1 − 30 = 3) = 44 rows, read once per query tile.
  CHECK(halo.find("K")->read_elements == std::uint64_t(th.tr) * 44 * 4);
}

TEST_CASE("mta traffic: a tiny forward and backward counted by hand", "[mta][traffic]") {
  // N = 5, d = 1, B = 3, cq = 2 (Pq = 1), ck = 1. Forward: Br = 2, Bc = 3, Tr = 3, Tc = 2.
  // Q/O row tiles [−1,2) [1,4) [3,6) load 2 + 3 + 2 = 7 rows; K/V tiles [0,3) [3,6) load 5.
  const auto in = make_inputs(Shape{1, 5, 1, 1}, 2, 1, 9);
  mta::Params p;
  p.cq = 2;
  p.ck = 1;
  p.block = 3;
  Traffic fwd;
  mta::flash_forward(in.q, in.k, in.v, in.w, p, &fwd);
  CHECK(fwd.find("Q")->read_elements == 2 * 7);      // once per key tile
  CHECK(fwd.find("K")->read_elements == 3 * 5);      // once per query tile
  CHECK(fwd.find("W")->read_elements == 3 * 2);      // once per query tile
  CHECK(fwd.find("O")->read_elements == 2 * 7 + 5);  // RMW of whole tiles + final pass
  CHECK(fwd.find("O")->write_elements == 5 + 2 * 5 + 5);  // zero init + RMW effective rows + final
  CHECK(fwd.find("M")->write_elements == 5);
  CHECK(fwd.flops() == 3 * 2 * (4 * 9 * 1 + 2 * 9 * 2));

  // Backward on N = 4: Br = B − 2Pq = 1, Bc = 3, Tr = 4, Tc = 2. Centred row tiles [t−1, t+2)
  // load 2 + 3 + 3 + 2 = 10 rows; key tiles [0,3) [3,6) load 4.
  const auto in4 = make_inputs(Shape{1, 4, 1, 1}, 2, 1, 10);
  const auto f4 = mta::flash_forward(in4.q, in4.k, in4.v, in4.w, p);
  Traffic bwd;
  mta::flash_backward(in4.q, in4.k, in4.v, in4.w, f4.o, f4.m, f4.l, in4.d_o, p, &bwd);
  CHECK(bwd.find("Q")->read_elements == 2 * 2 * 10);  // both loops, once per tile pair
  CHECK(bwd.find("K")->read_elements == 2 * 4 * 4);
  CHECK(bwd.find("dO")->read_elements == 4 + 10 + 2 * 10);  // preprocessing, dQ loop, dK/dV loop
  CHECK(bwd.find("M")->read_elements == 10 + 2 * 10);
  CHECK(bwd.find("dQ")->read_elements == 1 * 10 + 4);  // RMW from the 2nd key tile, final scale
  CHECK(bwd.find("dQ")->write_elements == 2 * 4 + 4);
  CHECK(bwd.find("dV")->read_elements == 3 * 4);  // RMW from the 2nd query tile
  CHECK(bwd.find("dV")->write_elements == 4 * 4);
  CHECK(bwd.find("dK")->read_elements == 3 * 4 + 4);
  CHECK(bwd.find("dK")->write_elements == 4 * 4 + 4);
  CHECK(bwd.find("dW")->read_elements == 4 * 2);       // one atomic add per row tile
  CHECK(bwd.find("dW")->write_elements == 2 + 4 * 2);  // zero init + atomic adds
  CHECK(bwd.find("W")->read_elements == (4 + 2) * 2);
}
