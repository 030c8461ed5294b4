// The trace store's reader (stream_store.hpp): every column file memory-mapped read-only, and every
// invariant the queries rely on checked once at open — headers, lengths, monotone pointers that
// end at the record count, causally valid key blocks, readers in range — so a truncated or
// hostile store is refused with a message instead of read out of bounds.
#include "stream_store_detail.hpp"

#include "flashlab/reference/npy.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace flashlab::ref::stream {

namespace fs = std::filesystem;

namespace {

constexpr const char* kDamaged = "the store is damaged or was not written by flashlab; trace again into a new store";

/// A read-only mapping of one file.
class Mapping {
 public:
  Mapping() = default;
  explicit Mapping(const fs::path& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      throw StoreError(path.string() + ": cannot open: " + std::strerror(errno),
                       "the store is missing a file; trace again into a new store");
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      throw StoreError(path.string() + ": not a regular file", kDamaged);
    }
    size_ = std::size_t(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) {
        ::close(fd);
        throw StoreError(path.string() + ": cannot map: " + std::strerror(errno), "check the file and free memory");
      }
      data_ = static_cast<const unsigned char*>(p);
    }
    ::close(fd);
  }
  Mapping(Mapping&& o) noexcept : data_(o.data_), size_(o.size_) {
    o.data_ = nullptr;
    o.size_ = 0;
  }
  Mapping& operator=(Mapping&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    return *this;
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (data_) ::munmap(const_cast<unsigned char*>(data_), size_);
  }
  [[nodiscard]] const unsigned char* data() const { return data_; }
  [[nodiscard]] std::size_t size() const { return size_; }

 private:
  const unsigned char* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace

struct Store::Impl {
  fs::path dir;
  detail::Manifest m;
  std::vector<Mapping> maps;
  const std::int64_t* row_ptr = nullptr;
  const std::int32_t* key_block = nullptr;
  const float* mass = nullptr;
  const float* score = nullptr;
  const float* value_norm = nullptr;
  const std::int64_t* rev_ptr = nullptr;
  const std::int32_t* rev_query = nullptr;
  const std::int64_t* seg_checksum = nullptr;
  std::uint64_t bytes = 0;

  // Maps one column, checks its header against the manifest and returns the payload.
  const void* column(const detail::Column& c) {
    const fs::path path = dir / c.file;
    Mapping map(path);
    const std::string name = path.string();
    const std::uint64_t want = detail::column_length(c, m.layout, m.segments, m.records);
    NpyHeader h;
    try {
      h = parse_npy_header(std::string_view(reinterpret_cast<const char*>(map.data()), std::min<std::size_t>(map.size(), 4096)), name);
    } catch (const NpyError& e) {
      throw StoreError(e.what(), kDamaged);
    }
    if (h.descr != c.descr)
      throw StoreError(name + ": dtype " + h.descr + ", expected " + c.descr, kDamaged);
    if (h.shape.size() != 1)
      throw StoreError(name + ": shape " + shape_str(h.shape) + ", expected one dimension", kDamaged);
    if (h.data_offset % 8 != 0) throw StoreError(name + ": payload offset " + std::to_string(h.data_offset) + " is not a multiple of 8", kDamaged);
    // A store being written may have a header (and bytes) ahead of its manifest; never behind.
    if (h.shape[0] < want || (m.complete && h.shape[0] != want))
      throw StoreError(name + ": header says " + std::to_string(h.shape[0]) + " elements, the manifest's " +
                           std::to_string(m.segments) + " committed heads need " + std::to_string(want),
                       kDamaged);
    const std::uint64_t need = h.data_offset + want * c.item;
    if (map.size() < need)
      throw StoreError(name + ": truncated: " + std::to_string(map.size()) + " bytes, " + std::to_string(need) + " needed",
                       kDamaged);
    bytes += map.size();
    const void* payload = map.data() ? map.data() + h.data_offset : nullptr;
    maps.push_back(std::move(map));
    return payload;
  }

  void check_pointers(const std::int64_t* ptr, std::size_t per_segment, const char* file) const {
    const std::uint64_t n = 1 + std::uint64_t(m.segments) * per_segment;
    const std::string name = (dir / file).string();
    if (ptr[0] != 0) throw StoreError(name + ": first pointer is " + std::to_string(ptr[0]) + ", not 0", kDamaged);
    for (std::uint64_t i = 1; i < n; ++i)
      if (ptr[i] < ptr[i - 1])
        throw StoreError(name + ": pointer " + std::to_string(i) + " (" + std::to_string(ptr[i]) + ") is below the one before",
                         kDamaged);
    if (std::uint64_t(ptr[n - 1]) != m.records)
      throw StoreError(name + ": last pointer " + std::to_string(ptr[n - 1]) + " is not the record count " +
                           std::to_string(m.records), kDamaged);
  }
};

Store::Store(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Store::Store(Store&&) noexcept = default;
Store& Store::operator=(Store&&) noexcept = default;
Store::~Store() = default;

Store Store::open(const fs::path& dir) {
  auto impl = std::make_unique<Impl>();
  Impl& s = *impl;
  s.dir = dir;
  s.m = detail::read_manifest(dir);
  const StoreLayout& L = s.m.layout;
  const Geometry& g = L.geometry;
  for (const auto& c : detail::columns(L)) {
    const void* p = s.column(c);
    const std::string f = c.file;
    if (f == "row_ptr.npy") s.row_ptr = static_cast<const std::int64_t*>(p);
    else if (f == "key_block.npy") s.key_block = static_cast<const std::int32_t*>(p);
    else if (f == "mass.npy") s.mass = static_cast<const float*>(p);
    else if (f == "score.npy") s.score = static_cast<const float*>(p);
    else if (f == "value_norm.npy") s.value_norm = static_cast<const float*>(p);
    else if (f == "rev_ptr.npy") s.rev_ptr = static_cast<const std::int64_t*>(p);
    else if (f == "rev_query.npy") s.rev_query = static_cast<const std::int32_t*>(p);
    else if (f == "segment_checksum.npy") s.seg_checksum = static_cast<const std::int64_t*>(p);
  }
  const std::size_t n_q = g.n_q(), n_k = g.n_k();
  s.check_pointers(s.row_ptr, n_q, "row_ptr.npy");
  s.check_pointers(s.rev_ptr, n_k, "rev_ptr.npy");
  const std::string kb = (dir / "key_block.npy").string(), rq = (dir / "rev_query.npy").string();
  for (std::size_t seg = 0; seg < s.m.segments; ++seg) {
    if (s.row_ptr[seg * n_q] != s.rev_ptr[seg * n_k])
      throw StoreError((dir / "rev_ptr.npy").string() + ": head " + std::to_string(seg) + " starts at record " +
                           std::to_string(s.rev_ptr[seg * n_k]) + ", row_ptr.npy says " + std::to_string(s.row_ptr[seg * n_q]),
                       kDamaged);
    for (std::size_t q = 0; q < n_q; ++q) {
      const std::int64_t a = s.row_ptr[seg * n_q + q], b = s.row_ptr[seg * n_q + q + 1];
      if (std::uint64_t(b - a) > L.k)
        throw StoreError((dir / "row_ptr.npy").string() + ": row (head " + std::to_string(seg) + ", q " + std::to_string(q) +
                             ") has " + std::to_string(b - a) + " records, more than k = " + std::to_string(L.k), kDamaged);
      const std::int64_t last = std::int64_t(detail::causal_last_block(g, q));
      for (std::int64_t e = a; e < b; ++e)
        if (s.key_block[e] < 0 || s.key_block[e] > last)
          throw StoreError(kb + ": record " + std::to_string(e) + " (head " + std::to_string(seg) + ", q " + std::to_string(q) +
                               ") has key block " + std::to_string(s.key_block[e]) + ", outside 0.." + std::to_string(last),
                           kDamaged);
    }
  }
  for (std::uint64_t e = 0; e < s.m.records; ++e)
    if (s.rev_query[e] < 0 || std::size_t(s.rev_query[e]) >= n_q)
      throw StoreError(rq + ": entry " + std::to_string(e) + " names query block " + std::to_string(s.rev_query[e]) +
                           ", outside 0.." + std::to_string(n_q - 1), kDamaged);
  return Store(std::move(impl));
}

const StoreLayout& Store::layout() const { return impl_->m.layout; }
const fs::path& Store::dir() const { return impl_->dir; }
std::size_t Store::segments() const { return impl_->m.segments; }
bool Store::complete() const { return impl_->m.complete; }
std::uint64_t Store::records() const { return impl_->m.records; }
std::uint64_t Store::checksum() const { return impl_->m.checksum; }
std::uint64_t Store::segment_checksum(std::size_t segment) const { return std::uint64_t(impl_->seg_checksum[segment]); }
std::uint64_t Store::bytes() const { return impl_->bytes; }

StoreRow Store::row(std::size_t segment, std::size_t q) const {
  const Impl& s = *impl_;
  const std::size_t i = segment * s.m.layout.geometry.n_q() + q;
  const auto a = std::uint64_t(s.row_ptr[i]), b = std::uint64_t(s.row_ptr[i + 1]);
  StoreRow r;
  r.first = a;
  r.size = std::size_t(b - a);
  r.key_block = s.key_block + a;
  r.mass = s.mass + a;
  r.score = s.score ? s.score + a : nullptr;
  r.value_norm = s.value_norm ? s.value_norm + a : nullptr;
  return r;
}

std::span<const std::int32_t> Store::readers(std::size_t segment, std::size_t r) const {
  const Impl& s = *impl_;
  const std::size_t i = segment * s.m.layout.geometry.n_k() + r;
  const auto a = std::uint64_t(s.rev_ptr[i]), b = std::uint64_t(s.rev_ptr[i + 1]);
  return {s.rev_query + a, std::size_t(b - a)};
}

std::string Store::verify() const {
  const Impl& s = *impl_;
  const StoreLayout& L = s.m.layout;
  const std::size_t n_q = L.geometry.n_q(), n_k = L.geometry.n_k();
  std::uint64_t running = kFnvOffset;
  std::vector<std::uint64_t> count(n_k);
  for (std::size_t seg = 0; seg < s.m.segments; ++seg) {
    std::uint64_t h = kFnvOffset;
    const auto first = std::uint64_t(s.row_ptr[seg * n_q]), end = std::uint64_t(s.row_ptr[(seg + 1) * n_q]);
    for (std::uint64_t e = first; e < end; ++e)
      for (std::uint64_t* x : {&h, &running}) {
        *x = fnv1a(*x, s.key_block + e, 4);
        *x = fnv1a(*x, s.mass + e, 4);
        if (s.score) *x = fnv1a(*x, s.score + e, 4);
        if (s.value_norm) *x = fnv1a(*x, s.value_norm + e, 4);
      }
    if (h != std::uint64_t(s.seg_checksum[seg]))
      return "head " + std::to_string(seg) + ": records hash to " + detail::hex64(h) + ", segment_checksum.npy says " +
             detail::hex64(std::uint64_t(s.seg_checksum[seg]));
    // The reverse index must be the transpose of the rows: same counts per key block, and each
    // reader's row must hold the key block.
    std::fill(count.begin(), count.end(), 0);
    for (std::uint64_t e = first; e < end; ++e) ++count[std::size_t(s.key_block[e])];
    for (std::size_t r = 0; r < n_k; ++r) {
      const auto rd = readers(seg, r);
      if (rd.size() != count[r])
        return "head " + std::to_string(seg) + ", key block " + std::to_string(r) + ": " + std::to_string(rd.size()) +
               " readers in the reverse index, " + std::to_string(count[r]) + " in the rows";
      for (std::size_t i = 0; i < rd.size(); ++i) {
        if (i > 0 && rd[i] <= rd[i - 1])
          return "head " + std::to_string(seg) + ", key block " + std::to_string(r) + ": readers not ascending";
        const StoreRow row = this->row(seg, std::size_t(rd[i]));
        if (std::find(row.key_block, row.key_block + row.size, std::int32_t(r)) == row.key_block + row.size)
          return "head " + std::to_string(seg) + ": the reverse index says query block " + std::to_string(rd[i]) +
                 " reads key block " + std::to_string(r) + ", its row does not";
      }
    }
  }
  if (running != s.m.checksum)
    return "records hash to " + detail::hex64(running) + ", manifest.json says " + detail::hex64(s.m.checksum);
  return "";
}

}  // namespace flashlab::ref::stream
