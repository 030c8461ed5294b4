// Golden frames of the stepper ("Frames come from a pure render function with
// golden-text tests"). Inputs are given explicitly so the frames do not depend on the random
// generator. To regenerate after an intended change: FLASHLAB_UPDATE_GOLDEN=1 test_lessons "[golden]".
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "flashlab/lessons/checker.hpp"
#include "flashlab/lessons/lesson.hpp"
#include "flashlab/lessons/stepper.hpp"
#include "flashlab/toymachine/executor.hpp"
#include "flashlab/toymachine/render.hpp"

using namespace flashlab;
namespace fs = std::filesystem;

namespace {

fs::path golden_dir() { return fs::path(FLASHLAB_SOURCE_DIR) / "tests" / "lessons" / "golden"; }

void check_golden(const std::string& name, const std::string& frame) {
  const fs::path p = golden_dir() / name;
  if (std::getenv("FLASHLAB_UPDATE_GOLDEN")) {
    std::ofstream(p) << frame;
    WARN("updated golden file " << p);
    return;
  }
  std::ifstream in(p);
  INFO("golden file " << p << " (FLASHLAB_UPDATE_GOLDEN=1 regenerates it)");
  REQUIRE(in.good());
  std::stringstream ss;
  ss << in.rdbuf();
  CHECK(frame == ss.str());
}

struct Run {
  toy::Machine machine;
  toy::Program program;
  toy::Executor ex;
};

Run start(const lessons::Lesson& l, const toy::Inputs& inputs, int n) {
  toy::Machine m = lessons::task_machine(*l.trace, n);
  auto as = toy::assemble(l.trace->solution, m, "solution.trace");
  REQUIRE(as.ok());
  return Run{m, as.program, toy::Executor(as.program, m, inputs)};
}

std::string frame_at(Run& r, std::size_t step, lessons::FrameOptions opt) {
  while (r.ex.steps_taken() < step && !r.ex.done()) r.ex.step();
  while (r.ex.steps_taken() > step) r.ex.back();
  const auto pc = r.ex.steps_taken();
  const toy::State* prev = pc > 0 ? &r.ex.history()[pc - 1] : nullptr;
  lessons::FrameContext ctx{&r.ex.program(), &r.ex.machine(), r.ex.fault() ? &*r.ex.fault() : nullptr};
  return lessons::render_frame(ctx, r.ex.state(), prev, opt);
}

lessons::FrameOptions opts(const std::string& title, int w = 80, int h = 24) {
  lessons::FrameOptions o;
  o.width = w;
  o.height = h;
  o.title = title;
  return o;
}

const toy::Inputs kMatmulInputs{{"a", {1, 2, 3, 4}}, {"b", {5, 6, 7, 8}}};

}  // namespace

TEST_CASE("stepper: golden frames of Problem 1's worked trace", "[stepper][golden]") {
  Run r = start(*lessons::find_lesson("1"), kMatmulInputs, 8);
  check_golden("p1_step0.txt", frame_at(r, 0, opts("p1.trace on matmul3")));
  check_golden("p1_step5.txt", frame_at(r, 5, opts("p1.trace on matmul3")));
  check_golden("p1_step7.txt", frame_at(r, 7, opts("p1.trace on matmul3")));
  auto numeric = opts("p1.trace on matmul3");
  numeric.numeric = true;
  check_golden("p1_step6_numeric.txt", frame_at(r, 6, numeric));
  auto help = opts("p1.trace on matmul3");
  help.help = true;
  check_golden("p1_help.txt", frame_at(r, 2, help));
}

TEST_CASE("stepper: golden frames of online softmax and a fault", "[stepper][golden]") {
  Run r = start(*lessons::find_lesson("5"), {{"x", {0.5, -1, 2, 0.25}}}, 4);
  check_golden("p5_step14.txt", frame_at(r, 14, opts("p5.trace on softmax4")));
  check_golden("p5_small_40x12.txt", frame_at(r, 14, opts("p5.trace on softmax4", 40, 12)));

  toy::Machine m = toy::builtin_machine("matmul3", 8);
  auto as = toy::assemble("LOAD a[0][0], R0\nMAC R0, R1, R2, R2\n", m, "bad.trace");
  REQUIRE(as.ok());
  Run f{m, as.program, toy::Executor(as.program, m, kMatmulInputs)};
  f.ex.run();
  REQUIRE(f.ex.fault());
  check_golden("fault.txt", frame_at(f, 1, opts("bad.trace on matmul3")));
}

TEST_CASE("stepper: frames always fit the terminal, at every step of every lesson trace", "[stepper]") {
  for (const auto& l : lessons::catalogue()) {
    if (!l.trace || l.trace->model != lessons::TraceModel::Toy) continue;
    const int n = l.trace->ns.empty() ? 8 : l.trace->ns.front();
    toy::Machine m = lessons::task_machine(*l.trace, n);
    Run r = start(l, toy::random_inputs(m, 3), n);
    r.ex.run();
    for (auto [w, h] : {std::pair{80, 24}, std::pair{40, 12}, std::pair{132, 40}}) {
      for (std::size_t step = 0; step <= r.ex.program().code.size(); step += 3) {
        for (bool numeric : {false, true}) {
          auto o = opts("t", w, h);
          o.numeric = numeric;
          const std::string f = frame_at(r, step, o);
          INFO("lesson " << l.id << " step " << step << " " << w << "x" << h << "\n" << f);
          std::istringstream is(f);
          std::string line;
          int lines = 0;
          while (std::getline(is, line)) {
            ++lines;
            CHECK(toy::display_width(line) <= static_cast<std::size_t>(w));
          }
          CHECK(lines == h);
        }
      }
    }
  }
}

TEST_CASE("stepper: the frame marks changed registers and the last DRAM access", "[stepper]") {
  Run r = start(*lessons::find_lesson("1"), kMatmulInputs, 8);
  const std::string f = frame_at(r, 3, opts("t"));
  CHECK_THAT(f, Catch::Contains("*R2  a00·b00") && Catch::Contains("> 4  LOAD a[0][1], R0"));
  const std::string g = frame_at(r, 4, opts("t"));
  CHECK_THAT(g, Catch::Contains("[a01(1)]R") && Catch::Contains("*R0  a01"));
  CHECK_THAT(g, !Catch::Contains("*R2"));
  const std::string h = frame_at(r, 7, opts("t"));
  CHECK_THAT(h, Catch::Contains("[c00]W") && Catch::Contains("end of trace"));
}
