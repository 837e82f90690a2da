// The rank's side of a recovery against a real in-process coordinator (gRPC on loopback):
// sessions learn a newer attempt from their heartbeats, are fenced (AwaitLatch and ReportStep
// fail ABORTED at once), rejoin the job's current attempt, and CoordinatorLatchSource::Recover
// turns all of it into the next attempt's plan; with max_restarts 0 a rank's own error fails
// the job naming it; a rank stuck in a fenced attempt exits with kExitRestartMe.
#include <atomic>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/error_info.h"
#include "gtest/gtest.h"
#include "tests/coordinator/harness.h"
#include "tests/support/specs.h"
#include "worker/session/coordinator_latch_source.h"
#include "worker/session/worker_session.h"

namespace latchkey::testing {
namespace {

CoordinatorOptions FastOptions() {
  CoordinatorOptions opt;
  opt.liveness_timeout = absl::Seconds(3);
  opt.heartbeat_interval = absl::Milliseconds(100);
  return opt;
}

// The test speaks to the coordinator's core directly (the user's side of the protocol is not the
// worker's); the workers under test go through gRPC.
SubmittedJob Submit(InProcessCoordinator& server, int max_restarts, int hang_timeout_seconds = 2) {
  SpecParams p;
  p.world_size = 2;
  p.tp = 2;
  p.steps = 20;
  p.extra_latchkey = {{"max_restarts", max_restarts},
                      {"hang_timeout_seconds", hang_timeout_seconds}};
  JobSubmission req;
  req.spec_json = SpecJson(p);
  auto submitted = server.core().SubmitJob(req);
  EXPECT_TRUE(submitted.ok()) << submitted.status();
  if (!submitted.ok()) return SubmittedJob{};
  return SubmittedJob{submitted->job.record.job_id, submitted->join_token,
                      ToJobInfo(submitted->job)};
}

absl::StatusOr<JobInfo> GetJob(InProcessCoordinator& server, const std::string& job_id) {
  auto view = server.core().GetJob(job_id, /*with_workers=*/false);
  if (!view.ok()) return view.status();
  return ToJobInfo(*view);
}

WorkerSessionOptions Options(const std::string& address, const SubmittedJob& job, int rank) {
  WorkerSessionOptions o;
  o.coordinator = address;
  o.job_id = job.job_id;
  o.join_token = job.join_token;
  o.worker_id = "rank-" + std::to_string(rank);
  o.requested_rank = rank;
  o.retry_max = absl::Milliseconds(100);
  o.heartbeat_interval = absl::Milliseconds(100);
  return o;
}

// Both ranks of a 2-rank job, joined concurrently (rank 1's Join waits for rank 0's host).
std::vector<std::unique_ptr<WorkerSession>> JoinBoth(const std::string& address,
                                                     const SubmittedJob& job,
                                                     std::vector<WorkerSessionOptions> opts = {}) {
  if (opts.empty()) opts = {Options(address, job, 0), Options(address, job, 1)};
  std::vector<std::unique_ptr<WorkerSession>> out(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto s = WorkerSession::Join(opts[static_cast<size_t>(r)]);
      EXPECT_TRUE(s.ok()) << "rank " << r << ": " << s.status();
      if (s.ok()) out[static_cast<size_t>(r)] = *std::move(s);
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

bool WaitFor(const std::function<bool()>& pred, absl::Duration timeout) {
  const absl::Time until = absl::Now() + timeout;
  while (absl::Now() < until) {
    if (pred()) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return pred();
}

TEST(WorkerSessionRecoveryTest, HeartbeatLearnsNewerAttemptAndFencesTheSession) {
  InProcessCoordinator server(FastOptions());
  const SubmittedJob job = Submit(server, 2);
  auto sessions = JoinBoth(server.address(), job);
  ASSERT_TRUE(sessions[0] && sessions[1]);
  WorkerSession& a = *sessions[0];
  EXPECT_EQ(a.attempt(), 1);
  EXPECT_EQ(a.info().attempt, 1);
  EXPECT_EQ(a.job_attempt(), 1);
  EXPECT_FALSE(a.fenced());
  a.StartLatches(0);
  ASSERT_TRUE(a.AwaitLatch(0, absl::Seconds(10)).ok());

  ASSERT_TRUE(sessions[1]->ReportFailure("rank 1: tokens file vanished").ok());
  EXPECT_GE(sessions[1]->job_attempt(), 2);  // the report's answer names the new attempt
  // Rank 0 heard nothing directly: its heartbeats tell it.
  ASSERT_TRUE(WaitFor([&] { return a.job_attempt() >= 2; }, absl::Seconds(5)));
  EXPECT_TRUE(a.fenced());
  EXPECT_EQ(a.attempt(), 1);

  // Fenced: the waiting training thread gets ABORTED at once, not after its timeout.
  // "At once" is measured against the call's own 30 s timeout, which an unfenced wait runs out;
  // a third of it leaves a loaded (ASan) run room.
  const absl::Duration timeout = absl::Seconds(30);
  const absl::Time start = absl::Now();
  auto latch = a.AwaitLatch(5, timeout);
  EXPECT_EQ(latch.status().code(), absl::StatusCode::kAborted) << latch.status();
  EXPECT_LT(absl::Now() - start, timeout / 3);
  // The refusal is data: ATTEMPT_FENCED with both attempts.
  EXPECT_TRUE(HasErrorReason(latch.status(), error_reason::kAttemptFenced)) << latch.status();
  std::optional<ErrorInfo> info = GetErrorInfo(latch.status());
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->IntMetadata("worker_attempt"), 1);
  EXPECT_GE(info->IntMetadata("job_attempt").value_or(0), 2);
  StepMetrics m;
  m.step = 0;
  m.kv_mode = KvMode::kCoalesced;
  EXPECT_EQ(a.ReportStep(m).code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(HasErrorReason(a.ReportStep(m), error_reason::kAttemptFenced));
  EXPECT_FALSE(a.job_end().has_value());
}

// A closed session is not a fenced one: its calls end FAILED_PRECONDITION, reason
// SESSION_CLOSED.
TEST(WorkerSessionRecoveryTest, ClosedSessionSaysSoAsData) {
  InProcessCoordinator server(FastOptions());
  const SubmittedJob job = Submit(server, 2);
  auto sessions = JoinBoth(server.address(), job);
  ASSERT_TRUE(sessions[0] && sessions[1]);
  WorkerSession& a = *sessions[0];
  a.StartLatches(0);
  a.Close();
  auto latch = a.AwaitLatch(5, absl::Seconds(30));
  EXPECT_EQ(latch.status().code(), absl::StatusCode::kFailedPrecondition) << latch.status();
  EXPECT_TRUE(HasErrorReason(latch.status(), error_reason::kSessionClosed)) << latch.status();
  EXPECT_FALSE(HasErrorReason(latch.status(), error_reason::kAttemptFenced));
  const absl::Status rejoin = a.Rejoin();
  EXPECT_EQ(rejoin.code(), absl::StatusCode::kFailedPrecondition) << rejoin;
  EXPECT_TRUE(HasErrorReason(rejoin, error_reason::kSessionClosed)) << rejoin;
  EXPECT_FALSE(a.fenced());
}

TEST(WorkerSessionRecoveryTest, RecoverJoinsTheNextAttemptOnEveryRank) {
  InProcessCoordinator server(FastOptions());
  const SubmittedJob job = Submit(server, 2);
  auto sessions = JoinBoth(server.address(), job);
  ASSERT_TRUE(sessions[0] && sessions[1]);
  std::vector<std::unique_ptr<CoordinatorLatchSource>> sources;
  for (auto& s : sessions) {
    sources.push_back(std::make_unique<CoordinatorLatchSource>(s.get(), comm::RendezvousConfig{}));
    auto plan = sources.back()->Begin();
    ASSERT_TRUE(plan.ok());
    EXPECT_EQ(plan->attempt, 1);
    EXPECT_EQ(plan->first_window(), 0);
  }
  std::vector<absl::StatusOr<AttemptPlan>> plans(2, absl::UnknownError("not run"));
  std::vector<Latch> first_latches(2);
  std::vector<std::thread> ranks;
  // Rank 1 fails on its own; rank 0 is waiting for a latch far ahead and is fenced.
  ranks.emplace_back([&] {
    absl::SleepFor(absl::Milliseconds(300));
    auto l = sources[1]->Await(0);
    ASSERT_TRUE(l.ok()) << l.status();
    first_latches[1] = *l;
    plans[1] = sources[1]->Recover(absl::InternalError("rank 1 broke\nstack..."));
  });
  ranks.emplace_back([&] {
    auto l = sources[0]->Await(0);
    ASSERT_TRUE(l.ok()) << l.status();
    first_latches[0] = *l;
    // Far ahead (the ranks report no step, so it is never published): rank 0 is waiting there.
    auto ahead = sources[0]->Await(10);
    EXPECT_EQ(ahead.status().code(), absl::StatusCode::kAborted) << ahead.status();
    plans[0] = sources[0]->Recover(ahead.status());
  });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 2; ++r) {
    const auto& plan = plans[static_cast<size_t>(r)];
    ASSERT_TRUE(plan.ok()) << "rank " << r << ": " << plan.status();
    EXPECT_EQ(plan->attempt, 2);
    EXPECT_EQ(plan->rendezvous.prefix, job.job_id + "/a2");
    EXPECT_EQ(plan->rendezvous.rank, r);
    EXPECT_FALSE(plan->rendezvous.host.empty());
    EXPECT_EQ(plan->resume_step, -1);  // no checkpoint: from scratch
    EXPECT_EQ(sessions[static_cast<size_t>(r)]->attempt(), 2);
    EXPECT_FALSE(sessions[static_cast<size_t>(r)]->fenced());
  }
  // The new attempt re-runs window 0 under the same (immutable) latch.
  for (int r = 0; r < 2; ++r) {
    auto l = sources[static_cast<size_t>(r)]->Await(0);
    ASSERT_TRUE(l.ok()) << "rank " << r << ": " << l.status();
    EXPECT_EQ(*l, first_latches[static_cast<size_t>(r)]);
  }
  auto info = GetJob(server, job.job_id);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->attempt, 2);
  EXPECT_EQ(info->state, JobState::kRunning);
  // The cause is rank 1's report, its first line only.
  EXPECT_NE(info->last_recovery_reason.find("rank 1 broke"), std::string::npos)
      << info->last_recovery_reason;
  EXPECT_EQ(info->last_recovery_reason.find("stack"), std::string::npos)
      << info->last_recovery_reason;
}

TEST(WorkerSessionRecoveryTest, WithoutRestartsAnOwnErrorFailsTheJobNamingIt) {
  InProcessCoordinator server(FastOptions());
  const SubmittedJob job = Submit(server, 0);
  auto sessions = JoinBoth(server.address(), job);
  ASSERT_TRUE(sessions[0] && sessions[1]);
  CoordinatorLatchSource source(sessions[1].get(), comm::RendezvousConfig{});
  ASSERT_TRUE(source.Begin().ok());
  const absl::Time start = absl::Now();
  auto plan = source.Recover(absl::NotFoundError("latchkey.data.tokens_file: not found"));
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kNotFound) << plan.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));  // the job's end, not the wait's bound
  auto info = GetJob(server, job.job_id);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->state, JobState::kFailed);
  EXPECT_NE(info->failure_reason.find("latchkey.data.tokens_file: not found"), std::string::npos)
      << info->failure_reason;
  // The other rank hears of the end: Await says CANCELLED (the job ended elsewhere) and its
  // Recover of a symptom names the job's end.
  CoordinatorLatchSource other(sessions[0].get(), comm::RendezvousConfig{});
  auto latch = other.Await(3);
  EXPECT_EQ(latch.status().code(), absl::StatusCode::kCancelled) << latch.status();
  auto rec = other.Recover(absl::UnavailableError("peer 1 vanished"));
  ASSERT_FALSE(rec.ok());
  EXPECT_NE(rec.status().message().find("tokens_file"), std::string::npos) << rec.status();
}

// A diverged training (TRAINING_DIVERGED) is the job's end even with restarts left: Recover
// reports it with its reason and returns it at once; the job fails with no new attempt.
TEST(WorkerSessionRecoveryTest, ADivergedTrainingFailsTheJobWithRestartsLeft) {
  InProcessCoordinator server(FastOptions());
  const SubmittedJob job = Submit(server, 3);
  auto sessions = JoinBoth(server.address(), job);
  ASSERT_TRUE(sessions[0] && sessions[1]);
  CoordinatorLatchSource source(sessions[0].get(), comm::RendezvousConfig{});
  ASSERT_TRUE(source.Begin().ok());
  const absl::Time start = absl::Now();
  auto plan = source.Recover(TrainingDivergedError("loss", std::nan(""), 1, 0));
  ASSERT_FALSE(plan.ok());
  EXPECT_TRUE(HasErrorReason(plan.status(), error_reason::kTrainingDiverged)) << plan.status();
  EXPECT_EQ(plan.status().message(), "loss is NaN at step 1 (rank 0)");
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  auto info = GetJob(server, job.job_id);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->state, JobState::kFailed);
  EXPECT_EQ(info->restarts, 0);
  EXPECT_EQ(info->attempt, 1);
  EXPECT_NE(info->failure_reason.find("loss is NaN at step 1 (rank 0) (training diverged: not "
                                      "retried)"),
            std::string::npos)
      << info->failure_reason;
}

// Heartbeats carry the ranks' positions: the coordinator's hang detector reads them and names
// the rank furthest behind in the plan (rank 1, computing, while rank 0 waits in a collective).
TEST(WorkerSessionRecoveryTest, HeartbeatPositionsNameTheStalledRank) {
  InProcessCoordinator server(FastOptions());
  const SubmittedJob job = Submit(server, 1, /*hang_timeout_seconds=*/1);
  const absl::Time start = absl::Now();
  std::vector<WorkerSessionOptions> opts = {Options(server.address(), job, 0),
                                            Options(server.address(), job, 1)};
  opts[0].position = [start] {
    RankPosition p;
    p.attempt = 1;
    p.window = 3;
    p.micro_batch = 2;
    p.phase = RankPhase::kCollective;
    p.op = "all_reduce";
    p.group = "tp";
    p.seq = 7;
    p.seconds = absl::ToDoubleSeconds(absl::Now() - start);
    return p;
  };
  opts[1].position = [start] {
    RankPosition p;
    p.attempt = 1;
    p.window = 3;
    p.micro_batch = 2;
    p.phase = RankPhase::kCompute;
    p.seq = 6;
    p.seconds = absl::ToDoubleSeconds(absl::Now() - start);
    return p;
  };
  auto sessions = JoinBoth(server.address(), job, opts);
  ASSERT_TRUE(sessions[0] && sessions[1]);
  absl::StatusOr<JobInfo> info;
  ASSERT_TRUE(WaitFor(
      [&] {
        info = GetJob(server, job.job_id);
        return info.ok() && !info->stalled.empty();
      },
      absl::Seconds(10)))
      << (info.ok() ? "no stall verdict" : info.status().ToString());
  const StalledRank& stalled = info->stalled.front();
  EXPECT_EQ(stalled.rank, 1);
  EXPECT_EQ(stalled.window, 3);
  EXPECT_EQ(stalled.micro_batch, 2);
  EXPECT_EQ(stalled.where, "compute");
  EXPECT_EQ(stalled.attempt, 1);
  EXPECT_GE(stalled.seconds, 1.0);
  EXPECT_EQ(info->attempt, 2);  // the verdict started a recovery
  EXPECT_NE(info->last_recovery_reason.find("rank 1 stalled in window 3"), std::string::npos)
      << info->last_recovery_reason;
  EXPECT_NE(info->last_recovery_reason.find("all_reduce/tp #7"), std::string::npos)
      << info->last_recovery_reason;
  // Both ranks hear of the new attempt from their heartbeats.
  for (auto& s : sessions) {
    EXPECT_TRUE(WaitFor([&] { return s->job_attempt() >= 2 && s->fenced(); }, absl::Seconds(5)));
  }
}

// A rank whose training thread never comes back from a fenced attempt (a collective with a
// stopped peer) exits for a restart, naming where it is stuck. Rank 0's session runs on a
// ManualClock: the test moves its time (heartbeats, then the watchdog's second) instead of
// waiting for it.
void StuckRank() {
  InProcessCoordinator server(FastOptions());
  const SubmittedJob job = Submit(server, 2);
  ManualClock clock;
  std::vector<WorkerSessionOptions> opts = {Options(server.address(), job, 0),
                                            Options(server.address(), job, 1)};
  opts[0].clock = &clock;
  opts[0].stuck_exit_after = absl::Seconds(1);
  opts[0].position = [] {
    RankPosition p;
    p.attempt = 1;
    p.window = 4;
    p.phase = RankPhase::kCollective;
    p.op = "all_reduce";
    p.group = "tp";
    p.seq = 3;
    return p;
  };
  auto sessions = JoinBoth(server.address(), job, opts);
  if (!sessions[0] || !sessions[1]) std::_Exit(1);
  if (!sessions[1]->ReportFailure("rank 1 stopped").ok()) std::_Exit(2);
  // "Stuck": rank 0's heartbeats learn of attempt 2, then its watchdog must end the process as
  // soon as the clock passed stuck_exit_after, well before these 20 s of its time.
  for (int i = 0; i < 200; ++i) {
    clock.Advance(absl::Milliseconds(100));
    absl::SleepFor(absl::Milliseconds(10));  // the heartbeat thread's turn to see the clock
  }
  std::_Exit(3);
}

TEST(WorkerSessionRecoveryDeathTest, StuckInAFencedAttemptExitsForARestart) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(StuckRank(), ::testing::ExitedWithCode(kExitRestartMe),
              "latchkey-worker: rank 0 stuck in all_reduce/tp #3 of attempt 1 while the job is "
              "at attempt 2; exiting for a restart");
}

// A rank whose training thread is back and rejoining is not stuck, however long the join waits
// (here for the new attempt's rank 0, as a recovery's survivors do): the watchdog leaves it be.
// Rank 1's session runs on a ManualClock moved well past stuck_exit_after during its Rejoin.
void RejoinOutlastingTheWatchdog() {
  InProcessCoordinator server(FastOptions());
  const SubmittedJob job = Submit(server, 2);
  ManualClock clock;
  std::vector<WorkerSessionOptions> opts = {Options(server.address(), job, 0),
                                            Options(server.address(), job, 1)};
  opts[1].clock = &clock;
  opts[1].stuck_exit_after = absl::Seconds(1);
  // Rank 0 first: rank 1's first Join must not wait for rank 0's host on a clock nobody moves.
  std::vector<std::unique_ptr<WorkerSession>> sessions;
  for (const WorkerSessionOptions& o : opts) {
    auto s = WorkerSession::Join(o);
    if (!s.ok()) std::_Exit(1);
    sessions.push_back(*std::move(s));
  }
  if (!sessions[0]->ReportFailure("rank 0 stopped").ok()) std::_Exit(2);
  for (int i = 0; i < 100 && !sessions[1]->fenced(); ++i) {
    clock.Advance(absl::Milliseconds(100));
    absl::SleepFor(absl::Milliseconds(10));
  }
  if (!sessions[1]->fenced()) std::_Exit(3);
  std::atomic<int> rejoined{-1};
  std::thread t([&] { rejoined = sessions[1]->Rejoin().ok() ? 1 : 0; });
  for (int i = 0; i < 30; ++i) {  // 3 s of its time: three times stuck_exit_after
    clock.Advance(absl::Milliseconds(100));
    absl::SleepFor(absl::Milliseconds(10));
  }
  if (rejoined != -1) std::_Exit(4);  // it did not wait for rank 0: the case is not made
  if (!sessions[0]->Rejoin().ok()) std::_Exit(5);
  for (int i = 0; i < 300 && rejoined == -1; ++i) {
    clock.Advance(absl::Milliseconds(100));
    absl::SleepFor(absl::Milliseconds(10));
  }
  t.join();
  if (rejoined != 1 || sessions[1]->attempt() != 2) std::_Exit(6);
  std::fprintf(stderr, "rank 1 rejoined attempt 2\n");
  std::_Exit(0);
}

TEST(WorkerSessionRecoveryDeathTest, ARejoinThatWaitsForRankZeroIsNotStuck) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(RejoinOutlastingTheWatchdog(), ::testing::ExitedWithCode(0),
              "rank 1 rejoined attempt 2");
}

}  // namespace
}  // namespace latchkey::testing
