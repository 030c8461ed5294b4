#include "stream/stream_flags.hpp"

#include "core/shared_flags.hpp"

#include <filesystem>

namespace flashlab::app {

void add_stream_options(po::options_description& desc, long long default_threads) {
  desc.add_options()
      ("sub", po::value<std::string>(), "estimate | apply | trace")
      ("device", po::value<std::string>(), "cpu (the CPU reference, default) | cuda (the clear CUDA kernels; --kernel fast: the fast ones)")
      ("seq", po::value<long long>(), "sequence length T (taken from --inputs when omitted)");
  add_dim_option(desc, " (taken from --inputs when they are given)");
  add_tile_options(desc, std::nullopt, std::nullopt, kStreamTiles);
  desc.add_options()
      ("k", po::value<long long>(), "key blocks kept per query block (required)")
      ("mask", po::value<std::string>(), "user block mask: .npy uint8/bool [n_q, n_k] or text of 0/1 rows");
  add_seed_option(desc);
  desc.add_options()
      ("threads", po::value<long long>()->default_value(default_threads),
       "CPU threads over query blocks (results do not depend on it)")
      ("inputs", po::value<std::string>(), "directory with q.npy k.npy [v.npy] (cuda: [T, D] or [T, H, D])")
      ("save", po::value<std::string>(), "directory for indices.npy / o.npy / edges.npy|csv")
      ("format", po::value<std::string>()->default_value("npy"), "edge list format for trace: npy | csv");
  add_input_options(desc);
}

namespace {
template <typename T>
T value_or(const po::variables_map& vm, const char* flag, T otherwise) {
  return vm.count(flag) ? vm[flag].as<T>() : otherwise;
}
}  // namespace

StreamFlags stream_flags(const po::variables_map& vm) {
  StreamFlags f;
  f.sub = value_or<std::string>(vm, "sub", "");
  if (f.sub.empty()) throw UsageError("missing subcommand", "flashlab stream estimate|apply|trace|needles …");
  if (f.sub != "estimate" && f.sub != "apply" && f.sub != "trace")
    throw UsageError("unknown stream subcommand '" + f.sub + "'", "use one of: estimate, apply, trace, needles");
  for (const char* flag : {"block-m", "block-n", "k"})
    if (!vm.count(flag)) throw UsageError(std::string("--") + flag + " is required", "flashlab stream --help");
  f.inputs = value_or<std::string>(vm, "inputs", "");
  if (f.inputs.empty() && !vm.count("seq"))
    throw UsageError("--seq is required without --inputs", "pass --seq T or --inputs DIR");
  if (vm.count("seq")) require_range("seq", *(f.seq = vm["seq"].as<long long>()), 1, 1LL << 24);
  // --dim's default stands without --inputs; with them only a --dim given checks the files.
  if (f.inputs.empty() || !vm["dim"].defaulted()) require_range("dim", *(f.dim = vm["dim"].as<long long>()), 1, 4096);
  f.bq = vm["block-m"].as<long long>();
  f.bk = vm["block-n"].as<long long>();
  f.k = vm["k"].as<long long>();
  f.threads = vm["threads"].as<long long>();
  require_range("block-m", f.bq, 1, 1LL << 24);
  require_range("block-n", f.bk, 1, 1LL << 24);
  require_range("k", f.k, 1, 1LL << 20);
  require_range("threads", f.threads, 1, 256);
  f.seed = static_cast<long long>(seed_flag(vm));
  f.policy = input_policy(vm);
  f.format = vm["format"].as<std::string>();
  if (f.format != "npy" && f.format != "csv")
    throw UsageError("--format '" + f.format + "' is not supported", "--format takes npy or csv");
  if (!vm["format"].defaulted() && f.sub != "trace")
    throw UsageError("--format applies to 'stream trace' only", "drop --format, or use stream trace");
  f.mask = value_or<std::string>(vm, "mask", "");
  if (!f.mask.empty() && !std::filesystem::exists(f.mask))
    throw UsageError("--mask " + f.mask + ": no such file", "a .npy of uint8/bool [n_q, n_k] or a text file of 0/1 rows");
  f.save = value_or<std::string>(vm, "save", "");
  return f;
}

}  // namespace flashlab::app
