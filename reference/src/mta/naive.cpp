// Naive MTA: the definition (docs/mta.md, "Semantics") followed literally, one (batch, head) at a time, with
// the full N × N score matrices materialised. The convolution and its adjoint are written as
// scalar loops straight from the formula Ŝ[i,j] = Σ_a Σ_b W[a,b] · S[i + a − Pq, j + b − Pk]
// (no shared code with the tile helpers), so that the flash paths are checked against an
// independent statement of the semantics.
#include "flashlab/reference/mta.hpp"

#include "shape_text.hpp"

#include <cmath>
#include <limits>

namespace flashlab::ref::mta {

namespace {

using Index = Eigen::Index;

// Everything the backward needs from one head's forward.
template <typename T>
struct HeadForward {
  Mat<T> s;    // scale·QKᵀ with j > i zeroed (the convolution's input)
  Mat<T> p;    // softmax of Ŝ (zero where j > i)
  Vec<T> lse;  // log Σ_j exp Ŝ[i, j]
};

// S with zero padding outside [0, N)²: the conv2d padding of the semantics.
template <typename T>
T padded(const Mat<T>& s, Index r, Index c) {
  if (r < 0 || c < 0 || r >= s.rows() || c >= s.cols()) return T(0);
  return s(r, c);
}

template <typename T>
HeadForward<T> head_forward(const ConstHeadMap<T>& q, const ConstHeadMap<T>& k, const Mat<T>& w, T scale) {
  const Index n = q.rows(), pq = w.rows() - 1, pk = (w.cols() - 1) / 2;
  HeadForward<T> f;
  f.s = scale * (q * k.transpose());
  for (Index i = 0; i < n; ++i)
    for (Index j = i + 1; j < n; ++j) f.s(i, j) = T(0);  // causal zeroing before the convolution

  f.p = Mat<T>::Zero(n, n);
  f.lse.resize(n);
  for (Index i = 0; i < n; ++i) {
    // Ŝ[i, j] for the visible keys j ≤ i; the others are −∞ and drop out of the softmax.
    Vec<T> row(i + 1);
    for (Index j = 0; j <= i; ++j) {
      T acc = 0;
      for (Index a = 0; a <= pq; ++a)
        for (Index b = 0; b < w.cols(); ++b) acc += w(a, b) * padded(f.s, i + a - pq, j + b - pk);
      row(j) = acc;
    }
    const T m = row.maxCoeff();
    T sum = 0;
    for (Index j = 0; j <= i; ++j) sum += std::exp(row(j) - m);
    for (Index j = 0; j <= i; ++j) f.p(i, j) = std::exp(row(j) - m) / sum;
    f.lse(i) = m + std::log(sum);
  }
  return f;
}

}  // namespace

template <typename T>
NaiveForward<T> naive_forward(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const Weights<T>& w,
                              const Params& p) {
  validate(q, k, v, w, p);
  const Shape& sh = q.shape();
  const T scale = static_cast<T>(resolve_scale(p, sh.head_dim));
  NaiveForward<T> out{Tensor<T>(sh), Tensor<T>(Shape{sh.batch, sh.seq, sh.heads, 1})};
  for (std::size_t b = 0; b < sh.batch; ++b)
    for (std::size_t h = 0; h < sh.heads; ++h) {
      const auto f = head_forward<T>(q.head(b, h), k.head(b, h), w.head(h), scale);
      out.o.head(b, h) = f.p * v.head(b, h);
      out.lse.head(b, h) = f.lse;
    }
  return out;
}

template <typename T>
Grads<T> naive_backward(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const Weights<T>& w,
                        const Tensor<T>& d_o, const Params& p) {
  validate(q, k, v, w, p);
  const Shape& sh = q.shape();
  if (!(d_o.shape() == sh))
    throw std::invalid_argument("MTA: dO shape " + detail::shape_text(d_o.shape()) + " differs from Q " + detail::shape_text(sh));
  const T scale = static_cast<T>(resolve_scale(p, sh.head_dim));
  Grads<T> g{Tensor<T>(sh), Tensor<T>(sh), Tensor<T>(sh), Weights<T>(sh.heads, p.cq, p.ck)};
  const Index n = Index(sh.seq), pq = Index(p.pq()), pk = Index(p.pk()), ck = Index(p.ck);
  for (std::size_t b = 0; b < sh.batch; ++b)
    for (std::size_t h = 0; h < sh.heads; ++h) {
      const Mat<T> wh = w.head(h);
      const auto f = head_forward<T>(q.head(b, h), k.head(b, h), wh, scale);
      const Mat<T> dO = d_o.head(b, h);
      const Mat<T> o = f.p * v.head(b, h);
      // Softmax backward with the D_i trick: D_i = Σ_j P_ij dP_ij = rowsum(dO_i ⊙ O_i).
      const Mat<T> dp = dO * v.head(b, h).transpose();
      const Vec<T> d = (dO.array() * o.array()).rowwise().sum();
      Mat<T> ds_hat = f.p.array() * (dp.colwise() - d).array();  // zero where P is (j > i)
      g.dv.head(b, h) = f.p.transpose() * dO;

      // Through the convolution: Ŝ[i,j] reads S[i + a − Pq, j + b − Pk] with weight W[a,b], so
      // dS[r,c] collects W[a,b]·dŜ[r − a + Pq, c − b + Pk], and dW[a,b] collects dŜ[i,j]·S[…].
      Mat<T> ds = Mat<T>::Zero(n, n);
      for (Index r = 0; r < n; ++r)
        for (Index c = 0; c <= r; ++c) {  // entries with c > r were zeroed before the conv: no gradient
          T acc = 0;
          for (Index a = 0; a <= pq; ++a)
            for (Index bb = 0; bb < ck; ++bb) acc += wh(a, bb) * padded(ds_hat, r - a + pq, c - bb + pk);
          ds(r, c) = acc;
        }
      for (Index a = 0; a <= pq; ++a)
        for (Index bb = 0; bb < ck; ++bb) {
          T acc = 0;
          for (Index i = 0; i < n; ++i)
            for (Index j = 0; j <= i; ++j) acc += ds_hat(i, j) * padded(f.s, i + a - pq, j + bb - pk);
          g.dw.at(h, std::size_t(a), std::size_t(bb)) += acc;
        }
      g.dq.head(b, h) = scale * (ds * k.head(b, h));
      g.dk.head(b, h) = scale * (ds.transpose() * q.head(b, h));
    }
  return g;
}

template NaiveForward<double> naive_forward(const Tensor<double>&, const Tensor<double>&, const Tensor<double>&,
                                            const Weights<double>&, const Params&);
template NaiveForward<float> naive_forward(const Tensor<float>&, const Tensor<float>&, const Tensor<float>&,
                                           const Weights<float>&, const Params&);
template Grads<double> naive_backward(const Tensor<double>&, const Tensor<double>&, const Tensor<double>&,
                                      const Weights<double>&, const Tensor<double>&, const Params&);
template Grads<float> naive_backward(const Tensor<float>&, const Tensor<float>&, const Tensor<float>&,
                                     const Weights<float>&, const Tensor<float>&, const Params&);

}  // namespace flashlab::ref::mta
