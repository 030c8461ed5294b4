// Flash MTA forward — the MTA kernels, "forward" algorithm, one (batch, head) at a time.
//
// Why overlapping tiles: Ŝ[i, j] reads S rows i − Pq … i and columns j − Pk … j + Pk, so a
// B × B tile of S yields exact Ŝ only on its inner (B − Pq) × (B − 2Pk) region. Tiles are
// therefore laid out with strides Br = B − Pq, Bc = B − 2Pk, and the Pq rows above and Pk
// columns on each side (the halo) are recomputed by neighbouring tiles. Every Ŝ entry is owned
// by exactly one tile: rows [Pq, B) and columns [Pk, B − Pk) of the tile.
#include "flashlab/reference/mta.hpp"

#include "tile.hpp"

#include <cmath>

namespace flashlab::ref::mta {

using detail::Index;

template <typename T>
FlashForward<T> flash_forward(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const Weights<T>& w,
                              const Params& p, Traffic* tr) {
  validate(q, k, v, w, p);
  const Shape& sh = q.shape();
  const Tiling t = forward_tiling(sh.seq, p);
  const T scale = static_cast<T>(resolve_scale(p, sh.head_dim));
  const long long n = (long long)sh.seq, bsz = (long long)p.block, br = (long long)t.br, bc = (long long)t.bc;
  const long long pq = (long long)p.pq(), pk = (long long)p.pk(), d = (long long)sh.head_dim;
  const std::uint64_t w_elems = p.cq * p.ck;
  constexpr T kNegInf = detail::neg_inf<T>();
  if (tr)
    for (const char* name : {"Q", "K", "V", "W", "O", "M", "L"}) tr->declare(name);

  const Shape stat{sh.batch, sh.seq, sh.heads, 1};
  FlashForward<T> out{Tensor<T>(sh), Tensor<T>(stat), Tensor<T>(stat)};
  for (std::size_t b = 0; b < sh.batch; ++b)
    for (std::size_t h = 0; h < sh.heads; ++h) {
      const auto qh = q.head(b, h), kh = k.head(b, h), vh = v.head(b, h);
      auto o_hbm = out.o.head(b, h);
      auto m_hbm = out.m.head(b, h);
      auto l_hbm = out.l.head(b, h);
      // "Initialize O = (0) in HBM": the read-modify-write below reads it, so it is a real write.
      if (tr) tr->write("O", std::uint64_t(n * d));

      // "Parallelize for i = 1 to Tr" (sequential here: the order does not change any result).
      for (long long i = 0; i < (long long)t.tr; ++i) {
        const long long is = i * br - pq;  // I_s: the loaded Q tile starts Pq rows above I_s^eff
        // "Load W from HBM to SRAM."
        const Mat<T> wt = w.head(h);
        if (tr) tr->read("W", w_elems);
        // "ℓ_i = (1)_B, m_i = (−∞)_B": ℓ's start value never matters, since the first finite
        // m_new gives α = e^{−∞} = 0.
        Vec<T> m_i = Vec<T>::Constant(bsz, kNegInf);
        Vec<T> l_i = Vec<T>::Ones(bsz);
        for (long long j = 0; j < (long long)t.tc; ++j) {
          const long long js = j * bc - pk;  // J_s: Pk columns of halo on each side
          // Load overlapping tiles Q[I_s:I_e], K[J_s:J_e], V[J_s:J_e]: HBM → SRAM.
          const Mat<T> q_i = detail::load_rows<T>(qh, is, bsz, tr, "Q");
          const Mat<T> k_j = detail::load_rows<T>(kh, js, bsz, tr, "K");
          const Mat<T> v_j = detail::load_rows<T>(vh, js, bsz, tr, "V");
          // S_ij = scale · Q_i K_jᵀ on the full tile, causal entries zeroed before the conv.
          Mat<T> s_ij = scale * (q_i * k_j.transpose());
          detail::causal_zero(s_ij, is, js);
          // P_ij^raw = Conv2D(S_ij, W); keep only the owned region (halo columns belong to
          // the neighbouring tiles), keys past N, and apply the causal −∞ mask.
          Mat<T> s_hat = detail::conv(s_ij, wt);
          for (Index r = 0; r < bsz; ++r)
            for (Index c = 0; c < bsz; ++c) {
              const long long gc = js + c;
              if (c < pk || c >= bsz - pk || gc >= n || gc > is + r) s_hat(r, c) = kNegInf;
            }
          // Local statistics m̃_ij, P̃_ij, ℓ̃_ij (rows with nothing visible stay at −∞ / 0:
          // the NaN hazard of e^{−∞ − (−∞)} is avoided by testing for −∞ first).
          const Vec<T> m_tilde = s_hat.rowwise().maxCoeff();
          Mat<T> p_tilde = Mat<T>::Zero(bsz, bsz);
          for (Index r = 0; r < bsz; ++r)
            if (m_tilde(r) != kNegInf) p_tilde.row(r) = (s_hat.row(r).array() - m_tilde(r)).exp().matrix();
          const Vec<T> l_tilde = p_tilde.rowwise().sum();
          // Online softmax update: m_new = max(m_i, m̃_ij), α = e^{m_i − m_new}, β = e^{m̃_ij − m_new}.
          const Vec<T> m_new = m_i.cwiseMax(m_tilde);
          Vec<T> alpha(bsz), beta(bsz);
          for (Index r = 0; r < bsz; ++r) {
            const bool empty = m_new(r) == kNegInf;
            alpha(r) = empty ? T(1) : std::exp(m_i(r) - m_new(r));
            beta(r) = empty ? T(0) : std::exp(m_tilde(r) - m_new(r));
          }
          l_i = alpha.cwiseProduct(l_i) + beta.cwiseProduct(l_tilde);
          // Update output (read-modify-write HBM): load the full tile O[I_s:I_e] …
          Mat<T> o_acc = detail::load_rows<T>(o_hbm, is, bsz, tr, "O");
          o_acc = alpha.asDiagonal() * o_acc + (beta.asDiagonal() * p_tilde) * v_j;
          // … write back only the effective region, slice [Pq : B] of the SRAM buffer.
          detail::store_rows<T>(o_hbm, o_acc, is, pq, br, tr, "O");
          m_i = m_new;
          if (tr) tr->add_flops(std::uint64_t(4 * bsz * bsz * d + 2 * bsz * bsz * (long long)w_elems));
        }
        // Finalisation: load O[I_s^eff:I_e^eff], divide by ℓ_i[Pq:B], write it back.
        const long long ie = i * br;
        Mat<T> o_eff = detail::load_rows<T>(o_hbm, ie, br, tr, "O");
        o_eff = l_i.tail(br).cwiseInverse().asDiagonal() * o_eff;
        detail::store_rows<T>(o_hbm, o_eff, ie, 0, br, tr, "O");
        // Write m_i[Pq:B] → M and ℓ_i[Pq:B] → L.
        const Mat<T> m_col = m_i.tail(br), l_col = l_i.tail(br);
        detail::store_rows<T>(m_hbm, m_col, ie, 0, br, tr, "M");
        detail::store_rows<T>(l_hbm, l_col, ie, 0, br, tr, "L");
      }
    }
  return out;
}

template FlashForward<double> flash_forward(const Tensor<double>&, const Tensor<double>&, const Tensor<double>&,
                                            const Weights<double>&, const Params&, Traffic*);
template FlashForward<float> flash_forward(const Tensor<float>&, const Tensor<float>&, const Tensor<float>&,
                                           const Weights<float>&, const Params&, Traffic*);

}  // namespace flashlab::ref::mta
