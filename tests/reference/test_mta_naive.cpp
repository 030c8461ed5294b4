// Naive MTA: the semantics pinned by independent computations, and its gradients against
// central finite differences in float64.
#include <catch2/catch.hpp>

#include "test_mta_util.hpp"

#include <cmath>
#include <functional>
#include <limits>
#include <vector>

using namespace flashlab::ref;
using mta_test::make_inputs;
using mta_test::rel_to_max;

namespace {

// Plain causal softmax attention over an explicitly given score matrix (for one head).
Mat<double> softmax_attention(const Mat<double>& scores, const Mat<double>& v) {
  const Eigen::Index n = scores.rows();
  Mat<double> p = Mat<double>::Zero(n, n);
  for (Eigen::Index i = 0; i < n; ++i) {
    double m = -std::numeric_limits<double>::infinity();
    for (Eigen::Index j = 0; j <= i; ++j) m = std::max(m, scores(i, j));
    double sum = 0;
    for (Eigen::Index j = 0; j <= i; ++j) sum += std::exp(scores(i, j) - m);
    for (Eigen::Index j = 0; j <= i; ++j) p(i, j) = std::exp(scores(i, j) - m) / sum;
  }
  return p * v;
}

}  // namespace

TEST_CASE("mta naive: a 1x1 kernel of 1 is plain causal attention", "[mta][naive]") {
  auto in = make_inputs(Shape{2, 9, 2, 4}, 1, 1, 11);
  for (std::size_t h = 0; h < 2; ++h) in.w.at(h, 0, 0) = 1.0;
  mta::Params p;
  const auto f = mta::naive_forward(in.q, in.k, in.v, in.w, p);
  for (std::size_t b = 0; b < 2; ++b)
    for (std::size_t h = 0; h < 2; ++h) {
      const Mat<double> s = (in.q.head(b, h) * in.k.head(b, h).transpose()) / 2.0;  // 1/√4
      const Mat<double> ref = softmax_attention(s, in.v.head(b, h));
      const Mat<double> got = f.o.head(b, h);
      CHECK((got - ref).cwiseAbs().maxCoeff() <= 1e-14);
    }
}

TEST_CASE("mta naive: the convolution reads past queries and is a cross-correlation", "[mta][naive]") {
  // W = δ at (a, b) = (0, 0) with cq = 2, ck = 3 turns Ŝ[i, j] into S[i − 1, j − 1] (zero outside,
  // and S itself zero where j − 1 > i − 1): a PyTorch conv2d with padding (Pq above, Pk each
  // side) shifts the scores down-right. Any other direction convention gives another output.
  auto in = make_inputs(Shape{1, 7, 1, 3}, 2, 3, 12);
  for (std::size_t a = 0; a < 2; ++a)
    for (std::size_t b = 0; b < 3; ++b) in.w.at(0, a, b) = 0.0;
  in.w.at(0, 0, 0) = 1.0;
  mta::Params p;
  p.cq = 2;
  p.ck = 3;
  p.scale = 0.7;
  const auto f = mta::naive_forward(in.q, in.k, in.v, in.w, p);
  const Mat<double> s = 0.7 * (in.q.head(0, 0) * in.k.head(0, 0).transpose());
  Mat<double> shifted = Mat<double>::Zero(7, 7);
  for (int i = 1; i < 7; ++i)
    for (int j = 1; j <= i; ++j) shifted(i, j) = s(i - 1, j - 1);
  const Mat<double> ref = softmax_attention(shifted, in.v.head(0, 0));
  const Mat<double> got = f.o.head(0, 0);
  CHECK((got - ref).cwiseAbs().maxCoeff() <= 1e-14);
  // LSE of row 0: only Ŝ[0, 0] = 0 is visible, so LSE = 0.
  CHECK(std::abs(f.lse.at(0, 0, 0, 0)) <= 1e-15);
}

TEST_CASE("mta naive: gradients equal central finite differences (float64)", "[mta][naive][grad]") {
  struct Case {
    Shape shape;
    std::size_t cq, ck;
  };
  const std::vector<Case> cases = {
      {Shape{1, 6, 1, 3}, 1, 1}, {Shape{2, 7, 2, 3}, 2, 3}, {Shape{1, 8, 2, 2}, 3, 5}, {Shape{1, 1, 1, 2}, 3, 3}};
  for (const auto& cs : cases) {
    INFO("shape " << mta_test::shape_text(cs.shape) << " cq=" << cs.cq << " ck=" << cs.ck);
    auto in = make_inputs(cs.shape, cs.cq, cs.ck, 100 + cs.cq * 10 + cs.ck);
    mta::Params p;
    p.cq = cs.cq;
    p.ck = cs.ck;
    const auto g = mta::naive_backward(in.q, in.k, in.v, in.w, in.d_o, p);
    // L(Q, K, V, W) = ⟨O, dO⟩, so ∂L/∂x is what naive_backward returns for x.
    auto loss = [&] {
      const auto f = mta::naive_forward(in.q, in.k, in.v, in.w, p);
      double s = 0;
      for (std::size_t i = 0; i < f.o.numel(); ++i) s += f.o.data()[i] * in.d_o.data()[i];
      return s;
    };
    const double h = 1e-5;
    auto fd = [&](double* x, std::size_t n) {
      std::vector<double> out(n);
      for (std::size_t i = 0; i < n; ++i) {
        const double keep = x[i];
        x[i] = keep + h;
        const double up = loss();
        x[i] = keep - h;
        const double down = loss();
        x[i] = keep;
        out[i] = (up - down) / (2 * h);
      }
      return out;
    };
    const auto fq = fd(in.q.data(), in.q.numel());
    const auto fk = fd(in.k.data(), in.k.numel());
    const auto fv = fd(in.v.data(), in.v.numel());
    const auto fw = fd(in.w.data(), in.w.numel());
    // Central differences: O(h²) ≈ 1e-10 truncation plus ≈ 1e-11 cancellation; 1e-7 relative
    // to the gradient's max leaves margin but catches any wrong term (those are O(1)).
    CHECK(rel_to_max(g.dq.data(), fq.data(), fq.size()) <= 1e-7);
    CHECK(rel_to_max(g.dk.data(), fk.data(), fk.size()) <= 1e-7);
    CHECK(rel_to_max(g.dv.data(), fv.data(), fv.size()) <= 1e-7);
    CHECK(rel_to_max(g.dw.data(), fw.data(), fw.size()) <= 1e-7);
  }
}

TEST_CASE("mta: bad arguments are refused with a message naming them", "[mta][errors]") {
  auto in = make_inputs(Shape{1, 5, 2, 3}, 2, 3, 7);
  mta::Params p;
  p.cq = 2;
  p.ck = 2;  // even
  CHECK_THROWS_WITH(mta::naive_forward(in.q, in.k, in.v, in.w, p), Catch::Contains("ck must be odd"));
  p.ck = 3;
  Tensor<double> k_bad(Shape{1, 6, 2, 3});
  CHECK_THROWS_WITH(mta::naive_forward(in.q, k_bad, in.v, in.w, p), Catch::Contains("K shape"));
  const auto w_bad = mta::random_weights(1, 2, 3, 1);  // one head, Q has two
  CHECK_THROWS_WITH(mta::naive_forward(in.q, in.k, in.v, w_bad, p), Catch::Contains("W has shape"));
  p.block = 2;  // forward needs B > 2·Pk = 2
  CHECK_THROWS_WITH(mta::flash_forward(in.q, in.k, in.v, in.w, p), Catch::Contains("no effective tile"));
  p.block = 4;  // forward fine, backward needs B > 4·Pk = 4
  CHECK_NOTHROW(mta::flash_forward(in.q, in.k, in.v, in.w, p));
  CHECK_THROWS_WITH(mta::backward_tiling(5, p), Catch::Contains("backward"));
  p.splits = 0;
  CHECK_THROWS_WITH(mta::flash_infer(in.q, in.k, in.v, in.w, p), Catch::Contains("splits"));
}

TEST_CASE("mta: NaN in the input never compares equal", "[mta][naive]") {
  auto in = make_inputs(Shape{1, 5, 1, 2}, 2, 3, 8);
  mta::Params p;
  p.cq = 2;
  p.ck = 3;
  p.block = 5;
  const auto ref = mta::naive_forward(in.q, in.k, in.v, in.w, p);
  in.q.at(0, 2, 0, 1) = std::numeric_limits<double>::quiet_NaN();
  const auto got = mta::flash_forward(in.q, in.k, in.v, in.w, p);
  CHECK(std::isinf(rel_to_max(got.o, ref.o)));
}
