// The tile model (the toy-machine lesson, "Element is Tile" and "Inner Product vs. Outer Product
// in Attention"). Lives in lessons/ rather than toymachine/: the toy machine's registers hold
// scalars, and this model's registers hold a whole tile (Br×d block, or a running state).
// Parsing goes through the toy machine's front end (lines, loops, index expressions, located
// diagnostics and their limits), so errors look the same in both models.
#include "flashlab/lessons/tile.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <stdexcept>

namespace flashlab::lessons::tile {

namespace {

// Builds "R<k>" (a helper rather than "R" + to_string: GCC 12 warns falsely on that, PR105329).
std::string rname(long long r) {
  std::string s("R");
  s += std::to_string(r);
  return s;
}

std::string upper(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// One tile instruction as written; the tile index is bound at expansion.
struct TileStatement {
  TileOp op = TileOp::LOAD;
  char tensor = 'Q';
  std::array<int, 4> regs{{-1, -1, -1, -1}};
  toy::IndexExpr index;  // LOAD/STORE
  int line = 0;
};

// The tile model's operands on top of the shared front end (lines, loops, index expressions and
// diagnostics come from toymachine's frontend.hpp, so errors read the same in both models).
class TileAssembler {
 public:
  TileAssembler(toy::Source& src, const TileShape& shape) : src_(src), shape_(shape) {}

  bool parse_statement(const toy::StatementLine& st, const toy::IndexVars& scope) {
    const std::string& s = src_.line(st.line);
    const std::string word = s.substr(st.mnemonic.begin, st.mnemonic.end - st.mnemonic.begin);
    const std::string mn = upper(word);
    TileStatement t;
    t.line = st.line;
    auto count = [&](std::size_t want, const char* pattern) {
      if (st.operands.size() == want) return true;
      error(st.line, st.mnemonic, mn + " takes " + std::to_string(want) + " operands, got " + std::to_string(st.operands.size()),
            std::string("write ") + pattern);
      return false;
    };
    bool ok = true;
    if (mn == "LOAD") {
      if (!count(2, "LOAD Q[i], R0")) return false;
      t.op = TileOp::LOAD;
      ok = tile(st.line, st.operands[0], false, scope, t);
      ok = reg(st.line, st.operands[1], t.regs[0]) && ok;
    } else if (mn == "STORE") {
      if (!count(2, "STORE R3, O[i]")) return false;
      t.op = TileOp::STORE;
      ok = reg(st.line, st.operands[0], t.regs[0]);
      ok = tile(st.line, st.operands[1], true, scope, t) && ok;
    } else if (mn == "ATTN") {
      if (!count(4, "ATTN Rq, Rk, Rv, Ro")) return false;
      t.op = TileOp::ATTN;
      for (std::size_t k = 0; k < 4; ++k) ok = reg(st.line, st.operands[k], t.regs[k]) && ok;
    } else {
      error(st.line, st.mnemonic, "unknown tile instruction '" + word + "'",
            "the tile machine has LOAD T[idx], Rd · STORE Rs, O[idx] · ATTN Rq, Rk, Rv, Ro");
      return false;
    }
    if (ok) statements_.push_back(std::move(t));
    return ok;
  }

  bool emit(std::size_t statement, const toy::IndexVars& vars, std::vector<TileInstruction>& out) {
    const TileStatement& t = statements_[statement];
    TileInstruction ins;
    ins.op = t.op;
    ins.regs = t.regs;
    ins.tensor = t.tensor;
    ins.source_line = t.line;
    if (t.op == TileOp::ATTN) {
      ins.text = "ATTN " + rname(t.regs[0]) + ", " + rname(t.regs[1]) + ", " + rname(t.regs[2]) + ", " + rname(t.regs[3]);
    } else {
      if (!toy::evaluate_index(src_, t.index, vars, ins.index)) return false;
      // Built by appending (GCC 12 warns falsely on chains of string temporaries, PR105329).
      std::string cell(1, t.tensor);
      cell += '[';
      cell += std::to_string(ins.index);
      cell += ']';
      const std::string r = rname(t.regs[0]);
      ins.text = t.op == TileOp::LOAD ? "LOAD " : "STORE ";
      ins.text += t.op == TileOp::LOAD ? cell : r;
      ins.text += ", ";
      ins.text += t.op == TileOp::LOAD ? r : cell;
    }
    out.push_back(std::move(ins));
    return true;
  }

 private:
  void error(int line, toy::Span at, std::string msg, std::string hint) {
    src_.error(line, at.begin, std::max<std::size_t>(1, at.end - at.begin), std::move(msg), std::move(hint));
  }

  std::string reg_hint() const {
    return "this tile machine has " + std::to_string(shape_.slots) + " tile registers, R0..R" +
           std::to_string(shape_.slots - 1);
  }

  // A register operand R<k> with k < slots (digits read with a bound: no overflow, no stoi).
  bool reg(int line, toy::Span at, int& out) {
    const std::string text = src_.line(line).substr(at.begin, at.end - at.begin);
    const bool digits = text.size() >= 2 && (text[0] == 'R' || text[0] == 'r') &&
                        std::all_of(text.begin() + 1, text.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
    if (!digits) {
      error(line, at, "expected a register, got '" + text + "'", reg_hint());
      return false;
    }
    long long r = 0;
    for (std::size_t i = 1; i < text.size() && r < shape_.slots; ++i) r = r * 10 + (text[i] - '0');
    if (r >= shape_.slots) {
      error(line, at, "no register " + text, reg_hint());
      return false;
    }
    out = static_cast<int>(r);
    return true;
  }

  // A tile operand T[expr] with T in Q K V O (STORE: only O); the expression is checked now.
  bool tile(int line, toy::Span at, bool store, const toy::IndexVars& scope, TileStatement& t) {
    const std::string text = src_.line(line).substr(at.begin, at.end - at.begin);
    const char tensor = text.empty() ? ' ' : static_cast<char>(std::toupper(static_cast<unsigned char>(text[0])));
    if (text.size() < 4 || text[1] != '[' || text.back() != ']' || std::string("QKVO").find(tensor) == std::string::npos) {
      error(line, at, "expected a tile such as Q[i], K[j], V[j] or O[i], got '" + text + "'",
            "HBM holds the tiles Q[0..n-1], K[0..n-1], V[0..n-1] and O[0..n-1]");
      return false;
    }
    if (store && tensor != 'O') {
      error(line, {at.begin, at.begin + 1}, "only O is written: " + text.substr(0, 1) + " is an input",
            "STORE Rs, O[i] writes the running state of query tile i back to HBM");
      return false;
    }
    t.tensor = tensor;
    t.index = toy::IndexExpr{text.substr(2, text.size() - 3), line, at.begin + 2};
    return toy::check_index(src_, t.index, scope);
  }

  toy::Source& src_;
  TileShape shape_;
  std::vector<TileStatement> statements_;
};

// The running state of one query tile (the lesson's "Full update rules": m, denominator, numerator).
struct OState {
  std::vector<double> m, l, acc;     // per row; acc is rows × d
  std::vector<long long> merged;     // KV tiles already folded in
};

struct Slot {
  char kind = 'Q';  // Q, K, V hold input tiles; O holds a state
  long long index = 0;
  std::shared_ptr<OState> state;  // kind O only
};

}  // namespace

TileProgram assemble_tiles(std::string_view text, const TileShape& shape, std::string_view filename) {
  toy::Source src(text, std::string(filename));
  TileAssembler a(src, shape);
  const toy::IndexVars outer{{"n", shape.n}};
  const toy::LoopProgram loops = toy::parse_loops(
      src, outer, [&](const toy::StatementLine& st, const toy::IndexVars& scope) { return a.parse_statement(st, scope); });
  TileProgram prog;
  if (src.ok()) {
    if (const auto count = toy::count_expansion(src, loops, outer)) {
      prog.code.reserve(*count);
      toy::expand_loops(src, loops, outer,
                        [&](std::size_t st, const toy::IndexVars& vars) { return a.emit(st, vars, prog.code); });
    }
  }
  prog.diagnostics = src.diagnostics();
  if (!prog.ok()) prog.code.clear();
  return prog;
}

TileRun run_tiles(const TileProgram& program, const TileShape& shape, const std::vector<double>& q,
                  const std::vector<double>& k, const std::vector<double>& v) {
  const std::size_t rows_total = static_cast<std::size_t>(shape.n) * shape.rows;
  const std::size_t need = rows_total * shape.d;
  if (q.size() != need || k.size() != need || v.size() != need) {
    throw std::invalid_argument("tile inputs must each have (n·rows)·d = " + std::to_string(need) + " elements");
  }
  const int R = shape.rows, D = shape.d;
  auto empty_state = [&] {
    auto s = std::make_shared<OState>();
    s->m.assign(R, -std::numeric_limits<double>::infinity());
    s->l.assign(R, 0.0);
    s->acc.assign(static_cast<std::size_t>(R) * D, 0.0);
    return s;
  };
  std::vector<std::shared_ptr<OState>> hbm_o(shape.n);
  for (auto& s : hbm_o) s = empty_state();  // O starts initialised in HBM (the lesson: "O loads n (initialize once per query)")
  std::vector<std::optional<Slot>> regs(shape.slots);
  TileRun run;
  auto fault = [&](std::size_t step, const TileInstruction& ins, std::string msg, std::string hint) {
    run.fault = "step " + std::to_string(step) + " (line " + std::to_string(ins.source_line) + ", " + ins.text +
                "): " + msg;
    run.fault_hint = std::move(hint);
  };
  auto name = [](const Slot& s) {
    std::string out(1, s.kind);
    out += std::to_string(s.index);
    return out;
  };
  for (std::size_t pc = 0; pc < program.code.size(); ++pc) {
    const auto& ins = program.code[pc];
    const std::size_t step = pc + 1;
    if (ins.op == TileOp::LOAD || ins.op == TileOp::STORE) {
      if (ins.index < 0 || ins.index >= shape.n) {
        fault(step, ins, std::string(1, ins.tensor) + "[" + std::to_string(ins.index) + "] is out of range",
              std::string(1, ins.tensor) + " has tiles 0..n-1 = 0.." + std::to_string(shape.n - 1));
        break;
      }
    }
    if (ins.op == TileOp::LOAD) {
      Slot s;
      s.kind = ins.tensor;
      s.index = ins.index;
      if (s.kind == 'O') s.state = std::make_shared<OState>(*hbm_o[ins.index]);
      regs[ins.regs[0]] = s;
      ++run.counters.loads[ins.tensor];
    } else if (ins.op == TileOp::STORE) {
      const auto& r = regs[ins.regs[0]];
      if (!r) {
        fault(step, ins, rname(ins.regs[0]) + " was never written", "LOAD O[i] into it first");
        break;
      }
      if (r->kind != 'O' || r->index != ins.index) {
        fault(step, ins, rname(ins.regs[0]) + " holds " + name(*r) + ", not the state of O" +
                             std::to_string(ins.index),
              "STORE writes back the running state that was loaded from the same O[i]");
        break;
      }
      hbm_o[ins.index] = std::make_shared<OState>(*r->state);
      ++run.counters.stores['O'];
    } else {  // ATTN
      const char want[4] = {'Q', 'K', 'V', 'O'};
      bool bad = false;
      for (int a = 0; a < 4 && !bad; ++a) {
        const auto& r = regs[ins.regs[a]];
        if (!r) {
          fault(step, ins, rname(ins.regs[a]) + " was never written",
                std::string("ATTN needs a ") + want[a] + " tile there: LOAD " + want[a] + "[…] into it first");
          bad = true;
        } else if (r->kind != want[a]) {
          fault(step, ins, "operand " + std::to_string(a + 1) + " (R" + std::to_string(ins.regs[a]) + ") holds " +
                               name(*r) + ", but ATTN expects a " + want[a] + " tile there",
                "ATTN Rq, Rk, Rv, Ro: query tile, key tile, value tile, running state");
          bad = true;
        }
      }
      if (bad) break;
      const Slot& sq = *regs[ins.regs[0]];
      const Slot& sk = *regs[ins.regs[1]];
      const Slot& sv = *regs[ins.regs[2]];
      Slot& so = *regs[ins.regs[3]];
      if (sk.index != sv.index) {
        fault(step, ins, "K" + std::to_string(sk.index) + " is paired with V" + std::to_string(sv.index),
              "a key tile goes with the value tile of the same index");
        break;
      }
      if (so.index != sq.index) {
        fault(step, ins, "the state in R" + std::to_string(ins.regs[3]) + " belongs to O" + std::to_string(so.index) +
                             ", but the query tile is Q" + std::to_string(sq.index),
              "update the running state of the same query tile");
        break;
      }
      auto& st = *so.state;
      if (std::find(st.merged.begin(), st.merged.end(), sk.index) != st.merged.end()) {
        fault(step, ins, "K/V tile " + std::to_string(sk.index) + " is already merged into O" + std::to_string(so.index),
              "each (query tile, KV tile) block is merged exactly once");
        break;
      }
      // "Element is Tile": local block max and sums, merged into the running state with
      // the scalar rescale e^(m − m'), row by row.
      for (int r = 0; r < R; ++r) {
        const double* qr = &q[(static_cast<std::size_t>(sq.index) * R + r) * D];
        std::vector<double> s(R);
        double mloc = -std::numeric_limits<double>::infinity();
        for (int c = 0; c < R; ++c) {
          const double* kc = &k[(static_cast<std::size_t>(sk.index) * R + c) * D];
          double dot = 0;
          for (int t = 0; t < D; ++t) dot += qr[t] * kc[t];
          s[c] = dot;
          mloc = std::max(mloc, dot);
        }
        const double mnew = std::max(st.m[r], mloc);
        const double alpha = std::isinf(st.m[r]) ? 0.0 : std::exp(st.m[r] - mnew);
        st.l[r] *= alpha;
        for (int t = 0; t < D; ++t) st.acc[static_cast<std::size_t>(r) * D + t] *= alpha;
        for (int c = 0; c < R; ++c) {
          const double p = std::exp(s[c] - mnew);
          st.l[r] += p;
          const double* vc = &v[(static_cast<std::size_t>(sv.index) * R + c) * D];
          for (int t = 0; t < D; ++t) st.acc[static_cast<std::size_t>(r) * D + t] += p * vc[t];
        }
        st.m[r] = mnew;
      }
      st.merged.push_back(sk.index);
      ++run.counters.attn;
    }
    ++run.counters.steps;
  }
  run.merged.resize(shape.n);
  run.out.assign(need, std::numeric_limits<double>::quiet_NaN());
  for (int i = 0; i < shape.n; ++i) {
    auto merged = hbm_o[i]->merged;
    std::sort(merged.begin(), merged.end());
    run.merged[i] = merged;
    for (int r = 0; r < R; ++r) {
      const double l = hbm_o[i]->l[r];
      if (l <= 0) continue;
      for (int t = 0; t < D; ++t) {
        run.out[(static_cast<std::size_t>(i) * R + r) * D + t] = hbm_o[i]->acc[static_cast<std::size_t>(r) * D + t] / l;
      }
    }
  }
  return run;
}

TileShape lesson_shape(int n) {
  TileShape s;
  s.n = n;
  return s;
}

TileInputs random_tile_inputs(const TileShape& shape, std::uint64_t seed) {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 7);
  std::uniform_real_distribution<double> u(-2.0, 2.0);
  const std::size_t count = static_cast<std::size_t>(shape.n) * shape.rows * shape.d;
  TileInputs in;
  for (auto* t : {&in.q, &in.k, &in.v}) {
    t->resize(count);
    for (auto& x : *t) x = u(rng);
  }
  return in;
}

std::vector<double> naive_attention(const std::vector<double>& q, const std::vector<double>& k,
                                    const std::vector<double>& v, int rows, int d) {
  std::vector<double> o(static_cast<std::size_t>(rows) * d, 0.0);
  for (int i = 0; i < rows; ++i) {
    std::vector<double> s(rows);
    double m = -std::numeric_limits<double>::infinity();
    for (int j = 0; j < rows; ++j) {
      double dot = 0;
      for (int t = 0; t < d; ++t) dot += q[static_cast<std::size_t>(i) * d + t] * k[static_cast<std::size_t>(j) * d + t];
      s[j] = dot;
      m = std::max(m, dot);
    }
    double l = 0;
    for (int j = 0; j < rows; ++j) l += (s[j] = std::exp(s[j] - m));
    for (int j = 0; j < rows; ++j) {
      for (int t = 0; t < d; ++t) o[static_cast<std::size_t>(i) * d + t] += s[j] / l * v[static_cast<std::size_t>(j) * d + t];
    }
  }
  return o;
}

}  // namespace flashlab::lessons::tile
