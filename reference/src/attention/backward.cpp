// Attention backward on the CPU: naive (P, dP, dS materialised), the two-kernel flash design
// (D preprocessing, dQ kernel, dK/dV kernel) and the single-kernel design with dQ accumulated in
// HBM ("atomic"). The Triton walkthrough "Backward Pass"; the toy-machine lesson "The D_i Trick".
//
// Manual. The loss is L = Σ O∘dO, so dL/dO = dO. The flash versions take O and LSE from a forward
// pass; LSE is base 2 (scores pre-scaled by scale·log2 e), so P_ij = 2^(S_ij − LSE_i) and
// dS_ij = P_ij (dP_ij − D_i) · scale. Padded query rows are handled exactly as in the Triton walkthrough:
// zero Q_i, dO_i, LSE_i, D_i, no explicit mask (implicit masking); padded key rows are masked to
// −inf unless BackwardOptions::mask_kv is false (the NaN hazard). A fully masked row (LSE = −inf)
// is read as LSE = +inf so that its P row is exactly 0 (2^(S − ∞) = 0) instead of 2^(−∞+∞) = NaN.
// With BackwardOptions::fp16_arithmetic every tile result is rounded to half precision.
// Every loop runs over the sequences b and, inside one, over tiles that never cross the
// sequence's end. Grouped-query attention: the loops with K_j/V_j outside (the dK/dV kernel, the
// atomic kernel, the naive dK and dV steps) run per K/V head with its group of query heads
// inside, so dK_j and dV_j sum over the group before they are written once; the dQ kernel runs
// per query head (or, with KvLoads::per_group, per group, sharing each K_j, V_j load).
#include "tiles.hpp"

#include <algorithm>
#include <cstring>

namespace flashlab::ref {

using detail::neg_inf;

double round_to_half(double x) {
  if (std::isnan(x) || std::isinf(x) || x == 0.0) return x;
  const double ax = std::abs(x);
  int e = 0;
  std::frexp(ax, &e);  // ax = f·2^e with f in [0.5, 1): the leading bit has weight 2^(e−1)
  // binary16 has 11 significant bits; below the smallest normal 2^−14 the spacing is fixed at 2^−24.
  const int quantum_exp = std::max(e - 11, -24);
  const double q = std::ldexp(1.0, quantum_exp);
  const double r = std::nearbyint(ax / q) * q;  // ties to even in the default rounding mode
  if (r > 65504.0) return std::copysign(std::numeric_limits<double>::infinity(), x);
  return std::copysign(r, x);
}

namespace {

template <typename T>
void check_bwd_inputs(const AttentionProblem& cfg, const Tensor<T>& Q, const Tensor<T>& K, const Tensor<T>& V,
                      const Tensor<T>& O, const std::vector<T>& LSE, const Tensor<T>& dO) {
  cfg.validate();
  detail::require_shape("Q", Q.shape(), cfg.q_shape());
  detail::require_shape("K", K.shape(), cfg.kv_shape());
  detail::require_shape("V", V.shape(), cfg.kv_shape());
  detail::require_shape("O", O.shape(), cfg.q_shape());
  detail::require_shape("dO", dO.shape(), cfg.q_shape());
  detail::require_stats("LSE", LSE, cfg.stat_numel());
}

template <typename T>
AttentionGradients<T> make_grads(const AttentionProblem& cfg) {
  AttentionGradients<T> g{Tensor<T>(cfg.q_shape()), Tensor<T>(cfg.kv_shape()), Tensor<T>(cfg.kv_shape()),
                          std::vector<T>(cfg.stat_numel(), T(0)), {}, Traffic(cfg.dtype), {}};
  return g;
}

// Loads LSE_i and D_i (rows [row0, row0+rq)) zero-padded to Br, LSE = −inf read as +inf (P row = 0).
template <typename T>
void load_stats(const T* lse, const T* D, std::size_t row0, std::size_t rq, std::size_t Br, Vec<T>& lse_i,
                Vec<T>& D_i) {
  lse_i.setZero(Eigen::Index(Br));
  D_i.setZero(Eigen::Index(Br));
  for (std::size_t r = 0; r < rq; ++r) {
    const T v = lse[row0 + r];
    lse_i(Eigen::Index(r)) = v == neg_inf<T>() ? std::numeric_limits<T>::infinity() : v;
    D_i(Eigen::Index(r)) = D[row0 + r];
  }
}

// One head of one sequence: the rows of Q, dO (query head h) or K, V (K/V head hk) it owns, and
// where its LSE and D rows start.
template <typename T>
struct QRows {
  ConstHeadMap<T> Q, dO;
  const T* lse;
  const T* D;
};
template <typename T>
QRows<T> q_rows(const AttentionProblem& cfg, std::size_t b, const SequenceSpan& sp, std::size_t h, const Tensor<T>& Q,
                const Tensor<T>& dO, const std::vector<T>& LSE, const std::vector<T>& D) {
  const std::size_t at = cfg.stat_offset(b, h);
  return {detail::rows_of(Q, sp.batch_index, h, sp.q_start, sp.q_len),
          detail::rows_of(dO, sp.batch_index, h, sp.q_start, sp.q_len), LSE.data() + at, D.data() + at};
}

// Loads K_j, V_j (rows [start_n, start_n+rk) of one K/V head) zero-padded to Bc rows: HBM → SRAM, counted.
template <typename T>
void load_kv_tile(const ConstHeadMap<T>& Kh, const ConstHeadMap<T>& Vh, std::size_t start_n, std::size_t rk,
                  std::size_t Bc, bool half, Traffic& tr, Mat<T>& K_j, Mat<T>& V_j) {
  const std::size_t d = std::size_t(Kh.cols());
  detail::load_tile(Kh, start_n, rk, Bc, K_j);
  detail::load_tile(Vh, start_n, rk, Bc, V_j);
  tr.read("K", rk * d);
  tr.read("V", rk * d);
  detail::maybe_half(half, K_j);
  detail::maybe_half(half, V_j);
}

// Loads Q_i, dO_i, LSE_i, D_i (rows [row0, row0+rq)) zero-padded to Br rows: HBM → SRAM, counted.
// Zero padding is the Triton walkthrough's implicit Q-side masking.
template <typename T>
void load_q_tile(const QRows<T>& q, std::size_t row0, std::size_t rq, std::size_t Br, bool half, Traffic& tr,
                 Mat<T>& Q_i, Mat<T>& dO_i, Vec<T>& lse_i, Vec<T>& D_i) {
  const std::size_t d = std::size_t(q.Q.cols());
  detail::load_tile(q.Q, row0, rq, Br, Q_i);
  detail::load_tile(q.dO, row0, rq, Br, dO_i);
  load_stats(q.lse, q.D, row0, rq, Br, lse_i, D_i);
  tr.read("Q", rq * d);
  tr.read("dO", rq * d);
  tr.read("LSE", rq);
  tr.read("D", rq);
  detail::maybe_half(half, Q_i);
  detail::maybe_half(half, dO_i);
}

// ---------------------------------------------------------------------------------------------
// D preprocessing (the Triton walkthrough "The O(N) Preprocessing Trick"): D_i = rowsum(dO_i ∘ O_i), O(N·d).
// ---------------------------------------------------------------------------------------------
template <typename T>
Traffic d_preprocessing(const AttentionProblem& cfg, const Tensor<T>& O, const Tensor<T>& dO, std::vector<T>& D,
                        bool half) {
  Traffic tr(cfg.dtype);
  const std::size_t d = cfg.head_dim, Br = cfg.Br;
  Mat<T> O_i, dO_i;
  Vec<T> D_i;
  for (std::size_t b = 0; b < cfg.batch; ++b) {
    const SequenceSpan sp = cfg.sequence(b);
    const std::size_t nq = sp.q_len;
    for (std::size_t h = 0; h < cfg.heads; ++h) {
      T* Dh = D.data() + cfg.stat_offset(b, h);
      const auto Oh = detail::rows_of(O, sp.batch_index, h, sp.q_start, nq);
      const auto dOh = detail::rows_of(dO, sp.batch_index, h, sp.q_start, nq);
      for (std::size_t row0 = 0; row0 < nq; row0 += Br) {
        const std::size_t rq = std::min(Br, nq - row0);
        // load O_i, dO_i: HBM → SRAM
        detail::load_tile(Oh, row0, rq, Br, O_i);
        detail::load_tile(dOh, row0, rq, Br, dO_i);
        tr.read("O", rq * d);
        tr.read("dO", rq * d);
        detail::maybe_half(half, O_i);
        detail::maybe_half(half, dO_i);
        D_i = O_i.cwiseProduct(dO_i).rowwise().sum();
        tr.add_flops(2 * rq * d);
        // store D_i: SRAM → HBM (fp32 statistic)
        for (std::size_t r = 0; r < rq; ++r) Dh[row0 + r] = D_i(Eigen::Index(r));
        tr.write("D", rq);
      }
    }
  }
  return tr;
}

// The recomputation shared by every flash backward loop, on one (Q_i, K_j) tile pair:
//   S_ij = Q_i K_jᵀ · scale·log2 e, masked ; P_ij = 2^(S_ij − LSE_i) ; dP_ij = dO_i V_jᵀ ;
//   dS_ij = P_ij ∘ (dP_ij − D_i) · scale
template <typename T>
struct TilePair {
  Mat<T> S, P, dP, dS;
  void recompute(const AttentionProblem& cfg, const detail::Band& band, const BackwardOptions& opt, const Mat<T>& Q_i,
                 const Mat<T>& dO_i, const Vec<T>& lse_i, const Vec<T>& D_i, const Mat<T>& K_j, const Mat<T>& V_j,
                 std::size_t row0, std::size_t start_n, std::size_t rk) {
    const bool half = opt.fp16_arithmetic;
    const T scale = static_cast<T>(cfg.softmax_scale());
    const T scale_log2 = static_cast<T>(cfg.softmax_scale() * detail::kLog2e);
    S.noalias() = Q_i * K_j.transpose();
    detail::maybe_half(half, S);
    S *= scale_log2;
    detail::maybe_half(half, S);
    // KV mask (out-of-sequence keys → −inf) unless dropped; the causal/window band always. No Q-side mask.
    detail::apply_masks(band, S, row0, start_n, rk, opt.mask_kv);
    P = S;
    P.array().colwise() -= lse_i.array();
    detail::maybe_half(half, P);
    detail::exp2_inplace(P);
    detail::maybe_half(half, P);
    dP.noalias() = dO_i * V_j.transpose();
    detail::maybe_half(half, dP);
    dS = dP;
    dS.array().colwise() -= D_i.array();
    detail::maybe_half(half, dS);
    dS = dS.cwiseProduct(P);
    detail::maybe_half(half, dS);
    dS *= scale;
    detail::maybe_half(half, dS);
  }
};

// The K_j/V_j-outer loop of the dK/dV kernel and of the atomic kernel, per sequence and K/V head:
//   for each key tile j (K_j, V_j resident; dK_j, dV_j accumulate in SRAM):
//     for each query head h of the group, each query tile i the mask lets see tile j:
//       recompute ; dV_j += P_ijᵀ dO_i ; dK_j += dS_ijᵀ Q_i ; and, when `dQ` is given,
//       dQ_i += dS_ij K_j   (read-modify-write in HBM: atomicAdd on a GPU)
//     store dK_j, dV_j
template <typename T>
void kv_outer_loop(const AttentionProblem& cfg, const BackwardOptions& opt, const Tensor<T>& Q, const Tensor<T>& K,
                   const Tensor<T>& V, const std::vector<T>& LSE, const Tensor<T>& dO, AttentionGradients<T>& g,
                   bool accumulate_dQ, Traffic& tr) {
  const bool half = opt.fp16_arithmetic;
  const std::size_t d = cfg.head_dim, Br = cfg.Br, Bc = cfg.Bc, group = cfg.group_size();
  Mat<T> Q_i, dO_i, K_j, V_j, dQ_i, dK_j, dV_j;
  Vec<T> lse_i, D_i;
  TilePair<T> t;
  for (std::size_t b = 0; b < cfg.batch; ++b) {
    const SequenceSpan sp = cfg.sequence(b);
    const detail::Band band(cfg, sp);
    const std::size_t nq = sp.q_len, nk = sp.k_len, bi = sp.batch_index;
    for (std::size_t hk = 0; hk < cfg.h_kv(); ++hk) {
      const auto Kh = detail::rows_of(K, bi, hk, sp.k_start, nk);
      const auto Vh = detail::rows_of(V, bi, hk, sp.k_start, nk);
      auto dKh = detail::rows_of(g.dK, bi, hk, sp.k_start, nk);
      auto dVh = detail::rows_of(g.dV, bi, hk, sp.k_start, nk);
      for (std::size_t start_n = 0; start_n < nk; start_n += Bc) {
        const std::size_t rk = std::min(Bc, nk - start_n);
        // load K_j, V_j: HBM → SRAM (resident for the whole inner loop)
        load_kv_tile(Kh, Vh, start_n, rk, Bc, half, tr, K_j, V_j);
        dK_j.setZero(Eigen::Index(Bc), Eigen::Index(d));
        dV_j.setZero(Eigen::Index(Bc), Eigen::Index(d));
        for (std::size_t h = hk * group; h < (hk + 1) * group; ++h) {
          const QRows<T> q = q_rows(cfg, b, sp, h, Q, dO, LSE, g.D);
          auto dQh = detail::rows_of(g.dQ, bi, h, sp.q_start, nq);
          for (std::size_t row0 = 0; row0 < nq; row0 += Br) {
            const std::size_t rq = std::min(Br, nq - row0);
            if (detail::tile_fully_masked(band, row0, row0 + rq, start_n, rk)) continue;
            // load Q_i, dO_i, LSE_i, D_i: HBM → SRAM
            load_q_tile(q, row0, rq, Br, half, tr, Q_i, dO_i, lse_i, D_i);
            t.recompute(cfg, band, opt, Q_i, dO_i, lse_i, D_i, K_j, V_j, row0, start_n, rk);
            dV_j.noalias() += t.P.transpose() * dO_i;
            dK_j.noalias() += t.dS.transpose() * Q_i;
            detail::maybe_half(half, dV_j);
            detail::maybe_half(half, dK_j);
            if (!accumulate_dQ) {
              tr.add_flops(8 * d * rq * rk);
              continue;
            }
            // dQ_i += dS_ij K_j: read dQ_i HBM → SRAM, add, write back SRAM → HBM (atomicAdd)
            dQ_i = t.dS * K_j;
            detail::maybe_half(half, dQ_i);
            auto dst = dQh.middleRows(Eigen::Index(row0), Eigen::Index(rq));
            dst += dQ_i.topRows(Eigen::Index(rq));
            if (half) {
              for (Eigen::Index r = 0; r < dst.rows(); ++r)
                for (Eigen::Index c = 0; c < dst.cols(); ++c)
                  dst(r, c) = static_cast<T>(round_to_half(static_cast<double>(dst(r, c))));
            }
            tr.read("dQ", rq * d);
            tr.write("dQ", rq * d);
            tr.add_flops(10 * d * rq * rk);
          }
        }
        // store dK_j, dV_j: SRAM → HBM (summed over the group)
        dKh.middleRows(Eigen::Index(start_n), Eigen::Index(rk)) = dK_j.topRows(Eigen::Index(rk));
        dVh.middleRows(Eigen::Index(start_n), Eigen::Index(rk)) = dV_j.topRows(Eigen::Index(rk));
        tr.write("dK", rk * d);
        tr.write("dV", rk * d);
      }
    }
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Naive backward (the Triton walkthrough "Formulation"): whole N_q × N_k matrices per sequence and head.
//   dV = Pᵀ dO ; dP = dO Vᵀ ; D = rowsum(dP∘P) ; dS = P∘(dP − D) ; dQ = scale·dS K ; dK = scale·dSᵀ Q
// dK and dV of a K/V head sum the terms of its group's query heads and are written once.
// D is also computed as rowsum(dO∘O) (D_from_O) to show the identity of the D_i trick.
// ---------------------------------------------------------------------------------------------
template <typename T>
AttentionGradients<T> naive_backward(const AttentionProblem& cfg, const Tensor<T>& Q, const Tensor<T>& K,
                                     const Tensor<T>& V, const Tensor<T>& dO) {
  cfg.validate();
  detail::require_shape("dO", dO.shape(), cfg.q_shape());
  const auto fwd = naive_forward(cfg, Q, K, V);  // P is what the naive forward saved in HBM
  auto g = make_grads<T>(cfg);
  g.D_from_O.assign(cfg.stat_numel(), T(0));
  Traffic s_dv(cfg.dtype), s_dp(cfg.dtype), s_d(cfg.dtype), s_ds(cfg.dtype), s_dq(cfg.dtype), s_dk(cfg.dtype);
  const std::size_t d = cfg.head_dim, group = cfg.group_size();
  const T scale = static_cast<T>(cfg.softmax_scale());
  const T scale_log2 = static_cast<T>(cfg.softmax_scale() * detail::kLog2e);
  Mat<T> P, dP, dS;
  for (std::size_t b = 0; b < cfg.batch; ++b) {
    const SequenceSpan sp = cfg.sequence(b);
    const detail::Band band(cfg, sp);
    const std::size_t nq = sp.q_len, nk = sp.k_len, bi = sp.batch_index;
    for (std::size_t hk = 0; hk < cfg.h_kv(); ++hk) {
      const auto Kh = detail::rows_of(K, bi, hk, sp.k_start, nk);
      const auto Vh = detail::rows_of(V, bi, hk, sp.k_start, nk);
      auto dKh = detail::rows_of(g.dK, bi, hk, sp.k_start, nk);
      auto dVh = detail::rows_of(g.dV, bi, hk, sp.k_start, nk);
      for (std::size_t h = hk * group; h < (hk + 1) * group; ++h) {
        const auto Qh = detail::rows_of(Q, bi, h, sp.q_start, nq);
        const auto Oh = detail::rows_of(fwd.O, bi, h, sp.q_start, nq);
        const auto dOh = detail::rows_of(dO, bi, h, sp.q_start, nq);
        const T* lse = fwd.LSE.data() + cfg.stat_offset(b, h);
        T* Dh = g.D.data() + cfg.stat_offset(b, h);
        T* D2 = g.D_from_O.data() + cfg.stat_offset(b, h);
        // P as the naive forward stored it: P = 2^(S − LSE), masked entries and fully masked rows 0
        P.noalias() = Qh * Kh.transpose();
        P *= scale_log2;
        detail::apply_masks(band, P, 0, 0, nk, false);
        for (std::size_t r = 0; r < nq; ++r) {
          const T l = lse[r] == neg_inf<T>() ? std::numeric_limits<T>::infinity() : lse[r];
          P.row(Eigen::Index(r)).array() -= l;
        }
        detail::exp2_inplace(P);

        // dV += Pᵀ dO: read P, dO (dV written once per K/V head, below)
        dVh.noalias() += P.transpose() * dOh;
        s_dv.read("P", nq * nk);
        s_dv.read("dO", nq * d);
        s_dv.add_flops(2 * nq * nk * d);
        // dP = dO Vᵀ: read dO, V; write dP
        dP.noalias() = dOh * Vh.transpose();
        s_dp.read("dO", nq * d);
        s_dp.read("V", nk * d);
        s_dp.write("dP", nq * nk);
        s_dp.add_flops(2 * nq * nk * d);
        // D = rowsum(dP ∘ P): read dP, P; write D   (and, for the identity only, rowsum(dO ∘ O))
        const Vec<T> D = dP.cwiseProduct(P).rowwise().sum();
        const Vec<T> D_alt = dOh.cwiseProduct(Oh).rowwise().sum();
        for (std::size_t r = 0; r < nq; ++r) {
          Dh[r] = D(Eigen::Index(r));
          D2[r] = D_alt(Eigen::Index(r));
        }
        s_d.read("dP", nq * nk);
        s_d.read("P", nq * nk);
        s_d.write("D", nq);
        s_d.add_flops(2 * nq * nk);
        // dS = P ∘ (dP − D): read P, dP, D; write dS
        dS = dP;
        dS.array().colwise() -= D.array();
        dS = dS.cwiseProduct(P);
        s_ds.read("P", nq * nk);
        s_ds.read("dP", nq * nk);
        s_ds.read("D", nq);
        s_ds.write("dS", nq * nk);
        // dQ = scale·dS K: read dS, K; write dQ
        detail::rows_of(g.dQ, bi, h, sp.q_start, nq).noalias() = scale * (dS * Kh);
        s_dq.read("dS", nq * nk);
        s_dq.read("K", nk * d);
        s_dq.write("dQ", nq * d);
        s_dq.add_flops(2 * nq * nk * d);
        // dK += scale·dSᵀ Q: read dS, Q (dK written once per K/V head, below)
        dKh.noalias() += scale * (dS.transpose() * Qh);
        s_dk.read("dS", nq * nk);
        s_dk.read("Q", nq * d);
        s_dk.add_flops(2 * nq * nk * d);
      }
      s_dv.write("dV", nk * d);
      s_dk.write("dK", nk * d);
    }
  }
  g.kernels = {{"dV = P^T dO", s_dv},      {"dP = dO V^T", s_dp},     {"D = rowsum(dP*P)", s_d},
               {"dS = P*(dP - D)", s_ds}, {"dQ = scale dS K", s_dq}, {"dK = scale dS^T Q", s_dk}};
  for (const auto& k : g.kernels) g.traffic.merge(k.traffic);
  return g;
}

// ---------------------------------------------------------------------------------------------
// Flash backward, two kernels (the Triton walkthrough _bwd_dq_kernel and _bwd_dk_dv_kernel):
//   D preprocessing: D_i = rowsum(dO_i ∘ O_i)
//   dQ kernel:   for each query tile i (Q_i, dO_i, LSE_i, D_i resident):
//                  for each key tile j: recompute S_ij, P_ij, dP_ij, dS_ij ; dQ_i += dS_ij K_j
//   dK/dV kernel: for each key tile j (K_j, V_j resident):
//                  for each query tile i: recompute ; dV_j += P_ijᵀ dO_i ; dK_j += dS_ijᵀ Q_i
// ---------------------------------------------------------------------------------------------
template <typename T>
AttentionGradients<T> flash_backward_two_kernel(const AttentionProblem& cfg, const Tensor<T>& Q, const Tensor<T>& K,
                                                const Tensor<T>& V, const Tensor<T>& O, const std::vector<T>& LSE,
                                                const Tensor<T>& dO, BackwardOptions opt) {
  check_bwd_inputs(cfg, Q, K, V, O, LSE, dO);
  auto g = make_grads<T>(cfg);
  const bool half = opt.fp16_arithmetic;
  const std::size_t d = cfg.head_dim, Br = cfg.Br, Bc = cfg.Bc;
  // Query heads that share one load of K_j, V_j in the dQ kernel: 1, or the whole group.
  const std::size_t sharing = opt.kv_loads == KvLoads::per_group ? cfg.group_size() : 1;
  Traffic pre = d_preprocessing(cfg, O, dO, g.D, half);
  Traffic kq(cfg.dtype), kkv(cfg.dtype);
  std::vector<Mat<T>> Q_i(sharing), dO_i(sharing), dQ_i(sharing);
  std::vector<Vec<T>> lse_i(sharing), D_i(sharing);
  Mat<T> K_j, V_j;
  TilePair<T> t;

  // dQ kernel
  for (std::size_t b = 0; b < cfg.batch; ++b) {
    const SequenceSpan sp = cfg.sequence(b);
    const detail::Band band(cfg, sp);
    const std::size_t nq = sp.q_len, nk = sp.k_len, bi = sp.batch_index;
    for (std::size_t h0 = 0; h0 < cfg.heads; h0 += sharing) {  // heads h0 … h0 + sharing − 1
      const auto Kh = detail::rows_of(K, bi, cfg.kv_head(h0), sp.k_start, nk);
      const auto Vh = detail::rows_of(V, bi, cfg.kv_head(h0), sp.k_start, nk);
      for (std::size_t row0 = 0; row0 < nq; row0 += Br) {
        const std::size_t rq = std::min(Br, nq - row0);
        for (std::size_t u = 0; u < sharing; ++u) {
          // load Q_i, dO_i, LSE_i, D_i: HBM → SRAM (zero-padded: the Triton walkthrough's implicit Q-side masking)
          load_q_tile(q_rows(cfg, b, sp, h0 + u, Q, dO, LSE, g.D), row0, rq, Br, half, kq, Q_i[u], dO_i[u], lse_i[u],
                      D_i[u]);
          dQ_i[u].setZero(Eigen::Index(Br), Eigen::Index(d));
        }
        for (std::size_t start_n = 0; start_n < nk; start_n += Bc) {
          const std::size_t rk = std::min(Bc, nk - start_n);
          if (detail::tile_fully_masked(band, row0, row0 + rq, start_n, rk)) continue;
          // load K_j, V_j: HBM → SRAM (once for the `sharing` query heads)
          load_kv_tile(Kh, Vh, start_n, rk, Bc, half, kq, K_j, V_j);
          for (std::size_t u = 0; u < sharing; ++u) {
            t.recompute(cfg, band, opt, Q_i[u], dO_i[u], lse_i[u], D_i[u], K_j, V_j, row0, start_n, rk);
            dQ_i[u].noalias() += t.dS * K_j;  // padded K_j rows are 0: Inf·0 = NaN if the KV mask is dropped
            detail::maybe_half(half, dQ_i[u]);
            kq.add_flops(6 * d * rq * rk);
          }
        }
        for (std::size_t u = 0; u < sharing; ++u) {
          // store dQ_i: SRAM → HBM
          detail::rows_of(g.dQ, bi, h0 + u, sp.q_start, nq).middleRows(Eigen::Index(row0), Eigen::Index(rq)) =
              dQ_i[u].topRows(Eigen::Index(rq));
          kq.write("dQ", rq * d);
        }
      }
    }
  }

  // dK/dV kernel
  kv_outer_loop(cfg, opt, Q, K, V, LSE, dO, g, false, kkv);
  g.kernels = {{"D preprocessing", pre}, {"dQ kernel", kq}, {"dK/dV kernel", kkv}};
  for (const auto& k : g.kernels) g.traffic.merge(k.traffic);
  return g;
}

// ---------------------------------------------------------------------------------------------
// Flash backward, one kernel with dQ in HBM (the Triton walkthrough "CUDA (Single Kernel, 10N²d)"):
//   D preprocessing ; dQ = 0
//   for each key tile j (K_j, V_j resident; dK_j, dV_j accumulate in SRAM):
//     for each query tile i: recompute ; dV_j += P_ijᵀ dO_i ; dK_j += dS_ijᵀ Q_i ;
//                            dQ_i += dS_ij K_j   (read-modify-write in HBM: atomicAdd on a GPU)
// ---------------------------------------------------------------------------------------------
template <typename T>
AttentionGradients<T> flash_backward_atomic(const AttentionProblem& cfg, const Tensor<T>& Q, const Tensor<T>& K,
                                            const Tensor<T>& V, const Tensor<T>& O, const std::vector<T>& LSE,
                                            const Tensor<T>& dO, BackwardOptions opt) {
  check_bwd_inputs(cfg, Q, K, V, O, LSE, dO);
  auto g = make_grads<T>(cfg);
  Traffic pre = d_preprocessing(cfg, O, dO, g.D, opt.fp16_arithmetic);
  // dQ = 0 in HBM before the kernel (the atomics accumulate into it)
  Traffic zero(cfg.dtype);
  g.dQ.fill(T(0));
  zero.write("dQ", g.dQ.numel());
  Traffic k(cfg.dtype);
  kv_outer_loop(cfg, opt, Q, K, V, LSE, dO, g, true, k);
  g.kernels = {{"D preprocessing", pre}, {"dQ = 0", zero}, {"dQ+dK/dV kernel", k}};
  for (const auto& kk : g.kernels) g.traffic.merge(kk.traffic);
  return g;
}

namespace {
template <typename T>
double max_err(const T* got, const double* ref, std::size_t n) {
  double ref_max = 0.0;
  for (std::size_t i = 0; i < n; ++i)
    if (std::isfinite(ref[i])) ref_max = std::max(ref_max, std::abs(ref[i]));
  if (ref_max == 0.0) ref_max = 1.0;
  double worst = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    const double g = static_cast<double>(got[i]), r = ref[i];
    if (std::isnan(g) || std::isnan(r)) return std::numeric_limits<double>::infinity();
    if (std::isinf(g) || std::isinf(r)) {
      if (g == r) continue;
      return std::numeric_limits<double>::infinity();
    }
    worst = std::max(worst, std::abs(g - r) / ref_max);
  }
  return worst;
}
template <typename T>
bool any_nan(const T* p, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    if (std::isnan(p[i])) return true;
  return false;
}
}  // namespace

double max_error_vs_max(const double* got, const double* ref, std::size_t n) { return max_err(got, ref, n); }
double max_error_vs_max(const float* got, const double* ref, std::size_t n) { return max_err(got, ref, n); }
bool has_nan(const double* p, std::size_t n) { return any_nan(p, n); }
bool has_nan(const float* p, std::size_t n) { return any_nan(p, n); }

#define FLASHLAB_BWD(T)                                                                                             \
  template AttentionGradients<T> naive_backward(const AttentionProblem&, const Tensor<T>&, const Tensor<T>&,         \
                                                const Tensor<T>&, const Tensor<T>&);                                \
  template AttentionGradients<T> flash_backward_two_kernel(const AttentionProblem&, const Tensor<T>&,                \
                                                           const Tensor<T>&, const Tensor<T>&, const Tensor<T>&,     \
                                                           const std::vector<T>&, const Tensor<T>&, BackwardOptions); \
  template AttentionGradients<T> flash_backward_atomic(const AttentionProblem&, const Tensor<T>&, const Tensor<T>&,  \
                                                       const Tensor<T>&, const Tensor<T>&, const std::vector<T>&,    \
                                                       const Tensor<T>&, BackwardOptions);
FLASHLAB_BWD(double)
FLASHLAB_BWD(float)
#undef FLASHLAB_BWD

}  // namespace flashlab::ref
