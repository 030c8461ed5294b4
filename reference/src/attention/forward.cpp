// Attention forward on the CPU: naive (S and P materialised), FA2 loop order, FA1 loop order.
//
// Manual. All three take Q [B, N_q, H, d], K and V [B, N_k, H_kv, d] (packed: [1, total, ·, d])
// and return O shaped like Q and LSE [B, H, N_q] (base 2, the Triton walkthrough), plus the
// traffic their loops caused. Every loop runs over the sequences b (one batch entry, or one
// packed sequence) and, inside one, over tiles that never cross the sequence's end; one head of
// one sequence is an Eigen map with outer stride H·d (the Triton walkthrough's layout). Query
// head h reads K/V head kv_head(h). "HBM" is the tensor memory, "SRAM" the tile buffers (Mat<T>)
// a loop copies into. Every copy between the two is counted where it happens.
// Performance note: FA2 here is single-threaded Eigen on Br × Bc tiles; the naive version does two
// big GEMMs, so it wins on arithmetic and loses on memory — bench/bench_attention.cpp measures it.
#include "tiles.hpp"

#include <algorithm>

namespace flashlab::ref {

using detail::neg_inf;

namespace {

template <typename T>
void check_inputs(const AttentionProblem& cfg, const Tensor<T>& Q, const Tensor<T>& K, const Tensor<T>& V) {
  cfg.validate();
  detail::require_shape("Q", Q.shape(), cfg.q_shape());
  detail::require_shape("K", K.shape(), cfg.kv_shape());
  detail::require_shape("V", V.shape(), cfg.kv_shape());
}

template <typename T>
AttentionForward<T> make_output(const AttentionProblem& cfg) {
  AttentionForward<T> out{Tensor<T>(cfg.q_shape()), std::vector<T>(cfg.stat_numel(), T(0)), Traffic(cfg.dtype), {}};
  return out;
}

// The end of a row: O_i = acc / l_i, LSE_i = m_i + log2 l_i; l_i = 0 exactly means the row saw
// no key (O_i = 0, LSE_i = −inf: guard 2 of docs/glossary.md). Only an exact 0 takes that
// branch, so a NaN in l_i stays NaN.
template <typename T, typename Row, typename Out>
void finish_row(const Row& acc_row, T l, T m, Out O_row, T& lse) {
  if (l == T(0)) {
    O_row.setZero();
    lse = neg_inf<T>();
  } else {
    O_row = acc_row / l;
    lse = m + std::log2(l);
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Naive forward (the Triton walkthrough "Formulation"): S = QKᵀ/√d, P = softmax(S), O = PV, whole
// matrices, one sequence and one query head at a time (its K/V head: kv_head(h)).
// Scores are kept in base 2 (S·log2 e) so that LSE has the same meaning as the flash versions.
// ---------------------------------------------------------------------------------------------
template <typename T>
AttentionForward<T> naive_forward(const AttentionProblem& cfg, const Tensor<T>& Q, const Tensor<T>& K,
                                  const Tensor<T>& V) {
  check_inputs(cfg, Q, K, V);
  auto out = make_output<T>(cfg);
  Traffic step_s(cfg.dtype), step_p(cfg.dtype), step_o(cfg.dtype);
  const std::size_t d = cfg.head_dim;
  const T scale_log2 = static_cast<T>(cfg.softmax_scale() * detail::kLog2e);
  Mat<T> S;
  Vec<T> m;
  for (std::size_t b = 0; b < cfg.batch; ++b) {
    const SequenceSpan sp = cfg.sequence(b);
    const detail::Band band(cfg, sp);
    const std::size_t nq = sp.q_len, nk = sp.k_len, bi = sp.batch_index;
    for (std::size_t h = 0; h < cfg.heads; ++h) {
      const auto Qh = detail::rows_of(Q, bi, h, sp.q_start, nq);
      const auto Kh = detail::rows_of(K, bi, cfg.kv_head(h), sp.k_start, nk);
      const auto Vh = detail::rows_of(V, bi, cfg.kv_head(h), sp.k_start, nk);
      auto Oh = detail::rows_of(out.O, bi, h, sp.q_start, nq);
      T* lse = out.LSE.data() + cfg.stat_offset(b, h);

      // S = scale·log2(e)·Q Kᵀ: read Q, K; write S (N_q × N_k) to HBM.
      step_s.read("Q", nq * d);
      step_s.read("K", nk * d);
      S.noalias() = Qh * Kh.transpose();
      S *= scale_log2;
      detail::apply_masks(band, S, 0, 0, nk, false);
      step_s.write("S", nq * nk);
      step_s.add_flops(2 * nq * nk * d);

      // P = softmax(S) row by row (base 2), LSE = m + log2 l: read S; write P and LSE.
      step_p.read("S", nq * nk);
      if (nk == 0) m.setConstant(Eigen::Index(nq), neg_inf<T>());  // no keys: every row fully masked
      else m = S.rowwise().maxCoeff();
      const Vec<T> m_ref = (m.array() == neg_inf<T>()).select(T(0), m);  // fully masked row: reference 0
      S.array().colwise() -= m_ref.array();
      detail::exp2_inplace(S);
      const Vec<T> l = S.rowwise().sum();
      for (std::size_t r = 0; r < nq; ++r) {
        // Fully masked row (l = 0): P row = 0, O row = 0, LSE = −inf; a NaN l stays NaN.
        const T l_r = l(Eigen::Index(r));
        S.row(Eigen::Index(r)) *= l_r == T(0) ? T(0) : T(1) / l_r;
        lse[r] = l_r == T(0) ? neg_inf<T>() : m(Eigen::Index(r)) + std::log2(l_r);
      }
      step_p.write("P", nq * nk);
      step_p.write("LSE", nq);

      // O = P V: read P, V; write O.
      step_o.read("P", nq * nk);
      step_o.read("V", nk * d);
      Oh.noalias() = S * Vh;
      step_o.write("O", nq * d);
      step_o.add_flops(2 * nq * nk * d);
    }
  }
  out.kernels = {{"S = QK^T", step_s}, {"P = softmax(S)", step_p}, {"O = PV", step_o}};
  for (const auto& k : out.kernels) out.traffic.merge(k.traffic);
  return out;
}

// One online-softmax step on tile (i, j), the same in both loop orders (SRAM only):
//   S_ij = Q_i K_jᵀ · scale·log2 e, masked ; m_new = max(m_i, rowmax S_ij)
//   P_ij = 2^(S_ij − m_ref) in place of S_ij ; α = 2^(m_i − m_ref)
// with m_ref = m_new, or 0 for a row that has seen only masked scores (so 2^(−inf − m_ref) = 0,
// never 2^(−inf + inf) = NaN: guard 1 of docs/glossary.md).
template <typename T>
void online_softmax_step(const detail::Band& band, const Mat<T>& Q_i, const Mat<T>& K_j, std::size_t row0,
                         std::size_t start_n, std::size_t rk, T scale_log2, const Vec<T>& m_i, Mat<T>& S_ij,
                         Vec<T>& m_new, Vec<T>& alpha) {
  S_ij.noalias() = Q_i * K_j.transpose();
  S_ij *= scale_log2;
  detail::apply_masks(band, S_ij, row0, start_n, rk, true);
  m_new = m_i.cwiseMax(S_ij.rowwise().maxCoeff());
  const Vec<T> m_ref = (m_new.array() == neg_inf<T>()).select(T(0), m_new);
  S_ij.array().colwise() -= m_ref.array();
  detail::exp2_inplace(S_ij);  // S_ij now holds P_ij
  alpha = m_i - m_ref;
  detail::exp2_inplace(alpha);
}

// ---------------------------------------------------------------------------------------------
// Flash forward, FA2 loop order (the toy-machine lesson: inner product style; the Triton walkthrough _fwd_kernel):
//   for each sequence, for each query head h (K/V head kv_head(h)), for each query tile Q_i:
//     m_i = −inf, l_i = 0, acc = 0                   (Q_i resident in SRAM)
//     for each key tile j (skipping tile pairs the mask hides entirely):
//       S_ij = Q_i K_jᵀ · scale·log2 e ; mask out-of-sequence keys and the band to −inf
//       m_new = max(m_i, rowmax S_ij) ; P_ij = 2^(S_ij − m_new) ; α = 2^(m_i − m_new)
//       l_i = α l_i + rowsum P_ij ; acc = α acc + P_ij V_j ; m_i = m_new
//     O_i = acc / l_i ; LSE_i = m_i + log2 l_i      (l_i = 0: O_i = 0, LSE_i = −inf)
// With KvLoads::per_group the query heads of a group run side by side: their Q_i, m_i, l_i, acc
// are resident together and each K_j, V_j is loaded once for all of them.
// ---------------------------------------------------------------------------------------------
template <typename T>
AttentionForward<T> flash_forward_fa2(const AttentionProblem& cfg, const Tensor<T>& Q, const Tensor<T>& K,
                                      const Tensor<T>& V, ForwardOptions opt) {
  check_inputs(cfg, Q, K, V);
  auto out = make_output<T>(cfg);
  Traffic& tr = out.traffic;
  const std::size_t d = cfg.head_dim, Br = cfg.Br, Bc = cfg.Bc;
  // Query heads that share one load of K_j, V_j: 1, or the whole group.
  const std::size_t sharing = opt.kv_loads == KvLoads::per_group ? cfg.group_size() : 1;
  const T scale_log2 = static_cast<T>(cfg.softmax_scale() * detail::kLog2e);
  std::vector<Mat<T>> Q_i(sharing), acc(sharing);
  std::vector<Vec<T>> m_i(sharing), l_i(sharing);
  Mat<T> K_j, V_j, S_ij;
  Vec<T> m_new, alpha;
  for (std::size_t b = 0; b < cfg.batch; ++b) {
    const SequenceSpan sp = cfg.sequence(b);
    const detail::Band band(cfg, sp);
    const std::size_t nq = sp.q_len, nk = sp.k_len, bi = sp.batch_index;
    const std::size_t Tr = (nq + Br - 1) / Br, Tc = (nk + Bc - 1) / Bc;
    for (std::size_t h0 = 0; h0 < cfg.heads; h0 += sharing) {  // heads h0 … h0 + sharing − 1
      const auto Kh = detail::rows_of(K, bi, cfg.kv_head(h0), sp.k_start, nk);
      const auto Vh = detail::rows_of(V, bi, cfg.kv_head(h0), sp.k_start, nk);
      for (std::size_t i = 0; i < Tr; ++i) {
        const std::size_t row0 = i * Br, rq = std::min(Br, nq - row0);
        for (std::size_t u = 0; u < sharing; ++u) {
          // load Q_i: HBM → SRAM (zero-padded to Br rows, as boundary_check does)
          detail::load_tile(detail::rows_of(Q, bi, h0 + u, sp.q_start, nq), row0, rq, Br, Q_i[u]);
          tr.read("Q", rq * d);
          m_i[u].setConstant(Eigen::Index(Br), neg_inf<T>());
          l_i[u].setZero(Eigen::Index(Br));
          acc[u].setZero(Eigen::Index(Br), Eigen::Index(d));
        }
        for (std::size_t j = 0; j < Tc; ++j) {
          const std::size_t start_n = j * Bc, rk = std::min(Bc, nk - start_n);
          if (detail::tile_fully_masked(band, row0, row0 + rq, start_n, rk)) continue;  // skipped, not loaded
          // load K_j, V_j: HBM → SRAM (once for the `sharing` query heads)
          detail::load_tile(Kh, start_n, rk, Bc, K_j);
          detail::load_tile(Vh, start_n, rk, Bc, V_j);
          tr.read("K", rk * d);
          tr.read("V", rk * d);
          for (std::size_t u = 0; u < sharing; ++u) {
            online_softmax_step(band, Q_i[u], K_j, row0, start_n, rk, scale_log2, m_i[u], S_ij, m_new, alpha);
            l_i[u] = l_i[u].cwiseProduct(alpha) + S_ij.rowwise().sum();
            acc[u].array().colwise() *= alpha.array();
            if (opt.round_p) S_ij = S_ij.unaryExpr([&](T p) { return static_cast<T>(opt.round_p(double(p))); });
            acc[u].noalias() += S_ij * V_j;
            m_i[u] = m_new;
            tr.add_flops(4 * d * rq * rk);
          }
        }
        for (std::size_t u = 0; u < sharing; ++u) {
          // write O_i, LSE_i: SRAM → HBM (valid rows only)
          auto Oh = detail::rows_of(out.O, bi, h0 + u, sp.q_start, nq);
          T* lse = out.LSE.data() + cfg.stat_offset(b, h0 + u);
          for (std::size_t r = 0; r < rq; ++r) {
            const auto R = Eigen::Index(r);
            finish_row(acc[u].row(R), l_i[u](R), m_i[u](R), Oh.row(Eigen::Index(row0 + r)), lse[row0 + r]);
          }
          tr.write("O", rq * d);
          tr.write("LSE", rq);
        }
      }
    }
  }
  out.kernels = {{"forward", out.traffic}};
  return out;
}

// ---------------------------------------------------------------------------------------------
// Flash forward, FA1 loop order (the toy-machine lesson: outer product style):
//   for each sequence, for each K/V head (its query heads h inside):
//     for each key tile j that some query sees:              (K_j, V_j resident in SRAM)
//       for each query head h of the group, each query tile i that sees tile j:
//         load Q_i; unless first visit, load O_i, m_i, l_i (HBM)
//         S_ij, masks, m_new, P_ij, α as in FA2
//         l_new = α l_i + rowsum P_ij ; O_i = (α l_i O_i + P_ij V_j) / l_new
//         store O_i; store m_i, l_i — or, on the last visit, LSE_i = m_new + log2 l_new instead
//     query tiles no key tile reaches: store O_i = 0, LSE_i = −inf
// ---------------------------------------------------------------------------------------------
template <typename T>
AttentionForward<T> flash_forward_fa1(const AttentionProblem& cfg, const Tensor<T>& Q, const Tensor<T>& K,
                                      const Tensor<T>& V) {
  check_inputs(cfg, Q, K, V);
  auto out = make_output<T>(cfg);
  Traffic& tr = out.traffic;
  const std::size_t d = cfg.head_dim, Br = cfg.Br, Bc = cfg.Bc, g = cfg.group_size();
  const T scale_log2 = static_cast<T>(cfg.softmax_scale() * detail::kLog2e);
  Mat<T> Q_i, K_j, V_j, S_ij, O_i;
  Vec<T> m_i, l_i, m_new, alpha, l_new;
  std::vector<T> m_hbm, l_hbm;  // FA1's running statistics live in HBM between visits, [g, N_q]
  std::vector<char> visited;    // [g, Tr]
  for (std::size_t b = 0; b < cfg.batch; ++b) {
    const SequenceSpan sp = cfg.sequence(b);
    const detail::Band band(cfg, sp);
    const std::size_t nq = sp.q_len, nk = sp.k_len, bi = sp.batch_index;
    const std::size_t Tr = (nq + Br - 1) / Br, Tc = (nk + Bc - 1) / Bc;
    for (std::size_t hk = 0; hk < cfg.h_kv(); ++hk) {
      const auto Kh = detail::rows_of(K, bi, hk, sp.k_start, nk);
      const auto Vh = detail::rows_of(V, bi, hk, sp.k_start, nk);
      m_hbm.assign(g * nq, T(0));
      l_hbm.assign(g * nq, T(0));
      visited.assign(g * Tr, 0);
      for (std::size_t j = 0; j < Tc; ++j) {
        const std::size_t start_n = j * Bc, rk = std::min(Bc, nk - start_n);
        if (detail::tile_fully_masked(band, 0, nq, start_n, rk)) continue;  // no query row sees this key tile
        // load K_j, V_j: HBM → SRAM (once per key tile, for the whole group)
        detail::load_tile(Kh, start_n, rk, Bc, K_j);
        detail::load_tile(Vh, start_n, rk, Bc, V_j);
        tr.read("K", rk * d);
        tr.read("V", rk * d);
        for (std::size_t u = 0; u < g; ++u) {
          const std::size_t h = hk * g + u;
          const auto Qh = detail::rows_of(Q, bi, h, sp.q_start, nq);
          auto Oh = detail::rows_of(out.O, bi, h, sp.q_start, nq);
          T* lse = out.LSE.data() + cfg.stat_offset(b, h);
          T* m_h = m_hbm.data() + u * nq;
          T* l_h = l_hbm.data() + u * nq;
          for (std::size_t i = 0; i < Tr; ++i) {
            const std::size_t row0 = i * Br, rq = std::min(Br, nq - row0);
            if (detail::tile_fully_masked(band, row0, row0 + rq, start_n, rk)) continue;
            const bool first = !visited[u * Tr + i];
            const bool last = j + 1 == Tc ||
                              detail::tile_fully_masked(band, row0, row0 + rq, start_n + Bc, std::min(Bc, nk - start_n - Bc));
            visited[u * Tr + i] = 1;
            // load Q_i: HBM → SRAM (once per visited pair)
            detail::load_tile(Qh, row0, rq, Br, Q_i);
            tr.read("Q", rq * d);
            O_i.setZero(Eigen::Index(Br), Eigen::Index(d));
            m_i.setConstant(Eigen::Index(Br), neg_inf<T>());
            l_i.setZero(Eigen::Index(Br));
            if (!first) {
              // load O_i, m_i, l_i: HBM → SRAM (read-modify-write of the running state)
              O_i.topRows(Eigen::Index(rq)) = Oh.middleRows(Eigen::Index(row0), Eigen::Index(rq));
              for (std::size_t r = 0; r < rq; ++r) {
                m_i(Eigen::Index(r)) = m_h[row0 + r];
                l_i(Eigen::Index(r)) = l_h[row0 + r];
              }
              tr.read("O", rq * d);
              tr.read("m", rq);
              tr.read("l", rq);
            }
            online_softmax_step(band, Q_i, K_j, row0, start_n, rk, scale_log2, m_i, S_ij, m_new, alpha);
            l_new = l_i.cwiseProduct(alpha) + S_ij.rowwise().sum();
            // O_i = (α l_i O_i + P_ij V_j) / l_new, with 0 for rows still fully masked (l_new = 0
            // exactly; a NaN l_new stays NaN)
            O_i.array().colwise() *= (alpha.cwiseProduct(l_i)).array();
            O_i.noalias() += S_ij * V_j;
            const Vec<T> inv = (l_new.array() == T(0)).select(T(0), l_new.cwiseInverse());
            O_i.array().colwise() *= inv.array();
            tr.add_flops(4 * d * rq * rk);
            // store O_i (every visit): SRAM → HBM
            Oh.middleRows(Eigen::Index(row0), Eigen::Index(rq)) = O_i.topRows(Eigen::Index(rq));
            tr.write("O", rq * d);
            if (last) {
              // store LSE_i: SRAM → HBM (the statistics are final)
              for (std::size_t r = 0; r < rq; ++r) {
                const auto R = Eigen::Index(r);
                lse[row0 + r] = l_new(R) == T(0) ? neg_inf<T>() : m_new(R) + std::log2(l_new(R));
              }
              tr.write("LSE", rq);
            } else {
              // store m_i, l_i: SRAM → HBM (for the next visit)
              for (std::size_t r = 0; r < rq; ++r) {
                m_h[row0 + r] = m_new(Eigen::Index(r));
                l_h[row0 + r] = l_new(Eigen::Index(r));
              }
              tr.write("m", rq);
              tr.write("l", rq);
            }
          }
        }
      }
      // The query tiles no key tile reaches get O_i = 0, LSE_i = −inf (guard 2 of
      // docs/glossary.md), written once.
      for (std::size_t u = 0; u < g; ++u) {
        const std::size_t h = hk * g + u;
        auto Oh = detail::rows_of(out.O, bi, h, sp.q_start, nq);
        T* lse = out.LSE.data() + cfg.stat_offset(b, h);
        for (std::size_t i = 0; i < Tr; ++i) {
          if (visited[u * Tr + i]) continue;
          const std::size_t row0 = i * Br, rq = std::min(Br, nq - row0);
          Oh.middleRows(Eigen::Index(row0), Eigen::Index(rq)).setZero();
          std::fill(lse + row0, lse + row0 + rq, neg_inf<T>());
          tr.write("O", rq * d);
          tr.write("LSE", rq);
        }
      }
    }
  }
  out.kernels = {{"forward", out.traffic}};
  return out;
}

template <typename T>
AttentionForward<T> attention_forward(Algorithm v, const AttentionProblem& cfg, const Tensor<T>& Q, const Tensor<T>& K,
                                      const Tensor<T>& V) {
  switch (v) {
    case Algorithm::naive_fwd: return naive_forward(cfg, Q, K, V);
    case Algorithm::fa1_fwd: return flash_forward_fa1(cfg, Q, K, V);
    case Algorithm::fa2_fwd: return flash_forward_fa2(cfg, Q, K, V);
    default: break;
  }
  throw std::invalid_argument("attention_forward: " + std::string(algorithm_name(v)) + " is not a forward variant");
}

// Explicit instantiations: double (the reference) and float only.
#define FLASHLAB_FWD(T)                                                                                            \
  template AttentionForward<T> naive_forward(const AttentionProblem&, const Tensor<T>&, const Tensor<T>&,            \
                                             const Tensor<T>&);                                                     \
  template AttentionForward<T> flash_forward_fa2(const AttentionProblem&, const Tensor<T>&, const Tensor<T>&,        \
                                                 const Tensor<T>&, ForwardOptions);                                 \
  template AttentionForward<T> flash_forward_fa1(const AttentionProblem&, const Tensor<T>&, const Tensor<T>&,        \
                                                 const Tensor<T>&);                                                 \
  template AttentionForward<T> attention_forward(Algorithm, const AttentionProblem&, const Tensor<T>&,                 \
                                                 const Tensor<T>&, const Tensor<T>&);
FLASHLAB_FWD(double)
FLASHLAB_FWD(float)
#undef FLASHLAB_FWD

}  // namespace flashlab::ref
