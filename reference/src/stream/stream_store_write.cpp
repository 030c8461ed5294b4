// The trace store's writer (stream_store.hpp). A head's records are appended to the column files
// as chunks arrive; end_head adds the head's row pointers, its reverse index (a counting sort of
// its records by key block, so each list of readers is ascending in q) and its checksum, rewrites
// the 128-byte headers with the new lengths and then replaces manifest.json, the commit record.
// Memory: one head's key blocks and row ends (O(n_q·k)), never the store.
//
// The checksums are FNV-1a over every byte, a chain of dependent multiplies (about 4 cycles a
// byte) that cannot be split; a GPU producer hands over a head every few milliseconds, so a
// second thread runs the chain over each appended chunk, in order, while the writer's thread
// validates and writes the next one; end_head waits for it before it writes the head's checksum.
#include "stream_store_detail.hpp"

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <system_error>
#include <thread>

namespace flashlab::ref::stream {

namespace fs = std::filesystem;
using detail::Column;

namespace {

struct ColumnFile {
  Column spec;
  fs::path path;
  std::FILE* f = nullptr;
  std::uint64_t length = 0;  // elements in the file, committed or not
};

[[noreturn]] void io_error(const fs::path& p, const char* what) {
  throw StoreError(p.string() + ": " + what + (errno ? std::string(": ") + std::strerror(errno) : std::string()),
                   "free disk space or fix the directory's permissions, then reopen the store to continue");
}

}  // namespace

struct StoreWriter::Impl {
  fs::path dir;
  detail::Manifest m;  // what is committed
  std::vector<ColumnFile> files;
  bool broken = false;  // an I/O error happened: only reopen can continue

  // The open head.
  bool open = false;
  std::size_t next_q = 0;
  std::uint64_t head_records = 0, head_checksum = kFnvOffset, running_checksum = kFnvOffset;
  std::vector<std::uint64_t> row_end;    // n_q: records of the head up to the end of each row
  std::vector<std::int32_t> head_r;      // key block of each record of the head

  // Scratch of append and end_head, kept from call to call: a GPU producer appends hundreds of
  // chunks a second, and buffers of this size freed and allocated again cost a page fault per
  // page each time (the allocator maps and unmaps them).
  std::vector<std::int32_t> r_out, rev_query;
  std::vector<float> mass_out, score_out, vn_out;
  std::vector<std::int64_t> ptr, rev_ptr;
  std::vector<std::uint64_t> start;

  // The checksum thread: chunks' records (key block, mass, score, value norm) in append order.
  // While a chunk is queued or being summed, head_checksum and running_checksum belong to it;
  // the writer's thread reads or resets them only after sum_wait().
  struct SumJob {
    std::vector<std::int32_t> r;
    std::vector<float> mass, score, vn;
  };
  std::thread sum_thread;
  std::mutex sum_mu;
  std::condition_variable sum_work, sum_idle;
  std::deque<SumJob> sum_jobs;
  std::vector<SumJob> sum_free;  // buffers of summed chunks, for the next ones
  bool sum_busy = false, sum_stop = false;

  ~Impl() { sum_shutdown(); }

  void sum_loop() {
    for (;;) {
      SumJob job;
      {
        std::unique_lock<std::mutex> lock(sum_mu);
        sum_work.wait(lock, [&] { return sum_stop || !sum_jobs.empty(); });
        if (sum_jobs.empty()) return;
        job = std::move(sum_jobs.front());
        sum_jobs.pop_front();
        sum_busy = true;
      }
      // Each record's bytes in record order; the head's and the store's chains advance together
      // in locals (two independent chains).
      std::uint64_t h_head = head_checksum, h_all = running_checksum;
      auto word = [&](const void* p) {
        unsigned char b[4];
        std::memcpy(b, p, 4);
        for (unsigned char x : b) {
          h_head = (h_head ^ x) * kFnvPrime;
          h_all = (h_all ^ x) * kFnvPrime;
        }
      };
      const bool score = !job.score.empty(), vn = !job.vn.empty();
      for (std::size_t e = 0; e < job.r.size(); ++e) {
        word(&job.r[e]);
        word(&job.mass[e]);
        if (score) word(&job.score[e]);
        if (vn) word(&job.vn[e]);
      }
      {
        std::lock_guard<std::mutex> lock(sum_mu);
        head_checksum = h_head;
        running_checksum = h_all;
        sum_busy = false;
        sum_free.push_back(std::move(job));
      }
      sum_idle.notify_all();
    }
  }

  /// Queues the records of `r_out` … for the checksum thread (started on first use); the
  /// scratch vectors come back empty, with a summed chunk's capacity where there is one.
  void sum_push() {
    SumJob job;
    {
      std::lock_guard<std::mutex> lock(sum_mu);
      if (!sum_free.empty()) {
        job = std::move(sum_free.back());
        sum_free.pop_back();
      }
    }
    job.r.swap(r_out);
    job.mass.swap(mass_out);
    job.score.swap(score_out);
    job.vn.swap(vn_out);
    r_out.clear();
    mass_out.clear();
    score_out.clear();
    vn_out.clear();
    {
      std::lock_guard<std::mutex> lock(sum_mu);
      sum_jobs.push_back(std::move(job));
    }
    if (!sum_thread.joinable()) sum_thread = std::thread([this] { sum_loop(); });
    sum_work.notify_one();
  }

  /// Waits until every queued chunk is summed.
  void sum_wait() {
    std::unique_lock<std::mutex> lock(sum_mu);
    sum_idle.wait(lock, [&] { return sum_jobs.empty() && !sum_busy; });
  }

  void sum_shutdown() {
    if (!sum_thread.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(sum_mu);
      sum_stop = true;
    }
    sum_work.notify_one();
    sum_thread.join();
  }

  ColumnFile& file(const char* name) {
    for (auto& c : files)
      if (std::strcmp(c.spec.file, name) == 0) return c;
    throw std::logic_error(std::string("no column ") + name);
  }

  void write(ColumnFile& c, const void* data, std::size_t count) {
    if (count == 0) return;
    errno = 0;
    if (std::fwrite(data, c.spec.item, count, c.f) != count) {
      broken = true;
      io_error(c.path, "write failed");
    }
    c.length += count;
  }

  void close_files() {
    for (auto& c : files)
      if (c.f) {
        std::fclose(c.f);
        c.f = nullptr;
      }
  }

  // Rewrites every header with the committed lengths; the payload stays where it is.
  void write_headers(std::size_t segments, std::uint64_t records) {
    for (auto& c : files) {
      const std::string h = detail::column_header(c.spec.descr, detail::column_length(c.spec, m.layout, segments, records));
      errno = 0;
      if (std::fflush(c.f) != 0 || std::fseek(c.f, 0, SEEK_SET) != 0 || std::fwrite(h.data(), 1, h.size(), c.f) != h.size() ||
          std::fseek(c.f, 0, SEEK_END) != 0 || std::fflush(c.f) != 0) {
        broken = true;
        io_error(c.path, "header update failed");
      }
    }
  }

  void require_usable() const {
    if (broken)
      throw StoreError(dir.string() + ": an earlier write failed, so this writer stopped",
                       "reopen the store (StoreWriter::reopen, or flashlab stream trace --resume) to continue");
    if (files.empty()) throw StoreError(dir.string() + ": the writer is closed", "reopen the store to continue");
  }
};

StoreWriter::StoreWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StoreWriter::StoreWriter(StoreWriter&&) noexcept = default;
StoreWriter& StoreWriter::operator=(StoreWriter&&) noexcept = default;
StoreWriter::~StoreWriter() {
  if (impl_) impl_->close_files();
}

StoreWriter StoreWriter::create(const fs::path& dir, const StoreLayout& layout) {
  layout.check();
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir))
    throw StoreError(dir.string() + ": cannot create the store directory" + (ec ? ": " + ec.message() : std::string()),
                     "choose a directory you can write");
  auto impl = std::make_unique<Impl>();
  impl->dir = dir;
  impl->m.layout = layout;
  const auto cols = detail::columns(layout);
  if (fs::exists(dir / "manifest.json"))
    throw StoreError(dir.string() + ": already holds a trace store (manifest.json)",
                     "choose a new directory, remove the old store, or continue it with --resume");
  for (const auto& c : cols)
    if (fs::exists(dir / c.file))
      throw StoreError((dir / c.file).string() + ": exists; a new store is not written over other files",
                       "choose a new or empty directory");
  for (const auto& c : cols) {
    ColumnFile f{c, dir / c.file, nullptr, 0};
    errno = 0;
    f.f = std::fopen(f.path.c_str(), "w+b");
    if (!f.f) {
      impl->close_files();
      io_error(f.path, "cannot create");
    }
    impl->files.push_back(f);
  }
  // The first row and reverse pointer (0), then the headers and an empty manifest: a valid store
  // with nothing committed, which reopen can continue.
  const std::int64_t zero = 0;
  impl->write(impl->file("row_ptr.npy"), &zero, 1);
  impl->write(impl->file("rev_ptr.npy"), &zero, 1);
  for (auto& c : impl->files) {
    const std::string h = detail::column_header(c.spec.descr, c.length);
    if (std::fseek(c.f, 0, SEEK_SET) != 0 || std::fwrite(h.data(), 1, h.size(), c.f) != h.size()) io_error(c.path, "cannot write");
    std::vector<char> payload(std::size_t(c.length * c.spec.item), 0);
    if (!payload.empty() && std::fwrite(payload.data(), 1, payload.size(), c.f) != payload.size()) io_error(c.path, "cannot write");
    if (std::fflush(c.f) != 0) io_error(c.path, "cannot write");
  }
  detail::write_manifest(dir, impl->m);
  return StoreWriter(std::move(impl));
}

StoreWriter StoreWriter::reopen(const fs::path& dir) {
  auto impl = std::make_unique<Impl>();
  impl->dir = dir;
  impl->m = detail::read_manifest(dir);
  impl->running_checksum = impl->m.checksum;
  for (const auto& c : detail::columns(impl->m.layout)) {
    ColumnFile f{c, dir / c.file, nullptr, detail::column_length(c, impl->m.layout, impl->m.segments, impl->m.records)};
    std::error_code ec;
    const auto size = fs::file_size(f.path, ec);
    const std::uint64_t need = kStoreHeaderBytes + f.length * c.item;
    if (ec)
      throw StoreError(f.path.string() + ": missing (" + ec.message() + ")", "the store is incomplete; trace again into a new store");
    if (size < need)
      throw StoreError(f.path.string() + ": truncated: " + std::to_string(size) + " bytes, the committed part needs " +
                           std::to_string(need),
                       "the store was damaged after it was written; trace again into a new store");
    // Whatever an interrupted writer appended after the last commit goes.
    if (size > need) fs::resize_file(f.path, need, ec);
    if (ec) throw StoreError(f.path.string() + ": cannot truncate: " + ec.message(), "check the file's permissions");
    errno = 0;
    f.f = std::fopen(f.path.c_str(), "r+b");
    if (!f.f) {
      impl->close_files();
      io_error(f.path, "cannot open for appending");
    }
    if (std::fseek(f.f, 0, SEEK_END) != 0) io_error(f.path, "cannot seek");
    impl->files.push_back(f);
  }
  impl->write_headers(impl->m.segments, impl->m.records);
  return StoreWriter(std::move(impl));
}

const StoreLayout& StoreWriter::layout() const { return impl_->m.layout; }
std::size_t StoreWriter::segments_committed() const { return impl_->m.segments; }
std::uint64_t StoreWriter::records_committed() const { return impl_->m.records; }
bool StoreWriter::complete() const { return impl_->m.complete; }
std::uint64_t StoreWriter::checksum() const { return impl_->m.checksum; }

std::pair<std::size_t, std::size_t> StoreWriter::next_head() const {
  const std::size_t s = impl_->m.segments, H = impl_->m.layout.heads;
  return {s / H, s % H};
}

void StoreWriter::begin_head(std::size_t layer, std::size_t head) {
  Impl& w = *impl_;
  w.require_usable();
  if (w.open) throw StoreError("store " + w.dir.string() + ": begin_head while a head is open", "call end_head first");
  if (w.m.complete)
    throw StoreError("store " + w.dir.string() + ": every one of its " + std::to_string(w.m.layout.segments()) +
                         " heads is committed", "a complete store takes no more records; write a new one");
  const auto [nl, nh] = next_head();
  if (layer != nl || head != nh)
    throw StoreError("store " + w.dir.string() + ": the next head is (layer " + std::to_string(nl) + ", head " +
                         std::to_string(nh) + "), not (layer " + std::to_string(layer) + ", head " + std::to_string(head) + ")",
                     "heads are written layer by layer, heads in order inside a layer");
  w.sum_wait();  // nothing is queued between heads; this only makes it explicit
  w.open = true;
  w.next_q = 0;
  w.head_records = 0;
  w.head_checksum = kFnvOffset;
  w.running_checksum = w.m.checksum;
  w.row_end.assign(w.m.layout.geometry.n_q(), 0);
  w.head_r.clear();
}

void StoreWriter::append(const RowChunk& c) {
  Impl& w = *impl_;
  w.require_usable();
  const StoreLayout& L = w.m.layout;
  const Geometry& g = L.geometry;
  const std::size_t k = L.k;
  const std::string where = "store " + w.dir.string() + ", head (layer " + std::to_string(next_head().first) + ", head " +
                            std::to_string(next_head().second) + ")";
  if (!w.open) throw StoreError("store " + w.dir.string() + ": append without begin_head", "call begin_head first");
  if (c.q0 != w.next_q)
    throw StoreError(where + ": chunk starts at query block " + std::to_string(c.q0) + ", expected " + std::to_string(w.next_q),
                     "chunks of a head come in ascending query blocks without gaps");
  if (c.rows > g.n_q() - c.q0)
    throw StoreError(where + ": chunk of " + std::to_string(c.rows) + " rows from " + std::to_string(c.q0) +
                         " runs past n_q = " + std::to_string(g.n_q()), "a head has n_q = ⌈T/b_q⌉ rows");
  if (c.rows > 0 && (!c.indices || !c.mass))
    throw StoreError(where + ": chunk without indices or mass", "pass I's rows and the mass beside each entry");
  if (c.rows > 0 && L.score && !c.score) throw StoreError(where + ": the store keeps scores, the chunk has none", "pass RowChunk::score");
  if (c.rows > 0 && L.value_norm && !c.value_norm)
    throw StoreError(where + ": the store keeps value norms, the chunk has none", "pass RowChunk::value_norm");

  // Validate the whole chunk before writing any of it. The message of a bad entry is built only
  // when it is thrown: a GPU producer appends a few hundred thousand entries per head, and this
  // loop must stay well below the GPU's time per head.
  std::vector<std::int32_t>& r_out = w.r_out;
  std::vector<float>&mass_out = w.mass_out, &score_out = w.score_out, &vn_out = w.vn_out;
  r_out.clear();
  mass_out.clear();
  score_out.clear();
  vn_out.clear();
  r_out.reserve(c.rows * k);
  mass_out.reserve(c.rows * k);
  if (L.score) score_out.reserve(c.rows * k);
  if (L.value_norm) vn_out.reserve(c.rows * k);
  std::vector<std::int64_t> seen;
  seen.reserve(k);
  for (std::size_t i = 0; i < c.rows; ++i) {
    const std::size_t q = c.q0 + i;
    const std::int64_t last = std::int64_t(detail::causal_last_block(g, q));
    seen.clear();
    bool empty_seen = false;
    for (std::size_t j = 0; j < k; ++j) {
      const std::int64_t r = c.indices[i * k + j];
      auto at = [&] { return where + ": I[" + std::to_string(q) + ", " + std::to_string(j) + "] = " + std::to_string(r); };
      if (r == -1) {
        empty_seen = true;
        continue;
      }
      if (r < 0 || r > last)
        throw StoreError(at() + " is not a causally valid key block (0.." + std::to_string(last) + ")",
                         "records must come from a valid index tensor (stream validate_indices)");
      if (empty_seen) throw StoreError(at() + " follows an empty entry", "empty entries (−1) come after the kept blocks");
      if (std::find(seen.begin(), seen.end(), r) != seen.end())
        throw StoreError(at() + " appears twice in the row", "a row keeps each key block once");
      seen.push_back(r);
      r_out.push_back(std::int32_t(r));
      mass_out.push_back(c.mass[i * k + j]);
      if (L.score) score_out.push_back(c.score[i * k + j]);
      if (L.value_norm) vn_out.push_back(c.value_norm[i * k + j]);
    }
  }
  w.write(w.file("key_block.npy"), r_out.data(), r_out.size());
  w.write(w.file("mass.npy"), mass_out.data(), mass_out.size());
  if (L.score) w.write(w.file("score.npy"), score_out.data(), score_out.size());
  if (L.value_norm) w.write(w.file("value_norm.npy"), vn_out.data(), vn_out.size());
  // Row ends, from the row lengths (the validation above counted them in order).
  for (std::size_t i = 0; i < c.rows; ++i) {
    std::size_t len = 0;
    for (std::size_t j = 0; j < k; ++j) len += c.indices[i * k + j] >= 0 ? 1 : 0;
    w.head_records += len;
    w.row_end[c.q0 + i] = w.head_records;
  }
  w.head_r.insert(w.head_r.end(), r_out.begin(), r_out.end());
  w.next_q = c.q0 + c.rows;
  // Checksum over each record's bytes in record order (key block, mass, score, value norm), on
  // the checksum thread, after the chunk is written.
  w.sum_push();
}

void StoreWriter::append_edges(const std::vector<Edge>& edges) {
  const StoreLayout& L = impl_->m.layout;
  const std::size_t n_q = L.geometry.n_q(), k = L.k;
  std::vector<std::int64_t> I(n_q * k, -1);
  std::vector<float> mass(n_q * k, 0.0f), score(n_q * k, 0.0f), vn(n_q * k, 0.0f);
  std::vector<std::size_t> used(n_q, 0);
  std::int64_t prev_q = -1;
  for (const Edge& e : edges) {
    if (e.q < 0 || std::size_t(e.q) >= n_q || e.q < prev_q)
      throw StoreError("store " + impl_->dir.string() + ": edge record with query block " + std::to_string(e.q) +
                           " out of order or outside [0, n_q)", "pass the records of one head in (q, slot) order");
    prev_q = e.q;
    const std::size_t q = std::size_t(e.q);
    if (used[q] >= k || e.slot != std::int64_t(used[q]))
      throw StoreError("store " + impl_->dir.string() + ": query block " + std::to_string(q) + " has a record at slot " +
                           std::to_string(e.slot) + ", expected slot " + std::to_string(used[q]) + " (k = " + std::to_string(k) + ")",
                       "records of a row fill slots 0, 1, … in order");
    const std::size_t at = q * k + used[q]++;
    I[at] = e.r;
    mass[at] = float(e.mass);
    score[at] = float(e.score);
    vn[at] = float(e.value_norm);
  }
  RowChunk c{0, n_q, I.data(), mass.data(), score.data(), vn.data()};
  append(c);
}

void StoreWriter::end_head() {
  Impl& w = *impl_;
  w.require_usable();
  if (!w.open) throw StoreError("store " + w.dir.string() + ": end_head without begin_head", "call begin_head first");
  const Geometry& g = w.m.layout.geometry;
  const std::size_t n_q = g.n_q(), n_k = g.n_k();
  for (std::size_t q = w.next_q; q < n_q; ++q) w.row_end[q] = w.head_records;  // rows never appended: empty
  const std::uint64_t base = w.m.records;

  std::vector<std::int64_t>& ptr = w.ptr;
  ptr.resize(n_q);
  for (std::size_t q = 0; q < n_q; ++q) ptr[q] = std::int64_t(base + w.row_end[q]);
  w.write(w.file("row_ptr.npy"), ptr.data(), ptr.size());

  // Reverse index: count the records per key block, prefix sums, then place each record's query
  // block; rows are visited in ascending q, so every list of readers is ascending.
  std::vector<std::uint64_t>& start = w.start;
  start.assign(n_k + 1, 0);
  for (std::int32_t r : w.head_r) ++start[std::size_t(r) + 1];
  for (std::size_t r = 0; r < n_k; ++r) start[r + 1] += start[r];
  std::vector<std::int64_t>& rev_ptr = w.rev_ptr;
  rev_ptr.resize(n_k);
  for (std::size_t r = 0; r < n_k; ++r) rev_ptr[r] = std::int64_t(base + start[r + 1]);
  std::vector<std::int32_t>& rev_query = w.rev_query;
  rev_query.resize(w.head_r.size());
  std::uint64_t e = 0;
  for (std::size_t q = 0; q < n_q; ++q)
    for (; e < w.row_end[q]; ++e) rev_query[start[std::size_t(w.head_r[e])]++] = std::int32_t(q);
  w.write(w.file("rev_ptr.npy"), rev_ptr.data(), rev_ptr.size());
  w.write(w.file("rev_query.npy"), rev_query.data(), rev_query.size());
  w.sum_wait();
  const std::int64_t seg_sum = std::int64_t(w.head_checksum);
  w.write(w.file("segment_checksum.npy"), &seg_sum, 1);

  // Commit: payloads, then headers, then the manifest (the commit record) replaced atomically.
  detail::Manifest next = w.m;
  next.segments += 1;
  next.records += w.head_records;
  next.checksum = w.running_checksum;
  next.complete = next.segments == next.layout.segments();
  w.write_headers(next.segments, next.records);
  detail::write_manifest(w.dir, next);
  w.m = next;
  w.open = false;
  w.head_r.clear();  // its capacity stays for the next head (see the scratch above)
}

void StoreWriter::close() {
  if (!impl_) return;
  impl_->open = false;
  impl_->close_files();
  impl_->files.clear();
}

}  // namespace flashlab::ref::stream
