// docs/glossary.md against the code: every row of its tables names a quantity's spelling in the
// code (second column) and the files where it appears (last column); each of those files must
// exist and contain each spelling as a whole word. A rename in the code that forgets the
// glossary, or a glossary entry the code does not use, fails here.
#include <catch2/catch.hpp>

#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The `backticked` words of one table cell.
std::vector<std::string> backticked(const std::string& cell) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while ((at = cell.find('`', at)) != std::string::npos) {
    const std::size_t end = cell.find('`', at + 1);
    if (end == std::string::npos) break;
    out.push_back(cell.substr(at + 1, end - at - 1));
    at = end + 1;
  }
  return out;
}

// The cells of a markdown table row "| a | b | … |".
std::vector<std::string> cells(const std::string& line) {
  std::vector<std::string> out;
  std::size_t at = 1;
  while (at < line.size()) {
    const std::size_t bar = line.find('|', at);
    if (bar == std::string::npos) break;
    out.push_back(line.substr(at, bar - at));
    at = bar + 1;
  }
  return out;
}

bool contains_word(const std::string& text, const std::string& word) {
  const std::regex re("(^|[^A-Za-z0-9_])" + word + "($|[^A-Za-z0-9_])");
  return std::regex_search(text, re);
}

}  // namespace

TEST_CASE("glossary: every name it lists appears in every file it lists", "[attention][glossary]") {
  const std::string root = FLASHLAB_SOURCE_DIR;
  std::istringstream doc(read_text(root + "/docs/glossary.md"));
  std::string line;
  int rows = 0, checks = 0;
  while (std::getline(doc, line)) {
    if (line.rfind("| ", 0) != 0 || line.find("In code") != std::string::npos) continue;  // not a row, or a header
    const auto c = cells(line);
    REQUIRE(c.size() == 5);
    const auto names = backticked(c[1]);
    const auto files = backticked(c[4]);
    INFO(line);
    REQUIRE(!names.empty());
    REQUIRE(!files.empty());
    ++rows;
    for (const auto& file : files) {
      const std::string text = read_text(root + "/" + file);
      INFO(file);
      REQUIRE(!text.empty());  // the file exists
      for (const auto& name : names) {
        INFO(name);
        CHECK(contains_word(text, name));
        ++checks;
      }
    }
  }
  CHECK(rows >= 30);  // the tables were found and read
  CHECK(checks >= 100);
}

TEST_CASE("glossary: the check finds a name that is missing", "[attention][glossary]") {
  CHECK(contains_word("float m_new = 0;", "m_new"));
  CHECK_FALSE(contains_word("float m_new2 = 0;", "m_new"));
  CHECK_FALSE(contains_word("float m_ij = 0;", "m_new"));
}
