// The ABI's shared layer (core.hpp): the calling thread's message, exception → status, versioned
// structs, device and dtype rules, tensor checks; and the entry points that belong to no family
// (version, build, messages).
#include "core.hpp"

#include "flashlab/reference/attention_problem.hpp"
#include "flashlab/reference/stream.hpp"

#if FLASHLAB_CAPI_HAVE_CUDA
#include "flashlab/cuda/options.hpp"

#include <cuda_runtime.h>
#endif

#include <array>
#include <cstdio>
#include <limits>
#include <new>
#include <stdexcept>
#include <utility>

namespace flashlab::capi {

namespace {

// The calling thread's message: a fixed buffer, so recording a failure never allocates (the
// failure may be an exhausted heap) and the pointer flashlab_last_error() returns stays valid
// until the thread's next call.
constexpr std::size_t kMessageBytes = 4096;
thread_local char t_message[kMessageBytes] = "";

void set_message(const char* function, const char* what) noexcept {
  std::snprintf(t_message, kMessageBytes, "%s: %s", function, what);
}

// Largest struct_size read: far above any struct this ABI will grow to, far below a size that
// could only be a garbage value (which would make the zero check read past the caller's struct).
constexpr std::size_t kMaxStructSize = 4096;

// Largest byte extent of one tensor: offsets and sizes stay far from 64-bit overflow.
constexpr std::int64_t kMaxBytes = std::int64_t(1) << 62;


#if FLASHLAB_CAPI_HAVE_CUDA
// Refuses a pointer the GPU cannot address as device memory: a kernel reading host memory would
// fault and leave the context unusable. The query is legal inside stream capture; the capture mode
// is relaxed around it all the same, so that no capture mode of the caller's makes it fail.
void require_device_memory(const char* name, const void* p) {
  cudaPointerAttributes attributes{};
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  const cudaError_t err = cudaPointerGetAttributes(&attributes, p);
  cudaThreadExchangeStreamCaptureMode(&mode);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    fail(FLASHLAB_ERROR_CUDA,
         std::string("cudaPointerGetAttributes(") + name + ") failed: " + cudaGetErrorName(err) + " (" +
             cudaGetErrorString(err) + ")",
         "check that a CUDA device is visible and the driver works");
  }
  if (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged)
    fail(FLASHLAB_ERROR_INVALID_ARGUMENT,
         std::string(name) + " is " + (attributes.type == cudaMemoryTypeHost ? "pinned host" : "host") +
             " memory, but FLASHLAB_DEVICE_CUDA takes device pointers",
         "allocate it with cudaMalloc (or cudaMallocAsync, cudaMallocManaged), or call with FLASHLAB_DEVICE_CPU");
}
#endif

}  // namespace

const char* dtype_name(flashlab_dtype dtype) {
  switch (dtype) {
    case FLASHLAB_DTYPE_F32: return "FLASHLAB_DTYPE_F32";
    case FLASHLAB_DTYPE_F64: return "FLASHLAB_DTYPE_F64";
    case FLASHLAB_DTYPE_BF16: return "FLASHLAB_DTYPE_BF16";
    case FLASHLAB_DTYPE_F16: return "FLASHLAB_DTYPE_F16";
  }
  return "?";
}

void fail(flashlab_status status, const std::string& what, const std::string& hint) {
  throw Error(status, hint.empty() ? what : what + " (hint: " + hint + ")");
}

void clear_last_error() noexcept { t_message[0] = '\0'; }

flashlab_status current_exception_status(const char* function) noexcept {
  try {
    throw;
  } catch (const Error& e) {
    set_message(function, e.what());
    return e.status();
  } catch (const std::bad_alloc&) {
    set_message(function, "out of host memory (std::bad_alloc) (hint: a smaller problem, or more memory)");
    return FLASHLAB_ERROR_OUT_OF_MEMORY;
#if FLASHLAB_CAPI_HAVE_CUDA
  } catch (const flashlab::cuda::CudaError& e) {
    set_message(function, e.what());
    const std::string_view what = e.what();
    return what.find("cudaErrorMemoryAllocation") != std::string_view::npos ? FLASHLAB_ERROR_OUT_OF_MEMORY
                                                                            : FLASHLAB_ERROR_CUDA;
#endif
  } catch (const ref::stream::StreamError& e) {
    set_message(function, e.what());
    return FLASHLAB_ERROR_INVALID_ARGUMENT;
  } catch (const std::invalid_argument& e) {  // ref::ProblemError and every parameter check
    set_message(function, e.what());
    return FLASHLAB_ERROR_INVALID_ARGUMENT;
  } catch (const std::exception& e) {
    std::snprintf(t_message, kMessageBytes, "%s: internal error: %s (hint: please report this message)", function,
                  e.what());
    return FLASHLAB_ERROR_INTERNAL;
  } catch (...) {
    set_message(function, "internal error: an exception of unknown type (hint: please report this message)");
    return FLASHLAB_ERROR_INTERNAL;
  }
}

void rethrow_as_unsupported(const char* context) {
  try {
    throw;
  } catch (const Error&) {
    throw;
#if FLASHLAB_CAPI_HAVE_CUDA
  } catch (const flashlab::cuda::CudaError&) {
    throw;
#endif
  } catch (const ref::stream::StreamError& e) {
    fail(FLASHLAB_ERROR_UNSUPPORTED, std::string(context) + ": " + e.what());
  } catch (const std::invalid_argument& e) {
    fail(FLASHLAB_ERROR_UNSUPPORTED, std::string(context) + ": " + e.what());
  }
}

std::size_t check_struct(const void* p, std::size_t known, std::initializer_list<std::size_t> earlier, const char* arg,
                         const char* type_name, const char* initialiser) {
  std::string defaults = type_name;  // flashlab_attention_problem → flashlab_attention_defaults()
  defaults = initialiser ? initialiser : defaults.substr(0, defaults.rfind('_')) + "_defaults()";
  if (p == nullptr)
    fail(FLASHLAB_ERROR_INVALID_ARGUMENT, std::string(arg) + " is NULL",
         std::string("pass a ") + type_name + " built with " + defaults);
  std::size_t size = 0;
  std::memcpy(&size, p, sizeof size);
  const std::string field = std::string(arg) + "->struct_size = " + std::to_string(size);
  const std::string set_it = "set it to sizeof(" + std::string(type_name) + "), or start from " + defaults;
  for (const std::size_t e : earlier)
    if (size == e) return size;  // an earlier minor version's struct: the rest takes the defaults
  if (size < known)
    fail(FLASHLAB_ERROR_INVALID_ARGUMENT,
         field + " is below sizeof(" + type_name + ") = " + std::to_string(known) + " of ABI version " +
             std::to_string(FLASHLAB_ABI_VERSION) + "." + std::to_string(FLASHLAB_ABI_MINOR) +
             " and is no earlier version's size",
         set_it);
  if (size > kMaxStructSize)
    fail(FLASHLAB_ERROR_INVALID_ARGUMENT, field + " is not the size of a " + type_name, set_it);
  const auto* bytes = static_cast<const unsigned char*>(p);
  for (std::size_t i = known; i < size; ++i)
    if (bytes[i] != 0)
      fail(FLASHLAB_ERROR_UNSUPPORTED,
           field + " sets fields past the " + std::to_string(known) + " bytes this library (ABI version " +
               std::to_string(FLASHLAB_ABI_VERSION) + ") knows",
           "link the libflashlab.so of the header you built with, or leave the newer fields at their defaults");
  return known;
}

void require_pointer(const void* p, const char* arg) {
  if (p == nullptr) fail(FLASHLAB_ERROR_INVALID_ARGUMENT, std::string(arg) + " is NULL", "pass a valid pointer");
}

bool have_cuda() {
#if FLASHLAB_CAPI_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

void check_device(flashlab_device device) {
  if (device != FLASHLAB_DEVICE_CPU && device != FLASHLAB_DEVICE_CUDA)
    fail(FLASHLAB_ERROR_INVALID_ARGUMENT, "device = " + std::to_string(int(device)) + " is not a flashlab_device",
         "FLASHLAB_DEVICE_CPU (0) or FLASHLAB_DEVICE_CUDA (1)");
  if (device == FLASHLAB_DEVICE_CUDA && !have_cuda())
    fail(FLASHLAB_ERROR_UNSUPPORTED, "device = FLASHLAB_DEVICE_CUDA, but this libflashlab.so was built without CUDA",
         "use FLASHLAB_DEVICE_CPU (host memory, f32 or f64), or build libflashlab.so with the cuda preset (nvcc) "
         "and run it on a machine with an NVIDIA GPU; flashlab_has_cuda() tells which build you have");
}

void check_dtype(flashlab_dtype dtype, flashlab_device device, const char* field) {
  if (dtype != FLASHLAB_DTYPE_F32 && dtype != FLASHLAB_DTYPE_F64 && dtype != FLASHLAB_DTYPE_BF16 &&
      dtype != FLASHLAB_DTYPE_F16)
    fail(FLASHLAB_ERROR_INVALID_ARGUMENT, std::string(field) + " = " + std::to_string(int(dtype)) + " is not a flashlab_dtype",
         "FLASHLAB_DTYPE_F32, _F64, _BF16 or _F16");
  const bool sixteen = dtype == FLASHLAB_DTYPE_BF16 || dtype == FLASHLAB_DTYPE_F16;
  if (device == FLASHLAB_DEVICE_CPU && sixteen)
    fail(FLASHLAB_ERROR_UNSUPPORTED,
         std::string(field) + " = " + dtype_name(dtype) + " on FLASHLAB_DEVICE_CPU: the CPU reference computes in F32 or F64",
         "convert the tensors to float or double, or run on FLASHLAB_DEVICE_CUDA");
  if (device == FLASHLAB_DEVICE_CUDA && !sixteen)
    fail(FLASHLAB_ERROR_UNSUPPORTED,
         std::string(field) + " = " + dtype_name(dtype) + " on FLASHLAB_DEVICE_CUDA: the CUDA kernels take BF16 or F16",
         "convert the tensors to bfloat16 or binary16, or run the reference on FLASHLAB_DEVICE_CPU");
}

std::size_t element_bytes(flashlab_dtype dtype) {
  switch (dtype) {
    case FLASHLAB_DTYPE_F32: return 4;
    case FLASHLAB_DTYPE_F64: return 8;
    default: return 2;
  }
}

std::size_t stat_bytes(flashlab_dtype dtype) { return dtype == FLASHLAB_DTYPE_F64 ? 8 : 4; }

ref::Dtype to_ref_dtype(flashlab_dtype dtype) {
  switch (dtype) {
    case FLASHLAB_DTYPE_F64: return ref::Dtype::fp64;
    case FLASHLAB_DTYPE_BF16: return ref::Dtype::bf16;
    case FLASHLAB_DTYPE_F16: return ref::Dtype::fp16;
    default: return ref::Dtype::fp32;
  }
}

void require_range(const char* field, std::int64_t value, std::int64_t lo, std::int64_t hi, const char* hint) {
  if (value >= lo && value <= hi) return;
  std::string limit = value < lo ? "below " + std::to_string(lo) : "above " + std::to_string(hi);
  fail(FLASHLAB_ERROR_INVALID_ARGUMENT, std::string(field) + " = " + std::to_string(value) + " is " + limit, hint);
}

std::int64_t checked_product(std::initializer_list<std::int64_t> factors, const char* what) {
  std::int64_t product = 1;
  for (const std::int64_t f : factors) {
    if (f != 0 && product > kMaxBytes / f)
      fail(FLASHLAB_ERROR_INVALID_ARGUMENT, std::string(what) + " is above 2^62", "a smaller problem");
    product *= f;
  }
  return product;
}

Strided tensor_arg(const char* name, const flashlab_tensor& t, const Extents& ext, flashlab_dtype dtype,
                   flashlab_device device, Role role) {
  Strided out;
  out.name = name;
  out.data = static_cast<char*>(t.data);
  out.elem = element_bytes(dtype);
  out.ext = ext;
  const std::string n = name;
  if (t.data == nullptr)
    fail(FLASHLAB_ERROR_INVALID_ARGUMENT, n + ".data is NULL",
         ext.rows_only ? "pass a [T, d] tensor" : "pass a [B, N, H, d] tensor");
  // The contiguous layout's strides and how messages spell them.
  const std::array<std::int64_t, 3> contiguous = {ext.n * ext.h * ext.d, ext.h * ext.d, ext.d};
  const std::array<std::int64_t, 3> extent = {ext.b, ext.n, ext.h};
  const char* spelled[3] = {"N·H·d", ext.rows_only ? "d" : "H·d", "d"};
  for (int i = 0; i < 3; ++i) {
    const std::string field = n + ".stride[" + std::to_string(i) + "] = " + std::to_string(t.stride[i]);
    if (t.stride[i] < 0)
      fail(FLASHLAB_ERROR_INVALID_ARGUMENT, field + " is negative",
           "strides count elements forward; 0 means the contiguous layout");
    if (ext.rows_only && i != 1 && t.stride[i] != 0)
      fail(FLASHLAB_ERROR_INVALID_ARGUMENT, field + " is not 0: STREAM tensors are [T, d], only stride[1] (the row stride) is read",
           "set stride[0] and stride[2] to 0");
    out.stride[i] = t.stride[i] != 0 ? t.stride[i] : contiguous[std::size_t(i)];
  }
  // Every offset must stay far from 64-bit overflow, in elements and in bytes: each term below 2^58.
  for (int i = 0; i < 3; ++i) {
    const std::int64_t e = extent[std::size_t(i)] - 1;
    if (e > 0 && out.stride[i] > (kMaxBytes / 16) / e)
      fail(FLASHLAB_ERROR_INVALID_ARGUMENT,
           n + ".stride[" + std::to_string(i) + "] = " + std::to_string(out.stride[i]) + " puts elements beyond 2^62 bytes",
           "check the strides: they count elements, not bytes");
  }
  if (role == Role::output) {
    // Non-overlap: ordered by stride, every dimension must step over the whole extent of the one
    // inside it (d innermost, stride 1).
    std::array<std::pair<std::int64_t, int>, 4> dims{};  // (stride, index; 3 = d)
    int count = 0;
    for (int i = 0; i < 3; ++i)
      if (extent[std::size_t(i)] > 1) dims[std::size_t(count++)] = {out.stride[i], i};
    dims[std::size_t(count++)] = {1, 3};
    for (int j = 1; j < count; ++j)  // insertion sort of at most four entries
      for (int i = j; i > 0 && dims[std::size_t(i)] < dims[std::size_t(i - 1)]; --i)
        std::swap(dims[std::size_t(i)], dims[std::size_t(i - 1)]);
    auto extent_of = [&](int i) { return i == 3 ? ext.d : extent[std::size_t(i)]; };
    for (int j = 1; j < count; ++j) {
      const auto [inner_stride, inner] = dims[std::size_t(j - 1)];
      const auto [stride, i] = dims[std::size_t(j)];
      if (stride < inner_stride * extent_of(inner)) {
        const std::string inner_name = inner == 3 ? "d = " + std::to_string(ext.d)
                                                  : "stride[" + std::to_string(inner) + "] × its extent = " +
                                                        std::to_string(inner_stride) + " × " +
                                                        std::to_string(extent_of(inner));
        fail(FLASHLAB_ERROR_INVALID_ARGUMENT,
             n + ".stride[" + std::to_string(i) + "] = " + std::to_string(stride) +
                 " makes elements of the output share memory: it is below " + inner_name,
             "an output's strides must step over the dimension inside them; 0 means contiguous");
      }
    }
  }
  if (device == FLASHLAB_DEVICE_CUDA) {
    for (int i = 0; i < 3; ++i)
      if (extent[std::size_t(i)] > 1 && out.stride[i] != contiguous[std::size_t(i)])
        fail(FLASHLAB_ERROR_UNSUPPORTED,
             n + ".stride[" + std::to_string(i) + "] = " + std::to_string(out.stride[i]) + " is not the contiguous " +
                 std::to_string(contiguous[std::size_t(i)]) + " (" + spelled[i] + "): the CUDA kernels read " +
                 (ext.rows_only ? "[T, d]" : "[B, N, H, d]") + " contiguous",
             "pass stride 0 with a contiguous copy of the tensor, or use FLASHLAB_DEVICE_CPU, which takes any strides");
    if (reinterpret_cast<std::uintptr_t>(t.data) % 16 != 0)
      fail(FLASHLAB_ERROR_UNSUPPORTED,
           n + ".data is not 16-byte aligned: the CUDA kernels load 16 bytes at a time",
           "pass the start of a cudaMalloc allocation, or an offset that is a multiple of 16 bytes");
#if FLASHLAB_CAPI_HAVE_CUDA
    require_device_memory((n + ".data").c_str(), t.data);
#endif
  }
  return out;
}

Qkv qkv_args(const flashlab_tensor& q, const flashlab_tensor& k, const flashlab_tensor& v, const Extents& q_ext,
             const Extents& kv_ext, flashlab_dtype dtype, flashlab_device device) {
  return {tensor_arg("q", q, q_ext, dtype, device, Role::input), tensor_arg("k", k, kv_ext, dtype, device, Role::input),
          tensor_arg("v", v, kv_ext, dtype, device, Role::input)};
}

void array_arg(const char* name, const void* p, flashlab_device device) {
  require_pointer(p, name);
#if FLASHLAB_CAPI_HAVE_CUDA
  if (device == FLASHLAB_DEVICE_CUDA) require_device_memory(name, p);
#else
  (void)device;
#endif
}

void workspace_arg(const void* workspace, std::size_t bytes, std::size_t needed, flashlab_device device) {
  if (needed == 0) return;
  if (bytes < needed)
    fail(FLASHLAB_ERROR_INVALID_ARGUMENT,
         "workspace_bytes = " + std::to_string(bytes) + " is below the " + std::to_string(needed) +
             " bytes this call needs",
         "allocate what the matching *_workspace_size() function returns");
  require_pointer(workspace, "workspace");
  if (device == FLASHLAB_DEVICE_CUDA && reinterpret_cast<std::uintptr_t>(workspace) % 256 != 0)
    fail(FLASHLAB_ERROR_INVALID_ARGUMENT, "workspace is not 256-byte aligned",
         "pass the start of a cudaMalloc allocation (its pointers are 256-byte aligned)");
  array_arg("workspace", workspace, device);
}

}  // namespace flashlab::capi

// ---- entry points of no family ----

using namespace flashlab::capi;

extern "C" {

FLASHLAB_API int flashlab_abi_version(void) { return FLASHLAB_ABI_VERSION; }

FLASHLAB_API const char* flashlab_version(void) { return FLASHLAB_VERSION_STRING; }

FLASHLAB_API int flashlab_has_cuda(void) { return have_cuda() ? 1 : 0; }

FLASHLAB_API const char* flashlab_last_error(void) { return t_message; }

FLASHLAB_API const char* flashlab_status_name(flashlab_status status) {
  switch (status) {
    case FLASHLAB_OK: return "FLASHLAB_OK";
    case FLASHLAB_ERROR_INVALID_ARGUMENT: return "FLASHLAB_ERROR_INVALID_ARGUMENT";
    case FLASHLAB_ERROR_UNSUPPORTED: return "FLASHLAB_ERROR_UNSUPPORTED";
    case FLASHLAB_ERROR_CUDA: return "FLASHLAB_ERROR_CUDA";
    case FLASHLAB_ERROR_OUT_OF_MEMORY: return "FLASHLAB_ERROR_OUT_OF_MEMORY";
    case FLASHLAB_ERROR_INTERNAL: return "FLASHLAB_ERROR_INTERNAL";
  }
  return "FLASHLAB_STATUS_UNKNOWN";
}

}  // extern "C"
