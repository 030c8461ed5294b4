// The inputs of one `flashlab mta fwd|bwd|infer` run, checked once for both devices: the CPU
// reference command (cmd_mta.cpp) and the clear CUDA kernels (cmd_mta_cuda.cpp) take the same
// flags, apply the same limits, input rules (input_checks.hpp) and tile constraints, and so
// refuse the same bad input with the same message and exit code.
#pragma once

#include "core/cli.hpp"

#include "flashlab/reference/mta.hpp"
#include "flashlab/reference/tensor.hpp"

#include "flashlab/reference/npy.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <vector>

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
/// the input policy flags) with the given default for B, and the hidden positional mode.
void add_mta_options(po::options_description& desc, po::options_description& hidden, long long default_block);

/// Every check of the flags and input files, then the inputs: from --inputs DIR (headers and
/// the memory plan checked before any payload is read) or seeded like the CPU reference. Throws
/// UsageError (exit 2) for anything the run cannot take.
MtaInputs mta_inputs(const po::variables_map& vm);

/// max |got − ref| / max |ref| (float or double results against the float64 reference); NaN or
/// inf anywhere → +inf, so it never passes.
template <class T>
double rel_to_max(const T* got, const double* ref, std::size_t n) {
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (!std::isfinite(double(got[i])) || !std::isfinite(ref[i])) return std::numeric_limits<double>::infinity();
    diff = std::max(diff, std::abs(double(got[i]) - ref[i]));
    scale = std::max(scale, std::abs(ref[i]));
  }
  return scale > 0 ? diff / scale : diff;
}

/// Writes an output tensor to DIR/name as .npy, [B, N, H, D] when the inputs carried a batch
/// dimension, else [N, H, D] (--save mirrors the inputs' layout).
template <class T>
void save_output(const std::filesystem::path& dir, const char* name, const ref::Tensor<T>& t, bool batched) {
  const ref::Shape& s = t.shape();
  std::vector<std::size_t> shape = {s.seq, s.heads, s.head_dim};
  if (batched) shape.insert(shape.begin(), s.batch);
  ref::write_npy(dir / name, shape, t.data());
}

}  // namespace flashlab::app
