// The trace store: round trip (every record, weight and reader back as written), chunked and
// whole-head appends give the same bytes, close/reopen and a killed writer continue to the same
// store, a store being written reads up to its last commit, the writer refuses invalid records,
// and hostile files (truncated, wrong version, huge counts, broken pointers) are refused by name.
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "flashlab/reference/stream_query.hpp"
#include "flashlab/reference/stream_store.hpp"
#include "test_stream_store_util.hpp"
#include "test_stream_util.hpp"

namespace fs = std::filesystem;
namespace rs = flashlab::ref::stream;
using namespace flashlab::test::stream;

namespace {

rs::StoreLayout small_layout(bool weights) {
  rs::StoreLayout L;
  L.geometry = rs::Geometry{203, 8, 6};  // ragged: T is a multiple of neither block size
  L.k = 4;
  L.layers = 2;
  L.heads = 3;
  L.d = 8;
  L.score = weights;
  L.value_norm = weights;
  L.source = "test \"records\"\n";
  return L;
}

std::vector<HeadRecords> all_heads(const rs::StoreLayout& L, unsigned seed) {
  std::vector<HeadRecords> v;
  for (std::size_t s = 0; s < L.segments(); ++s) v.push_back(random_records(L.geometry, L.k, seed + unsigned(s)));
  return v;
}

void write_store(const fs::path& dir, const rs::StoreLayout& L, const std::vector<HeadRecords>& heads, std::size_t chunk) {
  auto w = rs::StoreWriter::create(dir, L);
  for (std::size_t s = 0; s < L.segments(); ++s) {
    w.begin_head(s / L.heads, s % L.heads);
    append_chunks(w, heads[s], chunk);
    w.end_head();
  }
  w.close();
}

const std::vector<std::string> kFiles = {"manifest.json", "row_ptr.npy", "key_block.npy", "mass.npy", "score.npy",
                                         "value_norm.npy", "rev_ptr.npy", "rev_query.npy", "segment_checksum.npy"};

void expect_same_files(const fs::path& a, const fs::path& b) {
  for (const auto& f : kFiles) {
    INFO(f);
    CHECK(slurp(a / f) == slurp(b / f));
  }
}

/// Expects Store::open to refuse `dir` with a message containing `needle` and a hint.
void expect_refused(const fs::path& dir, const std::string& needle) {
  try {
    (void)rs::Store::open(dir);
    FAIL("opened a store that should be refused (" << needle << ")");
  } catch (const rs::StoreError& e) {
    INFO(e.what());
    CHECK_THAT(std::string(e.what()), Catch::Contains(needle));
    CHECK_FALSE(e.hint().empty());
  }
}

/// Overwrites `n` bytes at `offset` of a file.
void patch(const fs::path& p, std::size_t offset, const void* bytes, std::size_t n) {
  std::string s = slurp(p);
  REQUIRE(offset + n <= s.size());
  std::memcpy(s.data() + offset, bytes, n);
  spit(p, s);
}

void replace_in(const fs::path& p, const std::string& from, const std::string& to) {
  std::string s = slurp(p);
  const auto at = s.find(from);
  REQUIRE(at != std::string::npos);
  s.replace(at, from.size(), to);
  spit(p, s);
}

}  // namespace

TEST_CASE("stream store: every record, weight and reader reads back as written", "[stream][store]") {
  const auto L = small_layout(true);
  const auto heads = all_heads(L, 11);
  const auto dir = fresh_dir("store_rt");
  write_store(dir, L, heads, 5);
  const auto st = rs::Store::open(dir);
  REQUIRE(st.complete());
  REQUIRE(st.segments() == 6);
  CHECK(st.layout().source == L.source);
  CHECK(st.layout().geometry.T == 203);
  const std::size_t n_q = L.geometry.n_q(), n_k = L.geometry.n_k(), k = L.k;
  std::uint64_t records = 0;
  for (std::size_t s = 0; s < L.segments(); ++s) {
    std::vector<std::vector<std::int32_t>> readers(n_k);
    for (std::size_t q = 0; q < n_q; ++q) {
      const auto row = st.row(s, q);
      std::size_t kept = 0;
      for (std::size_t j = 0; j < k; ++j) kept += heads[s].I[q * k + j] >= 0 ? 1 : 0;
      INFO("segment " << s << " q " << q);
      REQUIRE(row.size == kept);
      for (std::size_t j = 0; j < kept; ++j) {
        CHECK(row.key_block[j] == heads[s].I[q * k + j]);
        CHECK(row.mass[j] == heads[s].mass[q * k + j]);
        CHECK(row.score[j] == heads[s].score[q * k + j]);
        CHECK(row.value_norm[j] == heads[s].value_norm[q * k + j]);
        readers[std::size_t(row.key_block[j])].push_back(std::int32_t(q));
      }
      records += kept;
    }
    for (std::size_t r = 0; r < n_k; ++r) {
      const auto got = st.readers(s, r);
      CHECK(std::vector<std::int32_t>(got.begin(), got.end()) == readers[r]);  // ascending q, as built
    }
  }
  CHECK(st.records() == records);
  CHECK(st.verify().empty());
}

TEST_CASE("stream store: chunks of any size and edge lists give byte-identical stores", "[stream][store]") {
  const auto L = small_layout(true);
  const auto heads = all_heads(L, 5);
  const auto a = fresh_dir("store_c1"), b = fresh_dir("store_c7"), c = fresh_dir("store_call");
  write_store(a, L, heads, 1);
  write_store(b, L, heads, 7);
  write_store(c, L, heads, L.geometry.n_q());
  expect_same_files(a, b);
  expect_same_files(a, c);

  // The reference's edge records through append_edges equal the same records as index rows.
  auto in = rs::make_workload(rs::Workload::random, rs::WorkloadParams{L.geometry, 8, 3});
  const auto edges = trace_head(in, L.geometry, L.k);
  rs::StoreLayout one = L;
  one.layers = one.heads = 1;
  const auto d1 = fresh_dir("store_edges"), d2 = fresh_dir("store_rows");
  {
    auto w = rs::StoreWriter::create(d1, one);
    w.begin_head(0, 0);
    w.append_edges(edges);
    w.end_head();
  }
  HeadRecords h{std::vector<std::int64_t>(L.geometry.n_q() * L.k, -1), std::vector<float>(L.geometry.n_q() * L.k),
                std::vector<float>(L.geometry.n_q() * L.k), std::vector<float>(L.geometry.n_q() * L.k)};
  for (const auto& e : edges) {
    const std::size_t at = std::size_t(e.q) * L.k + std::size_t(e.slot);
    h.I[at] = e.r;
    h.mass[at] = float(e.mass);
    h.score[at] = float(e.score);
    h.value_norm[at] = float(e.value_norm);
  }
  {
    auto w = rs::StoreWriter::create(d2, one);
    w.begin_head(0, 0);
    append_chunks(w, h, 3);
    w.end_head();
  }
  expect_same_files(d1, d2);
  const auto st = rs::Store::open(d1);
  CHECK(st.records() == edges.size());
  CHECK(st.verify().empty());
}

TEST_CASE("stream store: close, reopen and a killed writer continue to the same store", "[stream][store]") {
  const auto L = small_layout(false);
  const auto heads = all_heads(L, 21);
  const auto whole = fresh_dir("store_whole");
  write_store(whole, L, heads, 4);

  const auto dir = fresh_dir("store_resume");
  {
    auto w = rs::StoreWriter::create(dir, L);
    for (std::size_t s = 0; s < 2; ++s) {
      w.begin_head(0, s);
      append_chunks(w, heads[s], 4);
      w.end_head();
    }
    // A head that never commits: its chunks reach the files, its pointers and manifest do not.
    w.begin_head(0, 2);
    append_chunks(w, heads[2], 4);
  }  // destroyed with the head open, as a killed writer
  {
    // Readers see the committed part; NumPy would too (the headers say so).
    const auto partial = rs::Store::open(dir);
    CHECK_FALSE(partial.complete());
    CHECK(partial.segments() == 2);
    CHECK(partial.verify().empty());
    CHECK_THROWS_AS(rs::route(partial, {0, 8}, {100, 108}, {}), rs::StoreError);
  }
  {
    auto w = rs::StoreWriter::reopen(dir);
    CHECK(w.segments_committed() == 2);
    CHECK(w.next_head() == std::pair<std::size_t, std::size_t>{0, 2});
    CHECK_THROWS_AS(w.begin_head(1, 0), rs::StoreError);  // out of order
    w.begin_head(0, 2);
    append_chunks(w, heads[2], 4);
    w.end_head();
    w.close();
  }
  {
    auto w = rs::StoreWriter::reopen(dir);  // reopened again after a clean close
    for (std::size_t s = 3; s < L.segments(); ++s) {
      w.begin_head(s / L.heads, s % L.heads);
      append_chunks(w, heads[s], 4);
      w.end_head();
    }
    CHECK(w.complete());
    CHECK_THROWS_AS(w.begin_head(0, 0), rs::StoreError);  // complete
  }
  expect_same_files(whole, dir);
}

TEST_CASE("stream store: the writer refuses invalid records and overwriting", "[stream][store]") {
  rs::StoreLayout L = small_layout(true);
  const auto dir = fresh_dir("store_refuse");
  auto w = rs::StoreWriter::create(dir, L);
  CHECK_THROWS_AS(rs::StoreWriter::create(dir, L), rs::StoreError);  // a store is there
  CHECK_THROWS_AS(w.begin_head(0, 1), rs::StoreError);               // not the next head
  w.begin_head(0, 0);
  const std::size_t k = L.k;
  std::vector<std::int64_t> I(k, -1);
  std::vector<float> m(k, 0.5f);
  auto refused = [&](std::vector<std::int64_t> row, std::size_t q0, const std::string& needle, bool with_score = true) {
    rs::RowChunk c{q0, 1, row.data(), m.data(), with_score ? m.data() : nullptr, m.data()};
    try {
      w.append(c);
      FAIL("accepted: " << needle);
    } catch (const rs::StoreError& e) {
      CHECK_THAT(std::string(e.what()), Catch::Contains(needle));
    }
  };
  refused({2, -1, -1, -1}, 0, "not a causally valid key block");  // q = 0 (tokens 0..7) sees key blocks 0, 1
  refused({0, 0, -1, -1}, 0, "appears twice");
  refused({-1, 0, -1, -1}, 0, "follows an empty entry");
  refused({-2, -1, -1, -1}, 0, "not a causally valid key block");
  refused({0, -1, -1, -1}, 3, "expected 0");
  refused({0, -1, -1, -1}, 0, "keeps scores", false);
  // Nothing of the refused chunks was written: the head still commits cleanly.
  std::vector<std::int64_t> ok = {1, 0, -1, -1};
  rs::RowChunk c{0, 1, ok.data(), m.data(), m.data(), m.data()};
  w.append(c);
  rs::RowChunk past{1, L.geometry.n_q(), ok.data(), m.data(), m.data(), m.data()};
  CHECK_THROWS_AS(w.append(past), rs::StoreError);  // runs past n_q
  w.end_head();
  const auto st = rs::Store::open(dir);
  CHECK(st.records() == 2);
  CHECK(st.verify().empty());

  rs::StoreLayout bad = L;
  bad.k = 0;
  CHECK_THROWS_AS(rs::StoreWriter::create(fresh_dir("store_badk"), bad), rs::StoreError);
  bad = L;
  bad.layers = 70000;
  CHECK_THROWS_AS(rs::StoreWriter::create(fresh_dir("store_badl"), bad), rs::StoreError);
}

TEST_CASE("stream store: hostile and damaged stores are refused with the file and the problem named",
          "[stream][store][hostile]") {
  const auto L = small_layout(true);
  const auto heads = all_heads(L, 31);
  const auto good = fresh_dir("store_good");
  write_store(good, L, heads, 9);
  REQUIRE_NOTHROW(rs::Store::open(good));
  auto copy = [&](const std::string& tag) {
    const auto d = fresh_dir(tag);
    for (const auto& f : kFiles) fs::copy_file(good / f, d / f);
    return d;
  };
  const std::size_t H = rs::kStoreHeaderBytes;

  SECTION("not a store") {
    expect_refused(fresh_dir("store_empty"), "manifest.json: missing");
    expect_refused(good / "nope", "not a directory");
  }
  SECTION("truncated column") {
    const auto d = copy("store_trunc");
    const std::string s = slurp(d / "mass.npy");
    spit(d / "mass.npy", s.substr(0, s.size() - 4));
    expect_refused(d, "mass.npy: truncated");
    spit(d / "mass.npy", s.substr(0, 50));
    expect_refused(d, "mass.npy");
  }
  SECTION("missing column") {
    const auto d = copy("store_missing");
    fs::remove(d / "rev_query.npy");
    expect_refused(d, "rev_query.npy: cannot open");
  }
  SECTION("wrong version, wrong format, broken JSON") {
    const auto d = copy("store_version");
    replace_in(d / "manifest.json", "\"version\": 1", "\"version\": 2");
    expect_refused(d, "version 2, this flashlab reads version 1");
    const auto e = copy("store_format");
    replace_in(e / "manifest.json", "flashlab-stream-store", "something-else");
    expect_refused(e, "format \"something-else\"");
    const auto f = copy("store_json");
    replace_in(f / "manifest.json", "\"records\":", "\"records\" ");
    expect_refused(f, "manifest.json:");
  }
  SECTION("huge counts") {
    const auto d = copy("store_huge_records");
    replace_in(d / "manifest.json", "\"records\": ", "\"records\": 9000000000000000000");
    expect_refused(d, "records");
    const auto e = copy("store_huge_T");
    replace_in(e / "manifest.json", "\"T\": 203", "\"T\": 1099511627776");
    expect_refused(e, "\"T\" = 1099511627776 exceeds");
    const auto f = copy("store_huge_layers");
    replace_in(f / "manifest.json", "\"layers\": 2", "\"layers\": 99999999999999999999999");
    expect_refused(f, "layers");
    const auto g = copy("store_huge_shape");
    // A header declaring 10^14 more elements than the file holds, padding shortened to keep 128 bytes.
    std::string s = slurp(g / "key_block.npy");
    const std::string digits = "99999999999999";
    s.insert(s.find("'shape': (") + std::string("'shape': (").size(), digits);
    s.erase(H - 1, digits.size());  // spaces just before the header's closing newline
    REQUIRE(s[H - 1] == '\n');
    spit(g / "key_block.npy", s);
    expect_refused(g, "key_block.npy");
  }
  SECTION("broken pointers and out-of-range values") {
    const auto d = copy("store_rowptr");
    const std::int64_t big = 1 << 30;
    patch(d / "row_ptr.npy", H + 8 * 5, &big, 8);
    expect_refused(d, "row_ptr.npy");
    const auto e = copy("store_keyblock");
    const std::int32_t r = 1000;
    patch(e / "key_block.npy", H, &r, 4);
    expect_refused(e, "key_block.npy: record 0");
    const auto f = copy("store_revq");
    const std::int32_t q = -3;
    patch(f / "rev_query.npy", H + 4, &q, 4);
    expect_refused(f, "rev_query.npy: entry 1");
    const auto g = copy("store_dtype");
    replace_in(g / "mass.npy", "'<f4'", "'<i4'");
    expect_refused(g, "mass.npy: dtype <i4, expected <f4");
  }
  SECTION("a changed weight passes the structural checks and fails verify") {
    const auto d = copy("store_flip");
    const float m = 123.0f;
    patch(d / "mass.npy", H + 4 * 3, &m, 4);
    const auto st = rs::Store::open(d);
    CHECK_THAT(st.verify(), Catch::Contains("records hash to"));
  }
}
