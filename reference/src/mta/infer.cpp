// Split-K inference — the MTA kernels, "fwd_inference_kernel" + "combine_splits_kernel".
//
// Decoding needs the output of the last query token only, but its convolved scores read the
// Pq query rows above it, so the kernel loads a fixed 16-row query tile (rows N − 16 … N − 1,
// zero padding above token 0) and requires cq ≤ 16. Keys are split into N_splits contiguous
// ranges of T_k = ⌈N / (N_splits · Bc)⌉ key tiles each; each split runs its own online softmax
// and writes a partial (O_s, M_s, L_s); the combine step merges them with the α/β rescaling.
//
// Conventions the source leaves open (docs/mta.md):
// - Key tiles overlap like the forward's: B keys loaded, effective Bc = B − 2Pk (the conv needs
//   Pk halo columns on each side); the V tile loaded is the same B rows as the K tile.
// - A key tile whose effective range starts at or past N is not loaded (a split may be empty:
//   it writes O_s = 0, M_s = −∞, L_s = 0, which the combine weighs by β = e^{−∞} = 0).
// - With one split there is no combine kernel, so the split kernel normalises and writes O itself.
#include "flashlab/reference/mta.hpp"

#include "tile.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

namespace flashlab::ref::mta {

using detail::Index;

template <typename T>
Tensor<T> flash_infer(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const Weights<T>& w,
                      const Params& p, Traffic* tr) {
  validate(q, k, v, w, p);
  if (p.cq > kInferQueryRows)
    throw std::invalid_argument("MTA inference: cq = " + std::to_string(p.cq) +
                                " needs more query rows than the 16-row query tile holds (cq ≤ 16)");
  const Shape& sh = q.shape();
  const Tiling t = forward_tiling(sh.seq, p);
  const T scale = static_cast<T>(resolve_scale(p, sh.head_dim));
  const long long n = (long long)sh.seq, bsz = (long long)p.block, bc = (long long)t.bc;
  const long long pk = (long long)p.pk(), d = (long long)sh.head_dim, rows = (long long)kInferQueryRows;
  const long long splits = (long long)p.splits;
  const long long tk = (n + splits * bc - 1) / (splits * bc);  // T_k = ⌈N_k / (N_splits · B_k)⌉
  const std::uint64_t w_elems = p.cq * p.ck;
  constexpr T kNegInf = detail::neg_inf<T>();
  if (tr) {
    for (const char* name : {"Q", "K", "V", "W", "O"}) tr->declare(name);
    if (splits > 1) {
      tr->declare("O_s");
      tr->declare("M_s", 4);  // partial statistics are fp32, like M and L
      tr->declare("L_s", 4);
    }
  }

  Tensor<T> out(Shape{sh.batch, 1, sh.heads, sh.head_dim});
  const long long q0 = n - rows;  // first row of the query tile; the last row is token N − 1
  for (std::size_t b = 0; b < sh.batch; ++b)
    for (std::size_t h = 0; h < sh.heads; ++h) {
      const auto qh = q.head(b, h), kh = k.head(b, h), vh = v.head(b, h);
      // Part 1: "Parallelize for each (batch, head, k_split)". Partials stay in HBM-sized arrays.
      Mat<T> o_part = Mat<T>::Zero(splits, d);
      Vec<T> m_part = Vec<T>::Constant(splits, kNegInf), l_part = Vec<T>::Zero(splits);
      for (long long s = 0; s < splits; ++s) {
        Vec<T> o_s = Vec<T>::Zero(d);
        T m_s = kNegInf, l_s = 0;
        // Load the entire query tile Q (16 × d) and W.
        const Mat<T> q_t = detail::load_rows<T>(qh, q0, rows, tr, "Q");
        const Mat<T> wt = w.head(h);
        if (tr) tr->read("W", w_elems);
        for (long long jj = 0; jj < tk; ++jj) {
          const long long tile = s * tk + jj;
          if (tile * bc >= n) break;  // past the last key: nothing to load
          const long long js = tile * bc - pk;
          const Mat<T> k_t = detail::load_rows<T>(kh, js, bsz, tr, "K");
          // S_j = scale · Q Kᵀ (16 × B), causal zeroing, Conv2D; keep the last query's row.
          Mat<T> s_j = scale * (q_t * k_t.transpose());
          detail::causal_zero(s_j, q0, js);
          const Mat<T> s_conv = detail::conv(s_j, wt);
          Vec<T> s_last = s_conv.row(rows - 1).transpose();
          for (Index c = 0; c < bsz; ++c) {
            const long long gc = js + c;
            if (c < pk || c >= bsz - pk || gc >= n) s_last(c) = kNegInf;  // halo or past N
          }
          // Online softmax update: M_s = max(M_s, m_j), α = e^{M_old − M_s}.
          const T m_j = s_last.maxCoeff();
          const T m_old = m_s;
          m_s = std::max(m_s, m_j);
          const T alpha = m_s == kNegInf ? T(1) : std::exp(m_old - m_s);
          o_s *= alpha;
          l_s *= alpha;
          Vec<T> p_j = Vec<T>::Zero(bsz);
          if (m_s != kNegInf) p_j = (s_last.array() - m_s).exp().matrix();
          l_s += p_j.sum();
          // Load the corresponding V tile; O_s += P_j V.
          const Mat<T> v_t = detail::load_rows<T>(vh, js, bsz, tr, "V");
          o_s += (p_j.transpose() * v_t).transpose();
          if (tr)
            tr->add_flops(std::uint64_t(2 * rows * bsz * d + 2 * rows * bsz * (long long)w_elems + 2 * bsz * d));
        }
        if (splits == 1) {
          // No combine kernel: normalise here and write the final output row.
          out.head(b, h).row(0) = (o_s / l_s).transpose();
          if (tr) tr->write("O", std::uint64_t(d));
        } else {
          // Write the partial results (O_s, M_s, L_s) to HBM.
          o_part.row(s) = o_s.transpose();
          m_part(s) = m_s;
          l_part(s) = l_s;
          if (tr) {
            tr->write("O_s", std::uint64_t(d));
            tr->write("M_s", 1);
            tr->write("L_s", 1);
          }
        }
      }
      if (splits == 1) continue;
      // Part 2: combine the splits of this (batch, head): load all partials.
      if (tr) {
        tr->read("O_s", std::uint64_t(splits * d));
        tr->read("M_s", std::uint64_t(splits));
        tr->read("L_s", std::uint64_t(splits));
      }
      Vec<T> o_fin = o_part.row(0).transpose();
      T m_fin = m_part(0), l_fin = l_part(0);
      for (long long s = 1; s < splits; ++s) {
        const T m_old = m_fin;
        m_fin = std::max(m_fin, m_part(s));
        // Split 0 always holds key 0, so m_fin is finite here; an empty split has β = 0.
        const T alpha = std::exp(m_old - m_fin), beta = std::exp(m_part(s) - m_fin);
        o_fin = alpha * o_fin + beta * o_part.row(s).transpose();
        l_fin = alpha * l_fin + beta * l_part(s);
      }
      out.head(b, h).row(0) = (o_fin / l_fin).transpose();
      if (tr) tr->write("O", std::uint64_t(d));
    }
  return out;
}

template Tensor<double> flash_infer(const Tensor<double>&, const Tensor<double>&, const Tensor<double>&,
                                    const Weights<double>&, const Params&, Traffic*);
template Tensor<float> flash_infer(const Tensor<float>&, const Tensor<float>&, const Tensor<float>&,
                                   const Weights<float>&, const Params&, Traffic*);

}  // namespace flashlab::ref::mta
