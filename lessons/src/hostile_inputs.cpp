// The hostile input sets (hostile_inputs.hpp). Each one targets a wrong method named in the
// lessons' wrong-answer catalogue (tests/lessons/wrong/):
//   x near −800         a maximum started at 0: every e^(x − 0) underflows to 0, and 0/0 is NaN
//   x near +800         no maximum subtracted at all: e^800 is ∞
//   −800 … +800 spread  the first element (or all but the last) subtracted instead of the maximum
//   the maximum at xp   a maximum that misses one element: each position p in turn holds +800
//                       while the rest are near −800, so the missed element's exponent is ~1600
//   x near −10⁶         a maximum started at a constant (−100, say) instead of at an element:
//                       every e^(x − c) underflows to 0, and 0/0 is NaN
//   all equal           ties: the maximum is every element at once
//   x near 1e9          Σx² − (Σx)²/n cancels to nothing; Welford's correction does not
#include "hostile_inputs.hpp"

#include <random>

namespace flashlab::lessons::detail {

namespace {

// The positions that take the maximum in turn: every one at small n, else both ends, the middle
// and a few drawn from the seed (the check runs at every small n, so each position is tried).
std::vector<std::size_t> max_positions(std::size_t n, std::mt19937_64& rng) {
  std::vector<std::size_t> out;
  if (n <= 24) {
    for (std::size_t p = 0; p < n; ++p) out.push_back(p);
    return out;
  }
  for (std::size_t p : {std::size_t{0}, std::size_t{1}, n / 2, n - 2, n - 1}) out.push_back(p);
  for (int k = 0; k < 3; ++k) out.push_back(static_cast<std::size_t>(rng() % n));
  return out;
}

// Uniform noise in [−w, w], rounded to 0.01 like the random inputs (short tables).
double noise(std::mt19937_64& rng, double w) {
  std::uniform_real_distribution<double> u(-w, w);
  return static_cast<double>(static_cast<long long>(u(rng) * 100)) / 100.0;
}

std::vector<HostileInputs> softmax_like(std::size_t n, std::mt19937_64& rng, bool mean) {
  std::vector<HostileInputs> out;
  auto make = [&](std::string name, auto value, double tol = 1e-9) {
    std::vector<double> x(n);
    for (std::size_t i = 0; i < n; ++i) x[i] = value(i);
    out.push_back({std::move(name), {{"x", x}}, tol});
  };
  make("x near +800", [&](std::size_t) { return 800 + noise(rng, 2); });
  make("x near −800 (all negative)", [&](std::size_t) { return -800 + noise(rng, 2); });
  make("x from −800 to +800 (the maximum last)", [&](std::size_t i) {
    if (i + 1 == n) return 800.0;
    if (i == 0) return -800.0;
    return (rng() % 2 ? 790.0 : -800.0) + noise(rng, 2);
  });
  make("all x equal", [&](std::size_t) { return 3.25; });
  if (!mean) {
    make("x near −10⁶ (all far below any constant start)", [&](std::size_t) { return -1e6 + noise(rng, 2); });
    for (std::size_t p : max_positions(n, rng)) {
      make("x near −800 with the maximum +800 at x" + std::to_string(p),
           [&](std::size_t i) { return i == p ? 800.0 : -800 + noise(rng, 2); });
    }
  }
  if (mean) {
    // Float64 keeps ~7 digits after the point at 1e9: a correct running mean loses ~1e-7.
    make("x near 1e9", [&](std::size_t) { return 1e9 + noise(rng, 2); }, 1e-6);
    make("all x equal near 1e9", [&](std::size_t) { return 1e9 + 0.5; }, 1e-6);
  }
  return out;
}

std::vector<HostileInputs> attention_like(std::size_t n, std::mt19937_64& rng) {
  // Scores s_j = q·k_j with q = (20, 20): k_j near (±20, ±20) puts s_j near ±800.
  std::vector<HostileInputs> out;
  auto make = [&](std::string name, auto score_sign) {
    std::vector<double> k(2 * n), v(2 * n);
    for (std::size_t j = 0; j < n; ++j) {
      const double s = score_sign(j);
      k[2 * j] = 20 * s + noise(rng, 0.05);
      k[2 * j + 1] = 20 * s + noise(rng, 0.05);
      v[2 * j] = noise(rng, 2);
      v[2 * j + 1] = noise(rng, 2);
    }
    out.push_back({std::move(name), {{"q", {20, 20}}, {"k", k}, {"v", v}}, 1e-9});
  };
  make("scores near +800", [](std::size_t) { return 1.0; });
  make("scores near −800 (all negative)", [](std::size_t) { return -1.0; });
  make("scores from −800 to +800 (the maximum last)", [&](std::size_t j) {
    if (j + 1 == n) return 1.0;
    if (j == 0) return -1.0;
    return rng() % 2 ? 0.98 : -1.0;
  });
  make("all scores equal", [](std::size_t) { return 0.5; });
  for (std::size_t p : max_positions(n, rng)) {
    make("scores near −800 with the maximum +800 at key " + std::to_string(p),
         [p](std::size_t j) { return j == p ? 1.0 : -1.0; });
  }
  return out;
}

}  // namespace

std::vector<HostileInputs> hostile_inputs(InputFamily family, const toy::Machine& machine, std::uint64_t seed) {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 11);
  const std::size_t n = static_cast<std::size_t>(machine.n);
  switch (family) {
    case InputFamily::None: return {};
    case InputFamily::Softmax: return softmax_like(n, rng, false);
    case InputFamily::Mean: return softmax_like(n, rng, true);
    case InputFamily::Attention: return attention_like(n, rng);
  }
  return {};
}

}  // namespace flashlab::lessons::detail
