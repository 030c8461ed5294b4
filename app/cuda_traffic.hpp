// The CUDA side of `flashlab traffic attention --device cuda`: measured bytes beside the model.
// Declared here so cmd_traffic.cpp can call it; defined in cuda_traffic.cpp, which is compiled
// only when CUDA is found (FLASHLAB_HAVE_CUDA).
#pragma once

#include "cli.hpp"

namespace flashlab::app {

/// Runs the CUDA kernels named by the parsed `traffic attention` flags, measures them with
/// CUPTI, and prints model vs measured L2 and DRAM bytes. Returns an exit code.
int cuda_traffic_attention(const po::variables_map& vm);

}  // namespace flashlab::app
