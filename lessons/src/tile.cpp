// The tile model (seed 004, "Element is Tile" and "Inner Product vs. Outer Product in
// Attention"). Lives in lessons/ rather than toymachine/: the toy machine's registers hold
// scalars, and this model's registers hold a whole tile (Br×d block, or a running state).
// Parsing reuses the toy machine's index-expression evaluator and Diagnostic so that errors look
// the same in both models.
#include "flashlab/lessons/tile.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <stdexcept>

namespace flashlab::lessons::tile {

namespace {

constexpr std::size_t kMaxTileInstructions = 1'000'000;

std::string trim(std::string_view s) {
  std::size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return std::string(s.substr(a, b - a));
}

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

// One operand as written, with its column (1-based).
struct RawOperand {
  std::string text;
  int col = 0;
};

// A parsed line: an instruction or a loop with a body.
struct Node {
  bool loop = false;
  int line = 0;
  int col = 0;
  std::string mnemonic;              // instruction
  std::vector<RawOperand> operands;  // instruction
  std::string var;                   // loop
  RawOperand lo, hi;                 // loop bounds (expressions)
  std::vector<Node> body;            // loop
};

class TileAssembler {
 public:
  TileAssembler(std::string_view text, const TileShape& shape, std::string_view filename)
      : shape_(shape), file_(filename) {
    std::string cur;
    for (char c : text) {
      if (c == '\n') {
        lines_.push_back(cur);
        cur.clear();
      } else if (c != '\r') {
        cur += c;
      }
    }
    if (!cur.empty()) lines_.push_back(cur);
  }

  TileProgram run() {
    std::vector<Node> top;
    std::vector<Node>* target = &top;
    std::vector<std::vector<Node>*> targets{&top};
    for (std::size_t li = 0; li < lines_.size(); ++li) {
      const int line = static_cast<int>(li) + 1;
      std::string s = lines_[li];
      if (auto h = s.find('#'); h != std::string::npos) s.resize(h);
      // Leading step number (the seed's tables number their rows).
      std::size_t p = 0;
      while (p < s.size() && std::isspace(static_cast<unsigned char>(s[p]))) ++p;
      std::size_t q = p;
      while (q < s.size() && std::isdigit(static_cast<unsigned char>(s[q]))) ++q;
      if (q > p && q < s.size() && std::isspace(static_cast<unsigned char>(s[q]))) p = q;
      while (p < s.size() && std::isspace(static_cast<unsigned char>(s[p]))) ++p;
      if (p >= s.size()) continue;
      const int col0 = static_cast<int>(p) + 1;
      std::size_t e = p;
      while (e < s.size() && !std::isspace(static_cast<unsigned char>(s[e]))) ++e;
      const std::string word = s.substr(p, e - p);
      const std::string uword = upper(word);
      target = targets.back();
      if (uword == "FOR") {
        Node n;
        n.loop = true;
        n.line = line;
        n.col = col0;
        // for VAR in A..B
        const std::string rest = s.substr(e);
        std::istringstream is(rest);
        std::string var, in;
        is >> var >> in;
        const auto dots = rest.find("..");
        const auto in_pos = rest.find(" in ");
        if (var.empty() || upper(in) != "IN" || dots == std::string::npos || in_pos == std::string::npos) {
          error(line, col0, static_cast<int>(word.size()), "malformed loop",
                "write a loop as `for i in 0..n-1` … `end`");
          continue;
        }
        n.var = var;
        const std::size_t lo_start = in_pos + 4;
        n.lo = RawOperand{trim(rest.substr(lo_start, dots - lo_start)), static_cast<int>(e + lo_start) + 1};
        n.hi = RawOperand{trim(rest.substr(dots + 2)), static_cast<int>(e + dots + 2) + 1};
        target->push_back(std::move(n));
        targets.push_back(&target->back().body);
        open_line_.push_back(line);
        continue;
      }
      if (uword == "END") {
        if (targets.size() == 1) {
          error(line, col0, 3, "`end` without a matching `for`", "remove it, or open the loop with `for i in A..B`");
        } else {
          targets.pop_back();
          open_line_.pop_back();
        }
        continue;
      }
      Node n;
      n.line = line;
      n.col = col0;
      n.mnemonic = uword;
      // Operands: comma separated, columns kept.
      std::size_t start = e;
      const std::string rest = s;
      while (start < rest.size()) {
        std::size_t comma = rest.find(',', start);
        if (comma == std::string::npos) comma = rest.size();
        std::string raw = rest.substr(start, comma - start);
        std::size_t lead = 0;
        while (lead < raw.size() && std::isspace(static_cast<unsigned char>(raw[lead]))) ++lead;
        const std::string t = trim(raw);
        if (!t.empty() || comma < rest.size()) {
          n.operands.push_back(RawOperand{t, static_cast<int>(start + lead) + 1});
        }
        start = comma + 1;
      }
      if (!check_shape(n)) continue;
      target->push_back(std::move(n));
    }
    for (int l : open_line_) {
      error(l, 1, 3, "this `for` has no matching `end`", "close every loop with a line `end`");
    }
    TileProgram prog;
    if (diags_.empty()) {
      std::vector<std::pair<std::string, long long>> vars{{"n", shape_.n}};
      expand(top, vars, prog.code);
    }
    prog.diagnostics = std::move(diags_);
    if (prog.diagnostics.size() > toy::kMaxDiagnostics) prog.diagnostics.resize(toy::kMaxDiagnostics);
    return prog;
  }

 private:
  void error(int line, int col, int len, std::string msg, std::string hint) {
    toy::Diagnostic d;
    d.file = file_;
    d.line = line;
    d.col = col;
    d.length = std::max(1, len);
    d.message = std::move(msg);
    d.hint = std::move(hint);
    d.source_line = line >= 1 && static_cast<std::size_t>(line) <= lines_.size() ? lines_[line - 1] : "";
    diags_.push_back(std::move(d));
  }

  std::string reg_hint() const {
    return "this tile machine has " + std::to_string(shape_.slots) + " tile registers, R0..R" +
           std::to_string(shape_.slots - 1);
  }

  // Register operand → index, or −1 with a diagnostic.
  int reg(const Node& n, const RawOperand& o) {
    const std::string u = upper(o.text);
    if (u.size() >= 2 && u[0] == 'R' &&
        std::all_of(u.begin() + 1, u.end(), [](unsigned char c) { return std::isdigit(c); })) {
      const int r = std::stoi(u.substr(1));
      if (r < shape_.slots) return r;
      error(n.line, o.col, static_cast<int>(o.text.size()), "no register " + o.text, reg_hint());
      return -1;
    }
    error(n.line, o.col, std::max<int>(1, static_cast<int>(o.text.size())),
          "expected a register, got '" + o.text + "'", reg_hint());
    return -1;
  }

  // Memory operand: T[expr] with T in Q K V O (STORE: only O).
  bool mem(const Node& n, const RawOperand& o, bool store) {
    const auto lb = o.text.find('[');
    if (o.text.size() < 4 || lb != 1 || o.text.back() != ']' ||
        std::string("QKVO").find(static_cast<char>(std::toupper(static_cast<unsigned char>(o.text[0])))) == std::string::npos) {
      error(n.line, o.col, std::max<int>(1, static_cast<int>(o.text.size())),
            "expected a tile such as Q[i], K[j], V[j] or O[i], got '" + o.text + "'",
            "HBM holds the tiles Q[0..n-1], K[0..n-1], V[0..n-1] and O[0..n-1]");
      return false;
    }
    if (store && std::toupper(static_cast<unsigned char>(o.text[0])) != 'O') {
      error(n.line, o.col, 1, "only O is written: " + o.text.substr(0, 1) + " is an input",
            "STORE Rs, O[i] writes the running state of query tile i back to HBM");
      return false;
    }
    return true;
  }

  bool check_shape(const Node& n) {
    const std::size_t before = diags_.size();
    auto count = [&](std::size_t want, const char* pattern) {
      if (n.operands.size() != want) {
        error(n.line, n.col, static_cast<int>(n.mnemonic.size()),
              n.mnemonic + " takes " + std::to_string(want) + " operands, got " + std::to_string(n.operands.size()),
              std::string("write ") + pattern);
        return false;
      }
      return true;
    };
    if (n.mnemonic == "LOAD") {
      if (count(2, "LOAD Q[i], R0")) {
        mem(n, n.operands[0], false);
        reg(n, n.operands[1]);
      }
    } else if (n.mnemonic == "STORE") {
      if (count(2, "STORE R3, O[i]")) {
        reg(n, n.operands[0]);
        mem(n, n.operands[1], true);
      }
    } else if (n.mnemonic == "ATTN") {
      if (count(4, "ATTN Rq, Rk, Rv, Ro")) {
        for (const auto& o : n.operands) reg(n, o);
      }
    } else {
      error(n.line, n.col, static_cast<int>(n.mnemonic.size()), "unknown tile instruction '" + n.mnemonic + "'",
            "the tile machine has LOAD T[idx], Rd · STORE Rs, O[idx] · ATTN Rq, Rk, Rv, Ro");
    }
    return diags_.size() == before;
  }

  bool eval(const Node& n, const RawOperand& o, const std::string& expr, int col,
            const std::vector<std::pair<std::string, long long>>& vars, long long& out) {
    std::string err;
    std::size_t ecol = 0;
    if (!toy::eval_index_expression(expr, vars, out, err, ecol)) {
      error(n.line, col + static_cast<int>(ecol), 1, err, "indices use integers, n, loop variables, + − * and ( )");
      (void)o;
      return false;
    }
    return true;
  }

  void expand(const std::vector<Node>& nodes, std::vector<std::pair<std::string, long long>>& vars,
              std::vector<TileInstruction>& out) {
    for (const auto& n : nodes) {
      if (!diags_.empty()) return;
      if (n.loop) {
        long long lo = 0, hi = 0;
        if (!eval(n, n.lo, n.lo.text, n.lo.col, vars, lo) || !eval(n, n.hi, n.hi.text, n.hi.col, vars, hi)) return;
        for (long long v = lo; v <= hi; ++v) {
          vars.emplace_back(n.var, v);
          expand(n.body, vars, out);
          vars.pop_back();
          if (!diags_.empty()) return;
        }
        continue;
      }
      if (out.size() >= kMaxTileInstructions) {
        error(n.line, n.col, 1, "the trace expands to more than 1000000 instructions", "check the loop bounds");
        return;
      }
      TileInstruction ins;
      ins.source_line = n.line;
      std::string text = n.mnemonic + " ";
      if (n.mnemonic == "ATTN") {
        ins.op = TileOp::ATTN;
        for (int k = 0; k < 4; ++k) ins.regs[k] = std::stoi(n.operands[k].text.substr(1));
        text += rname(ins.regs[0]) + ", R" + std::to_string(ins.regs[1]) + ", R" +
                std::to_string(ins.regs[2]) + ", R" + std::to_string(ins.regs[3]);
      } else {
        const bool load = n.mnemonic == "LOAD";
        ins.op = load ? TileOp::LOAD : TileOp::STORE;
        const RawOperand& m = n.operands[load ? 0 : 1];
        const RawOperand& r = n.operands[load ? 1 : 0];
        ins.regs[0] = std::stoi(r.text.substr(1));
        ins.tensor = static_cast<char>(std::toupper(static_cast<unsigned char>(m.text[0])));
        const std::string idx = m.text.substr(2, m.text.size() - 3);
        if (!eval(n, m, idx, m.col + 2, vars, ins.index)) return;
        const std::string cell = std::string(1, ins.tensor) + "[" + std::to_string(ins.index) + "]";
        text += load ? cell + ", R" + std::to_string(ins.regs[0]) : rname(ins.regs[0]) + ", " + cell;
      }
      ins.text = text;
      out.push_back(std::move(ins));
    }
  }

  TileShape shape_;
  std::string file_;
  std::vector<std::string> lines_;
  std::vector<toy::Diagnostic> diags_;
  std::vector<int> open_line_;
};

// The running state of one query tile (seed "Full update rules": m, denominator, numerator).
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
  return TileAssembler(text, shape, filename).run();
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
  for (auto& s : hbm_o) s = empty_state();  // O starts initialised in HBM (seed: "O loads n (initialize once per query)")
  std::vector<std::optional<Slot>> regs(shape.slots);
  TileRun run;
  auto fault = [&](std::size_t step, const TileInstruction& ins, std::string msg, std::string hint) {
    run.fault = "step " + std::to_string(step) + " (line " + std::to_string(ins.source_line) + ", " + ins.text +
                "): " + msg;
    run.fault_hint = std::move(hint);
  };
  auto name = [](const Slot& s) { return std::string(1, s.kind) + std::to_string(s.index); };
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
      // Seed "Element is Tile": local block max and sums, merged into the running state with
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
