// The traffic chapter's command and picture (cmd_traffic_chapter.cpp): `flashlab traffic levels`
// and the `--svg FILE` flag of `flashlab traffic attention`.
#pragma once

#include <vector>

#include "core/cli.hpp"
#include "flashlab/reference/attention_traffic.hpp"

namespace flashlab::app {

/// `flashlab traffic levels …` (args after "levels"): the three-level table. Returns an exit code.
int cmd_traffic_levels(const Args& args);

/// True when `--svg FILE` was given.
bool traffic_svg_wanted(const po::variables_map& vm);

/// Writes the plot of `flashlab traffic attention --svg FILE`: bytes against N for naive, FA1
/// and FA2, the model for every N of `seqs` and the recorded measurement where it has that N
/// and `base`'s shape. @throws UsageError when the file cannot be written.
void write_traffic_svg(const po::variables_map& vm, const std::vector<std::size_t>& seqs,
                       const ref::AttentionProblem& base);

}  // namespace flashlab::app
