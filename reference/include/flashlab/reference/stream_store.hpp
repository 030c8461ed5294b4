/// @file stream_store.hpp
/// @brief The trace store: STREAM edge records of many layers and heads on disk, written head by
/// head while tracing, read back memory-mapped, and readable with NumPy alone.
///
/// A store is a directory (docs/stream.md, "The trace store", specifies every byte):
///
///     manifest.json    format, version, geometry (T, b_q, b_k, n_q, n_k, k), layers, heads,
///                      columns, committed segments and records, checksums
///     row_ptr.npy      int64 [1 + S·n_q]   CSR row pointers: records of (segment s, query block q)
///                                          are row_ptr[s·n_q + q] .. row_ptr[s·n_q + q + 1]
///     key_block.npy    int32 [N]           key block r of each record (slot order inside a row)
///     mass.npy         float32 [N]         w (ii): Σ_{t∈q} Σ_{s∈r} p_{t,s}
///     score.npy        float32 [N]         w (i), when the store keeps scores
///     value_norm.npy   float32 [N]         w (iii), when the store keeps value norms
///     rev_ptr.npy      int64 [1 + S·n_k]   the reverse index (CSC): readers of (s, key block r) are
///     rev_query.npy    int32 [N]           rev_query[rev_ptr[s·n_k + r] .. rev_ptr[s·n_k + r + 1]], ascending
///
/// A segment is one (layer, head); segment s = layer·heads + head, written in that fixed order, so
/// the bytes of a store depend only on the records, never on how a producer scheduled its work.
/// Every `.npy` file has a 128-byte header whose shape is rewritten in place when a head is
/// committed, so NumPy reads the committed part of a store that is still being written.
///
/// Writing is append-only and crash-tolerant: a head's records go to the column files as they
/// arrive (`append`), and `end_head` writes the head's row pointers and reverse index, updates the
/// headers and then replaces `manifest.json` atomically (write + rename). The manifest is the
/// commit record: `StoreWriter::reopen` truncates whatever a killed writer left after the last
/// committed head and continues with the next one.
#pragma once

#include "flashlab/reference/stream.hpp"

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace flashlab::ref::stream {

/// A store that cannot be created, appended to or read; the message names the file and what is
/// wrong, `hint()` says what to do.
class StoreError : public StreamError {
 public:
  /// `what` names the file (or parameter) and the problem; `hint` a remedy.
  StoreError(const std::string& what, std::string hint = {}) : StreamError(what), hint_(std::move(hint)) {}
  /// What to do about it (may be empty).
  [[nodiscard]] const std::string& hint() const { return hint_; }

 private:
  std::string hint_;
};

/// The store format this build writes and reads (manifest "version").
inline constexpr std::uint32_t kStoreVersion = 1;
/// The manifest's "format" string.
inline constexpr const char* kStoreFormat = "flashlab-stream-store";
/// Bytes before the payload of every column file (magic, version, header length, padded dict).
inline constexpr std::size_t kStoreHeaderBytes = 128;

/// Limits a store must respect (checked when created and when opened).
struct StoreLimits {
  static constexpr std::uint64_t max_T = (1ull << 31) - 1;      ///< tokens (key blocks and query blocks are int32)
  static constexpr std::uint64_t max_k = 65536;                 ///< records per row
  static constexpr std::uint64_t max_segments = 65536;         ///< layers · heads
  static constexpr std::uint64_t max_manifest_bytes = 16ull << 20;  ///< manifest.json size
};

/// What a store holds: the block geometry, k, how many layers and heads, and which optional
/// weight columns are kept.
struct StoreLayout {
  Geometry geometry;            ///< T, b_q, b_k of every head
  std::size_t k = 0;            ///< columns of I: at most k records per (segment, query block)
  std::size_t layers = 1;       ///< layers traced
  std::size_t heads = 1;        ///< heads per layer
  std::size_t d = 0;            ///< head dim of the traced inputs (information only; 0 = unknown)
  bool score = false;           ///< keep w (i), the representative score, per record
  bool value_norm = false;      ///< keep w (iii), the value summary's norm, per record
  std::string source;           ///< free text: how the inputs were made (shown by the viewer)

  /// layers · heads.
  [[nodiscard]] std::size_t segments() const { return layers * heads; }
  /// The segment index of (layer, head): layer·heads + head.
  [[nodiscard]] std::size_t segment(std::size_t layer, std::size_t head) const { return layer * heads + head; }
  /// Throws StoreError (naming the field) unless every field is within StoreLimits.
  void check() const;
};

/// One chunk of a head's records in the index-tensor form a producer has them: `rows` query
/// blocks starting at `q0`, each a row of k entries of I (−1 = empty, empties after the kept
/// blocks) with a weight beside each entry. A GPU producer hands over whatever chunk of query
/// blocks it downloaded; chunks of one head come in ascending q without gaps.
struct RowChunk {
  std::size_t q0 = 0;                   ///< first query block of the chunk
  std::size_t rows = 0;                 ///< query blocks in the chunk
  const std::int64_t* indices = nullptr;  ///< rows × k entries of I
  const float* mass = nullptr;          ///< rows × k, w (ii) beside each entry (read where the entry is ≥ 0)
  const float* score = nullptr;         ///< rows × k, w (i); required when the store keeps scores
  const float* value_norm = nullptr;    ///< rows × k, w (iii); required when the store keeps value norms
};

/// Writes a store head by head in the fixed segment order. Not thread-safe: one producer. The
/// checksum chain runs on a thread of the writer's own, chunk after chunk in append order, while
/// the caller's thread validates and writes the next chunk; end_head() waits for it (the bytes
/// and checksums are those of one thread).
class StoreWriter {
 public:
  /// Creates the store in `dir` (made if missing; StoreError if it already holds a manifest or
  /// any of the store's files, so nothing is overwritten by accident).
  static StoreWriter create(const std::filesystem::path& dir, const StoreLayout& layout);
  /// Reopens an existing store to continue after its last committed head; anything a writer
  /// left beyond that is truncated. StoreError when the store is malformed.
  static StoreWriter reopen(const std::filesystem::path& dir);

  StoreWriter(StoreWriter&&) noexcept;             ///< moves the open files
  StoreWriter& operator=(StoreWriter&&) noexcept;  ///< moves the open files
  ~StoreWriter();  ///< closes the files; an open head is dropped (not committed)

  /// The layout the store was created with.
  [[nodiscard]] const StoreLayout& layout() const;
  /// Segments (heads) committed so far.
  [[nodiscard]] std::size_t segments_committed() const;
  /// Records committed so far.
  [[nodiscard]] std::uint64_t records_committed() const;
  /// True when every segment is committed.
  [[nodiscard]] bool complete() const;
  /// The (layer, head) the next begin_head must name.
  [[nodiscard]] std::pair<std::size_t, std::size_t> next_head() const;
  /// FNV-1a 64 over every committed record (key block, then each weight column, little-endian).
  [[nodiscard]] std::uint64_t checksum() const;

  /// Starts the next head; StoreError unless (layer, head) is next_head() and no head is open.
  void begin_head(std::size_t layer, std::size_t head);
  /// Appends the next chunk of the open head. Validated before anything is written: q0 follows
  /// the previous chunk, every entry is −1 or a causally valid key block of its row, no duplicates,
  /// empties last, and the weight columns the store keeps are given.
  void append(const RowChunk& chunk);
  /// Appends a whole head's edge records as stream_apply returns them ((q, slot) order).
  void append_edges(const std::vector<Edge>& edges);
  /// Commits the open head: rows not appended are empty; writes its row pointers and reverse
  /// index, updates the headers and the manifest.
  void end_head();
  /// Commits nothing more and closes the files (also done by the destructor); idempotent.
  void close();

 private:
  struct Impl;
  explicit StoreWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// One row of a store: the records of (segment, query block q), in slot order.
struct StoreRow {
  std::uint64_t first = 0;                ///< index of the row's first record
  std::size_t size = 0;                   ///< records in the row (≤ k)
  const std::int32_t* key_block = nullptr;  ///< size key blocks
  const float* mass = nullptr;            ///< size masses
  const float* score = nullptr;           ///< size scores, or nullptr when not stored
  const float* value_norm = nullptr;      ///< size value norms, or nullptr when not stored
};

/// A store opened for reading: its files memory-mapped (nothing of size N is copied) and every
/// structural invariant checked once, so the queries can trust it.
class Store {
 public:
  /// Opens and validates `dir`: manifest fields and limits, every column's `.npy` header and
  /// size, row and reverse pointers monotone and consistent, key blocks causally valid, readers in
  /// range. StoreError naming the file and the problem (with a hint) otherwise. A store still being
  /// written is read up to its last committed head.
  static Store open(const std::filesystem::path& dir);

  Store(Store&&) noexcept;             ///< moves the mappings
  Store& operator=(Store&&) noexcept;  ///< moves the mappings
  ~Store();                            ///< unmaps the files

  /// The layout from the manifest.
  [[nodiscard]] const StoreLayout& layout() const;
  /// The directory it was opened from.
  [[nodiscard]] const std::filesystem::path& dir() const;
  /// Committed segments (every one when complete()).
  [[nodiscard]] std::size_t segments() const;
  /// True when every segment is committed.
  [[nodiscard]] bool complete() const;
  /// Committed records.
  [[nodiscard]] std::uint64_t records() const;
  /// The manifest's checksum over every committed record.
  [[nodiscard]] std::uint64_t checksum() const;
  /// The manifest's checksum of one segment.
  [[nodiscard]] std::uint64_t segment_checksum(std::size_t segment) const;
  /// Bytes of the store's files (what is mapped).
  [[nodiscard]] std::uint64_t bytes() const;

  /// The records of (segment, q); segment < segments(), q < n_q (not checked: callers index
  /// within the layout).
  [[nodiscard]] StoreRow row(std::size_t segment, std::size_t q) const;
  /// The query blocks of `segment` whose rows hold key block r, ascending.
  [[nodiscard]] std::span<const std::int32_t> readers(std::size_t segment, std::size_t r) const;
  /// Reads all committed records again: recomputes every checksum and the reverse index and
  /// compares them with the files. Returns "" when all agree, else the first difference.
  [[nodiscard]] std::string verify() const;

 private:
  struct Impl;
  explicit Store(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// FNV-1a 64 continued over `bytes` (start with kFnvOffset).
std::uint64_t fnv1a(std::uint64_t state, const void* bytes, std::size_t n);
/// The FNV-1a 64 offset basis, the checksum of nothing.
inline constexpr std::uint64_t kFnvOffset = 0xcbf29ce484222325ull;
/// The FNV-1a 64 prime (each byte: state = (state xor byte) · prime).
inline constexpr std::uint64_t kFnvPrime = 0x100000001b3ull;

}  // namespace flashlab::ref::stream
