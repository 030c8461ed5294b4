// The wrong-answer catalogue: for every lesson, answers that must be refused, and (under
// tests/lessons/right/) answers that must be accepted.
//   wrong/<id>/*.trace   traces that are wrong (value), over budget, re-read needlessly, misuse
//                        registers, use another method or do not assemble. Each states what the
//                        checker must say:
//                          # verdict: wrong | over | asm
//                          # expect: <a substring of the report>   (one or more)
//                          # refuse: <a substring the report must not contain>
//                        Each is checked with two seeds: a fixed one and one drawn anew, so a
//                        verdict that depends on the sizes or inputs a check happens to draw fails.
//   wrong/<id>/answers.txt   one wrong answer a line (`lesson answer` text): each must give exit 1
//   right/<id>/answers.txt   one right answer a line: each must give exit 0
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include "flashlab/lessons/checker.hpp"
#include "flashlab/lessons/lesson.hpp"

using namespace flashlab::lessons;
namespace fs = std::filesystem;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Expectation {
  std::string verdict;
  std::vector<std::string> expect;
  std::vector<std::string> refuse;
};

Expectation read_expectation(const std::string& text) {
  Expectation e;
  std::istringstream is(text);
  std::string line;
  while (std::getline(is, line)) {
    if (line.rfind("# verdict: ", 0) == 0) e.verdict = line.substr(11);
    if (line.rfind("# expect: ", 0) == 0) e.expect.push_back(line.substr(10));
    if (line.rfind("# refuse: ", 0) == 0) e.refuse.push_back(line.substr(10));
  }
  return e;
}

Verdict to_verdict(const std::string& s) {
  if (s == "wrong") return Verdict::Wrong;
  if (s == "over") return Verdict::OverBudget;
  if (s == "asm") return Verdict::DoesNotAssemble;
  FAIL("bad verdict line: " << s);
  return Verdict::Passed;
}

// The answer lines of an answers.txt: everything but blank lines and `#` comments.
std::vector<std::string> answer_lines(const fs::path& p) {
  std::vector<std::string> out;
  std::istringstream is(slurp(p));
  for (std::string line; std::getline(is, line);) {
    if (!line.empty() && line[0] != '#') out.push_back(line);
  }
  return out;
}

const fs::path kRoot = fs::path(FLASHLAB_SOURCE_DIR) / "tests" / "lessons";

}  // namespace

TEST_CASE("lessons: every wrong answer in the catalogue fails with the expected message", "[lessons][wrong]") {
  const fs::path root = kRoot / "wrong";
  REQUIRE(fs::is_directory(root));
  std::map<std::string, int> per_lesson;
  const std::uint64_t fresh = std::random_device{}();
  for (const auto& dir : fs::directory_iterator(root)) {
    const std::string id = dir.path().filename().string();
    const Lesson* lesson = find_lesson(id);
    INFO("folder " << dir.path());
    REQUIRE(lesson != nullptr);
    for (const auto& f : fs::directory_iterator(dir.path())) {
      if (f.path().extension() != ".trace") continue;
      const std::string text = slurp(f.path());
      const Expectation e = read_expectation(text);
      INFO("wrong answer " << id << "/" << f.path().filename().string());
      REQUIRE(!e.verdict.empty());
      REQUIRE(!e.expect.empty());
      for (const std::uint64_t seed : {std::uint64_t{1}, fresh}) {
        CheckOptions opt;
        opt.seed = seed;
        const CheckReport rep = check_trace(*lesson, text, f.path().filename().string(), opt);
        const std::string report = rep.to_text();
        INFO("seed " << seed << ", report:\n" << report);
        CHECK(rep.verdict == to_verdict(e.verdict));
        CHECK(rep.exit_code() == (e.verdict == "asm" ? 2 : 1));
        for (const auto& s : e.expect) CHECK_THAT(report, Catch::Contains(s));
        for (const auto& s : e.refuse) CHECK_THAT(report, !Catch::Contains(s));
        // A trace that is not passed is never praised for what it saves.
        CHECK_THAT(report, !Catch::Contains("beats the target"));
      }
      ++per_lesson[id];
    }
  }
  // At least three wrong answers for every lesson with a trace.
  for (const auto& l : catalogue()) {
    if (!l.trace) continue;
    INFO("lesson " << l.id);
    CHECK(per_lesson[l.id] >= 3);
  }
}

TEST_CASE("lessons: every wrong answer in the answer catalogue is refused and every right one accepted",
          "[lessons][wrong][answers]") {
  int wrong = 0, right = 0;
  for (const char* kind : {"wrong", "right"}) {
    for (const auto& dir : fs::directory_iterator(kRoot / kind)) {
      const fs::path file = dir.path() / "answers.txt";
      if (!fs::exists(file)) continue;
      const Lesson* lesson = find_lesson(dir.path().filename().string());
      INFO("folder " << dir.path());
      REQUIRE(lesson != nullptr);
      for (const auto& line : answer_lines(file)) {
        const auto r = check_answer(*lesson, line);
        INFO(kind << " answer to " << lesson->id << ": " << line << "\n" << r.to_text());
        CHECK(r.exit_code() == (std::string(kind) == "wrong" ? 1 : 0));
        ++(std::string(kind) == "wrong" ? wrong : right);
      }
    }
  }
  CHECK(wrong >= 60);
  CHECK(right >= 40);
}
