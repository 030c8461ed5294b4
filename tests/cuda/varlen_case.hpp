// One packed (cu_seqlens) case of the GPU tests, shared by the forward and backward tests of
// packed sequences: the lengths of each sequence, the heads, the head dim, the mask and the dtype.
#pragma once

#include "flashlab/reference/traffic.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace flashlab::test {

/// One packed case: each sequence's query and key lengths, H, H_kv, d, the mask, the dtype.
struct VarlenCase {
  std::vector<int> len_q, len_k;  // len_k empty: the queries' lengths (self-attention)
  int heads, heads_kv, head_dim;
  bool causal;
  long long window_left = -1, window_right = -1;
  ref::Dtype dtype = ref::Dtype::bf16;
};

/// cu_seqlens of `lengths`: 0, then the running sums.
inline std::vector<std::int32_t> prefix_sums(const std::vector<int>& lengths) {
  std::vector<std::int32_t> cu{0};
  for (int n : lengths) cu.push_back(cu.back() + n);
  return cu;
}

/// "3,0,17": the lengths for a test's message.
inline std::string lengths_str(const std::vector<int>& lengths) {
  std::string s;
  for (int n : lengths) {
    if (!s.empty()) s += ',';
    s += std::to_string(n);
  }
  return s;
}

}  // namespace flashlab::test
