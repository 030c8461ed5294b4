// "[B, N, H, d]" for error messages. Written with a stream rather than Shape::str(): GCC 12 at -O2
// reports a false -Wrestrict inside the `"[" + std::to_string(…)` chain of Shape::str().
#pragma once

#include "flashlab/reference/tensor.hpp"

#include <sstream>
#include <string>

namespace flashlab::ref::mta::detail {

inline std::string shape_text(const Shape& s) {
  std::ostringstream os;
  os << '[' << s.batch << ", " << s.seq << ", " << s.heads << ", " << s.head_dim << ']';
  return os.str();
}

}  // namespace flashlab::ref::mta::detail
