// `flashlab lesson list | next | show ID | hint ID | starter ID | check ID FILE | answer ID "TEXT" |
// solution ID | reset ID|--all`: parse flags, call the lessons library (lessons/), print its
// reports (as text or JSON), keep the user's progress. Grading lives in lessons/src/checker.cpp.
#include <charconv>
#include <fstream>
#include <initializer_list>
#include <iostream>
#include <optional>
#include <sstream>

#include "core/commands.hpp"
#include "core/report.hpp"
#include "core/shared_flags.hpp"
#include "flashlab/lessons/checker.hpp"
#include "flashlab/lessons/lesson.hpp"
#include "flashlab/lessons/progress.hpp"
#include "flashlab/toymachine/machine.hpp"

namespace flashlab::app {

namespace lessons = flashlab::lessons;

namespace {

constexpr const char* kLessonUsage =
    "lesson ACTION [ID] [FILE|TEXT] [options]\n\n"
    "Actions:\n"
    "  list                 every problem and quiz, with your progress\n"
    "  next                 the first lesson you have not passed yet (as show)\n"
    "  show ID              the statement, machine and target of lesson ID\n"
    "  hint ID              the next hint (--level K shows hints 1..K)\n"
    "  starter ID           print the starter trace (redirect it into a file to begin)\n"
    "  check ID FILE        run your trace on random inputs and symbolically; grade its cost\n"
    "                       (FILE - reads standard input; --seed S repeats a check; --json, --csv)\n"
    "  answer ID \"TEXT\"     check answers, e.g. \"reads=3n; writes=n\" (formulas are checked by value; --json, --csv)\n"
    "  solution ID          the reference trace (after you have passed; --spoil to see it anyway)\n"
    "  reset ID | --all     forget your progress on lesson ID (trace, answers, hints), or on every lesson\n\n"
    "Exit codes: check — 0 correct and within target, 1 wrong or over budget, 2 does not assemble;\n"
    "answer — 0 all right, 1 something wrong, 2 malformed. Progress is kept in\n"
    "$XDG_STATE_HOME/flashlab/progress (default ~/.local/state/flashlab/progress).";

const lessons::Lesson& lesson_or_throw(const std::string& id) {
  if (const auto* l = lessons::find_lesson(id)) return *l;
  throw UsageError("no lesson '" + id + "'", "the lessons are: " + lessons::lesson_ids() + " (flashlab lesson list)");
}

lessons::Progress load() {
  try {
    return lessons::load_progress(lessons::progress_path());
  } catch (const std::exception& e) {
    std::cerr << "warning: progress not available: " << e.what() << "\n";
    return {};
  }
}

void save(const lessons::Progress& p) {
  try {
    lessons::save_progress(lessons::progress_path(), p);
  } catch (const std::exception& e) {
    std::cerr << "warning: progress not saved: " << e.what() << "\n";
  }
}

// "[x]" done, "[~]" part done, "[ ]" not started.
std::string status(const lessons::Lesson& l, const lessons::Progress& p) {
  const bool need_trace = l.trace.has_value(), need_ans = !l.questions.empty();
  const bool t = p.trace_passed.count(l.id) > 0, a = p.answers_passed.count(l.id) > 0;
  const int done = (need_trace && t) + (need_ans && a);
  const int need = need_trace + need_ans;
  if (done == need) return "[x]";
  return done > 0 ? "[~]" : "[ ]";
}

// The budget of a trace lesson is a quiz answer until the lesson's questions are answered.
bool budget_hidden(const lessons::Lesson& l, const lessons::Progress& p) {
  return l.trace && !l.trace->hidden_target_text.empty() && !l.questions.empty() && !p.answers_passed.count(l.id);
}

// The first lesson in curriculum order that is not done, or nullptr when all are.
const lessons::Lesson* first_unfinished(const lessons::Progress& p) {
  for (const auto& l : lessons::catalogue()) {
    if (status(l, p) != "[x]") return &l;
  }
  return nullptr;
}

int do_list() {
  const auto p = load();
  std::cout << "flashlab lessons — from the toy machine to FlashAttention, then its HBM traffic\n\n";
  int done = 0;
  for (const auto& l : lessons::catalogue()) {
    const std::string st = status(l, p);
    done += st == "[x]";
    std::string kind = l.trace ? (l.questions.empty() ? "trace" : "trace+answer") : "answer";
    std::cout << "  " << st << " " << l.id << std::string(l.id.size() < 16 ? 16 - l.id.size() : 1, ' ') << kind
              << std::string(kind.size() < 14 ? 14 - kind.size() : 1, ' ') << l.title;
    if (auto it = p.trace_passed.find(l.id); it != p.trace_passed.end() && !it->second.empty())
      std::cout << "  (passed: " << it->second << ")";
    std::cout << "\n";
  }
  std::cout << "\n" << done << " of " << lessons::catalogue().size() << " done.  ";
  // Point at the first unfinished lesson: the newcomer's next command.
  if (const auto* next = first_unfinished(p)) {
    std::cout << "Next: flashlab lesson show " << next->id << "   (or: flashlab lesson next)\n";
    return kOk;
  }
  std::cout << "All done!\n";
  return kOk;
}

std::string machine_text(const lessons::TraceTask& t) {
  if (t.model == lessons::TraceModel::Tile) {
    return "tile machine: R0..R3 hold one tile each; HBM holds Q, K, V, O as n tiles (checked at n = " +
           std::to_string(t.ns.front()) + " and more)\n";
  }
  if (!t.machine_file.empty()) return "machine file " + t.machine + ":\n" + t.machine_file;
  const auto m = lessons::task_machine(t, t.ns.empty() ? 8 : t.ns.front());
  return "machine " + m.name + ": registers " + m.register_list() + "; instructions " + m.isa_list() + "; DRAM " +
         m.array_list() + "\n";
}

int do_show(const lessons::Lesson& l) {
  const auto p = load();
  std::cout << l.title << "   [lesson " << l.id << ", section \"" << l.section << "\"]\n\n" << l.statement;
  if (l.statement.empty() || l.statement.back() != '\n') std::cout << "\n";
  if (l.trace) {
    std::cout << "\n" << machine_text(*l.trace);
    if (budget_hidden(l, p)) std::cout << "budget: " << l.trace->hidden_target_text;
    else std::cout << "target: " << l.trace->target_text;
    if (!l.trace->ns.empty() && l.trace->model == lessons::TraceModel::Toy) {
      std::cout << " (checked at n =";
      for (int n : l.trace->ns) std::cout << " " << n;
      std::cout << ", every n up to 24 and larger n drawn for each check)";
    }
    std::cout << "\n";
  }
  if (!l.questions.empty()) {
    std::cout << "\nquestions (flashlab lesson answer " << l.id << " \"";
    for (std::size_t i = 0; i < l.questions.size(); ++i) std::cout << (i ? "; " : "") << l.questions[i].key << "=…";
    std::cout << "\"):\n";
    for (const auto& q : l.questions) {
      std::cout << "  " << q.key << ": " << q.prompt;
      if (q.kind == lessons::AnswerKind::Formula) {
        std::cout << "  (a formula in";
        for (const auto& v : q.vars) std::cout << " " << v;
        std::cout << ")";
      }
      std::cout << "\n";
    }
  }
  std::cout << "\nnext steps:\n";
  if (l.trace) {
    const std::string file = "lesson" + l.id + ".trace";
    std::cout << "  flashlab lesson starter " << l.id << " > " << file << "   # a start; edit it\n";
    if (l.trace->model == lessons::TraceModel::Toy) {
      const std::string mflag = l.trace->machine_file.empty() ? "--machine " + l.trace->machine
                                                              : "--lesson " + l.id;
      std::cout << "  flashlab step " << file << " " << mflag << "   # step through it\n";
    }
    std::cout << "  flashlab lesson check " << l.id << " " << file << "\n";
  }
  if (!l.hints.empty()) {
    const int seen = p.hints_seen.count(l.id) ? p.hints_seen.at(l.id) : 0;
    std::cout << "  flashlab lesson hint " << l.id << "   # " << l.hints.size() << " hints";
    if (seen > 0) std::cout << ", " << seen << " seen";
    std::cout << "\n";
  }
  std::cout << "  progress: " << status(l, p) << "\n";
  return kOk;
}

int do_hint(const lessons::Lesson& l, const po::variables_map& vm) {
  if (l.hints.empty()) throw UsageError("lesson " + l.id + " has no hints", "flashlab lesson show " + l.id);
  auto p = load();
  const int total = static_cast<int>(l.hints.size());
  const int seen = p.hints_seen.count(l.id) ? p.hints_seen.at(l.id) : 0;
  int level = std::min(seen + 1, total);
  if (vm.count("level")) {
    level = vm["level"].as<int>();
    require_range("level", level, 1, total);
  }
  // The newest hint only; --level K shows hints 1..K again (earlier ones for context).
  const int from = vm.count("level") ? 1 : level;
  for (int k = from; k <= level; ++k) {
    std::cout << "hint " << k << " of " << total << ":\n" << l.hints[static_cast<std::size_t>(k - 1)] << "\n";
    if (k < level) std::cout << "\n";
  }
  if (level > 1 && from == level) std::cout << "(earlier hints: flashlab lesson hint " << l.id << " --level " << level << ")\n";
  if (level < total) std::cout << "\n(more: flashlab lesson hint " << l.id << ")\n";
  if (level > seen) {
    p.hints_seen[l.id] = level;
    save(p);
  }
  return kOk;
}

const char* verdict_name(lessons::Verdict v) {
  switch (v) {
    case lessons::Verdict::Passed: return "passed";
    case lessons::Verdict::OverBudget: return "over-budget";
    case lessons::Verdict::Wrong: return "wrong";
    case lessons::Verdict::DoesNotAssemble: return "does-not-assemble";
  }
  return "wrong";
}

// The verdict as one JSON object: what the text report says, field by field.
void print_check_json(const lessons::Lesson& l, const lessons::CheckReport& rep, OutputFormat format) {
  ReportOutput report(format, std::cout);
  Json& j = report.json();
  j.begin_object();
  j.key("lesson").value(l.id);
  j.key("verdict").value(verdict_name(rep.verdict));
  j.key("exit_code").value(rep.exit_code());
  auto strings = [&](const char* key, const std::vector<std::string>& items) {
    j.key(key).begin_array();
    for (const auto& s : items) j.value(s);
    j.end_array();
  };
  strings("diagnostics", rep.diagnostics);
  strings("problems", rep.problems);
  strings("notes", rep.notes);
  j.key("budget_hidden").value(rep.budget_hidden);
  j.key("costs").begin_array();
  for (const auto& c : rep.costs) {
    j.begin_object();
    j.key("metric").value(c.metric);
    if (c.n > 0) j.key("n").value(c.n);
    j.key("measured").value(c.measured);
    if (!rep.budget_hidden) j.key("target").value(c.target).key("formula").value(c.formula);
    j.key("within").value(c.within());
    j.end_object();
  }
  j.end_array();
  j.key("sizes").begin_array();
  for (int n : rep.sizes) j.value(n);
  j.end_array();
  j.key("seed").value(rep.seed);
  j.key("random_runs").value(rep.runs);
  j.key("hostile_runs").value(rep.hostile_runs);
  j.key("symbolic").value(rep.symbolic);
  j.end_object();
  report.finish();
}

int do_check(const lessons::Lesson& l, const std::string& file, const po::variables_map& vm) {
  if (!l.trace) {
    throw UsageError("lesson " + l.id + " has no trace to check",
                     "it is answered with: flashlab lesson answer " + l.id + " \"…\"");
  }
  const std::string text = read_input(file, "FILE", "trace");
  const OutputFormat format = output_format(vm);
  const bool json = format != OutputFormat::text;
  lessons::CheckOptions opt;
  opt.hide_budget = budget_hidden(l, load());
  if (const auto seed = fresh_seed_flag(vm)) opt.seed = *seed;
  const auto rep = lessons::check_trace(l, text, file == "-" ? "<stdin>" : file, opt);
  if (json) {
    print_check_json(l, rep, format);
  } else {
    std::cout << "lesson " << l.id << ": " << l.title << "\n";
    const std::string body = rep.to_text();
    (rep.verdict == lessons::Verdict::DoesNotAssemble ? std::cerr : std::cout) << body;
    // The seed is drawn anew by design; name it so that the check can be repeated. On stderr: the
    // report on stdout stays the same from run to run.
    if (rep.verdict != lessons::Verdict::DoesNotAssemble && body.find("--seed ") == std::string::npos)
      std::cerr << "seed " << rep.seed << " (--seed " << rep.seed << " repeats this check)\n";
  }
  if (rep.verdict == lessons::Verdict::Passed) {
    auto p = load();
    std::string summary;
    for (const auto& c : rep.costs) {
      if (c.n > 0 && c.n != rep.costs.front().n) continue;
      summary += (summary.empty() ? "" : ", ") + std::to_string(c.measured) + " " + c.metric +
                 (c.n > 0 ? " (n=" + std::to_string(c.n) + ")" : "");
    }
    p.trace_passed[l.id] = summary.empty() ? "passed" : summary;
    save(p);
    if (json) return rep.exit_code();
    if (!l.discussion.empty()) std::cout << "\n" << l.discussion << "\n";
    if (l.trace->model == lessons::TraceModel::Tile) std::cout << "\n" << lessons::loop_order_table(l.trace->ns.back());
    if (!l.questions.empty() && !p.answers_passed.count(l.id))
      std::cout << "\nnow the questions: flashlab lesson show " << l.id << "\n";
  } else if (!json && rep.verdict != lessons::Verdict::DoesNotAssemble && !l.hints.empty()) {
    std::cout << "stuck? flashlab lesson hint " << l.id << "\n";
  }
  return rep.exit_code();
}

int do_answer(const lessons::Lesson& l, const std::string& text, OutputFormat format) {
  const bool json = format != OutputFormat::text;
  if (l.questions.empty()) {
    throw UsageError("lesson " + l.id + " has no questions",
                     "it is checked with: flashlab lesson check " + l.id + " FILE");
  }
  const auto rep = lessons::check_answer(l, text);
  if (!rep.error.empty()) {
    throw UsageError(rep.error, rep.hint);
  }
  if (json) {
    ReportOutput report(format, std::cout);
    Json& j = report.json();
    j.begin_object();
    j.key("lesson").value(l.id);
    j.key("all_correct").value(rep.all_correct);
    j.key("exit_code").value(rep.exit_code());
    j.key("answers").begin_array();
    for (const auto& a : rep.lines)
      j.begin_object().key("key").value(a.key).key("correct").value(a.correct).key("message").value(a.message).end_object();
    j.end_array();
    j.end_object();
    report.finish();
  } else {
    std::cout << rep.to_text();
  }
  if (rep.all_correct) {
    auto p = load();
    p.answers_passed[l.id] = "answered";
    save(p);
    if (json) return rep.exit_code();
    if (l.trace && !l.trace->hidden_target_text.empty())
      std::cout << "the budget of the trace: " << l.trace->target_text << "\n";
    if (l.id == "traffic-fwd" || l.id == "traffic-bwd" || l.id == "traffic-levels")
      std::cout << "the three levels, measured: flashlab traffic levels\n";
    if (l.trace && !p.trace_passed.count(l.id))
      std::cout << "now the trace: flashlab lesson check " << l.id << " FILE\n";
    else if (!l.discussion.empty())
      std::cout << "\n" << l.discussion << "\n";
  }
  return rep.exit_code();
}

int do_next() {
  const auto p = load();
  if (const auto* l = first_unfinished(p)) return do_show(*l);
  std::cout << "All " << lessons::catalogue().size()
            << " lessons are done. `flashlab lesson reset --all` starts again; `flashlab traffic levels` shows the "
               "traffic chapter's measurements.\n";
  return kOk;
}

int do_reset(const std::optional<std::string>& id, bool all) {
  if (all == id.has_value()) {
    throw UsageError(all ? "lesson reset takes a lesson ID or --all, not both" : "lesson reset needs a lesson ID or --all",
                     "flashlab lesson reset 4   (forgets lesson 4), flashlab lesson reset --all   (forgets every lesson)");
  }
  auto p = load();
  if (all) {
    save(lessons::Progress{});
    std::cout << "forgot your progress on every lesson\n";
    return kOk;
  }
  const auto& l = lesson_or_throw(*id);
  const bool any = p.trace_passed.erase(l.id) + p.answers_passed.erase(l.id) + p.hints_seen.erase(l.id) > 0;
  save(p);
  std::cout << (any ? "forgot your progress on lesson " : "nothing to forget on lesson ") << l.id << "\n";
  return kOk;
}

int do_solution(const lessons::Lesson& l, bool spoil) {
  if (!l.trace) throw UsageError("lesson " + l.id + " has no trace", "flashlab lesson show " + l.id);
  const auto p = load();
  if (!spoil && !p.trace_passed.count(l.id)) {
    throw UsageError("you have not passed lesson " + l.id + " yet",
                     "try flashlab lesson hint " + l.id + " first, or add --spoil to see the reference trace");
  }
  std::cout << l.trace->solution;
  return kOk;
}

}  // namespace

int cmd_lesson(const Args& args) {
  return guarded("lesson", [&]() -> int {
    po::options_description desc("Options");
    desc.add_options()("help,h", "show this help")("level", po::value<int>(), "hint: show hints 1..K")(
        "spoil", "solution: show the reference trace even before passing")("all", "reset: forget every lesson");
    add_fresh_seed_option(desc, "check: the seed of the sizes and inputs drawn at random");
    add_output_options(desc);
    po::options_description hidden;
    hidden.add_options()("action", po::value<std::string>())("id", po::value<std::string>())(
        "arg", po::value<std::vector<std::string>>());
    po::options_description all;
    all.add(desc).add(hidden);
    po::positional_options_description pos;
    pos.add("action", 1).add("id", 1).add("arg", -1);
    const auto vm = parse(args, all, &pos);
    if (vm.count("help")) {
      print_help(std::cout, kLessonUsage, "The lesson's problems and quizzes, checked by running your answer.", desc);
      return kOk;
    }
    if (!vm.count("action")) {
      throw UsageError("missing action", "start with: flashlab lesson list   (flashlab lesson --help for all actions)");
    }
    const std::string action = vm["action"].as<std::string>();
    const std::vector<std::string> rest =
        vm.count("arg") ? vm["arg"].as<std::vector<std::string>>() : std::vector<std::string>{};
    auto need_id = [&]() -> const lessons::Lesson& {
      if (!vm.count("id")) throw UsageError("lesson " + action + " needs a lesson ID", "the lessons are: " + lessons::lesson_ids());
      return lesson_or_throw(vm["id"].as<std::string>());
    };
    auto max_args = [&](std::size_t n) {
      if (rest.size() > n) throw UsageError("unexpected argument '" + rest[n] + "'", "flashlab lesson --help");
    };
    // Flags that only one action takes are refused elsewhere, not silently ignored.
    auto only_for = [&](const char* flag, std::initializer_list<const char*> actions) {
      const bool is_switch = std::string(flag) == "json" || std::string(flag) == "csv";
      if (!vm.count(flag) || (is_switch && !vm[flag].as<bool>())) return;
      for (const char* a : actions)
        if (action == a) return;
      throw UsageError("--" + std::string(flag) + " is not an option of lesson " + action,
                       "flashlab lesson --help lists which action takes which option");
    };
    only_for("seed", {"check"});
    only_for("json", {"check", "answer"});
    only_for("csv", {"check", "answer"});
    only_for("all", {"reset"});
    only_for("level", {"hint"});
    only_for("spoil", {"solution"});
    if (action == "list" || action == "next") {
      if (vm.count("id"))
        throw UsageError("unexpected argument '" + vm["id"].as<std::string>() + "'", "lesson " + action + " takes no arguments");
      return action == "list" ? do_list() : do_next();
    }
    if (action == "reset") {
      max_args(0);
      return do_reset(vm.count("id") ? std::optional<std::string>(vm["id"].as<std::string>()) : std::nullopt,
                      vm.count("all") > 0);
    }
    if (action == "show") {
      max_args(0);
      return do_show(need_id());
    }
    if (action == "hint") {
      max_args(0);
      return do_hint(need_id(), vm);
    }
    if (action == "starter") {
      max_args(0);
      const auto& l = need_id();
      if (!l.trace) throw UsageError("lesson " + l.id + " has no trace", "it is answered with flashlab lesson answer");
      std::cout << l.trace->starter;
      return kOk;
    }
    if (action == "solution") {
      max_args(0);
      return do_solution(need_id(), vm.count("spoil") > 0);
    }
    if (action == "check") {
      const auto& l = need_id();
      if (rest.empty()) throw UsageError("lesson check needs a trace FILE", "flashlab lesson check " + l.id + " FILE");
      max_args(1);
      return do_check(l, rest[0], vm);
    }
    if (action == "answer") {
      const auto& l = need_id();
      if (rest.empty()) throw UsageError("lesson answer needs the answer TEXT", "flashlab lesson show " + l.id + " lists the questions");
      // Several words are one answer: `lesson answer contraction the contraction with V`.
      std::string text;
      for (const auto& r : rest) text += (text.empty() ? "" : " ") + r;
      return do_answer(l, text, output_format(vm));
    }
    throw UsageError("unknown action '" + action + "'",
                     "the actions are list, next, show, hint, starter, check, answer, solution, reset");
  });
}

}  // namespace flashlab::app
