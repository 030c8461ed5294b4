// The traffic chapter's rows for Multi-Token Attention and STREAM (`flashlab traffic levels`):
// measured live on the GPU at the chapter's shapes, beside the reference's counts.
#pragma once

#include <string>

#include "flashlab/lessons/traffic_chapter.hpp"

namespace flashlab::app {

/// Runs the clear MTA passes (fwd, bwd, infer) and the clear STREAM estimate and apply at the
/// chapter's shapes under the CUPTI probe and counts the same passes with the reference; `command`
/// is recorded with the rows. Builds with CUDA only; throws UsageError when no device can be used.
lessons::FamilyMeasurement measure_families_live(const std::string& command, const std::string& date);

}  // namespace flashlab::app
