// Fidelity: dense block masses against the sparse application with every block kept (the same
// quantity by another route), the comparison's definitions on a hand-made case with ties, and
// the workloads: reproducible, variants that keep the plan, structured retrievals that dense
// attention reads.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "flashlab/reference/stream_fidelity.hpp"
#include "test_stream_util.hpp"

namespace rs = flashlab::ref::stream;
using flashlab::test::stream::random_mat;
using flashlab::test::stream::random_user_mask;

TEST_CASE("stream fidelity: dense block masses equal the edge masses of the application with every block kept",
          "[stream][fidelity]") {
  for (const rs::Geometry g : {rs::Geometry{1, 1, 1}, rs::Geometry{37, 8, 6}, rs::Geometry{96, 16, 16}, rs::Geometry{70, 7, 10}}) {
    for (const bool user : {false, true}) {
      const rs::BlockMask mask = user ? rs::BlockMask(g, random_user_mask(g, 3, 0.6)) : rs::BlockMask(g);
      const auto Q = random_mat<double>(g.T, 6, 1), K = random_mat<double>(g.T, 6, 2), V = random_mat<double>(g.T, 3, 3);
      const std::size_t k = g.n_k();
      const auto est = rs::stream_estimate(Q, K, mask, rs::EstimateParams{k, 1});
      const auto app = rs::stream_apply(Q, K, V, mask, est.indices, k, 1, true);
      const auto dense = rs::dense_block_mass(Q, K, mask, 2);
      std::vector<double> from_edges(g.n_q() * g.n_k(), 0.0);
      for (const auto& e : app.edges) from_edges[std::size_t(e.q) * g.n_k() + std::size_t(e.r)] = e.mass;
      INFO("T " << g.T << " b_q " << g.bq << " b_k " << g.bk << " user mask " << user);
      for (std::size_t i = 0; i < from_edges.size(); ++i) CHECK(dense.mass[i] == Approx(from_edges[i]).margin(1e-12));
      // With k = n_k every valid block is kept: recall 1, all of the mass.
      const auto f = rs::compare_with_dense(dense, mask, est.indices, k);
      CHECK(f.recall() == 1.0);
      if (f.wanted) {
        CHECK(f.mass_kept == Approx(1.0).epsilon(1e-12));
        CHECK(f.mass_oracle == Approx(1.0).epsilon(1e-12));
      }
    }
  }
}

TEST_CASE("stream fidelity: recall counts ties at the k-th mass, mass kept and oracle follow their definitions",
          "[stream][fidelity]") {
  // One query block of 4 rows over 4 key blocks (b_q = 4, b_k = 1, T = 4: only the last row sees all).
  const rs::Geometry g{4, 4, 1};
  const rs::BlockMask mask(g);
  rs::BlockMass dense{g, {0.5, 1.5, 1.5, 0.5}};  // Σ = 4 rows
  // k = 2: the k-th largest mass is 1.5 (a tie of blocks 1 and 2).
  CHECK(rs::compare_with_dense(dense, mask, {1, 2}, 2).recall() == 1.0);
  CHECK(rs::compare_with_dense(dense, mask, {2, 1}, 2).recall() == 1.0);
  const auto half = rs::compare_with_dense(dense, mask, {1, 0}, 2);
  CHECK(half.hits == 1);
  CHECK(half.wanted == 2);
  CHECK(half.mass_kept == Approx(2.0 / 4.0));
  CHECK(half.mass_oracle == Approx(3.0 / 4.0));
  // k = 3: blocks 0 and 3 tie at 0.5, the 3rd largest; either completes the top 3.
  CHECK(rs::compare_with_dense(dense, mask, {3, 1, 2}, 3).recall() == 1.0);
  CHECK(rs::compare_with_dense(dense, mask, {0, 1, -1}, 3).recall() == Approx(2.0 / 3.0));
  CHECK_THROWS_AS(rs::compare_with_dense(dense, mask, {0, 1}, 3), rs::StreamError);
}

TEST_CASE("stream fidelity: workloads are reproducible, variants keep the plan, structured retrievals are read",
          "[stream][fidelity][workloads]") {
  const rs::Geometry g{1024, 32, 32};
  for (const auto w : {rs::Workload::random, rs::Workload::needles, rs::Workload::structured}) {
    rs::WorkloadParams p{g, 24, 9};
    const auto a = rs::make_workload(w, p), b = rs::make_workload(w, p);
    CHECK(a.Q == b.Q);
    CHECK(a.K == b.K);
    CHECK(a.V == b.V);
    p.variant = 3;
    const auto c = rs::make_workload(w, p);
    CHECK_FALSE(c.Q == a.Q);
    REQUIRE(c.planted.size() == a.planted.size());
    for (std::size_t i = 0; i < a.planted.size(); ++i) {
      CHECK(c.planted[i].q == a.planted[i].q);
      CHECK(c.planted[i].r == a.planted[i].r);
    }
    CHECK(rs::workload_from_name(rs::workload_name(w)) == w);
    CHECK(a.planted.size() == (w == rs::Workload::random ? 0u : w == rs::Workload::needles ? 16u : 4u));
  }
  CHECK_FALSE(rs::workload_from_name("dense"));
  // Structured: dense attention puts most of a retrieving token's mass on its retrieval block,
  // and block 0 (the sink) takes a visible share of every far row.
  rs::WorkloadParams p{g, 24, 2};
  const auto in = rs::make_workload(rs::Workload::structured, p);
  const rs::BlockMask mask(g);
  const auto dense = rs::dense_block_mass(in.Q, in.K, mask, 2);
  for (const auto& n : in.planted) {
    INFO("retrieval q " << n.q << " r " << n.r);
    // 4 retrieving tokens of 32 rows read the far block almost entirely.
    CHECK(dense.at(n.q, n.r) > 3.5);
    CHECK(dense.at(n.q, 0) > 1.0);
  }
  CHECK_THROWS_AS(rs::make_workload(rs::Workload::structured, rs::WorkloadParams{g, 4, 1}), rs::StreamError);
}
