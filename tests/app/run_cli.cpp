#include "run_cli.hpp"

#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unistd.h>

namespace flashlab::test {

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string fresh_temp_dir(const std::string& tag) {
  static std::atomic<int> counter{0};
  auto dir = std::filesystem::temp_directory_path() /
             ("flashlab_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

CliResult run_cli(const std::string& args, const std::string& workdir) {
  const std::string dir = fresh_temp_dir("cli");
  const std::string out = dir + "/out.txt", err = dir + "/err.txt";
  std::string cmd = "NO_COLOR=1 ";
  if (!workdir.empty()) cmd = "cd '" + workdir + "' && " + cmd;
  cmd += std::string("'") + FLASHLAB_BIN + "' " + args + " </dev/null >'" + out + "' 2>'" + err + "'";
  const int status = std::system(cmd.c_str());
  CliResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = read_text(out);
  r.err = read_text(err);
  std::filesystem::remove_all(dir);
  return r;
}

void expect_usage_error(const std::string& args, const std::string& message) {
  INFO("flashlab " << args);
  const auto r = run_cli(args);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Catch::Contains("error:") && Catch::Contains(message) && Catch::Contains("hint:"));
  CHECK(r.out.empty());
}

CliResult run_gpu_command(const std::string& args) {
  INFO("flashlab " << args);
  const auto r = run_cli(args);
  INFO(r.err);
#ifndef FLASHLAB_TEST_HAVE_CUDA
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Catch::Contains("error: this flashlab was built without CUDA") && Catch::Contains("hint:"));
  CHECK(r.out.empty());
#else
  if (!std::filesystem::exists("/dev/nvidia0") && !std::filesystem::exists("/dev/nvidiactl")) {
    // No NVIDIA device node: cudaGetDeviceCount must fail (or find none), and the message says which.
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.err, Catch::Contains("needs a CUDA GPU") && Catch::Contains("hint:"));
    CHECK_THAT(r.err, Catch::Contains("cudaGetDeviceCount") || Catch::Contains("no CUDA device found"));
    CHECK(r.out.empty());
  } else if (r.exit_code != 0) {  // a device node but no usable GPU: still the clear error
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.err, Catch::Contains("needs a CUDA GPU"));
  }
#endif
  return r;
}

}  // namespace flashlab::test
