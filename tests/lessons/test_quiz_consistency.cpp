// Every quiz answer agrees with what its own checker accepts. Where the answer is a cost of the
// lesson's trace (Problem 2's and Problem 3's cycles, the inner6 quiz), an exhaustive search over
// the 2×2 matmul machines proves that no trace the checker accepts is cheaper, and the cheapest
// trace the search finds is run through the real checker: it passes at exactly that cost. Where
// the answer is a formula, it is compared with the lesson's budget and with counts measured on
// the reference traces, across n.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "flashlab/lessons/checker.hpp"
#include "flashlab/lessons/formula.hpp"
#include "flashlab/lessons/lesson.hpp"
#include "flashlab/lessons/tile.hpp"
#include "flashlab/reference/attention_traffic.hpp"
#include "flashlab/toymachine/assembler.hpp"
#include "flashlab/toymachine/executor.hpp"

using namespace flashlab::lessons;

namespace {

// ---- the search over 2×2 matmul traces --------------------------------------------------------
//
// A register holds nothing useful (0), an input (a_ik: 1..4, b_kj: 5..8), a product a_ik·b_kj
// (9..16) or a finished output c_ij = a_i0·b_0j + a_i1·b_1j (17..20). The machines have no
// subtraction, so any other value (a sum of unrelated products, a square) can never become part
// of a right output: it counts as nothing. Registers are interchangeable, so a state keeps their
// values sorted, plus which outputs are stored and whether four partial products of one k have
// been held at once. Each step costs one cycle:
//   LOAD an input into any register; MAC_Z a product of two held operands; MAC an output from
//   two held operands and its other held product; STORE a held output; or overwrite a register
//   with nothing (any instruction that computes something useless).
// This is every move a right trace can make, and a few more; so the cheapest goal the search
// reaches is a lower bound on every trace the checker accepts (the checker accepts only right
// outputs, as exact polynomials).

int a_val(int i, int k) { return 1 + i * 2 + k; }
int b_val(int k, int j) { return 5 + k * 2 + j; }
int p_val(int i, int k, int j) { return 9 + i * 4 + k * 2 + j; }
int c_val(int i, int j) { return 17 + i * 2 + j; }

struct Rules {
  int registers = 3;
  int outputs = 0xF;        // which of c00, c01, c10, c11 (bit i*2+j) must be stored
  int max_inputs = 99;      // Problem 3: at most two registers hold inputs at any step
  bool four_at_once = false;  // Problem 3: four partial products of one k held at once
};

constexpr std::uint8_t kNoRegister = 31;  // a slot the machine does not have: sorts last

struct Node {
  std::array<std::uint8_t, 6> reg{};  // sorted; slots beyond the machine's registers hold kNoRegister
  std::uint8_t stored = 0;
  bool flag = false;
  [[nodiscard]] std::uint64_t key() const {
    std::uint64_t k = 0;
    for (auto r : reg) k = k * 32 + r;
    return (k << 5) | (static_cast<std::uint64_t>(stored) << 1) | (flag ? 1 : 0);
  }
};

// One move, as the witness trace needs it: the value written (or stored) and the value it replaced.
struct Move {
  enum Kind { Load, Product, Output, Store, Clear } kind = Load;
  int value = 0, replaced = 0;
};

bool holds(const Node& s, int v) { return std::find(s.reg.begin(), s.reg.end(), v) != s.reg.end(); }

int lower_bound_to_goal(const Node& s, const Rules& r) {
  int stores = 0, macs = 0;
  std::array<bool, 9> need{};
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) {
      const int bit = i * 2 + j;
      if (!(r.outputs >> bit & 1) || (s.stored >> bit & 1)) continue;
      ++stores;
      if (holds(s, c_val(i, j))) continue;
      for (int k = 0; k < 2; ++k) {
        if (holds(s, p_val(i, k, j))) continue;
        ++macs;
        need[static_cast<std::size_t>(a_val(i, k))] = need[static_cast<std::size_t>(b_val(k, j))] = true;
      }
    }
  int loads = 0;
  for (int v = 1; v <= 8; ++v) loads += need[static_cast<std::size_t>(v)] && !holds(s, v);
  return stores + macs + loads;
}

struct SearchResult {
  int cycles = -1;           // the cheapest, or −1 when none within the bound
  std::vector<Move> moves;   // one cheapest path
};

// Breadth-first, one cycle per layer, keeping only states that can still reach the goal within
// `bound` (lower_bound_to_goal never overestimates): the first layer with a goal is the cheapest,
// so a result of k cycles also proves that no trace takes fewer.
SearchResult search(const Rules& r, int bound) {
  auto legal = [&](const Node& s) {
    return std::count_if(s.reg.begin(), s.reg.end(), [](int v) { return v >= 1 && v <= 8; }) <= r.max_inputs;
  };
  auto goal = [&](const Node& s) { return (s.stored & r.outputs) == r.outputs && (!r.four_at_once || s.flag); };
  auto mark = [&](Node& s) {
    for (int k = 0; k < 2; ++k) {
      bool all = true;
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j) all = all && holds(s, p_val(i, k, j));
      s.flag = s.flag || all;
    }
  };
  std::unordered_map<std::uint64_t, std::pair<std::uint64_t, Move>> parent;
  Node start;
  for (std::size_t q = static_cast<std::size_t>(r.registers); q < start.reg.size(); ++q) start.reg[q] = kNoRegister;
  std::vector<Node> layer{start};
  parent[start.key()] = {start.key(), Move{}};
  for (int g = 0; g <= bound; ++g) {
    for (const Node& s : layer) {
      if (!goal(s)) continue;
      SearchResult res;
      res.cycles = g;
      for (std::uint64_t k = s.key(); k != start.key(); k = parent[k].first) res.moves.push_back(parent[k].second);
      std::reverse(res.moves.begin(), res.moves.end());
      return res;
    }
    std::vector<Node> next;
    auto push = [&](const Node& from, Node to, Move m) {
      std::sort(to.reg.begin(), to.reg.end());
      mark(to);
      if (!legal(to) || g + 1 + lower_bound_to_goal(to, r) > bound) return;
      const auto k = to.key();
      if (parent.count(k)) return;
      parent[k] = {from.key(), m};
      next.push_back(to);
    };
    for (const Node& s : layer) {
      // Writes: each distinct value present may be replaced.
      std::vector<int> slots;
      for (int q = 0; q < r.registers; ++q)
        if (q == 0 || s.reg[static_cast<std::size_t>(q)] != s.reg[static_cast<std::size_t>(q - 1)]) slots.push_back(q);
      auto write = [&](int value, Move::Kind kind) {
        for (int q : slots) {
          Node t = s;
          const int old = t.reg[static_cast<std::size_t>(q)];
          if (old == value) continue;
          t.reg[static_cast<std::size_t>(q)] = static_cast<std::uint8_t>(value);
          push(s, t, Move{kind, value, old});
        }
      };
      for (int v = 1; v <= 8; ++v) write(v, Move::Load);
      for (int i = 0; i < 2; ++i)
        for (int k = 0; k < 2; ++k)
          for (int j = 0; j < 2; ++j) {
            if (!holds(s, a_val(i, k)) || !holds(s, b_val(k, j))) continue;
            write(p_val(i, k, j), Move::Product);
            if (holds(s, p_val(i, 1 - k, j))) write(c_val(i, j), Move::Output);
          }
      write(0, Move::Clear);
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j) {
          const int bit = i * 2 + j;
          if (!holds(s, c_val(i, j)) || (s.stored >> bit & 1)) continue;
          Node t = s;
          t.stored = static_cast<std::uint8_t>(t.stored | 1 << bit);
          push(s, t, Move{Move::Store, c_val(i, j), 0});
        }
    }
    layer = std::move(next);
  }
  return {};
}

// The path as a trace for the real machine: each abstract register value is given a real
// register holding it.
std::string witness(const std::vector<Move>& moves, int registers) {
  std::vector<int> file(static_cast<std::size_t>(registers), 0);
  auto reg_of = [&](int v) {
    for (std::size_t q = 0; q < file.size(); ++q)
      if (file[q] == v) return static_cast<int>(q);
    FAIL("no register holds value " << v);
    return -1;
  };
  auto name = [](int q) { return std::string(1, 'R') += static_cast<char>('0' + q); };
  auto input = [](int v) {
    return v <= 4 ? "a[" + std::to_string((v - 1) / 2) + "][" + std::to_string((v - 1) % 2) + "]"
                  : "b[" + std::to_string((v - 5) / 2) + "][" + std::to_string((v - 5) % 2) + "]";
  };
  std::string out;
  for (const Move& m : moves) {
    if (m.kind == Move::Store) {
      const int c = m.value - 17;
      out += "STORE " + name(reg_of(m.value)) + ", c[" + std::to_string(c / 2) + "][" + std::to_string(c % 2) + "]\n";
      continue;
    }
    const int dst = reg_of(m.replaced);
    if (m.kind == Move::Load) {
      out += "LOAD " + input(m.value) + ", " + name(dst) + "\n";
    } else if (m.kind == Move::Product || m.kind == Move::Output) {
      const int c = m.kind == Move::Product ? m.value - 9 : -1;
      int i = 0, k = 0, j = 0;
      if (m.kind == Move::Product) {
        i = c / 4, k = c / 2 % 2, j = c % 2;
      } else {
        i = (m.value - 17) / 2, j = (m.value - 17) % 2;
        k = std::find(file.begin(), file.end(), p_val(i, 0, j)) != file.end() ? 1 : 0;  // the missing product
      }
      const std::string ops = name(reg_of(a_val(i, k))) + ", " + name(reg_of(b_val(k, j)));
      out += m.kind == Move::Product ? "MAC_Z " + ops + ", " + name(dst) + "\n"
                                     : "MAC " + ops + ", " + name(reg_of(p_val(i, 1 - k, j))) + ", " + name(dst) + "\n";
    } else {  // a useless value: the product of a register with itself
      const int src = file[0] != 0 ? 0 : dst;
      out += "MAC_Z " + name(src) + ", " + name(src) + ", " + name(dst) + "\n";
    }
    file[static_cast<std::size_t>(dst)] = m.value;
  }
  return out;
}

const Question& question(const char* id, const char* key) {
  const Lesson* l = find_lesson(id);
  REQUIRE(l);
  for (const auto& q : l->questions)
    if (q.key == key) return q;
  FAIL("lesson " << id << " has no question " << key);
  return l->questions.front();
}

int number(const Question& q) { return static_cast<int>(std::lround(evaluate_formula(q.expected, {}))); }

CheckReport check(const char* id, const std::string& trace) {
  const Lesson* l = find_lesson(id);
  REQUIRE(l);
  CheckOptions opt;
  opt.seed = 1;
  return check_trace(*l, trace, "witness.trace", opt);
}

std::uint64_t cost(const CheckReport& rep, const std::string& metric) {
  for (const auto& c : rep.costs)
    if (c.metric == metric) return c.measured;
  return 0;
}

// The counters of lesson `l`'s reference trace at size n, run on the toy machine.
flashlab::toy::Counters reference_counters(const Lesson& l, int n) {
  const auto m = task_machine(*l.trace, n);
  const auto as = flashlab::toy::assemble(l.trace->solution, m, "solution.trace");
  REQUIRE(as.ok());
  flashlab::toy::Executor ex(as.program, m, flashlab::toy::random_inputs(m, 1), flashlab::toy::Options{false, 0});
  REQUIRE(!ex.run());
  return ex.state().counters;
}

// The search under `r` must find its cheapest trace at exactly `cycles` (and so none cheaper), and
// that trace must pass lesson `id`'s checker at that cost. Returns the checker's report.
CheckReport cheapest_passes(const char* id, const Rules& r, int cycles) {
  const auto res = search(r, cycles);
  REQUIRE(res.cycles == cycles);
  const std::string w = witness(res.moves, r.registers);
  const auto rep = check(id, w);
  INFO("lesson " << id << ", the cheapest trace:\n" << w << rep.to_text());
  CHECK(rep.verdict == Verdict::Passed);
  CHECK(cost(rep, "cycles") == static_cast<std::uint64_t>(cycles));
  return rep;
}

}  // namespace

TEST_CASE("quiz consistency: the matmul answers are the cheapest traces their checkers accept", "[lessons][quiz]") {
  SECTION("Problem 1: 7 cycles for c00 on three registers") {
    Rules r;
    r.outputs = 1;
    cheapest_passes("1", r, 7);
  }
  SECTION("Problem 2: its answer is the fewest cycles of any right trace on three registers") {
    cheapest_passes("2", Rules{}, number(question("2", "cycles")));
  }
  SECTION("inner6: its answers are the fewest cycles and LOADs of any right trace on six registers") {
    Rules r;
    r.registers = 6;
    const auto rep = cheapest_passes("inner6", r, number(question("inner6", "cycles")));
    const int loads = number(question("inner6", "loads"));
    CHECK(cost(rep, "LOADs") == static_cast<std::uint64_t>(loads));
    CHECK(loads == 8);  // each of the eight inputs once: no trace reads fewer
  }
  SECTION("Problem 3: its answer is the fewest cycles of any trace its method check accepts") {
    Rules r;
    r.registers = 6;
    r.max_inputs = 2;
    r.four_at_once = true;
    cheapest_passes("3", r, number(question("3", "cycles")));
    // Without the two-operand rule the four partial sums can be held in 20 cycles: the checker
    // refuses that trace, which is what keeps the answer right.
    Rules loose = r;
    loose.max_inputs = 99;
    const auto cheap = search(loose, 20);
    REQUIRE(cheap.cycles == 20);
    const std::string wc = witness(cheap.moves, 6);
    const auto refused = check("3", wc);
    INFO(wc << refused.to_text());
    CHECK(refused.verdict == Verdict::Wrong);
    CHECK_THAT(refused.to_text(), Catch::Contains("registers hold inputs at once"));
  }
}

TEST_CASE("quiz consistency: formula answers are the budgets and the measured counts", "[lessons][quiz]") {
  const std::vector<VariableRange> n_range{VariableRange{"n", 1, 1e6, false}};
  auto same = [&](const std::string& a, const std::string& b) { return compare_on_domain(a, b, n_range, 7).equal; };
  // Problems 4 and 5: the answers are the budgets the checker grades, at every n.
  for (const char* id : {"4", "5"}) {
    const Lesson* l = find_lesson(id);
    REQUIRE(l);
    INFO("lesson " << id);
    CHECK(same(question(id, "reads").expected, l->trace->target.reads));
    CHECK(same(question(id, "writes").expected, l->trace->target.writes));
    // … and what the reference trace measures at every size up to 64.
    for (int n = 1; n <= 64; ++n) {
      const auto c = reference_counters(*l, n);
      const double reads = evaluate_formula(question(id, "reads").expected, {{"n", n}});
      const double writes = evaluate_formula(question(id, "writes").expected, {{"n", n}});
      CHECK(c.dram_reads == static_cast<std::uint64_t>(reads));
      CHECK(c.dram_writes == static_cast<std::uint64_t>(writes));
    }
  }
  // Problem 7: one pass — the reference reads every k and v element `passes` times, q once, and
  // that is the budget 4n + 2.
  {
    const Lesson* l = find_lesson("7");
    const int passes = number(question("7", "passes"));
    CHECK(same("2 + 4n*" + std::to_string(passes), l->trace->target.reads));
    for (int n : {1, 2, 5, 17}) {
      const auto c = reference_counters(*l, n);
      const auto m = task_machine(*l->trace, n);
      for (const char* arr : {"k", "v"}) {
        const auto& reads = c.element_reads[static_cast<std::size_t>(m.find_array(arr))];
        CHECK(std::all_of(reads.begin(), reads.end(), [&](auto r) { return static_cast<int>(r) == passes; }));
      }
    }
  }
  // The loop-order quizzes: measured on the tile model's reference traces.
  auto tile_counts = [](const char* id, int n) {
    const Lesson* l = find_lesson(id);
    const auto shape = tile::lesson_shape(n);
    const auto in = tile::random_tile_inputs(shape, 1);
    const auto prog = tile::assemble_tiles(l->trace->solution, shape, "solution.trace");
    return tile::run_tiles(prog, shape, in.q, in.k, in.v).counters;
  };
  auto transfers = [](const tile::TileCounters& c) {
    std::uint64_t t = 0;
    for (const auto& [k, v] : c.loads) t += v;
    for (const auto& [k, v] : c.stores) t += v;
    return static_cast<double>(t);
  };
  for (int n = 1; n <= 12; ++n) {
    INFO("n = " << n);
    const auto fa2 = tile_counts("fa2-order", n), fa1 = tile_counts("fa1-order", n);
    const Bindings at{{"n", n}};
    CHECK(evaluate_formula(question("ai-order", "inner").expected, at) == transfers(fa2));
    CHECK(evaluate_formula(question("ai-order", "outer").expected, at) == transfers(fa1));
    CHECK(evaluate_formula(question("ai-order", "ai").expected, at) ==
          Approx(static_cast<double>(fa2.attn) / transfers(fa2)).epsilon(1e-12));
    // One more resident O slot stores each query tile once instead of once per KV tile.
    CHECK(evaluate_formula(question("fa1-order", "saved").expected, at) ==
          static_cast<double>(fa1.stores.at('O') - fa2.stores.at('O')) / n);
  }
  // The tile lessons' budgets add up to the ai-order answers, at every n.
  for (const auto& [id, key] : {std::pair{"fa2-order", "inner"}, std::pair{"fa1-order", "outer"}}) {
    std::string sum;
    for (const auto& [metric, formula] : find_lesson(id)->trace->tile_targets) sum += (sum.empty() ? "" : " + ") + ("(" + formula + ")");
    CHECK(same(sum, question("ai-order", key).expected));
  }
}

TEST_CASE("quiz consistency: the other answers follow from their own definitions", "[lessons][quiz]") {
  // ai-flash: the intensity is the FLOPs over the K/V elements read, and the K/V elements are
  // what the reference traffic model counts for FA2 (fp32: 4 bytes each).
  const std::vector<VariableRange> ranges = find_lesson("ai-flash")->questions.front().ranges;
  CHECK(compare_on_domain("(" + question("ai-flash", "flops").expected + ")/(" + question("ai-flash", "kv").expected + ")",
                          question("ai-flash", "ai").expected, ranges, 3)
            .equal);
  for (const auto& [n, d, br] : {std::tuple{4096, 64, 64}, std::tuple{1024, 128, 128}, std::tuple{512, 32, 16}}) {
    flashlab::ref::AttentionProblem p;
    p.batch = 1;
    p.heads = 1;
    p.seq = static_cast<std::size_t>(n);
    p.head_dim = static_cast<std::size_t>(d);
    p.Br = static_cast<std::size_t>(br);
    p.Bc = 32;
    const auto t = flashlab::ref::attention_traffic_formula(flashlab::ref::Algorithm::fa2_fwd, p);
    const double kv = evaluate_formula(question("ai-flash", "kv").expected, {{"n", n}, {"d", d}, {"Br", br}});
    INFO("n=" << n << " d=" << d << " Br=" << br);
    CHECK(static_cast<double>(t.read_bytes("K") + t.read_bytes("V")) / 4 == kv);
  }
  // traffic-levels: each K_j is read by every query tile, Tr = N/Br of them.
  CHECK(number(question("traffic-levels", "rereads")) == 4096 / 64);
  // safety: e^709 is finite in float64, e^710 is not; e^(m − m′) ≤ e^0 = 1.
  const int overflow = number(question("safety", "overflow"));
  CHECK(std::isinf(std::exp(static_cast<double>(overflow))));
  CHECK(std::isfinite(std::exp(static_cast<double>(overflow - 1))));
  CHECK(number(question("safety", "bound")) == 1);
  // merge: the merged statistics of two tiles are those of the tiles joined.
  std::vector<double> xa{0.3, -1.2, 2.5}, xb{1.7, 4.1}, va{0.5, -2, 1}, vb{3, -1};
  auto stats = [](const std::vector<double>& x, const std::vector<double>& v) {
    const double m = *std::max_element(x.begin(), x.end());
    double d = 0, num = 0;
    for (std::size_t i = 0; i < x.size(); ++i) d += std::exp(x[i] - m), num += std::exp(x[i] - m) * v[i];
    return std::array<double, 3>{m, d, num};
  };
  const auto a = stats(xa, va), b = stats(xb, vb);
  auto xs = xa, vs = va;
  xs.insert(xs.end(), xb.begin(), xb.end());
  vs.insert(vs.end(), vb.begin(), vb.end());
  const auto both = stats(xs, vs);
  const Bindings at{{"ma", a[0]}, {"mb", b[0]}, {"da", a[1]}, {"db", b[1]}, {"na", a[2]}, {"nb", b[2]}};
  CHECK(evaluate_formula(question("merge", "m").expected, at) == Approx(both[0]));
  CHECK(evaluate_formula(question("merge", "d").expected, at) == Approx(both[1]));
  CHECK(evaluate_formula(question("merge", "num").expected, at) == Approx(both[2]));
}

TEST_CASE("quiz consistency: the grouped K/V and decode lessons follow the reference's model", "[lessons][quiz][traffic]") {
  namespace ref = flashlab::ref;
  const auto kv_bytes = [](const ref::AttentionProblem& p, ref::KvLoads loads) {
    const auto t = ref::attention_traffic_formula(ref::Algorithm::fa2_fwd, p, loads);
    return double(t.read_bytes("K") + t.read_bytes("V"));
  };
  // traffic-gqa: the per-group count drops the head count by H/Hkv, and the formula answer is
  // the model's K/V bytes at any shape with N a multiple of Br.
  const std::string formula = question("traffic-gqa", "formula").expected;
  for (const auto& [n, h, hkv, d, br] : {std::tuple{8192, 32, 8, 128, 128}, std::tuple{1024, 8, 1, 64, 64},
                                         std::tuple{512, 12, 4, 32, 16}}) {
    ref::AttentionProblem p;
    p.seq = std::size_t(n);
    p.heads = std::size_t(h);
    p.heads_kv = std::size_t(hkv);
    p.head_dim = std::size_t(d);
    p.Br = p.Bc = std::size_t(br);
    p.dtype = ref::Dtype::bf16;
    INFO("N=" << n << " H=" << h << " Hkv=" << hkv);
    CHECK(kv_bytes(p, ref::KvLoads::per_query_head) == kv_bytes(p, ref::KvLoads::per_group) * h / hkv);
    CHECK(evaluate_formula(formula, {{"B", 1}, {"N", n}, {"Hkv", hkv}, {"d", d}, {"Br", br}}) ==
          kv_bytes(p, ref::KvLoads::per_group));
  }
  CHECK(evaluate_formula(question("traffic-gqa", "head").expected, {}) ==
        64.0 * 32 * 2 * 8192 * 128 * 2);  // Tr · H · (K and V) · N · d · 2 bytes
  // traffic-decode: the time is the model's bytes at 3 TB/s; the rows answer is the smallest
  // whole Nq whose intensity reaches 300 FLOPs per byte.
  const double bytes = evaluate_formula(question("traffic-decode", "bytes").expected, {});
  CHECK(bytes == 2.0 * 131072 * 8 * 128 * 2 + 2 * 32 * 128 * 2 + 32 * 4);  // K, V; Q, O; LSE
  CHECK(evaluate_formula(question("traffic-decode", "time").expected, {}) == Approx(bytes / 3e12 * 1e6).epsilon(1e-12));
  const std::string intensity = question("traffic-decode", "intensity").expected;
  const int rows = number(question("traffic-decode", "rows"));
  CHECK(evaluate_formula(intensity, {{"Nq", rows}, {"H", 32}, {"Hkv", 8}}) >= 300);
  CHECK(evaluate_formula(intensity, {{"Nq", rows - 1}, {"H", 32}, {"Hkv", 8}}) < 300);
  CHECK(evaluate_formula(question("traffic-decode", "flops").expected, {}) / (bytes - 2 * 32 * 128 * 2 - 32 * 4) ==
        evaluate_formula(intensity, {{"Nq", 1}, {"H", 32}, {"Hkv", 8}}));
}
