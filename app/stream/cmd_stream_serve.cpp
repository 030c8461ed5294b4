// `flashlab stream serve STORE`: the trace store in a browser. A cpp-httplib server bound to
// 127.0.0.1 only (never another interface) moves requests to the endpoints of
// stream_viewer_api.cpp and their answers back; it runs until Ctrl-C, or for --max-requests
// requests or --exit-after seconds (what tests and scripts use, so no loop is unbounded).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <iostream>
#include <mutex>
#include <thread>

#include "core/input_checks.hpp"
#include "stream/stream_store_flags.hpp"
#include "stream/stream_viewer_api.hpp"
#include "flashlab/reference/stream_store.hpp"

// Last: httplib includes <resolv.h>, whose `_res` macro breaks Eigen's headers included after it.
#if FLASHLAB_HAVE_HTTPLIB
#include <httplib.h>
#endif

namespace flashlab::app {

namespace {

constexpr std::string_view kServeUsage =
    "stream serve STORE [--tokens FILE] [--port P] [--max-requests N] [--exit-after SECONDS] [--threads N]";
constexpr std::string_view kServeSummary =
    "Serves a trace store to a browser at http://127.0.0.1:P/ (this machine only): an overview of the\n"
    "sequence with edge mass by distance at any zoom, what a clicked position reads and who reads it,\n"
    "per-layer and per-head selection, routes between two spans, planted needles, and token text when\n"
    "--tokens gives one token per line (or a JSON array of strings), T of them. The page and its JSON\n"
    "endpoints are described in docs/stream.md (\"The viewer\"). --port 0 picks a free port; the line\n"
    "'serving … at http://127.0.0.1:P/' on stdout names it. Built only with cpp-httplib\n"
    "(libcpp-httplib-dev, found with pkg-config); the cuda preset leaves it out (FLASHLAB_VIEWER=OFF).";

}  // namespace

int cmd_stream_serve(const Args& args) {
  return guarded("stream serve", [&]() -> int {
    std::string store_dir, tokens_file;
    long long port = 8737, max_requests = 0, exit_after = 0, threads = 4;
    po::options_description desc("Options");
    desc.add_options()
        ("help,h", "show this help")
        ("sub", po::value<std::string>(), "serve")
        ("store", po::value<std::string>(&store_dir), "the trace store directory")
        ("tokens", po::value<std::string>(&tokens_file), "token text: one token per line, or a .json array of strings")
        ("port", po::value<long long>(&port)->default_value(8737), "TCP port on 127.0.0.1 (0: any free port)")
        ("max-requests", po::value<long long>(&max_requests)->default_value(0), "stop after this many requests (0: no limit)")
        ("exit-after", po::value<long long>(&exit_after)->default_value(0), "stop after this many seconds (0: no limit)")
        ("threads", po::value<long long>(&threads)->default_value(4), "threads answering requests");
    add_input_options(desc);
    po::positional_options_description pos;
    pos.add("sub", 1).add("store", 1);
    const auto vm = parse(args, desc, &pos);
    if (vm.count("help")) {
      print_help(std::cout, kServeUsage, kServeSummary, desc);
      return kOk;
    }
    if (store_dir.empty()) throw UsageError("missing the store directory", "flashlab stream serve DIR");
    require_range("port", port, 0, 65535);
    require_range("max-requests", max_requests, 0, 1LL << 40);
    require_range("exit-after", exit_after, 0, 1LL << 30);
    require_range("threads", threads, 1, 64);
    const InputPolicy policy = input_policy(vm);
#if !FLASHLAB_HAVE_HTTPLIB && defined(FLASHLAB_VIEWER_OFF)
    throw UsageError("this flashlab was built without cpp-httplib (FLASHLAB_VIEWER=OFF, as the cuda preset sets), "
                     "so it cannot serve",
                     "serve with the cpu preset's build, or configure with -DFLASHLAB_VIEWER=ON where "
                     "libcpp-httplib-dev is installed");
#elif !FLASHLAB_HAVE_HTTPLIB
    throw UsageError("this flashlab was built without cpp-httplib, so it cannot serve",
                     "install libcpp-httplib-dev (make deps) and build again");
#else
    return with_store_errors([&]() -> int {
      const auto store = ref::stream::Store::open(store_dir);
      std::vector<std::string> tokens;
      if (!tokens_file.empty()) tokens = load_tokens(tokens_file, store.layout().geometry.T, policy.memory_limit);
      const ViewerApi api(store, std::move(tokens), load_planted(store_dir, store.layout()), policy.memory_limit);

      httplib::Server server;
      // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, which would let a second server
      // share a port that is in use instead of failing to bind.
      server.set_socket_options([](socket_t sock) {
        int yes = 1;
        ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, reinterpret_cast<const char*>(&yes), sizeof yes);
      });
      // Headers and body go out as separate writes: without TCP_NODELAY, Nagle's algorithm holds
      // the body until the client's delayed ACK (40 ms on Linux) on a kept-alive connection.
      server.set_tcp_nodelay(true);
      const auto pool = std::size_t(threads);
      server.new_task_queue = [pool] { return new httplib::ThreadPool(pool); };
      std::mutex mutex;
      std::condition_variable cv;
      bool done = false;
      std::atomic<long long> answered{0};
      server.Get(R"(/.*)", [&](const httplib::Request& req, httplib::Response& res) {
        std::map<std::string, std::string> params;
        for (const auto& [k, v] : req.params) params[k] = v;
        ViewerResponse r;
        try {
          r = api.handle(req.path, params);
        } catch (const std::exception& e) {
          r = {500, std::string("{\"error\":\"") + json_escape(e.what()) + "\",\"hint\":\"see the server's terminal\"}"};
        }
        res.status = r.status;
        res.set_header("Cache-Control", "no-store");
        res.set_content(std::move(r.body), r.content_type.c_str());
      });
      // The logger runs after a response is written: count it there, so the last allowed
      // request is answered before the server stops.
      server.set_logger([&](const httplib::Request&, const httplib::Response&) {
        const long long n = ++answered;
        if (max_requests > 0 && n >= max_requests) {
          std::lock_guard<std::mutex> lock(mutex);
          done = true;
          cv.notify_all();
        }
      });
      int bound = 0;
      if (port == 0) {
        bound = server.bind_to_any_port("127.0.0.1");
      } else if (server.bind_to_port("127.0.0.1", int(port))) {
        bound = int(port);
      }
      if (bound <= 0)
        throw UsageError("cannot listen on 127.0.0.1:" + std::to_string(port) + " (the port is in use, or needs privileges)",
                         "choose another --port, or --port 0 for any free one");
      std::cout << "serving " << store_dir << " (" << store.records() << " records, " << store.segments() << " heads) at http://127.0.0.1:"
                << bound << "/" << std::endl;
      std::thread stopper([&] {
        std::unique_lock<std::mutex> lock(mutex);
        if (exit_after > 0) cv.wait_for(lock, std::chrono::seconds(exit_after), [&] { return done; });
        else cv.wait(lock, [&] { return done; });
        lock.unlock();
        server.stop();
      });
      const bool ok = server.listen_after_bind();
      {
        std::lock_guard<std::mutex> lock(mutex);
        done = true;
        cv.notify_all();
      }
      stopper.join();
      std::cout << "stopped after " << answered.load() << " requests" << std::endl;
      return ok ? kOk : kFailed;
    });
#endif
  });
}

}  // namespace flashlab::app
