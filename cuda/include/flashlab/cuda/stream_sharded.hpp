/// @file stream_sharded.hpp
/// @brief STREAM (fast bf16 estimate + fast apply) with the sequence dealt over G GPUs of this
/// process (zigzag chunks by default, or G contiguous shards), the key blocks a rank needs moved
/// between the GPUs over NCCL or by the copy engines.
///
/// Contiguous, the shards are the CPU model's (ref::stream::shard_sequence at b_q = b_k = 64): rank g holds the
/// Q, K, V rows of tokens [token_begin_g, token_end_g) and estimates and applies its own query
/// blocks. Causal attention lets a query block see every key block up to its own, so rank g needs
/// K (for the estimate) and V (for the apply) of every token before its shard: the CPU model's
/// keys_visible scheme, which moves no more bytes than keys_scored at the k of interest and takes
/// one exchange instead of one per refinement round. Each rank sends its K rows to every later
/// rank (grouped ncclSend/ncclRecv), the estimate starts when they have landed; V follows on the
/// same communication stream while the estimate runs, the apply waits for it. The kernels are the
/// single-GPU fast kernels launched on a query-block range (stream_fast_estimate_shard_device,
/// stream_fast_apply_shard_device), with K and V indexed by global token, so every row of I and
/// O is bitwise the single-GPU launch's. Two options change how, never what: the zigzag layout
/// (ShardedStreamProblem::layout; rank g holds query chunks g and 2G − 1 − g of 2G, one range
/// launch each, and receives every row before the end of its last chunk that it does not hold)
/// and the K exchange in pieces (ShardedStreamProblem::pieces; the rows a rank's first chunk
/// needs travel in a first NCCL group, so its first estimate starts before the rest lands; in
/// tiers, one per chunk index, with more chunks). Three more: zigzag folds (2·folds chunks per
/// rank), each chunk on a compute stream of its own (overlap), and the rows moved by the copy
/// engines instead of NCCL (docs/stream.md, "Where the 5.9 ms go").
/// Code: cuda/src/stream/stream_sharded.cpp (the NCCL driver),
/// cuda/src/stream/front_door.cpp (the range entries); docs/stream.md, "Across GPUs".
///
/// Only the device entries of a range are in flashlab_cuda; ShardedStream and the helpers below
/// it are in flashlab_cuda_stream_sharded, built where NCCL is found. No CUDA or NCCL types here.
#pragma once

#include "flashlab/cuda/stream_fast.hpp"
#include "flashlab/reference/stream_shards.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace flashlab::cuda {
class LocalRing;
}

namespace flashlab::cuda::stream {

/// Query blocks `first` … `first + count − 1` of a launch (a shard of the sequence).
struct QueryBlockRange {
  std::size_t first = 0;  ///< first query block
  std::size_t count = 0;  ///< query blocks; 0 = every one from `first` on
};

/// The fast estimate (stream_fast_estimate_device, causal-only mask) of the query blocks in
/// `blocks`: Q holds their tokens from its row 0 (`[T − 64·first, H, d]`, rows past the range never
/// read), K is indexed by global token and must hold every row before the range's last token; I,
/// scores and margins hold `[H, count, k]`, `[H, count, k]`, `[H, count]` (scores and margins may
/// be nullptr). Each row is bitwise that of a whole-sequence launch. Asynchronous on `stream`.
/// Throws StreamError for a user mask, an empty range or one past n_q, and the fast estimate's limits.
void stream_fast_estimate_shard_device(const ref::stream::BlockMask& mask, std::size_t heads, std::size_t d,
                                       std::size_t k, QueryBlockRange blocks, const void* Q, const void* K,
                                       long long* I, float* scores, float* margins, void* stream = nullptr);

/// The fast apply (stream_fast_apply_device, group 1) of the query blocks in `blocks`: Q and O hold
/// their tokens from row 0, I their rows (`[H, count, k]`, global key-block numbers), K and V are
/// indexed by global token. Each output row is bitwise that of a whole-sequence launch. Asynchronous.
/// Throws StreamError for a bad shape or range, CudaError for a failed launch.
void stream_fast_apply_shard_device(const FastApplyShape& shape, QueryBlockRange blocks, const void* Q, const void* K,
                                    const void* V, const std::int64_t* I, void* O, void* stream = nullptr);

/// The contiguous shards of T tokens over `gpus` ranks at b_q = b_k = 64 (the CPU model's).
std::vector<ref::stream::RankShard> fast_stream_shards(std::size_t T, std::size_t gpus);

/// What a sharded run computes: one causal STREAM problem, bf16, b_q = b_k = 64, and how the run
/// is dealt and moved, which never changes I or O. The defaults (zigzag, K in pieces, overlap,
/// copy engines) ran fastest of every schedule measured at T = 4M on 2 GPUs, in two runs, and at
/// T = 8M on 4, where 8 folds then beat 4 (level with 4 on 2 GPUs; docs/stream.md).
struct ShardedStreamProblem {
  std::size_t T = 0;      ///< tokens of the whole sequence
  std::size_t heads = 1;  ///< H
  std::size_t dim = 0;    ///< d (64 or 128)
  std::size_t k = 0;      ///< kept blocks per query block (1 … 128)
  /// How the query blocks are dealt to the ranks (ref::stream::shard_layout); G = 1 runs the
  /// whole sequence whatever the layout. Zigzag by default: on 2 and 4 GPUs it runs T = 8M in
  /// 0.87–0.92 of the contiguous layout's time (docs/stream.md).
  ref::stream::ShardLayout layout = ref::stream::ShardLayout::zigzag;
  /// K in tiers, one NCCL group each (ref::stream::layout_transfers): tier i holds the rows that
  /// some rank's chunk i needs first, so a rank's chunk i starts once the tiers 0 … i have landed
  /// instead of waiting for every row. No effect on the contiguous layout, whose one chunk needs
  /// every row the rank receives.
  bool pieces = true;
  /// Zigzag folds (ref::stream::shard_layout): 2·folds chunks per rank; 1 is plain zigzag, and
  /// the contiguous layout takes 1 only (set it with the layout). More folds: smaller first
  /// chunks, so a rank's first wait is shorter and the cheap early query blocks spread evenly.
  std::size_t folds = 8;
  /// Each chunk's estimate and apply on a compute stream of its own, waiting only for the rows it
  /// needs (the tiers up to its own with `pieces`, then V), so one chunk's kernels fill the GPU
  /// while another's wait or drain; false: one compute stream, the estimates in token order, then
  /// the applies. The latest chunk is launched first (its query blocks are the dearest). Streams
  /// beyond the device's hardware queues (CUDA_DEVICE_MAX_CONNECTIONS, 8 unless set before CUDA
  /// starts) would share one, and a chunk waiting for its rows would hold back the others on it:
  /// so at most as many compute streams as leave a queue to the communication and pull streams
  /// (4 on 4 GPUs with the copy engines), chunk c on stream c mod S in token order.
  bool overlap = true;
  /// The communication streams at the device's greatest stream priority, so that the exchange's
  /// NCCL kernels take SMs ahead of waiting estimate blocks (the rows a chunk waits for land
  /// sooner); false: the default priority, as the compute streams.
  bool comm_priority = false;
  /// The exchange by the GPUs' copy engines instead of NCCL: each rank pulls the rows it needs
  /// from the others (cudaMemcpyPeerAsync, one stream per source so its peers' copies run at
  /// once; peer access enabled between the ring's devices; one process drives them all, as
  /// LocalRing does), so no exchange kernel takes SMs from the estimate; V is enqueued after the
  /// estimates, which do not need it. One host thread per rank enqueues that rank's copies and
  /// kernels, each K tier's estimates right behind it. The same rows, tiers and events; refused where two of
  /// the ring's devices cannot reach each other's memory (then false: NCCL, which any ring has).
  bool copy_engines = true;
};

/// One rank's device buffers, on that rank's GPU, owned by the caller.
struct ShardedStreamBuffers {
  const void* Q = nullptr;   ///< bf16 `[tokens, H, d]`: the queries of the rank's chunks, one chunk after the other
  /// bf16 `[last chunk's token_end, H, d]` by global token: the rank's chunks hold its keys, the
  /// exchange writes the other rows.
  void* K = nullptr;
  void* V = nullptr;         ///< as K, for the values
  long long* I = nullptr;    ///< int64: each chunk's `[H, q_end − q_begin, k]` rows of I, one chunk after the other
  float* scores = nullptr;   ///< fp32, laid out as I, or nullptr
  void* O = nullptr;         ///< bf16, laid out as Q: the outputs
};

/// One rank's times of the last ShardedStream::run (CUDA events on its GPU, ms). The kernels'
/// spans are measured per chunk; with `overlap` they may overlap, so the three parts below are
/// of the rank's timeline, and add up to total_ms.
struct ShardedRankTimes {
  float total_ms = 0.f;     ///< from the start of the run to the end of its last apply
  float estimate_ms = 0.f;  ///< time in which some estimate kernel of the rank runs (one per chunk)
  float apply_ms = 0.f;     ///< time in which an apply kernel runs and no estimate does
  float exposed_ms = 0.f;   ///< total − estimate − apply: no kernel of the rank runs, it waits for the exchange
  float first_wait_ms = 0.f;///< from the start to its first estimate's start (waiting for the rows it needs first)
  float k_exchange_ms = 0.f;///< from the start to the last K rows' arrival (0 on a rank that receives none)
  float v_exchange_ms = 0.f;///< from the start to the last V rows' arrival (0 on a rank that receives none)
  /// The run's timeline, ms from the rank's start: when each K group had landed (one per tier with
  /// `pieces`, else one; empty on a rank that receives none).
  std::vector<float> k_group_landed_ms;
  /// One chunk's kernels in the run's timeline, ms from the rank's start: its estimate starts after
  /// its K group has landed, its apply after its estimate and after V has landed.
  struct ChunkSpan {
    float estimate_begin = 0.f;  ///< the estimate kernel's start
    float estimate_end = 0.f;    ///< its end
    float apply_begin = 0.f;     ///< the apply kernel's start
    float apply_end = 0.f;       ///< its end
  };
  std::vector<ChunkSpan> chunk_spans;  ///< per chunk, in token order (the rank's chunks)
  /// The benchmark only: the rank's estimate launches again, in token order on one stream, with no
  /// exchange and no other GPU running (every row it needs already in place): the time they take
  /// alone, then each chunk's. The run's estimate_ms against it is what the run around it costs.
  float estimate_alone_ms = 0.f;
  std::vector<float> chunk_alone_ms;  ///< per chunk, in token order (the rank's chunks)
  float estimate_together_ms = 0.f;   ///< the same launches with every rank's at once (still no exchange)
};

/// The bytes one rank sends and receives in a run (bf16 K and V rows, the same whether NCCL or the
/// copy engines move them) and the CPU model's keys_visible bytes for the same I
/// (ref::stream::keys_visible_causal_traffic, summed over heads).
struct ShardedRankBytes {
  std::uint64_t sent = 0;          ///< K and V rows this rank sends (to every rank whose last chunk ends after them)
  std::uint64_t received = 0;      ///< K and V rows it receives (every remote row before its last chunk's end)
  std::uint64_t model_sent = 0;    ///< the model: K before each later rank, V of the blocks they keep
  std::uint64_t model_received = 0;///< the model: K before the shard, V of the remote blocks it keeps
};

/// A sharded STREAM run over the GPUs of a LocalRing (one rank per GPU, its NCCL communicator):
/// made once per problem (streams and events on every rank), run as often as wanted.
class ShardedStream {
 public:
  /// Checks the problem (causal, bf16, the fast kernels' limits) against the ring's G ranks.
  /// Throws StreamError for a bad problem, CudaError on a CUDA failure.
  ShardedStream(const ShardedStreamProblem& problem, const LocalRing& ring);
  ~ShardedStream();
  ShardedStream(const ShardedStream&) = delete;
  ShardedStream& operator=(const ShardedStream&) = delete;

  /// The query chunks of every rank in token order (ref::stream::shard_layout at b_q = b_k = 64).
  [[nodiscard]] const std::vector<std::vector<ref::stream::RankShard>>& chunks() const;
  /// Enqueues on every rank: the K exchange, the estimate, the V exchange (overlapping the
  /// estimate) and the apply. Asynchronous; a rank that holds no query block only sends.
  /// Throws StreamError for missing buffers, CudaError / NCCL failures as CudaError.
  void run(const std::vector<ShardedStreamBuffers>& buffers);
  /// Waits for every rank and returns each one's times of the last run.
  std::vector<ShardedRankTimes> wait();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// What every rank of a G-rank run sends and receives beside the CPU model's
/// keys_visible bytes for `indices`, the whole `[H, n_q, k]` I of the run. Throws StreamError for
/// an I of the wrong size. Both follow problem.layout.
std::vector<ShardedRankBytes> sharded_bytes(const ShardedStreamProblem& problem, std::size_t gpus,
                                            const std::vector<std::int64_t>& indices);

/// The whole problem from host arrays (tests): bf16 `[T, H, d]` Q, K, V are cut into the ring's
/// chunks and uploaded (every other K and V row poisoned with NaN, so only the exchange
/// can fill them), run once, and I (`[H, n_q, k]`, global) and O (`[T, H, d]` bf16) gathered.
struct ShardedStreamOutput {
  std::vector<std::int64_t> indices;  ///< `[H, n_q, k]`
  std::vector<float> scores;          ///< `[H, n_q, k]`
  std::vector<std::uint16_t> O;       ///< `[T, H, d]` bf16 bits
};
/// Runs ShardedStream once on host inputs (above). Throws as ShardedStream.
ShardedStreamOutput stream_sharded_host(const ShardedStreamProblem& problem, const LocalRing& ring,
                                        const HostHeads16& Q, const HostHeads16& K, const HostHeads16& V);

/// One timed row of `flashlab bench stream --gpus`: G ranks (G = 1: the single-GPU device entries).
struct ShardedBenchRow {
  std::size_t gpus = 1;            ///< G
  std::size_t T = 0;               ///< tokens of the whole sequence
  std::size_t dim = 0;             ///< d
  std::size_t k = 0;               ///< kept blocks per query block
  ref::stream::ShardLayout layout = ref::stream::ShardLayout::contiguous;  ///< the problem's layout
  bool pieces = false;             ///< the problem's K exchange in pieces
  std::size_t folds = 1;           ///< the problem's zigzag folds
  bool overlap = false;            ///< the problem's chunks on streams of their own
  bool comm_priority = false;      ///< the problem's communication stream at the greatest priority
  bool copy_engines = false;       ///< the problem's exchange by copy engines instead of NCCL
  double total_ms = 0;             ///< median over reps of the slowest rank's total
  double estimate_ms = 0;          ///< median of the slowest rank's estimate
  double apply_ms = 0;             ///< median of the slowest rank's apply
  double exposed_ms = 0;           ///< median of the largest exposed exchange time
  double first_wait_ms = 0;        ///< median of the longest wait before a rank's first estimate
  double estimate_alone_ms = 0;    ///< the largest over ranks of ShardedRankTimes::estimate_alone_ms
  double estimate_alone_sum_ms = 0;///< their sum over ranks (G = 1: the range kernel over every query block)
  double estimate_together_ms = 0; ///< the largest over ranks of ShardedRankTimes::estimate_together_ms
  /// Per rank, the median of each time over the reps; the timeline (k_group_landed_ms,
  /// chunk_spans) is the run's whose slowest rank took the median total.
  std::vector<ShardedRankTimes> ranks;
  std::uint64_t sent_max = 0;      ///< most bytes one rank sends
  std::uint64_t model_sent_max = 0;///< the model's most bytes one rank sends (keys_visible)
  std::uint64_t received_max = 0;  ///< most bytes one rank receives
  std::uint64_t model_received_max = 0; ///< the model's most bytes one rank receives
  std::uint64_t indices_checksum = 0;   ///< FNV-1a 64 of I (the same as the G = 1 row's when identical)
  bool same_every_launch = true;   ///< I bitwise the same after every timed run
  int reps = 0;                    ///< timed runs
};

/// Times estimate + apply at one shape on the G GPUs of `ring` (G = 1: the single-GPU entries, no
/// NCCL) on the seeded N(0, 1) bf16 inputs of the whole sequence made on each rank's GPU (its shard
/// only, the values of a single-GPU run): `warmup` untimed runs, then `reps` runs each after an L2
/// flush on every GPU; then `reps` times the ranks' estimates without the exchange, rank after rank
/// and then all at once (ShardedRankTimes::estimate_alone_ms, estimate_together_ms; I compared as
/// after a run). Throws StreamError / CudaError.
ShardedBenchRow bench_stream_sharded(const ShardedStreamProblem& problem, const LocalRing& ring, int reps, int warmup,
                                     std::uint64_t seed);

}  // namespace flashlab::cuda::stream
