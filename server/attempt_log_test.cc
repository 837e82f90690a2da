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

// Next()'s layout choice: a table of (spec layout, workers at hand) -> the next layout.
TEST(AttemptLog, ElasticNextChoosesTheLargestLayoutTheWorkersFill) {
  struct Case {
    const char* name;
    int world, tp, gas, min_dp, workers;
    int want_dp, want_gas;  // want_dp 0: FAILED_PRECONDITION
  };
  const Case cases[] = {
      {"DP2xTP2 loses a replica", 4, 2, 1, 1, 2, 1, 2},
      {"a third worker fills no TP group", 4, 2, 1, 1, 3, 1, 2},
      {"all four back", 4, 2, 1, 1, 4, 2, 1},
      {"more than the spec: never above", 4, 2, 1, 1, 6, 2, 1},
      {"dp 4 to 3 would need GAS 4/3: 2", 4, 1, 1, 1, 3, 2, 2},
      {"GAS 3 x dp 4 = 12: dp 3 divides", 4, 1, 3, 1, 3, 3, 4},
      {"fewer than min_dp", 8, 2, 1, 2, 3, 0, 0},
      {"not one TP group", 4, 2, 1, 1, 1, 0, 0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    JobSpec spec;
    spec.world_size = c.world;
    spec.tp = c.tp;
    spec.gradient_accumulation_steps = c.gas;
    JobRecord rec;
    const AttemptLog log(rec, SpecLayout(spec), c.min_dp);
    AttemptLog::Recovery r;
    r.cause = "rank lost";
    r.checkpoint_step = 5;
    r.workers = c.workers;
    r.spend_restart = false;
    const absl::StatusOr<AttemptLog::Attempt> next = log.Next(r);
    if (c.want_dp == 0) {
      ASSERT_FALSE(next.ok());
      EXPECT_EQ(next.status().code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_NE(next.status().message().find("latchkey.elastic"), absl::string_view::npos);
      continue;
    }
    ASSERT_TRUE(next.ok()) << next.status();
    EXPECT_EQ(next->layout.dp, c.want_dp);
    EXPECT_EQ(next->layout.tp, c.tp);
    EXPECT_EQ(next->layout.world_size, c.want_dp * c.tp);
    EXPECT_EQ(next->layout.gradient_accumulation_steps, c.want_gas);
    // The global batch in micro-batches is kept.
    EXPECT_EQ(next->layout.gradient_accumulation_steps * next->layout.dp, c.gas * (c.world / c.tp));
    EXPECT_EQ(next->restarts, 0);  // spend_restart false
    EXPECT_EQ(next->resume_step, 5);
    // A new layout begins a layout epoch of its own.
    EXPECT_EQ(next->layout_attempt, next->layout == log.layout() ? 1 : 2);
  }
}

TEST(AttemptLog, PlainRecoveryKeepsTheLayoutAndRestoredLogKeepsEveryLayout) {
  JobSpec spec;
  spec.world_size = 4;
  spec.tp = 2;
  spec.gradient_accumulation_steps = 2;
  JobRecord rec;
  AttemptLog log(rec, SpecLayout(spec), 1);
  AttemptLog::Recovery plain;
  plain.cause = "rank 3 failed";
  const AttemptLog::Attempt second = *log.Next(plain);
  EXPECT_EQ(second.layout, log.layout());  // workers -1: the same layout, even when elastic
  EXPECT_EQ(second.restarts, 1);
  log.Begin(second, absl::UnixEpoch());
  AttemptLog::Recovery shrink;
  shrink.cause = "ranks 2, 3 did not rejoin";
  shrink.checkpoint_step = 3;
  shrink.workers = 2;
  shrink.spend_restart = false;
  const AttemptLog::Attempt third = *log.Next(shrink);
  EXPECT_EQ(third.restarts, 1);
  EXPECT_EQ(third.layout_attempt, 3);
  AttemptLog::Record(third, &rec);
  const std::vector<AttemptRecord> stored = {AttemptLog::ToRecord("j", second, absl::UnixEpoch()),
                                             AttemptLog::ToRecord("j", third, absl::UnixEpoch())};
  log.Begin(third, absl::UnixEpoch());
  const AttemptLog restored(rec, SpecLayout(spec), 1, stored);
  ASSERT_EQ(restored.history().size(), 3u);
  EXPECT_EQ(restored.layout(1).dp, 2);
  EXPECT_EQ(restored.layout(2).dp, 2);
  EXPECT_EQ(restored.layout(3).dp, 1);
  EXPECT_EQ(restored.layout(3).gradient_accumulation_steps, 4);
  EXPECT_EQ(restored.current().layout_attempt, 3);
  EXPECT_EQ(restored.history()[2].cause, "ranks 2, 3 did not rejoin");
  EXPECT_EQ(restored.restarts(), 1);
}

}  // namespace
}  // namespace latchkey
