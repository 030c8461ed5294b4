// Flash MTA backward — the MTA kernels, the dQ + dW algorithm and the dK/dV algorithm, preceded by the
// D preprocessing of the Triton walkthrough (D_i = rowsum(dO_i ⊙ O_i)).
//
// Why the halo doubles: dS[r, c] (the gradient of the pre-convolution score) collects dŜ from
// rows r … r + Pq and columns c − Pk … c + Pk (the transposed convolution), and each of those dŜ
// needs an exact Ŝ, i.e. S from a further Pq rows above and Pk columns to each side. So a
// B × B tile yields exact dS on rows [Pq, B − Pq) and columns [2Pk, B − 2Pk): strides
// Br = B − 2Pq and Bc = B − 4Pk (the MTA kernels).
//
// Deviation from the MTA kernels, on purpose (docs/mta.md, "The backward halo"): the source starts the
// loaded row tile 2Pq rows above its effective region (I_s = (i−1)·Br − 2Pq). The convolution
// looks at *past* queries, so its transpose looks at *future* ones: dS row r needs dŜ rows
// r … r + Pq, which lie *below* r. With the whole doubled halo above, the last Pq effective rows
// would miss that gradient. We centre the row halo (Pq above, Pq below: I_s = (i−1)·Br − Pq),
// which keeps the source's Br, Tr and tile size and makes the result equal the naive one.
// The column halo is symmetric (2Pk each side), exactly as in the source.
#include "flashlab/reference/mta.hpp"

#include "shape_text.hpp"

#include "tile.hpp"

#include <cmath>

namespace flashlab::ref::mta {

using detail::Index;

namespace {

// What both loops recompute for a tile pair (i, j): S_ij (for GradW) and P_ij on its exact
// region, zero elsewhere.
template <typename T>
struct Reprise {
  Mat<T> s;  // S_ij, causal entries zeroed
  Mat<T> p;  // P_ij = exp(Ŝ_ij − LSE_i) where Ŝ is exact, visible and inside [0, N)²; else 0
};

// "Forward computation reprise": S_ij = scale·Q_i K_jᵀ, P_ij^raw = Conv2D(S_ij, W) with the
// causal mask, P_ij = exp(P_ij^raw − L_i). L_i here is LSE_i = M_i + log ℓ_i, formed on chip
// from the M and L the forward saved (docs/mta.md, "Saved statistics").
template <typename T>
Reprise<T> reprise(const Mat<T>& q_i, const Mat<T>& k_j, const Mat<T>& w, const Vec<T>& lse, T scale, long long is,
                   long long js, long long n) {
  const Index bsz = q_i.rows(), pq = w.rows() - 1, pk = (w.cols() - 1) / 2;
  Reprise<T> rp;
  rp.s = scale * (q_i * k_j.transpose());
  detail::causal_zero(rp.s, is, js);
  const Mat<T> s_hat = detail::conv(rp.s, w);
  rp.p = Mat<T>::Zero(bsz, bsz);
  for (Index r = pq; r < bsz; ++r) {
    const long long gr = is + r;
    if (gr < 0 || gr >= n) continue;
    for (Index c = pk; c < bsz - pk; ++c) {
      const long long gc = js + c;
      if (gc < 0 || gc >= n || gc > gr) continue;
      rp.p(r, c) = std::exp(s_hat(r, c) - lse(r));
    }
  }
  return rp;
}

// Keeps only the effective block [r0, r0 + nr) × [c0, c0 + nc) of a tile (zero elsewhere).
template <typename T>
Mat<T> only_block(const Mat<T>& x, Index r0, Index nr, Index c0, Index nc) {
  Mat<T> y = Mat<T>::Zero(x.rows(), x.cols());
  y.block(r0, c0, nr, nc) = x.block(r0, c0, nr, nc);
  return y;
}

}  // namespace

template <typename T>
Grads<T> flash_backward(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const Weights<T>& w,
                        const Tensor<T>& o, const Tensor<T>& m, const Tensor<T>& l, const Tensor<T>& d_o,
                        const Params& p, Traffic* tr) {
  validate(q, k, v, w, p);
  const Shape& sh = q.shape();
  const Shape stat{sh.batch, sh.seq, sh.heads, 1};
  if (!(o.shape() == sh)) throw std::invalid_argument("MTA: O shape " + detail::shape_text(o.shape()) + " differs from Q " + detail::shape_text(sh));
  if (!(d_o.shape() == sh))
    throw std::invalid_argument("MTA: dO shape " + detail::shape_text(d_o.shape()) + " differs from Q " + detail::shape_text(sh));
  if (!(m.shape() == stat) || !(l.shape() == stat))
    throw std::invalid_argument("MTA: M and L must have shape " + detail::shape_text(stat));
  const Tiling t = backward_tiling(sh.seq, p);
  const T scale = static_cast<T>(resolve_scale(p, sh.head_dim));
  const long long n = (long long)sh.seq, bsz = (long long)p.block, br = (long long)t.br, bc = (long long)t.bc;
  const long long pq = (long long)p.pq(), pk = (long long)p.pk(), d = (long long)sh.head_dim;
  const std::uint64_t w_elems = p.cq * p.ck;
  const auto bb2 = std::uint64_t(bsz * bsz);
  if (tr)
    for (const char* name : {"Q", "K", "V", "W", "O", "dO", "M", "L", "D", "dQ", "dK", "dV", "dW"}) tr->declare(name);

  Grads<T> g{Tensor<T>(sh), Tensor<T>(sh), Tensor<T>(sh), Weights<T>(sh.heads, p.cq, p.ck)};
  Tensor<T> d_hbm(stat);
  // "Initialize dW = (0) in HBM": one kernel per head, shared by the batch.
  if (tr) tr->write("dW", sh.heads * w_elems);

  for (std::size_t b = 0; b < sh.batch; ++b)
    for (std::size_t h = 0; h < sh.heads; ++h) {
      const auto qh = q.head(b, h), kh = k.head(b, h), vh = v.head(b, h);
      const auto oh = o.head(b, h), doh = d_o.head(b, h), mh = m.head(b, h), lh = l.head(b, h);
      auto dh = d_hbm.head(b, h);
      auto dq_hbm = g.dq.head(b, h);
      auto dk_hbm = g.dk.head(b, h);
      auto dv_hbm = g.dv.head(b, h);

      // Preprocessing (the Triton walkthrough): D_i = rowsum(dO_i ⊙ O_i) — read O and dO once, write D.
      dh = (doh.array() * oh.array()).rowwise().sum().matrix();
      if (tr) {
        tr->read("O", std::uint64_t(n * d));
        tr->read("dO", std::uint64_t(n * d));
        tr->write("D", std::uint64_t(n));
        tr->add_flops(std::uint64_t(2 * n * d));
      }

      // ---- dQ + dW: "Parallelize for i = 1 to Tr", key tiles inner ----
      for (long long i = 0; i < (long long)t.tr; ++i) {
        const long long is = i * br - pq;  // centred row halo (see the file comment)
        const Mat<T> wt = w.head(h);
        if (tr) tr->read("W", w_elems);
        Mat<T> dw_i = Mat<T>::Zero(Index(p.cq), Index(p.ck));  // local dW_i accumulator in SRAM
        // "Load dO[I_s:I_e], L[I_s:I_e], D[I_s:I_e]" once per row tile.
        const Mat<T> do_i = detail::load_rows<T>(doh, is, bsz, tr, "dO");
        const Mat<T> m_t = detail::load_rows<T>(mh, is, bsz, tr, "M");
        const Mat<T> l_t = detail::load_rows<T>(lh, is, bsz, tr, "L");
        const Mat<T> d_t = detail::load_rows<T>(dh, is, bsz, tr, "D");
        const Vec<T> lse = m_t.col(0) + l_t.col(0).array().log().matrix();
        const Vec<T> d_i = d_t.col(0);
        Mat<T> dq_acc;
        for (long long j = 0; j < (long long)t.tc; ++j) {
          const long long js = j * bc - 2 * pk;
          // Forward reprise: load Q_i, K_j; S_ij, Conv2D, P_ij.
          const Mat<T> q_i = detail::load_rows<T>(qh, is, bsz, tr, "Q");
          const Mat<T> k_j = detail::load_rows<T>(kh, js, bsz, tr, "K");
          const auto rp = reprise<T>(q_i, k_j, wt, lse, scale, is, js, n);
          // dP_ij = dO_i V_jᵀ; dS^conv = P_ij ⊙ (dP_ij − D_i).
          const Mat<T> v_j = detail::load_rows<T>(vh, js, bsz, tr, "V");
          const Mat<T> dp = do_i * v_j.transpose();
          const Mat<T> ds_hat = rp.p.array() * (dp.colwise() - d_i).array();
          // dW_i += GradW(S_ij, dS^conv) over the dŜ entries this tile owns (rows of its
          // effective dQ region, columns of its effective key region), so that every dŜ entry
          // of the head is counted once across all tiles.
          dw_i += detail::grad_w<T>(rp.s, only_block<T>(ds_hat, pq, br, 2 * pk, bc), Index(p.cq), Index(p.ck));
          // d(QKᵀ) = TransposedConv2D(dS^conv, W); no gradient into the causally zeroed entries;
          // only the effective block is exact (and owned by this tile).
          Mat<T> ds = detail::conv_transpose<T>(ds_hat, wt);
          detail::causal_zero(ds, is, js);
          const Mat<T> ds_eff = only_block<T>(ds, pq, br, 2 * pk, bc);
          // dQ read-modify-write: load dQ[I_s:I_e] (j > 1; else start from 0), add, write back
          // the effective region (unscaled).
          dq_acc = j > 0 ? detail::load_rows<T>(dq_hbm, is, bsz, tr, "dQ") : Mat<T>::Zero(bsz, d);
          dq_acc += ds_eff * k_j;
          detail::store_rows<T>(dq_hbm, dq_acc, is, pq, br, tr, "dQ");
          if (tr) tr->add_flops(6 * bb2 * std::uint64_t(d) + 6 * bb2 * w_elems);
        }
        // Finalisation: dQ[I_s^eff:I_e^eff] ← scale · dQ (read-modify-write).
        Mat<T> dq_eff = detail::load_rows<T>(dq_hbm, i * br, br, tr, "dQ");
        dq_eff *= scale;
        detail::store_rows<T>(dq_hbm, dq_eff, i * br, 0, br, tr, "dQ");
        // AtomicAdd(dW, dW_i): a read-modify-write of the global kernel gradient.
        for (std::size_t a = 0; a < p.cq; ++a)
          for (std::size_t c = 0; c < p.ck; ++c) g.dw.at(h, a, c) += dw_i(Index(a), Index(c));
        if (tr) {
          tr->read("dW", w_elems);
          tr->write("dW", w_elems);
        }
      }

      // ---- dK/dV: "Parallelize for j = 1 to Tc", query tiles inner ----
      for (long long j = 0; j < (long long)t.tc; ++j) {
        const long long js = j * bc - 2 * pk;
        const Mat<T> wt = w.head(h);
        if (tr) tr->read("W", w_elems);
        Mat<T> dv_acc, dk_acc;
        for (long long i = 0; i < (long long)t.tr; ++i) {
          const long long is = i * br - pq;
          // Forward reprise: load Q_i, K_j, L_i, D_i (L as M and ℓ, see reprise()).
          const Mat<T> q_i = detail::load_rows<T>(qh, is, bsz, tr, "Q");
          const Mat<T> k_j = detail::load_rows<T>(kh, js, bsz, tr, "K");
          const Mat<T> m_t = detail::load_rows<T>(mh, is, bsz, tr, "M");
          const Mat<T> l_t = detail::load_rows<T>(lh, is, bsz, tr, "L");
          const Mat<T> d_t = detail::load_rows<T>(dh, is, bsz, tr, "D");
          const Vec<T> lse = m_t.col(0) + l_t.col(0).array().log().matrix();
          const Vec<T> d_i = d_t.col(0);
          const auto rp = reprise<T>(q_i, k_j, wt, lse, scale, is, js, n);
          // dP_ij = dO_i V_jᵀ.
          const Mat<T> do_i = detail::load_rows<T>(doh, is, bsz, tr, "dO");
          const Mat<T> v_j = detail::load_rows<T>(vh, js, bsz, tr, "V");
          const Mat<T> dp = do_i * v_j.transpose();
          // dV read-modify-write: dV_acc += P_ijᵀ dO_i over the query rows this tile owns.
          dv_acc = i > 0 ? detail::load_rows<T>(dv_hbm, js, bsz, tr, "dV") : Mat<T>::Zero(bsz, d);
          dv_acc += only_block<T>(rp.p, pq, br, 0, bsz).transpose() * do_i;
          detail::store_rows<T>(dv_hbm, dv_acc, js, 2 * pk, bc, tr, "dV");
          // dS^conv = P_ij ⊙ (dP_ij − D_i); d(QKᵀ) = TransposedConv2D(dS^conv, W).
          const Mat<T> ds_hat = rp.p.array() * (dp.colwise() - d_i).array();
          Mat<T> ds = detail::conv_transpose<T>(ds_hat, wt);
          detail::causal_zero(ds, is, js);
          const Mat<T> ds_eff = only_block<T>(ds, pq, br, 2 * pk, bc);
          // dK read-modify-write: dK_acc += d(QKᵀ)_ijᵀ Q_i (unscaled).
          dk_acc = i > 0 ? detail::load_rows<T>(dk_hbm, js, bsz, tr, "dK") : Mat<T>::Zero(bsz, d);
          dk_acc += ds_eff.transpose() * q_i;
          detail::store_rows<T>(dk_hbm, dk_acc, js, 2 * pk, bc, tr, "dK");
          if (tr) tr->add_flops(8 * bb2 * std::uint64_t(d) + 4 * bb2 * w_elems);
        }
        // Finalisation: dK[J_s^eff:J_e^eff] ← scale · dK; dV is already final.
        Mat<T> dk_eff = detail::load_rows<T>(dk_hbm, j * bc, bc, tr, "dK");
        dk_eff *= scale;
        detail::store_rows<T>(dk_hbm, dk_eff, j * bc, 0, bc, tr, "dK");
      }
    }
  return g;
}

template Grads<double> flash_backward(const Tensor<double>&, const Tensor<double>&, const Tensor<double>&,
                                      const Weights<double>&, const Tensor<double>&, const Tensor<double>&,
                                      const Tensor<double>&, const Tensor<double>&, const Params&, Traffic*);
template Grads<float> flash_backward(const Tensor<float>&, const Tensor<float>&, const Tensor<float>&,
                                     const Weights<float>&, const Tensor<float>&, const Tensor<float>&,
                                     const Tensor<float>&, const Tensor<float>&, const Params&, Traffic*);

}  // namespace flashlab::ref::mta
