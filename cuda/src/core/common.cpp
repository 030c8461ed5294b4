// Host-side plumbing shared by the kernels: error formatting, the launch description, shared-memory
// opt-in, the launch hook, device queries.
#include "core/common.hpp"

#include "flashlab/reference/attention_problem.hpp"

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
  const std::size_t numel = problem.batch * problem.seq * problem.heads * problem.head_dim;
  if (numel >= (std::size_t(1) << 31) || problem.n_k() != problem.seq)
    throw std::invalid_argument("flashlab::cuda: " + problem.str() +
                                " does not fit the kernels (hint: B·N·H·d below 2^31, N_k = N)");
  Problem p;
  p.batch = int(problem.batch);
  p.seq = int(problem.seq);
  p.heads = int(problem.heads);
  p.head_dim = int(problem.head_dim);
  p.causal = problem.causal;
  const double scale = problem.softmax_scale();
  p.scale = float(scale);
  p.scale_log2 = float(scale * 1.4426950408889634);  // log2(e): e^x = 2^(x·log2 e)
  return p;
}

void set_smem(const void* kernel, std::size_t bytes, const char* kernel_name, const Problem& p) {
  int dev = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&dev));
  // The attribute belongs to the kernel in one device's context, so a process that launches on
  // several GPUs opts in on each of them. It is a maximum: it is only ever raised, and a launch
  // needing no more than what is set pays one lookup. One lock around all of it, so that two
  // threads raising it cannot leave it lower than the map says.
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, std::size_t> opted_in;
  const std::lock_guard<std::mutex> lock(mutex);
  std::size_t& set = opted_in[std::make_pair(kernel, dev)];
  if (set >= bytes) return;
  int optin = 0;
  FLASHLAB_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (bytes > std::size_t(optin)) {
    std::ostringstream os;
    os << "flashlab::cuda: " << kernel_name << " needs " << bytes << " bytes of shared memory for Br="
       << p.Br << ", Bc=" << p.Bc << ", d=" << p.head_dim << " but the device allows "
       << optin << " (hint: use smaller tiles, e.g. --block-m 64 --block-n 32)";
    throw std::invalid_argument(os.str());
  }
  FLASHLAB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  set = bytes;
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
