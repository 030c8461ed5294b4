// The optimisation ladder (docs/optimisation.md) and the GPU results page (cuda/RESULTS.md) are
// read whole, so together they stay under 80 KB: a step's story goes in its rung once, measured
// rows of builds no longer in the tree move to cuda/results/archive/, and the generated tables
// show the kernels in the tree.
#include <catch2/catch.hpp>

#include <cstdint>
#include <filesystem>

namespace fs = std::filesystem;

TEST_CASE("pages: the ladder and the results page together stay under 80 KB", "[docs][sizes]") {
  const fs::path root = FLASHLAB_SOURCE_DIR;
  constexpr std::uintmax_t kLimit = 80000;
  const std::uintmax_t bytes = fs::file_size(root / "docs/optimisation.md") + fs::file_size(root / "cuda/RESULTS.md");
  INFO("docs/optimisation.md + cuda/RESULTS.md = " << bytes << " bytes, the limit " << kLimit
       << " (hint: tighten a rung, or move rows of builds no longer in the tree to cuda/results/archive/ and "
          "regenerate the tables with the results-pages target)");
  CHECK(bytes < kLimit);
}
