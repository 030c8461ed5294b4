// What every family's entry points share: the status an error carries, the boundary that turns
// any exception into a status and the calling thread's message, the versioned-struct read, the
// device and dtype rules, the tensor and stride checks (once, for every tensor of every call),
// and the copies between the caller's strided host memory and the reference's dense tensors.
// Internal to libflashlab.so: nothing here is exported.
#pragma once

#include "flashlab.h"

#include "flashlab/reference/tensor.hpp"
#include "flashlab/reference/traffic.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <string>
#include <string_view>

namespace flashlab::capi {

/// The largest size any problem field may state (B, N, H, d, T, …): far past what fits a device,
/// small enough that products of a few fields stay checkable in 64 bits. The families' own limits
/// come after it, from their front doors.
inline constexpr std::int64_t kMaxDim = std::int64_t(1) << 40;

/// A refusal found by the ABI layer itself: its status and the message (without the function name).
class Error : public std::exception {
 public:
  Error(flashlab_status status, std::string message) : status_(status), message_(std::move(message)) {}
  [[nodiscard]] flashlab_status status() const { return status_; }
  [[nodiscard]] const char* what() const noexcept override { return message_.c_str(); }

 private:
  flashlab_status status_;
  std::string message_;
};

/// Throws Error(status, what + " (hint: " + hint + ")"), or without the hint when it is empty.
[[noreturn]] void fail(flashlab_status status, const std::string& what, const std::string& hint = {});

/// Records the outcome of the exception being handled for flashlab_last_error() and returns its
/// status (Error: its own; std::bad_alloc: OUT_OF_MEMORY; a CUDA failure: CUDA; a problem or
/// parameter error: INVALID_ARGUMENT; anything else: INTERNAL). Call only inside a catch block.
flashlab_status current_exception_status(const char* function) noexcept;

/// Sets the calling thread's message to "" (a call that succeeds).
void clear_last_error() noexcept;

/// Runs one entry point's body: FLASHLAB_OK and an empty message when it returns, otherwise the
/// status of what it threw and the message "<function>: <what>" for flashlab_last_error().
/// Never throws: no exception crosses the C boundary.
template <typename Body>
flashlab_status guard(const char* function, Body&& body) noexcept {
  try {
    body();
    clear_last_error();
    return FLASHLAB_OK;
  } catch (...) {
    return current_exception_status(function);
  }
}

/// Rethrows the exception being handled, a std::invalid_argument or a STREAM parameter error
/// becoming Error(UNSUPPORTED) with its message after `context`. Call only inside a catch block.
[[noreturn]] void rethrow_as_unsupported(const char* context);

/// Runs a kernel family's limit check (or launch): a std::invalid_argument or a STREAM parameter
/// error it throws means "valid, but not on this device" and becomes FLASHLAB_ERROR_UNSUPPORTED
/// with the kernel's own message after `context`. CUDA failures pass through.
template <typename Body>
void kernel_limits(const char* context, Body&& body) {
  try {
    body();
  } catch (...) {
    rethrow_as_unsupported(context);
  }
}

/// Checks `p` (not NULL) and its struct_size against the `known` bytes of this version and the
/// sizes of the same struct in `earlier` minor versions (see flashlab.h, "Versioning"); returns
/// the bytes to read from the caller: min(struct_size, known). The hints name `initialiser`, the
/// way to build the struct, or by default its flashlab_*_defaults() function.
std::size_t check_struct(const void* p, std::size_t known, std::initializer_list<std::size_t> earlier, const char* arg,
                         const char* type_name, const char* initialiser = nullptr);

/// Copies a caller's versioned struct: checks `p` and its struct_size and returns the fields this
/// library knows; a struct of an earlier minor version (its size in `earlier`) gets the fields
/// appended since from `defaults` (the flashlab_*_defaults() values).
template <typename T>
T read_struct(const T* p, const char* arg, const char* type_name, const T& defaults,
              std::initializer_list<std::size_t> earlier = {}, const char* initialiser = nullptr) {
  const std::size_t bytes = check_struct(p, sizeof(T), earlier, arg, type_name, initialiser);
  T out = defaults;
  std::memcpy(static_cast<void*>(&out), p, bytes);
  return out;
}

/// Refuses a NULL pointer argument with INVALID_ARGUMENT naming it.
void require_pointer(const void* p, const char* arg);

/// One `*_workspace_size` entry: `size_of()` checks the problem and returns the bytes, which go
/// to `*bytes` (checked not NULL after the problem, so a bad problem is named first).
template <typename SizeOf>
flashlab_status size_query(const char* function, size_t* bytes, SizeOf&& size_of) noexcept {
  return guard(function, [&] {
    const std::size_t n = size_of();
    require_pointer(bytes, "bytes");
    *bytes = n;
  });
}

/// Checks the device value and that this build has it (UNSUPPORTED with a hint otherwise).
void check_device(flashlab_device device);

/// Checks the dtype value and that `device` computes in it: f32/f64 on the CPU, bf16/f16 on CUDA.
void check_dtype(flashlab_dtype dtype, flashlab_device device, const char* field);

/// The enumerator's name of a dtype, e.g. "FLASHLAB_DTYPE_BF16" ("?" for a value that is none).
const char* dtype_name(flashlab_dtype dtype);

/// Bytes of one element of `dtype` (Q, K, V, O and their gradients).
std::size_t element_bytes(flashlab_dtype dtype);

/// Bytes of one statistic (LSE) or MTA weight for `dtype`: double for F64, float otherwise.
std::size_t stat_bytes(flashlab_dtype dtype);

/// The reference's name of a dtype (traffic accounting and the kernels' problem types).
ref::Dtype to_ref_dtype(flashlab_dtype dtype);

/// `field` = `value` must lie in [lo, hi] (INVALID_ARGUMENT naming the field and the limit).
void require_range(const char* field, std::int64_t value, std::int64_t lo, std::int64_t hi, const char* hint);

/// a·b·…, refusing (INVALID_ARGUMENT naming `what`) a product above 2^62.
std::int64_t checked_product(std::initializer_list<std::int64_t> factors, const char* what);

/// Logical extents of a tensor: `[B, N, H, d]`, or STREAM's `[T, d]` as {1, T, 1, d} with
/// only the row stride read.
struct Extents {
  std::int64_t b = 1, n = 1, h = 1, d = 1;
  bool rows_only = false;  ///< STREAM's [T, d]: stride[0] and stride[2] must be 0
};

/// A checked tensor argument: its data, its element size and the effective strides (0s replaced
/// by the contiguous layout's).
struct Strided {
  const char* name = "";
  char* data = nullptr;
  std::size_t elem = 0;
  Extents ext;
  std::int64_t stride[3] = {0, 0, 0};
};

/// Input or output: output strides must not make two elements share memory.
enum class Role { input, output };

/// Checks a tensor argument once: data not NULL, strides not negative, the largest offset
/// representable, outputs without overlap; on CUDA also device memory, 16-byte aligned and
/// contiguous (UNSUPPORTED naming the tensor and the stride otherwise).
Strided tensor_arg(const char* name, const flashlab_tensor& t, const Extents& ext, flashlab_dtype dtype,
                   flashlab_device device, Role role);

/// The three inputs every family takes, checked: q with `q_ext`, k and v with `kv_ext`.
struct Qkv {
  Strided q, k, v;
};
Qkv qkv_args(const flashlab_tensor& q, const flashlab_tensor& k, const flashlab_tensor& v, const Extents& q_ext,
             const Extents& kv_ext, flashlab_dtype dtype, flashlab_device device);

/// Checks a plain contiguous array argument (statistics, W, dW, indices, edges): not NULL and,
/// on CUDA, device memory.
void array_arg(const char* name, const void* p, flashlab_device device);

/// Checks a caller's workspace against the size query's `needed` bytes (and, on CUDA, its
/// 256-byte alignment and device memory).
void workspace_arg(const void* workspace, std::size_t bytes, std::size_t needed, flashlab_device device);

/// The tensor's elements copied into a dense reference tensor `[B, N, H, d]` (host memory).
template <typename T>
ref::Tensor<T> gather(const Strided& t) {
  const Extents& e = t.ext;
  ref::Tensor<T> out(ref::Shape{std::size_t(e.b), std::size_t(e.n), std::size_t(e.h), std::size_t(e.d)});
  T* dst = out.data();
  const std::size_t row = std::size_t(e.d) * sizeof(T);
  for (std::int64_t b = 0; b < e.b; ++b)
    for (std::int64_t n = 0; n < e.n; ++n)
      for (std::int64_t h = 0; h < e.h; ++h, dst += e.d)
        std::memcpy(dst, t.data + (b * t.stride[0] + n * t.stride[1] + h * t.stride[2]) * std::int64_t(sizeof(T)), row);
  return out;
}

/// A dense reference tensor copied into the caller's strided host memory.
template <typename T>
void scatter(const ref::Tensor<T>& x, const Strided& t) {
  const Extents& e = t.ext;
  const T* src = x.data();
  const std::size_t row = std::size_t(e.d) * sizeof(T);
  for (std::int64_t b = 0; b < e.b; ++b)
    for (std::int64_t n = 0; n < e.n; ++n)
      for (std::int64_t h = 0; h < e.h; ++h, src += e.d)
        std::memcpy(t.data + (b * t.stride[0] + n * t.stride[1] + h * t.stride[2]) * std::int64_t(sizeof(T)), src, row);
}

/// STREAM's `[T, d]` as the reference's row-major matrix.
template <typename T>
ref::Mat<T> gather_rows(const Strided& t) {
  ref::Mat<T> out(Eigen::Index(t.ext.n), Eigen::Index(t.ext.d));
  for (std::int64_t n = 0; n < t.ext.n; ++n)
    std::memcpy(out.data() + n * t.ext.d, t.data + n * t.stride[1] * std::int64_t(sizeof(T)),
                std::size_t(t.ext.d) * sizeof(T));
  return out;
}

/// A row-major matrix copied into STREAM's strided `[T, d]`.
template <typename T>
void scatter_rows(const ref::Mat<T>& x, const Strided& t) {
  for (std::int64_t n = 0; n < t.ext.n; ++n)
    std::memcpy(t.data + n * t.stride[1] * std::int64_t(sizeof(T)), x.data() + n * t.ext.d,
                std::size_t(t.ext.d) * sizeof(T));
}

/// True when this library was built with the CUDA kernels.
bool have_cuda();

}  // namespace flashlab::capi
