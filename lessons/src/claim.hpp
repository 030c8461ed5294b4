// Free-text answers judged by the claim they make, not by the words they contain (private to
// the checker). An answer is read clause by clause; a clause that names the expected claim
// affirms it, unless the clause is negated ("contraction does not matter"), and a clause that
// names the opposite claim ("the re-reads miss in L2") or a distractor ("online softmax") as
// true refutes the answer. What the claim is about must be right too: the thing named next to
// it ("hits in DRAM", "a contraction over d") is checked against the question's right and wrong
// quantities. The rules, with the phrasings they were tested on, are in docs/lessons.md.
#pragma once

#include <string>
#include <vector>

namespace flashlab::lessons::detail {

/// What a question accepts and refuses (lesson.txt: accept, reject, contrary, about, not.about).
struct ClaimSpec {
  std::vector<std::string> affirm;     ///< phrases that state the expected claim ("contraction", "hit in l2")
  std::vector<std::string> distract;   ///< other answers; asserted as true, the answer is wrong
  std::vector<std::string> contrary;   ///< phrases that state the opposite claim ("miss", "materialised")
  std::vector<std::string> about;      ///< what the claim is about, right ("l2", "v", "j")
  std::vector<std::string> not_about;  ///< what the claim is about, wrong ("dram", "d", "q")
};

/// The judgement of one answer.
struct ClaimVerdict {
  bool correct = false;  ///< the answer makes the expected claim and nothing refutes it
  std::string why;       ///< when wrong: what is wrong with it, quoting the answer's own words
};

/// Judges `answer` against `spec`.
ClaimVerdict judge_claim(const std::string& answer, const ClaimSpec& spec);

}  // namespace flashlab::lessons::detail
