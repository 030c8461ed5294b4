// Synthetic inputs for traces and fidelity runs (stream_fidelity.hpp): random, planted needles,
// and structured (local window + sink + retrieval). Every value is a pure function of
// (seed, variant, position), drawn from a counter-based generator, so a trace of many heads is
// reproducible and any head can be regenerated alone.
#include "flashlab/reference/stream_fidelity.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

namespace flashlab::ref::stream {

namespace {

std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// N(0, 1) for counter i of `stream` (Box–Muller on two uniforms in (0, 1]).
double normal(std::uint64_t stream, std::uint64_t i) {
  const double u1 = (double(mix(stream ^ mix(2 * i)) >> 11) + 1.0) * 0x1.0p-53;
  const double u2 = double(mix(stream ^ mix(2 * i + 1)) >> 11) * 0x1.0p-53;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

/// Columns [c0, d) of m filled with scale·N(0, 1) from `stream`.
void fill(Mat<float>& m, Eigen::Index c0, std::uint64_t stream, double scale) {
  for (Eigen::Index t = 0; t < m.rows(); ++t)
    for (Eigen::Index c = c0; c < m.cols(); ++c) m(t, c) = float(scale * normal(stream, std::uint64_t(t * m.cols() + c)));
}

std::uint64_t stream_id(std::uint64_t seed, std::size_t variant, std::uint64_t tensor) {
  return mix(mix(seed) ^ mix(0x1000 + variant) ^ mix(0x77 + tensor));
}

WorkloadInputs random_inputs(const WorkloadParams& p) {
  const auto T = Eigen::Index(p.geometry.T), d = Eigen::Index(p.d);
  WorkloadInputs in{Mat<float>(T, d), Mat<float>(T, d), Mat<float>(T, d), {}};
  fill(in.Q, 0, stream_id(p.seed, p.variant, 0), 1.0 / std::sqrt(double(p.d)));
  fill(in.K, 0, stream_id(p.seed, p.variant, 1), 1.0);
  fill(in.V, 0, stream_id(p.seed, p.variant, 2), 1.0);
  return in;
}

WorkloadInputs needle_inputs(const WorkloadParams& p) {
  NeedleParams np;
  np.geometry = p.geometry;
  np.d = p.d;
  np.needle_blocks = p.needle_blocks;
  np.needles_per_block = p.needles_per_block;
  np.seed = p.seed;
  NeedleSet set = make_needles(np);  // the plan (and the noise of variant 0)
  WorkloadInputs in{std::move(set.Q), std::move(set.K), Mat<float>(Eigen::Index(p.geometry.T), Eigen::Index(p.d)),
                    std::move(set.needles)};
  if (p.variant > 0) {
    // Needle i of needle block j owns coordinate j·M + i (stream_needles.hpp); the columns after
    // them are noise, redrawn here with the generator's spread (uniform of sd 0.02) for another head.
    const auto planted = Eigen::Index(np.set_blocks() * np.needles_per_block);
    const double half_width = np.noise * std::sqrt(3.0);
    for (Mat<float>* m : {&in.Q, &in.K}) {
      const std::uint64_t id = stream_id(p.seed, p.variant, m == &in.Q ? 3 : 4);
      for (Eigen::Index t = 0; t < m->rows(); ++t)
        for (Eigen::Index c = planted; c < m->cols(); ++c) {
          const double u = double(mix(id ^ mix(std::uint64_t(t * m->cols() + c))) >> 11) * 0x1.0p-53;
          (*m)(t, c) = float((2 * u - 1) * half_width);
        }
    }
  }
  fill(in.V, 0, stream_id(p.seed, p.variant, 2), 1.0);
  return in;
}

WorkloadInputs structured_inputs(const WorkloadParams& p) {
  const Geometry& g = p.geometry;
  if (p.d < 8) throw StreamError("structured inputs need d ≥ 8 (3 position/sink coordinates and a retrieval direction)");
  const std::size_t window = p.window ? p.window : 4 * g.bk;
  const double beta = 4.0 / double(window);  // the local logit falls by 4 over one window
  const double lambda = 4.0, sigma = 3.0, rho = std::sqrt(12.0);
  const std::size_t free_dims = p.d - 3;
  // Noise on the free coordinates with ⟨noise_q, noise_k⟩ of standard deviation 0.5.
  const double eta = std::sqrt(0.5 / std::sqrt(double(free_dims)));
  const auto T = Eigen::Index(g.T), d = Eigen::Index(p.d);
  WorkloadInputs in{Mat<float>(T, d), Mat<float>(T, d), Mat<float>(T, d), {}};
  fill(in.Q, 3, stream_id(p.seed, p.variant, 5), eta);
  fill(in.K, 3, stream_id(p.seed, p.variant, 6), eta);
  fill(in.V, 0, stream_id(p.seed, p.variant, 2), 1.0);
  for (Eigen::Index t = 0; t < T; ++t) {
    in.Q(t, 0) = float(-beta * double(t));
    in.Q(t, 1) = 1.0f;
    in.Q(t, 2) = 1.0f;
    in.K(t, 0) = 1.0f;
    in.K(t, 1) = float(beta * double(t) + lambda);
    in.K(t, 2) = 0.0f;
  }
  // The sink: block 0's keys leave the decay and carry σ.
  for (Eigen::Index s = 0; s < Eigen::Index(std::min(g.bk, g.T)); ++s) {
    in.K(s, 0) = 0.0f;
    in.K(s, 1) = 0.0f;
    in.K(s, 2) = float(sigma);
  }
  // Retrieval: query blocks spread over the second half, each with a key block in the first half
  // of its past (not block 0) and its own direction u; the key block's keys carry ρ·u and no decay.
  const std::size_t n_q = g.n_q(), first = n_q / 2, span = n_q - first;
  if (p.needle_blocks > span) throw StreamError("structured inputs: " + std::to_string(p.needle_blocks) +
                                                " retrieval blocks exceed the query blocks of the second half");
  if (p.needles_per_block > g.bq) throw StreamError("structured inputs: more retrieving tokens per block than b_q");
  std::uint64_t draw = mix(p.seed + 11);
  for (std::size_t j = 0; j < p.needle_blocks; ++j) {
    const std::size_t q = first + j * span / p.needle_blocks;
    const std::size_t last = std::min(g.T - 1, (q + 1) * g.bq - 1) / g.bk;
    const std::size_t range = last / 2;  // key blocks 1..range
    if (range < 1) throw StreamError("structured inputs: query block " + std::to_string(q) + " has no far past (larger T)");
    std::size_t r = 0;
    do {
      draw = mix(draw);
      r = 1 + std::size_t(draw % range);
    } while (std::any_of(in.planted.begin(), in.planted.end(), [&](const Needle& n) { return n.r == r; }));
    std::vector<double> u(free_dims);
    double norm = 0;
    for (std::size_t c = 0; c < free_dims; ++c) norm += (u[c] = normal(mix(p.seed + 101 + j), c)) * u[c];
    for (auto& x : u) x /= std::sqrt(norm);
    for (std::size_t s = r * g.bk; s < std::min(g.T, (r + 1) * g.bk); ++s) {
      in.K(Eigen::Index(s), 0) = 0.0f;
      in.K(Eigen::Index(s), 1) = 0.0f;
      for (std::size_t c = 0; c < free_dims; ++c) in.K(Eigen::Index(s), Eigen::Index(3 + c)) = float(rho * u[c]);
    }
    const std::size_t rows = g.q_rows(q);
    for (std::size_t i = 0; i < std::min(p.needles_per_block, rows); ++i) {
      const std::size_t t = q * g.bq + i * rows / p.needles_per_block;
      for (std::size_t c = 0; c < free_dims; ++c) in.Q(Eigen::Index(t), Eigen::Index(3 + c)) = float(rho * u[c]);
    }
    in.planted.push_back(Needle{q, r});
  }
  return in;
}

}  // namespace

std::string_view workload_name(Workload w) {
  switch (w) {
    case Workload::random: return "random";
    case Workload::needles: return "needles";
    case Workload::structured: return "structured";
  }
  return "?";
}

std::optional<Workload> workload_from_name(std::string_view name) {
  for (Workload w : {Workload::random, Workload::needles, Workload::structured})
    if (workload_name(w) == name) return w;
  return std::nullopt;
}

WorkloadInputs make_workload(Workload w, const WorkloadParams& p) {
  p.geometry.check();
  if (p.d < 1) throw StreamError("d must be at least 1");
  switch (w) {
    case Workload::random: return random_inputs(p);
    case Workload::needles: return needle_inputs(p);
    case Workload::structured: return structured_inputs(p);
  }
  throw StreamError("unknown workload");
}

}  // namespace flashlab::ref::stream
