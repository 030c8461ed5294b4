// The manifest's JSON reader: the values it reads back exactly (64-bit counts, escapes, surrogate
// pairs) and the documents it refuses with name:line:col (trailing commas, duplicates, NaN,
// control characters, nesting deeper than 64, oversized input, wrong kinds).
#include <catch2/catch.hpp>

#include <string>

#include "flashlab/reference/stream_json.hpp"

namespace json = flashlab::ref::json;

TEST_CASE("stream json: values read back exactly", "[stream][json]") {
  const auto v = json::parse(R"( {"n": 18446744073709551615, "i": -9223372036854775808, "x": 1.5e-3,
      "s": "a\"b\\c\/\n\u00e9\ud83d\ude00", "b": [true, false, null], "o": {}} )", "doc");
  CHECK(v.at("n").as_uint() == 18446744073709551615ull);
  CHECK(v.at("i").as_int() == std::numeric_limits<std::int64_t>::min());
  CHECK(v.at("x").as_double() == 1.5e-3);
  CHECK(v.at("s").as_string() == "a\"b\\c/\n\xc3\xa9\xf0\x9f\x98\x80");
  CHECK(v.at("b").as_array().size() == 3);
  CHECK(v.at("b").as_array()[2].is_null());
  CHECK(v.at("o").keys().empty());
  CHECK(v.keys() == std::vector<std::string>{"n", "i", "x", "s", "b", "o"});
  CHECK(v.find("missing") == nullptr);
  CHECK_THROWS_WITH(v.at("missing"), Catch::Contains("missing member \"missing\""));
  CHECK_THROWS_WITH(v.at("s").as_uint(), Catch::Contains("expected a number, found a string"));
  CHECK_THROWS_WITH(v.at("x").as_uint(), Catch::Contains("non-negative integer"));
  CHECK_THROWS_WITH(json::parse("18446744073709551616", "big").as_uint(), Catch::Contains("below 2^64"));
}

TEST_CASE("stream json: malformed documents are refused with name:line:col", "[stream][json]") {
  auto refused = [](const std::string& text, const std::string& needle) {
    try {
      (void)json::parse(text, "m.json");
      FAIL("accepted: " << text);
    } catch (const json::JsonError& e) {
      CHECK_THAT(std::string(e.what()), Catch::Contains(needle));
    }
  };
  refused("{\"a\": 1,}", "m.json:1:9: expected a member name");
  refused("[1, 2,]", "m.json:1:7: unexpected character ']'");
  refused("{\"a\": 1, \"a\": 2}", "duplicate member \"a\"");
  refused("{\"a\": NaN}", "unexpected character 'N'");
  refused("\"tab\there\"", "control character");
  refused("{\n\"a\": [1,\n 2 3]}", "m.json:3:4: expected ',' or ']'");
  refused("01", "unexpected text after the document");
  refused("-", "a number needs digits");
  refused("\"\\ud800x\"", "high surrogate");
  refused("\"\\udc00\"", "lone low surrogate");
  refused("\"abc", "unterminated string");
  refused("", "unexpected end of the document");
  refused(std::string(65, '[') + std::string(65, ']'), "nesting deeper than 64");
  CHECK_NOTHROW(json::parse(std::string(64, '[') + std::string(64, ']'), "deep"));
  CHECK_THROWS_WITH(json::parse(std::string(100, ' '), "big", 10), Catch::Contains("100 bytes, more than the 10"));
}
