// `flashlab stream serve` as a process: started on a free loopback port, every endpoint fetched
// over HTTP (127.0.0.1 only) and its JSON checked against the library's answer for the same
// store; the socket is bound to 127.0.0.1 alone; bad parameters are 400 with an error and a hint;
// --max-requests ends the server by itself.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "flashlab/reference/stream.hpp"
#include "flashlab/reference/stream_fidelity.hpp"
#include "flashlab/reference/stream_json.hpp"
#include "flashlab/reference/stream_query.hpp"
#include "flashlab/reference/stream_store.hpp"
#include "run_cli.hpp"

// Last: httplib includes <resolv.h>, whose `_res` macro breaks Eigen's headers included after it.
#include <httplib.h>

extern char** environ;

namespace fs = std::filesystem;
namespace rs = flashlab::ref::stream;
namespace json = flashlab::ref::json;

namespace {

/// A `flashlab stream serve` child process: started with a pipe on stdout, ended by its pid.
class Server {
 public:
  explicit Server(const std::vector<std::string>& args) {
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
    posix_spawn_file_actions_addclose(&actions, fds[0]);
    std::vector<std::string> argv_s = {FLASHLAB_BIN, "stream", "serve"};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    REQUIRE(posix_spawn(&pid_, FLASHLAB_BIN, &actions, nullptr, argv.data(), environ) == 0);
    posix_spawn_file_actions_destroy(&actions);
    ::close(fds[1]);
    out_ = fds[0];
  }
  ~Server() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      ::waitpid(pid_, nullptr, 0);
    }
    if (out_ >= 0) ::close(out_);
  }
  /// Reads stdout until `needle` appears or `seconds` pass; returns what was read.
  std::string read_until(const std::string& needle, int seconds) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    while (text_.find(needle) == std::string::npos && std::chrono::steady_clock::now() < end) {
      pollfd p{out_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      char buf[4096];
      const auto n = ::read(out_, buf, sizeof buf);
      if (n <= 0) break;
      text_.append(buf, std::size_t(n));
    }
    return text_;
  }
  /// The port from the "serving … at http://127.0.0.1:P/" line (0 if none in 20 s).
  int port() {
    const std::string t = read_until("/\n", 20);
    const auto at = t.find("http://127.0.0.1:");
    return at == std::string::npos ? 0 : std::atoi(t.c_str() + at + 17);
  }
  /// Waits up to `seconds` for the process to exit by itself; its exit code, or −1.
  int wait_exit(int seconds) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    while (std::chrono::steady_clock::now() < end) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  std::string text_;
};

/// A three-layer store with planted needles in layers 0 and 2, and a token file.
struct Fixture {
  std::string dir, tokens;
  std::vector<rs::Needle> planted;
};

Fixture make_store() {
  Fixture f;
  const auto root = flashlab::test::fresh_temp_dir("serve");
  f.dir = root + "/s";
  f.tokens = root + "/tokens.txt";
  const rs::Geometry g{1024, 32, 32};
  rs::StoreLayout L;
  L.geometry = g;
  L.k = 6;
  L.layers = 3;
  L.heads = 2;
  L.d = 16;
  L.score = true;
  L.source = "serve test";
  auto w = rs::StoreWriter::create(f.dir, L);
  for (std::size_t s = 0; s < L.segments(); ++s) {
    rs::WorkloadParams p{g, 16, 3};
    p.variant = s;
    p.needle_blocks = 2;
    p.needles_per_block = 2;
    const bool needles = s / 2 != 1;
    const auto in = rs::make_workload(needles ? rs::Workload::needles : rs::Workload::random, p);
    if (needles) f.planted = in.planted;
    const rs::BlockMask mask(g);
    const auto est = rs::stream_estimate(in.Q, in.K, mask, rs::EstimateParams{6, 1});
    w.begin_head(s / 2, s % 2);
    w.append_edges(rs::stream_apply(in.Q, in.K, in.V, mask, est.indices, 6, 1, true).edges);
    w.end_head();
  }
  std::ofstream tok(f.tokens);
  for (std::size_t t = 0; t < g.T; ++t) tok << "w" << t << (t % 10 == 9 ? "." : "") << "\n";
  return f;
}

json::Value get(httplib::Client& c, const std::string& path, int status = 200) {
  auto res = c.Get(path.c_str());
  REQUIRE(res);
  INFO(path << " -> " << res->body.substr(0, 300));
  REQUIRE(res->status == status);
  return json::parse(res->body, path);
}

}  // namespace

TEST_CASE("stream serve: every endpoint answers over loopback with the library's numbers", "[stream][serve]") {
  const auto f = make_store();
  Server server({f.dir, "--port", "0", "--exit-after", "60", "--tokens", f.tokens});
  const int port = server.port();
  REQUIRE(port > 0);
  // The listening socket is bound to 127.0.0.1 alone (0100007F in /proc/net/tcp), no other interface.
  {
    std::ifstream tcp("/proc/net/tcp");
    std::string line;
    char want[16];
    std::snprintf(want, sizeof want, ":%04X", port);
    bool found = false;
    while (std::getline(tcp, line)) {
      std::istringstream ss(line);
      std::string sl, local;
      ss >> sl >> local;
      if (local.size() > 5 && local.substr(local.size() - 5) == want) {
        CHECK(local.substr(0, 8) == "0100007F");
        found = true;
      }
    }
    CHECK(found);
  }
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(20, 0);
  const auto st = rs::Store::open(f.dir);

  const auto meta = get(c, "/api/meta");
  CHECK(meta.at("T").as_uint() == 1024);
  CHECK(meta.at("layers").as_uint() == 3);
  CHECK(meta.at("records").as_uint() == st.records());
  CHECK(meta.at("tokens").as_bool());
  CHECK(meta.at("classes").as_uint() == rs::distance_classes(st.layout().geometry));

  // The overview's cells sum to the store's mass, for the aggregate and for one head.
  for (const std::string sel : {"", "&layer=1", "&layer=2&head=1", "&head=0"}) {
    const auto ov = get(c, "/api/overview?t0=0&t1=1024&bins=37" + sel);
    double sum = 0;
    for (const auto& row : ov.at("values").as_array())
      for (const auto& v : row.as_array()) sum += v.as_double();
    double want = 0;
    for (std::size_t s = 0; s < st.segments(); ++s) {
      const std::size_t l = s / 2, h = s % 2;
      if ((sel.find("layer=1") != std::string::npos && l != 1) || (sel.find("layer=2") != std::string::npos && l != 2) ||
          (sel.find("head=1") != std::string::npos && h != 1) || (sel.find("head=0") != std::string::npos && h != 0))
        continue;
      for (std::size_t q = 0; q < 32; ++q) {
        const auto row = st.row(s, q);
        for (std::size_t j = 0; j < row.size; ++j) want += row.mass[j];
      }
    }
    INFO("selection '" << sel << "'");
    CHECK(sum == Approx(want).epsilon(1e-5));
    CHECK(ov.at("bins").as_uint() == 32);  // 37 asked, 32 query blocks in view
    CHECK(ov.at("bin_start").as_array().size() == 33);
  }
  const auto zoom = get(c, "/api/overview?t0=500&t1=600&bins=800&measure=edges");
  CHECK(zoom.at("t0").as_uint() == 480);  // whole query blocks
  CHECK(zoom.at("t1").as_uint() == 608);
  CHECK(zoom.at("bins").as_uint() == 4);

  const auto& nd = f.planted.front();
  const std::size_t pos = nd.q * 32 + 1;
  const auto reads = get(c, "/api/reads?pos=" + std::to_string(pos) + "&top=1000&layer=0");
  const auto want = rs::top_reads(st, nd.q, rs::HeadSelection{0, std::nullopt}, rs::Pruning{1000, 1.0});
  const auto& edges = reads.at("edges").as_array();
  REQUIRE(edges.size() == want.edges.size());
  bool needle = false;
  for (std::size_t i = 0; i < edges.size(); ++i) {
    CHECK(edges[i].at("r").as_uint() == want.edges[i].r);
    CHECK(edges[i].at("mass").as_double() == want.edges[i].mass);
    needle = needle || edges[i].at("r").as_uint() == nd.r;
  }
  CHECK(needle);
  CHECK(reads.at("text").as_string().rfind("w" + std::to_string(nd.q * 32), 0) == 0);
  const auto readers = get(c, "/api/readers?pos=" + std::to_string(nd.r * 32) + "&top=1000");
  CHECK(readers.at("candidates").as_uint() == rs::top_readers(st, nd.r, {}, rs::Pruning{1000, 1.0}).candidates);

  const std::string src = std::to_string(nd.r * 32) + "-" + std::to_string(nd.r * 32 + 31);
  const std::string dst = std::to_string(nd.q * 32) + "-" + std::to_string(nd.q * 32 + 31);
  const auto route = get(c, "/api/route?src=" + src + "&dst=" + dst);
  const auto lib = rs::route(st, {nd.r * 32, nd.r * 32 + 32}, {nd.q * 32, nd.q * 32 + 32}, rs::RouteParams{});
  CHECK(route.at("total").as_double() == Approx(lib.total).epsilon(1e-12));
  REQUIRE(route.at("layers").as_array().size() == 3);
  for (const auto& layer : route.at("layers").as_array()) {
    if (layer.at("layer").as_uint() == 1) continue;
    bool found = false;
    for (const auto& e : layer.at("edges").as_array())
      found = found || (!e.at("head").is_null() && e.at("q").as_uint() == nd.q && e.at("r").as_uint() == nd.r);
    INFO("layer " << layer.at("layer").as_uint());
    CHECK(found);  // the planted needle is on the route in both needle layers
  }

  CHECK(get(c, "/api/summary").at("heads").as_array().size() == 6);
  const auto tokens = get(c, "/api/tokens?t0=8&t1=11");
  REQUIRE(tokens.at("tokens").as_array().size() == 3);
  CHECK(tokens.at("tokens").as_array()[1].as_string() == "w9.");

  for (const std::string bad : {"/api/reads", "/api/reads?pos=1024", "/api/overview?bins=0", "/api/overview?t0=9&t1=3",
                                "/api/reads?pos=3&layer=7", "/api/route?src=9-1&dst=100", "/api/tokens?t0=0&t1=9000",
                                "/api/reads?pos=3&cumulative=2"}) {
    const auto e = get(c, bad, 400);
    CHECK_FALSE(e.at("error").as_string().empty());
    CHECK_FALSE(e.at("hint").as_string().empty());
  }
  get(c, "/api/nothing", 404);
  const auto page = c.Get("/");
  REQUIRE(page);
  CHECK(page->status == 200);
  CHECK_THAT(page->body, Catch::Contains("<canvas id=\"overview\"") && Catch::Contains("/api/overview"));
  CHECK(page->body.find("http://") == std::string::npos);  // nothing fetched from elsewhere
  CHECK(page->body.find("https://") == std::string::npos);
}

TEST_CASE("stream serve: --max-requests ends the server after that many answers", "[stream][serve]") {
  const auto f = make_store();
  Server server({f.dir, "--port", "0", "--max-requests", "3", "--exit-after", "30"});
  const int port = server.port();
  REQUIRE(port > 0);
  httplib::Client c("127.0.0.1", port);
  for (int i = 0; i < 3; ++i) {
    auto res = c.Get("/api/meta");
    REQUIRE(res);
    CHECK(res->status == 200);
  }
  CHECK(server.wait_exit(10) == 0);
  CHECK_THAT(server.read_until("requests", 2), Catch::Contains("stopped after 3 requests"));
}
