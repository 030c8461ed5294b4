#include "core/progress.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace flashlab::app {

namespace {
using Clock = std::chrono::steady_clock;
constexpr auto kQuiet = std::chrono::seconds(1);          // runs shorter than this print nothing
constexpr auto kInterval = std::chrono::milliseconds(200);

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
}  // namespace

bool Progress::enabled() { return ::isatty(STDERR_FILENO) == 1; }

Progress::Progress(std::string what, std::vector<Stage> stages)
    : what_(std::move(what)), stages_(std::move(stages)), start_(Clock::now()), stage_start_(start_) {
  for (const auto& s : stages_) total_work_ += std::max(s.work, 0.0);
  if (enabled() && !stages_.empty()) ticker_ = std::thread([this] { tick(); });
}

Progress::~Progress() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (ticker_.joinable()) ticker_.join();
  if (drawn_) std::fputs("\r\033[K", stderr);
}

void Progress::next() {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto now = Clock::now();
  const std::size_t s = stage_.load();
  if (s < stages_.size()) done_work_ += std::max(stages_[s].work, 0.0);
  done_seconds_ += seconds(now - stage_start_);
  stage_start_ = now;
  stage_.store(s + 1);
}

std::string Progress::line() const {
  const auto now = Clock::now();
  const std::size_t s = std::min(stage_.load(), stages_.size() - 1);
  std::ostringstream os;
  os << what_ << ": " << stages_[s].name << " (" << s + 1 << "/" << stages_.size() << ")";
  const double elapsed = seconds(now - start_);
  if (done_work_ > 0 && done_seconds_ > 0 && total_work_ > 0) {
    const double rate = done_work_ / done_seconds_;  // work per second, from the finished stages
    const double in_stage = std::min(rate * seconds(now - stage_start_), 0.99 * stages_[s].work);
    const double done = std::min(done_work_ + in_stage, total_work_);
    os << ", " << int(100.0 * done / total_work_) << "% of the estimated work, " << int(elapsed) << " s elapsed, ~"
       << int((total_work_ - done) / rate + 0.5) << " s left";
  } else {
    os << ", " << int(elapsed) << " s elapsed, time left: estimating";
  }
  return os.str();
}

void Progress::tick() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (stop_cv_.wait_for(lock, kQuiet, [this] { return stop_; })) return;
  while (!stop_) {
    std::fprintf(stderr, "\r\033[K%s", line().c_str());
    std::fflush(stderr);
    drawn_ = true;
    stop_cv_.wait_for(lock, kInterval, [this] { return stop_; });
  }
}

}  // namespace flashlab::app
