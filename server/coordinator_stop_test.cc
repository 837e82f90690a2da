// Stops that lose nothing (Coordinator::Leave, SuspendJob; docs/fault-tolerance.md
// "Preemption"): a rank's Leave stops the attempt at the first unpublished window; the ranks'
// latch streams and heartbeats say so; the checkpoint of the window before it makes the job
// `preempted` (a new attempt from it, no restart spent, no rejoin deadline) or, for a suspend,
// `suspended` until ResumeJob. Real SQLite, a ManualClock.
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

class StopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorOptions opt;
    opt.clock = &clock_;
    opt.liveness_timeout = absl::Seconds(10);
    opt.latch_lookahead = 2;
    auto store = SqliteStore::Open(":memory:");
    ASSERT_TRUE(store.ok()) << store.status();
    auto c = Coordinator::Create(*std::move(store), opt, nullptr);
    ASSERT_TRUE(c.ok()) << c.status();
    c_ = *std::move(c);
    SpecParams p;
    p.world_size = 2;
    p.steps = 16;
    p.extra_latchkey["max_restarts"] = 2;
    p.extra_latchkey["checkpoint"] = {{"dir", "/tmp/latchkey-stop-test-ckpt"},
                                      {"every_steps", 100}};
    auto job = c_->SubmitJob({SpecJson(p), "", "", 0});
    ASSERT_TRUE(job.ok()) << job.status();
    job_ = *job;
    id_ = job_.job.record.job_id;
  }

  absl::StatusOr<JoinResult> Join(const std::string& worker, int rank) {
    JoinArgs a;
    a.call = {id_, job_.join_token, worker, -1, 0};
    a.requested_rank = rank;
    a.peer_host = "127.0.0.1";
    return c_->Join(a);
  }
  std::vector<WorkerCall> JoinAll(const std::string& prefix) {
    std::vector<WorkerCall> out;
    for (int r = 0; r < 2; ++r) {
      auto j = Join(prefix + std::to_string(r), r);
      EXPECT_TRUE(j.ok()) << j.status();
      if (j.ok())
        out.push_back({id_, job_.join_token, prefix + std::to_string(r), j->rank, j->attempt});
    }
    return out;
  }
  void Steps(const std::vector<WorkerCall>& calls, int64_t from, int64_t to) {
    for (int64_t s = from; s <= to; ++s) {
      for (const WorkerCall& call : calls) {
        StepReportRecord rec;
        rec.report.step = s;
        rec.report.loss = 3.0 - 0.125 * static_cast<double>(s);
        rec.report.tokens = 128;
        auto r = c_->ReportStep(call, rec);
        ASSERT_TRUE(r.ok()) << "step " << s << ": " << r.status();
      }
    }
  }
  absl::StatusOr<WorkerStatus> Checkpoint(const WorkerCall& call, int64_t step) {
    CheckpointReport r;
    r.step = step;
    r.manifest_sha256 = "sha-" + std::to_string(step);
    r.bytes = 1000;
    return c_->ReportCheckpoint(call, r);
  }
  JobView View() { return *c_->GetJob(id_, false); }

  ManualClock clock_;
  std::unique_ptr<Coordinator> c_;
  SubmitResult job_;
  std::string id_;
};

// Three windows done, six published (lookahead 2 past the slowest rank's next): rank 1 leaves on
// SIGTERM. Nothing from window 6 on is published; window 6's stream answer is the stop; the
// checkpoint after step 5 makes the job preempted with a new attempt resuming there, no restart
// spent. The replacements join and it runs from window 6 under the same latches.
TEST_F(StopTest, ALeaveStopsAtTheFirstUnpublishedWindowAndPreemptsWithoutARestart) {
  std::vector<WorkerCall> w = JoinAll("w");
  ASSERT_EQ(View().record.state, JobState::kRunning);
  Steps(w, 0, 2);
  ASSERT_EQ(View().record.next_window, 6);

  auto left = c_->Leave(w[1], "SIGTERM");
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_TRUE(left->stop);
  EXPECT_EQ(left->state, JobState::kRunning);  // it saves first
  auto hb = c_->Heartbeat(w[0], std::nullopt);
  ASSERT_TRUE(hb.ok()) << hb.status();
  EXPECT_TRUE(hb->stop);  // the rank that got no signal hears of it too
  auto at5 = c_->PollLatches(w[0], 5, 8);
  ASSERT_TRUE(at5.ok()) << at5.status();
  ASSERT_EQ(at5->latches.size(), 1u);  // window 5 was decided: it runs
  EXPECT_EQ(at5->stop_before, -1);     // the stop is the answer for window 6
  auto at6 = c_->PollLatches(w[1], 6, 8);
  ASSERT_TRUE(at6.ok()) << at6.status();
  EXPECT_TRUE(at6->latches.empty());
  EXPECT_EQ(at6->stop_before, 6);

  // The published windows run to their end; no later latch is published meanwhile.
  Steps(w, 3, 5);
  EXPECT_EQ(View().record.next_window, 6);
  EXPECT_EQ(View().record.state, JobState::kRunning);
  // Rank 0 commits the checkpoint after step 5: the stop is done.
  auto saved = Checkpoint(w[0], 5);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->state, JobState::kPreempted);
  JobView v = View();
  EXPECT_EQ(v.record.state, JobState::kPreempted);
  EXPECT_EQ(v.record.restarts, 0);
  EXPECT_EQ(v.record.attempt, 2);
  EXPECT_EQ(v.record.resume_step, 5);
  EXPECT_NE(v.record.failure_reason.find("rank 1 (worker w1) left (SIGTERM); ranks that left: 1"),
            std::string::npos)
      << v.record.failure_reason;
  // The old attempt is over: its calls are fenced.
  EXPECT_EQ(c_->Heartbeat(w[0], std::nullopt).status().code(), absl::StatusCode::kAborted);

  // No rejoin deadline while preempted: a minute passes with one rank back.
  auto back = Join("w0", 0);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->attempt, 2);
  EXPECT_EQ(back->resume_step, 5);
  clock_.Advance(absl::Seconds(60));
  ASSERT_TRUE(c_->Heartbeat({id_, job_.join_token, "w0", 0, 2}, std::nullopt).ok());
  c_->CheckLiveness();
  EXPECT_EQ(View().record.state, JobState::kPreempted);
  EXPECT_EQ(View().record.restarts, 0);
  // The replacement of rank 1 joins: the job runs again from window 6.
  auto replacement = Join("w1b", 1);
  ASSERT_TRUE(replacement.ok()) << replacement.status();
  v = View();
  EXPECT_EQ(v.record.state, JobState::kRunning);
  EXPECT_EQ(v.record.restarts, 0);
  std::vector<WorkerCall> next = {{id_, job_.join_token, "w0", 0, 2},
                                  {id_, job_.join_token, "w1b", 1, 2}};
  auto latches = c_->PollLatches(next[0], 6, 1);
  ASSERT_TRUE(latches.ok()) << latches.status();
  ASSERT_EQ(latches->latches.size(), 1u);
  EXPECT_EQ(latches->stop_before, -1);
  Steps(next, 6, 15);
  EXPECT_EQ(View().record.state, JobState::kSucceeded);
  EXPECT_EQ(View().record.restarts, 0);
}

// A rank that dies while the attempt saves for a stop (the grace ran out): recovered from as
// any failure, one restart, the stop forgotten.
TEST_F(StopTest, ARankLostDuringTheStopIsRecoveredAsAfterACrash) {
  std::vector<WorkerCall> w = JoinAll("w");
  Steps(w, 0, 2);
  ASSERT_TRUE(c_->Leave(w[0], "SIGTERM").ok());
  Steps(w, 3, 5);
  clock_.Advance(absl::Seconds(11));
  ASSERT_TRUE(c_->Heartbeat(w[0], std::nullopt).ok());
  c_->CheckLiveness();  // rank 1 is late
  const JobView v = View();
  EXPECT_EQ(v.record.state, JobState::kRecovering);
  EXPECT_EQ(v.record.restarts, 1);
  EXPECT_EQ(v.record.attempt, 2);
  auto hb = c_->Heartbeat({id_, job_.join_token, "w0", 0, 1}, std::nullopt);
  EXPECT_EQ(hb.status().code(), absl::StatusCode::kAborted);  // fenced, no stop pending
}

// latchkey suspend: the same save-and-stop, then `suspended`: joins are refused naming
// `latchkey resume`; ResumeJob continues it from the saved step.
TEST_F(StopTest, SuspendSavesStopsAndWaitsForResume) {
  std::vector<WorkerCall> w = JoinAll("w");
  Steps(w, 0, 2);
  auto s = c_->SuspendJob(id_, "");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->record.state, JobState::kRunning);  // saving
  Steps(w, 3, 5);
  auto saved = Checkpoint(w[0], 5);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->state, JobState::kSuspended);
  EXPECT_EQ(View().record.restarts, 0);
  auto refused = Join("x", 0);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("latchkey resume " + id_), std::string::npos)
      << refused.status();
  // Suspending again is a no-op; resuming continues from the saved step.
  EXPECT_TRUE(c_->SuspendJob(id_, "").ok());
  auto resumed = c_->ResumeJob(id_, "");
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->record.state, JobState::kRecovering);
  EXPECT_EQ(resumed->record.resume_step, 5);
  std::vector<WorkerCall> next = JoinAll("v");
  EXPECT_EQ(View().record.state, JobState::kRunning);
  Steps(next, 6, 15);
  EXPECT_EQ(View().record.state, JobState::kSucceeded);
}

// A rank that leaves before its attempt trains gives its rank up at once: a replacement takes
// it without waiting for a liveness deadline. A pending job is suspended at once.
TEST_F(StopTest, ALeaveBeforeTrainingFreesTheRankAndAPendingJobSuspendsAtOnce) {
  // (The job is pending: only rank 0 joins.)
  auto first = Join("w0", 0);
  ASSERT_TRUE(first.ok()) << first.status();
  const WorkerCall w0{id_, job_.join_token, "w0", 0, first->attempt};
  EXPECT_EQ(Join("z", 0).status().code(), absl::StatusCode::kAborted);  // held
  auto left = c_->Leave(w0, "SIGTERM");
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_EQ(left->state, JobState::kPending);
  auto taken = Join("z", 0);
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_EQ(taken->rank, 0);
  auto s = c_->SuspendJob(id_, "queue preempted it");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->record.state, JobState::kSuspended);
  EXPECT_EQ(s->record.failure_reason, "queue preempted it");
}

// Every window left is decided (16 steps, 14 done, lookahead 2): the job ends within them, so a
// Leave starts no stop (the rank finishes, or its grace ends it) and a suspend is refused,
// saying why; the job then succeeds as it would have.
TEST_F(StopTest, WhenEveryRemainingWindowIsDecidedTheJobFinishesInstead) {
  std::vector<WorkerCall> w = JoinAll("w");
  Steps(w, 0, 13);
  ASSERT_EQ(View().record.next_window, 16);
  auto left = c_->Leave(w[1], "SIGTERM");
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_FALSE(left->stop);
  auto suspended = c_->SuspendJob(id_, "");
  EXPECT_EQ(suspended.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(suspended.status().message().find("nothing to suspend"), std::string::npos)
      << suspended.status();
  Steps(w, 14, 15);
  EXPECT_EQ(View().record.state, JobState::kSucceeded) << View().record.failure_reason;
  EXPECT_EQ(View().record.restarts, 0);
}

}  // namespace
}  // namespace latchkey
