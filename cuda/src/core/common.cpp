// Host-side plumbing shared by the kernels: error formatting, the launch description, shared-memory
// opt-in, the launch hook, device queries.
#include "core/common.hpp"

#include "flashlab/reference/attention_problem.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <utility>

namespace flashlab::cuda::detail {

void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line) {
  std::ostringstream os;
  os << "CUDA error in " << expr << ": " << cudaGetErrorName(err) << " (" << cudaGetErrorString(err) << ") at "
     << file << ":" << line;
  throw CudaError(os.str());
}

Problem make_problem(const ref::AttentionProblem& problem) {
  if (problem.packed) return make_packed_problem(problem, problem.packed->total_q(), problem.packed->total_k());
  // The front doors (check_clear_problem, check_fast_problem) refuse these with the field's name;
  // reaching here with one means a caller skipped them.
  const std::size_t numel = problem.batch * problem.seq * problem.heads * problem.head_dim;
  const std::size_t kv_numel = problem.batch * problem.n_k() * problem.h_kv() * problem.head_dim;
  if (numel >= (std::size_t(1) << 31) || kv_numel >= (std::size_t(1) << 31))
    throw std::logic_error("flashlab::cuda: " + problem.str() +
                           " reached a launch unchecked (B·N·H·d and B·N_k·H_kv·d must be below 2^31)");
  return problem_fields(problem);
}

Problem make_packed_problem(const ref::AttentionProblem& problem, std::size_t total_q, std::size_t total_k) {
  const std::size_t numel = total_q * problem.heads * problem.head_dim;
  const std::size_t kv_numel = total_k * problem.h_kv() * problem.head_dim;
  if (total_q == 0 || numel >= (std::size_t(1) << 31) || kv_numel >= (std::size_t(1) << 31) ||
      problem.batch >= (std::size_t(1) << 31))
    throw std::logic_error("flashlab::cuda: " + problem.str() + " with " + std::to_string(total_q) + " and " +
                           std::to_string(total_k) +
                           " packed rows reached a launch unchecked (total_q·H·d and total_k·H_kv·d must be "
                           "below 2^31, total_q at least 1)");
  ref::AttentionProblem shape = problem;
  shape.packed.reset();  // the fields below; the lists themselves travel as device pointers
  Problem p = problem_fields(shape);
  p.total_q = int(total_q);
  p.total_k = int(total_k);
  // Capped by the totals, not by the longest lengths the caller states (each sequence is at most
  // its tensor's rows long): a window this wide sees what an unbounded one sees in any sequence.
  if (problem.window_left >= 0) p.window_left = int(std::min<long long>(problem.window_left, p.total_k));
  if (!problem.causal && problem.window_right >= 0)
    p.window_right = int(std::min<long long>(problem.window_right, p.total_q));
  return p;
}

Problem problem_fields(const ref::AttentionProblem& problem) {
  Problem p;
  p.batch = int(problem.batch);
  p.seq = int(problem.seq);
  p.heads = int(problem.heads);
  p.head_dim = int(problem.head_dim);
  p.seq_k = int(problem.n_k());
  p.heads_kv = int(problem.h_kv());
  p.causal = problem.causal;
  // The window as the reference reads it (band.hpp): causal caps the right side at 0. Sides wider
  // than the sequence see what an unbounded side sees; capping them keeps the band in int.
  if (problem.window_left >= 0) p.window_left = int(std::min<long long>(problem.window_left, p.seq_k));
  if (problem.causal) p.window_right = 0;
  else if (problem.window_right >= 0) p.window_right = int(std::min<long long>(problem.window_right, p.seq));
  const double scale = problem.softmax_scale();
  p.scale = float(scale);
  p.scale_log2 = float(scale * 1.4426950408889634);  // log2(e): e^x = 2^(x·log2 e)
  return p;
}

void opt_in_smem(const void* kernel, std::size_t bytes, const std::function<void(std::size_t optin)>& refuse) {
  int dev = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&dev));
  // What each (device, kernel) was opted into; the attribute is per device, so a second GPU (or a
  // thread on another device) opts in again.
  static std::mutex mutex;
  static std::map<std::pair<int, const void*>, std::size_t> given;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto it = given.find({dev, kernel});
  if (it != given.end() && it->second >= bytes) return;
  int optin = 0;
  FLASHLAB_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (bytes > std::size_t(optin)) {
    refuse(std::size_t(optin));
    throw std::logic_error("opt_in_smem: the refusal did not throw");  // refuse() must throw
  }
  FLASHLAB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  given[{dev, kernel}] = bytes;
}

void opt_in_smem(const void* kernel, std::size_t bytes, const char* kernel_name) {
  opt_in_smem(kernel, bytes, [&](std::size_t optin) {
    throw CudaError(std::string("flashlab::cuda: ") + kernel_name + " needs " + std::to_string(bytes) +
                    " bytes of shared memory per block, the device allows " + std::to_string(optin) +
                    " (hint: the fast kernels are built for sm_90, 227 KiB)");
  });
}

void set_smem(const void* kernel, std::size_t bytes, const char* kernel_name, const Problem& p) {
  opt_in_smem(kernel, bytes, [&](std::size_t optin) {
    std::ostringstream os;
    os << "flashlab::cuda: " << kernel_name << " needs " << bytes << " bytes of shared memory for Br=" << p.Br
       << ", Bc=" << p.Bc << ", d=" << p.head_dim << " but the device allows " << optin
       << " (hint: use smaller tiles, e.g. --block-m 64 --block-n 32)";
    throw std::invalid_argument(os.str());
  });
}

LaunchHook*& launch_hook() {
  thread_local LaunchHook* hook = nullptr;
  return hook;
}

}  // namespace flashlab::cuda::detail

namespace flashlab::cuda {

bool device_available(std::string* why) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    if (why) *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return false;
  }
  if (n == 0) {
    if (why) *why = "no CUDA device found";
    return false;
  }
  return true;
}

std::string device_description() {
  cudaDeviceProp prop{};
  FLASHLAB_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::ostringstream os;
  os << prop.name << " (" << prop.multiProcessorCount << " SMs, L2 " << (prop.l2CacheSize >> 20) << " MiB, sm_"
     << prop.major << prop.minor << ")";
  return os.str();
}

}  // namespace flashlab::cuda
