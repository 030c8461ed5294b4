// `flashlab traffic attention --svg FILE`: the plot is well-formed XML (checked by a small
// parser here: every tag closed in order, attributes quoted), has one polyline per series with
// one point per N, point markers for the measured series, both axis labels and a legend.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <vector>

#include "run_cli.hpp"

using flashlab::test::fresh_temp_dir;
using flashlab::test::run_cli;

namespace {

struct Element {
  std::string name;
  std::map<std::string, std::string> attrs;
};

// A strict little XML reader for what the plot writes: declaration, elements, attributes in
// double quotes, text, entities &amp; &lt; &gt; &quot;. Fails the test on anything malformed.
std::vector<Element> parse_xml(const std::string& s) {
  std::vector<Element> all;
  std::vector<std::string> open;
  std::size_t i = 0;
  if (s.rfind("<?xml", 0) == 0) i = s.find("?>") + 2;
  while (i < s.size()) {
    if (s[i] != '<') {
      const std::size_t next = s.find('<', i);
      const std::string text = s.substr(i, next == std::string::npos ? std::string::npos : next - i);
      for (std::size_t a = text.find('&'); a != std::string::npos; a = text.find('&', a + 1)) {
        const bool entity = text.compare(a, 5, "&amp;") == 0 || text.compare(a, 4, "&lt;") == 0 ||
                            text.compare(a, 4, "&gt;") == 0 || text.compare(a, 6, "&quot;") == 0;
        REQUIRE(entity);
      }
      if (next == std::string::npos) break;
      i = next;
      continue;
    }
    const std::size_t end = s.find('>', i);
    REQUIRE(end != std::string::npos);
    std::string tag = s.substr(i + 1, end - i - 1);
    i = end + 1;
    if (tag[0] == '/') {
      REQUIRE(!open.empty());
      REQUIRE(open.back() == tag.substr(1));
      open.pop_back();
      continue;
    }
    const bool self_closing = tag.back() == '/';
    if (self_closing) tag.pop_back();
    Element e;
    std::size_t p = tag.find_first_of(" \n");
    e.name = tag.substr(0, p);
    REQUIRE(std::regex_match(e.name, std::regex("[a-zA-Z][a-zA-Z0-9:-]*")));
    while (p != std::string::npos && p < tag.size()) {
      p = tag.find_first_not_of(" \n", p);
      if (p == std::string::npos) break;
      const std::size_t eq = tag.find('=', p);
      REQUIRE(eq != std::string::npos);
      REQUIRE(tag[eq + 1] == '"');
      const std::size_t close = tag.find('"', eq + 2);
      REQUIRE(close != std::string::npos);
      const std::string key = tag.substr(p, eq - p);
      REQUIRE(e.attrs.count(key) == 0);  // no duplicate attributes
      e.attrs[key] = tag.substr(eq + 2, close - eq - 2);
      p = close + 1;
    }
    all.push_back(e);
    if (!self_closing) open.push_back(e.name);
  }
  REQUIRE(open.empty());
  return all;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("cli traffic: --svg writes a well-formed plot with model and measured lines", "[cli][traffic][svg]") {
  const auto dir = fresh_temp_dir("svg");
  const std::string file = dir + "/traffic.svg";
  auto r = run_cli("traffic attention --seq 1024,2048,4096,8192,16384 --heads 16 --dim 64 --block-m 64 --block-n 32 "
                   "--svg '" + file + "'");
  REQUIRE(r.exit_code == 0);
  const std::string svg = slurp(file);
  const auto elements = parse_xml(svg);
  REQUIRE(!elements.empty());
  CHECK(elements.front().name == "svg");
  int models = 0, measured = 0, measured_points = 0, points = 0;
  for (const auto& e : elements) {
    if (e.name == "polyline") {
      const std::string name = e.attrs.at("data-name");
      const bool model = name.find("model") != std::string::npos;
      (model ? models : measured) += 1;
      // One x,y pair per N.
      std::istringstream pts(e.attrs.at("points"));
      std::string pair;
      int count = 0;
      while (pts >> pair) {
        CHECK(std::regex_match(pair, std::regex("[0-9.]+,[0-9.]+")));
        ++count;
      }
      if (model) {
        CHECK(count == 5);  // the model at every N
      } else {
        measured_points += count;
        CHECK(count >= 1);
      }
    }
    if (e.name == "circle") ++points;
  }
  // naive, FA1, FA2: a model line each, and a measured line each (the recorded measurement has
  // all three at N = 4096); a marker per measured point.
  CHECK(models == 3);
  CHECK(measured == 3);
  CHECK(points == measured_points);
  CHECK_THAT(svg, Catch::Contains("sequence length N (log scale)") && Catch::Contains("HBM bytes (read + written) (log scale)"));
  CHECK_THAT(svg, Catch::Contains(">naive model<") && Catch::Contains(">FA2 measured (L2)<"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("cli traffic: --svg into a directory that does not exist is a usage error", "[cli][traffic][svg][errors]") {
  auto r = run_cli("traffic attention --seq 1024 --svg /nonexistent-dir/x.svg");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Catch::Contains("--svg: cannot write"));
}
