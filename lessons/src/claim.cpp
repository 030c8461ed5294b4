// The claim matcher (claim.hpp). The answer is lower-cased, contractions are spelled out
// ("isn't" → "is not") and it is cut into clauses at punctuation and at words that start a new
// statement (but, because, so, …). Inside a clause every word gets a polarity:
//   - a negator (not, no, never, without, …) negates what follows it in the clause;
//   - it also negates what comes before it when it denies relevance: "contraction does not
//     matter", "contraction is irrelevant", "isn't the key" — but not in "a line already in L2 is
//     not fetched again", where the negation belongs to another verb;
//   - "rather than", "instead of", "unlike", "anything but", "not because" negate the rest of the
//     clause and only the rest ("the contraction rather than online softmax");
//   - two negations cancel; "not only", "nothing but" are not negations;
//   - a clause that is only a negation ("contraction? No.") negates the clause before it.
// A phrase counts where its first word stands, with that word's polarity. The object of a claim
// is the nearest right or wrong quantity outside the phrase, within a few words; ties go to the
// word after the phrase ("hits in DRAM").
#include "claim.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <set>

namespace flashlab::lessons::detail {

namespace {

using Words = std::vector<std::string>;

// Lower-case ASCII words; every other byte separates words. Boundaries (punctuation, dashes)
// become the word "|". An apostrophe inside a word is dropped ("isn't" → "isnt") and the
// negative contractions are spelled out afterwards.
Words tokenize(const std::string& text) {
  Words out;
  std::string cur;
  auto flush = [&] {
    if (!cur.empty()) out.push_back(cur);
    cur.clear();
  };
  for (std::size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (std::isalnum(c)) {
      cur += static_cast<char>(std::tolower(c));
      continue;
    }
    if (c == '\'' && !cur.empty()) continue;  // isn't → isnt
    if (c == 0xE2 && i + 2 < text.size() && static_cast<unsigned char>(text[i + 1]) == 0x80) {
      const unsigned char t = static_cast<unsigned char>(text[i + 2]);
      i += 2;
      if ((t == 0x98 || t == 0x99) && !cur.empty()) continue;  // ’ ‘ as an apostrophe
      if (t == 0x93 || t == 0x94) {                            // – —
        flush();
        out.push_back("|");
      } else {
        flush();
      }
      continue;
    }
    flush();
    const bool spaced_dash = c == '-' && (i == 0 || text[i - 1] == ' ') && (i + 1 >= text.size() || text[i + 1] == ' ');
    if (std::string_view(".,;:!?()[]{}\n\"").find(static_cast<char>(c)) != std::string_view::npos || spaced_dash)
      out.push_back("|");
  }
  flush();
  // Negative contractions, written with or without the apostrophe.
  Words spelled;
  for (const auto& w : out) {
    static const std::set<std::string> nt = {"isnt", "arent", "wasnt", "werent", "dont", "doesnt", "didnt",
                                             "cant", "cannot", "wont", "wouldnt", "shouldnt", "couldnt",
                                             "hasnt", "havent", "hadnt", "mustnt", "neednt", "aint"};
    if (nt.count(w)) {
      spelled.push_back(w == "cannot" ? "can" : w.substr(0, w.size() - (w.back() == 't' && w.size() > 3 ? 2 : 0)));
      spelled.push_back("not");
    } else {
      spelled.push_back(w);
    }
  }
  return spelled;
}

Words phrase_words(const std::string& phrase) {
  Words w = tokenize(phrase);
  w.erase(std::remove(w.begin(), w.end(), "|"), w.end());
  return w;
}

bool at(const Words& w, std::size_t i, const Words& p) {
  return !p.empty() && i + p.size() <= w.size() && std::equal(p.begin(), p.end(), w.begin() + static_cast<std::ptrdiff_t>(i));
}

// Words that start a new statement: the clause before them is finished.
const std::set<std::string>& boundary_words() {
  static const std::set<std::string> s = {"but", "however", "whereas", "although", "though", "while", "yet",
                                          "so", "because", "since", "therefore", "thus", "hence", "which"};
  return s;
}

// Negate what follows them, and only that, up to the end of the clause.
const std::vector<Words>& forward_only() {
  static const std::vector<Words> s = [] {
    std::vector<Words> v;
    for (const char* p : {"rather than", "instead of", "as opposed to", "unlike", "other than", "anything but",
                          "everything but", "all but", "not because", "not due to", "not thanks to", "without",
                          "avoid", "avoids", "avoided", "avoiding", "skip", "skips", "skipped", "skipping"})
      v.push_back(phrase_words(p));
    return v;
  }();
  return s;
}

// Not negations, though they start with a negator.
const std::vector<Words>& neutral() {
  static const std::vector<Words> s = [] {
    std::vector<Words> v;
    for (const char* p : {"not only", "not just", "nothing but", "nothing else but", "no more than", "no less than"})
      v.push_back(phrase_words(p));
    return v;
  }();
  return s;
}

// Negate what follows them; those marked as denying relevance also negate what precedes them.
const std::set<std::string>& negators() {
  static const std::set<std::string> s = {"not", "no", "never", "none", "nothing", "nobody", "nowhere", "neither",
                                          "nor", "hardly", "barely", "scarcely", "doubt", "irrelevant",
                                          "unimportant", "unrelated", "useless", "wrong", "false", "incorrect",
                                          "untrue", "myth", "herring", "nope", "nah", "lacks", "lack", "unlikely",
                                          "doubtful", "nonsense"};
  return s;
}

const std::set<std::string>& denies_relevance() {
  static const std::set<std::string> s = {"irrelevant", "unimportant", "unrelated", "useless", "wrong", "false",
                                          "incorrect", "untrue", "myth", "herring", "nothing", "none", "nonsense",
                                          "unlikely", "doubtful"};
  return s;
}

// What a negation denies when it is about the claim itself: "does not matter", "is not the key".
const std::set<std::string>& relevance_words() {
  static const std::set<std::string> s = {"matter", "matters", "mattered", "it", "key", "answer", "reason", "cause",
                                          "relevant", "important", "needed", "involved", "true", "correct", "right",
                                          "role", "help", "helps", "helped", "why", "point", "explanation",
                                          "ingredient", "enough", "case", "work", "works", "apply", "applies",
                                          "happen", "happens", "exist", "exists", "responsible", "trick", "related"};
  return s;
}

bool only_negation(const Words& clause) {
  static const std::set<std::string> filler = {"really", "at", "all", "definitely", "certainly", "of", "course",
                                               "i", "think", "it", "is", "that", "s", "way"};
  bool neg = false;
  for (const auto& w : clause) {
    if (negators().count(w)) neg = true;
    else if (!filler.count(w)) return false;
  }
  return neg;
}

struct Clause {
  Words words;
  bool forced = false;      // after "rather than", "instead of", …: the whole clause is negated
  std::vector<bool> neg;    // per word
};

std::vector<Clause> clauses_of(const Words& all) {
  std::vector<Clause> out(1);
  auto next = [&](bool forced) {
    if (!out.back().words.empty() || out.back().forced) out.emplace_back();
    out.back().forced = forced;
  };
  for (std::size_t i = 0; i < all.size();) {
    const auto& w = all[i];
    if (w == "|") {
      next(false);
      ++i;
      continue;
    }
    bool matched = false;
    for (const auto& p : neutral()) {
      if (!at(all, i, p)) continue;
      for (const auto& x : p) out.back().words.push_back(negators().count(x) ? "_" + x : x);
      i += p.size();
      matched = true;
      break;
    }
    if (matched) continue;
    for (const auto& p : forward_only()) {
      if (!at(all, i, p)) continue;
      next(true);
      i += p.size();
      matched = true;
      break;
    }
    if (matched) continue;
    if (boundary_words().count(w)) {
      next(false);
      ++i;
      continue;
    }
    // "… and not online softmax": a negation after a conjunction starts a new statement.
    if ((w == "and" || w == "or") && i + 1 < all.size() && negators().count(all[i + 1])) {
      next(false);
      ++i;
      continue;
    }
    out.back().words.push_back(w);
    ++i;
  }
  std::vector<Clause> kept;
  for (auto& c : out) {
    if (c.words.empty()) continue;
    c.neg.assign(c.words.size(), false);
    for (std::size_t p = 0; p < c.words.size(); ++p) {
      if (!negators().count(c.words[p])) continue;
      for (std::size_t q = p + 1; q < c.words.size(); ++q) c.neg[q] = !c.neg[q];
      bool backward = denies_relevance().count(c.words[p]) > 0;
      static const std::set<std::string> skip = {"a", "an", "the", "be", "really", "that", "very", "so", "at", "all",
                                                 "what", "much", "any", "to", "do", "does", "did", "is", "are"};
      for (std::size_t q = p + 1, seen = 0; q < c.words.size() && seen < 3 && !backward; ++q) {
        if (skip.count(c.words[q])) continue;
        backward = relevance_words().count(c.words[q]) > 0;
        ++seen;
      }
      if (backward)
        for (std::size_t q = 0; q < p; ++q) c.neg[q] = !c.neg[q];
    }
    if (c.forced)
      for (std::size_t q = 0; q < c.neg.size(); ++q) c.neg[q] = !c.neg[q];
    if (only_negation(c.words) && !kept.empty()) {  // "contraction? No."
      for (std::size_t q = 0; q < kept.back().neg.size(); ++q) kept.back().neg[q] = !kept.back().neg[q];
      continue;
    }
    kept.push_back(std::move(c));
  }
  return kept;
}

struct Hit {
  std::size_t at = 0, len = 0;
  std::string phrase;
};

std::vector<Hit> find_all(const Words& w, const std::vector<std::string>& phrases) {
  std::vector<Hit> out;
  for (const auto& ph : phrases) {
    const Words p = phrase_words(ph);
    for (std::size_t i = 0; i < w.size(); ++i)
      if (at(w, i, p)) out.push_back(Hit{i, p.size(), ph});
  }
  return out;
}

std::string joined(const Words& w) {
  std::string s;
  for (const auto& x : w) s += (s.empty() ? "" : " ") + (x.front() == '_' ? x.substr(1) : x);
  return s;
}

// The nearest right or wrong quantity to `h` outside it, within `window` words; nullptr if none.
const Hit* object_of(const Hit& h, const std::vector<Hit>& objects, std::size_t window) {
  const Hit* best = nullptr;
  std::size_t best_d = window + 1;
  bool best_after = false;
  for (const auto& o : objects) {
    const bool overlaps = o.at < h.at + h.len && h.at < o.at + o.len;
    if (overlaps) continue;
    const bool after = o.at >= h.at + h.len;
    const std::size_t d = after ? o.at - (h.at + h.len) : h.at - (o.at + o.len);
    if (d < best_d || (d == best_d && after && !best_after)) {
      best = &o;
      best_d = d;
      best_after = after;
    }
  }
  return best;
}

}  // namespace

ClaimVerdict judge_claim(const std::string& answer, const ClaimSpec& spec) {
  const auto clauses = clauses_of(tokenize(answer));
  std::string distractor, denied, contrary, misdirected, misdirected_to;
  bool affirmed = false;
  for (const auto& c : clauses) {
    const auto affirm = find_all(c.words, spec.affirm);
    const auto opposite = find_all(c.words, spec.contrary);
    std::vector<Hit> objects = find_all(c.words, spec.about);
    const std::size_t right_objects = objects.size();
    for (const auto& o : find_all(c.words, spec.not_about)) objects.push_back(o);
    auto object_is_wrong = [&](const Hit& h) -> const Hit* {
      const Hit* o = object_of(h, objects, 6);
      return o && static_cast<std::size_t>(o - objects.data()) >= right_objects ? o : nullptr;
    };
    for (const auto& d : find_all(c.words, spec.distract)) {
      const bool inside_affirm = std::any_of(affirm.begin(), affirm.end(), [&](const Hit& a) {
        return d.at >= a.at && d.at + d.len <= a.at + a.len;
      });
      if (!c.neg[d.at] && !inside_affirm && distractor.empty()) distractor = d.phrase;
    }
    for (const auto& a : affirm) {
      if (c.neg[a.at]) {
        if (denied.empty()) denied = joined(c.words);
      } else if (const Hit* o = object_is_wrong(a)) {
        if (misdirected.empty()) misdirected = joined(c.words), misdirected_to = o->phrase;
      } else {
        affirmed = true;
      }
    }
    for (const auto& o : opposite) {
      if (!c.neg[o.at]) {
        if (contrary.empty()) contrary = o.phrase;
      } else if (affirm.empty()) {  // "the re-reads never miss in L2": a denied opposite affirms
        if (const Hit* w = object_is_wrong(o)) {
          if (misdirected.empty()) misdirected = joined(c.words), misdirected_to = w->phrase;
        } else {
          affirmed = true;
        }
      }
    }
  }
  if (!distractor.empty())
    return {false, "\"" + distractor + "\" is not it — the question rules it out, or it misses the point"};
  if (!denied.empty()) return {false, "your answer names it only to deny it (\"" + denied + "\")"};
  if (!contrary.empty()) return {false, "\"" + contrary + "\" says the opposite of what happens"};
  if (!misdirected.empty())
    return {false, "right idea, wrong quantity: \"" + misdirected + "\" makes it about " + misdirected_to +
                       ", which is not what it is about"};
  if (affirmed) return {true, ""};
  return {false, "not what we are looking for"};
}

}  // namespace flashlab::lessons::detail
