// Answers to the lesson questions: every expected answer is accepted, typical wrong ones are
// refused with a counterexample, malformed ones are errors (exit 2).
#include <catch2/catch.hpp>

#include "flashlab/lessons/checker.hpp"
#include "flashlab/lessons/lesson.hpp"

#include <cctype>

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
    if (l.questions.size() == 1 && (l.questions[0].kind == AnswerKind::Choice || l.questions[0].kind == AnswerKind::Claim))
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

TEST_CASE("answers: formulas are compared at random points, not only at fixed ones", "[answers]") {
  // Equal to 3n at the fixed points n = 5, 8, 13, 64, 1000, different everywhere else.
  const std::string sly = "3n + (n-5)(n-8)(n-13)(n-64)(n-1000)";
  auto r = answer("4", "reads=" + sly + "; writes=n");
  CHECK(!r.all_correct);
  CHECK_THAT(r.to_text(), Catch::Contains("✗ reads"));
}

TEST_CASE("answers: free text is judged by the claim it makes", "[answers][claims]") {
  CHECK(answer("contraction", "a contraction").all_correct);
  CHECK(answer("contraction", "P is only used inside a reduction over j").all_correct);
  CHECK(answer("contraction", "the contraction, not online softmax").all_correct);
  CHECK(answer("contraction", "not online softmax but the contraction").all_correct);
  CHECK(answer("contraction", "weighted sum").all_correct);
  // A distractor asserted, the claim denied, its opposite, the right word about the wrong thing:
  // each says what is wrong, in the answer's own words.
  auto distractor = answer("contraction", "online softmax and a contraction");
  CHECK(!distractor.all_correct);
  CHECK_THAT(distractor.to_text(), Catch::Contains("\"online softmax\" is not it"));
  auto negated = answer("contraction", "contraction does not matter");
  CHECK(!negated.all_correct);
  CHECK_THAT(negated.to_text(), Catch::Contains("names it only to deny it (\"contraction does not matter\")"));
  auto opposite = answer("contraction", "P must be materialised for the contraction");
  CHECK_THAT(opposite.to_text(), Catch::Contains("\"materialised\" says the opposite"));
  auto about = answer("contraction", "the contraction over d");
  CHECK_THAT(about.to_text(), Catch::Contains("wrong quantity") && Catch::Contains("about d,"));
  CHECK(!answer("contraction", "contractionless").all_correct);  // a substring is not a word
  CHECK(!answer("contraction", "abstraction").all_correct);
  CHECK_THAT(answer("contraction", "tiling").to_text(), Catch::Contains("\"tiling\" is not it"));
  // The DRAM-vs-L2 question: the right verb about the wrong memory, and the opposite claim.
  CHECK(answer("traffic-levels", "rereads=64; why=re-reads hit in L2").all_correct);
  CHECK_THAT(answer("traffic-levels", "rereads=64; why=hits in DRAM").to_text(), Catch::Contains("about dram"));
  CHECK_THAT(answer("traffic-levels", "rereads=64; why=they miss in L2").to_text(), Catch::Contains("\"miss\" says the opposite"));
  CHECK(!answer("traffic-levels", "rereads=64; why=the data is not cached").all_correct);
  CHECK(!answer("traffic-levels", "rereads=64; why=compression").all_correct);
  CHECK(answer("traffic-levels", "rereads=Tr; why=K and V are served from L2").exit_code() == 2);  // Tr is not a number
  // Commas and semicolons inside free text belong to it; a following `key=` ends it.
  CHECK(answer("traffic-levels", "rereads=64; why=K and V fit in L2, so only the first read goes to DRAM").all_correct);
  CHECK(answer("traffic-levels", "why=after the first tile, K_j and V_j come from L2; rereads=64").all_correct);
  CHECK(answer("traffic-levels", "64; after the first tile, K_j and V_j come from L2").all_correct);
}

TEST_CASE("answers: numbers in any notation the program prints", "[answers]") {
  CHECK(answer("2", "2.5e1").all_correct);
  CHECK(answer("2", "2.5E+01").all_correct);
  CHECK(answer("safety", "bound=1.0; overflow=7.1e2; form=a").all_correct);
  // Rounded to the digits written: at least four significant digits (the traffic table's).
  auto gb = answer("traffic-fwd", "naive=4.362 GB; fa1=6.59266e+09; fa2=2080.25 MiB");
  INFO(gb.to_text());
  CHECK(gb.all_correct);
  CHECK_THAT(gb.to_text(), Catch::Contains("to the 4 significant digits given"));
  auto coarse = answer("traffic-fwd", "naive=4.36 GB; fa1=6.59266e+09; fa2=2080.25 MiB");
  CHECK(!coarse.all_correct);
  CHECK_THAT(coarse.to_text(), Catch::Contains("3 significant digits cannot tell"));
  CHECK(!answer("2", "25.4").all_correct);  // rounding accepts only the exact value's digits
  // A unit where the answer is a count is malformed, and so is an unknown unit.
  CHECK_THAT(answer("2", "25 GB").error, Catch::Contains("a count, not a number of bytes"));
  CHECK_THAT(answer("traffic-fwd", "naive=4 XB; fa1=1; fa2=1").error, Catch::Contains("unknown unit 'XB'"));
}

TEST_CASE("answers: the tile merge takes exp and max, compared at random real points", "[answers][merge]") {
  CHECK(answer("merge", "m=max(mb, ma); d=db*exp(mb - max(ma,mb)) + da*exp(ma - max(ma,mb)); "
                        "num=na*exp(ma-max(ma,mb)) + nb*exp(mb-max(ma,mb))").all_correct);
  // Forgetting to rescale one tile: right only when that tile holds the maximum.
  auto half = answer("merge", "m=max(ma,mb); d=da + db*exp(mb - max(ma,mb)); num=na + nb");
  CHECK(!half.all_correct);
  CHECK_THAT(half.to_text(), Catch::Contains("✗ d") && Catch::Contains("✗ num") && Catch::Contains("✓ m"));
  auto bad = answer("merge", "m=max(ma); d=1; num=1");
  CHECK(bad.exit_code() == 2);
  CHECK_THAT(bad.error, Catch::Contains("two or more arguments"));
  CHECK(answer("safety", "bound=1; overflow=710; form=a").all_correct);
  CHECK(!answer("safety", "bound=1; overflow=89; form=b").all_correct);
}

TEST_CASE("lessons: hints, budgets and statements do not state a quiz's answer", "[lessons][answers]") {
  // Answers worth hiding: numbers of two or more digits and formulas in n (single digits and
  // words occur in ordinary prose). Shown texts: every hint, the statement, the hidden budget.
  for (const auto& l : catalogue()) {
    for (const auto& q : l.questions) {
      if (q.kind != AnswerKind::Formula && q.kind != AnswerKind::Number) continue;
      const bool worth = q.expected.size() >= 2 && q.expected.find('(') == std::string::npos &&
                         q.expected.find("model") == std::string::npos;
      // A number that is part of the lesson's given shape (d = 64) is data, not the answer.
      const bool given = !l.shape.empty() && l.shape.find("=" + q.expected) != std::string::npos;
      if (!worth || given) continue;
      std::vector<std::string> forms{q.expected};
      std::string spaced = q.expected;  // "n - 1" also as "n − 1"
      for (auto at = spaced.find(" - "); at != std::string::npos; at = spaced.find(" - ", at + 1))
        spaced.replace(at, 3, " − ");
      forms.push_back(spaced);
      std::vector<std::string> shown = l.hints;
      shown.push_back(l.statement);
      if (l.trace && !l.trace->hidden_target_text.empty()) shown.push_back(l.trace->hidden_target_text);
      for (const auto& text : shown) {
        for (const auto& f : forms) {
          INFO("lesson " << l.id << ", question " << q.key << " = " << f << ", in:\n" << text);
          // As a whole token: not preceded or followed by a digit or a letter.
          bool found = false;
          for (auto at = text.find(f); at != std::string::npos && !found; at = text.find(f, at + 1)) {
            const bool left = at == 0 || !std::isalnum(static_cast<unsigned char>(text[at - 1]));
            const std::size_t e = at + f.size();
            const bool right = e >= text.size() || !std::isalnum(static_cast<unsigned char>(text[e]));
            found = left && right;
          }
          CHECK(!found);
        }
      }
    }
  }
}

TEST_CASE("answers: a wrong number says which way it is off, never the answer", "[answers]") {
  auto r = answer("inner6", "cycles=22; loads=10");
  CHECK(!r.all_correct);
  CHECK_THAT(r.to_text(), Catch::Contains("22 is a little too large") && !Catch::Contains("20") && !Catch::Contains(" 8"));
  auto close = answer("2", "24");
  CHECK_THAT(close.to_text(), Catch::Contains("a little too small (within 10%)") && !Catch::Contains("25"));
}
