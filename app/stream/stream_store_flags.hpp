// What `flashlab stream trace --store`, `stream query`, `stream serve` and `stream fidelity` share:
// the subcommands' entry points, the mapping of store errors to usage errors (exit 2, with the
// store's hint), and the parsers of positions, spans and head selections — one rule each, so the
// CLI and the viewer's endpoints accept the same text.
#pragma once

#include "core/cli.hpp"
#include "core/input_checks.hpp"

#include "flashlab/reference/stream_query.hpp"
#include "flashlab/reference/tensor.hpp"

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace flashlab::app {

int cmd_stream_trace_store(const Args& args);  ///< `stream trace … --store DIR` (cmd_stream_store.cpp)
int cmd_stream_query(const Args& args);        ///< `stream query DIR …` (cmd_stream_store.cpp)
int cmd_stream_serve(const Args& args);        ///< `stream serve DIR …` (cmd_stream_serve.cpp)
int cmd_stream_fidelity(const Args& args);     ///< `stream fidelity …` (cmd_stream_fidelity.cpp)

/// True when `args` hold the flag (as `--flag` or `--flag=…`).
bool has_flag(const Args& args, std::string_view flag);

/// Runs `body`, turning a store's StoreError (and StreamError) into a UsageError with its hint.
int with_store_errors(const std::function<int()>& body);

/// A position given as text: a plain number is read as `plain_is_block` says; `t123` is a
/// token, `b12` a block. Throws std::invalid_argument with a message naming the text.
struct Position {
  std::size_t value = 0;  ///< the number
  bool block = false;     ///< true: a block index, false: a token
};
/// Parses a Position (see above).
Position parse_position(std::string_view text, bool plain_is_block);

/// A token span: `A` (one token) or `A-B` (inclusive). Throws std::invalid_argument naming the
/// text when malformed or B < A.
ref::stream::TokenSpan parse_span(std::string_view text);

/// `all` or a non-negative integer; throws std::invalid_argument naming the text otherwise.
std::optional<std::size_t> parse_all_or_index(std::string_view text);

/// Unsigned decimal integer below 2^63 with nothing else, or nothing.
std::optional<std::size_t> parse_index(std::string_view text);

/// The sizes of q.npy, k.npy (and v.npy) of a multi-head trace, from their headers.
struct TraceInputsShape {
  std::size_t L = 1, T = 0, H = 1, H_kv = 1, D = 0, D_v = 0;  ///< sizes (H_kv divides H)
  std::string dir;                                             ///< the --inputs directory
  ref::NpyHeader q_header, k_header, v_header;                 ///< the headers (v: k's without v.npy)
};

/// q.npy, k.npy (and v.npy) of a multi-head trace, as float, with their sizes.
struct TraceInputs : TraceInputsShape {
  std::vector<float> q, k, v;  ///< [L, T, H, D], [L, T, H_kv, D], [L, T, H_kv, D_v]
};

/// Checks q.npy, k.npy (and v.npy when `need_v`) in `dir` from their headers alone: float32/float64
/// of shape [T, D], [T, H, D] or [L, T, H, D], k and v with H_kv heads dividing H; --seq/--dim,
/// when given, must agree. UsageError naming the flag or the file otherwise. Reads no payload.
TraceInputsShape check_trace_inputs(const std::string& dir, std::optional<long long> seq, std::optional<long long> dim,
                                    bool need_v);

/// Reads the inputs check_trace_inputs() accepts, whole; sizes are checked against the memory
/// limit before the payloads are read.
TraceInputs load_trace_inputs(const std::string& dir, const InputPolicy& policy, std::optional<long long> seq,
                              std::optional<long long> dim, bool need_v);

/// Reads rows of one layer of q.npy, k.npy or v.npy in pieces (the GPU trace's inputs: host memory
/// is the caller's buffer, whatever T): the same files and rules as load_trace_inputs(), float64
/// converted to float32, the finiteness policy applied to every piece.
class TraceInputsReader {
 public:
  /// Opens the files of a checked shape. UsageError when one cannot be opened.
  TraceInputsReader(const TraceInputsShape& shape, const InputPolicy& policy);
  /// Rows t0 … t0 + rows − 1 of layer `layer` of tensor `which` (0 = q, 1 = k, 2 = v), every head
  /// of the file, as float32 `[rows, heads, D]` into `out`. UsageError naming the file when it
  /// ends early or holds NaN/±Inf (unless allowed); std::out_of_range for rows outside the file.
  void read(int which, std::size_t layer, std::size_t t0, std::size_t rows, float* out);

 private:
  TraceInputsShape shape_;
  InputPolicy policy_;
  std::vector<double> wide_;  // a float64 piece before conversion
};

/// Head h of layer l of a [L, T, H, D] array as a T × D matrix.
ref::Mat<float> head_of(const std::vector<float>& a, std::size_t l, std::size_t T, std::size_t H, std::size_t h,
                        std::size_t D);

}  // namespace flashlab::app
