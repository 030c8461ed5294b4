// The JSON endpoints of `flashlab stream serve`, without HTTP: a request (path and query
// parameters) in, a status and a JSON body out. The server (cmd_stream_serve.cpp) only moves bytes,
// so every answer can be computed and tested here, and every one is bounded: at most 4096 bins,
// 1000 edges, 4096 tokens of text per request.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "flashlab/reference/stream_query.hpp"

namespace flashlab::app {

/// One answer: an HTTP status and its body (JSON, or the page for "/").
struct ViewerResponse {
  int status = 200;                       ///< 200, 400 (bad parameter), 404 (unknown path)
  std::string body;                       ///< JSON text (or the page)
  std::string content_type = "application/json";  ///< MIME type of the body
};

/// Token text for the viewer: one token per line of a text file (the line as it is, without its
/// newline), or a JSON array of strings (a `.json` file). Exactly T tokens.
std::vector<std::string> load_tokens(const std::filesystem::path& file, std::size_t T, std::uint64_t max_bytes);

/// Planted (layer, head, q, r) pairs from a store's planted.csv, if there is one.
struct PlantedPair {
  std::size_t layer = 0, head = 0, q = 0, r = 0;  ///< where a needle was planted
};
/// Reads `dir/planted.csv` (header `layer,head,q,r`); empty when absent. Throws UsageError naming
/// file:line on a malformed line or a pair outside the store.
std::vector<PlantedPair> load_planted(const std::filesystem::path& dir, const ref::stream::StoreLayout& layout);

/// The endpoints (docs/stream.md, "The viewer"): /api/meta, /api/overview, /api/reads,
/// /api/readers, /api/route, /api/summary, /api/tokens, and "/" (the page).
class ViewerApi {
 public:
  /// Opens nothing itself: the store stays owned by the caller and must outlive the API. Builds
  /// the density sums under `max_bytes` (StoreError beyond).
  ViewerApi(const ref::stream::Store& store, std::vector<std::string> tokens, std::vector<PlantedPair> planted,
            std::uint64_t max_bytes);
  ~ViewerApi();

  /// Answers GET `path` with query parameters `params`. Never throws: bad parameters are 400
  /// with {"error", "hint"}.
  [[nodiscard]] ViewerResponse handle(const std::string& path, const std::map<std::string, std::string>& params) const;

 private:
  const ref::stream::Store& store_;
  std::vector<std::string> tokens_;
  std::vector<PlantedPair> planted_;
  std::unique_ptr<ref::stream::DensityIndex> density_;
  // Summaries read every record: each (local, far) is computed once (the page asks on load).
  mutable std::mutex summary_mutex_;
  mutable std::map<std::pair<std::size_t, std::size_t>, std::vector<ref::stream::HeadSummary>> summaries_;
};

/// The viewer's page (HTML, CSS and JavaScript in one file), embedded in the binary at build time.
std::string_view viewer_page();

}  // namespace flashlab::app
