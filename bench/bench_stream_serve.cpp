// bench_stream_serve: how fast `flashlab stream serve` answers a scripted session of the viewer.
//
// Writes a large synthetic trace store (default: T = 1,048,576, 4 layers × 8 heads, k = 16,
// b = 64: 8.4 M records; rows keep their own block, block 0 and random earlier blocks, with
// random masses), starts the server on a free loopback port, and replays a fixed session of
// requests (default 200) over one keep-alive connection: overviews at every zoom from the whole
// sequence down to a few blocks (all heads, one layer, one head), reads and readers at random
// positions, routes between random spans, and the summary. Prints the median, 90th percentile and
// maximum per endpoint and over the session. Timings are wall-clock on this machine, client and
// server together; nothing is asserted (speed targets live in benchmarks, not tests).
//
//   build/cpu/bench/bench_stream_serve [--seq T] [--layers L] [--heads H] [--k K] [--requests N]
//                                      [--store DIR (serve an existing store)] [--keep DIR (keep the
//                                      synthetic store there)] [--seed S]
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "flashlab/reference/stream_store.hpp"

// Last: httplib includes <resolv.h>, whose `_res` macro breaks Eigen's headers included after it.
#include <httplib.h>

extern char** environ;

namespace fs = std::filesystem;
namespace rs = flashlab::ref::stream;

namespace {

struct Options {
  std::size_t T = 1 << 20, layers = 4, heads = 8, k = 16, b = 64, requests = 200;
  std::uint64_t seed = 1;
  std::string store;   // an existing store to serve
  std::string keep;    // write the synthetic store here and keep it
};

/// A synthetic store: each row keeps its own block, block 0 and k − 2 random earlier blocks.
void write_store(const fs::path& dir, const Options& o) {
  rs::StoreLayout L;
  L.geometry = {o.T, o.b, o.b};
  L.k = o.k;
  L.layers = o.layers;
  L.heads = o.heads;
  L.source = "synthetic records for bench_stream_serve";
  auto w = rs::StoreWriter::create(dir, L);
  std::mt19937_64 rng(o.seed);
  const std::size_t n_q = L.geometry.n_q(), k = o.k;
  std::vector<std::int64_t> I(n_q * k);
  std::vector<float> mass(n_q * k);
  for (std::size_t s = 0; s < L.segments(); ++s) {
    for (std::size_t q = 0; q < n_q; ++q) {
      std::int64_t* row = I.data() + q * k;
      std::size_t n = 0;
      row[n++] = std::int64_t(q);
      if (q > 0) row[n++] = 0;
      for (std::size_t tries = 0; n < std::min(k, q + 1) && tries < 4 * k; ++tries) {
        const auto r = std::int64_t(std::uniform_int_distribution<std::size_t>(1, q)(rng));
        if (std::find(row, row + n, r) == row + n) row[n++] = r;
      }
      float sum = 0;
      for (std::size_t j = 0; j < n; ++j) sum += (mass[q * k + j] = std::uniform_real_distribution<float>(0.01f, 1.0f)(rng));
      for (std::size_t j = 0; j < n; ++j) mass[q * k + j] *= float(o.b) / sum;
      for (std::size_t j = n; j < k; ++j) row[j] = -1;
    }
    w.begin_head(s / o.heads, s % o.heads);
    w.append(rs::RowChunk{0, n_q, I.data(), mass.data()});
    w.end_head();
  }
}

std::string flashlab_path(const char* argv0) {
  const fs::path self = fs::canonical(fs::path(argv0).is_absolute() ? fs::path(argv0) : fs::current_path() / argv0);
  return (self.parent_path().parent_path() / "app" / "flashlab").string();
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, std::size_t(p * double(v.size() - 1) + 0.5))];
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string f = argv[i], v = argv[i + 1];
    if (f == "--seq") o.T = std::stoull(v);
    else if (f == "--layers") o.layers = std::stoull(v);
    else if (f == "--heads") o.heads = std::stoull(v);
    else if (f == "--k") o.k = std::stoull(v);
    else if (f == "--requests") o.requests = std::stoull(v);
    else if (f == "--seed") o.seed = std::stoull(v);
    else if (f == "--store") o.store = v;
    else if (f == "--keep") o.keep = v;
    else {
      std::cerr << "error: unknown flag " << f << "\nhint: --seq --layers --heads --k --requests --seed --store --keep\n";
      return 2;
    }
  }
  const std::string bin = flashlab_path(argv[0]);
  fs::path dir = o.store;
  fs::path made;
  using clock = std::chrono::steady_clock;
  if (dir.empty()) {
    dir = o.keep.empty() ? fs::temp_directory_path() / ("flashlab_bench_serve_" + std::to_string(::getpid())) : fs::path(o.keep);
    if (o.keep.empty()) made = dir;
    const auto t0 = clock::now();
    write_store(dir, o);
    std::cout << "wrote a synthetic store: T=" << o.T << ", " << o.layers << " layers x " << o.heads << " heads, k=" << o.k
              << ", b=" << o.b << " in " << std::chrono::duration<double>(clock::now() - t0).count() << " s\n";
  }
  const auto st = rs::Store::open(dir);
  const auto& g = st.layout().geometry;
  std::cout << "store: " << st.records() << " records, " << st.bytes() / (1 << 20) << " MiB\n";

  int fds[2];
  if (::pipe(fds) != 0) return 1;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  std::vector<std::string> args = {bin, "stream", "serve", dir.string(), "--port", "0", "--exit-after", "900"};
  std::vector<char*> argv_c;
  for (auto& a : args) argv_c.push_back(a.data());
  argv_c.push_back(nullptr);
  pid_t pid = 0;
  const auto start = clock::now();
  if (posix_spawn(&pid, bin.c_str(), &actions, nullptr, argv_c.data(), environ) != 0) {
    std::cerr << "error: cannot start " << bin << "\n";
    return 1;
  }
  ::close(fds[1]);
  std::string out;
  int port = 0;
  while (port == 0 && clock::now() - start < std::chrono::seconds(120)) {
    pollfd p{fds[0], POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;
    char buf[1024];
    const auto n = ::read(fds[0], buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, std::size_t(n));
    const auto at = out.find("http://127.0.0.1:");
    if (at != std::string::npos && out.find('\n', at) != std::string::npos) port = std::atoi(out.c_str() + at + 17);
  }
  if (port == 0) {
    std::cerr << "error: the server did not start: " << out << "\n";
    ::kill(pid, SIGTERM);
    ::waitpid(pid, nullptr, 0);
    return 1;
  }
  std::cout << "server ready on port " << port << " after " << std::chrono::duration<double>(clock::now() - start).count()
            << " s (store opened and checked, density sums built)\n";

  // The session: a fixed mix, drawn from the seed.
  std::mt19937_64 rng(o.seed + 7);
  auto uni = [&](std::size_t lo, std::size_t hi) { return std::uniform_int_distribution<std::size_t>(lo, hi)(rng); };
  std::vector<std::pair<std::string, std::string>> session;  // (kind, path)
  const std::size_t T = g.T;
  for (std::size_t i = 0; i < o.requests; ++i) {
    const std::size_t kind = i % 10;
    std::string sel = (i / 10) % 3 == 0 ? "" : (i / 10) % 3 == 1 ? "&layer=" + std::to_string(uni(0, o.layers - 1))
                                                                   : "&head=" + std::to_string(uni(0, o.heads - 1));
    if (kind < 4) {
      const std::size_t zoom = uni(0, 14), span = std::max<std::size_t>(4 * g.bq, T >> zoom);
      const std::size_t t0 = uni(0, T - std::min(T, span));
      session.push_back({"overview", "/api/overview?bins=1000&t0=" + std::to_string(t0) + "&t1=" + std::to_string(std::min(T, t0 + span)) + sel});
    } else if (kind < 6) {
      session.push_back({"reads", "/api/reads?top=30&pos=" + std::to_string(uni(0, T - 1)) + sel});
    } else if (kind < 8) {
      session.push_back({"readers", "/api/readers?top=30&pos=" + std::to_string(uni(0, T - 1)) + sel});
    } else if (kind == 8) {
      const std::size_t a = uni(0, T / 2), b = uni(T / 2, T - 64);
      session.push_back({"route", "/api/route?src=" + std::to_string(a) + "-" + std::to_string(a + 63) + "&dst=" +
                                      std::to_string(b) + "-" + std::to_string(b + 63)});
    } else {
      session.push_back({i % 20 == 9 ? "summary" : "meta", i % 20 == 9 ? "/api/summary" : "/api/meta"});
    }
  }
  httplib::Client c("127.0.0.1", port);
  c.set_keep_alive(true);
  c.set_tcp_nodelay(true);
  c.set_read_timeout(120, 0);
  std::map<std::string, std::vector<double>> ms;
  std::vector<double> all;
  std::size_t bytes = 0, failed = 0;
  for (const auto& [kind, path] : session) {
    const auto t0 = clock::now();
    auto res = c.Get(path.c_str());
    const double t = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
    if (!res || res->status != 200) {
      ++failed;
      std::cerr << "request failed: " << path << (res ? " -> " + std::to_string(res->status) + " " + res->body : "") << "\n";
      continue;
    }
    bytes += res->body.size();
    ms[kind].push_back(t);
    all.push_back(t);
  }
  ::kill(pid, SIGTERM);
  ::waitpid(pid, nullptr, 0);
  ::close(fds[0]);
  if (!made.empty()) fs::remove_all(made);

  std::printf("%zu requests (%zu failed), %.1f MB of JSON; milliseconds per request, client and server on this machine:\n",
              all.size() + failed, failed, double(bytes) / 1e6);
  std::printf("  %-9s %6s %9s %9s %9s\n", "endpoint", "count", "median", "p90", "max");
  for (const auto& [kind, v] : ms)
    std::printf("  %-9s %6zu %9.2f %9.2f %9.2f\n", kind.c_str(), v.size(), percentile(v, 0.5), percentile(v, 0.9), percentile(v, 1.0));
  std::printf("  %-9s %6zu %9.2f %9.2f %9.2f\n", "session", all.size(), percentile(all, 0.5), percentile(all, 0.9), percentile(all, 1.0));
  return failed ? 1 : 0;
}
