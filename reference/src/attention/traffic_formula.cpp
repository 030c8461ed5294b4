// Closed-form HBM traffic of the attention variants (attention_traffic.hpp).
//
// Every formula is a sum over query tiles i of a few per-tile sizes, so it costs O(Tr) — cheap at
// N = 16384 — and states exactly what the tile loops in attention_forward.cpp and
// attention_backward.cpp count. The per-head quantities (notation of the Triton walkthrough and the toy-machine lesson):
//   rq(i)  rows of query tile i (Br, or the ragged tail)
//   c_i    key tiles visited by query tile i (all Tc, or fewer with causal: fully masked tiles skipped)
//   kr_i   key rows in those tiles = min(N_k, c_i·Bc)
//   A  = Σ_i kr_i          key rows loaded by a query-tile-outer loop (FA2 forward, dQ kernel)
//   Bq = Σ_i c_i·rq(i)     query rows loaded by a key-tile-outer loop (FA1, dK/dV kernel, atomic)
//   E  = Σ_i rq(i)·kr_i    score elements S_ij computed (FLOPs: 2·d per element per matrix product)
#include "flashlab/reference/attention_traffic.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>

namespace flashlab::ref {

std::size_t visible_key_tiles(const AttentionProblem& cfg, std::size_t i) {
  if (!cfg.causal) return cfg.Tc();
  // The last row of tile i sees the most keys; a key tile is visited iff its first key is visible.
  const long long last_row = static_cast<long long>(std::min((i + 1) * cfg.Br, cfg.n_q())) - 1;
  const long long max_key = last_row + cfg.causal_offset();
  if (max_key < 0) return 0;
  return std::min(cfg.Tc(), static_cast<std::size_t>(max_key) / cfg.Bc + 1);
}

namespace {

struct TileSums {
  std::uint64_t A = 0, Bq = 0, E = 0;
  std::uint64_t visited_rows = 0;  // query rows in tiles with c_i > 0
  std::uint64_t key_rows_visited = 0;  // rows of key tiles visited by at least one query tile
};

TileSums tile_sums(const AttentionProblem& cfg) {
  TileSums t;
  const std::size_t nq = cfg.n_q(), nk = cfg.n_k();
  for (std::size_t i = 0; i < cfg.Tr(); ++i) {
    const std::uint64_t rq = std::min(cfg.Br, nq - i * cfg.Br);
    const std::uint64_t c = visible_key_tiles(cfg, i);
    const std::uint64_t kr = std::min<std::uint64_t>(nk, c * cfg.Bc);
    t.A += kr;
    t.Bq += c * rq;
    t.E += rq * kr;
    if (c > 0) t.visited_rows += rq;
    t.key_rows_visited = std::max(t.key_rows_visited, kr);
  }
  return t;
}

// One kernel's counts, scaled by B·H at the end.
struct Builder {
  Traffic t;
  std::uint64_t bh;
  Builder(Dtype d, std::uint64_t heads_total) : t(d), bh(heads_total) {}
  Builder& r(const char* name, std::uint64_t n) { t.read(name, n * bh); return *this; }
  Builder& w(const char* name, std::uint64_t n) { t.write(name, n * bh); return *this; }
  Builder& f(std::uint64_t n) { t.add_flops(n * bh); return *this; }
};

// The naive backward: six materialising steps, whole N_q × N_k matrices per head.
void naive_backward_kernels(const AttentionProblem& cfg, std::uint64_t bh, std::vector<KernelTraffic>& out) {
  const std::uint64_t nq = cfg.n_q(), nk = cfg.n_k(), d = cfg.head_dim;
  auto kernel = [&](const char* name, Builder& b) { out.push_back({name, b.t}); };
  Builder a(cfg.dtype, bh), b(cfg.dtype, bh), c(cfg.dtype, bh), e(cfg.dtype, bh), g(cfg.dtype, bh), h(cfg.dtype, bh);
  a.r("P", nq * nk).r("dO", nq * d).w("dV", nk * d).f(2 * nq * nk * d);
  b.r("dO", nq * d).r("V", nk * d).w("dP", nq * nk).f(2 * nq * nk * d);
  c.r("dP", nq * nk).r("P", nq * nk).w("D", nq).f(2 * nq * nk);
  e.r("P", nq * nk).r("dP", nq * nk).r("D", nq).w("dS", nq * nk);
  g.r("dS", nq * nk).r("K", nk * d).w("dQ", nq * d).f(2 * nq * nk * d);
  h.r("dS", nq * nk).r("Q", nq * d).w("dK", nk * d).f(2 * nq * nk * d);
  kernel("dV = P^T dO", a);
  kernel("dP = dO V^T", b);
  kernel("D = rowsum(dP*P)", c);
  kernel("dS = P*(dP - D)", e);
  kernel("dQ = scale dS K", g);
  kernel("dK = scale dS^T Q", h);
}

// The flash backward designs: D preprocessing, then the two kernels or the one atomic kernel.
void flash_backward_kernels(Algorithm v, const AttentionProblem& cfg, const TileSums& s, std::uint64_t bh,
                            std::vector<KernelTraffic>& out) {
  const std::uint64_t nq = cfg.n_q(), nk = cfg.n_k(), d = cfg.head_dim;
  auto kernel = [&](const char* name, Builder& b) { out.push_back({name, b.t}); };
  // D preprocessing: O_i, dO_i read once, D_i written once (the D_i trick, O(N·d)).
  Builder pre(cfg.dtype, bh);
  pre.r("O", nq * d).r("dO", nq * d).w("D", nq).f(2 * nq * d);
  kernel("D preprocessing", pre);
  if (v == Algorithm::bwd_two_kernel) {
    // dQ kernel: Q_i, dO_i, LSE_i, D_i resident per query tile; K_j, V_j per visited pair.
    Builder dq(cfg.dtype, bh);
    dq.r("Q", nq * d).r("dO", nq * d).r("LSE", nq).r("D", nq).r("K", s.A * d).r("V", s.A * d);
    dq.w("dQ", nq * d).f(6 * d * s.E);
    kernel("dQ kernel", dq);
    // dK/dV kernel: K_j, V_j resident per key tile (all Tc tiles); Q_i, dO_i, LSE_i, D_i per
    // visited pair; dK_j, dV_j written once.
    Builder dkv(cfg.dtype, bh);
    dkv.r("K", nk * d).r("V", nk * d).r("Q", s.Bq * d).r("dO", s.Bq * d).r("LSE", s.Bq).r("D", s.Bq);
    dkv.w("dK", nk * d).w("dV", nk * d).f(8 * d * s.E);
    kernel("dK/dV kernel", dkv);
    return;
  }
  Builder zero(cfg.dtype, bh);
  zero.w("dQ", nq * d);
  kernel("dQ = 0", zero);
  // One kernel: K_j, V_j resident; per visited pair Q_i, dO_i, LSE_i, D_i read and dQ_i
  // read-modify-written (atomicAdd in HBM); dK_j, dV_j written once.
  Builder k(cfg.dtype, bh);
  k.r("K", nk * d).r("V", nk * d).r("Q", s.Bq * d).r("dO", s.Bq * d).r("LSE", s.Bq).r("D", s.Bq);
  k.r("dQ", s.Bq * d).w("dQ", s.Bq * d).w("dK", nk * d).w("dV", nk * d).f(10 * d * s.E);
  kernel("dQ+dK/dV kernel", k);
}

}  // namespace

std::vector<KernelTraffic> attention_traffic_kernels(Algorithm v, const AttentionProblem& cfg) {
  cfg.validate();
  const std::uint64_t nq = cfg.n_q(), nk = cfg.n_k(), d = cfg.head_dim;
  const std::uint64_t bh = static_cast<std::uint64_t>(cfg.batch) * cfg.heads;
  const TileSums s = tile_sums(cfg);
  std::vector<KernelTraffic> out;
  auto kernel = [&](const char* name, Builder& b) { out.push_back({name, b.t}); };

  switch (v) {
    case Algorithm::naive_fwd: {
      // Three materialising steps; each operand read once per step, S and P full N_q × N_k
      // (causal entries included: the naive version writes the −inf / 0 entries too).
      Builder s1(cfg.dtype, bh), s2(cfg.dtype, bh), s3(cfg.dtype, bh);
      s1.r("Q", nq * d).r("K", nk * d).w("S", nq * nk).f(2 * nq * nk * d);
      s2.r("S", nq * nk).w("P", nq * nk).w("LSE", nq);
      s3.r("P", nq * nk).r("V", nk * d).w("O", nq * d).f(2 * nq * nk * d);
      kernel("S = QK^T", s1);
      kernel("P = softmax(S)", s2);
      kernel("O = PV", s3);
      break;
    }
    case Algorithm::fa2_fwd: {
      // Q_i read once per query tile; K_j, V_j once per visited (query tile, key tile) pair;
      // O and LSE written once per query row.
      Builder k(cfg.dtype, bh);
      k.r("Q", nq * d).r("K", s.A * d).r("V", s.A * d).w("O", nq * d).w("LSE", nq).f(4 * d * s.E);
      kernel("forward", k);
      break;
    }
    case Algorithm::fa1_fwd: {
      // K_j, V_j read once per visited key tile; Q_i once per visited pair; O_i, m_i, l_i read on
      // every visit but the first, O_i written on every visit, m_i, l_i on every visit but the
      // last (which writes LSE_i instead); never-visited query tiles get O = 0, LSE = −inf.
      Builder k(cfg.dtype, bh);
      const std::uint64_t rereads = s.Bq - s.visited_rows;
      const std::uint64_t unvisited_rows = nq - s.visited_rows;
      k.r("K", s.key_rows_visited * d).r("V", s.key_rows_visited * d).r("Q", s.Bq * d);
      k.r("O", rereads * d).r("m", rereads).r("l", rereads);
      k.w("O", (s.Bq + unvisited_rows) * d).w("m", rereads).w("l", rereads).w("LSE", nq);
      k.f(4 * d * s.E);
      kernel("forward", k);
      break;
    }
    case Algorithm::naive_bwd:
      naive_backward_kernels(cfg, bh, out);
      break;
    case Algorithm::bwd_two_kernel:
    case Algorithm::bwd_atomic:
      flash_backward_kernels(v, cfg, s, bh, out);
      break;
  }
  return out;
}

Traffic attention_traffic_formula(Algorithm v, const AttentionProblem& cfg) {
  Traffic total(cfg.dtype);
  for (const auto& k : attention_traffic_kernels(v, cfg)) total.merge(k.traffic);
  return total;
}

bool same_counts(const Traffic& a, const Traffic& b, std::string* why) {
  auto fail = [&](const std::string& m) {
    if (why) *why = m;
    return false;
  };
  for (const auto& t : a.tensors()) {
    const auto* u = b.find(t.name);
    const std::uint64_t ur = u ? u->read_elements : 0, uw = u ? u->write_elements : 0;
    if (t.read_elements != ur)
      return fail(t.name + " read " + std::to_string(t.read_elements) + " vs " + std::to_string(ur));
    if (t.write_elements != uw)
      return fail(t.name + " write " + std::to_string(t.write_elements) + " vs " + std::to_string(uw));
    if (u && u->element_bytes != t.element_bytes) return fail(t.name + " element size differs");
  }
  for (const auto& u : b.tensors()) {
    if (!a.find(u.name) && (u.read_elements || u.write_elements))
      return fail(u.name + " only in the second count");
  }
  if (a.flops() != b.flops())
    return fail("flops " + std::to_string(a.flops()) + " vs " + std::to_string(b.flops()));
  return true;
}

}  // namespace flashlab::ref
