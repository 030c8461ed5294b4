// docs/cli-flags.md tabulates, for every command, the flags that every command spells the same
// way (app/core/shared_flags.hpp). This test reads each command's --help and derives the row
// from it: the tile flags, --seed, --dim, --dtype, the output formats and whether a file
// argument takes `-` for standard input. The page's table must equal the derived one cell for
// cell, every command `flashlab --help` lists must have a row, no help text may show a retired
// spelling, and --dtype must mean the tensors' element type wherever it exists.
// FLASHLAB_PRINT_FLAGS_TABLE=1 prints the derived table (to update the page after a change).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "run_cli.hpp"

using flashlab::test::read_text;
using flashlab::test::run_cli;

namespace {

std::string collapse(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == ' ' || c == '\n' || c == '\t') {
      if (!out.empty() && out.back() != ' ') out += ' ';
    } else {
      out += c;
    }
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

/// One option of a --help text: whether it takes a value, its default, its description.
struct Option {
  bool takes_value = false;
  std::optional<std::string> default_value;
  std::string description;
};

// The option `name` of a Boost.Program_options help text: its line ("  --dim arg (=64)  d, …")
// and the description's continuation lines (indented, not starting with '-').
std::optional<Option> find_option(const std::string& help, const std::string& name) {
  std::istringstream in(help);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  const std::regex head("^  (?:-\\w \\[ )?--" + name + "(?: \\])?( arg)?(?: \\(=([^)]*)\\))?(?:\\s+(.*))?$");
  for (std::size_t i = 0; i < lines.size(); ++i) {
    std::smatch m;
    if (!std::regex_match(lines[i], m, head)) continue;
    Option o;
    o.takes_value = m[1].matched;
    if (m[2].matched) o.default_value = m[2].str();
    std::string text = m[3].str();
    for (std::size_t k = i + 1; k < lines.size(); ++k) {
      const auto first = lines[k].find_first_not_of(' ');
      if (first == std::string::npos || first < 8 || lines[k][first] == '-') break;
      text += ' ';
      text += lines[k].substr(first);
    }
    o.description = collapse(text);
    return o;
  }
  return std::nullopt;
}

const char* const kNone = "—";

// The row's cells, derived from one --help text.
std::vector<std::string> derive_row(const std::string& help) {
  std::vector<std::string> cells;
  // Tile flags: the query/key tiles, or MTA's one square loaded tile.
  std::string tiles;
  for (const char* flag : {"block-m", "block-n", "block"}) {
    const auto o = find_option(help, flag);
    if (!o) continue;
    if (!tiles.empty()) tiles += ", ";
    tiles += std::string("--") + flag + " " + (o->default_value ? *o->default_value : "(required)");
  }
  cells.push_back(tiles.empty() ? kNone : tiles);
  // --seed: its default, or drawn anew by design.
  if (const auto o = find_option(help, "seed"))
    cells.push_back(o->default_value ? *o->default_value
                    : o->description.find("drawn anew") != std::string::npos ? "drawn anew, printed"
                                                                              : "(no default)");
  else
    cells.push_back(kNone);
  // --dim: its default (a list for the sweeps), or required.
  if (const auto o = find_option(help, "dim"))
    cells.push_back(o->default_value ? *o->default_value : "required");
  else
    cells.push_back(kNone);
  // --dtype: the choices and the default ("fp32, bf16, fp16 (fp32)").
  if (const auto o = find_option(help, "dtype")) {
    const std::string lead = "element type of the tensors: ";
    // Every command declares --dtype with the shared helper; another wording derives "?" and
    // fails the comparison with the page.
    std::string choices = o->description.rfind(lead, 0) == 0 ? o->description.substr(lead.size()) : "?";
    choices = choices.substr(0, choices.find(" ("));
    std::string list;
    std::istringstream words(choices);
    for (std::string w; words >> w;)
      if (w != "|") list += (list.empty() ? "" : ", ") + w;
    cells.push_back(list + " (" + o->default_value.value_or("?") + ")");
  } else {
    cells.push_back(kNone);
  }
  // Output formats.
  std::string formats;
  for (const char* flag : {"json", "csv"})
    if (const auto o = find_option(help, flag); o && !o->takes_value)
      formats += std::string(formats.empty() ? "" : ", ") + "--" + flag;
  cells.push_back(formats.empty() ? kNone : formats);
  // `-` for standard input where a file is read.
  cells.push_back(collapse(help).find("- reads standard input") != std::string::npos ? "yes" : kNone);
  return cells;
}

std::vector<std::string> split_row(const std::string& line) {
  std::vector<std::string> cells;
  std::string cell;
  for (std::size_t i = 1; i < line.size(); ++i) {
    if (line[i] == '|') {
      cells.push_back(collapse(cell));
      cell.clear();
    } else {
      cell += line[i];
    }
  }
  return cells;
}

// The commands (first cell, `flashlab ...` in backticks) and the rows of the page's table.
struct PageRow {
  std::string command;  // e.g. "mta fwd --device cuda"
  std::vector<std::string> cells;
};

std::vector<PageRow> page_rows(const std::string& page) {
  std::vector<PageRow> rows;
  const auto begin = page.find("<!-- flags table -->");
  const auto end = page.find("<!-- end flags table -->");
  REQUIRE(begin != std::string::npos);
  REQUIRE(end != std::string::npos);
  std::istringstream in(page.substr(begin, end - begin));
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("| `flashlab ", 0) != 0) continue;
    auto cells = split_row(line);
    const std::string first = cells.front();
    PageRow r;
    r.command = first.substr(10, first.size() - 11);  // "`flashlab X`" → "X"
    r.cells.assign(cells.begin() + 1, cells.end());
    // Cells are written with code spans: compare their text.
    for (auto& c : r.cells) c.erase(std::remove(c.begin(), c.end(), '`'), c.end());
    rows.push_back(r);
  }
  return rows;
}

}  // namespace

TEST_CASE("cli flags table: docs/cli-flags.md equals what every command's --help says", "[cli][flags][docs]") {
  const std::string source = FLASHLAB_SOURCE_DIR;
  const auto rows = page_rows(read_text(source + "/docs/cli-flags.md"));
  REQUIRE(rows.size() >= 20);
  const bool print = std::getenv("FLASHLAB_PRINT_FLAGS_TABLE") != nullptr;
  std::set<std::string> first_words;
  for (const auto& row : rows) {
    INFO("flashlab " << row.command << " --help");
    const auto r = run_cli(row.command + " --help");
    REQUIRE(r.exit_code == 0);
    const auto derived = derive_row(r.out);
    if (print) {
      std::cout << "| `flashlab " << row.command << "` |";
      for (const auto& c : derived) std::cout << " " << c << " |";
      std::cout << "\n";
    }
    CHECK(row.cells == derived);
    first_words.insert(row.command.substr(0, row.command.find(' ')));
  }
  // Every command of `flashlab --help` has a row.
  const auto top = run_cli("--help");
  std::istringstream in(top.out.substr(top.out.find("Commands:")));
  std::string line;
  std::getline(in, line);
  int listed = 0;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string name;
    if (!(words >> name)) continue;
    ++listed;
    INFO("command " << name);
    CHECK(first_words.count(name) == 1);
  }
  CHECK(listed >= 10);
}

TEST_CASE("cli flags table: no help text shows a retired spelling", "[cli][flags]") {
  const std::string source = FLASHLAB_SOURCE_DIR;
  for (const auto& row : page_rows(read_text(source + "/docs/cli-flags.md"))) {
    INFO("flashlab " << row.command << " --help");
    const auto r = run_cli(row.command + " --help");
    for (const char* old : {"--bq", "--bk", "b_q, query-block size", "storage and compute dtype"})
      CHECK(r.out.find(old) == std::string::npos);
    // --dtype has one meaning: where a command has it, it is the tensors' element type.
    if (const auto o = find_option(r.out, "dtype"))
      CHECK(o->description.rfind("element type of the tensors: ", 0) == 0);
  }
}
