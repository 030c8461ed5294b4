// Helpers for the trace-store tests: synthetic records (valid index rows with random weights),
// traced heads, and file surgery for the hostile-store tests.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "flashlab/reference/stream.hpp"
#include "flashlab/reference/stream_fidelity.hpp"
#include "flashlab/reference/stream_store.hpp"

namespace flashlab::test::stream {

/// One head's records in index-tensor form.
struct HeadRecords {
  std::vector<std::int64_t> I;   ///< n_q × k, −1 = empty (after the kept ones)
  std::vector<float> mass, score, value_norm;  ///< n_q × k
};

/// Random valid rows: each query block keeps a random number (0..k) of distinct causally valid
/// key blocks; masses are drawn from a few values so ties happen.
inline HeadRecords random_records(const ref::stream::Geometry& g, std::size_t k, unsigned seed) {
  std::mt19937_64 rng(seed);
  HeadRecords h;
  const std::size_t n_q = g.n_q();
  h.I.assign(n_q * k, -1);
  h.mass.assign(n_q * k, 0.0f);
  h.score.assign(n_q * k, 0.0f);
  h.value_norm.assign(n_q * k, 0.0f);
  for (std::size_t q = 0; q < n_q; ++q) {
    const std::size_t last = std::min(g.T - 1, (q + 1) * g.bq - 1) / g.bk;
    std::vector<std::int64_t> blocks(last + 1);
    for (std::size_t r = 0; r <= last; ++r) blocks[r] = std::int64_t(r);
    std::shuffle(blocks.begin(), blocks.end(), rng);
    const std::size_t n = std::uniform_int_distribution<std::size_t>(0, std::min(k, blocks.size()))(rng);
    for (std::size_t j = 0; j < n; ++j) {
      h.I[q * k + j] = blocks[j];
      h.mass[q * k + j] = float(std::uniform_int_distribution<int>(0, 8)(rng)) * 0.125f * float(g.q_rows(q)) / float(k);
      h.score[q * k + j] = float(std::normal_distribution<double>(0, 1)(rng));
      h.value_norm[q * k + j] = float(std::uniform_real_distribution<double>(0, 2)(rng));
    }
  }
  return h;
}

/// The records of a head traced by the reference: estimate with k, apply with edge records.
inline std::vector<ref::stream::Edge> trace_head(const ref::stream::WorkloadInputs& in, const ref::stream::Geometry& g,
                                                 std::size_t k) {
  const ref::stream::BlockMask mask(g);
  const auto est = ref::stream::stream_estimate(in.Q, in.K, mask, ref::stream::EstimateParams{k, 1});
  return ref::stream::stream_apply(in.Q, in.K, in.V, mask, est.indices, k, 1, true).edges;
}

/// Appends `h` to the writer's open head in chunks of `chunk` rows.
inline void append_chunks(ref::stream::StoreWriter& w, const HeadRecords& h, std::size_t chunk) {
  const std::size_t n_q = w.layout().geometry.n_q(), k = w.layout().k;
  for (std::size_t q0 = 0; q0 < n_q; q0 += chunk) {
    const std::size_t rows = std::min(chunk, n_q - q0);
    ref::stream::RowChunk c{q0, rows, h.I.data() + q0 * k, h.mass.data() + q0 * k, h.score.data() + q0 * k,
                            h.value_norm.data() + q0 * k};
    w.append(c);
  }
}

/// Whole file as bytes.
inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// Writes `bytes` as the whole file.
inline void spit(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << bytes;
}

/// A fresh empty directory under the system temp dir, removed when the test program exits.
inline std::filesystem::path fresh_dir(const std::string& tag) {
  struct Made {
    std::vector<std::filesystem::path> dirs;
    ~Made() {
      std::error_code ec;
      for (const auto& d : dirs) std::filesystem::remove_all(d, ec);
    }
  };
  static Made made;
  const auto p = std::filesystem::temp_directory_path() /
                 ("flashlab_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(made.dirs.size()));
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  made.dirs.push_back(p);
  return p;
}

}  // namespace flashlab::test::stream
