// Replays fuzz inputs without libFuzzer: `fuzz_<name>_replay DIR|FILE...` feeds every file to the
// target's LLVMFuzzerTestOneInput once, so the corpora run as ordinary tests in any build (and
// under the sanitizers with the debug preset). A crash, a sanitizer report or an exception that
// escapes the target fails the run; so does a corpus with no inputs (a replay that replays
// nothing must not pass).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

std::vector<std::filesystem::path> inputs_of(const std::filesystem::path& arg) {
  std::vector<std::filesystem::path> files;
  if (std::filesystem::is_directory(arg)) {
    for (const auto& e : std::filesystem::directory_iterator(arg))
      if (e.is_regular_file()) files.push_back(e.path());
  } else if (std::filesystem::is_regular_file(arg)) {
    files.push_back(arg);
  }
  return files;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t replayed = 0;
  for (int i = 1; i < argc; ++i) {
    auto files = inputs_of(argv[i]);
    if (files.empty()) {
      std::fprintf(stderr, "error: %s: no inputs to replay (no such directory, or it is empty)\n", argv[i]);
      return 2;
    }
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      std::ifstream in(f, std::ios::binary);
      const std::vector<char> bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
      // A copy in its own allocation, so AddressSanitizer sees reads past the end.
      std::vector<std::uint8_t> data(bytes.begin(), bytes.end());
      LLVMFuzzerTestOneInput(data.data(), data.size());
      ++replayed;
    }
  }
  if (replayed == 0) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR|FILE...\n", argv[0]);
    return 2;
  }
  std::printf("replayed %zu inputs\n", replayed);
  return 0;
}
