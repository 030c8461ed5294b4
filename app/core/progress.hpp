// Progress of a long CPU run, on stderr, for a person watching a terminal: what runs, how far it
// is, and the time left. Nothing at all when stderr is not a terminal (pipes, files, tests) or
// when the run ends within a second. A run is a list of stages with estimated work (flops); the
// reference's loops report nothing themselves, so the fraction inside a stage is extrapolated
// from the rate of the stages already done (and says "estimating" until one is).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace flashlab::app {

/// One stage of a run: a name ("naive float64 reference") and its estimated work.
struct Stage {
  std::string name;  ///< what the stage does
  double work = 1;   ///< estimated work (e.g. flops); only ratios matter
};

/// Prints `\r<what>: <stage> (i/n), p% of the estimated work, t s elapsed, ~r s left` on stderr
/// about five times a second after the first second, when stderr is a terminal.
class Progress {
 public:
  /// Starts the clock on the first stage.
  Progress(std::string what, std::vector<Stage> stages);
  /// Stops the ticker and clears the line it drew.
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  /// Marks the current stage done and starts the next.
  void next();
  /// True when progress would be shown (stderr is a terminal).
  [[nodiscard]] static bool enabled();

 private:
  void tick();
  [[nodiscard]] std::string line() const;
  std::string what_;
  std::vector<Stage> stages_;
  double total_work_ = 0;
  std::chrono::steady_clock::time_point start_, stage_start_;
  std::atomic<std::size_t> stage_{0};
  double done_work_ = 0;  // work of the finished stages (guarded by mutex_)
  double done_seconds_ = 0;
  mutable std::mutex mutex_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
  bool drawn_ = false;
  std::thread ticker_;
};

}  // namespace flashlab::app
