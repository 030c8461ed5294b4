// Per-user progress "). A tiny line format
// so that a person can read and edit it:
//   trace <id> <summary>      the lesson's trace check passed (summary: the cost it passed with)
//   answers <id>              every question answered correctly
//   hints <id> <k>            hints 1..k have been shown
#include "flashlab/lessons/progress.hpp"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <unistd.h>

namespace flashlab::lessons {

std::filesystem::path progress_path() {
  const char* xdg = std::getenv("XDG_STATE_HOME");
  if (xdg && *xdg && std::filesystem::path(xdg).is_absolute()) {
    return std::filesystem::path(xdg) / "flashlab" / "progress";
  }
  const char* home = std::getenv("HOME");
  if (!home || !*home) {
    throw std::runtime_error("cannot find where to keep lesson progress: neither XDG_STATE_HOME nor HOME is set");
  }
  return std::filesystem::path(home) / ".local" / "state" / "flashlab" / "progress";
}

Progress load_progress(const std::filesystem::path& file) {
  Progress p;
  std::ifstream in(file);
  if (!in) return p;  // no file yet: nothing done
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream is(line);
    std::string kind, id;
    if (!(is >> kind >> id)) continue;
    std::string rest;
    std::getline(is, rest);
    if (!rest.empty() && rest.front() == ' ') rest.erase(0, 1);
    if (kind == "trace") {
      p.trace_passed[id] = rest;
    } else if (kind == "answers") {
      p.answers_passed[id] = "answered";
    } else if (kind == "hints") {
      try {
        p.hints_seen[id] = std::stoi(rest);
      } catch (const std::exception&) {
        // a hand-edited line that is not a number: ignore it
      }
    }
  }
  return p;
}

void save_progress(const std::filesystem::path& file, const Progress& p) {
  std::error_code ec;
  std::filesystem::create_directories(file.parent_path(), ec);
  if (ec) throw std::runtime_error("cannot create " + file.parent_path().string() + ": " + ec.message());
  const auto tmp = file.string() + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp);
    if (!out) throw std::runtime_error("cannot write " + tmp);
    out << "# flashlab lesson progress (flashlab lesson list shows it)\n";
    for (const auto& [id, s] : p.trace_passed) out << "trace " << id << " " << s << "\n";
    for (const auto& [id, s] : p.answers_passed) out << "answers " << id << "\n";
    for (const auto& [id, k] : p.hints_seen) out << "hints " << id << " " << k << "\n";
    if (!out) throw std::runtime_error("cannot write " + tmp);
  }
  std::filesystem::rename(tmp, file, ec);
  if (ec) {
    std::filesystem::remove(tmp);
    throw std::runtime_error("cannot write " + file.string() + ": " + ec.message());
  }
}

}  // namespace flashlab::lessons
