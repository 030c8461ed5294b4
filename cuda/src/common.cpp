// Host-side plumbing shared by the kernels: error formatting, problem validation, shared-memory
// opt-in, the launch hook, device queries.
#include "common.hpp"

#include <cmath>
#include <sstream>
#include <stdexcept>

namespace flashlab::cuda::detail {

void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line) {
  std::ostringstream os;
  os << "CUDA error in " << expr << ": " << cudaGetErrorName(err) << " (" << cudaGetErrorString(err) << ") at "
     << file << ":" << line;
  throw CudaError(os.str());
}

Problem make_problem(int batch, int seq, int heads, int head_dim, const Options& opt) {
  auto bad = [](const std::string& what, const std::string& hint) {
    throw std::invalid_argument("flashlab::cuda: " + what + " (hint: " + hint + ")");
  };
  if (batch < 1) bad("batch = " + std::to_string(batch) + " must be >= 1", "tensors are [B, N, H, d]");
  if (seq < 1) bad("SEQ = " + std::to_string(seq) + " must be >= 1", "give at least one token");
  if (heads < 1) bad("HEAD_NUM = " + std::to_string(heads) + " must be >= 1", "tensors are [B, N, H, d]");
  if (head_dim < 1 || head_dim > 256)
    bad("HEAD_DIM = " + std::to_string(head_dim) + " is outside 1..256", "the kernels keep whole rows of d in SRAM");
  if (opt.block_m < 1 || opt.block_m > 128)
    bad("BLOCK_M = " + std::to_string(opt.block_m) + " is outside 1..128", "try 64");
  if (opt.block_n < 1 || opt.block_n > 128)
    bad("BLOCK_N = " + std::to_string(opt.block_n) + " is outside 1..128", "try 32");
  if (!(opt.scale >= 0.0) || !std::isfinite(opt.scale))
    bad("scale must be finite and >= 0", "0 means 1/sqrt(HEAD_DIM)");
  Problem p;
  p.batch = batch;
  p.seq = seq;
  p.heads = heads;
  p.head_dim = head_dim;
  p.block_m = opt.block_m;
  p.block_n = opt.block_n;
  p.causal = opt.causal;
  const double scale = opt.scale > 0.0 ? opt.scale : 1.0 / std::sqrt(double(head_dim));
  p.scale = float(scale);
  p.scale_log2 = float(scale * 1.4426950408889634);  // log2(e): e^x = 2^(x·log2 e), seed 001
  return p;
}

void set_smem(const void* kernel, std::size_t bytes, const char* kernel_name, const Problem& p) {
  int dev = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&dev));
  int optin = 0;
  FLASHLAB_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (bytes > std::size_t(optin)) {
    std::ostringstream os;
    os << "flashlab::cuda: " << kernel_name << " needs " << bytes << " bytes of shared memory for BLOCK_M="
       << p.block_m << ", BLOCK_N=" << p.block_n << ", HEAD_DIM=" << p.head_dim << " but the device allows "
       << optin << " (hint: use smaller tiles, e.g. --block-m 64 --block-n 32)";
    throw std::invalid_argument(os.str());
  }
  FLASHLAB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
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
