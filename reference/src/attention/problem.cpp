// AttentionProblem's checks and names, and the algorithm names (attention_problem.hpp).
#include "flashlab/reference/attention_problem.hpp"

#include "flashlab/reference/tensor.hpp"

#include "band.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace flashlab::ref {

double AttentionProblem::softmax_scale() const {
  return scale > 0.0 ? scale : 1.0 / std::sqrt(static_cast<double>(head_dim));
}

Shape AttentionProblem::q_shape() const {
  if (packed) return Shape{1, packed->total_q(), heads, head_dim};
  return Shape{batch, n_q(), heads, head_dim};
}

Shape AttentionProblem::kv_shape() const {
  if (packed) return Shape{1, packed->total_k(), h_kv(), head_dim};
  return Shape{batch, n_k(), h_kv(), head_dim};
}

std::size_t AttentionProblem::stat_numel() const {
  const Shape q = q_shape();
  return q.batch * heads * q.seq;
}

SequenceSpan AttentionProblem::sequence(std::size_t b) const {
  if (packed) {
    return SequenceSpan{0, std::size_t(packed->cu_seqlens_q()[b]), packed->len_q(b),
                        std::size_t(packed->cu_seqlens_k()[b]), packed->len_k(b)};
  }
  return SequenceSpan{b, 0, n_q(), 0, n_k()};
}

std::size_t AttentionProblem::stat_offset(std::size_t b, std::size_t h) const {
  const SequenceSpan s = sequence(b);
  return (s.batch_index * heads + h) * q_shape().seq + s.q_start;
}

KeyRange AttentionProblem::visible_keys(const SequenceSpan& s, long long i) const {
  return detail::Band(*this, s).keys(i);
}

std::string AttentionProblem::extended_feature() const {
  std::ostringstream f;
  if (h_kv() != heads) {
    f << "heads_kv (grouped-query attention, H_kv = " << h_kv() << " of H = " << heads << ")";
  } else if (packed) {
    f << "cu_seqlens (" << packed->count() << " packed sequences)";
  } else if (has_window()) {
    f << "window (" << window_left << "," << window_right << ")";
  }
  return f.str();
}

namespace {

// "attention problem: <field> (<symbol>) = <value> <limit> (hint: <hint>)".
[[noreturn]] void reject(const char* field, const char* symbol, const std::string& value, const char* limit,
                         const std::string& hint) {
  std::string name = field;
  if (*symbol) name += std::string(" (") + symbol + ")";
  throw ProblemError(field, "attention problem: " + name + " = " + value + " " + limit + " (hint: " + hint + ")");
}

void require_positive(const char* field, const char* symbol, std::size_t v, const char* hint) {
  if (v == 0) reject(field, symbol, "0", "must be at least 1", hint);
}

void require_window_side(const char* field, long long v) {
  if (v < -1 || v > kMaxWindow)
    reject(field, "", std::to_string(v), "is not -1 or 0 ... 2147483647",
           "keys seen on that side of the diagonal; -1 means unbounded");
}

// One prefix-sum list: B + 1 ≥ 2 entries, starting at 0, never decreasing, not all zero.
// (Messages through an ostringstream: GCC 12 reports a false -Wrestrict in "literal" + string.)
void check_cu_seqlens(const char* field, const char* what, const std::vector<std::int32_t>& cu) {
  std::ostringstream m;
  m << "attention problem: " << field;
  if (cu.size() < 2) {
    m << " has " << cu.size() << " entries, fewer than 2 (hint: B sequences take B + 1 prefix sums, e.g. 0 3 7 for "
      << "lengths 3 and 4)";
    throw ProblemError(field, m.str());
  }
  if (cu[0] != 0) {
    m << "[0] = " << cu[0] << " is not 0 (hint: prefix sums start at 0)";
    throw ProblemError(field, m.str());
  }
  for (std::size_t b = 1; b < cu.size(); ++b) {
    if (cu[b] >= cu[b - 1]) continue;
    m << "[" << b << "] = " << cu[b] << " is below " << field << "[" << b - 1 << "] = " << cu[b - 1]
      << " (hint: prefix sums never decrease: sequence " << b - 1 << " would have length "
      << static_cast<long long>(cu[b]) - cu[b - 1] << "; a length-0 sequence repeats an entry)";
    throw ProblemError(field, m.str());
  }
  if (cu.back() == 0) {
    m << " holds no " << what << " (every sequence has length 0) (hint: give at least one " << what << ")";
    throw ProblemError(field, m.str());
  }
}

}  // namespace

PackedSequences::PackedSequences(std::vector<std::int32_t> cu_seqlens_q, std::vector<std::int32_t> cu_seqlens_k)
    : cu_q_(std::move(cu_seqlens_q)), cu_k_(std::move(cu_seqlens_k)) {
  check_cu_seqlens("cu_seqlens_q", "query", cu_q_);
  if (cu_k_.size() != cu_q_.size())
    throw ProblemError("cu_seqlens_k", "attention problem: cu_seqlens_k has " + std::to_string(cu_k_.size()) +
                                           " entries but cu_seqlens_q has " + std::to_string(cu_q_.size()) +
                                           " (hint: both list the same B sequences, B + 1 entries each)");
  check_cu_seqlens("cu_seqlens_k", "key", cu_k_);
  for (std::size_t b = 0; b < count(); ++b) {
    max_q_ = std::max(max_q_, len_q(b));
    max_k_ = std::max(max_k_, len_k(b));
  }
}

PackedSequences::PackedSequences(std::vector<std::int32_t> cu_seqlens) : PackedSequences(cu_seqlens, cu_seqlens) {}

void AttentionProblem::set_packed(PackedSequences p) {
  batch = p.count();
  seq = p.max_len_q();
  seq_k = p.max_len_k();
  packed = std::move(p);
}

void AttentionProblem::validate() const {
  require_positive("batch", "B", batch, "tensors are [B, N, H, d]");
  require_positive("seq", "N", seq, "give at least one query");
  require_positive("heads", "H", heads, "tensors are [B, N, H, d]");
  require_positive("head_dim", "d", head_dim, "give the head dimension, e.g. 64");
  require_positive("Br", "", Br, "query rows per tile, e.g. 64");
  require_positive("Bc", "", Bc, "key rows per tile, e.g. 64");
  if (Br > kMaxTileRows)
    reject("Br", "", std::to_string(Br), "is above 65536", "a tile holds Br x d elements; try 64");
  if (Bc > kMaxTileRows)
    reject("Bc", "", std::to_string(Bc), "is above 65536", "a tile holds Bc x d elements; try 64");
  if (!(scale >= 0.0) || !std::isfinite(scale)) {
    std::ostringstream v;
    v << scale;
    reject("scale", "", v.str(), "must be finite and not negative", "0 means 1/sqrt(d)");
  }
  if (heads_kv > heads || heads % h_kv() != 0)
    reject("heads_kv", "H_kv", std::to_string(heads_kv), ("does not divide heads (H) = " + std::to_string(heads)).c_str(),
           "each K/V head serves H/H_kv query heads: H_kv = H is multi-head, 1 multi-query attention");
  require_window_side("window_left", window_left);
  require_window_side("window_right", window_right);
  if (packed) {
    const char* hint = "with packed sequences B, N and N_k come from cu_seqlens (set_packed sets them)";
    if (batch != packed->count())
      reject("batch", "B", std::to_string(batch),
             ("differs from the " + std::to_string(packed->count()) + " sequences of cu_seqlens").c_str(), hint);
    if (seq != packed->max_len_q())
      reject("seq", "N", std::to_string(seq),
             ("differs from the longest query sequence, " + std::to_string(packed->max_len_q())).c_str(), hint);
    if (n_k() != packed->max_len_k())
      reject("seq_k", "N_k", std::to_string(n_k()),
             ("differs from the longest key sequence, " + std::to_string(packed->max_len_k())).c_str(), hint);
  }
}

std::string AttentionProblem::str() const {
  std::ostringstream s;
  s << "B=" << batch << " N=" << n_q();
  if (n_k() != n_q()) s << " N_k=" << n_k();
  if (packed) s << " packed total_q=" << packed->total_q() << " total_k=" << packed->total_k();
  s << " H=" << heads;
  if (h_kv() != heads) s << " H_kv=" << h_kv();
  s << " d=" << head_dim << " Br=" << Br << " Bc=" << Bc << (causal ? " causal" : "");
  if (has_window()) s << " window=" << window_left << "," << window_right;
  s << " " << dtype_name(dtype);
  return s.str();
}

std::string_view algorithm_name(Algorithm a) {
  switch (a) {
    case Algorithm::naive_fwd: return "naive_fwd";
    case Algorithm::fa1_fwd: return "fa1_fwd";
    case Algorithm::fa2_fwd: return "fa2_fwd";
    case Algorithm::naive_bwd: return "naive_bwd";
    case Algorithm::bwd_two_kernel: return "bwd_two_kernel";
    case Algorithm::bwd_atomic: return "bwd_atomic";
  }
  return "?";
}

std::string_view algorithm_flag_name(Algorithm a) {
  switch (a) {
    case Algorithm::naive_fwd:
    case Algorithm::naive_bwd: return "naive";
    case Algorithm::fa1_fwd: return "fa1";
    case Algorithm::fa2_fwd: return "fa2";
    case Algorithm::bwd_two_kernel: return "two-kernel";
    case Algorithm::bwd_atomic: return "atomic";
  }
  return "?";
}

bool is_backward(Algorithm a) {
  return a == Algorithm::naive_bwd || a == Algorithm::bwd_two_kernel || a == Algorithm::bwd_atomic;
}

Algorithm parse_algorithm(std::string_view name, bool backward) {
  if (!backward) {
    if (name == "naive" || name == "naive_fwd") return Algorithm::naive_fwd;
    if (name == "fa1" || name == "fa1_fwd") return Algorithm::fa1_fwd;
    if (name == "fa2" || name == "fa2_fwd") return Algorithm::fa2_fwd;
    if (name == "atomic" || name == "two-kernel" || name == "bwd_atomic" || name == "bwd_two_kernel")
      throw std::invalid_argument("algorithm '" + std::string(name) +
                                  "' is a backward design (hint: the forward takes naive, fa1 or fa2)");
    throw std::invalid_argument("algorithm '" + std::string(name) + "' is unknown (hint: the forward takes naive, fa1 or fa2)");
  }
  if (name == "naive" || name == "naive_bwd") return Algorithm::naive_bwd;
  if (name == "two-kernel" || name == "fa2" || name == "bwd_two_kernel") return Algorithm::bwd_two_kernel;
  if (name == "atomic" || name == "bwd_atomic") return Algorithm::bwd_atomic;
  if (name == "fa1" || name == "fa1_fwd")
    throw std::invalid_argument("algorithm '" + std::string(name) +
                                "' is a forward loop order (hint: the backward takes naive, two-kernel (or fa2) or atomic)");
  throw std::invalid_argument("algorithm '" + std::string(name) +
                              "' is unknown (hint: the backward takes naive, two-kernel (or fa2) or atomic)");
}

}  // namespace flashlab::ref
