#include "flashlab/reference/traffic.hpp"

#include <array>
#include <stdexcept>

namespace flashlab::ref {

std::size_t dtype_bytes(Dtype d) {
  switch (d) {
    case Dtype::fp32: return 4;
    case Dtype::bf16: return 2;
    case Dtype::fp16: return 2;
    case Dtype::fp64: return 8;
  }
  return 4;
}

std::string_view dtype_name(Dtype d) {
  switch (d) {
    case Dtype::fp32: return "fp32";
    case Dtype::bf16: return "bf16";
    case Dtype::fp16: return "fp16";
    case Dtype::fp64: return "fp64";
  }
  return "fp32";
}

Dtype parse_dtype(std::string_view s) {
  if (s == "fp32") return Dtype::fp32;
  if (s == "bf16") return Dtype::bf16;
  if (s == "fp16") return Dtype::fp16;
  if (s == "fp64") return Dtype::fp64;
  throw std::invalid_argument("unknown dtype '" + std::string(s) + "' (choose fp32, bf16, fp16 or fp64)");
}

namespace {
// Per-row softmax statistics are fp32 in the Triton walkthrough's kernels regardless of the input dtype.
bool is_statistic(std::string_view t) {
  constexpr std::array<std::string_view, 6> stats = {"LSE", "D", "M", "L", "m", "l"};
  for (auto s : stats)
    if (t == s) return true;
  return false;
}
}  // namespace

Traffic::Traffic(Dtype dtype) : dtype_(dtype) {}

TensorTraffic& Traffic::entry(std::string_view tensor) {
  for (auto& t : tensors_)
    if (t.name == tensor) return t;
  TensorTraffic t;
  t.name = std::string(tensor);
  t.element_bytes = is_statistic(tensor) ? 4 : dtype_bytes(dtype_);
  tensors_.push_back(t);
  return tensors_.back();
}

void Traffic::declare(std::string_view tensor, std::size_t element_bytes) {
  auto& t = entry(tensor);
  if (element_bytes) t.element_bytes = element_bytes;
}
void Traffic::read(std::string_view tensor, std::uint64_t elements) { entry(tensor).read_elements += elements; }
void Traffic::write(std::string_view tensor, std::uint64_t elements) { entry(tensor).write_elements += elements; }

const TensorTraffic* Traffic::find(std::string_view tensor) const {
  for (const auto& t : tensors_)
    if (t.name == tensor) return &t;
  return nullptr;
}
std::uint64_t Traffic::read_bytes(std::string_view tensor) const {
  const auto* t = find(tensor);
  return t ? t->read_bytes() : 0;
}
std::uint64_t Traffic::write_bytes(std::string_view tensor) const {
  const auto* t = find(tensor);
  return t ? t->write_bytes() : 0;
}
std::uint64_t Traffic::total_read_bytes() const {
  std::uint64_t s = 0;
  for (const auto& t : tensors_) s += t.read_bytes();
  return s;
}
std::uint64_t Traffic::total_write_bytes() const {
  std::uint64_t s = 0;
  for (const auto& t : tensors_) s += t.write_bytes();
  return s;
}
void Traffic::merge(const Traffic& other) {
  for (const auto& t : other.tensors_) {
    auto& mine = entry(t.name);
    mine.element_bytes = t.element_bytes;
    mine.read_elements += t.read_elements;
    mine.write_elements += t.write_elements;
  }
  flops_ += other.flops_;
}

}  // namespace flashlab::ref
