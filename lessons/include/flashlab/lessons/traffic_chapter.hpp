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
#include "flashlab/reference/context_parallel.hpp"
#include "flashlab/reference/tensor.hpp"

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

/// One pass of a kernel family beyond the clear attention designs at the chapter's shape for that
/// family: the bytes the reference counts and the bytes measured for its CUDA kernels (attention:
/// the fast 16-bit kernels; MTA, STREAM: their clear fp32 kernels).
struct FamilyBytes {
  std::string family;          ///< attention | mta | stream
  std::string pass;            ///< attention: fwd (grouped K/V), decode; mta: fwd, bwd, infer; stream: estimate, apply
  std::string shape;           ///< the shape in words, e.g. "B=1 N=2048 H=16 d=64 W=3x3 block=64 splits=8 fp32"
  double counted_read = 0;     ///< the reference's read bytes (MTA: closed form, equal to its loops)
  double counted_write = 0;    ///< the reference's written bytes
  double l2_read = 0;          ///< L2 → SM bytes
  double l2_write = 0;         ///< SM → L2 bytes
  double l2_atomic = 0;        ///< bytes of atomic reductions in L2
  double dram_read = 0;        ///< HBM → L2 bytes
  double dram_write = 0;       ///< L2 → HBM bytes
  double duration_ms = 0;      ///< the kernels' time under the profiler (one launch each)
  /// Counted bytes read and written.
  [[nodiscard]] double counted_total() const { return counted_read + counted_write; }
  /// L2 request bytes: reads + writes + atomics (as MeasuredBytes::l2_total()).
  [[nodiscard]] double l2_total() const { return l2_read + l2_write + l2_atomic; }
  /// DRAM bytes read and written.
  [[nodiscard]] double dram_total() const { return dram_read + dram_write; }
};

/// A measurement of the other families: where, when and how, and one row per (family, pass).
struct FamilyMeasurement {
  std::string date;              ///< e.g. 2026-11-27 (a live run: today)
  std::string device;            ///< the GPU
  std::string command;           ///< the command that produced it
  std::vector<FamilyBytes> rows;  ///< one per (family, pass)
};

/// The columns of measured_families.csv, in order.
inline constexpr const char* kFamiliesCsvHeader =
    "date,device,command,family,pass,shape,counted_read_bytes,counted_write_bytes,l2_read_bytes,l2_write_bytes,"
    "l2_atomic_bytes,dram_read_bytes,dram_write_bytes,duration_ms";

/// Parses measured_families.csv text (kFamiliesCsvHeader, then one row per pass; every row has
/// the same date, device and command). @throws std::invalid_argument with the line.
FamilyMeasurement parse_family_csv(const std::string& text);

/// `m` as measured_families.csv text.
std::string family_csv(const FamilyMeasurement& m);

/// The measurement of the other families shipped with the lessons
/// (lessons/data/traffic-levels/measured_families.csv).
const FamilyMeasurement& recorded_family_measurement();

/// One pass of the context-parallel ring measured on G GPUs: the bytes one GPU handed to NCCL
/// beside the model's, and the times (`flashlab traffic ring`, recorded or with --device cuda).
struct RingMeasured {
  std::string date;                     ///< UTC, YYYY-MM-DD HH:MM
  std::string device;                   ///< the GPUs' name
  ref::ContextParallelProblem problem;  ///< G, layout, B, N, H, H_kv, d, causal, dtype
  std::string pass;                     ///< "fwd" or "bwd"
  double ring_ms = 0;                   ///< median of the slowest rank's whole ring
  double model_bytes = 0;               ///< bytes one GPU sends in the pass, by the model
  double counted_bytes = 0;             ///< bytes one GPU handed to NCCL (the largest over ranks)
  double max_exchange_ms = 0;           ///< the longest exchange
  double max_step_compute_ms = 0;       ///< the longest step's compute
  double exposed_ms = 0;                ///< the slowest rank's ring less its steps' compute
};

/// The columns of the ring's measured.csv, in order.
inline constexpr const char* kRingCsvHeader =
    "date,device,gpus,layout,causal,N,B,H,H_kv,d,dtype,pass,ring_ms,model_bytes_per_gpu,counted_bytes_per_gpu,"
    "max_exchange_ms,max_step_compute_ms,exposed_ms";

/// Parses the ring's measured.csv text (kRingCsvHeader, then one row per shape and pass).
/// @throws std::invalid_argument with the line.
std::vector<RingMeasured> parse_ring_csv(const std::string& text);

/// `rows` as the ring's measured.csv text.
std::string ring_csv(const std::vector<RingMeasured>& rows);

/// The ring's measurements shipped with the lessons (lessons/data/traffic-ring/measured.csv).
const std::vector<RingMeasured>& recorded_ring_measurements();

/// The last of `rows` whose problem is `p` (G, layout, B, N, H, H_kv, d, causal, dtype) and whose
/// pass is `pass`, or nullptr.
const RingMeasured* find_ring_measurement(const std::vector<RingMeasured>& rows, const ref::ContextParallelProblem& p,
                                          const std::string& pass);

/// The traffic-gqa lesson's shape (its `shape:` line): a grouped K/V forward, H = 32, H_kv = 8.
ref::AttentionProblem gqa_chapter_problem();

/// The traffic-decode lesson's shape: one decode step, N = 1 against N_k = 131072 keys, GQA.
ref::AttentionProblem decode_chapter_problem();

/// The attention rows' counted bytes (the FA2 model, attention_traffic.hpp): "fwd" at `fwd` with
/// K_j, V_j loaded once per query head, as flashlab's fast forward loads them (through L2), and
/// "decode" at `decode` with K_j, V_j loaded once per group of query heads, as its split-key
/// decode does; the measured fields zero.
std::vector<FamilyBytes> attention_counted_rows(const ref::AttentionProblem& fwd, const ref::AttentionProblem& decode);

/// The chapter's MTA shape and parameters (the defaults of `flashlab traffic mta`).
struct MtaChapterShape {
  ref::Shape shape{1, 2048, 16, 64};  ///< B, N, H, d
  std::size_t cq = 3;      ///< kernel rows
  std::size_t ck = 3;      ///< kernel columns
  std::size_t block = 64;  ///< the loaded tile size B
  std::size_t splits = 8;  ///< key splits of the inference pass
  /// In words, as FamilyBytes::shape.
  [[nodiscard]] std::string str() const;
};

/// The chapter's STREAM shape: T, d, H, b_q, b_k, k and the seed of its N(0, 1) inputs.
struct StreamChapterShape {
  std::size_t T = 32768;   ///< tokens
  std::size_t d = 128;     ///< head dim
  std::size_t heads = 1;   ///< H
  std::size_t bq = 64;     ///< query-block size b_q
  std::size_t bk = 64;     ///< key-block size b_k
  std::size_t k = 16;      ///< key blocks kept per query block
  std::uint64_t seed = 0;  ///< seed of Q (K: seed + 1, V: seed + 2)
  /// In words, as FamilyBytes::shape.
  [[nodiscard]] std::string str() const;
};

/// The MTA rows' counted bytes at `s` (closed form, mta_traffic.hpp), passes fwd, bwd, infer; the
/// measured fields zero.
std::vector<FamilyBytes> mta_counted_rows(const MtaChapterShape& s);

/// The families' table: per pass counted, L2 requests and DRAM with their ratios, where the
/// measurement comes from, and (`explain`: once the traffic-levels lesson is passed) why DRAM
/// falls below L2 for these kernels too.
std::string traffic_families_table(const FamilyMeasurement& m, bool explain);

}  // namespace flashlab::lessons
