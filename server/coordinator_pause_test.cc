// A coordinator that did not run for a while (SIGSTOP, a frozen VM, a long stall) judges no rank
// on that gap: GraceAfterPause gives every rank of every live job a fresh liveness deadline, a
// recovery a fresh rejoin window, and holds hang verdicts for a hang timeout; a rank that stays
// silent after the pause is still caught. Real SQLite, a ManualClock.
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "gtest/gtest.h"
#include "server/coordinator.h"
#include "server/sqlite_store.h"
#include "tests/support/specs.h"

namespace latchkey {
namespace {

using testing::SpecJson;
using testing::SpecParams;

struct Running {
  std::unique_ptr<Coordinator> c;
  std::string id;
  std::vector<WorkerCall> calls;
};

// A 2-rank job, both ranks joined and in window 3, liveness 10 s, hang timeout 20 s (the
// defaults of `latchkey up`).
Running Start(ManualClock& clock) {
  CoordinatorOptions opt;
  opt.clock = &clock;
  opt.heartbeat_interval = absl::Seconds(1);
  opt.liveness_timeout = absl::Seconds(10);
  auto store = SqliteStore::Open(":memory:");
  EXPECT_TRUE(store.ok()) << store.status();
  auto c = Coordinator::Create(*std::move(store), opt, nullptr);
  EXPECT_TRUE(c.ok()) << c.status();
  Running r{*std::move(c), "", {}};
  SpecParams p;
  p.world_size = 2;
  p.steps = 20;
  p.extra_latchkey["hang_timeout_seconds"] = 20;
  auto job = r.c->SubmitJob({SpecJson(p), "", "", 0});
  EXPECT_TRUE(job.ok()) << job.status();
  r.id = job->job.record.job_id;
  for (int i = 0; i < 2; ++i) {
    JoinArgs a;
    a.call = {r.id, job->join_token, "w" + std::to_string(i), -1, 0};
    a.requested_rank = i;
    a.peer_host = "127.0.0.1";
    auto joined = r.c->Join(a);
    EXPECT_TRUE(joined.ok()) << joined.status();
    r.calls.push_back({r.id, job->join_token, a.call.worker_id, joined->rank, joined->attempt});
  }
  return r;
}

RankPosition InWindow(int64_t window, double seconds) {
  RankPosition p;
  p.attempt = 1;
  p.window = window;
  p.micro_batch = 0;
  p.phase = RankPhase::kLatch;
  p.seconds = seconds;
  return p;
}

JobState State(const Running& r) { return r.c->GetJob(r.id, false)->record.state; }

TEST(CoordinatorPauseTest, WithoutTheGraceAPauseLooksLikeLostRanks) {
  ManualClock clock;
  Running r = Start(clock);
  for (const WorkerCall& w : r.calls) ASSERT_TRUE(r.c->Heartbeat(w, InWindow(3, 0.1)).ok());
  clock.Advance(absl::Seconds(45));  // the coordinator was stopped: nothing was counted
  r.c->CheckLiveness();
  EXPECT_EQ(State(r), JobState::kRecovering);
}

TEST(CoordinatorPauseTest, AfterAPauseNoRankIsJudgedOnTheGap) {
  ManualClock clock;
  Running r = Start(clock);
  for (const WorkerCall& w : r.calls) ASSERT_TRUE(r.c->Heartbeat(w, InWindow(3, 0.1)).ok());
  clock.Advance(absl::Seconds(45));
  r.c->GraceAfterPause(absl::Seconds(45));
  r.c->CheckLiveness();
  EXPECT_EQ(State(r), JobState::kRunning);
  // The ranks' first heartbeats after waking still hold the whole wait in their position (they
  // waited for a latch the stopped coordinator could not publish): no hang verdict on them.
  for (int s = 1; s <= 15; ++s) {
    clock.Advance(absl::Seconds(1));
    for (const WorkerCall& w : r.calls) {
      ASSERT_TRUE(r.c->Heartbeat(w, InWindow(3, 45.0 + s)).ok());
    }
    r.c->CheckLiveness();
    ASSERT_EQ(State(r), JobState::kRunning) << s << " s after waking";
  }
  const JobView v = *r.c->GetJob(r.id, false);
  EXPECT_EQ(v.record.attempt, 1);
  EXPECT_TRUE(v.record.stalled.empty());
}

TEST(CoordinatorPauseTest, ARankSilentAfterThePauseIsStillLost) {
  ManualClock clock;
  Running r = Start(clock);
  for (const WorkerCall& w : r.calls) ASSERT_TRUE(r.c->Heartbeat(w, InWindow(3, 0.1)).ok());
  clock.Advance(absl::Seconds(45));
  r.c->GraceAfterPause(absl::Seconds(45));
  // Rank 1 never speaks again: it is lost two liveness timeouts after the coordinator woke (the
  // grace lets it make its connection anew).
  for (int s = 1; s <= 20; ++s) {
    clock.Advance(absl::Seconds(1));
    ASSERT_TRUE(r.c->Heartbeat(r.calls[0], InWindow(4, 0.1)).ok());
    r.c->CheckLiveness();
    if (s < 20) {
      ASSERT_EQ(State(r), JobState::kRunning) << s << " s after waking";
    }
  }
  const JobView v = *r.c->GetJob(r.id, false);
  EXPECT_EQ(v.record.state, JobState::kRecovering);
  EXPECT_NE(v.record.last_recovery_reason.find("rank 1 (worker w1, unseen for 20s)"),
            std::string::npos)
      << v.record.last_recovery_reason;
}

}  // namespace
}  // namespace latchkey
