// AttentionProblem's checks and names, and the algorithm names (attention_problem.hpp).
#include "flashlab/reference/attention_problem.hpp"

#include "flashlab/reference/tensor.hpp"

#include <cmath>
#include <sstream>
#include <stdexcept>

namespace flashlab::ref {

double AttentionProblem::softmax_scale() const {
  return scale > 0.0 ? scale : 1.0 / std::sqrt(static_cast<double>(head_dim));
}

Shape AttentionProblem::q_shape() const { return Shape{batch, n_q(), heads, head_dim}; }

Shape AttentionProblem::kv_shape() const { return Shape{batch, n_k(), heads, head_dim}; }

namespace {

// "attention problem: <field> (<symbol>) = <value> <limit> (hint: <hint>)".
[[noreturn]] void reject(const char* field, const char* symbol, const std::string& value, const char* limit,
                         const char* hint) {
  std::string name = field;
  if (*symbol) name += std::string(" (") + symbol + ")";
  throw ProblemError(field, "attention problem: " + name + " = " + value + " " + limit + " (hint: " + hint + ")");
}

void require_positive(const char* field, const char* symbol, std::size_t v, const char* hint) {
  if (v == 0) reject(field, symbol, "0", "must be at least 1", hint);
}

}  // namespace

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
}

std::string AttentionProblem::str() const {
  std::ostringstream s;
  s << "B=" << batch << " N=" << n_q();
  if (n_k() != n_q()) s << " N_k=" << n_k();
  s << " H=" << heads << " d=" << head_dim << " Br=" << Br << " Bc=" << Bc << (causal ? " causal" : "") << " "
    << dtype_name(dtype);
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
