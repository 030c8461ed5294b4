// The traffic counter: per-tensor bytes by dtype, statistics kept in fp32, merge.
#include <catch2/catch.hpp>

#include "flashlab/reference/traffic.hpp"

using namespace flashlab::ref;

TEST_CASE("traffic: bytes follow the dtype, statistics stay fp32", "[traffic]") {
  Traffic t(Dtype::bf16);
  t.read("Q", 100);
  t.write("O", 10);
  t.write("LSE", 5);
  CHECK(t.read_bytes("Q") == 200);
  CHECK(t.write_bytes("O") == 20);
  CHECK(t.write_bytes("LSE") == 20);  // fp32 statistics
  CHECK(t.total_read_bytes() == 200);
  CHECK(t.total_write_bytes() == 40);
  REQUIRE(t.tensors().size() == 3);
  CHECK(t.tensors()[0].name == "Q");  // order of first touch
}

TEST_CASE("traffic: merge adds tensor by tensor", "[traffic]") {
  Traffic a(Dtype::fp32), b(Dtype::fp32);
  a.read("K", 3);
  b.read("K", 4);
  b.write("dQ", 2);
  b.add_flops(10);
  a.merge(b);
  CHECK(a.read_bytes("K") == 28);
  CHECK(a.write_bytes("dQ") == 8);
  CHECK(a.flops() == 10);
}

TEST_CASE("traffic: dtype names parse and unknown ones are refused", "[traffic][errors]") {
  CHECK(parse_dtype("fp16") == Dtype::fp16);
  CHECK(dtype_bytes(Dtype::fp64) == 8);
  REQUIRE_THROWS_WITH(parse_dtype("fp8"), Catch::Contains("choose fp32"));
}
