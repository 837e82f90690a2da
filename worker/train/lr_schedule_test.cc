#include "worker/train/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace latchkey {
namespace {

void ExpectRel(double got, double want, const std::string& what) {
  if (want == 0.0) {
    EXPECT_EQ(got, 0.0) << what;
  } else {
    EXPECT_LE(std::abs(got - want) / std::abs(want), 1e-9) << what << ": " << got << " vs " << want;
  }
}

void ExpectSteps(const LrSchedule& s, const std::vector<double>& want) {
  for (size_t i = 0; i < want.size(); ++i) {
    ExpectRel(s.ForStep(static_cast<int64_t>(i)), want[i], "step " + std::to_string(i));
  }
}

SchedulerConfig Config(SchedulerType type, int64_t warmup, WarmupType wt, int64_t total = 0) {
  SchedulerConfig c;
  c.type = type;
  c.warmup_num_steps = warmup;
  c.warmup_type = wt;
  c.total_num_steps = total;
  return c;
}

// The lr of every step of the three runs of testdata/gptbigcode-tiny/expected-schedules.json
// (made by an independent implementation), copied here literally.
TEST(LrScheduleFixture, WarmupCosineLrLinearWarmup) {
  // {"type": "WarmupCosineLR", "params": {"total_num_steps": 6, "warmup_num_steps": 2,
  //  "warmup_type": "linear"}}, optimizer lr 0.002.
  LrSchedule s(Config(SchedulerType::kWarmupCosineLR, 2, WarmupType::kLinear, 6), 0.002);
  ExpectSteps(s, {0.0, 0.0, 0.001, 0.001707136070508429, 0.0010001, 0.0002930639294915712});
}

TEST(LrScheduleFixture, WarmupLrLogWarmup) {
  // {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0001, "warmup_max_lr": 0.003,
  //  "warmup_num_steps": 3}}, optimizer lr 0.001.
  SchedulerConfig c = Config(SchedulerType::kWarmupLR, 3, WarmupType::kLog);
  c.warmup_min_lr = 0.0001;
  c.warmup_max_lr = 0.003;
  LrSchedule s(c, 0.001);
  ExpectSteps(s, {0.0001, 0.0001, 0.0019296962853572266, 0.003, 0.003});
}

TEST(LrScheduleFixture, WarmupDecayLrLinearWarmup) {
  // {"type": "WarmupDecayLR", "params": {"total_num_steps": 5, "warmup_num_steps": 2,
  //  "warmup_max_lr": 0.5, "warmup_type": "linear"}}, SGD lr 0.5.
  SchedulerConfig c = Config(SchedulerType::kWarmupDecayLR, 2, WarmupType::kLinear, 5);
  c.warmup_max_lr = 0.5;
  LrSchedule s(c, 0.5);
  ExpectSteps(s, {0.0, 0.0, 0.25, 0.5, 0.3333333333333333});
}

TEST(LrSchedule, NoSchedulerIsTheConstantLr) {
  LrSchedule s(SchedulerConfig{}, 0.003);
  for (int64_t step : {0, 1, 2, 1000000}) EXPECT_EQ(s.ForStep(step), 0.003);
}

TEST(LrSchedule, StepsZeroAndOneGetTheStartValue) {
  for (WarmupType wt : {WarmupType::kLog, WarmupType::kLinear}) {
    SchedulerConfig c = Config(SchedulerType::kWarmupLR, 10, wt);
    c.warmup_min_lr = 0.01;
    c.warmup_max_lr = 0.1;
    LrSchedule s(c, 0.1);
    EXPECT_EQ(s.AtIteration(-1), 0.01);
    EXPECT_EQ(s.ForStep(0), 0.01);
    EXPECT_EQ(s.ForStep(1), 0.01);  // log(1) = 0 and 0 / W = 0
    EXPECT_GT(s.ForStep(2), 0.01);
    c.type = SchedulerType::kWarmupDecayLR;
    c.total_num_steps = 20;
    LrSchedule d(c, 0.1);
    EXPECT_EQ(d.ForStep(0), 0.01);
    EXPECT_EQ(d.ForStep(1), 0.01);
    SchedulerConfig k = Config(SchedulerType::kWarmupCosineLR, 10, wt, 20);
    LrSchedule cos(k, 0.1);
    EXPECT_EQ(cos.ForStep(0), 0.0);
    EXPECT_EQ(cos.ForStep(1), 0.0);
  }
}

TEST(LrSchedule, LogAndLinearWarmupFormulas) {
  SchedulerConfig c = Config(SchedulerType::kWarmupLR, 8, WarmupType::kLog);
  c.warmup_min_lr = 0.001;
  c.warmup_max_lr = 0.009;
  LrSchedule log_warmup(c, 0.5);
  c.warmup_type = WarmupType::kLinear;
  LrSchedule linear(c, 0.5);
  for (int64_t i = 0; i < 8; ++i) {
    ExpectRel(log_warmup.AtIteration(i), 0.001 + 0.008 * std::log(i + 1.0) / std::log(8.0),
              "log " + std::to_string(i));
    ExpectRel(linear.AtIteration(i), 0.001 + 0.008 * i / 8.0, "linear " + std::to_string(i));
  }
  for (int64_t i : {8, 9, 100}) {  // min + (max - min) * 1, as DeepSpeed computes it
    ExpectRel(log_warmup.AtIteration(i), 0.009, "after the warmup");
    ExpectRel(linear.AtIteration(i), 0.009, "after the warmup");
  }
}

TEST(LrSchedule, WarmupNumStepsIsRaisedToTwo) {
  for (WarmupType wt : {WarmupType::kLog, WarmupType::kLinear}) {
    SchedulerConfig c = Config(SchedulerType::kWarmupLR, 1, wt);
    c.warmup_max_lr = 1.0;
    LrSchedule s(c, 1.0);
    EXPECT_EQ(s.AtIteration(0), 0.0);
    ExpectRel(s.AtIteration(1), wt == WarmupType::kLog ? 1.0 : 0.5, "i=1");
    EXPECT_EQ(s.AtIteration(2), 1.0);
  }
}

TEST(LrSchedule, WarmupDecayLrDecaysLinearlyToZeroAndStays) {
  SchedulerConfig c = Config(SchedulerType::kWarmupDecayLR, 4, WarmupType::kLinear, 10);
  c.warmup_min_lr = 0.0;
  c.warmup_max_lr = 0.6;
  LrSchedule s(c, 0.6);
  for (int64_t i = 4; i <= 10; ++i) {
    ExpectRel(s.AtIteration(i), 0.6 * (10 - i) / 6.0, "i=" + std::to_string(i));
  }
  EXPECT_EQ(s.AtIteration(11), 0.0);
  EXPECT_EQ(s.AtIteration(1000), 0.0);
  // With a floor: after the end the lr is warmup_min_lr.
  c.warmup_min_lr = 0.1;
  LrSchedule floor(c, 0.6);
  EXPECT_EQ(floor.AtIteration(50), 0.1);
}

TEST(LrSchedule, WarmupDecayLrWithTotalBelowWarmup) {
  // Accepted (with a warning at parsing): after the warmup the decay factor is max(0, negative).
  SchedulerConfig c = Config(SchedulerType::kWarmupDecayLR, 5, WarmupType::kLinear, 3);
  c.warmup_max_lr = 1.0;
  LrSchedule s(c, 1.0);
  ExpectRel(s.AtIteration(4), 0.8, "warmup still runs");
  EXPECT_EQ(s.AtIteration(5), 0.0);
  EXPECT_EQ(s.AtIteration(6), 0.0);
}

TEST(LrSchedule, WarmupCosineLrRatios) {
  SchedulerConfig c = Config(SchedulerType::kWarmupCosineLR, 4, WarmupType::kLog, 12);
  c.warmup_min_ratio = 0.2;
  c.cos_min_ratio = 0.01;
  LrSchedule s(c, 0.5);
  for (int64_t i = 0; i < 4; ++i) {
    ExpectRel(s.AtIteration(i), 0.5 * (0.2 + 0.8 * std::log(i + 1.0) / std::log(4.0)),
              "warmup " + std::to_string(i));
  }
  for (int64_t i = 4; i <= 11; ++i) {
    const double p = (i - 4 + 1) / 8.0;
    ExpectRel(s.AtIteration(i), 0.5 * (0.01 + 0.99 * (1 + std::cos(M_PI * p)) / 2),
              "cosine " + std::to_string(i));
  }
  ExpectRel(s.AtIteration(11), 0.5 * 0.01, "end of the schedule");
  // Progress is clamped at 1: the lr stays at cos_min_ratio and never rises again.
  for (int64_t i : {12, 13, 20, 100}) ExpectRel(s.AtIteration(i), 0.005, "after the end");
}

TEST(LrSchedule, WarmupCosineLrDenominatorAtLeastOne) {
  // total <= warmup: (T - W) <= 0 is replaced by 1, so the first post-warmup step is the floor.
  for (int64_t total : {1, 3, 4}) {
    SchedulerConfig c = Config(SchedulerType::kWarmupCosineLR, 4, WarmupType::kLinear, total);
    c.cos_min_ratio = 0.1;
    LrSchedule s(c, 2.0);
    ExpectRel(s.AtIteration(3), 2.0 * 0.75, "warmup");
    ExpectRel(s.AtIteration(4), 0.2, "floor");
    ExpectRel(s.AtIteration(9), 0.2, "floor");
  }
}

TEST(LrSchedule, WarmupCosineLrZeroFloorReachesZero) {
  SchedulerConfig c = Config(SchedulerType::kWarmupCosineLR, 2, WarmupType::kLinear, 4);
  c.cos_min_ratio = 0.0;
  LrSchedule s(c, 1.0);
  ExpectRel(s.AtIteration(2), 0.5, "half way");
  EXPECT_NEAR(s.AtIteration(3), 0.0, 1e-15);
  EXPECT_GE(s.AtIteration(3), 0.0);
}

}  // namespace
}  // namespace latchkey
