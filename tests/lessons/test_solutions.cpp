// Every lesson's reference solution must pass its own check , and the
// starters must at least assemble or fail in a way that names the place.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <random>

#include "flashlab/lessons/checker.hpp"
#include "flashlab/lessons/lesson.hpp"

using namespace flashlab::lessons;

TEST_CASE("lessons: the catalogue covers every problem and quiz of the toy-machine lesson", "[lessons]") {
  for (const char* id : {"1", "2", "3", "inner6", "4", "5", "6", "welford", "7", "fa2-order", "fa1-order", "ai-order",
                         "ai-flash", "contraction", "why-dw", "bwd-compute", "bwd-order", "d-trick"}) {
    INFO(id);
    const Lesson* l = find_lesson(id);
    REQUIRE(l != nullptr);
    CHECK(!l->statement.empty());
    CHECK((l->trace.has_value() || !l->questions.empty()));
  }
  CHECK(find_lesson("nope") == nullptr);
}

TEST_CASE("lessons: every reference solution passes its check", "[lessons][solutions]") {
  for (const auto& l : catalogue()) {
    if (!l.trace) continue;
    INFO("lesson " << l.id);
    // With a fixed seed and one drawn anew: a right trace passes whatever sizes a check draws.
    for (const std::uint64_t seed : {std::uint64_t{1}, std::uint64_t{std::random_device{}()}}) {
      CheckOptions opt;
      opt.seed = seed;
      const CheckReport rep = check_trace(l, l.trace->solution, l.id + "/solution.trace", opt);
      INFO("seed " << seed << "\n" << rep.to_text());
      CHECK(rep.verdict == Verdict::Passed);
      CHECK(rep.exit_code() == 0);
      CHECK(rep.runs >= kRandomRuns);
      // Every target was graded and met exactly (a beaten budget would make a quiz answer wrong).
      CHECK(!rep.costs.empty());
      for (const auto& c : rep.costs) CHECK(c.measured == c.target);
      CHECK_THAT(rep.to_text(), !Catch::Contains("beats the target"));
      // The small and boundary sizes, and large ones, whatever the trace says.
      if (!l.trace->ns.empty()) {
        for (int n = l.trace->smallest_n; n <= 24; ++n)
          CHECK(std::find(rep.sizes.begin(), rep.sizes.end(), n) != rep.sizes.end());
        CHECK(std::count_if(rep.sizes.begin(), rep.sizes.end(), [](int n) { return n > 24; }) >= 3);
      }
    }
  }
}

TEST_CASE("lessons: the lesson text's costs are met exactly by the reference solutions", "[lessons][solutions]") {
  std::map<std::string, CheckReport> reports;  // one check per lesson
  auto cost = [&](const char* id, const std::string& metric, int n) -> long long {
    const Lesson* l = find_lesson(id);
    REQUIRE(l);
    if (!reports.count(id)) reports[id] = check_trace(*l, l->trace->solution, "solution.trace");
    for (const auto& c : reports.at(id).costs) {
      if (c.metric == metric && c.n == n) return static_cast<long long>(c.measured);
    }
    return -1;
  };
  CHECK(cost("1", "cycles", 0) == 7);
  CHECK(cost("1", "LOADs", 0) == 4);
  CHECK(cost("2", "cycles", 0) == 25);
  CHECK(cost("2", "LOADs", 0) == 13);
  CHECK(cost("3", "cycles", 0) == 22);
  CHECK(cost("3", "LOADs", 0) == 10);
  CHECK(cost("inner6", "cycles", 0) == 20);
  CHECK(cost("inner6", "LOADs", 0) == 8);
  CHECK(cost("4", "DRAM reads", 7) == 21);  // 3n
  CHECK(cost("4", "DRAM writes", 7) == 7);  // n
  CHECK(cost("5", "DRAM reads", 7) == 14);  // 2n
  CHECK(cost("5", "DRAM writes", 7) == 7);
  CHECK(cost("6", "DRAM reads", 7) == 8);   // n + 1
  CHECK(cost("welford", "DRAM writes", 4) == 2);
  CHECK(cost("7", "DRAM reads", 6) == 26);  // 4n + 2: one pass over K and V
  // The lesson text's cost-comparison table, in tiles (n = 5).
  CHECK(cost("fa2-order", "Q loads", 5) == 5);
  CHECK(cost("fa2-order", "K loads", 5) == 25);
  CHECK(cost("fa2-order", "V loads", 5) == 25);
  CHECK(cost("fa2-order", "O loads", 5) == 5);
  CHECK(cost("fa2-order", "O stores", 5) == 5);
  CHECK(cost("fa1-order", "Q loads", 5) == 25);
  CHECK(cost("fa1-order", "K loads", 5) == 5);
  CHECK(cost("fa1-order", "V loads", 5) == 5);
  CHECK(cost("fa1-order", "O loads", 5) == 25);
  CHECK(cost("fa1-order", "O stores", 5) == 25);
}
