// The inputs of one `flashlab mta fwd|bwd|infer` run, checked once for both devices: the CPU
// reference command (cmd_mta.cpp) and the clear CUDA kernels (cmd_mta_cuda.cpp) take the same
// flags, apply the same limits, input rules (input_checks.hpp) and tile constraints, and so
// refuse the same bad input with the same message and exit code.
#pragma once

#include "cli.hpp"

#include "flashlab/reference/mta.hpp"
#include "flashlab/reference/tensor.hpp"

#include <filesystem>
#include <optional>
#include <string>

namespace flashlab::app {

/// One MTA problem: mode, sizes, kernel parameters and float64 inputs (seeded or read).
struct MtaInputs {
  std::string mode;                ///< fwd, bwd or infer
  ref::Shape shape;                ///< [B, N, H, D]
  ref::mta::Params p;              ///< cq, ck, block B, splits, scale
  bool batched = true;             ///< the inputs carried a batch dimension (outputs mirror it)
  ref::Tensor<double> q, k, v, d_o;
  ref::mta::Weights<double> w;     ///< one cq x ck kernel per head
  std::optional<std::filesystem::path> save_dir;  ///< --save, created
};

/// Adds the problem flags both devices share (sizes, seed, scale, --inputs, --save, --device and
/// the input policy flags) with the given defaults for D and B, and the hidden positional mode.
void add_mta_options(po::options_description& desc, po::options_description& hidden, long long default_dim,
                     long long default_block);

/// Every check of the flags and input files, then the inputs: from --inputs DIR (headers and
/// the memory plan checked before any payload is read) or seeded like the CPU reference. Throws
/// UsageError (exit 2) for anything the run cannot take.
MtaInputs mta_inputs(const po::variables_map& vm);

}  // namespace flashlab::app
