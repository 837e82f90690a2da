// The CLI's renderings: the one JSON mapping (int64 as numbers, zero values and empty lists
// present, timestamps as strings) and the progress line's recovery cause.
#include "client/cli/format.h"

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "proto/wire.h"

namespace latchkey::cli {
namespace {

TEST(FormatJson, Int64sAreNumbersAndZeroValuesPresent) {
  JobInfo job;
  job.job_id = "job-000007";
  job.steps = 12;
  job.steps_completed = 0;
  job.attempt = 3;
  job.last_checkpoint_step = -1;
  job.create_time = absl::FromUnixSeconds(1700000000);
  AttemptSummary a;
  a.attempt = 2;
  a.resume_step = 9;
  job.attempts.push_back(a);
  const nlohmann::json j = ToJsonValue(ToProto(job));
  EXPECT_EQ(j["steps"], 12) << j.dump();
  EXPECT_TRUE(j["steps"].is_number());
  EXPECT_EQ(j["steps_completed"], 0);  // a zero value, present
  EXPECT_EQ(j["attempt"], 3);
  EXPECT_EQ(j["last_checkpoint_step"], -1);
  EXPECT_EQ(j["windows_published"], 0);
  EXPECT_EQ(j["workers"], nlohmann::json::array());  // an empty list, present
  EXPECT_EQ(j["failure_reason"], "");
  EXPECT_TRUE(j["policy"]["generation"].is_number()) << j.dump();
  ASSERT_EQ(j["attempts"].size(), 1u);
  EXPECT_EQ(j["attempts"][0]["resume_step"], 9);
  EXPECT_EQ(j["create_time"], "2023-11-14T22:13:20Z");  // a timestamp keeps its string form
  // The list answer nests jobs in a list: converted there too.
  const nlohmann::json list = ToJsonValue(ToProto(std::vector<JobInfo>{job}));
  EXPECT_EQ(list["jobs"][0]["steps"], 12) << list.dump();
  EXPECT_EQ(ToJsonValue(ToProto(std::vector<JobInfo>{}))["jobs"], nlohmann::json::array());
}

// The job's uid (its checkpoints carry it): in status's JSON always, in its text when known.
TEST(FormatJson, StatusShowsTheJobUid) {
  JobInfo job;
  job.job_id = "job-000001";
  job.job_uid = "3f9c01d2a7b4e865";
  const nlohmann::json j = nlohmann::json::parse(StatusJson(job));
  EXPECT_EQ(j["job_uid"], "3f9c01d2a7b4e865") << j.dump();
  EXPECT_NE(JobDetails(job).find("job:          job-000001\njob_uid:      3f9c01d2a7b4e865\n"),
            std::string::npos)
      << JobDetails(job);
  EXPECT_EQ(FromProto(ToProto(job)).job_uid, "3f9c01d2a7b4e865");
  job.job_uid.clear();  // a coordinator before job uids
  EXPECT_EQ(nlohmann::json::parse(StatusJson(job))["job_uid"], "");
  EXPECT_EQ(JobDetails(job).find("job_uid"), std::string::npos);
}

// The ranks named slow and the split (docs/fault-tolerance.md "Stragglers"): in status's JSON
// always (empty lists when none), a line each in its text, and across the wire unchanged.
TEST(FormatJson, StatusShowsTheStragglersAndTheSplit) {
  JobInfo job;
  job.job_id = "job-000001";
  nlohmann::json j = nlohmann::json::parse(StatusJson(job));
  EXPECT_EQ(j["stragglers"], nlohmann::json::array()) << j.dump();
  EXPECT_EQ(j["replica_micro_batches"], nlohmann::json::array()) << j.dump();
  job.stragglers.push_back({1, "node-3", 1.93, 12});
  job.replica_micro_batches = {8, 4};
  j = nlohmann::json::parse(StatusJson(job));
  ASSERT_EQ(j["stragglers"].size(), 1u) << j.dump();
  EXPECT_EQ(j["stragglers"][0]["rank"], 1);
  EXPECT_EQ(j["stragglers"][0]["host"], "node-3");
  EXPECT_DOUBLE_EQ(j["stragglers"][0]["slowdown"].get<double>(), 1.93);
  EXPECT_EQ(j["stragglers"][0]["since_step"], 12);
  EXPECT_EQ(j["replica_micro_batches"], nlohmann::json::array({8, 4}));
  const std::string text = JobDetails(job);
  EXPECT_NE(text.find("straggler:    rank 1 (host node-3) 1.93x slower than the median since "
                      "step 12\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("split:        8,4 micro-batches per DP replica"), std::string::npos) << text;
  const JobInfo back = FromProto(ToProto(job));
  ASSERT_EQ(back.stragglers.size(), 1u);
  EXPECT_EQ(back.stragglers[0].host, "node-3");
  EXPECT_EQ(back.stragglers[0].since_step, 12);
  EXPECT_EQ(back.replica_micro_batches, (std::vector<int>{8, 4}));
}

TEST(FormatProgress, RecoveringShowsTheCause) {
  JobInfo job;
  job.steps = 20;
  job.steps_completed = 7;
  job.attempt = 2;
  job.state = JobState::kRecovering;
  job.last_recovery_reason = "rank 1: process exited: killed by signal 9";
  EXPECT_NE(ProgressLine(job, nullptr)
                .find("attempt 2 recovering (rank 1: process exited: killed by signal 9)"),
            std::string::npos)
      << ProgressLine(job, nullptr);
  job.state = JobState::kRunning;
  EXPECT_EQ(ProgressLine(job, nullptr).find("killed"), std::string::npos);
}

// A diverged step's loss and grad norm read NaN / Inf in the live bar and in `status`, never
// printf's "-nan" (a NaN made by arithmetic usually has its sign bit set).
TEST(FormatProgress, ADivergedStepReadsNaNAndInf) {
  JobInfo job;
  job.steps = 8;
  job.steps_completed = 2;
  job.state = JobState::kFailed;
  CompletedStep step;
  step.report.step = 1;
  step.report.loss = -std::nan("");
  step.report.grad_norm = INFINITY;
  step.report.lr = 1e9;
  const std::string line = ProgressLine(job, &step);
  EXPECT_NE(line.find(" loss NaN lr 1.000e+09"), std::string::npos) << line;
  job.last_step = step;
  const std::string details = JobDetails(job);
  EXPECT_NE(details.find("last step:    1 loss NaN lr 1.000e+09 grad_norm Inf kv_mode"),
            std::string::npos)
      << details;
}

}  // namespace
}  // namespace latchkey::cli
