// The CUDA side of `flashlab traffic attention --device cuda`: measured bytes beside the model.
// Declared here so cmd_traffic.cpp can call it; defined in cuda_traffic.cpp, which is compiled
// only when CUDA is found (FLASHLAB_HAVE_CUDA).
#pragma once

#include "core/cli.hpp"

#include "flashlab/reference/attention_problem.hpp"

#include <cstddef>
#include <optional>
#include <vector>

namespace flashlab::app {

/// Runs the clear CUDA kernels of `algorithm` on `problem` once per N of `seqs` (the problem's
/// `seq` replaced), measures them with CUPTI, and prints model vs measured L2 and DRAM bytes (a
/// table, or CSV when `csv`). Without an algorithm it measures naive_fwd and fa2_fwd side by side
/// and adds the naive-vs-flash sweep table. Returns an exit code.
int cuda_traffic_attention(const ref::AttentionProblem& problem, const std::vector<std::size_t>& seqs,
                           std::optional<ref::Algorithm> algorithm, bool csv);

}  // namespace flashlab::app
