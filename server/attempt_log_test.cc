// AttemptLog: the attempts of one job, their layouts and the fence, without a coordinator.
#include "server/attempt_log.h"

#include "absl/time/time.h"
#include "common/error_info.h"
#include "gtest/gtest.h"

namespace latchkey {
namespace {

AttemptLayout Layout() {
  JobSpec spec;
  spec.world_size = 4;
  spec.tp = 2;
  spec.gradient_accumulation_steps = 3;
  return SpecLayout(spec);
}

TEST(AttemptLog, SpecLayoutIsTheJobsGrid) {
  const AttemptLayout l = Layout();
  EXPECT_EQ(l.world_size, 4);
  EXPECT_EQ(l.tp, 2);
  EXPECT_EQ(l.dp, 2);
  EXPECT_EQ(l.gradient_accumulation_steps, 3);
  JobSpec placeholder;  // an unparsable job's: one rank
  placeholder.world_size = 0;
  placeholder.tp = 0;
  EXPECT_EQ(SpecLayout(placeholder).world_size, 1);
  EXPECT_EQ(SpecLayout(placeholder).dp, 1);
}

TEST(AttemptLog, NextAttemptResumesFromTheCheckpointInTheSameLayout) {
  JobRecord rec;
  AttemptLog log(rec, Layout(), /*min_dp=*/0);
  EXPECT_EQ(log.attempt(), 1);
  const AttemptLog::Attempt next = *log.Next({"rank 1 failed", 7, "c0ffee"});
  EXPECT_EQ(log.attempt(), 1);  // Next changes nothing
  EXPECT_EQ(next.number, 2);
  EXPECT_EQ(next.restarts, 1);
  EXPECT_EQ(next.resume_step, 7);
  EXPECT_EQ(next.layout, log.layout());
  AttemptLog::Record(next, &rec);
  EXPECT_EQ(rec.attempt, 2);
  EXPECT_EQ(rec.restarts, 1);
  EXPECT_EQ(rec.resume_step, 7);
  EXPECT_EQ(rec.resume_manifest_sha256, "c0ffee");
  EXPECT_EQ(rec.last_recovery_reason, "rank 1 failed");

  log.CountViolation(8);
  const absl::Time now = absl::FromUnixSeconds(100);
  log.Begin(next, now);
  EXPECT_EQ(log.attempt(), 2);
  EXPECT_EQ(log.recovery_start(), now);
  EXPECT_FALSE(log.ViolationCounted(8));
  EXPECT_EQ(log.layout(1), log.layout(2));
  // A restored log starts where the record says.
  const AttemptLog restored(rec, Layout(), 0);
  EXPECT_EQ(restored.attempt(), 2);
  EXPECT_EQ(restored.current().cause, "rank 1 failed");
}

TEST(AttemptLog, FenceRefusesOtherAttemptsAsData) {
  JobRecord rec;
  rec.attempt = 3;
  AttemptLog log(rec, Layout(), 0);
  log.Fence("old", 1);
  log.Fence("old", 2);  // the newest attempt a worker is known by
  EXPECT_EQ(log.AttemptOf("old", 0, false), 2);
  EXPECT_EQ(log.AttemptOf("holder", 0, true), 3);
  EXPECT_EQ(log.AttemptOf("stranger", 0, false), 0);
  EXPECT_TRUE(log.CheckFence("j", "holder", 0, true).ok());
  EXPECT_TRUE(log.CheckFence("j", "stranger", 0, false).ok());
  EXPECT_TRUE(log.CheckFence("j", "w", 3, false).ok());

  const absl::Status fenced = log.CheckFence("j", "old", 0, false);
  EXPECT_EQ(fenced.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(fenced.message(), "worker old is at attempt 2; job j is at attempt 3 (fenced)");
  EXPECT_TRUE(HasErrorReason(fenced, error_reason::kAttemptFenced));
  const std::optional<ErrorInfo> info = GetErrorInfo(fenced);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->IntMetadata("job_attempt"), 3);
  EXPECT_EQ(info->IntMetadata("worker_attempt"), 2);
  log.Unfence("old");
  EXPECT_EQ(log.AttemptOf("old", 0, false), 0);
}

}  // namespace
}  // namespace latchkey
