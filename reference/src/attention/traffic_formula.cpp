// Closed-form HBM traffic of the attention variants (attention_traffic.hpp).
//
// Every formula is a sum over the sequences and, inside one, over its query tiles i of a few
// per-tile sizes, so it costs O(Tr) per sequence (a dense problem's B sequences are alike: one is
// summed and multiplied by B) — cheap at N = 16384 — and states exactly what the tile loops in
// forward.cpp and backward.cpp count. The per-sequence quantities (notation of the Triton
// walkthrough and the toy-machine lesson), for one head:
//   rq(i)  rows of query tile i (Br, or the ragged tail)
//   c_i    key tiles visited by query tile i (visible_key_tile_range: all Tc, or fewer under
//          causal masking or a window: fully masked tile pairs skipped)
//   kr_i   key rows in those tiles (the last tile may be ragged)
//   A  = Σ_i kr_i          key rows loaded by a query-tile-outer loop (FA2 forward, dQ kernel)
//   Bq = Σ_i c_i·rq(i)     query rows loaded by a key-tile-outer loop (FA1, dK/dV kernel, atomic)
//   E  = Σ_i rq(i)·kr_i    score elements S_ij computed (FLOPs: 2·d per element per matrix product)
// Quantities of a query head are multiplied by H, those of a K/V head (K_j, V_j in the
// key-tile-outer loops, dK, dV written) by H_kv.
#include "flashlab/reference/attention_traffic.hpp"

#include "band.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <stdexcept>

namespace flashlab::ref {

KeyTileRange visible_key_tile_range(const AttentionProblem& cfg, const SequenceSpan& s, std::size_t i) {
  const std::size_t row0 = i * cfg.Br;
  if (row0 >= s.q_len || s.k_len == 0) return {};
  const std::size_t row_end = std::min(row0 + cfg.Br, s.q_len);
  // The rows' bands shift by one key per row, so the tile's rows see the keys from the first
  // row's first visible key to the last row's last one (band.hpp, Band::sees_any).
  const detail::Band band(cfg, s);
  const long long lo = std::max(band.lo(static_cast<long long>(row0)), 0LL);
  const long long hi = std::min(band.hi(static_cast<long long>(row_end) - 1), static_cast<long long>(s.k_len) - 1);
  if (lo > hi) return {};
  return {std::size_t(lo) / cfg.Bc, std::size_t(hi) / cfg.Bc + 1};
}

std::size_t visible_key_tiles(const AttentionProblem& cfg, std::size_t i) {
  return visible_key_tile_range(cfg, cfg.sequence(0), i).count();
}

namespace {

// The per-sequence sums of the file comment, added over sequences (each term still per head).
struct TileSums {
  std::uint64_t q_rows = 0;            // Σ len_q
  std::uint64_t k_rows = 0;            // Σ len_k
  std::uint64_t qk = 0;                // Σ len_q·len_k (the naive matrices)
  std::uint64_t A = 0, Bq = 0, E = 0;
  std::uint64_t visited_rows = 0;      // query rows in tiles with c_i > 0
  std::uint64_t key_rows_visited = 0;  // rows of key tiles visited by at least one query tile

  void add(const AttentionProblem& cfg, const SequenceSpan& s, std::uint64_t times) {
    TileSums one;
    one.q_rows = s.q_len;
    one.k_rows = s.k_len;
    one.qk = std::uint64_t(s.q_len) * s.k_len;
    // The key tiles visited by some query tile form one range too (neighbouring query tiles'
    // ranges meet): from the first tile's first to the last tile's end.
    std::size_t kv_first = SIZE_MAX, kv_end = 0;
    for (std::size_t row0 = 0, i = 0; row0 < s.q_len; row0 += cfg.Br, ++i) {
      const std::uint64_t rq = std::min(cfg.Br, s.q_len - row0);
      const KeyTileRange c = visible_key_tile_range(cfg, s, i);
      if (c.count() == 0) continue;
      const std::uint64_t kr = std::min<std::uint64_t>(s.k_len, c.end * cfg.Bc) - c.first * cfg.Bc;
      one.A += kr;
      one.Bq += c.count() * rq;
      one.E += rq * kr;
      one.visited_rows += rq;
      kv_first = std::min(kv_first, c.first);
      kv_end = std::max(kv_end, c.end);
    }
    if (kv_end > 0) one.key_rows_visited = std::min<std::uint64_t>(s.k_len, kv_end * cfg.Bc) - kv_first * cfg.Bc;
    q_rows += one.q_rows * times;
    k_rows += one.k_rows * times;
    qk += one.qk * times;
    A += one.A * times;
    Bq += one.Bq * times;
    E += one.E * times;
    visited_rows += one.visited_rows * times;
    key_rows_visited += one.key_rows_visited * times;
  }
};

TileSums tile_sums(const AttentionProblem& cfg) {
  TileSums t;
  if (cfg.is_packed()) {
    for (std::size_t b = 0; b < cfg.batch; ++b) t.add(cfg, cfg.sequence(b), 1);
  } else {
    t.add(cfg, cfg.sequence(0), cfg.batch);  // a dense problem's sequences are alike
  }
  return t;
}

// One kernel's counts: `h` multiplies the terms of a query head, `hkv` those of a K/V head.
struct Builder {
  Traffic t;
  std::uint64_t h, hkv;
  explicit Builder(const AttentionProblem& cfg) : t(cfg.dtype), h(cfg.heads), hkv(cfg.h_kv()) {}
  Builder& r(const char* name, std::uint64_t n) { t.read(name, n * h); return *this; }
  Builder& w(const char* name, std::uint64_t n) { t.write(name, n * h); return *this; }
  Builder& r_kv(const char* name, std::uint64_t n) { t.read(name, n * hkv); return *this; }
  Builder& w_kv(const char* name, std::uint64_t n) { t.write(name, n * hkv); return *this; }
  Builder& f(std::uint64_t n) { t.add_flops(n * h); return *this; }
};

// The naive backward: six materialising steps, whole len_q × len_k matrices per sequence and
// query head; dV and dK summed over a group and written once per K/V head.
void naive_backward_kernels(const AttentionProblem& cfg, const TileSums& s, std::vector<KernelTraffic>& out) {
  const std::uint64_t d = cfg.head_dim;
  auto kernel = [&](const char* name, Builder& b) { out.push_back({name, b.t}); };
  Builder a(cfg), b(cfg), c(cfg), e(cfg), g(cfg), h(cfg);
  a.r("P", s.qk).r("dO", s.q_rows * d).w_kv("dV", s.k_rows * d).f(2 * s.qk * d);
  b.r("dO", s.q_rows * d).r("V", s.k_rows * d).w("dP", s.qk).f(2 * s.qk * d);
  c.r("dP", s.qk).r("P", s.qk).w("D", s.q_rows).f(2 * s.qk);
  e.r("P", s.qk).r("dP", s.qk).r("D", s.q_rows).w("dS", s.qk);
  g.r("dS", s.qk).r("K", s.k_rows * d).w("dQ", s.q_rows * d).f(2 * s.qk * d);
  h.r("dS", s.qk).r("Q", s.q_rows * d).w_kv("dK", s.k_rows * d).f(2 * s.qk * d);
  kernel("dV = P^T dO", a);
  kernel("dP = dO V^T", b);
  kernel("D = rowsum(dP*P)", c);
  kernel("dS = P*(dP - D)", e);
  kernel("dQ = scale dS K", g);
  kernel("dK = scale dS^T Q", h);
}

// The flash backward designs: D preprocessing, then the two kernels or the one atomic kernel.
void flash_backward_kernels(Algorithm v, const AttentionProblem& cfg, const TileSums& s, KvLoads kv_loads,
                            std::vector<KernelTraffic>& out) {
  const std::uint64_t d = cfg.head_dim, nq = s.q_rows, nk = s.k_rows;
  auto kernel = [&](const char* name, Builder& b) { out.push_back({name, b.t}); };
  // D preprocessing: O_i, dO_i read once, D_i written once (the D_i trick, O(N·d)).
  Builder pre(cfg);
  pre.r("O", nq * d).r("dO", nq * d).w("D", nq).f(2 * nq * d);
  kernel("D preprocessing", pre);
  if (v == Algorithm::bwd_two_kernel) {
    // dQ kernel: Q_i, dO_i, LSE_i, D_i resident per query tile; K_j, V_j per visited pair, once
    // per query head or once per group.
    Builder dq(cfg);
    dq.r("Q", nq * d).r("dO", nq * d).r("LSE", nq).r("D", nq);
    if (kv_loads == KvLoads::per_group) dq.r_kv("K", s.A * d).r_kv("V", s.A * d);
    else dq.r("K", s.A * d).r("V", s.A * d);
    dq.w("dQ", nq * d).f(6 * d * s.E);
    kernel("dQ kernel", dq);
    // dK/dV kernel: K_j, V_j resident per key tile (all Tc tiles, once per K/V head); Q_i, dO_i,
    // LSE_i, D_i per visited pair of each query head; dK_j, dV_j written once per K/V head.
    Builder dkv(cfg);
    dkv.r_kv("K", nk * d).r_kv("V", nk * d).r("Q", s.Bq * d).r("dO", s.Bq * d).r("LSE", s.Bq).r("D", s.Bq);
    dkv.w_kv("dK", nk * d).w_kv("dV", nk * d).f(8 * d * s.E);
    kernel("dK/dV kernel", dkv);
    return;
  }
  Builder zero(cfg);
  zero.w("dQ", nq * d);
  kernel("dQ = 0", zero);
  // One kernel: K_j, V_j resident; per visited pair Q_i, dO_i, LSE_i, D_i read and dQ_i
  // read-modify-written (atomicAdd in HBM); dK_j, dV_j written once per K/V head.
  Builder k(cfg);
  k.r_kv("K", nk * d).r_kv("V", nk * d).r("Q", s.Bq * d).r("dO", s.Bq * d).r("LSE", s.Bq).r("D", s.Bq);
  k.r("dQ", s.Bq * d).w("dQ", s.Bq * d).w_kv("dK", nk * d).w_kv("dV", nk * d).f(10 * d * s.E);
  kernel("dQ+dK/dV kernel", k);
}

}  // namespace

std::vector<KernelTraffic> attention_traffic_kernels(Algorithm v, const AttentionProblem& cfg, KvLoads kv_loads) {
  cfg.validate();
  const std::uint64_t d = cfg.head_dim;
  const TileSums s = tile_sums(cfg);
  std::vector<KernelTraffic> out;
  auto kernel = [&](const char* name, Builder& b) { out.push_back({name, b.t}); };

  switch (v) {
    case Algorithm::naive_fwd: {
      // Three materialising steps; each operand read once per step and query head, S and P full
      // len_q × len_k (masked entries included: the naive version writes the −inf / 0 entries too).
      Builder s1(cfg), s2(cfg), s3(cfg);
      s1.r("Q", s.q_rows * d).r("K", s.k_rows * d).w("S", s.qk).f(2 * s.qk * d);
      s2.r("S", s.qk).w("P", s.qk).w("LSE", s.q_rows);
      s3.r("P", s.qk).r("V", s.k_rows * d).w("O", s.q_rows * d).f(2 * s.qk * d);
      kernel("S = QK^T", s1);
      kernel("P = softmax(S)", s2);
      kernel("O = PV", s3);
      break;
    }
    case Algorithm::fa2_fwd: {
      // Q_i read once per query tile; K_j, V_j once per visited (query tile, key tile) pair of
      // each query head, or of each group; O and LSE written once per query row.
      Builder k(cfg);
      k.r("Q", s.q_rows * d);
      if (kv_loads == KvLoads::per_group) k.r_kv("K", s.A * d).r_kv("V", s.A * d);
      else k.r("K", s.A * d).r("V", s.A * d);
      k.w("O", s.q_rows * d).w("LSE", s.q_rows).f(4 * d * s.E);
      kernel("forward", k);
      break;
    }
    case Algorithm::fa1_fwd: {
      // K_j, V_j read once per visited key tile and K/V head; Q_i once per visited pair; O_i,
      // m_i, l_i read on every visit but the first, O_i written on every visit, m_i, l_i on
      // every visit but the last (which writes LSE_i instead); never-visited query tiles get
      // O = 0, LSE = −inf.
      Builder k(cfg);
      const std::uint64_t rereads = s.Bq - s.visited_rows;
      const std::uint64_t unvisited_rows = s.q_rows - s.visited_rows;
      k.r_kv("K", s.key_rows_visited * d).r_kv("V", s.key_rows_visited * d).r("Q", s.Bq * d);
      k.r("O", rereads * d).r("m", rereads).r("l", rereads);
      k.w("O", (s.Bq + unvisited_rows) * d).w("m", rereads).w("l", rereads).w("LSE", s.q_rows);
      k.f(4 * d * s.E);
      kernel("forward", k);
      break;
    }
    case Algorithm::naive_bwd:
      naive_backward_kernels(cfg, s, out);
      break;
    case Algorithm::bwd_two_kernel:
    case Algorithm::bwd_atomic:
      flash_backward_kernels(v, cfg, s, kv_loads, out);
      break;
  }
  return out;
}

Traffic attention_traffic_formula(Algorithm v, const AttentionProblem& cfg, KvLoads kv_loads) {
  Traffic total(cfg.dtype);
  for (const auto& k : attention_traffic_kernels(v, cfg, kv_loads)) total.merge(k.traffic);
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
