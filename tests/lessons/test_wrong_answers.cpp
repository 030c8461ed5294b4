// The wrong-answer catalogue : for every trace lesson, traces under
// tests/lessons/wrong/<id>/ that are wrong (value), over budget, re-read needlessly, misuse
// registers or do not assemble. Each file states what the checker must say:
//   # verdict: wrong | over | asm
//   # expect: <a substring of the report>        (one or more)
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <map>
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
};

Expectation read_expectation(const std::string& text) {
  Expectation e;
  std::istringstream is(text);
  std::string line;
  while (std::getline(is, line)) {
    if (line.rfind("# verdict: ", 0) == 0) e.verdict = line.substr(11);
    if (line.rfind("# expect: ", 0) == 0) e.expect.push_back(line.substr(10));
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

}  // namespace

TEST_CASE("lessons: every wrong answer in the catalogue fails with the expected message", "[lessons][wrong]") {
  const fs::path root = fs::path(FLASHLAB_SOURCE_DIR) / "tests" / "lessons" / "wrong";
  REQUIRE(fs::is_directory(root));
  std::map<std::string, int> per_lesson;
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
      const CheckReport rep = check_trace(*lesson, text, f.path().filename().string());
      const std::string report = rep.to_text();
      INFO("report:\n" << report);
      CHECK(rep.verdict == to_verdict(e.verdict));
      CHECK(rep.exit_code() == (e.verdict == "asm" ? 2 : 1));
      for (const auto& s : e.expect) CHECK_THAT(report, Catch::Contains(s));
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
