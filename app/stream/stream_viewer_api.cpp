// The viewer's JSON endpoints (stream_viewer_api.hpp). Each handler parses its parameters with
// one rule per kind (index, span, selection), calls the store's queries and writes JSON; nothing
// here is O(records) except what the query itself reads, and the density view is O(n_q·classes)
// at most (the sums are built once).
#include "stream/stream_viewer_api.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <iterator>
#include <sstream>

#include "core/cli.hpp"
#include "stream/stream_store_flags.hpp"
#include "flashlab/reference/stream_json.hpp"

namespace flashlab::app {

namespace {

namespace rs = flashlab::ref::stream;

/// A bad request: 400 with this error and hint.
struct BadRequest {
  std::string error, hint;
};

using Params = std::map<std::string, std::string>;

std::string param(const Params& p, const std::string& name, const std::string& otherwise) {
  const auto it = p.find(name);
  return it == p.end() ? otherwise : it->second;
}

std::size_t index_param(const Params& p, const std::string& name, std::optional<std::size_t> otherwise, std::size_t lo,
                        std::size_t hi, const std::string& hint) {
  const auto it = p.find(name);
  if (it == p.end()) {
    if (!otherwise) throw BadRequest{"missing parameter " + name, hint};
    return *otherwise;
  }
  const auto v = parse_index(it->second);
  if (!v || *v < lo || *v > hi)
    throw BadRequest{"parameter " + name + "=" + it->second + " is not an integer in [" + std::to_string(lo) + ", " +
                         std::to_string(hi) + "]",
                     hint};
  return *v;
}

double real_param(const Params& p, const std::string& name, double otherwise, double lo, double hi, bool hi_open) {
  const auto it = p.find(name);
  if (it == p.end()) return otherwise;
  double v = 0;
  const auto& s = it->second;
  const auto res = std::from_chars(s.data(), s.data() + s.size(), v);
  if (res.ec != std::errc() || res.ptr != s.data() + s.size() || !(v >= lo) || !(hi_open ? v < hi : v <= hi))
    throw BadRequest{"parameter " + name + "=" + s + " is not a number in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                         (hi_open ? ")" : "]"),
                     "e.g. " + name + "=0.5"};
  return v;
}

rs::HeadSelection selection(const Params& p) {
  rs::HeadSelection sel;
  try {
    sel.layer = parse_all_or_index(param(p, "layer", "all"));
    sel.head = parse_all_or_index(param(p, "head", "all"));
  } catch (const std::invalid_argument& e) {
    throw BadRequest{std::string("layer/head: ") + e.what(), "layer=all or a layer index; head=all or a head index"};
  }
  return sel;
}

void span_json(Json& j, const char* key, std::size_t a, std::size_t b) {
  j.key(key).begin_array().value(std::uint64_t(a)).value(std::uint64_t(b)).end_array();
}

}  // namespace

std::vector<std::string> load_tokens(const std::filesystem::path& file, std::size_t T, std::uint64_t max_bytes) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(file, ec);
  if (ec) throw UsageError("--tokens " + file.string() + ": cannot be read (" + ec.message() + ")", "pass a text file, one token per line");
  if (size > max_bytes)
    throw UsageError("--tokens " + file.string() + ": " + std::to_string(size) + " bytes exceed the memory limit", "--memory-limit raises it");
  std::ifstream in(file, std::ios::binary);
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  std::vector<std::string> tokens;
  if (file.extension() == ".json") {
    try {
      const auto doc = ref::json::parse(text, file.string(), max_bytes);
      for (const auto& v : doc.as_array()) tokens.push_back(v.as_string());
    } catch (const ref::json::JsonError& e) {
      throw UsageError(std::string("--tokens ") + e.what(), "a .json token file is one array of strings");
    }
  } else {
    std::size_t start = 0;
    while (start < text.size()) {
      const auto nl = text.find('\n', start);
      const auto end = nl == std::string::npos ? text.size() : nl;
      std::string line = text.substr(start, end - start);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      tokens.push_back(std::move(line));
      start = end + 1;
    }
  }
  if (tokens.size() != T)
    throw UsageError("--tokens " + file.string() + ": " + std::to_string(tokens.size()) + " tokens, the store has T = " +
                         std::to_string(T),
                     "one token per line (or a JSON array of strings), as many as the traced sequence");
  return tokens;
}

std::vector<PlantedPair> load_planted(const std::filesystem::path& dir, const rs::StoreLayout& L) {
  const auto path = dir / "planted.csv";
  std::vector<PlantedPair> out;
  std::ifstream in(path);
  if (!in) return out;
  std::string line;
  std::size_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (n == 1 && line == "layer,head,q,r") continue;
    if (line.empty()) continue;
    std::stringstream ss(line);
    std::size_t v[4];
    std::string cell;
    int i = 0;
    for (; i < 4 && std::getline(ss, cell, ','); ++i) {
      const auto x = parse_index(cell);
      if (!x) break;
      v[i] = *x;
    }
    const PlantedPair p{v[0], v[1], v[2], v[3]};
    if (i != 4 || p.layer >= L.layers || p.head >= L.heads || p.q >= L.geometry.n_q() || p.r >= L.geometry.n_k())
      throw UsageError(path.string() + ":" + std::to_string(n) + ": '" + line + "' is not a pair layer,head,q,r inside the store",
                       "planted.csv is written by flashlab stream trace --workload needles; remove it or trace again");
    out.push_back(p);
    if (out.size() > 100000) throw UsageError(path.string() + ": more than 100000 planted pairs", "remove planted.csv");
  }
  return out;
}

ViewerApi::ViewerApi(const rs::Store& store, std::vector<std::string> tokens, std::vector<PlantedPair> planted,
                     std::uint64_t max_bytes)
    : store_(store), tokens_(std::move(tokens)), planted_(std::move(planted)),
      density_(std::make_unique<rs::DensityIndex>(store, max_bytes)) {}

ViewerApi::~ViewerApi() = default;

ViewerResponse ViewerApi::handle(const std::string& path, const Params& p) const {
  if (path == "/" || path == "/index.html") return {200, std::string(viewer_page()), "text/html; charset=utf-8"};
  const auto& L = store_.layout();
  const auto& g = L.geometry;
  std::ostringstream os;
  Json j(os, false);
  // Text of tokens [a, b) for a list entry: at most 24 tokens and 160 bytes, cut on a UTF-8 boundary.
  auto text = [&](std::size_t a, std::size_t b) {
    std::string s;
    for (std::size_t t = a; t < std::min(b, a + 24) && t < tokens_.size(); ++t) s += tokens_[t];
    if (s.size() > 160) {
      std::size_t cut = 160;
      while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
      s = s.substr(0, cut) + "…";
    } else if (b > a + 24 && a + 24 <= tokens_.size()) {
      s += "…";
    }
    return s;
  };
  try {
    if (path == "/api/meta") {
      j.begin_object();
      j.key("T").value(std::uint64_t(g.T)).key("bq").value(std::uint64_t(g.bq)).key("bk").value(std::uint64_t(g.bk));
      j.key("k").value(std::uint64_t(L.k)).key("n_q").value(std::uint64_t(g.n_q())).key("n_k").value(std::uint64_t(g.n_k()));
      j.key("layers").value(std::uint64_t(L.layers)).key("heads").value(std::uint64_t(L.heads)).key("d").value(std::uint64_t(L.d));
      j.key("segments").value(std::uint64_t(store_.segments())).key("complete").value(store_.complete());
      j.key("records").value(store_.records()).key("bytes").value(store_.bytes()).key("source").value(L.source);
      j.key("scores").value(L.score).key("tokens").value(!tokens_.empty());
      const std::size_t C = rs::distance_classes(g);
      j.key("classes").value(std::uint64_t(C)).key("class_ranges").begin_array();
      for (std::size_t c = 0; c < C; ++c) {
        const std::uint64_t lo = c == 0 ? 0 : 1ull << (c - 1), hi = c == 0 ? 0 : (1ull << c) - 1;
        j.begin_array().value(lo).value(hi).end_array();
      }
      j.end_array();
      j.key("planted").begin_array();
      for (std::size_t i = 0; i < std::min<std::size_t>(planted_.size(), 1000); ++i) {
        const auto& pp = planted_[i];
        j.begin_object().key("layer").value(std::uint64_t(pp.layer)).key("head").value(std::uint64_t(pp.head));
        j.key("q").value(std::uint64_t(pp.q)).key("r").value(std::uint64_t(pp.r)).end_object();
      }
      j.end_array();
      j.key("density_bytes").value(density_->bytes());
      j.end_object();
    } else if (path == "/api/overview") {
      const std::size_t t0 = index_param(p, "t0", 0, 0, g.T - 1, "t0 is a token index below T");
      const std::size_t t1 = index_param(p, "t1", g.T, t0 + 1, g.T, "t0 < t1 ≤ T");
      const std::size_t bins = index_param(p, "bins", 800, 1, 4096, "bins=800");
      const std::string measure = param(p, "measure", "mass");
      if (measure != "mass" && measure != "edges") throw BadRequest{"measure=" + measure + " is unknown", "measure=mass or measure=edges"};
      const auto sel = selection(p);
      const auto v = density_->view(sel, t0, t1, bins);
      j.begin_object().key("t0").value(std::uint64_t(v.t0)).key("t1").value(std::uint64_t(v.t1));
      j.key("bins").value(std::uint64_t(v.bins())).key("classes").value(std::uint64_t(v.classes)).key("measure").value(measure);
      j.key("bin_start").begin_array();
      for (auto s : v.bin_start) j.value(std::uint64_t(s));
      j.end_array();
      double max = 0, total = 0;
      j.key("values").begin_array();
      for (std::size_t c = 0; c < v.classes; ++c) {
        j.begin_array();
        for (std::size_t b = 0; b < v.bins(); ++b) {
          const double x = measure == "mass" ? v.mass[c * v.bins() + b] : double(v.edges[c * v.bins() + b]);
          max = std::max(max, x);
          total += x;
          j.value(x);
        }
        j.end_array();
      }
      j.end_array();
      j.key("max").value(max).key("total").value(total).end_object();
    } else if (path == "/api/reads" || path == "/api/readers") {
      const bool reads = path == "/api/reads";
      const std::size_t pos = index_param(p, "pos", std::nullopt, 0, g.T - 1, "pos is a token index below T");
      const std::size_t top = index_param(p, "top", 30, 1, 1000, "top=30");
      const double cumulative = real_param(p, "cumulative", 1.0, 1e-9, 1.0, false);
      const auto sel = selection(p);
      const std::size_t block = reads ? pos / g.bq : pos / g.bk;
      const auto list = reads ? rs::top_reads(store_, block, sel, {100000, 1.0}) : rs::top_readers(store_, block, sel, {100000, 1.0});
      const auto kept = rs::prune_edges(list.edges, {top, cumulative});
      std::size_t heads = 0;
      for (std::size_t s = 0; s < store_.segments(); ++s) heads += sel.contains(s / L.heads, s % L.heads) ? 1 : 0;
      j.begin_object().key("pos").value(std::uint64_t(pos)).key(reads ? "q" : "r").value(std::uint64_t(block));
      if (reads) span_json(j, "query_tokens", block * g.bq, block * g.bq + g.q_rows(block));
      else span_json(j, "key_tokens", block * g.bk, block * g.bk + g.k_rows(block));
      if (!tokens_.empty())
        j.key("text").value(reads ? text(block * g.bq, block * g.bq + g.q_rows(block)) : text(block * g.bk, block * g.bk + g.k_rows(block)));
      j.key("heads_selected").value(std::uint64_t(heads)).key("candidates").value(std::uint64_t(list.candidates));
      j.key("total_mass").value(list.total_mass).key("edges").begin_array();
      for (const auto& e : kept.edges) {
        j.begin_object().key("layer").value(std::uint64_t(e.layer)).key("head").value(std::uint64_t(e.head));
        j.key("q").value(std::uint64_t(e.q)).key("r").value(std::uint64_t(e.r)).key("slot").value(std::uint64_t(e.slot));
        j.key("mass").value(e.mass).key("share").value(e.share).key("score").value(e.score);
        const std::size_t other = reads ? e.r : e.q;
        const std::size_t a = reads ? other * g.bk : other * g.bq, b = reads ? a + g.k_rows(other) : a + g.q_rows(other);
        span_json(j, reads ? "key_tokens" : "query_tokens", a, b);
        if (!tokens_.empty()) j.key("text").value(text(a, b));
        j.end_object();
      }
      j.end_array();
      // The same edges summed over the selected heads, per block: what the page draws as arcs.
      std::map<std::size_t, double> by;
      for (const auto& e : list.edges)
        if (!std::isnan(e.mass)) by[reads ? e.r : e.q] += e.mass;
      std::vector<std::pair<std::size_t, double>> blocks(by.begin(), by.end());
      std::stable_sort(blocks.begin(), blocks.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
      if (blocks.size() > top) blocks.resize(top);
      j.key("by_block").begin_array();
      for (const auto& [blk, mass] : blocks) {
        const std::size_t q = reads ? block : blk;
        const std::size_t a = reads ? blk * g.bk : blk * g.bq, b = reads ? a + g.k_rows(blk) : a + g.q_rows(blk);
        j.begin_object().key(reads ? "r" : "q").value(std::uint64_t(blk)).key("mass").value(mass);
        j.key("share").value(mass / (double(g.q_rows(q)) * double(std::max<std::size_t>(heads, 1))));
        span_json(j, "tokens", a, b);
        j.end_object();
      }
      j.end_array().end_object();
    } else if (path == "/api/route") {
      rs::TokenSpan src, dst;
      try {
        src = parse_span(param(p, "src", ""));
        dst = parse_span(param(p, "dst", ""));
      } catch (const std::invalid_argument& e) {
        throw BadRequest{std::string("src/dst: ") + e.what(), "src=FIRST-LAST&dst=FIRST-LAST in tokens, source earlier than target"};
      }
      rs::RouteParams rp;
      rp.head = selection(p).head;
      rp.residual = real_param(p, "residual", 0.5, 0.0, 1.0, true);
      rp.pruning = {index_param(p, "top", 16, 1, 1000, "top=16"), real_param(p, "cumulative", 0.9, 1e-9, 1.0, false)};
      const auto route = rs::route(store_, src, dst, rp);
      j.begin_object();
      span_json(j, "source", src.begin, src.end);
      span_json(j, "target", dst.begin, dst.end);
      j.key("residual").value(rp.residual).key("total").value(route.total).key("layers").begin_array();
      for (const auto& rl : route.layers) {
        j.begin_object().key("layer").value(std::uint64_t(rl.layer)).key("attention").value(rl.attention);
        j.key("residual").value(rl.residual).key("edges").begin_array();
        for (const auto& e : rl.edges) {
          j.begin_object();
          if (e.head) j.key("head").value(std::uint64_t(*e.head));
          else j.key("head").null();
          j.key("q").value(std::uint64_t(e.q)).key("r").value(std::uint64_t(e.r)).key("weight").value(e.weight);
          span_json(j, "query_tokens", e.q * g.bq, e.q * g.bq + g.q_rows(e.q));
          if (e.head) span_json(j, "key_tokens", e.r * g.bk, e.r * g.bk + g.k_rows(e.r));
          else span_json(j, "key_tokens", e.q * g.bq, e.q * g.bq + g.q_rows(e.q));
          j.end_object();
        }
        j.end_array().end_object();
      }
      j.end_array().end_object();
    } else if (path == "/api/summary") {
      const std::size_t local = index_param(p, "local", 512, 0, std::size_t(1) << 40, "local=512");
      const std::size_t far = index_param(p, "far", 8192, 0, std::size_t(1) << 40, "far=8192");
      std::vector<rs::HeadSummary> sums;
      {
        std::lock_guard<std::mutex> lock(summary_mutex_);
        auto it = summaries_.find({local, far});
        if (it == summaries_.end()) {
          if (summaries_.size() >= 64) summaries_.clear();  // bounded: a few band choices at a time
          it = summaries_.emplace(std::pair{local, far}, rs::summarize(store_, rs::DistanceBands{local, far})).first;
        }
        sums = it->second;
      }
      j.begin_object().key("local").value(std::uint64_t(local)).key("far").value(std::uint64_t(far)).key("heads").begin_array();
      for (const auto& h : sums) {
        j.begin_object().key("layer").value(std::uint64_t(h.layer)).key("head").value(std::uint64_t(h.head));
        j.key("records").value(h.records).key("mass").value(h.mass).key("local").value(h.local).key("mid").value(h.mid);
        j.key("far").value(h.far).key("mean_distance").value(h.mean_distance).end_object();
      }
      j.end_array().end_object();
    } else if (path == "/api/tokens") {
      if (tokens_.empty()) throw BadRequest{"this store is served without token text", "start the server with --tokens FILE"};
      const std::size_t t0 = index_param(p, "t0", std::nullopt, 0, g.T - 1, "t0 is a token index below T");
      const std::size_t t1 = index_param(p, "t1", std::nullopt, t0 + 1, std::min(g.T, t0 + 4096), "t0 < t1 ≤ min(T, t0 + 4096)");
      j.begin_object().key("t0").value(std::uint64_t(t0)).key("t1").value(std::uint64_t(t1)).key("tokens").begin_array();
      for (std::size_t t = t0; t < t1; ++t) j.value(tokens_[t]);
      j.end_array().end_object();
    } else {
      std::ostringstream e;
      Json je(e, false);
      je.begin_object().key("error").value("no endpoint " + path);
      je.key("hint").value("GET /, /api/meta, /api/overview, /api/reads, /api/readers, /api/route, /api/summary, /api/tokens").end_object();
      return {404, e.str()};
    }
  } catch (const BadRequest& b) {
    std::ostringstream e;
    Json je(e, false);
    je.begin_object().key("error").value(b.error).key("hint").value(b.hint).end_object();
    return {400, e.str()};
  } catch (const rs::StoreError& s) {
    std::ostringstream e;
    Json je(e, false);
    je.begin_object().key("error").value(std::string(s.what())).key("hint").value(s.hint()).end_object();
    return {400, e.str()};
  }
  return {200, os.str()};
}

}  // namespace flashlab::app
