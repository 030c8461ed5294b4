// Host-side helpers of the clear MTA kernels shared by the front door (front_door.cpp), the
// host wrappers (host.cpp) and the traffic probe (internal; host code only: it includes the
// reference's Eigen-based headers, which device code avoids).
#pragma once

#include "mta/mta_tile.cuh"

#include "flashlab/reference/mta.hpp"
#include "flashlab/reference/tensor.hpp"

#include <vector>

namespace flashlab::cuda::detail::mta {

/// The launch description of one pass from the reference's parameters: the forward tiling
/// (Br = B − Pq, Bc = B − 2Pk; also inference) or, with `backward`, the doubled halos. Throws
/// std::invalid_argument as the reference's tilings do, or when a size does not fit an int.
Launch make_launch(const ref::Shape& shape, const ref::mta::Params& p, bool backward);

/// A [B, N, H, 1] statistics tensor (M, L) as the kernels' [B, H, N] vector.
std::vector<float> stats_to_device_layout(const ref::Tensor<float>& s);
/// The kernels' [B, H, N] statistics vector as a [B, N, H, 1] tensor.
ref::Tensor<float> stats_from_device_layout(const std::vector<float>& v, const ref::Shape& shape);

}  // namespace flashlab::cuda::detail::mta
