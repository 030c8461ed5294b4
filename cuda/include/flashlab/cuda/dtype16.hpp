/// @file dtype16.hpp
/// @brief The 16-bit storage types of the fast kernels (bf16, fp16) on the host: a float rounded
/// to its nearest value (ties to even) and widened back exactly. The one place every family,
/// test and command converts; no CUDA types here, so CPU-only code may include this header.
/// 16-bit values travel as `uint16_t` bit patterns.
#pragma once

#include "flashlab/reference/traffic.hpp"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace flashlab::cuda {

/// Rounds a float to the nearest bfloat16 (ties to even) and returns its bit pattern.
std::uint16_t float_to_bf16(float x);
/// The float value of a bfloat16 bit pattern (exact).
float bf16_to_float(std::uint16_t bits);
/// Rounds a float to the nearest IEEE binary16 (ties to even) and returns its bit pattern.
std::uint16_t float_to_fp16(float x);
/// The float value of a binary16 bit pattern (exact).
float fp16_to_float(std::uint16_t bits);

/// Whether `dtype` is one of the 16-bit storage types (bf16, fp16).
bool is_16bit(ref::Dtype dtype);
/// `x` rounded to `dtype` (bf16 or fp16) as its bit pattern; throws std::invalid_argument for
/// another dtype.
std::uint16_t to_bits16(float x, ref::Dtype dtype);
/// The float value of a `dtype` (bf16 or fp16) bit pattern (exact); throws std::invalid_argument
/// for another dtype.
float from_bits16(std::uint16_t bits, ref::Dtype dtype);
/// `x` rounded to `dtype` and widened back: the value a kernel reading `dtype` sees (fp32: x).
float round_to(float x, ref::Dtype dtype);

/// The `count` floats at `x` rounded to `dtype` (bf16 or fp16), as bit patterns.
std::vector<std::uint16_t> to_bits16(const float* x, std::size_t count, ref::Dtype dtype);
/// The float values of `bits` (bf16 or fp16 bit patterns of `dtype`).
std::vector<float> from_bits16(const std::vector<std::uint16_t>& bits, ref::Dtype dtype);

}  // namespace flashlab::cuda
