#include "client/trace_file.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "nlohmann/json.hpp"

namespace latchkey {
namespace {

namespace fs = std::filesystem;

class TraceFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("trace_file_test_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
            "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
  }
  fs::path dir_;
};

constexpr char kRank0[] =
    R"({"trace":1,"rank":0,"world_size":2,"tp":2,"attempt":1,"backend":"shm","worker":"h:1","clock":"coordinator","clock_error_us":40,"spans":4,"dropped":0}
{"span":"window","stream":"train","begin_us":1000100,"end_us":1000900,"step":0}
{"span":"forward","stream":"train","begin_us":1000200,"end_us":1000300,"step":0,"micro_batch":0}
{"span":"collective","stream":"collectives","begin_us":1000400,"end_us":1000500,"step":0,"micro_batch":0,"op":"all_reduce","group":"tp","bytes":4096,"seq":1,"kv":true}
{"span":"window","stream":"train","begin_us":1001000,"end_us":1001900,"step":1}
)";
constexpr char kRank1[] =
    R"({"trace":1,"rank":1,"world_size":2,"tp":2,"attempt":1,"backend":"shm","worker":"h:2","clock":"coordinator","clock_error_us":70,"spans":1,"dropped":3}
{"span":"window","stream":"train","begin_us":1000000,"end_us":1000950,"step":0}
)";

TEST_F(TraceFileTest, MergesRanksIntoOneChromeTrace) {
  Write("trace-0.jsonl", kRank0);
  Write("trace-1.jsonl", kRank1);
  Write("steps-0.jsonl", "{}\n");  // not a trace file
  absl::StatusOr<std::vector<RankTrace>> ranks = ReadRankTraces(dir_.string());
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  ASSERT_EQ(ranks->size(), 2u);
  EXPECT_EQ((*ranks)[0].spans.size(), 4u);
  EXPECT_EQ((*ranks)[1].clock_error_us, 70);

  std::ostringstream out;
  absl::StatusOr<TraceSummary> sum = WriteChromeTrace(*ranks, StepRange{}, "j", out);
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(sum->ranks, 2);
  EXPECT_EQ(sum->events, 5);
  EXPECT_EQ(sum->first_step, 0);
  EXPECT_EQ(sum->last_step, 1);
  EXPECT_EQ(sum->clock_error_us, 70);
  EXPECT_EQ(sum->dropped, 3);

  const nlohmann::json doc = nlohmann::json::parse(out.str());
  EXPECT_EQ(doc["distributedInfo"]["world_size"], 2);
  EXPECT_EQ(doc["distributedInfo"]["backend"], "shm");
  EXPECT_EQ(doc["distributedInfo"]["ranks"], nlohmann::json::array({0, 1}));
  EXPECT_EQ(doc["baseTimeNanoseconds"], int64_t{1000000} * 1000);  // the earliest span's start
  int complete = 0;
  bool kv_seen = false;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] != "X") continue;
    ++complete;
    if (e["pid"] == 1) {
      EXPECT_EQ(e["name"], "ProfilerStep#0");
      EXPECT_EQ(e["ts"], 0);
      EXPECT_EQ(e["dur"], 950);
    }
    if (e["cat"] == "collective") {
      kv_seen = true;
      EXPECT_EQ(e["name"], "all_reduce tp K/V");
      EXPECT_EQ(e["tid"], 2);
      EXPECT_EQ(e["ts"], 400);
      EXPECT_EQ(e["args"]["bytes"], 4096);
      EXPECT_EQ(e["args"]["seq"], 1);
      EXPECT_EQ(e["args"]["kv"], 1);
      EXPECT_EQ(e["args"]["step"], 0);
    }
  }
  EXPECT_EQ(complete, 5);
  EXPECT_TRUE(kv_seen);
}

TEST_F(TraceFileTest, KeepsOnlyTheAskedSteps) {
  Write("trace-0.jsonl", kRank0);
  absl::StatusOr<std::vector<RankTrace>> ranks = ReadRankTraces(dir_.string());
  ASSERT_TRUE(ranks.ok());
  std::ostringstream out;
  absl::StatusOr<TraceSummary> sum = WriteChromeTrace(*ranks, *ParseStepRange("1..1"), "j", out);
  ASSERT_TRUE(sum.ok());
  EXPECT_EQ(sum->events, 1);
  EXPECT_EQ(sum->first_step, 1);
  const nlohmann::json doc = nlohmann::json::parse(out.str());
  EXPECT_EQ(doc["baseTimeNanoseconds"], int64_t{1001000} * 1000);

  std::ostringstream none;
  absl::StatusOr<TraceSummary> empty = WriteChromeTrace(*ranks, *ParseStepRange("7.."), "j", none);
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(TraceFileTest, RefusesWhatIsNotATrace) {
  EXPECT_EQ(ReadRankTraces(dir_.string()).status().code(), absl::StatusCode::kNotFound);
  Write("trace-0.jsonl", std::string(kRank0) + "not json\n");
  absl::StatusOr<std::vector<RankTrace>> bad = ReadRankTraces(dir_.string());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("trace-0.jsonl:6"), std::string::npos) << bad.status();
  Write("trace-0.jsonl", R"({"span":"window","begin_us":1,"end_us":2,"step":0})"
                         "\n");
  EXPECT_EQ(ReadRankTraces(dir_.string()).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(StepRangeTest, ParsesAndRefuses) {
  EXPECT_EQ(ParseStepRange("3..9")->first, 3);
  EXPECT_EQ(ParseStepRange("3..9")->last, 9);
  EXPECT_EQ(ParseStepRange("4")->last, 4);
  EXPECT_EQ(ParseStepRange("4..")->last, std::numeric_limits<int64_t>::max());
  for (const char* bad : {"", "..", "a..b", "9..3", "-1..2", "1..x"}) {
    EXPECT_EQ(ParseStepRange(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace latchkey
