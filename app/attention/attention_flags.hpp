// Flags shared by the attention commands (attention, traffic, bench): the one place that turns
// them into a ref::AttentionProblem and a --variant into a ref::Algorithm, and that turns the
// problem's validation errors into usage errors naming the flag.
#pragma once

#include "core/cli.hpp"
#include "core/input_checks.hpp"
#include "core/shared_flags.hpp"

#include "flashlab/reference/attention_problem.hpp"
#include "flashlab/reference/tensor.hpp"

#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace flashlab::app {

/// Adds --block-m (Br) and --block-n (Bc) (shared_flags.hpp) with the one default of each
/// attention tile (ref::kDefaultBr, ref::kDefaultBc).
void add_tile_options(po::options_description& d);

/// Adds --window L,R (keys seen left and right of the diagonal, -1 unbounded): the one spelling of
/// every attention command that takes a window; `note` is appended to its help.
void add_window_option(po::options_description& d, const char* note = "");

/// Sets `problem`'s window_left and window_right from --window when it was given: two integers
/// in -1 … ref::kMaxWindow, else a UsageError naming --window with an example.
void window_flag(const po::variables_map& vm, ref::AttentionProblem& problem);

/// The value of an integer flag declared as po::value<long long>, as a size; a negative value
/// is a UsageError naming the flag (its limits are the problem's, checked by validate_flags()).
std::size_t size_flag(const po::variables_map& vm, const char* name);

/// Runs problem.validate() and rethrows its ProblemError as a UsageError whose message names
/// the flag that sets the field (--block-m for Br, --dim for d, …) and keeps its hint.
void validate_flags(const ref::AttentionProblem& problem);

/// The sequences of a --cu-seqlens file: a line `cu_seqlens_q = 0 3 3 10` (B + 1 prefix sums of
/// the query lengths) and, when the keys' lengths differ, a line `cu_seqlens_k = 0 5 5 17`;
/// numbers separated by spaces or commas, `#` starts a comment. A syntax error is a UsageError
/// naming --cu-seqlens and `source`:line:col; a list ref::PackedSequences refuses (not starting
/// at 0, decreasing, no query at all, …) names `source`:line and keeps the problem's hint.
ref::PackedSequences parse_cu_seqlens(std::string_view text, const std::string& source);

/// Reads and parses a --cu-seqlens file (a file, a pipe, or "-" for standard input; at most
/// 1 MiB); UsageError naming the flag when it cannot be read.
ref::PackedSequences read_cu_seqlens(const std::string& path);

/// The fast kernels' head dims as a usage error naming --dim, in every build (a CPU build has no
/// front door to ask; check_fast_problem() in fast_attention.hpp states the rule): d = 64, 128 or
/// 256, and with packed sequences (--cu-seqlens) 64 or 128. `elsewhere` ends the hint: where the
/// refused d runs instead.
void require_fast_dim(std::size_t d, bool packed, const std::string& elsewhere);

/// What a fast backward on --bwd-kernel wgmma-ws-det would run: the head dims, the query lengths
/// (N_k compared with each), H, H_kv (0: H), N_k (0: N), the window and packed sequences.
struct DetBackwardFlags {
  std::vector<int> dims;
  std::vector<int> seqs;
  std::size_t heads = 1, heads_kv = 0, seq_k = 0;
  long long window_left = -1, window_right = -1;
  bool packed = false;
};

/// --bwd-kernel wgmma-ws-det's limits as usage errors naming the flag, in every build (the front
/// door states them: fast_bwd_problem()): at d = 64 and 128 no window, grouped K/V or N_k != N;
/// no packed sequences at any d. `hint` ends each refusal of the first three, `packed_hint` the
/// last: the command's ways out.
void require_det_backward(const DetBackwardFlags& f, const std::string& hint, const std::string& packed_hint);

/// The hint of every --inputs refusal of the attention commands.
inline constexpr const char* kAttentionInputsHint =
    "--inputs DIR needs q.npy k.npy v.npy (and do.npy for bwd), float32 or float64";

/// One --inputs operand's shape from its .npy header alone (nothing read yet, so a run is sized
/// before loading): `[N, H, D]` as B = 1, or `[B, N, H, D]` (`four_d`). Any other rank or a zero
/// dimension is a UsageError naming the file.
struct AttentionOperand {
  ref::Shape shape;
  bool four_d = false;
};
AttentionOperand attention_operand_shape(const std::filesystem::path& file);

/// The operand's values as float64, in its shape (attention_operand_shape()), under `policy`.
ref::Tensor<double> load_attention_operand(const std::filesystem::path& file, const InputPolicy& policy);

/// The layouts --inputs takes: the hint of an operand whose size disagrees with another's.
inline constexpr const char* kOperandLayoutHint =
    "q and do are [B, N, H, D]; k and v are [B, N_k, H_kv, D] with the same B and D";

/// A UsageError naming `file` unless its `what` (e.g. "head dim") `got` equals `want`, the value
/// of the file named `against`; `hint` says which sizes must agree.
void require_operand_match(const std::filesystem::path& file, const char* what, std::size_t got, std::size_t want,
                           const char* against, const char* hint = kOperandLayoutHint);

/// The algorithm a --variant value names for a forward or backward pass (ref::parse_algorithm);
/// an unknown value is a UsageError naming --variant.
ref::Algorithm algorithm_flag(const std::string& value, bool backward);

}  // namespace flashlab::app
