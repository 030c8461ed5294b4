// The README's "real output" blocks are what the commands print: each block is found by the
// command quoted (in backticks) just before it, the command is run, and the block must equal its
// output line for line (trailing spaces aside). The stepper's block is a full-screen frame and is
// covered by the stepper's own render tests instead.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "run_cli.hpp"

using flashlab::test::fresh_temp_dir;
using flashlab::test::read_text;
using flashlab::test::run_cli;

namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    while (!line.empty() && line.back() == ' ') line.pop_back();
    lines.push_back(line);
  }
  while (!lines.empty() && lines.back().empty()) lines.pop_back();
  return lines;
}

// The fenced block after the first mention of "`flashlab <command>`" in the README.
std::string readme_block(const std::string& readme, const std::string& command) {
  const auto at = readme.find("`flashlab " + command + "`");
  if (at == std::string::npos) return "(no mention of `flashlab " + command + "` in README.md)";
  const auto open = readme.find("```\n", at);
  const auto close = open == std::string::npos ? open : readme.find("```\n", open + 4);
  if (close == std::string::npos) return "(no fenced block after `flashlab " + command + "`)";
  return readme.substr(open + 4, close - open - 4);
}

// Lesson 1's answer that re-reads a01, as the README describes it.
constexpr const char* kMineTrace =
    "LOAD a[0][0], R0\nLOAD b[0][0], R1\nMAC_Z R0, R1, R2\nLOAD a[0][1], R0\nLOAD b[1][0], R1\n"
    "MAC R0, R1, R2, R2\nLOAD a[0][1], R0\nSTORE R2, c[0][0]\n";

}  // namespace

TEST_CASE("readme: every real-output block equals what its command prints", "[cli][readme]") {
  const std::string source = FLASHLAB_SOURCE_DIR;
  const std::string readme = read_text(source + "/README.md");
  REQUIRE(!readme.empty());
  const std::string lesson_dir = fresh_temp_dir("readme");
  std::ofstream(lesson_dir + "/mine.trace") << kMineTrace;
  struct Block {
    std::string command;  // as quoted in the README
    std::string workdir;  // where it runs
    int exit_code;
  };
  const Block blocks[] = {
      {"run toymachine/traces/p1_c00.trace --machine matmul3 --table", source, 0},
      {"lesson check 1 mine.trace", lesson_dir, 1},
      {"attention fwd --seq 1000 --heads 2 --dim 64 --block-m 64 --block-n 32 --causal --variant fa2", source, 0},
  };
  for (const auto& b : blocks) {
    INFO("flashlab " << b.command);
    const auto r = run_cli(b.command, b.workdir);
    CHECK(r.exit_code == b.exit_code);
    CHECK(lines_of(readme_block(readme, b.command)) == lines_of(r.out));
  }
  std::filesystem::remove_all(lesson_dir);
}
