// The traffic chapter: the shipped measurement parses and agrees with the model where the
// lesson says it does, the toy tile level is the tile lessons' counts × bytes per tile, and
// the chapter's answers are the reference model's bytes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

#include "flashlab/lessons/checker.hpp"
#include "flashlab/lessons/lesson.hpp"
#include "flashlab/lessons/traffic_chapter.hpp"

using namespace flashlab::lessons;
namespace fr = flashlab::ref;

TEST_CASE("traffic chapter: the recorded measurement is at the chapter's shape and has every design",
          "[traffic]") {
  const Measurement& m = recorded_measurement();
  const Lesson* l = find_lesson("traffic-levels");
  REQUIRE(l);
  const auto shape = parse_attention_shape(l->shape);
  CHECK(!m.date.empty());
  CHECK_THAT(m.device, Catch::Contains("H100"));
  CHECK_THAT(m.command, Catch::Contains("flashlab"));
  CHECK(m.shape.heads == shape.heads);
  CHECK(m.shape.head_dim == shape.head_dim);
  CHECK(m.shape.Br == shape.Br);
  CHECK(m.shape.Bc == shape.Bc);
  for (fr::Algorithm v : chapter_variants()) {
    INFO(fr::algorithm_name(v));
    const auto* row = m.find(std::string(fr::algorithm_name(v)), shape.seq);
    REQUIRE(row);
    CHECK(row->l2_total() > 0);
    CHECK(row->dram_total() > 0);
    // The lesson's point: DRAM falls below the L2 requests.
    CHECK(row->dram_total() < row->l2_total());
  }
  // FA2 forward: the L2 requests are the model's bytes within 5%.
  fr::AttentionProblem c = shape;
  const auto t = fr::attention_traffic_formula(fr::Algorithm::fa2_fwd, c);
  const double counted = double(t.total_read_bytes() + t.total_write_bytes());
  const double l2 = m.find("fa2_fwd", shape.seq)->l2_total();
  CHECK(std::fabs(l2 / counted - 1.0) < 0.05);
}

TEST_CASE("traffic chapter: the CSV round-trips and malformed CSV names its line", "[traffic][errors]") {
  const Measurement& m = recorded_measurement();
  const Measurement again = parse_measurement_csv(measurement_csv(m));
  REQUIRE(again.rows.size() == m.rows.size());
  CHECK(again.command == m.command);
  CHECK(again.rows.front().l2_read == Approx(m.rows.front().l2_read));
  CHECK_THROWS_WITH(parse_measurement_csv("x,y\n"), Catch::Contains("measured.csv:1") && Catch::Contains("header"));
  const std::string bad = std::string(kMeasuredCsvHeader) + "\n2026-01-01,dev,cmd,fa2_fwd,1,4096,16,64,64,32,fp32,1,2,3\n";
  CHECK_THROWS_WITH(parse_measurement_csv(bad), Catch::Contains("measured.csv:2") && Catch::Contains("14 fields"));
  const std::string neg = std::string(kMeasuredCsvHeader) + "\n2026-01-01,dev,cmd,fa2_fwd,1,4096,16,64,64,32,fp32,1,2,3,-4,5\n";
  CHECK_THROWS_WITH(parse_measurement_csv(neg), Catch::Contains("not a byte count"));
  CHECK_THROWS_WITH(parse_attention_shape("B=1 N=0"), Catch::Contains("N"));
  CHECK_THROWS_WITH(parse_attention_shape("B=1 Q=3"), Catch::Contains("unknown size 'Q'"));
}

TEST_CASE("traffic chapter: the toy level is the tile lessons' counts times bytes per tile", "[traffic]") {
  fr::AttentionProblem c = parse_attention_shape("B=1 N=4096 H=16 d=64 Br=64 Bc=32 fp32");
  const std::uint64_t Tr = 64, Tc = 128, q_tile = 64 * 64 * 4, kv_tile = 32 * 64 * 4, H = 16;
  // FA2 order: Q n, K n², V n², O load n, O store n.
  CHECK(*toy_tile_bytes(fr::Algorithm::fa2_fwd, c) == H * (Tr * q_tile + 2 * Tr * Tc * kv_tile + 2 * Tr * q_tile));
  // FA1 order: Q n², K n, V n, O load n², O store n².
  CHECK(*toy_tile_bytes(fr::Algorithm::fa1_fwd, c) == H * (3 * Tr * Tc * q_tile + 2 * Tc * kv_tile));
  CHECK(!toy_tile_bytes(fr::Algorithm::naive_fwd, c));
  const std::string table = traffic_levels_table(c, &recorded_measurement(), false);
  CHECK_THAT(table, Catch::Contains("fa2_fwd") && Catch::Contains("bwd_two_kernel") && Catch::Contains("L2/counted"));
  CHECK_THAT(table, !Catch::Contains("served from L2"));
  CHECK_THAT(traffic_levels_table(c, &recorded_measurement(), true), Catch::Contains("served from L2"));
}

TEST_CASE("traffic chapter: the predictions are the reference model's bytes", "[traffic][answers]") {
  const Lesson* fwd = find_lesson("traffic-fwd");
  REQUIRE(fwd);
  const auto c = parse_attention_shape(fwd->shape);
  const auto fa2 = fr::attention_traffic_formula(fr::Algorithm::fa2_fwd, c);
  // Worked by hand: Q, O once; K, V Tr = 64 times; LSE once; 16 heads, 4 bytes.
  const std::uint64_t N = 4096, d = 64, by_hand = 16 * 4 * (N * d + 64 * 2 * N * d + N * d + N);
  CHECK(fa2.total_read_bytes() + fa2.total_write_bytes() == by_hand);
  const auto r = check_answer(*fwd, "naive=1; fa1=2; fa2=16*4*(4096*64 + 64*2*4096*64 + 4096*64 + 4096)");
  REQUIRE(r.lines.size() == 3);
  CHECK(!r.lines[0].correct);
  CHECK(r.lines[2].correct);
}

TEST_CASE("lesson data: malformed lesson.txt names the file and line", "[lessons][data][errors]") {
  std::map<std::string, std::string> files{{"lesson.txt", "title: t\nsection: s\nfrobnicate: 3\n"},
                                           {"statement.md", "x"}};
  CHECK_THROWS_WITH(parse_lesson("zz", files), Catch::Contains("lessons/data/zz/lesson.txt:3") &&
                                                   Catch::Contains("unknown field 'frobnicate'"));
  files["lesson.txt"] = "title: t\n[question q]\nkind: formula\nprompt: p\n";
  CHECK_THROWS_WITH(parse_lesson("zz", files), Catch::Contains("has no expected answer"));
  files["lesson.txt"] = "title: t\ntrace: toy\nmachine: softmax3\n";
  CHECK_THROWS_WITH(parse_lesson("zz", files), Catch::Contains("needs reference"));
  files["lesson.txt"] = "title: t\n[question q]\nkind: guess\n";
  CHECK_THROWS_WITH(parse_lesson("zz", files), Catch::Contains("kind 'guess'"));
  // Variable domains: whole numbers from 1 (NAME=LO..HI), real numbers (NAME:LO..HI).
  files["lesson.txt"] = "title: t\n[question q]\nkind: formula\nexpected: n\nvars: n d=1..4096 ma:-6..6\n";
  const auto ranges = parse_lesson("zz", files).questions.at(0).ranges;
  REQUIRE(ranges.size() == 3);
  CHECK((ranges[0].lo == 1 && ranges[0].hi == 1e6 && !ranges[0].real));
  CHECK((ranges[1].lo == 1 && ranges[1].hi == 4096 && !ranges[1].real));
  CHECK((ranges[2].lo == -6 && ranges[2].hi == 6 && ranges[2].real));
  files["lesson.txt"] = "title: t\n[question q]\nkind: formula\nexpected: n\nvars: d=0..5\n";
  CHECK_THROWS_WITH(parse_lesson("zz", files), Catch::Contains("whole bounds from 1"));
  files["lesson.txt"] = "title: t\n[question q]\nkind: formula\nexpected: n\nvars: d=5\n";
  CHECK_THROWS_WITH(parse_lesson("zz", files), Catch::Contains("is not NAME=LO..HI"));
  // The model's answers: a shape first; options name tensors of the model and a K/V loading.
  files["lesson.txt"] = "title: t\n[question q]\nkind: number\nexpected.model: fa2_fwd\n";
  CHECK_THROWS_WITH(parse_lesson("zz", files), Catch::Contains("needs a shape"));
  const std::string shape = "title: t\nshape: B=1 N=64 H=4 H_kv=2 d=16 Br=16 Bc=16 bf16\n[question q]\nkind: number\n";
  files["lesson.txt"] = shape + "expected.model: fa2_fwd tensors=K,V loads=per_group\n";
  CHECK(parse_lesson("zz", files).questions.at(0).expected == std::to_string(4 * 2 * 2 * 64 * 16 * 2));
  files["lesson.txt"] = shape + "expected.model: fa2_fwd tensors=S\n";
  CHECK_THROWS_WITH(parse_lesson("zz", files), Catch::Contains("moves no tensor 'S'"));
  files["lesson.txt"] = shape + "expected.model: fa2_fwd loads=twice\n";
  CHECK_THROWS_WITH(parse_lesson("zz", files), Catch::Contains("'loads=twice' is not"));
  files["lesson.txt"] = "title: t\nshape: B=1 N=64 H=4 H_kv=3 d=16\n";
  CHECK_THROWS(parse_lesson("zz", files));  // H_kv must divide H
  files.erase("statement.md");
  files["lesson.txt"] = "title: t\n";
  CHECK_THROWS_WITH(parse_lesson("zz", files), Catch::Contains("statement.md is missing"));
}

TEST_CASE("traffic chapter: its lessons share one shape", "[traffic][lessons]") {
  const Lesson* levels = find_lesson("traffic-levels");
  REQUIRE(levels);
  for (const char* id : {"traffic-fwd", "traffic-bwd"}) {
    const Lesson* l = find_lesson(id);
    REQUIRE(l);
    INFO(id);
    CHECK(l->shape == levels->shape);
  }
}

TEST_CASE("traffic chapter: the MTA and STREAM rows are at the chapter's shapes and follow the counts",
          "[traffic]") {
  const FamilyMeasurement& m = recorded_family_measurement();
  CHECK(!m.date.empty());
  CHECK_THAT(m.device, Catch::Contains("H100"));
  CHECK_THAT(m.command, Catch::Contains("flashlab"));
  // Every pass of both families, each at the shape the CLI measures live.
  const auto mta = mta_counted_rows(MtaChapterShape{});
  const std::string stream_shape = StreamChapterShape{}.str();
  for (const std::string pass : {"fwd", "bwd", "infer", "estimate", "apply"}) {
    INFO(pass);
    const bool is_mta = pass == "fwd" || pass == "bwd" || pass == "infer";
    const FamilyBytes* row = nullptr;
    for (const auto& r : m.rows)
      if (r.pass == pass && r.family == (is_mta ? "mta" : "stream")) row = &r;
    REQUIRE(row);
    CHECK(row->shape == (is_mta ? MtaChapterShape{}.str() : stream_shape));
    // The L2 requests are the reference's count within 5%; DRAM never exceeds them.
    CHECK(std::fabs(row->l2_total() / row->counted_total() - 1.0) < 0.05);
    CHECK(row->dram_total() <= row->l2_total());
    if (is_mta) {
      // The recorded count is the closed form at that shape (the model the tests hold the loops to).
      const auto* model = &*std::find_if(mta.begin(), mta.end(), [&](const FamilyBytes& r) { return r.pass == pass; });
      CHECK(row->counted_read == Approx(model->counted_read).epsilon(1e-12));
      CHECK(row->counted_write == Approx(model->counted_write).epsilon(1e-12));
    }
  }
}

TEST_CASE("traffic chapter: the grouped K/V and decode rows are at their lessons' shapes and answer them",
          "[traffic]") {
  namespace ref = flashlab::ref;
  const FamilyMeasurement& m = recorded_family_measurement();
  const auto row = [&](const char* pass) -> const FamilyBytes& {
    const auto it = std::find_if(m.rows.begin(), m.rows.end(),
                                 [&](const FamilyBytes& r) { return r.family == "attention" && r.pass == pass; });
    REQUIRE(it != m.rows.end());
    return *it;
  };
  const FamilyBytes &fwd = row("fwd"), &decode = row("decode");
  // The recorded shapes are the lessons' (with the tiles the kernels ran), and the counts the model's there.
  const ref::AttentionProblem pf = parse_attention_shape(fwd.shape), pd = parse_attention_shape(decode.shape);
  for (const auto& [p, lesson] : {std::pair{pf, gqa_chapter_problem()}, std::pair{pd, decode_chapter_problem()}}) {
    CHECK((p.batch == lesson.batch && p.n_q() == lesson.n_q() && p.n_k() == lesson.n_k() && p.heads == lesson.heads &&
           p.h_kv() == lesson.h_kv() && p.head_dim == lesson.head_dim && p.dtype == lesson.dtype && !p.causal));
  }
  const auto counted = attention_counted_rows(pf, pd);
  CHECK(fwd.counted_total() == counted[0].counted_total());
  CHECK(decode.counted_total() == counted[1].counted_total());
  // The forward loads K/V per query head: its L2 requests are that count within 5%; its DRAM reads
  // are Q, K and V once, the traffic-gqa lesson's answer (c), far below even the per-group count.
  CHECK(std::fabs(fwd.l2_total() / fwd.counted_total() - 1.0) < 0.05);
  const double q_bytes = double(pf.n_q() * pf.heads * pf.head_dim * 2), kv_once = double(2 * pf.n_k() * pf.h_kv() * pf.head_dim * 2);
  CHECK(fwd.dram_read <= 1.05 * (q_bytes + kv_once));
  CHECK(fwd.dram_read >= q_bytes + kv_once);
  // The decode step reads each K/V row once from DRAM, in the time of those bytes at close to the
  // HBM's bandwidth (above 2 TB/s on an H100).
  CHECK(std::fabs(decode.dram_total() / decode.counted_total() - 1.0) < 0.05);
  CHECK(std::fabs(decode.l2_total() / decode.counted_total() - 1.0) < 0.05);
  CHECK(decode.dram_total() / (decode.duration_ms * 1e-3) > 2e12);
}

TEST_CASE("traffic chapter: the families' CSV round-trips and malformed CSV names its line", "[traffic][errors]") {
  const FamilyMeasurement& m = recorded_family_measurement();
  const FamilyMeasurement again = parse_family_csv(family_csv(m));
  REQUIRE(again.rows.size() == m.rows.size());
  CHECK(again.command == m.command);
  CHECK(again.rows.back().shape == m.rows.back().shape);
  CHECK(again.rows.front().dram_read == Approx(m.rows.front().dram_read));
  CHECK_THROWS_WITH(parse_family_csv("x,y\n"), Catch::Contains("measured_families.csv:1") && Catch::Contains("header"));
  const std::string head = std::string(kFamiliesCsvHeader) + "\n";
  CHECK_THROWS_WITH(parse_family_csv(head + "2026-01-01,dev,cmd,mta,fwd,s,1,2,3\n"),
                    Catch::Contains("measured_families.csv:2") && Catch::Contains("9 fields"));
  CHECK_THROWS_WITH(parse_family_csv(head + "2026-01-01,dev,cmd,flash,fwd,s,1,2,3,4,5,6,7,8\n"),
                    Catch::Contains("is not attention, mta or stream"));
  CHECK_THROWS_WITH(parse_family_csv(head + "2026-01-01,dev,cmd,mta,fwd,s,1,2,3,4,5,-6,7,8\n"),
                    Catch::Contains("not a byte count"));
  CHECK_THROWS_WITH(parse_family_csv(head + "2026-01-01,dev,cmd,mta,fwd,s,1,2,3,4,5,6,7,8\n"
                                            "2026-01-02,dev,cmd,mta,bwd,s,1,2,3,4,5,6,7,8\n"),
                    Catch::Contains("measured_families.csv:3") && Catch::Contains("share"));
  CHECK_THROWS_WITH(parse_family_csv(head), Catch::Contains("no rows"));
  // The table names both families, their passes and where the numbers come from; the why is the
  // traffic-levels quiz, shown only once it is answered.
  const std::string table = traffic_families_table(m, false);
  CHECK_THAT(table, Catch::Contains("mta fwd") && Catch::Contains("mta bwd") && Catch::Contains("mta infer") &&
                        Catch::Contains("stream estimate") && Catch::Contains("stream apply") &&
                        Catch::Contains("measured: " + m.date));
  CHECK_THAT(table, !Catch::Contains("served from L2"));
  CHECK_THAT(traffic_families_table(m, true), Catch::Contains("served from L2"));
}

TEST_CASE("traffic chapter: the ring's recorded measurement parses, round-trips and is found by shape", "[traffic][ring]") {
  const std::vector<RingMeasured>& rows = recorded_ring_measurements();
  REQUIRE(!rows.empty());
  for (const auto& r : rows) {
    CHECK(r.counted_bytes == r.model_bytes);  // what was recorded: NCCL got the model's bytes
    CHECK(r.ring_ms > 0);
  }
  const std::vector<RingMeasured> again = parse_ring_csv(ring_csv(rows));
  REQUIRE(again.size() == rows.size());
  CHECK(again.back().problem.str() == rows.back().problem.str());
  CHECK(again.back().exposed_ms == Approx(rows.back().exposed_ms));
  const RingMeasured* found = find_ring_measurement(rows, rows.front().problem, rows.front().pass);
  REQUIRE(found != nullptr);
  CHECK(found->problem.gpus == rows.front().problem.gpus);
  flashlab::ref::ContextParallelProblem other = rows.front().problem;
  other.attention.seq *= 3;
  CHECK(find_ring_measurement(rows, other, "fwd") == nullptr);
  const std::string head = std::string(kRingCsvHeader) + "\n";
  CHECK_THROWS_WITH(parse_ring_csv("a,b\n"), Catch::Contains("measured.csv:1") && Catch::Contains("header"));
  CHECK_THROWS_WITH(parse_ring_csv(head + "d,dev,2,zigzag,1,1024,1,4,4,64,bf16,up,1,2,2,0,1,0\n"),
                    Catch::Contains("measured.csv:2") && Catch::Contains("pass 'up'"));
  CHECK_THROWS_WITH(parse_ring_csv(head + "d,dev,2,spiral,1,1024,1,4,4,64,bf16,fwd,1,2,2,0,1,0\n"),
                    Catch::Contains("spiral"));
  CHECK_THROWS_WITH(parse_ring_csv(head + "d,dev,2,zigzag,1,1024,1,4,3,64,bf16,fwd,1,2,2,0,1,0\n"),
                    Catch::Contains("measured.csv:2"));
  CHECK_THROWS_WITH(parse_ring_csv(head + "d,dev,2,zigzag,1,1024,1,4,4,64,bf16,fwd,1,-2,2,0,1,0\n"),
                    Catch::Contains("not a byte count"));
}
