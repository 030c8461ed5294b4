// Answers to the lesson questions: every expected answer is accepted, typical wrong ones are
// refused with a counterexample, malformed ones are errors (exit 2).
#include <catch2/catch.hpp>

#include "flashlab/lessons/checker.hpp"
#include "flashlab/lessons/lesson.hpp"

using namespace flashlab::lessons;

namespace {
AnswerReport answer(const char* id, const std::string& text) {
  const Lesson* l = find_lesson(id);
  REQUIRE(l);
  return check_answer(*l, text);
}
}  // namespace

TEST_CASE("answers: the expected answer of every question is accepted", "[answers]") {
  for (const auto& l : catalogue()) {
    if (l.questions.empty()) continue;
    std::string text;
    for (const auto& q : l.questions) text += (text.empty() ? "" : "; ") + q.key + "=" + q.expected;
    if (l.questions.size() == 1 && (l.questions[0].kind == AnswerKind::Choice || l.questions[0].kind == AnswerKind::Keyword))
      text = l.questions[0].expected;
    INFO("lesson " << l.id << ": " << text);
    const auto r = check_answer(l, text);
    INFO(r.to_text());
    CHECK(r.all_correct);
    CHECK(r.exit_code() == 0);
  }
}

TEST_CASE("answers: equivalent formulas, positional answers", "[answers]") {
  CHECK(answer("4", "n + n + n; n").all_correct);
  CHECK(answer("4", "writes=n, reads=3*n").all_correct);
  CHECK(answer("4", "reads=3n writes=n").all_correct);  // typed without quotes or separators
  CHECK(answer("ai-order", "inner=n(2n+3); outer=n(3n+2); ai=n/(2n+3)").all_correct);
  CHECK(answer("ai-flash", "flops=2nd*2n; kv=2dn^2/Br; ai=2*Br").all_correct);
  CHECK(answer("bwd-compute", "3d^2n; 3n*d*d").all_correct);
  CHECK(answer("fa1-order", "-1 + n").all_correct);
  CHECK(answer("why-dw", " (B) ").all_correct);
  CHECK(answer("contraction", "Contraction: P only appears inside a weighted sum").all_correct);
}

TEST_CASE("answers: wrong answers say what is wrong", "[answers][wrong]") {
  auto r = answer("5", "reads=3n; writes=n");
  CHECK(!r.all_correct);
  CHECK(r.exit_code() == 1);
  CHECK_THAT(r.to_text(), Catch::Contains("✗ reads") && Catch::Contains("at n=5: expected 10, got 15") &&
                              Catch::Contains("✓ writes"));
  auto half = answer("4", "reads=3n");
  CHECK(!half.all_correct);
  CHECK_THAT(half.to_text(), Catch::Contains("writes: not answered"));
  auto flash = answer("ai-flash", "flops=4n^2d; kv=2n^2d; ai=2Br");
  CHECK_THAT(flash.to_text(), Catch::Contains("✗ kv"));
  CHECK(!answer("why-dw", "a").all_correct);
  CHECK(!answer("contraction", "online softmax").all_correct);
  CHECK(!answer("d-trick", "without=1; with=1").all_correct);
  CHECK(!answer("bwd-order", "rows=2; cols=1").all_correct);
  CHECK(!answer("inner6", "cycles=22; loads=10").all_correct);
}

TEST_CASE("answers: malformed answers are errors with a hint", "[answers][errors]") {
  auto unknown = answer("4", "reeds=3n");
  CHECK(unknown.exit_code() == 2);
  CHECK_THAT(unknown.error, Catch::Contains("unknown answer name 'reeds'"));
  CHECK_THAT(unknown.hint, Catch::Contains("reads, writes"));
  auto bad = answer("4", "reads=3q");
  CHECK(bad.exit_code() == 2);
  CHECK_THAT(bad.error, Catch::Contains("unknown name 'q'"));
  auto many = answer("4", "1; 2; 3");
  CHECK_THAT(many.error, Catch::Contains("more answers than questions"));
  auto twice = answer("4", "reads=3n; reads=3n");
  CHECK_THAT(twice.error, Catch::Contains("answered twice"));
  auto letter = answer("why-dw", "bee");
  CHECK_THAT(letter.error, Catch::Contains("not one letter"));
  auto number = answer("d-trick", "without=n");
  CHECK(number.exit_code() == 2);
  CHECK(answer("4", "  ").exit_code() == 2);
}
