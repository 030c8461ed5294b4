/// @file traffic.hpp
/// @brief One vocabulary for memory traffic at every level: bytes read and written per tensor.
///
/// DESIGN.md: "Traffic has one vocabulary at every level: a per-tensor count of bytes read and
/// written". The tiled references call `read("K", elements)` exactly where their loops move a
/// tile HBM → SRAM and `write("O", elements)` where they move it back, so the counts are a
/// by-product of running the loops, not a formula. Closed-form formulas (elsewhere) are tested
/// equal to these counts, and the CUDA side measures the same tensors with CUPTI.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace flashlab::ref {

/// Element type of the tensors whose traffic is counted.
enum class Dtype { fp32, bf16, fp16, fp64 };

/// Bytes per element of a dtype (fp32 4, bf16 2, fp16 2, fp64 8).
std::size_t dtype_bytes(Dtype d);
/// "fp32", "bf16", "fp16", "fp64".
std::string_view dtype_name(Dtype d);
/// Parses "fp32" | "bf16" | "fp16" | "fp64"; throws std::invalid_argument naming the choices.
Dtype parse_dtype(std::string_view s);

/// Elements read and written of one tensor.
struct TensorTraffic {
  std::string name;               ///< tensor name in paper notation: "Q", "K", "LSE", "dQ", ...
  std::size_t element_bytes = 4;  ///< bytes per element of this tensor
  std::uint64_t read_elements = 0;   ///< elements moved HBM → fast memory
  std::uint64_t write_elements = 0;  ///< elements moved fast memory → HBM
  /// Bytes read = elements × element size.
  [[nodiscard]] std::uint64_t read_bytes() const { return read_elements * element_bytes; }
  /// Bytes written = elements × element size.
  [[nodiscard]] std::uint64_t write_bytes() const { return write_elements * element_bytes; }
};

/// Per-tensor traffic and work counter, filled in by the tiled loops as they run.
///
/// Tensors appear in the order they are first touched (or declared). Statistics tensors
/// (`LSE`, `D`, `M`, `L`, `m`, `l`) are kept in fp32 whatever the input dtype, as in the Triton walkthrough,
/// unless declared otherwise with `declare`.
class Traffic {
 public:
  /// Counts with elements of `dtype` (statistics tensors stay fp32).
  explicit Traffic(Dtype dtype = Dtype::fp32);

  /// Declares a tensor (fixes its order in reports and, optionally, its element size).
  void declare(std::string_view tensor, std::size_t element_bytes = 0);
  /// Records `elements` elements of `tensor` moved HBM → fast memory.
  void read(std::string_view tensor, std::uint64_t elements);
  /// Records `elements` elements of `tensor` moved fast memory → HBM.
  void write(std::string_view tensor, std::uint64_t elements);
  /// Adds floating-point operations (a multiply-add counts 2).
  void add_flops(std::uint64_t flops) { flops_ += flops; }

  /// Every tensor touched or declared, in that order.
  [[nodiscard]] const std::vector<TensorTraffic>& tensors() const { return tensors_; }
  /// The entry for `tensor`, or nullptr if it was never touched or declared.
  [[nodiscard]] const TensorTraffic* find(std::string_view tensor) const;
  /// Bytes read of `tensor` (0 if never touched).
  [[nodiscard]] std::uint64_t read_bytes(std::string_view tensor) const;
  /// Bytes written of `tensor` (0 if never touched).
  [[nodiscard]] std::uint64_t write_bytes(std::string_view tensor) const;
  /// Bytes read over all tensors.
  [[nodiscard]] std::uint64_t total_read_bytes() const;
  /// Bytes written over all tensors.
  [[nodiscard]] std::uint64_t total_write_bytes() const;
  /// Floating-point operations counted so far.
  [[nodiscard]] std::uint64_t flops() const { return flops_; }
  /// The element type the counter was made for.
  [[nodiscard]] Dtype dtype() const { return dtype_; }
  /// Adds every count of `other` into this counter (tensor by tensor).
  void merge(const Traffic& other);

 private:
  TensorTraffic& entry(std::string_view tensor);
  Dtype dtype_;
  std::vector<TensorTraffic> tensors_;
  std::uint64_t flops_ = 0;
};

}  // namespace flashlab::ref
