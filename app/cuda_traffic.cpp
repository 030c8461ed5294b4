// PLACEHOLDER — replaced by the CUDA traffic command before anything lands.
#include "cuda_traffic.hpp"
#include <iostream>
namespace flashlab::app {
int cuda_traffic_attention(const po::variables_map&) { std::cerr << "error: not built yet\n"; return kFailed; }
}  // namespace flashlab::app
