/// @file traffic_chapter.hpp
/// @brief The traffic chapter's three levels for one attention shape: the toy tile model's counts
/// × bytes per tile, the reference's counted bytes (attention_traffic.hpp), and the bytes
/// measured on an H100 (L2 requests and DRAM) — live from the CLI with `--device cuda`, else the
/// recorded measurement shipped as lessons/data/traffic-levels/measured.csv.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "flashlab/reference/attention_traffic.hpp"

namespace flashlab::lessons {

/// Parses a shape such as "B=1 N=4096 H=16 d=64 Br=64 Bc=32 fp32" (any order; fp32, bf16 or
/// fp16; "causal" for the causal mask). @throws std::invalid_argument naming the bad word.
ref::AttentionProblem parse_attention_shape(const std::string& text);

/// Bytes one design moved on the GPU, summed over its kernels.
struct MeasuredBytes {
  std::string variant;        ///< naive_fwd, fa1_fwd, fa2_fwd, bwd_two_kernel, bwd_atomic
  std::size_t seq = 0;        ///< N
  double l2_read = 0;         ///< L2 → SM bytes (requests served by L2)
  double l2_write = 0;        ///< SM → L2 bytes (stores)
  double l2_atomic = 0;       ///< bytes of atomic reductions done in L2
  double dram_read = 0;       ///< HBM → L2 bytes
  double dram_write = 0;      ///< L2 → HBM bytes
  /// L2 request bytes: reads + writes + atomics. An atomic add in L2 returns no data: its payload
  /// is already in the writes, so the atomic bytes stand for the read half of the model's
  /// read-modify-write of dQ.
  [[nodiscard]] double l2_total() const { return l2_read + l2_write + l2_atomic; }
  /// DRAM bytes read and written.
  [[nodiscard]] double dram_total() const { return dram_read + dram_write; }
};

/// A measurement: where, when and how it was taken, at which shape (N varies per row).
struct Measurement {
  std::string date;     ///< e.g. 2026-11-23 (empty for a live run: it is now)
  std::string device;   ///< e.g. NVIDIA H100 80GB HBM3
  std::string command;  ///< the command that produced it
  ref::AttentionProblem shape;        ///< B, H, d, Br, Bc, dtype (seq of the first row)
  std::vector<MeasuredBytes> rows;   ///< one per (design, N)
  /// The row of `variant` at `seq`, or nullptr.
  [[nodiscard]] const MeasuredBytes* find(const std::string& variant, std::size_t seq) const;
};

/// The columns of measured.csv, in order.
inline constexpr const char* kMeasuredCsvHeader =
    "date,device,command,variant,batch,seq,heads,head_dim,block_m,block_n,dtype,"
    "l2_read_bytes,l2_write_bytes,l2_atomic_bytes,dram_read_bytes,dram_write_bytes";

/// Parses measured.csv text (kMeasuredCsvHeader, then one row per design and N; every row has
/// the same date, device, command and shape but N). @throws std::invalid_argument with the line.
Measurement parse_measurement_csv(const std::string& text);

/// The measurement shipped with the lessons (lessons/data/traffic-levels/measured.csv).
const Measurement& recorded_measurement();

/// `m` as measured.csv text (what `flashlab traffic levels --device cuda --csv` prints).
std::string measurement_csv(const Measurement& m);

/// The toy tile model's bytes for a design: the tile lessons' transfer counts (fa2-order,
/// fa1-order: Q, K, V, O loads and stores as formulas in n, checked on the tile model) with n
/// query tiles → Tr and n KV tiles → Tc, times the bytes of one tile (Br·d or Bc·d elements).
/// nullopt for designs the tile model has no lesson for (naive, backward).
std::optional<std::uint64_t> toy_tile_bytes(ref::Algorithm v, const ref::AttentionProblem& cfg);

/// The designs of the chapter's table, in order.
std::vector<ref::Algorithm> chapter_variants();

/// The three-level table at `cfg.seq`: per design toy, counted, L2 requests, DRAM and their
/// ratios, with the source of the measurement and why DRAM falls below L2 (once the
/// traffic-levels lesson is passed: `explain`). Rows without a measurement show "—".
std::string traffic_levels_table(const ref::AttentionProblem& cfg, const Measurement* measured, bool explain);

}  // namespace flashlab::lessons
