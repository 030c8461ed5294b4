// `flashlab stream trace --store`, `stream query`, `stream fidelity` and the refusals of
// `stream serve` end to end: the store holds what the library traces from the documented inputs,
// --resume continues to the same bytes, the query answers equal the library's, and bad stores,
// flags and ports are usage errors (exit 2) with a hint.
#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "flashlab/reference/npy.hpp"
#include "flashlab/reference/stream.hpp"
#include "flashlab/reference/stream_fidelity.hpp"
#include "flashlab/reference/stream_json.hpp"
#include "flashlab/reference/stream_query.hpp"
#include "flashlab/reference/stream_store.hpp"
#include "run_cli.hpp"

namespace fs = std::filesystem;
namespace rs = flashlab::ref::stream;
namespace json = flashlab::ref::json;
using flashlab::test::expect_usage_error;
using flashlab::test::fresh_temp_dir;
using flashlab::test::read_text;
using flashlab::test::run_cli;

namespace {

/// The records the reference gives for one head of inputs.
std::vector<rs::Edge> traced(const flashlab::ref::Mat<float>& Q, const flashlab::ref::Mat<float>& K,
                             const flashlab::ref::Mat<float>& V, const rs::Geometry& g, std::size_t k) {
  const rs::BlockMask mask(g);
  const auto est = rs::stream_estimate(Q, K, mask, rs::EstimateParams{k, 1});
  return rs::stream_apply(Q, K, V, mask, est.indices, k, 1, true).edges;
}

void expect_head_equals(const rs::Store& st, std::size_t segment, const std::vector<rs::Edge>& edges) {
  std::size_t i = 0;
  const auto& g = st.layout().geometry;
  for (std::size_t q = 0; q < g.n_q(); ++q) {
    const auto row = st.row(segment, q);
    for (std::size_t j = 0; j < row.size; ++j, ++i) {
      REQUIRE(i < edges.size());
      INFO("segment " << segment << " q " << q << " slot " << j);
      CHECK(std::int64_t(q) == edges[i].q);
      CHECK(row.key_block[j] == edges[i].r);
      CHECK(row.mass[j] == float(edges[i].mass));
    }
  }
  CHECK(i == edges.size());
}

const char* kTrace = "stream trace --seq 300 --dim 8 --block-m 8 --block-n 6 --k 3 --layers 2 --heads 2 --seed 4 --store ";

}  // namespace

TEST_CASE("cli stream store: trace --store holds the reference's records of the documented workload",
          "[cli][stream][store]") {
  const auto dir = fresh_temp_dir("cli_store") + "/s";
  const auto r = run_cli(std::string(kTrace) + dir + " --json");
  REQUIRE(r.exit_code == 0);
  const auto report = json::parse(r.out, "trace report");
  const auto st = rs::Store::open(dir);
  CHECK(report.at("records").as_uint() == st.records());
  CHECK(st.segments() == 4);
  CHECK(st.verify().empty());
  const rs::Geometry g{300, 8, 6};
  for (std::size_t s = 0; s < 4; ++s) {
    rs::WorkloadParams p{g, 8, 4};
    p.variant = s;
    const auto in = rs::make_workload(rs::Workload::random, p);
    expect_head_equals(st, s, traced(in.Q, in.K, in.V, g, 3));
  }
  // Into a directory that holds a store: refused, nothing overwritten.
  const std::string before = read_text(fs::path(dir) / "mass.npy");
  expect_usage_error(std::string(kTrace) + dir, "already holds a trace store");
  CHECK(read_text(fs::path(dir) / "mass.npy") == before);
  expect_usage_error(std::string(kTrace) + dir + "x --save " + dir + "y", "--save and --store");
  expect_usage_error(std::string(kTrace) + dir + "x --workload dense", "--workload 'dense' is unknown");
  expect_usage_error(std::string(kTrace) + dir + "x --workload needles --needle-layers 5", "--needle-layers");
}

TEST_CASE("cli stream store: the GPU trace's flags are checked before any CUDA call", "[cli][stream][store]") {
  const std::string dir = fresh_temp_dir("stream_store_gpu_flags");
  auto gpu = [&](const std::string& rest, int bm = 64, int dim = 128, int k = 16, const std::string& store = "t") {
    return "stream trace --store " + dir + "/" + store + " --device cuda --block-m " + std::to_string(bm) + " --block-n 64 --k " +
           std::to_string(k) + " --seq 4096 --dim " + std::to_string(dim) + rest;
  };
  expect_usage_error(gpu(""), "add --kernel fast");
  expect_usage_error(gpu(" --kernel fast", 32), "--block-m 64 --block-n 64");
  expect_usage_error(gpu(" --kernel fast", 64, 96), "--dim 64 or 128");
  expect_usage_error(gpu(" --kernel fast", 64, 128, 129), "--k 129");
  expect_usage_error(gpu(" --kernel fast --heads 4 --heads-per-launch 5"), "--heads-per-launch 5");
  expect_usage_error(gpu(" --kernel fast --chunk 0"), "--chunk 0");
  expect_usage_error(gpu(" --kernel fast --priority first"), "--priority first: expected equal, trace or estimate");
  expect_usage_error("stream trace --store " + dir + "/t --device tpu --block-m 64 --block-n 64 --k 16 --seq 4096",
                     "--device 'tpu' is unknown");
  // The CPU trace takes none of the GPU path's flags.
  const std::string cpu = "stream trace --store " + dir + "/c --block-m 8 --block-n 8 --k 2 --seq 64 --dim 8";
  expect_usage_error(cpu + " --kernel fast", "--kernel applies to --device cuda");
  expect_usage_error(cpu + " --chunk 8", "--chunk, --heads-per-launch and --priority apply to --device cuda");
  expect_usage_error(cpu + " --priority trace", "--chunk, --heads-per-launch and --priority apply to --device cuda");
  // Valid flags reach the device: a build without CUDA says so (exit 2), a machine without a GPU too;
  // on a GPU each run writes a store, so each has its own directory.
  flashlab::test::run_gpu_command(gpu(" --kernel fast --heads 2", 64, 128, 16, "v1"));
  flashlab::test::run_gpu_command(gpu(" --kernel fast --heads 2 --priority trace", 64, 128, 16, "v2"));
  flashlab::test::run_gpu_command(gpu(" --kernel fast --heads 2 --workload needles --needle-layers 0", 64, 128, 16, "v3"));
}

TEST_CASE("cli stream store: the GPU trace checks --inputs and --mask as the CPU trace does, before any CUDA call",
          "[cli][stream][store]") {
  const std::string root = fresh_temp_dir("stream_store_gpu_inputs");
  const std::string gpu = "stream trace --store " + root + "/t --device cuda --kernel fast --block-m 64 --block-n 64 --k 4";
  // Writes q, k, v of the given shapes ([T, H, D] each) into a fresh directory.
  int made = 0;
  auto inputs = [&](std::vector<std::size_t> q, std::vector<std::size_t> k, std::vector<std::size_t> v) {
    const std::string dir = root + "/in" + std::to_string(made++);
    fs::create_directories(dir);
    for (const auto& [name, shape] : {std::pair{"q.npy", q}, std::pair{"k.npy", k}, std::pair{"v.npy", v}}) {
      std::size_t n = 1;
      for (auto x : shape) n *= x;
      const std::vector<float> zeros(n, 0.f);
      flashlab::ref::write_npy(fs::path(dir) / name, shape, zeros.data());
    }
    return dir;
  };
  expect_usage_error(gpu + " --inputs " + root + "/none", "--inputs " + root + "/none: not a directory");
  const std::string good = inputs({2, 300, 4, 64}, {2, 300, 2, 64}, {2, 300, 2, 64});
  {
    // Not a .npy: the file is named.
    fs::create_directories(good + "x");
    for (const char* f : {"k.npy", "v.npy"}) fs::copy_file(fs::path(good) / f, fs::path(good + "x") / f);
    std::ofstream(fs::path(good + "x") / "q.npy") << "not a numpy file";
    expect_usage_error(gpu + " --inputs " + good + "x", "q.npy");
  }
  expect_usage_error(gpu + " --inputs " + inputs({300, 4, 64}, {299, 2, 64}, {299, 2, 64}), "must have q.npy's T = 300");
  expect_usage_error(gpu + " --inputs " + inputs({300, 4, 96}, {300, 2, 96}, {300, 2, 96}), "q.npy's head dim D = 96");
  expect_usage_error(gpu + " --inputs " + inputs({300, 4, 64}, {300, 2, 64}, {300, 2, 32}), "v.npy's head dim 32");
  expect_usage_error(gpu + " --inputs " + inputs({300, 3, 64}, {300, 2, 64}, {300, 2, 64}), "not a multiple");
  expect_usage_error(gpu + " --inputs " + good + " --seq 301", "--seq 301 disagrees");
  expect_usage_error(gpu + " --inputs " + good + " --heads 4", "--inputs gives the layers and heads");
  expect_usage_error(gpu + " --inputs " + good + " --heads-per-launch 5", "--heads-per-launch 5");
  expect_usage_error(gpu + " --inputs " + good + " --mask " + root + "/none.npy", "--mask " + root + "/none.npy");
  {
    // A mask of the wrong shape for T = 300 (5 × 5 blocks of 64) is refused, naming the file.
    const std::vector<std::uint8_t> m(4 * 4, 1);
    flashlab::ref::write_npy_raw(fs::path(root) / "mask.npy", {4, 4}, "|u1", m.data(), m.size());
    expect_usage_error(gpu + " --inputs " + good + " --mask " + root + "/mask.npy", "mask.npy");
  }
  flashlab::test::run_gpu_command(gpu + " --inputs " + good);
}

TEST_CASE("cli stream store: --resume continues an interrupted trace to the same bytes", "[cli][stream][store]") {
  const auto root = fresh_temp_dir("cli_resume");
  const auto whole = root + "/whole", part = root + "/part";
  REQUIRE(run_cli(std::string(kTrace) + whole).exit_code == 0);
  {
    // The first head as the command writes it, then the writer is gone (an interrupted trace).
    rs::StoreLayout L;
    L.geometry = {300, 8, 6};
    L.k = 3;
    L.layers = L.heads = 2;
    L.d = 8;
    L.source = "workload random, seed 4, d 8";
    auto w = rs::StoreWriter::create(part, L);
    rs::WorkloadParams p{L.geometry, 8, 4};
    const auto in = rs::make_workload(rs::Workload::random, p);
    w.begin_head(0, 0);
    w.append_edges(traced(in.Q, in.K, in.V, L.geometry, 3));
    w.end_head();
  }
  expect_usage_error("stream trace --seq 300 --dim 8 --block-m 8 --block-n 6 --k 3 --layers 2 --heads 2 --seed 5 --resume --store " + part,
                     "--resume: the store");  // other inputs than the interrupted trace's
  const auto r = run_cli(std::string(kTrace) + part + " --resume");
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("resumed after 1"));
  for (const char* f : {"manifest.json", "row_ptr.npy", "key_block.npy", "mass.npy", "rev_ptr.npy", "rev_query.npy", "segment_checksum.npy"}) {
    INFO(f);
    CHECK(read_text(fs::path(whole) / f) == read_text(fs::path(part) / f));
  }
}

TEST_CASE("cli stream store: [T, H, D] inputs with shared key/value heads are traced head by head", "[cli][stream][store]") {
  const auto dir = fresh_temp_dir("cli_store_inputs");
  const std::size_t T = 90, H = 4, Hkv = 2, D = 5;
  std::vector<double> q(T * H * D), k(T * Hkv * D), v(T * Hkv * 3);
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.37 * double(i));
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = std::cos(0.11 * double(i) + 1.0);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = double(i % 7) - 3.0;
  flashlab::ref::write_npy(fs::path(dir) / "q.npy", {T, H, D}, q.data());
  flashlab::ref::write_npy(fs::path(dir) / "k.npy", {T, Hkv, D}, k.data());
  flashlab::ref::write_npy(fs::path(dir) / "v.npy", {T, Hkv, 3}, v.data());
  const auto store = dir + "/s";
  const auto r = run_cli("stream trace --block-m 8 --block-n 8 --k 4 --inputs " + dir + " --store " + store);
  REQUIRE(r.exit_code == 0);
  const auto st = rs::Store::open(store);
  REQUIRE(st.layout().heads == 4);
  const rs::Geometry g{T, 8, 8};
  for (std::size_t h = 0; h < H; ++h) {
    flashlab::ref::Mat<float> Q(T, D), K(T, D), V(T, 3);
    const std::size_t hk = h / 2;  // two query heads per key/value head
    for (std::size_t t = 0; t < T; ++t) {
      for (std::size_t c = 0; c < D; ++c) {
        Q(Eigen::Index(t), Eigen::Index(c)) = float(q[(t * H + h) * D + c]);
        K(Eigen::Index(t), Eigen::Index(c)) = float(k[(t * Hkv + hk) * D + c]);
      }
      for (std::size_t c = 0; c < 3; ++c) V(Eigen::Index(t), Eigen::Index(c)) = float(v[(t * Hkv + hk) * 3 + c]);
    }
    expect_head_equals(st, h, traced(Q, K, V, g, 4));
  }
  expect_usage_error("stream trace --block-m 8 --block-n 8 --k 4 --inputs " + dir + " --heads 2 --store " + dir + "/t", "--inputs gives the layers");
}

TEST_CASE("cli stream query: answers equal the library's, bad questions are usage errors", "[cli][stream][store]") {
  const auto dir = fresh_temp_dir("cli_query") + "/s";
  REQUIRE(run_cli(std::string(kTrace) + dir + " --with-scores").exit_code == 0);
  const auto st = rs::Store::open(dir);

  auto r = run_cli("stream query " + dir + " --reads 150 --layer 1 --top 5 --json");
  REQUIRE(r.exit_code == 0);
  auto doc = json::parse(r.out, "reads");
  auto want = rs::top_reads(st, 150 / 8, rs::HeadSelection{1, std::nullopt}, rs::Pruning{5, 1.0});
  const auto& edges = doc.at("edges").as_array();
  REQUIRE(edges.size() == want.edges.size());
  for (std::size_t i = 0; i < edges.size(); ++i) {
    CHECK(edges[i].at("r").as_uint() == want.edges[i].r);
    CHECK(edges[i].at("head").as_uint() == want.edges[i].head);
    CHECK(edges[i].at("mass").as_double() == want.edges[i].mass);
    CHECK(edges[i].at("score").as_double() == want.edges[i].score);
  }
  r = run_cli("stream query " + dir + " --readers t60 --head 0 --json --cumulative 0.5");
  REQUIRE(r.exit_code == 0);
  doc = json::parse(r.out, "readers");
  want = rs::top_readers(st, 10, rs::HeadSelection{std::nullopt, 0}, rs::Pruning{20, 0.5});
  REQUIRE(doc.at("edges").as_array().size() == want.edges.size());
  CHECK(doc.at("candidates").as_uint() == want.candidates);

  r = run_cli("stream query " + dir + " --route 0-20:280-299 --json");
  REQUIRE(r.exit_code == 0);
  doc = json::parse(r.out, "route");
  const auto route = rs::route(st, {0, 21}, {280, 300}, rs::RouteParams{});
  CHECK(doc.at("total").as_double() == Approx(route.total).epsilon(1e-12));
  CHECK(doc.at("layers").as_array().size() == 2);

  r = run_cli("stream query " + dir + " --summary --json");
  REQUIRE(r.exit_code == 0);
  CHECK(json::parse(r.out, "summary").at("heads").as_array().size() == 4);
  r = run_cli("stream query " + dir + " --summary");
  CHECK_THAT(r.out, Catch::Contains("mass by distance"));
  r = run_cli("stream query " + dir + " --verify");
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("verified"));

  expect_usage_error("stream query " + dir, "nothing to ask");
  expect_usage_error("stream query " + dir + " --summary --verify", "one question at a time");
  expect_usage_error("stream query " + dir + " --reads 300", "outside [0, T = 300)");
  expect_usage_error("stream query " + dir + " --reads x1", "is not a position");
  expect_usage_error("stream query " + dir + " --readers 60", "outside 0..49");
  expect_usage_error("stream query " + dir + " --route 5-1:200", "ends before it starts");
  expect_usage_error("stream query " + dir + " --route 5-10", "expected SRC:DST");
  expect_usage_error("stream query " + dir + " --reads 3 --layer 2", "layer 2 is outside");
  expect_usage_error("stream query " + dir + " --reads 3 --cumulative 0", "--cumulative");
  expect_usage_error("stream query " + dir + " --route 0-5:100-120 --residual 1", "--residual");
  expect_usage_error("stream query " + fresh_temp_dir("cli_nostore") + " --summary", "manifest.json: missing");
  // A store written by a future version is refused, not misread.
  const auto m = fs::path(dir) / "manifest.json";
  std::string text = read_text(m);
  text.replace(text.find("\"version\": 1"), 12, "\"version\": 9");
  std::ofstream(m, std::ios::trunc) << text;
  expect_usage_error("stream query " + dir + " --summary", "store format version 9");
  // A build without the server (the cuda preset's) refuses `serve` before it opens the store.
  const std::string serve = "stream serve " + dir + " --port 0 --exit-after 5";
  if (const auto refused = run_cli(serve); refused.err.find("built without cpp-httplib") != std::string::npos) {
    expect_usage_error(serve, "built without cpp-httplib");
    // The hint fits the build: the switch where FLASHLAB_VIEWER is off, else the package to install.
    const bool switched_off = refused.err.find("FLASHLAB_VIEWER=OFF") != std::string::npos;
    CHECK_THAT(refused.err, Catch::Contains(switched_off ? "-DFLASHLAB_VIEWER=ON" : "install libcpp-httplib-dev"));
  } else
    expect_usage_error(serve, "store format version 9");
}

TEST_CASE("cli stream fidelity: k = n_k keeps everything, rows match the library, limits are refused",
          "[cli][stream][fidelity]") {
  auto r = run_cli("stream fidelity --seq 512 --dim 16 --block-m 32 --block-n 32 --k 2,16 --workload random,structured --json");
  REQUIRE(r.exit_code == 0);
  const auto doc = json::parse(r.out, "fidelity");
  const auto& rows = doc.at("rows").as_array();
  REQUIRE(rows.size() == 4);
  for (const auto& row : rows)
    if (row.at("k").as_uint() == 16) {  // n_k = 16: every valid block kept
      CHECK(row.at("recall").as_double() == 1.0);
      CHECK(row.at("mass_kept").as_double() == Approx(1.0).epsilon(1e-12));
    }
  const rs::Geometry g{512, 32, 32};
  const auto in = rs::make_workload(rs::Workload::random, rs::WorkloadParams{g, 16, 1});
  const rs::BlockMask mask(g);
  const auto f = rs::compare_with_dense(rs::dense_block_mass(in.Q, in.K, mask, 1), mask,
                                        rs::stream_estimate(in.Q, in.K, mask, rs::EstimateParams{2, 1}).indices, 2);
  CHECK(rows[0].at("workload").as_string() == "random");
  CHECK(rows[0].at("recall").as_double() == f.recall());
  CHECK(rows[0].at("mass_kept").as_double() == f.mass_kept);
  r = run_cli("stream fidelity --seq 512 --dim 16 --block-m 32 --block-n 32 --k 4 --workload needles");
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("planted found") && Catch::Contains("/16"));
  // The user's Q and K, [T, H, D] with one key head shared by both query heads: a row per head.
  const auto in_dir = fresh_temp_dir("cli_fidelity_inputs");
  std::vector<double> qv(200 * 2 * 6), kv(200 * 1 * 6);
  for (std::size_t i = 0; i < qv.size(); ++i) qv[i] = std::sin(0.7 * double(i));
  for (std::size_t i = 0; i < kv.size(); ++i) kv[i] = std::cos(0.3 * double(i));
  flashlab::ref::write_npy(fs::path(in_dir) / "q.npy", {200, 2, 6}, qv.data());
  flashlab::ref::write_npy(fs::path(in_dir) / "k.npy", {200, 1, 6}, kv.data());
  r = run_cli("stream fidelity --block-m 20 --block-n 20 --k 10 --inputs " + in_dir + " --json");
  REQUIRE(r.exit_code == 0);
  const auto user = json::parse(r.out, "fidelity --inputs");
  REQUIRE(user.at("rows").as_array().size() == 2);
  for (const auto& row : user.at("rows").as_array()) {
    CHECK(row.at("workload").as_string() == "inputs");
    CHECK(row.at("recall").as_double() == 1.0);  // k = n_k = 10
  }
  CHECK(user.at("rows").as_array()[1].at("head").as_uint() == 1);
  expect_usage_error("stream fidelity --block-m 20 --block-n 20 --k 10 --inputs " + in_dir + " --workload random", "--workload and --inputs");
  expect_usage_error("stream fidelity --seq 131073 --dim 16 --block-m 32 --block-n 32 --k 4", "--seq");
  expect_usage_error("stream fidelity --seq 512 --dim 16 --block-m 32 --block-n 32 --k 4,x", "--k");
  expect_usage_error("stream fidelity --seq 512 --dim 16 --block-m 32 --block-n 32 --k 4 --workload dense", "'dense' is unknown");
  expect_usage_error("stream fidelity --seq 512 --dim 4 --block-m 32 --block-n 32 --k 4 --workload structured", "d ≥ 8");
}

TEST_CASE("cli stream serve: --help says which builds serve", "[cli][stream][serve]") {
  const auto r = run_cli("stream serve --help");
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("libcpp-httplib-dev") && Catch::Contains("FLASHLAB_VIEWER=OFF"));
}

TEST_CASE("cli stream serve: a port in use and a missing store are usage errors", "[cli][stream][serve]") {
  const auto dir = fresh_temp_dir("cli_serve") + "/s";
  REQUIRE(run_cli("stream trace --seq 64 --dim 4 --block-m 8 --block-n 8 --k 2 --store " + dir).exit_code == 0);
  // Hold a loopback port, then ask the server for it.
  const int sock = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(sock >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  REQUIRE(::bind(sock, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(sock, 1) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(sock, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  const int port = ntohs(a.sin_port);
  const auto r = run_cli("stream serve " + dir + " --port " + std::to_string(port) + " --exit-after 5");
  ::close(sock);
  if (r.err.find("built without cpp-httplib") != std::string::npos) {
    CHECK(r.exit_code == 2);  // this build has no server; the refusal is the contract
    return;
  }
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Catch::Contains("cannot listen on 127.0.0.1:" + std::to_string(port)) && Catch::Contains("hint: "));
  expect_usage_error("stream serve " + dir + "/nope --port 0 --exit-after 5", "not a directory");
  expect_usage_error("stream serve " + dir + " --port 70000", "--port");
  expect_usage_error("stream serve " + dir + " --port 0 --tokens " + dir + "/manifest.json", "--tokens");
}
