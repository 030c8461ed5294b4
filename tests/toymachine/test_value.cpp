// The symbolic printer and the algebra behind it: the lesson's table notation, naming (c00, m, S),
// max runs, Σ runs, and the folding that makes the online sum equal the two-pass S.
#include <catch2/catch.hpp>

#include "flashlab/toymachine/machine.hpp"
#include "flashlab/toymachine/value.hpp"

using namespace flashlab::toy;

namespace {
// Names built by appending: GCC 12 warns falsely (-Wrestrict, bug 105329) on "x" + std::to_string(i).
std::string name(char array, std::size_t i, std::size_t j = 99) {
  std::string s(1, array);
  s += std::to_string(i);
  if (j != 99) s += std::to_string(j);
  return s;
}
ExprPtr x(std::size_t i) { return make_input("x", i, name('x', i)); }
ExprPtr a(int i, int j) {
  return make_input("a", static_cast<std::size_t>(i * 2 + j), name('a', static_cast<std::size_t>(i), static_cast<std::size_t>(j)));
}
ExprPtr b(int i, int j) {
  return make_input("b", static_cast<std::size_t>(i * 2 + j), name('b', static_cast<std::size_t>(i), static_cast<std::size_t>(j)));
}
}  // namespace

TEST_CASE("printer: the lesson's matmul notation", "[value]") {
  const ExprPtr c00 = make_add(make_mul(a(0, 0), b(0, 0)), make_mul(a(0, 1), b(1, 0)));
  CHECK(to_string(*c00) == "a00·b00 + a01·b10");
  const Machine m = builtin_machine("matmul3");
  CHECK(to_string(*c00, &m.names) == "c00");
  // Named regardless of operand order (MAC_Z R1, R0 or accumulating k = 1 first).
  const ExprPtr swapped = make_add(make_mul(b(1, 0), a(0, 1)), make_mul(b(0, 0), a(0, 0)));
  CHECK(to_string(*swapped, &m.names) == "c00");
  CHECK(to_string(*swapped) == "b10·a01 + b00·a00");
  // A partial sum is not named.
  CHECK(to_string(*make_mul(a(0, 0), b(0, 0)), &m.names) == "a00·b00");
  // A wrong product is shown as what it is.
  CHECK(to_string(*make_add(make_mul(a(0, 0), b(0, 1)), make_mul(a(0, 1), b(1, 0))), &m.names) == "a00·b01 + a01·b10");
}

TEST_CASE("printer: the lesson's softmax notation", "[value]") {
  const Machine m = builtin_machine("softmax3", 3);
  const ExprPtr mx = make_max(make_max(x(1), x(0)), x(2));
  CHECK(to_string(*make_max(x(1), x(0))) == "max(x0, x1)");
  CHECK(to_string(*mx) == "max(x0, x1, x2)");
  CHECK(to_string(*mx, &m.names) == "m");
  const ExprPtr e0 = make_exp(make_sub(x(0), mx));
  CHECK(to_string(*e0, &m.names) == "e^(x0 − m)");
  CHECK(to_string(*make_sub(x(0), mx), &m.names) == "x0 − m");
  ExprPtr s = make_add(make_add(e0, make_exp(make_sub(x(1), mx))), make_exp(make_sub(x(2), mx)));
  CHECK(to_string(*s, &m.names) == "S");
  CHECK(to_string(*make_div(e0, s), &m.names) == "e^(x0 − m)/S");
  CHECK(to_string(*make_exp(x(3))) == "e^x3");
}

TEST_CASE("printer: long runs are abbreviated", "[value]") {
  ExprPtr mx = x(0);
  for (std::size_t i = 1; i < 8; ++i) mx = make_max(mx, x(i));
  CHECK(to_string(*mx) == "max(x0..x7)");
  CHECK(to_string(*make_max(make_max(make_max(x(0), x(1)), x(2)), x(5))) == "max(x0, x1, x2, x5)");
  ExprPtr s;
  for (std::size_t i = 2; i < 7; ++i) {
    ExprPtr t = make_exp(make_sub(x(i), mx));
    s = s ? make_add(s, t) : t;
  }
  CHECK(to_string(*s) == "Σ_{j=2..6} e^(xj − max(x0..x7))");
  // Three terms stay written out.
  ExprPtr s3 = make_add(make_add(x(0), x(1)), x(2));
  CHECK(to_string(*s3) == "x0 + x1 + x2");
}

TEST_CASE("algebra: cancel, fold, and the online-softmax rescale", "[value]") {
  CHECK(to_string(*make_sub(x(0), x(0))) == "0");
  CHECK(to_string(*make_exp(make_sub(x(0), x(0)))) == "1");  // lesson: online init, r2 = 1
  CHECK(to_string(*make_mul(make_constant(1), x(2))) == "x2");
  CHECK(to_string(*make_sub(make_add(x(0), x(1)), x(0))) == "x1");
  CHECK(to_string(*make_add(x(0), x(0))) == "2·x0");
  CHECK(to_string(*make_sub(make_constant(1), x(1))) == "1 − x1");
  CHECK(to_string(*make_sub(x(1), make_constant(2))) == "x1 − 2");
  CHECK(to_string(*make_mul(make_add(x(0), x(1)), x(2))) == "(x0 + x1)·x2");
  CHECK(to_string(*make_div(x(0), make_mul(x(1), x(2)))) == "x0/(x1·x2)");
  // e^(x0 − m1)·e^(m1 − m2) = e^(x0 − m2)
  const ExprPtr m1 = make_max(x(0), x(1)), m2 = make_max(m1, x(2));
  CHECK(equivalent(*make_mul(make_exp(make_sub(x(0), m1)), make_exp(make_sub(m1, m2))), *make_exp(make_sub(x(0), m2))));
  // (e^(x0 − m1) + e^(x1 − m1))·e^(m1 − m2) + e^(x2 − m2) = Σ e^(xj − m2)
  const ExprPtr s1 = make_add(make_exp(make_sub(x(0), m1)), make_exp(make_sub(x(1), m1)));
  const ExprPtr s2 = make_add(make_mul(s1, make_exp(make_sub(m1, m2))), make_exp(make_sub(x(2), m2)));
  const ExprPtr two_pass =
      make_add(make_add(make_exp(make_sub(x(0), m2)), make_exp(make_sub(x(1), m2))), make_exp(make_sub(x(2), m2)));
  CHECK(equivalent(*s2, *two_pass));
  CHECK(to_string(*s2) == to_string(*two_pass));
}

TEST_CASE("equivalent and hashing ignore term order but not structure", "[value]") {
  CHECK(equivalent(*make_add(x(0), x(1)), *make_add(x(1), x(0))));
  CHECK(make_add(x(0), x(1))->hash == make_add(x(1), x(0))->hash);
  CHECK_FALSE(equivalent(*make_sub(x(0), x(1)), *make_sub(x(1), x(0))));
  CHECK_FALSE(equivalent(*make_div(x(0), x(1)), *make_div(x(1), x(0))));
  CHECK(equivalent(*make_max(x(0), x(1)), *make_max(x(1), make_max(x(0), x(1)))));
}

TEST_CASE("format_number", "[value]") {
  CHECK(format_number(0.5) == "0.5");
  CHECK(format_number(-1.25) == "-1.25");
  CHECK(format_number(1.0 / 3.0) == "0.333333");
  CHECK(format_number(-0.0) == "0");
  CHECK(format_number(1e300 * 1e300) == "inf");
}

TEST_CASE("printer: an exploding expression prints a placeholder, fast", "[value]") {
  // x0^(2^80) as a DAG of 81 nodes: printing it in full would take 2^80 terms.
  ExprPtr e = make_add(x(0), x(1));
  for (int k = 0; k < 80; ++k) e = make_mul(e, e);
  CHECK(to_string(*e) == "\u27e8expression of more than 2000 terms\u27e9");
  CHECK(equivalent(*e, *e));
  // Below the cap, expressions still print in full.
  ExprPtr small = make_add(x(0), x(1));
  for (int k = 0; k < 3; ++k) small = make_mul(small, small);
  CHECK(to_string(*small).find("expression of more than") == std::string::npos);
}
