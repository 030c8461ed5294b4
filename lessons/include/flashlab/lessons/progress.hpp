/// @file progress.hpp
/// @brief Per-user lesson progress, kept in `$XDG_STATE_HOME/flashlab/progress`
/// (fallback `~/.local/state/flashlab/progress`), one line per lesson part.
#pragma once

#include <filesystem>
#include <map>
#include <string>

namespace flashlab::lessons {

/// What a user has passed so far.
struct Progress {
  /// lesson id → best passing cost summary of its trace check ("7 cycles, 4 LOADs").
  std::map<std::string, std::string> trace_passed;
  /// lesson id → "answered" when every question was answered correctly.
  std::map<std::string, std::string> answers_passed;
  /// lesson id → highest hint level shown so far.
  std::map<std::string, int> hints_seen;
};

/// The progress file: `$XDG_STATE_HOME/flashlab/progress`, else `$HOME/.local/state/flashlab/progress`.
/// @throws std::runtime_error when neither XDG_STATE_HOME nor HOME is set.
std::filesystem::path progress_path();

/// Reads the progress file; a missing file is empty progress. Unreadable lines are skipped.
Progress load_progress(const std::filesystem::path& file);

/// Writes the progress file atomically (temp file + rename), creating the directory.
/// @throws std::runtime_error naming the path when it cannot be written.
void save_progress(const std::filesystem::path& file, const Progress& p);

}  // namespace flashlab::lessons
