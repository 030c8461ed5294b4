#include "core/cli.hpp"

#include "core/report.hpp"
#include "core/shared_flags.hpp"

#include "flashlab/reference/input_file.hpp"

#include <cctype>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <new>
#include <sstream>
#include <vector>

namespace flashlab::app {

po::variables_map parse(const Args& args, const po::options_description& desc,
                        const po::positional_options_description* positional) {
  // A retired spelling where only its successor exists names the successor, instead of Boost's
  // bare "unrecognised option".
  for (const std::string& a : args) {
    if (a.size() < 3 || a.compare(0, 2, "--") != 0) continue;
    const std::string name = a.substr(2, a.find('=') == std::string::npos ? std::string::npos : a.find('=') - 2);
    for (const auto& r : retired_flags()) {
      if (name != r.old_name || desc.find_nothrow(name, false) || !desc.find_nothrow(std::string(r.new_name), false))
        continue;
      throw UsageError("--" + name + " is not a flag of this command; use --" + std::string(r.new_name),
                       "--" + std::string(r.new_name) + " is " + std::string(r.meaning));
    }
  }
  // A flag that takes a value followed by another flag ("--seq --dim 4") would otherwise surface
  // as Boost's "too many positional options" about the stray value; name the flag instead.
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.size() < 3 || a.compare(0, 2, "--") != 0 || a.find('=') != std::string::npos) continue;
    const auto* opt = desc.find_nothrow(a.substr(2), false);
    if (!opt || opt->semantic()->min_tokens() == 0) continue;
    const bool next_is_flag = i + 1 < args.size() && args[i + 1].size() > 1 && args[i + 1][0] == '-' &&
                              !std::isdigit(static_cast<unsigned char>(args[i + 1][1])) && args[i + 1][1] != '.';
    if (i + 1 == args.size() || next_is_flag)
      throw UsageError(a + " needs a value" + (next_is_flag ? ", but the next word is the flag " + args[i + 1] : ""),
                       "e.g. " + a + " VALUE (see --help)");
  }
  po::variables_map vm;
  try {
    // No guessing of abbreviations: `--dev` must not quietly stand for some flag that starts so.
    auto parser = po::command_line_parser(args).options(desc).style(po::command_line_style::default_style &
                                                                    ~po::command_line_style::allow_guessing);
    if (positional) parser.positional(*positional);
    po::store(parser.run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw UsageError(e.what(), "see --help for the options");
  }
  return vm;
}

std::optional<po::variables_map> parse_subject_command(const Args& args, const po::options_description& desc,
                                                       const SubjectCommand& cmd) {
  po::options_description hidden;
  hidden.add_options()("subject", po::value<std::string>(), "what to run");
  po::options_description all;
  all.add(desc).add(hidden);
  po::positional_options_description pos;
  pos.add("subject", 1);
  auto vm = parse(args, all, &pos);
  const std::string example = "e.g. " + std::string(cmd.example);
  // An unknown subject is an error even beside --help: its help would be some other command's.
  if (vm.count("subject") && vm["subject"].as<std::string>() != cmd.subject)
    throw UsageError("unknown " + std::string(cmd.command) + " subject '" + vm["subject"].as<std::string>() + "'",
                     example);
  if (vm.count("help")) {
    print_help(std::cout, cmd.usage, cmd.summary, desc);
    return std::nullopt;
  }
  if (!vm.count("subject"))
    throw UsageError("missing what to " + std::string(cmd.verb) + ": " + std::string(cmd.subject), example);
  const std::string subject = vm["subject"].as<std::string>();
  if (subject != cmd.subject)
    throw UsageError("unknown " + std::string(cmd.command) + " subject '" + subject + "'", example);
  return vm;
}

void print_help(std::ostream& os, std::string_view usage, std::string_view summary,
                const po::options_description& desc) {
  os << "Usage: flashlab " << usage << "\n\n" << summary << "\n\n" << desc << "\n";
}

int guarded(std::string_view command, const std::function<int()>& body) {
  try {
    return body();
  } catch (const UsageError& e) {
    std::cerr << "error: " << e.what() << "\n";
    if (!e.hint().empty()) std::cerr << "hint: " << e.hint() << "\n";
    else std::cerr << "hint: flashlab " << command << " --help\n";
    return kUsage;
  } catch (const po::error& e) {
    std::cerr << "error: " << e.what() << "\nhint: flashlab " << command << " --help\n";
    return kUsage;
  } catch (const std::bad_alloc&) {
    // Sizes are checked against the memory limit before work starts; this is the last resort.
    std::cerr << "error: out of memory\nhint: use smaller sizes, or a lower --memory-limit so that the sizes are "
                 "checked before the run (flashlab "
              << command << " --help)\n";
    return kFailed;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return kFailed;
  }
}

std::vector<long long> integer_list(std::string_view flag, const std::string& text, long long lo, long long hi,
                                    std::string_view example) {
  const std::string name = "--" + std::string(flag);
  const std::string hint = name + " takes integers from " + std::to_string(lo) + " to " + std::to_string(hi) +
                           " separated by commas, e.g. " + name + " " + std::string(example);
  std::vector<long long> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    std::size_t used = 0;
    long long v = lo - 1;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size() || v < lo || v > hi)
      throw UsageError(name + ": '" + item + "' is not an integer from " + std::to_string(lo) + " to " +
                           std::to_string(hi),
                       hint);
    out.push_back(v);
  }
  if (out.empty() || text.back() == ',') throw UsageError(name + ": '" + text + "' is not a list", hint);
  return out;
}

void require_range(std::string_view flag, long long value, long long lo, long long hi) {
  flag.remove_prefix(std::min(flag.find_first_not_of('-'), flag.size()));  // "seq" and "--seq" alike
  if (value < lo || value > hi) {
    std::ostringstream msg;
    msg << "--" << flag << " " << value << " is out of range";
    std::ostringstream hint;
    hint << "--" << flag << " takes a value from " << lo << " to " << hi;
    throw UsageError(msg.str(), hint.str());
  }
}

std::string read_input(const std::string& path, std::string_view label, std::string_view what,
                       std::uint64_t max_bytes) {
  ref::InputLimits limits;
  limits.max_bytes = max_bytes;
  try {
    return ref::read_input_file(path, std::string(what), limits);
  } catch (const ref::InputFileError& e) {
    throw UsageError(std::string(label) + ": '" + path + "': " + e.reason(), e.hint());
  }
}

std::string json_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out;
}

void Json::indent() {
  if (!pretty_) return;
  *os_ << '\n' << std::string(2 * first_.size(), ' ');
}

void Json::separator() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (!first_.empty()) {
    if (!first_.back()) *os_ << ',';
    first_.back() = false;
    indent();
  }
}

Value& Json::place(Value v) {
  if (open_.empty()) return *root_ = std::move(v);
  Value& parent = *open_.back();
  if (parent.kind == Value::Kind::object) {
    parent.members.emplace_back(std::move(key_), std::move(v));
    key_.clear();
    return parent.members.back().second;
  }
  parent.items.push_back(std::move(v));
  return parent.items.back();
}

Json& Json::begin_object() {
  if (root_) {
    Value v;
    v.kind = Value::Kind::object;
    open_.push_back(&place(std::move(v)));
    return *this;
  }
  separator();
  *os_ << '{';
  first_.push_back(true);
  return *this;
}
Json& Json::end_object() {
  if (root_) {
    open_.pop_back();
    return *this;
  }
  const bool empty = first_.back();
  first_.pop_back();
  if (!empty) indent();
  *os_ << '}';
  return *this;
}
Json& Json::begin_array() {
  if (root_) {
    Value v;
    v.kind = Value::Kind::array;
    open_.push_back(&place(std::move(v)));
    return *this;
  }
  separator();
  *os_ << '[';
  first_.push_back(true);
  return *this;
}
Json& Json::end_array() {
  if (root_) {
    open_.pop_back();
    return *this;
  }
  const bool empty = first_.back();
  first_.pop_back();
  if (!empty) indent();
  *os_ << ']';
  return *this;
}
Json& Json::key(std::string_view k) {
  if (root_) {
    key_ = std::string(k);
    return *this;
  }
  separator();
  *os_ << '"' << json_escape(k) << "\":" << (pretty_ ? " " : "");
  after_key_ = true;
  return *this;
}
Json& Json::value(std::string_view s) {
  if (root_) {
    Value v;
    v.kind = Value::Kind::string;
    v.string = std::string(s);
    place(std::move(v));
    return *this;
  }
  separator();
  *os_ << '"' << json_escape(s) << '"';
  return *this;
}
Json& Json::value(double d) {
  if (root_) {
    Value v;
    v.kind = std::isfinite(d) ? Value::Kind::number : Value::Kind::null;
    v.number = d;
    place(std::move(v));
    return *this;
  }
  separator();
  if (!std::isfinite(d)) {
    *os_ << "null";
  } else {
    // Shortest text that reads back to the same double (0.27, not 0.27000000000000002).
    char buf[32];
    const auto res = std::to_chars(buf, buf + sizeof buf, d);
    *os_ << std::string_view(buf, static_cast<std::size_t>(res.ptr - buf));
  }
  return *this;
}
Json& Json::value(std::int64_t i) {
  if (root_) {
    Value v;
    v.kind = Value::Kind::integer;
    v.integer = i;
    place(std::move(v));
    return *this;
  }
  separator();
  *os_ << i;
  return *this;
}
Json& Json::value(std::uint64_t u) {
  if (root_) {
    Value v;
    v.kind = Value::Kind::unsigned_integer;
    v.unsigned_integer = u;
    place(std::move(v));
    return *this;
  }
  separator();
  *os_ << u;
  return *this;
}
Json& Json::value(bool b) {
  if (root_) {
    Value v;
    v.kind = Value::Kind::boolean;
    v.boolean = b;
    place(std::move(v));
    return *this;
  }
  separator();
  *os_ << (b ? "true" : "false");
  return *this;
}
Json& Json::null() {
  if (root_) {
    place(Value{});
    return *this;
  }
  separator();
  *os_ << "null";
  return *this;
}
void Json::finish() {
  if (!root_) *os_ << '\n';
}

}  // namespace flashlab::app
