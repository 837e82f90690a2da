#include "worker/comm/timeline.h"

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "worker/comm/flight_recorder.h"

namespace latchkey::comm {
namespace {

Span At(int64_t step, int64_t begin) {
  Span s;
  s.kind = SpanKind::kWindow;
  s.step = step;
  s.begin_us = begin;
  s.end_us = begin + 10;
  return s;
}

TEST(TimelineTest, FullRingDropsTheOldest) {
  Timeline t(3);
  for (int i = 0; i < 5; ++i) t.Add(At(i, 100 * i));
  const Timeline::Contents c = t.Read();
  ASSERT_EQ(c.spans.size(), 3u);
  EXPECT_EQ(c.spans[0].step, 2);
  EXPECT_EQ(c.spans[2].step, 4);
  EXPECT_EQ(c.dropped, 2);
}

TEST(TimelineTest, CapacityZeroRecordsNothing) {
  Timeline t(0);
  EXPECT_FALSE(t.enabled());
  t.Add(At(0, 0));
  { ScopedSpan s(&t, SpanKind::kForward, 0); }
  EXPECT_TRUE(t.Read().spans.empty());
}

TEST(TimelineTest, ScopedSpansNestAndCancel) {
  Timeline t;
  {
    ScopedSpan outer(&t, SpanKind::kMicroBatch, 4, 1);
    { ScopedSpan inner(&t, SpanKind::kForward, 4, 1); }
    ScopedSpan dropped(&t, SpanKind::kCheckpointCommit, 3);
    dropped.Cancel();
  }
  const Timeline::Contents c = t.Read();
  ASSERT_EQ(c.spans.size(), 2u);
  EXPECT_EQ(c.spans[0].kind, SpanKind::kForward);  // ended first
  EXPECT_EQ(c.spans[1].kind, SpanKind::kMicroBatch);
  EXPECT_LE(c.spans[1].begin_us, c.spans[0].begin_us);
  EXPECT_GE(c.spans[1].end_us, c.spans[0].end_us);
  EXPECT_EQ(c.spans[1].micro_batch, 1);
}

TEST(TimelineTest, KeepsTheClockSampleWithTheSmallestError) {
  Timeline t;
  EXPECT_EQ(t.Read().error_micros, -1);  // this host's clock until a sample
  t.NoteClock(5000, 300);
  t.NoteClock(7000, 900);  // worse: ignored
  EXPECT_EQ(t.Read().offset_micros, 5000);
  t.NoteClock(6000, 100);
  EXPECT_EQ(t.Read().offset_micros, 6000);
  EXPECT_EQ(t.Read().error_micros, 100);
}

TEST(TimelineTest, CollectivesAreSpansOfTheFlightRecorder) {
  FlightRecorder r;
  r.BeginWindow(7, RankPhase::kCompute);
  r.SetMicroBatch(2);
  r.EnterCollective("all_reduce", "tp");
  r.ExitCollective(4096, /*kv=*/true);
  r.EnterCollective("all_gather", "dp");
  r.ExitCollective(64, /*kv=*/false);
  r.timeline()->NoteClock(1'000'000, 50);

  std::ostringstream out;
  r.timeline()->SetIdentity(nlohmann::ordered_json{{"trace", 1}, {"rank", 3}});
  r.timeline()->WriteJsonl(out);
  std::istringstream in(out.str());
  std::string line;
  std::vector<nlohmann::json> lines;
  while (std::getline(in, line)) lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0]["rank"], 3);
  EXPECT_EQ(lines[0]["clock"], "coordinator");
  EXPECT_EQ(lines[0]["clock_error_us"], 50);
  EXPECT_EQ(lines[0]["spans"], 2);
  EXPECT_EQ(lines[1]["span"], "collective");
  EXPECT_EQ(lines[1]["stream"], "collectives");
  EXPECT_EQ(lines[1]["op"], "all_reduce");
  EXPECT_EQ(lines[1]["group"], "tp");
  EXPECT_EQ(lines[1]["bytes"], 4096);
  EXPECT_EQ(lines[1]["seq"], 1);
  EXPECT_EQ(lines[1]["kv"], true);
  EXPECT_EQ(lines[1]["step"], 7);
  EXPECT_EQ(lines[1]["micro_batch"], 2);
  EXPECT_EQ(lines[2]["group"], "dp");
  EXPECT_EQ(lines[2]["seq"], 2);
  EXPECT_EQ(lines[2]["kv"], false);
  // Steady time + the sampled offset.
  const Timeline::Contents c = r.timeline()->Read();
  EXPECT_EQ(lines[1]["begin_us"].get<int64_t>(), c.spans[0].begin_us + 1'000'000);
}

TEST(TimelineTest, AnswersAStepRangeWithinABudgetKeepingTheNewest) {
  Timeline t;
  t.SetIdentity(nlohmann::ordered_json{{"trace", 1}, {"rank", 0}});
  for (int i = 0; i < 100; ++i) t.Add(At(i, 100 * i));
  auto parse = [](const std::string& text) {
    std::vector<nlohmann::json> lines;
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) lines.push_back(nlohmann::json::parse(line));
    return lines;
  };
  std::vector<nlohmann::json> some = parse(t.Jsonl(10, 19));
  ASSERT_EQ(some.size(), 11u);
  EXPECT_EQ(some[0]["spans"], 10);
  EXPECT_EQ(some[0]["dropped"], 0);
  EXPECT_EQ(some[1]["step"], 10);
  EXPECT_EQ(some[10]["step"], 19);
  // A budget for the header and a few spans: the newest of the range are kept, in order.
  const std::string all = t.Jsonl(0, -1);
  const size_t budget = 512 + 5 * (all.size() / 101) + 10;
  std::vector<nlohmann::json> newest = parse(t.Jsonl(0, -1, budget));
  const int kept = newest[0]["spans"].get<int>();
  EXPECT_GE(kept, 4);
  EXPECT_LE(kept, 6);
  EXPECT_EQ(newest[0]["dropped"], 100 - kept);
  EXPECT_EQ(newest.back()["step"], 99);
  EXPECT_EQ(newest[1]["step"], 100 - kept);
}

}  // namespace
}  // namespace latchkey::comm
