// The trace store's format (docs/stream.md, "The trace store"): the manifest, the list of column
// files, their fixed-size `.npy` headers, the layout's limits and the record checksum. The
// writer (stream_store_write.cpp) and the reader (stream_store_read.cpp) both use only these.
#include "stream_store_detail.hpp"

#include "flashlab/reference/stream_json.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <system_error>

namespace flashlab::ref::stream {

std::uint64_t fnv1a(std::uint64_t state, const void* bytes, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(bytes);
  for (std::size_t i = 0; i < n; ++i) {
    state ^= p[i];
    state *= kFnvPrime;
  }
  return state;
}

void StoreLayout::check() const {
  auto bad = [](const std::string& what, const std::string& hint) { throw StoreError("store layout: " + what, hint); };
  if (geometry.T < 1 || geometry.T > StoreLimits::max_T)
    bad("T = " + std::to_string(geometry.T) + " is outside [1, 2^31 − 1]", "block indices are stored as int32");
  if (geometry.bq < 1 || geometry.bk < 1 || geometry.bq > StoreLimits::max_T || geometry.bk > StoreLimits::max_T)
    bad("b_q = " + std::to_string(geometry.bq) + ", b_k = " + std::to_string(geometry.bk) + " must lie in [1, 2^31 − 1]",
        "block sizes are a few tokens to a few hundred");
  if (k < 1 || k > StoreLimits::max_k)
    bad("k = " + std::to_string(k) + " is outside [1, 65536]", "k is the number of key blocks kept per query block");
  if (layers < 1 || heads < 1 || layers > StoreLimits::max_segments || heads > StoreLimits::max_segments ||
      layers * heads > StoreLimits::max_segments)
    bad("layers = " + std::to_string(layers) + ", heads = " + std::to_string(heads) +
            ": each must be ≥ 1 and layers·heads ≤ 65536",
        "trace fewer layers or heads per store");
  if (source.size() > 4096) bad("the source text has " + std::to_string(source.size()) + " bytes, more than 4096", "shorten it");
}

namespace detail {

std::vector<Column> columns(const StoreLayout& layout) {
  std::vector<Column> c = {{"row_ptr.npy", "<i8", 8, Counts::row_pointers},
                           {"key_block.npy", "<i4", 4, Counts::records},
                           {"mass.npy", "<f4", 4, Counts::records}};
  if (layout.score) c.push_back({"score.npy", "<f4", 4, Counts::records});
  if (layout.value_norm) c.push_back({"value_norm.npy", "<f4", 4, Counts::records});
  c.push_back({"rev_ptr.npy", "<i8", 8, Counts::reverse_pointers});
  c.push_back({"rev_query.npy", "<i4", 4, Counts::records});
  c.push_back({"segment_checksum.npy", "<i8", 8, Counts::segments});
  return c;
}

std::uint64_t column_length(const Column& c, const StoreLayout& layout, std::size_t segments, std::uint64_t records) {
  switch (c.counts) {
    case Counts::records: return records;
    case Counts::row_pointers: return 1 + std::uint64_t(segments) * layout.geometry.n_q();
    case Counts::reverse_pointers: return 1 + std::uint64_t(segments) * layout.geometry.n_k();
    case Counts::segments: return segments;
  }
  return 0;
}

std::string column_header(const char* descr, std::uint64_t length) {
  std::string dict = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (" +
                     std::to_string(length) + ",), }";
  // magic (6) + version (2) + header length (2) + dict padded with spaces + '\n' = 128 bytes, so
  // the shape can grow in place to 20 digits without moving the payload.
  dict.resize(kStoreHeaderBytes - 10 - 1, ' ');
  dict.push_back('\n');
  std::string h = "\x93NUMPY";
  h.push_back('\x01');
  h.push_back('\x00');
  const auto len = std::uint16_t(dict.size());
  h.push_back(char(len & 0xFF));
  h.push_back(char(len >> 8));
  return h + dict;
}

std::string hex64(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(v));
  return buf;
}

namespace {

std::string json_quoted(std::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  return out + "\"";
}

std::uint64_t parse_hex64(const std::string& s, const std::string& where) {
  if (s.size() != 18 || s[0] != '0' || s[1] != 'x') throw StoreError(where + ": checksum \"" + s + "\" is not 0x and 16 hex digits");
  std::uint64_t v = 0;
  for (std::size_t i = 2; i < s.size(); ++i) {
    const char c = s[i];
    v <<= 4;
    if (c >= '0' && c <= '9') v |= std::uint64_t(c - '0');
    else if (c >= 'a' && c <= 'f') v |= std::uint64_t(c - 'a' + 10);
    else throw StoreError(where + ": checksum \"" + s + "\" is not 0x and 16 lower-case hex digits");
  }
  return v;
}

constexpr const char* kRetrace = "trace the inputs again into a new store (flashlab stream trace --store DIR)";

}  // namespace

Manifest read_manifest(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  const fs::path path = dir / "manifest.json";
  const std::string name = path.string();
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw StoreError(dir.string() + ": not a directory", "pass the directory a trace was stored in (--store DIR)");
  if (!fs::is_regular_file(path, ec))
    throw StoreError(name + ": missing, so " + dir.string() + " is not a trace store",
                     "pass the directory a trace was stored in (flashlab stream trace --store DIR)");
  const auto size = fs::file_size(path, ec);
  if (ec || size > StoreLimits::max_manifest_bytes)
    throw StoreError(name + ": " + (ec ? "cannot be read" : std::to_string(size) + " bytes, more than a manifest can be"),
                     kRetrace);
  std::ifstream in(path, std::ios::binary);
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (!in && !in.eof()) throw StoreError(name + ": cannot be read", "check the file's permissions");
  Manifest m;
  try {
    const json::Value doc = json::parse(text, name);
    const auto& format = doc.at("format").as_string();
    if (format != kStoreFormat)
      throw StoreError(name + ": format \"" + format + "\", expected \"" + kStoreFormat + "\"", kRetrace);
    const std::uint64_t version = doc.at("version").as_uint();
    if (version != kStoreVersion)
      throw StoreError(name + ": store format version " + std::to_string(version) + ", this flashlab reads version " +
                           std::to_string(kStoreVersion),
                       "open it with the flashlab that wrote it, or trace again into a new store");
    auto count = [&](const char* key, std::uint64_t hi) {
      const std::uint64_t v = doc.at(key).as_uint();
      if (v > hi)
        throw StoreError(name + ": \"" + key + "\" = " + std::to_string(v) + " exceeds the limit " + std::to_string(hi),
                         kRetrace);
      return std::size_t(v);
    };
    StoreLayout& L = m.layout;
    L.geometry.T = count("T", StoreLimits::max_T);
    L.geometry.bq = count("bq", StoreLimits::max_T);
    L.geometry.bk = count("bk", StoreLimits::max_T);
    L.k = count("k", StoreLimits::max_k);
    L.layers = count("layers", StoreLimits::max_segments);
    L.heads = count("heads", StoreLimits::max_segments);
    L.d = count("d", 1u << 20);
    L.source = doc.at("source").as_string();
    try {
      L.check();
    } catch (const StoreError& e) {
      throw StoreError(name + ": " + e.what(), kRetrace);
    }
    if (count("n_q", StoreLimits::max_T) != L.geometry.n_q() || count("n_k", StoreLimits::max_T) != L.geometry.n_k())
      throw StoreError(name + ": n_q, n_k disagree with ⌈T/b_q⌉, ⌈T/b_k⌉", kRetrace);
    const auto& cols = doc.at("columns").as_array();
    std::vector<std::string> names;
    for (const auto& c : cols) names.push_back(c.as_string());
    L.score = std::find(names.begin(), names.end(), "score") != names.end();
    L.value_norm = std::find(names.begin(), names.end(), "value_norm") != names.end();
    std::vector<std::string> expected = {"key_block", "mass"};
    if (L.score) expected.push_back("score");
    if (L.value_norm) expected.push_back("value_norm");
    if (names != expected)
      throw StoreError(name + ": \"columns\" must be key_block, mass, then optionally score and value_norm in that order",
                       kRetrace);
    if (doc.at("segment_order").as_string() != "layer-major")
      throw StoreError(name + ": \"segment_order\" must be \"layer-major\"", kRetrace);
    m.segments = count("segments_committed", L.segments());
    m.records = doc.at("records").as_uint();
    if (m.records > std::uint64_t(m.segments) * L.geometry.n_q() * L.k)
      throw StoreError(name + ": " + std::to_string(m.records) + " records is more than segments·n_q·k allows", kRetrace);
    m.complete = doc.at("complete").as_bool();
    if (m.complete != (m.segments == L.segments()))
      throw StoreError(name + ": \"complete\" disagrees with segments_committed = " + std::to_string(m.segments) +
                           " of layers·heads = " + std::to_string(L.segments()),
                       kRetrace);
    m.checksum = parse_hex64(doc.at("checksum").as_string(), name);
  } catch (const json::JsonError& e) {
    // A member that is missing or of the wrong kind: the parser's message says which.
    std::string what = e.what();
    if (what.rfind(name, 0) != 0) what = name + ": " + what;
    throw StoreError(what, kRetrace);
  }
  return m;
}

void write_manifest(const std::filesystem::path& dir, const Manifest& m) {
  const StoreLayout& L = m.layout;
  std::string cols = "[\"key_block\", \"mass\"";
  if (L.score) cols += ", \"score\"";
  if (L.value_norm) cols += ", \"value_norm\"";
  cols += "]";
  auto num = [](std::uint64_t v) { return std::to_string(v); };
  const std::string text =
      "{\n"
      "  \"format\": \"" + std::string(kStoreFormat) + "\",\n"
      "  \"version\": " + num(kStoreVersion) + ",\n"
      "  \"T\": " + num(L.geometry.T) + ", \"bq\": " + num(L.geometry.bq) + ", \"bk\": " + num(L.geometry.bk) +
      ", \"n_q\": " + num(L.geometry.n_q()) + ", \"n_k\": " + num(L.geometry.n_k()) + ", \"k\": " + num(L.k) + ",\n"
      "  \"layers\": " + num(L.layers) + ", \"heads\": " + num(L.heads) + ", \"d\": " + num(L.d) + ",\n"
      "  \"segment_order\": \"layer-major\",\n"
      "  \"columns\": " + cols + ",\n"
      "  \"segments_committed\": " + num(m.segments) + ",\n"
      "  \"records\": " + num(m.records) + ",\n"
      "  \"complete\": " + (m.complete ? "true" : "false") + ",\n"
      "  \"checksum\": \"" + hex64(m.checksum) + "\",\n"
      "  \"source\": " + json_quoted(L.source) + "\n"
      "}\n";
  const auto tmp = dir / "manifest.json.tmp", path = dir / "manifest.json";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) throw StoreError(tmp.string() + ": cannot write (disk full?)", "free space, then reopen the store to continue");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);  // atomic on POSIX: readers see the old or the new manifest
  if (ec) throw StoreError(path.string() + ": cannot replace: " + ec.message(), "check the directory's permissions");
}

}  // namespace detail
}  // namespace flashlab::ref::stream
