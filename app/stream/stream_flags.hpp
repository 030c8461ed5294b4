// The flags of `flashlab stream estimate|apply|trace`, checked once for both devices: the CPU
// reference command (cmd_stream.cpp) and the clear CUDA kernels (cmd_stream_cuda.cpp) take the
// same flags with the same limits and input rules (input_checks.hpp), so the same bad flag gets
// the same message and exit code on --device cpu and --device cuda.
#pragma once

#include "core/cli.hpp"
#include "core/input_checks.hpp"
#include "core/shared_flags.hpp"

#include <optional>
#include <string>

namespace flashlab::app {

/// STREAM names its tiles b_q and b_k (query and key blocks); the flags are --block-m, --block-n.
inline constexpr TileNames kStreamTiles{"b_q", "b_k", "block"};

/// The checked flags every device shares.
struct StreamFlags {
  std::string sub;                     ///< estimate, apply or trace
  std::optional<long long> seq, dim;   ///< T and D when given (else from --inputs)
  long long bq = 0, bk = 0, k = 0;     ///< b_q, b_k and the key blocks kept per query block
  long long seed = 0, threads = 1;     ///< --seed (checked), CPU threads
  std::string mask, inputs, save;      ///< files and directories as given
  std::string format = "npy";          ///< trace output: npy or csv
  InputPolicy policy;                  ///< --allow-nonfinite, --memory-limit
};

/// Adds the shared flags (subcommand, --device, sizes, mask, seed, threads, inputs, save,
/// format, and the input policy's flags) with the device's default thread count.
void add_stream_options(po::options_description& desc, long long default_threads);

/// Checks every shared flag (required ones, ranges, seed, policy, format, the mask file exists)
/// and returns them; UsageError (exit 2) otherwise.
StreamFlags stream_flags(const po::variables_map& vm);

}  // namespace flashlab::app
