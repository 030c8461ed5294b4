// Flash MTA (forward, backward, split-K inference) against the naive reference on random shapes:
// N not a multiple of the effective tile, cq ∈ {1, 2, 3}, ck ∈ {1, 3, 5}. Tolerance: float64
// round-off, ≤ 1e-12 relative to the reference tensor's max |value| (docs/mta.md).
#include <catch2/catch.hpp>

#include "test_mta_util.hpp"

#include <cmath>
#include <random>

using namespace flashlab::ref;
using mta_test::make_inputs;
using mta_test::rel_to_max;

namespace {

constexpr double kTol = 1e-12;

struct RandomCase {
  Shape shape;
  mta::Params p;
};

// A random shape for (cq, ck) whose N is not a multiple of the effective tiles of the forward
// or the backward (when that is possible at all) and whose block B fits the backward's halos.
RandomCase random_case(std::mt19937_64& rng, std::size_t cq, std::size_t ck) {
  auto pick = [&rng](std::size_t lo, std::size_t hi) { return lo + std::size_t(rng() % (hi - lo + 1)); };
  RandomCase c;
  c.p.cq = cq;
  c.p.ck = ck;
  const std::size_t pq = cq - 1, pk = (ck - 1) / 2;
  c.p.block = std::max(2 * pq, 4 * pk) + pick(1, 5);
  c.p.splits = pick(1, 4);
  const std::size_t fr = c.p.block - pq, fc = c.p.block - 2 * pk;
  const std::size_t brr = c.p.block - 2 * pq, bcc = c.p.block - 4 * pk;
  std::size_t n = pick(2, 40);
  // (A tile of 1 divides every N; such cases still run, they just cannot be ragged.)
  auto divides = [&n](std::size_t tile) { return tile > 1 && n % tile == 0; };
  for (int tries = 0; tries < 100 && (divides(fr) || divides(fc) || divides(brr) || divides(bcc)); ++tries)
    n = pick(2, 40);
  c.shape = Shape{pick(1, 2), n, pick(1, 2), pick(1, 5)};
  return c;
}

void check_all_paths(const RandomCase& c, unsigned long long seed) {
  INFO("shape " << mta_test::shape_text(c.shape) << " cq=" << c.p.cq << " ck=" << c.p.ck << " B=" << c.p.block
                << " splits=" << c.p.splits);
  const auto in = make_inputs(c.shape, c.p.cq, c.p.ck, seed);
  const auto ref = mta::naive_forward(in.q, in.k, in.v, in.w, c.p);
  const auto fl = mta::flash_forward(in.q, in.k, in.v, in.w, c.p);
  CHECK(rel_to_max(fl.o, ref.o) <= kTol);
  // M + log L is the log-sum-exp of each row.
  Tensor<double> lse(ref.lse.shape());
  for (std::size_t i = 0; i < lse.numel(); ++i) lse.data()[i] = fl.m.data()[i] + std::log(fl.l.data()[i]);
  CHECK(rel_to_max(lse, ref.lse) <= kTol);

  const auto g_ref = mta::naive_backward(in.q, in.k, in.v, in.w, in.d_o, c.p);
  const auto g = mta::flash_backward(in.q, in.k, in.v, in.w, fl.o, fl.m, fl.l, in.d_o, c.p);
  CHECK(rel_to_max(g.dq, g_ref.dq) <= kTol);
  CHECK(rel_to_max(g.dk, g_ref.dk) <= kTol);
  CHECK(rel_to_max(g.dv, g_ref.dv) <= kTol);
  CHECK(rel_to_max(g.dw, g_ref.dw) <= kTol);

  const auto last = mta::flash_infer(in.q, in.k, in.v, in.w, c.p);
  Tensor<double> ref_last(Shape{c.shape.batch, 1, c.shape.heads, c.shape.head_dim});
  for (std::size_t b = 0; b < c.shape.batch; ++b)
    for (std::size_t h = 0; h < c.shape.heads; ++h) ref_last.head(b, h).row(0) = ref.o.head(b, h).row(c.shape.seq - 1);
  CHECK(rel_to_max(last, ref_last) <= kTol);
}

}  // namespace

TEST_CASE("mta flash: forward, backward and inference equal naive on random shapes", "[mta][flash]") {
  std::mt19937_64 rng(2026);
  for (std::size_t cq : {1, 2, 3})
    for (std::size_t ck : {1, 3, 5})
      for (int rep = 0; rep < 3; ++rep) check_all_paths(random_case(rng, cq, ck), rng());
}

TEST_CASE("mta flash: awkward shapes (N = 1, one tile, tiny B, many splits)", "[mta][flash]") {
  auto mk = [](Shape s, std::size_t cq, std::size_t ck, std::size_t block, std::size_t splits) {
    RandomCase c;
    c.shape = s;
    c.p.cq = cq;
    c.p.ck = ck;
    c.p.block = block;
    c.p.splits = splits;
    return c;
  };
  check_all_paths(mk(Shape{1, 1, 1, 3}, 3, 5, 9, 1), 1);     // N = 1: everything is halo or padding
  check_all_paths(mk(Shape{1, 5, 2, 2}, 2, 3, 64, 2), 2);    // one tile covers all; split 2 empty
  check_all_paths(mk(Shape{1, 13, 1, 4}, 1, 1, 1, 3), 3);    // B = 1: no halo, 1 × 1 tiles
  check_all_paths(mk(Shape{1, 11, 1, 3}, 3, 5, 9, 40), 4);   // B − 4Pk = 1, most splits empty
  check_all_paths(mk(Shape{2, 23, 1, 7}, 3, 3, 5, 3), 5);    // B − 2Pq = 1
  check_all_paths(mk(Shape{1, 40, 1, 5}, 3, 3, 16, 4), 6);   // N > 16: the query tile is all real rows
}

TEST_CASE("mta flash: the float instantiation agrees with float64 to single precision", "[mta][flash]") {
  const Shape s{1, 19, 2, 5};
  const auto in = make_inputs(s, 2, 3, 77);
  mta::Params p;
  p.cq = 2;
  p.ck = 3;
  p.block = 7;
  p.splits = 2;
  const auto ref = mta::naive_forward(in.q, in.k, in.v, in.w, p);
  const auto qf = in.q.cast<float>(), kf = in.k.cast<float>(), vf = in.v.cast<float>();
  const auto wf = in.w.cast<float>();
  const auto fl = mta::flash_forward(qf, kf, vf, wf, p);
  // fp32 accumulations over ≤ 19 keys: ~1e-6 relative; 1e-4 is generous but fails on any bug.
  CHECK(rel_to_max(fl.o, ref.o) <= 1e-4);
  const auto g_ref = mta::naive_backward(in.q, in.k, in.v, in.w, in.d_o, p);
  const auto g = mta::flash_backward(qf, kf, vf, wf, fl.o, fl.m, fl.l, in.d_o.cast<float>(), p);
  CHECK(rel_to_max(g.dq, g_ref.dq) <= 1e-4);
  CHECK(rel_to_max(g.dw, g_ref.dw) <= 1e-4);
  const auto last = mta::flash_infer(qf, kf, vf, wf, p);
  for (std::size_t h = 0; h < s.heads; ++h)
    for (std::size_t c = 0; c < s.head_dim; ++c)
      CHECK(std::abs(double(last.at(0, 0, h, c)) - ref.o.at(0, s.seq - 1, h, c)) <= 1e-4);
}

TEST_CASE("mta flash: inference needs cq <= 16", "[mta][flash][errors]") {
  const auto in = make_inputs(Shape{1, 20, 1, 2}, 17, 1, 3);
  mta::Params p;
  p.cq = 17;
  p.block = 20;
  CHECK_THROWS_WITH(mta::flash_infer(in.q, in.k, in.v, in.w, p), Catch::Contains("cq"));
}
