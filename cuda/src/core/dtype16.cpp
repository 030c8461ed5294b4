// The host's 16-bit conversions (flashlab/cuda/dtype16.hpp), on CUDA's own rounding functions so
// that the host rounds exactly as the kernels' __float2bfloat16_rn / __float2half_rn do.
#include "flashlab/cuda/dtype16.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdexcept>
#include <string>

namespace flashlab::cuda {

std::uint16_t float_to_bf16(float x) {
  const __nv_bfloat16_raw raw = __float2bfloat16_rn(x);
  return raw.x;
}
float bf16_to_float(std::uint16_t bits) {
  __nv_bfloat16_raw raw;
  raw.x = bits;
  return __bfloat162float(__nv_bfloat16(raw));
}
std::uint16_t float_to_fp16(float x) {
  const __half_raw raw = __float2half_rn(x);
  return raw.x;
}
float fp16_to_float(std::uint16_t bits) {
  __half_raw raw;
  raw.x = bits;
  return __half2float(__half(raw));
}

bool is_16bit(ref::Dtype dtype) { return dtype == ref::Dtype::bf16 || dtype == ref::Dtype::fp16; }

namespace {
void require_16bit(ref::Dtype dtype) {
  if (!is_16bit(dtype))
    throw std::invalid_argument("flashlab::cuda: dtype " + std::string(ref::dtype_name(dtype)) +
                                " is not a 16-bit storage type (hint: bf16 or fp16)");
}
}  // namespace

std::uint16_t to_bits16(float x, ref::Dtype dtype) {
  require_16bit(dtype);
  return dtype == ref::Dtype::bf16 ? float_to_bf16(x) : float_to_fp16(x);
}

float from_bits16(std::uint16_t bits, ref::Dtype dtype) {
  require_16bit(dtype);
  return dtype == ref::Dtype::bf16 ? bf16_to_float(bits) : fp16_to_float(bits);
}

float round_to(float x, ref::Dtype dtype) { return is_16bit(dtype) ? from_bits16(to_bits16(x, dtype), dtype) : x; }

std::vector<std::uint16_t> to_bits16(const float* x, std::size_t count, ref::Dtype dtype) {
  require_16bit(dtype);
  std::vector<std::uint16_t> bits(count);
  for (std::size_t i = 0; i < count; ++i) bits[i] = to_bits16(x[i], dtype);
  return bits;
}

std::vector<float> from_bits16(const std::vector<std::uint16_t>& bits, ref::Dtype dtype) {
  require_16bit(dtype);
  std::vector<float> out(bits.size());
  for (std::size_t i = 0; i < bits.size(); ++i) out[i] = from_bits16(bits[i], dtype);
  return out;
}

}  // namespace flashlab::cuda
