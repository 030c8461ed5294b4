// Planted needles for STREAM (stream_needles.hpp): noise, needle coordinates, the fading lead-in.
#include "flashlab/reference/stream_needles.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

namespace flashlab::ref::stream {

namespace {

/// splitmix64: a counter-based generator, so element i of Q or K depends on (seed, i) alone.
std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// Uniform noise of standard deviation `sd`, U(−sd·√3, sd·√3), in columns `first_col`.. of m
/// (the needles' own columns stay exact, so no needle leaks into another's scores).
void fill_noise(Mat<float>& m, Eigen::Index first_col, std::uint64_t stream, double sd) {
  const double half_width = sd * std::sqrt(3.0);
  m.leftCols(first_col).setZero();
  for (Eigen::Index t = 0; t < m.rows(); ++t)
    for (Eigen::Index c = first_col; c < m.cols(); ++c) {
      const auto i = std::uint64_t(t * m.cols() + c);
      const double u = double(mix(stream ^ mix(i)) >> 11) * 0x1.0p-53;  // [0, 1)
      m(t, c) = float((2 * u - 1) * half_width);
    }
}

/// h(distance) = slope·(n_k + 1 − distance): linear, so two candidates one block apart differ by
/// `slope`, far above the noise part of a score; h ≥ slope over the whole range.
double lead_in_height(const Geometry& g, double slope, std::size_t distance) {
  return slope * (double(g.n_k()) + 1.0 - double(distance));
}

/// x rounded to the nearest bfloat16 (ties to even), as a float; x finite.
float round_to_bf16(float x) {
  std::uint32_t bits = 0;
  std::memcpy(&bits, &x, sizeof bits);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  bits &= 0xffff0000u;
  float y = 0;
  std::memcpy(&y, &bits, sizeof y);
  return y;
}

void check(const NeedleParams& p) {
  const Geometry& g = p.geometry;
  g.check();
  auto bad = [](const std::string& what) { throw StreamError("needles: " + what); };
  if (p.d == 0) bad("d must be at least 1");
  if (p.needle_blocks == 0 || p.needles_per_block == 0) bad("needle_blocks and needles_per_block must be at least 1");
  if (p.sets == 0 || p.set >= p.sets)
    bad("set = " + std::to_string(p.set) + " must lie in [0, sets = " + std::to_string(p.sets) + ")");
  const std::size_t cols = p.set_blocks() * p.needles_per_block * (p.bf16_pairs ? 2 : 1);
  if (cols > p.d)
    bad(std::string(p.bf16_pairs ? "2·" : "") + "needle_blocks·needles_per_block = " + std::to_string(cols) +
        " exceeds d = " + std::to_string(p.d) +
        (p.bf16_pairs ? " (each needle owns two coordinates)" : " (each needle owns one coordinate)"));
  if (p.needles_per_block > g.bq)
    bad("needles_per_block = " + std::to_string(p.needles_per_block) + " exceeds b_q = " + std::to_string(g.bq) +
        " (each needle owns one query token)");
  const std::size_t second_half = g.n_q() - g.n_q() / 2;
  if (p.needle_blocks > second_half)
    bad("needle_blocks = " + std::to_string(p.needle_blocks) + " exceeds the " + std::to_string(second_half) +
        " query blocks of the second half");
  if (!(p.noise >= 0) || !std::isfinite(p.noise)) bad("noise must be finite and ≥ 0");
  if (!(p.slope > 0) || !std::isfinite(p.slope)) bad("slope must be finite and > 0");
}

}  // namespace

NeedleSet make_needles(const NeedleParams& p) {
  check(p);
  const Geometry& g = p.geometry;
  const BlockMask causal(g);
  NeedleSet set;
  set.Q.resize(Eigen::Index(g.T), Eigen::Index(p.d));
  set.K.resize(Eigen::Index(g.T), Eigen::Index(p.d));
  const Eigen::Index per_needle = p.bf16_pairs ? 2 : 1;
  const auto planted_cols = Eigen::Index(p.set_blocks() * p.needles_per_block) * per_needle;
  fill_noise(set.Q, planted_cols, mix(p.seed), p.noise);
  fill_noise(set.K, planted_cols, mix(p.seed + 1), p.noise);

  const std::size_t n_q = g.n_q(), first = n_q / 2, span = n_q - first;
  std::uint64_t draw = mix(p.seed + 2);
  for (std::size_t j = 0; j < p.set_blocks(); ++j) {
    const std::size_t q = first + (p.set + j * p.sets) * span / p.needle_blocks;  // of the whole planting
    // Needles far in the past: distinct blocks in the first half of [0, causal_last(q)].
    const std::size_t range = causal.causal_last(q) / 2 + 1;
    if (range < p.needles_per_block)
      throw StreamError("needles: query block " + std::to_string(q) + " has only " + std::to_string(range) +
                        " key blocks in the first half of its past, fewer than needles_per_block (hint: larger T)");
    std::vector<std::size_t> rs;
    while (rs.size() < p.needles_per_block) {
      draw = mix(draw);
      const std::size_t r = std::size_t(draw % range);
      if (std::find(rs.begin(), rs.end(), r) == rs.end()) rs.push_back(r);
    }
    std::sort(rs.begin(), rs.end());
    for (std::size_t i = 0; i < rs.size(); ++i) {
      const auto c = Eigen::Index(j * p.needles_per_block + i) * per_needle;  // this needle's own coordinate(s)
      for (Eigen::Index e = 0; e < per_needle; ++e) set.Q(Eigen::Index(q * g.bq + i), c + e) += 1.0f;
      const std::size_t r = rs[i], s_first = p.lead_in ? 0 : r;
      for (std::size_t s_blk = s_first; s_blk <= r; ++s_blk) {
        const float h = float(lead_in_height(g, p.slope, r - s_blk));
        const float high = p.bf16_pairs ? round_to_bf16(h) : h, low = h - high;  // high + low = h exactly
        for (std::size_t s = s_blk * g.bk; s < std::min(g.T, (s_blk + 1) * g.bk); ++s) {
          set.K(Eigen::Index(s), c) += high;
          if (p.bf16_pairs) set.K(Eigen::Index(s), c + 1) += low;
        }
      }
      set.needles.push_back(Needle{q, r});
    }
  }
  return set;
}

std::size_t needle_sets_needed(std::size_t d, std::size_t needle_blocks, std::size_t needles_per_block,
                               bool bf16_pairs) {
  const std::size_t per_block = needles_per_block * (bf16_pairs ? 2 : 1);
  if (per_block == 0 || per_block > d) return 0;
  const std::size_t blocks_per_set = d / per_block;
  return (needle_blocks + blocks_per_set - 1) / blocks_per_set;
}

NeedleRecall needle_recall(const std::vector<Needle>& needles, const std::vector<std::int64_t>& indices,
                           std::size_t k) {
  NeedleRecall rec;
  for (const Needle& n : needles) {
    ++rec.planted;
    if (k == 0 || (n.q + 1) * k > indices.size()) continue;  // a row that does not exist finds nothing
    const auto row = indices.begin() + std::ptrdiff_t(n.q * k);
    if (std::find(row, row + std::ptrdiff_t(k), std::int64_t(n.r)) != row + std::ptrdiff_t(k)) ++rec.found;
  }
  return rec;
}

}  // namespace flashlab::ref::stream
