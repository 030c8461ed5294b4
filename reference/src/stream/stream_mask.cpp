// STREAM block geometry and the bit-packed block mask C_blk (the STREAM paper, §2, §5).
//
// C_blk[q, r] = causal(q, r) ∧ user[q, r]. The causal half is arithmetic (one comparison), so a
// causal-only run stores nothing of size n_q × n_k; the user half is one bit per block pair,
// 64 per word, and the two queries the estimator needs — "any valid r in [a, b]" and "the first
// valid r in [a, b]" — are fixed-order word scans, as §5 describes for the kernel.
#include "flashlab/reference/memory_budget.hpp"
#include "flashlab/reference/npy.hpp"
#include "flashlab/reference/stream.hpp"
#include "flashlab/reference/input_file.hpp"

#include <algorithm>
#include <bit>
#include <fstream>
#include <sstream>

namespace flashlab::ref::stream {

std::size_t ceil_log2(std::size_t n) {
  std::size_t bits = 0;
  while ((std::size_t{1} << bits) < n) ++bits;
  return bits;
}

void Geometry::check() const {
  // Far above any run (the CLI takes T ≤ 2^24); keeps T + b_q − 1 and n_q·b_q far from overflow.
  constexpr std::size_t kMax = std::size_t{1} << 40;
  if (T > kMax || bq > kMax || bk > kMax) throw StreamError("T, b_q and b_k must each be at most 2^40");
  if (T == 0) throw StreamError("sequence length T must be at least 1");
  if (bq == 0) throw StreamError("query-block size b_q must be at least 1");
  if (bk == 0) throw StreamError("key-block size b_k must be at least 1");
}

std::size_t Geometry::q_rows(std::size_t q) const { return std::min(bq, T - q * bq); }
std::size_t Geometry::k_rows(std::size_t r) const { return std::min(bk, T - r * bk); }

BlockMask::BlockMask(Geometry g) : g_(g) { g_.check(); }

BlockMask::BlockMask(Geometry g, const std::vector<std::uint8_t>& user) : g_(g) {
  g_.check();
  const std::size_t nq = g_.n_q(), nk = g_.n_k();
  if (user.size() != nq * nk) {
    throw StreamError("user block mask has " + std::to_string(user.size()) + " entries, expected n_q·n_k = " +
                      std::to_string(nq) + "·" + std::to_string(nk));
  }
  words_per_row_ = (nk + 63) / 64;
  bits_.assign(nq * words_per_row_, 0);
  for (std::size_t q = 0; q < nq; ++q) {
    for (std::size_t r = 0; r < nk; ++r) {
      const std::uint8_t v = user[q * nk + r];
      if (v > 1) {
        throw StreamError("user block mask entry [" + std::to_string(q) + ", " + std::to_string(r) + "] is " +
                          std::to_string(int(v)) + ", expected 0 or 1");
      }
      if (v) bits_[q * words_per_row_ + r / 64] |= std::uint64_t{1} << (r % 64);
    }
  }
}

std::size_t BlockMask::causal_last(std::size_t q) const {
  // The last token of block q that exists is min(T−1, (q+1)b_q − 1); key block r has a causal
  // pair with it iff its first token r·b_k is ≤ that token.
  const std::size_t last_t = std::min(g_.T - 1, (q + 1) * g_.bq - 1);
  return last_t / g_.bk;
}

bool BlockMask::user_bit(std::size_t q, std::size_t r) const {
  if (bits_.empty()) return true;
  return (bits_[q * words_per_row_ + r / 64] >> (r % 64)) & 1u;
}

bool BlockMask::valid(std::size_t q, std::size_t r) const {
  if (q >= g_.n_q() || r >= g_.n_k()) return false;
  return r <= causal_last(q) && user_bit(q, r);
}

std::int64_t BlockMask::first_valid(std::size_t q, std::size_t a, std::size_t b, std::uint64_t* words) const {
  if (q >= g_.n_q()) return -1;
  b = std::min(b, causal_last(q));
  if (a > b) return -1;
  if (bits_.empty()) return static_cast<std::int64_t>(a);  // causal only: every r ≤ causal_last is valid
  // Fixed-order scan of the packed row, lowest word first (§5: "a fixed-order scan for the first
  // set bit"); the first and last words are masked to [a, b].
  const std::uint64_t* row = bits_.data() + q * words_per_row_;
  for (std::size_t w = a / 64; w <= b / 64; ++w) {
    std::uint64_t bits = row[w];
    if (words) ++*words;
    if (w == a / 64) bits &= ~std::uint64_t{0} << (a % 64);
    if (w == b / 64 && b % 64 != 63) bits &= (std::uint64_t{1} << (b % 64 + 1)) - 1;
    if (bits) return static_cast<std::int64_t>(w * 64 + std::size_t(std::countr_zero(bits)));
  }
  return -1;
}

std::int64_t BlockMask::last_valid(std::size_t q, std::size_t a, std::size_t b, std::uint64_t* words) const {
  if (q >= g_.n_q()) return -1;
  b = std::min(b, causal_last(q));
  if (a > b) return -1;
  if (bits_.empty()) return static_cast<std::int64_t>(b);
  const std::uint64_t* row = bits_.data() + q * words_per_row_;
  for (std::size_t w = b / 64 + 1; w-- > a / 64;) {
    std::uint64_t bits = row[w];
    if (words) ++*words;
    if (w == a / 64) bits &= ~std::uint64_t{0} << (a % 64);
    if (w == b / 64 && b % 64 != 63) bits &= (std::uint64_t{1} << (b % 64 + 1)) - 1;
    if (bits) return static_cast<std::int64_t>(w * 64 + 63 - std::size_t(std::countl_zero(bits)));
  }
  return -1;
}

std::size_t BlockMask::count_valid(std::size_t q) const {
  if (q >= g_.n_q()) return 0;
  const std::size_t last = causal_last(q);
  if (bits_.empty()) return last + 1;
  std::size_t n = 0;
  for (std::size_t r = 0; r <= last; ++r) n += user_bit(q, r) ? 1 : 0;
  return n;
}

bool BlockMask::token_valid(std::size_t t, std::size_t s) const {
  if (t >= g_.T || s >= g_.T || s > t) return false;
  return user_bit(t / g_.bq, s / g_.bk);
}

namespace {

[[noreturn]] void mask_fail(const std::string& name, const std::string& where, const std::string& what) {
  throw StreamError(name + (where.empty() ? "" : ":" + where) + ": " + what);
}

std::string geometry_str(Geometry g) {
  std::ostringstream s;
  s << "(" << g.n_q() << ", " << g.n_k() << ") for T=" << g.T << ", b_q=" << g.bq << ", b_k=" << g.bk;
  return s.str();
}

// n_q·n_k user entries (one byte each while read) plus the packed bits, checked before any
// allocation: a mask for T = 2^24 with one-token blocks would need 2^48 entries.
std::uint64_t mask_entries(Geometry g, const std::string& name, std::uint64_t max_bytes) {
  const auto entries = checked_mul(g.n_q(), g.n_k());
  const auto words = checked_mul(g.n_q(), (g.n_k() + 63) / 64);
  const auto bits_bytes = words ? checked_mul(*words, 8) : std::nullopt;
  const auto total = entries && bits_bytes ? checked_add(*entries, *bits_bytes) : std::nullopt;
  if (!total) mask_fail(name, "", "a block mask of shape " + geometry_str(g) + " has more than 2^64 entries");
  try {
    require_within_limit("a block mask of shape " + geometry_str(g), *total, max_bytes);
  } catch (const MemoryLimitError& e) {
    mask_fail(name, "", e.what());
  }
  return *entries;
}

BlockMask mask_from_npy(const NpyArray& a, const std::string& name, Geometry g) {
  const std::size_t nk = g.n_k();
  if (a.descr != "|u1" && a.descr != "|b1" && a.descr != "<i4" && a.descr != "<i8") {
    mask_fail(name, "", "block mask has dtype " + a.descr + "; expected uint8 or bool (|u1, |b1), or int32/int64");
  }
  if (a.shape != std::vector<std::size_t>{g.n_q(), nk}) {
    mask_fail(name, "", "block mask has shape " + shape_str(a.shape) + "; expected [n_q, n_k] = " + geometry_str(g));
  }
  const auto v = a.as_int64();
  std::vector<std::uint8_t> user(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (v[i] != 0 && v[i] != 1) {
      mask_fail(name, "", "entry [" + std::to_string(i / nk) + ", " + std::to_string(i % nk) + "] is " +
                              std::to_string(v[i]) + "; block mask entries must be 0 or 1");
    }
    user[i] = static_cast<std::uint8_t>(v[i]);
  }
  return BlockMask(g, user);
}

// The shape check before the payload is read: a wrong shape is named without reading a byte more.
void check_npy_mask_header(const NpyHeader& h, const std::string& name, Geometry g) {
  if (h.shape != std::vector<std::size_t>{g.n_q(), g.n_k()})
    mask_fail(name, "", "block mask has shape " + shape_str(h.shape) + "; expected [n_q, n_k] = " + geometry_str(g));
}

BlockMask parse_text_mask(std::string_view text, const std::string& name, Geometry g, std::uint64_t entries) {
  const std::size_t nq = g.n_q(), nk = g.n_k();
  // The text is in memory already (within the limit); n_q·n_k may be far larger than a short file.
  std::vector<std::uint8_t> user;
  user.reserve(std::size_t(std::min<std::uint64_t>(entries, text.size())));
  std::size_t line_no = 0, rows = 0, pos = 0;
  while (pos < text.size()) {
    const std::size_t eol = std::min(text.find('\n', pos), text.size());
    std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || line[0] == '#') continue;
    if (rows == nq) {
      mask_fail(name, std::to_string(line_no) + ":1",
                "extra row: the block mask must have exactly n_q = " + std::to_string(nq) + " rows");
    }
    for (std::size_t c = 0; c < line.size(); ++c) {
      if (line[c] != '0' && line[c] != '1') {
        const unsigned char ch = static_cast<unsigned char>(line[c]);
        std::ostringstream what;
        what << "unexpected character ";
        if (ch >= 0x20 && ch < 0x7f) what << "'" << line[c] << "'";
        else what << "byte 0x" << std::hex << int(ch);
        what << "; rows are strings of '0' and '1'";
        mask_fail(name, std::to_string(line_no) + ":" + std::to_string(c + 1), what.str());
      }
    }
    if (line.size() != nk) {
      mask_fail(name, std::to_string(line_no) + ":" + std::to_string(std::min(line.size(), nk) + 1),
                "row " + std::to_string(rows) + " has " + std::to_string(line.size()) + " columns; expected n_k = " +
                    std::to_string(nk));
    }
    for (char ch : line) user.push_back(ch == '1' ? 1 : 0);
    ++rows;
  }
  if (rows != nq) {
    mask_fail(name, std::to_string(line_no + 1) + ":1",
              "block mask has " + std::to_string(rows) + " rows; expected n_q = " + std::to_string(nq));
  }
  return BlockMask(g, user);
}

}  // namespace

BlockMask parse_block_mask(std::string_view bytes, const std::string& name, bool npy, Geometry g,
                           std::uint64_t max_bytes) {
  g.check();
  const std::uint64_t entries = mask_entries(g, name, max_bytes);
  if (!npy) return parse_text_mask(bytes, name, g, entries);
  NpyArray a;
  try {
    check_npy_mask_header(parse_npy_header(bytes, name), name, g);
    a = parse_npy(bytes, name, max_bytes);
  } catch (const NpyError& e) {
    throw StreamError(std::string("block mask: ") + e.what());
  }
  return mask_from_npy(a, name, g);
}

BlockMask load_block_mask(const std::filesystem::path& path, Geometry g, std::uint64_t max_bytes) {
  g.check();
  const std::string name = path.string();
  const std::uint64_t entries = mask_entries(g, name, max_bytes);
  if (path.extension() == ".npy") {
    NpyArray a;
    try {
      check_npy_mask_header(read_npy_header(path), name, g);
      a = read_npy(path, max_bytes);
    } catch (const NpyError& e) {
      throw StreamError(std::string("block mask: ") + e.what());
    }
    return mask_from_npy(a, name, g);
  }
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) mask_fail(name, "", "is a directory, not a block mask");
  if (std::filesystem::is_regular_file(path, ec)) {
    const auto size = std::filesystem::file_size(path, ec);
    try {
      if (!ec) require_within_limit("text block mask of " + std::to_string(size) + " bytes", size, max_bytes);
    } catch (const MemoryLimitError& e) {
      mask_fail(name, "", e.what());
    }
  }
  std::string text;
  try {
    // Pipes and devices too, bounded by the same limit in bytes and by the reader's time limit.
    InputLimits limits;
    limits.max_bytes = max_bytes;
    text = read_input_file(name, "block mask", limits);
  } catch (const InputFileError& e) {
    mask_fail(name, "", e.reason());
  }
  return parse_text_mask(text, name, g, entries);
}

BlockMask load_block_mask(const std::filesystem::path& path, Geometry g) {
  std::uint64_t limit = 0;
  try {
    limit = memory_limit_from_env();
  } catch (const MemoryLimitError& e) {
    mask_fail(path.string(), "", e.what());
  }
  return load_block_mask(path, g, limit);
}

std::uint64_t indices_checksum(const std::vector<std::int64_t>& indices) {
  std::uint64_t h = 1469598103934665603ull;
  for (std::int64_t v : indices) {
    auto u = static_cast<std::uint64_t>(v);
    for (int i = 0; i < 8; ++i) {
      h ^= (u >> (8 * i)) & 0xffu;
      h *= 1099511628211ull;
    }
  }
  return h;
}

}  // namespace flashlab::ref::stream
