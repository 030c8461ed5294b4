// Queries over a trace store (stream_query.hpp): reads, readers, routes, summaries, density.
// Everything reads the memory-mapped columns directly; nothing here allocates more than
// O(layers·n_q) (routes) or the density sums the caller sized.
#include "flashlab/reference/stream_query.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <tuple>

namespace flashlab::ref::stream {

namespace {

std::string span_str(TokenSpan s) { return "[" + std::to_string(s.begin) + ", " + std::to_string(s.end) + ")"; }

/// Tokens of [a0, a1) inside [b0, b1).
std::size_t overlap(std::size_t a0, std::size_t a1, std::size_t b0, std::size_t b1) {
  const std::size_t lo = std::max(a0, b0), hi = std::min(a1, b1);
  return hi > lo ? hi - lo : 0;
}

}  // namespace

void check_selection(const Store& store, const HeadSelection& sel) {
  const StoreLayout& L = store.layout();
  if (sel.layer && *sel.layer >= L.layers)
    throw StoreError("layer " + std::to_string(*sel.layer) + " is outside the store's layers 0.." + std::to_string(L.layers - 1),
                     "pick a layer below " + std::to_string(L.layers) + ", or all");
  if (sel.head && *sel.head >= L.heads)
    throw StoreError("head " + std::to_string(*sel.head) + " is outside the store's heads 0.." + std::to_string(L.heads - 1),
                     "pick a head below " + std::to_string(L.heads) + ", or all");
  for (std::size_t s = 0; s < store.segments(); ++s)
    if (sel.contains(s / L.heads, s % L.heads)) return;
  throw StoreError("no committed head matches the selection (the store has " + std::to_string(store.segments()) + " of " +
                       std::to_string(L.segments()) + " heads)",
                   "select a layer and head that the trace has written");
}

bool edge_before(const StoreEdge& a, const StoreEdge& b) {
  const bool an = std::isnan(a.mass), bn = std::isnan(b.mass);
  if (an != bn) return bn;
  if (!an && a.mass != b.mass) return a.mass > b.mass;
  return std::tie(a.layer, a.head, a.q, a.r) < std::tie(b.layer, b.head, b.q, b.r);
}

EdgeList prune_edges(std::vector<StoreEdge> edges, const Pruning& p) {
  if (p.top < 1) throw StoreError("top = 0 keeps nothing", "ask for at least one edge");
  if (!(p.cumulative > 0 && p.cumulative <= 1))
    throw StoreError("cumulative = " + std::to_string(p.cumulative) + " is outside (0, 1]", "e.g. 0.9 keeps the edges that carry 90% of the mass");
  EdgeList out;
  out.candidates = edges.size();
  for (const auto& e : edges)
    if (!std::isnan(e.mass)) out.total_mass += e.mass;
  std::sort(edges.begin(), edges.end(), edge_before);
  double before = 0;
  for (const auto& e : edges) {
    if (out.edges.size() >= p.top) break;
    if (p.cumulative < 1 && !out.edges.empty() && before >= p.cumulative * out.total_mass) break;
    out.edges.push_back(e);
    if (!std::isnan(e.mass)) before += e.mass;
  }
  return out;
}

EdgeList top_reads(const Store& store, std::size_t q, const HeadSelection& sel, const Pruning& pruning) {
  const StoreLayout& L = store.layout();
  const Geometry& g = L.geometry;
  if (q >= g.n_q())
    throw StoreError("query block " + std::to_string(q) + " is outside 0.." + std::to_string(g.n_q() - 1),
                     "token t is in query block ⌊t/b_q⌋ (b_q = " + std::to_string(g.bq) + ")");
  check_selection(store, sel);
  std::vector<StoreEdge> edges;
  const double rows = double(g.q_rows(q));
  for (std::size_t s = 0; s < store.segments(); ++s) {
    const std::size_t layer = s / L.heads, head = s % L.heads;
    if (!sel.contains(layer, head)) continue;
    const StoreRow row = store.row(s, q);
    for (std::size_t j = 0; j < row.size; ++j)
      edges.push_back({layer, head, q, std::size_t(row.key_block[j]), j, row.mass[j], row.mass[j] / rows,
                       row.score ? double(row.score[j]) : std::nan("")});
  }
  return prune_edges(std::move(edges), pruning);
}

EdgeList top_readers(const Store& store, std::size_t r, const HeadSelection& sel, const Pruning& pruning) {
  const StoreLayout& L = store.layout();
  const Geometry& g = L.geometry;
  if (r >= g.n_k())
    throw StoreError("key block " + std::to_string(r) + " is outside 0.." + std::to_string(g.n_k() - 1),
                     "token s is in key block ⌊s/b_k⌋ (b_k = " + std::to_string(g.bk) + ")");
  check_selection(store, sel);
  std::vector<StoreEdge> edges;
  for (std::size_t s = 0; s < store.segments(); ++s) {
    const std::size_t layer = s / L.heads, head = s % L.heads;
    if (!sel.contains(layer, head)) continue;
    for (const std::int32_t q32 : store.readers(s, r)) {
      const auto q = std::size_t(q32);
      const StoreRow row = store.row(s, q);
      const auto* it = std::find(row.key_block, row.key_block + row.size, std::int32_t(r));
      if (it == row.key_block + row.size)
        throw StoreError(store.dir().string() + ": the reverse index says query block " + std::to_string(q) +
                             " reads key block " + std::to_string(r) + " in head " + std::to_string(s) + ", its row does not",
                         "the store is damaged; flashlab stream query DIR --verify tells more");
      const auto j = std::size_t(it - row.key_block);
      edges.push_back({layer, head, q, r, j, row.mass[j], row.mass[j] / double(g.q_rows(q)),
                       row.score ? double(row.score[j]) : std::nan("")});
    }
  }
  return prune_edges(std::move(edges), pruning);
}

std::size_t edge_distance(const Geometry& g, std::size_t q, std::size_t r) {
  const std::size_t a = q * g.bq, b = r * g.bk;
  return a > b ? a - b : 0;
}

std::size_t distance_class(std::size_t distance) { return distance == 0 ? 0 : std::size_t(std::bit_width(distance)); }

std::size_t distance_classes(const Geometry& g) { return distance_class(g.T) + 1; }

Route route(const Store& store, TokenSpan source, TokenSpan target, const RouteParams& p) {
  const StoreLayout& L = store.layout();
  const Geometry& g = L.geometry;
  for (const auto& [name, s] : {std::pair{"source", source}, std::pair{"target", target}})
    if (s.begin >= s.end || s.end > g.T)
      throw StoreError(std::string("route ") + name + " span " + span_str(s) + " is empty or outside [0, T = " +
                           std::to_string(g.T) + ")",
                       "spans are token ranges FIRST-LAST (inclusive), e.g. 100-163");
  prune_edges({}, p.pruning);  // the same checks of top and cumulative as every answer
  if (!(p.residual >= 0 && p.residual < 1))
    throw StoreError("residual = " + std::to_string(p.residual) + " is outside [0, 1)", "0.5 is attention rollout's choice");
  if (p.head && *p.head >= L.heads)
    throw StoreError("head " + std::to_string(*p.head) + " is outside the store's heads 0.." + std::to_string(L.heads - 1),
                     "pick a head below " + std::to_string(L.heads) + ", or all");
  if (!store.complete())
    throw StoreError("a route crosses every layer, and the store has " + std::to_string(store.segments()) + " of " +
                         std::to_string(L.segments()) + " heads committed",
                     "finish the trace (flashlab stream trace --resume) before asking for routes");
  const std::size_t n = g.n_q(), layers = L.layers;
  const double alpha = p.residual, heads = p.head ? 1.0 : double(L.heads);

  // Key block r → nodes (query blocks) it overlaps, with the share of its tokens in each.
  struct Part { std::size_t node; double frac; };
  auto parts = [&](std::size_t r, auto&& fn) {
    if (g.bq == g.bk) return fn(Part{r, 1.0});
    const std::size_t s0 = r * g.bk, s1 = std::min(g.T, s0 + g.bk);
    for (std::size_t node = s0 / g.bq; node * g.bq < s1; ++node)
      fn(Part{node, double(overlap(s0, s1, node * g.bq, std::min(g.T, (node + 1) * g.bq))) / double(s1 - s0)});
  };
  auto for_rows = [&](std::size_t layer, std::size_t q, auto&& fn) {
    const double rows = double(g.q_rows(q));
    for (std::size_t h = 0; h < L.heads; ++h) {
      if (p.head && *p.head != h) continue;
      const StoreRow row = store.row(L.segment(layer, h), q);
      for (std::size_t j = 0; j < row.size; ++j) {
        const double share = double(row.mass[j]) / rows;
        if (std::isfinite(share) && share > 0) fn(h, std::size_t(row.key_block[j]), share);
      }
    }
  };

  // f[ℓ]: flow from the target at the input of layer ℓ (f[layers]: at the top); g[ℓ]: the part of
  // a node's flow that ends in the source.
  std::vector<std::vector<double>> f(layers + 1, std::vector<double>(n, 0.0)), gb(layers + 1, std::vector<double>(n, 0.0));
  for (std::size_t q = 0; q < n; ++q) {
    const std::size_t a = q * g.bq, b = std::min(g.T, a + g.bq);
    f[layers][q] = double(overlap(a, b, target.begin, target.end)) / double(target.end - target.begin);
    gb[0][q] = double(overlap(a, b, source.begin, source.end)) / double(b - a);
  }
  // g moves up through the reverse index: only key blocks that overlap a node with g > 0 are
  // visited, with their readers, so the cost follows the route's support, not the store's size.
  std::vector<double> G(g.n_k(), 0.0);  // Σ_n frac(r → n)·g_ℓ(n) per key block r
  std::vector<std::size_t> touched;
  for (std::size_t l = 0; l < layers; ++l) {
    for (std::size_t node = 0; node < n; ++node) gb[l + 1][node] = alpha * gb[l][node];
    touched.clear();
    const std::size_t k_last = g.n_k() - 1;
    for (std::size_t node = 0; node < n; ++node) {
      if (gb[l][node] == 0) continue;
      const std::size_t a = node * g.bq, b = std::min(g.T, a + g.bq);
      for (std::size_t r = a / g.bk; r <= std::min(k_last, (b - 1) / g.bk); ++r) {
        if (G[r] == 0) touched.push_back(r);
        const std::size_t s0 = r * g.bk, s1 = std::min(g.T, s0 + g.bk);
        G[r] += double(overlap(s0, s1, a, b)) / double(s1 - s0) * gb[l][node];
      }
    }
    if (touched.size() * 8 < g.n_k()) {
      // Few key blocks lead to the source: visit their readers.
      for (const std::size_t r : touched) {
        for (std::size_t h = 0; h < L.heads; ++h) {
          if (p.head && *p.head != h) continue;
          const std::size_t seg = L.segment(l, h);
          for (const std::int32_t q32 : store.readers(seg, r)) {
            const auto q = std::size_t(q32);
            const StoreRow row = store.row(seg, q);
            for (std::size_t j = 0; j < row.size; ++j) {
              if (std::size_t(row.key_block[j]) != r) continue;
              const double share = double(row.mass[j]) / double(g.q_rows(q));
              if (std::isfinite(share) && share > 0) gb[l + 1][q] += (1 - alpha) / heads * share * G[r];
            }
          }
        }
      }
    } else {
      // Most do: one sequential pass over the layer's rows is cheaper than the reverse index.
      for (std::size_t q = 0; q < n; ++q) {
        double through = 0;
        for_rows(l, q, [&](std::size_t, std::size_t r, double share) { through += share * G[r]; });
        gb[l + 1][q] += (1 - alpha) / heads * through;
      }
    }
    for (const std::size_t r : touched) G[r] = 0;
  }
  for (std::size_t l = layers; l-- > 0;)
    for (std::size_t q = 0; q < n; ++q) {
      const double fq = f[l + 1][q];
      if (fq == 0) continue;
      f[l][q] += alpha * fq;
      for_rows(l, q, [&](std::size_t, std::size_t r, double share) {
        parts(r, [&](Part pt) { f[l][pt.node] += (1 - alpha) / heads * fq * share * pt.frac; });
      });
    }

  Route out;
  for (std::size_t q = 0; q < n; ++q) out.total += f[0][q] * gb[0][q];
  // Only the first `top` edges in order are ever listed: a bounded heap keeps them (its top is
  // the last of the kept), while every edge still counts in the layer's sums.
  auto before_in_order = [](const RouteEdge& a, const RouteEdge& b) {
    if (a.weight != b.weight) return a.weight > b.weight;
    const std::size_t ha = a.head ? *a.head : std::size_t(-1), hb = b.head ? *b.head : std::size_t(-1);
    return std::tie(a.q, a.r, ha) < std::tie(b.q, b.r, hb);
  };
  for (std::size_t l = layers; l-- > 0;) {
    RouteLayer rl;
    rl.layer = l;
    std::vector<RouteEdge> kept;  // a heap under before_in_order
    auto offer = [&](const RouteEdge& e) {
      (e.head ? rl.attention : rl.residual) += e.weight;
      if (kept.size() < p.pruning.top) {
        kept.push_back(e);
        std::push_heap(kept.begin(), kept.end(), before_in_order);
      } else if (before_in_order(e, kept.front())) {
        std::pop_heap(kept.begin(), kept.end(), before_in_order);
        kept.back() = e;
        std::push_heap(kept.begin(), kept.end(), before_in_order);
      }
    };
    if (out.total > 0) {
      for (std::size_t q = 0; q < n; ++q) {
        const double fq = f[l + 1][q];
        if (fq == 0) continue;
        const double stay = alpha * fq * gb[l][q] / out.total;
        if (stay > 0) offer({l, std::nullopt, q, q, stay});
        for_rows(l, q, [&](std::size_t h, std::size_t r, double share) {
          double to_source = 0;
          parts(r, [&](Part pt) { to_source += pt.frac * gb[l][pt.node]; });
          const double w = (1 - alpha) / heads * fq * share * to_source / out.total;
          if (w > 0) offer({l, h, q, r, w});
        });
      }
    }
    std::sort(kept.begin(), kept.end(), before_in_order);
    const double sum = rl.attention + rl.residual;
    double before = 0;
    for (const auto& e : kept) {
      if (p.pruning.cumulative < 1 && !rl.edges.empty() && before >= p.pruning.cumulative * sum) break;
      rl.edges.push_back(e);
      before += e.weight;
    }
    out.layers.push_back(std::move(rl));
  }
  return out;
}

std::vector<HeadSummary> summarize(const Store& store, const DistanceBands& bands) {
  const StoreLayout& L = store.layout();
  const Geometry& g = L.geometry;
  if (bands.local > bands.far)
    throw StoreError("local band " + std::to_string(bands.local) + " exceeds far band " + std::to_string(bands.far),
                     "local < far, both in tokens");
  std::vector<HeadSummary> out;
  for (std::size_t s = 0; s < store.segments(); ++s) {
    HeadSummary h;
    h.layer = s / L.heads;
    h.head = s % L.heads;
    double weighted = 0;
    for (std::size_t q = 0; q < g.n_q(); ++q) {
      const StoreRow row = store.row(s, q);
      h.records += row.size;
      h.empty_rows += row.size == 0 ? 1 : 0;
      for (std::size_t j = 0; j < row.size; ++j) {
        const double m = row.mass[j];
        if (std::isnan(m)) continue;
        const std::size_t dist = edge_distance(g, q, std::size_t(row.key_block[j]));
        h.mass += m;
        (dist < bands.local ? h.local : dist >= bands.far ? h.far : h.mid) += m;
        weighted += m * double(dist);
      }
    }
    if (h.mass > 0) {
      h.local /= h.mass;
      h.mid /= h.mass;
      h.far /= h.mass;
      h.mean_distance = weighted / h.mass;
    }
    out.push_back(h);
  }
  return out;
}

DensityIndex::DensityIndex(const Store& store, std::uint64_t max_bytes) : store_(&store) {
  const StoreLayout& L = store.layout();
  const Geometry& g = L.geometry;
  classes_ = distance_classes(g);
  const std::uint64_t cells = std::uint64_t(L.layers + 1) * g.n_q() * classes_;
  if (cells * 8 > max_bytes)
    throw StoreError("the viewer's density sums need " + std::to_string(cells * 8) + " bytes ((layers + 1)·n_q·" +
                         std::to_string(classes_) + " classes · 8), more than the limit " + std::to_string(max_bytes),
                     "raise --memory-limit, or store fewer layers or larger blocks");
  mass_.assign(cells, 0.0f);
  edges_.assign(cells, 0);
  const std::size_t n_q = g.n_q(), all = L.layers;
  for (std::size_t s = 0; s < store.segments(); ++s) {
    const std::size_t layer = s / L.heads;
    for (std::size_t q = 0; q < n_q; ++q) {
      const StoreRow row = store.row(s, q);
      for (std::size_t j = 0; j < row.size; ++j) {
        const std::size_t c = distance_class(edge_distance(g, q, std::size_t(row.key_block[j])));
        const float m = std::isnan(row.mass[j]) ? 0.0f : row.mass[j];
        for (std::size_t slice : {layer, all}) {
          const std::size_t cell = (slice * n_q + q) * classes_ + c;
          mass_[cell] += m;
          ++edges_[cell];
        }
      }
    }
  }
}

std::uint64_t DensityIndex::bytes() const { return mass_.size() * sizeof(float) + edges_.size() * sizeof(std::uint32_t); }

DensityView DensityIndex::view(const HeadSelection& sel, std::size_t t0, std::size_t t1, std::size_t bins) const {
  const Store& store = *store_;
  const StoreLayout& L = store.layout();
  const Geometry& g = L.geometry;
  check_selection(store, sel);
  t1 = std::min(t1, g.T);
  if (t0 >= t1)
    throw StoreError("token range [" + std::to_string(t0) + ", " + std::to_string(t1) + ") is empty within [0, T = " +
                         std::to_string(g.T) + ")", "t0 < t1 ≤ T");
  if (bins == 0) throw StoreError("bins = 0", "ask for at least one bin");
  const std::size_t q0 = t0 / g.bq, q1 = std::min(g.n_q(), (t1 + g.bq - 1) / g.bq), span = q1 - q0;
  const std::size_t nb = std::min(bins, span);
  DensityView v;
  v.classes = classes_;
  v.t0 = q0 * g.bq;
  v.t1 = std::min(g.T, q1 * g.bq);
  v.bin_start.resize(nb + 1);
  std::vector<std::size_t> bin_of(span);
  for (std::size_t b = 0; b < nb; ++b) {
    const std::size_t a = q0 + b * span / nb, e = q0 + (b + 1) * span / nb;
    v.bin_start[b] = a * g.bq;
    for (std::size_t q = a; q < e; ++q) bin_of[q - q0] = b;
  }
  v.bin_start[nb] = v.t1;
  v.mass.assign(classes_ * nb, 0.0);
  v.edges.assign(classes_ * nb, 0);
  const std::size_t n_q = g.n_q();
  if (!sel.head) {
    const std::size_t slice = sel.layer ? *sel.layer : L.layers;
    for (std::size_t q = q0; q < q1; ++q) {
      const std::size_t b = bin_of[q - q0];
      for (std::size_t c = 0; c < classes_; ++c) {
        const std::size_t cell = (slice * n_q + q) * classes_ + c;
        v.mass[c * nb + b] += mass_[cell];
        v.edges[c * nb + b] += edges_[cell];
      }
    }
    return v;
  }
  for (std::size_t s = 0; s < store.segments(); ++s) {
    if (!sel.contains(s / L.heads, s % L.heads)) continue;
    for (std::size_t q = q0; q < q1; ++q) {
      const std::size_t b = bin_of[q - q0];
      const StoreRow row = store.row(s, q);
      for (std::size_t j = 0; j < row.size; ++j) {
        const std::size_t c = distance_class(edge_distance(g, q, std::size_t(row.key_block[j])));
        v.mass[c * nb + b] += std::isnan(row.mass[j]) ? 0.0 : double(row.mass[j]);
        ++v.edges[c * nb + b];
      }
    }
  }
  return v;
}

}  // namespace flashlab::ref::stream
