// Attempts (docs/fault-tolerance.md): recovery, the attempt fence, resume from the last reported
// checkpoint, max_restarts, determinism violations, stall verdicts, a coordinator restart in the
// middle of a recovery, the rejoin deadline, and boundary arrival lag (rebuilt on load). Real
// SQLite, a ManualClock.
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/error_info.h"
#include "gtest/gtest.h"
#include "server/coordinator.h"
#include "server/hang_detector.h"
#include "server/sqlite_store.h"
#include "tests/support/specs.h"
#include "tests/support/temp_dir.h"

namespace latchkey {
namespace {

using testing::ScopedTempDir;
using testing::SpecJson;
using testing::SpecParams;

std::unique_ptr<Coordinator> Make(CoordinatorOptions opt = {}, const std::string& db = ":memory:") {
  auto store = SqliteStore::Open(db);
  EXPECT_TRUE(store.ok()) << store.status();
  auto c = Coordinator::Create(*std::move(store), opt, nullptr);
  EXPECT_TRUE(c.ok()) << c.status();
  return *std::move(c);
}

std::string Spec(int world_size = 2, std::optional<int> max_restarts = std::nullopt,
                 std::optional<double> hang_timeout = std::nullopt) {
  SpecParams p;
  p.world_size = world_size;
  p.steps = 6;
  if (max_restarts) p.extra_latchkey["max_restarts"] = *max_restarts;
  if (hang_timeout) p.extra_latchkey["hang_timeout_seconds"] = *hang_timeout;
  return SpecJson(p);
}

// Joins worker `worker` asking for `rank`; the call it makes afterwards names the attempt.
WorkerCall Join(Coordinator& c, const SubmitResult& job, const std::string& worker, int rank,
                JoinResult* out = nullptr) {
  JoinArgs a;
  a.call = {job.job.record.job_id, job.join_token, worker, -1, 0};
  a.requested_rank = rank;
  a.peer_host = "127.0.0.1";
  auto r = c.Join(a);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return {};
  if (out) *out = *r;
  return {job.job.record.job_id, job.join_token, worker, r->rank, r->attempt};
}

std::vector<WorkerCall> JoinAll(Coordinator& c, const SubmitResult& job, int world,
                                const std::string& prefix = "w") {
  std::vector<WorkerCall> calls;
  for (int i = 0; i < world; ++i) calls.push_back(Join(c, job, prefix + std::to_string(i), i));
  return calls;
}

absl::StatusOr<WorkerStatus> Report(Coordinator& c, const WorkerCall& call, int64_t step,
                                    double loss, double boundary_wait = 0.0) {
  StepReportRecord r;
  r.report.step = step;
  r.report.loss = loss;
  r.report.tokens = 128;
  r.report.boundary_wait_seconds = boundary_wait;
  return c.ReportStep(call, r);
}

absl::Status Checkpoint(Coordinator& c, const WorkerCall& call, int64_t step,
                        const std::string& sha) {
  CheckpointReport r;
  r.step = step;
  r.manifest_sha256 = sha;
  r.bytes = 1000;
  return c.ReportCheckpoint(call, r).status();
}

std::vector<std::string> EventKinds(Coordinator& c, const std::string& id) {
  auto audit = c.ListLatches(id, 0, 0);
  EXPECT_TRUE(audit.ok()) << audit.status();
  std::vector<std::string> kinds;
  if (audit.ok()) {
    for (const JobEventRecord& e : audit->events) kinds.push_back(e.kind);
  }
  return kinds;
}

TEST(CoordinatorRecoveryTest, FailureBumpsTheAttemptAndFencesTheOldWorkers) {
  auto c = Make();
  auto job = *c->SubmitJob({Spec(), "", "", 0});
  const std::string id = job.job.record.job_id;
  auto calls = JoinAll(*c, job, 2);
  EXPECT_EQ(calls[0].attempt, 1);
  for (const auto& call : calls) ASSERT_TRUE(Report(*c, call, 0, 2.5).ok());
  ASSERT_TRUE(Checkpoint(*c, calls[0], 0, "c0ffee").ok());
  ASSERT_TRUE(Checkpoint(*c, calls[0], 0, "c0ffee").ok());  // a repeat changes nothing
  ASSERT_TRUE(Report(*c, calls[0], 1, 2.25).ok());

  auto failed = c->ReportFailure(calls[1], "CUDA error: an illegal memory access");
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_EQ(failed->state, JobState::kRecovering);
  EXPECT_EQ(failed->attempt, 2);
  const JobView before = *c->GetJob(id, true);
  EXPECT_EQ(before.record.attempt, 2);
  EXPECT_EQ(before.record.restarts, 1);
  EXPECT_EQ(before.record.resume_step, 0);
  EXPECT_EQ(before.record.resume_manifest_sha256, "c0ffee");
  EXPECT_NE(before.record.last_recovery_reason.find("rank 1 (worker w1): CUDA error"),
            std::string::npos)
      << before.record.last_recovery_reason;
  EXPECT_EQ(before.workers_joined, 0);  // every rank is free for the new attempt

  // Every call of the old attempt is refused, naming both attempts, and changes nothing.
  const std::string fenced = "worker w0 is at attempt 1; job " + id + " is at attempt 2 (fenced)";
  auto step = Report(*c, calls[0], 2, 2.0);
  ASSERT_EQ(step.status().code(), absl::StatusCode::kAborted) << step.status();
  EXPECT_EQ(step.status().message(), fenced);
  // The attempts travel as data: a worker decides on the code and these, never on the text.
  const std::optional<ErrorInfo> info = GetErrorInfo(step.status());
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->domain, kErrorDomain);
  EXPECT_EQ(info->reason, error_reason::kAttemptFenced);
  EXPECT_EQ(info->IntMetadata("job_attempt"), 2);
  EXPECT_EQ(info->IntMetadata("worker_attempt"), 1);
  WorkerCall legacy = calls[0];
  legacy.attempt = 0;  // a client that names no attempt is judged by the rank it held
  EXPECT_EQ(c->Heartbeat(legacy).status().message(), fenced);
  EXPECT_EQ(c->WaitLatches(calls[0], 0, 10, absl::Now()).status().code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(Checkpoint(*c, calls[0], 1, "beef").code(), absl::StatusCode::kAborted);
  EXPECT_EQ(c->ReportFailure(calls[0], "late").status().code(), absl::StatusCode::kAborted);
  const JobView after = *c->GetJob(id, true);
  EXPECT_EQ(after.record.attempt, 2);
  EXPECT_EQ(after.record.update_time, before.record.update_time);
  EXPECT_EQ(after.record.last_checkpoint_step, 0);
  EXPECT_EQ(after.record.state, JobState::kRecovering);

  // Rejoin: the surviving process keeps its id, the replacement has a new one. The host is
  // handed out once rank 0 of attempt 2 has joined.
  JoinResult r1;
  WorkerCall n1 = Join(*c, job, "w1-restarted", 1, &r1);
  EXPECT_EQ(r1.attempt, 2);
  EXPECT_EQ(r1.rendezvous_prefix, id + "/a2");
  EXPECT_EQ(r1.resume_step, 0);
  EXPECT_EQ(r1.resume_manifest_sha256, "c0ffee");
  EXPECT_EQ(r1.rendezvous_host, "");
  EXPECT_EQ(r1.state, JobState::kRecovering);
  JoinResult r0;
  WorkerCall n0 = Join(*c, job, "w0", 0, &r0);
  EXPECT_EQ(r0.attempt, 2);
  EXPECT_EQ(r0.rendezvous_host, "127.0.0.1");
  EXPECT_EQ(r0.state, JobState::kRunning);
  Join(*c, job, "w1-restarted", 1, &r1);  // joining again (idempotent) now gets the host
  EXPECT_EQ(r1.rendezvous_host, "127.0.0.1");
  EXPECT_EQ(c->GetJob(id, false)->record.state, JobState::kRunning);

  // The new attempt runs from window resume_step + 1; window 1 was stored by attempt 1.
  auto dup = Report(*c, n0, 1, 2.25);
  ASSERT_TRUE(dup.ok()) << dup.status();
  EXPECT_TRUE(dup->duplicate);
  EXPECT_EQ(dup->attempt, 2);
  ASSERT_TRUE(Report(*c, n1, 1, 2.25).ok());
  EXPECT_EQ(c->GetJob(id, false)->record.determinism_violations, 0);  // same loss, bit for bit
  EXPECT_EQ(EventKinds(*c, id), (std::vector<std::string>{"checkpoint", "recovery"}));
}

TEST(CoordinatorRecoveryTest, AFreshJobRendezvousesUnderItsIdAndResumesFromNothing) {
  auto c = Make();
  auto job = *c->SubmitJob({Spec(), "", "", 0});
  JoinResult r;
  Join(*c, job, "w0", 0, &r);
  EXPECT_EQ(r.attempt, 1);
  EXPECT_EQ(r.rendezvous_prefix, job.job.record.job_id);
  EXPECT_EQ(r.resume_step, -1);
  EXPECT_EQ(r.hang_timeout, absl::Seconds(20));
}

TEST(CoordinatorRecoveryTest, ReRunWithADifferentLossIsADeterminismViolation) {
  auto c = Make();
  auto job = *c->SubmitJob({Spec(), "", "", 0});
  const std::string id = job.job.record.job_id;
  auto calls = JoinAll(*c, job, 2);
  for (const auto& call : calls) ASSERT_TRUE(Report(*c, call, 0, 2.5).ok());
  ASSERT_TRUE(c->ReportFailure(calls[0], "killed").ok());
  auto next = JoinAll(*c, job, 2, "v");
  EXPECT_EQ(next[0].attempt, 2);
  EXPECT_EQ(c->GetJob(id, false)->record.resume_step, -1);  // no checkpoint: from the start
  auto same = Report(*c, next[0], 0, 2.5);
  ASSERT_TRUE(same.ok());
  EXPECT_TRUE(same->duplicate);
  auto differs = Report(*c, next[1], 0, std::nextafter(2.5, 3.0));
  ASSERT_TRUE(differs.ok()) << differs.status();
  EXPECT_TRUE(differs->duplicate);
  auto v = *c->GetJob(id, true);
  EXPECT_EQ(v.record.determinism_violations, 1);
  EXPECT_EQ(v.last_step->report.loss, 2.5);  // the first report is kept
  // Both ranks re-ran window 0: their progress in this attempt moved on.
  EXPECT_EQ(v.workers[0].steps_reported, 1);
  EXPECT_EQ(v.workers[1].steps_reported, 1);
  auto audit = c->ListLatches(id, 0, 0);
  ASSERT_EQ(audit->events.size(), 2u);
  EXPECT_EQ(audit->events[1].kind, "determinism_violation");
  EXPECT_EQ(audit->events[1].attempt, 2);
  EXPECT_NE(audit->events[1].message.find("step 0 re-run by rank 1"), std::string::npos)
      << audit->events[1].message;
}

TEST(CoordinatorRecoveryTest, PastMaxRestartsTheJobFailsNamingTheLastCause) {
  auto c = Make();
  auto job = *c->SubmitJob({Spec(2, 1), "", "", 0});
  const std::string id = job.job.record.job_id;
  auto calls = JoinAll(*c, job, 2);
  ASSERT_EQ(c->ReportFailure(calls[1], "segfault")->state, JobState::kRecovering);
  auto next = JoinAll(*c, job, 2, "v");
  auto end = c->ReportFailure(next[1], "disk full");
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_EQ(end->state, JobState::kFailed);
  EXPECT_EQ(end->attempt, 2);
  EXPECT_EQ(end->reason, "rank 1 (worker v1): disk full (after 1 restart)");
  auto v = *c->GetJob(id, false);
  EXPECT_EQ(v.record.restarts, 1);
  EXPECT_EQ(v.max_restarts, 1);
}

TEST(CoordinatorRecoveryTest, NoRestartsFailsAtOnce) {
  auto c = Make();
  auto job = *c->SubmitJob({Spec(2, 0), "", "", 0});
  auto calls = JoinAll(*c, job, 2);
  auto end = c->ReportFailure(calls[0], "oom");
  EXPECT_EQ(end->state, JobState::kFailed);
  EXPECT_EQ(end->reason, "rank 0 (worker w0): oom");
}

TEST(CoordinatorRecoveryTest, APermanentFailureFailsAtOnceWithRestartsLeft) {
  auto c = Make();
  auto job = *c->SubmitJob({Spec(), "", "", 0});  // max_restarts 3
  auto calls = JoinAll(*c, job, 2);
  auto end = c->ReportFailure(calls[1], "latchkey.device: \"cuda\": no CUDA device cuda:1",
                              /*permanent=*/true);
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_EQ(end->state, JobState::kFailed);
  EXPECT_EQ(end->attempt, 1);
  EXPECT_EQ(end->reason,
            "rank 1 (worker w1): latchkey.device: \"cuda\": no CUDA device cuda:1 (a "
            "configuration error: not retried)");
  const JobView view = *c->GetJob(job.job.record.job_id, false);
  EXPECT_EQ(view.record.restarts, 0);
}

// Heartbeats with positions every second; rank `silent` stops after its first one.
TEST(CoordinatorRecoveryTest, StallVerdictNamesTheSilentRankAndStartsARecovery) {
  ManualClock clock;
  CoordinatorOptions opt;
  opt.clock = &clock;
  opt.heartbeat_interval = absl::Seconds(1);
  opt.liveness_timeout = absl::Seconds(30);
  auto c = Make(opt);
  const double hang = 5;
  auto job = *c->SubmitJob({Spec(4, 3, hang), "", "", 0});
  const std::string id = job.job.record.job_id;
  auto calls = JoinAll(*c, job, 4);
  RankPosition stuck;
  stuck.attempt = 1;
  stuck.window = 3;
  stuck.micro_batch = 1;
  stuck.phase = RankPhase::kCompute;
  stuck.seq = 4;
  stuck.seconds = 0.5;
  ASSERT_TRUE(c->Heartbeat(calls[1], stuck).ok());
  RankPosition waiting = stuck;
  waiting.phase = RankPhase::kCollective;
  waiting.op = "all_reduce";
  waiting.group = "tp";
  waiting.seq = 5;
  const absl::Duration bound = absl::Seconds(hang) + 2 * opt.heartbeat_interval;
  absl::Duration elapsed;
  while (c->GetJob(id, false)->record.state == JobState::kRunning && elapsed <= bound) {
    clock.Advance(absl::Seconds(1));
    elapsed += absl::Seconds(1);
    waiting.seconds = absl::ToDoubleSeconds(elapsed);
    for (int r : {0, 2, 3}) ASSERT_TRUE(c->Heartbeat(calls[static_cast<size_t>(r)], waiting).ok());
    c->CheckLiveness();
  }
  const JobView v = *c->GetJob(id, false);
  ASSERT_EQ(v.record.state, JobState::kRecovering) << "no verdict within " << bound;
  EXPECT_LE(elapsed, bound);
  EXPECT_EQ(v.record.attempt, 2);
  ASSERT_EQ(v.record.stalled.size(), 1u);
  const StalledRank& s = v.record.stalled[0];
  EXPECT_EQ(s.rank, 1);
  EXPECT_EQ(s.window, 3);
  EXPECT_EQ(s.micro_batch, 1);
  EXPECT_EQ(s.where, "compute");
  EXPECT_EQ(s.attempt, 1);
  EXPECT_EQ(s.seconds, 0.5 + absl::ToDoubleSeconds(elapsed));
  const std::string& why = v.record.last_recovery_reason;
  EXPECT_EQ(why.rfind("rank 1 stalled in window 3, micro-batch 1 (compute) for ", 0), 0u) << why;
  EXPECT_NE(why.find("no heartbeat for"), std::string::npos) << why;
  EXPECT_NE(why.find("; ranks 0,2,3 waiting in all_reduce/tp #5"), std::string::npos) << why;
  EXPECT_EQ(EventKinds(*c, id), (std::vector<std::string>{"stalled", "recovery"}));

  // The verdict stays listed until the attempt it caused completed a step.
  auto next = JoinAll(*c, job, 4, "v");
  for (size_t r = 0; r < 3; ++r) ASSERT_TRUE(Report(*c, next[r], 0, 1.0).ok());
  EXPECT_EQ(c->GetJob(id, false)->record.stalled.size(), 1u);
  ASSERT_TRUE(Report(*c, next[3], 0, 1.0).ok());
  EXPECT_TRUE(c->GetJob(id, false)->record.stalled.empty());
}

TEST(CoordinatorRecoveryTest, LivenessVerdictNamesWhereTheRankWasAndRecovers) {
  ManualClock clock;
  CoordinatorOptions opt;
  opt.clock = &clock;
  opt.liveness_timeout = absl::Seconds(30);
  auto c = Make(opt);
  auto job = *c->SubmitJob({Spec(2, 3, 60), "", "", 0});
  const std::string id = job.job.record.job_id;
  auto calls = JoinAll(*c, job, 2);
  RankPosition p;
  p.window = 2;
  p.micro_batch = 0;
  p.phase = RankPhase::kLatch;
  ASSERT_TRUE(c->Heartbeat(calls[1], p).ok());
  clock.Advance(absl::Seconds(31));
  ASSERT_TRUE(c->Heartbeat(calls[0]).ok());
  c->CheckLiveness();
  auto v = *c->GetJob(id, false);
  EXPECT_EQ(v.record.state, JobState::kRecovering);
  EXPECT_EQ(v.record.last_recovery_reason,
            "rank 1 (worker w1, unseen for 31s), last in window 2, micro-batch 0 (latch), missed "
            "the liveness deadline of 30s");
}

// The ranks of a later attempt that reported a step (their state moved to active) still hold
// their ranks after a coordinator restart: their heartbeats are answered, not fenced.
TEST(CoordinatorRecoveryTest, ReopenedInALaterAttemptItsActiveRanksKeepTheirRanks) {
  ScopedTempDir dir;
  const std::string db = dir.path() + "/c.db";
  SubmitResult job;
  std::vector<WorkerCall> second;
  {
    auto c = Make({}, db);
    job = *c->SubmitJob({Spec(), "", "", 0});
    std::vector<WorkerCall> first = JoinAll(*c, job, 2);
    ASSERT_EQ(c->ReportFailure(first[1], "killed by signal 9")->state, JobState::kRecovering);
    second = JoinAll(*c, job, 2, "v");
    ASSERT_EQ(second[0].attempt, 2);
    for (const auto& call : second) ASSERT_TRUE(Report(*c, call, 0, 2.5).ok());
  }
  auto c = Make({}, db);
  const JobView v = *c->GetJob(job.job.record.job_id, true);
  EXPECT_EQ(v.record.state, JobState::kRunning);
  EXPECT_EQ(v.workers_joined, 2);
  for (const auto& call : second) {
    auto beat = c->Heartbeat(call);
    ASSERT_TRUE(beat.ok()) << beat.status();
    EXPECT_EQ(beat->attempt, 2);
  }
}

TEST(CoordinatorRecoveryTest, ReopenedInStateRecoveringTheCoordinatorFinishesTheRecovery) {
  ScopedTempDir dir;
  const std::string db = dir.path() + "/c.db";
  SubmitResult job;
  std::vector<WorkerCall> old;
  {
    auto c = Make({}, db);
    job = *c->SubmitJob({Spec(), "", "", 0});
    old = JoinAll(*c, job, 2);
    for (const auto& call : old) ASSERT_TRUE(Report(*c, call, 0, 2.5).ok());
    ASSERT_TRUE(Checkpoint(*c, old[0], 0, "abc").ok());
    ASSERT_EQ(c->ReportFailure(old[1], "killed by signal 9")->state, JobState::kRecovering);
    Join(*c, job, "v1", 1);  // one rank of attempt 2 joined before the coordinator died
  }
  auto c = Make({}, db);
  const std::string id = job.job.record.job_id;
  auto v = *c->GetJob(id, true);
  EXPECT_EQ(v.record.state, JobState::kRecovering);
  EXPECT_EQ(v.record.attempt, 2);
  EXPECT_EQ(v.record.resume_step, 0);
  EXPECT_EQ(v.workers_joined, 1);  // only the worker of the current attempt holds a rank
  ASSERT_EQ(v.workers.size(), 1u);
  EXPECT_EQ(v.workers[0].worker_id, "v1");
  EXPECT_EQ(c->Heartbeat(old[0]).status().code(), absl::StatusCode::kAborted);
  JoinResult r;
  WorkerCall n0 = Join(*c, job, "w0", 0, &r);
  EXPECT_EQ(r.attempt, 2);
  EXPECT_EQ(r.resume_manifest_sha256, "abc");
  EXPECT_EQ(r.state, JobState::kRunning);
  EXPECT_TRUE(c->Heartbeat(n0).ok());
  EXPECT_EQ(c->GetJob(id, false)->steps_completed, 1);  // step 0 stays completed
}

TEST(CoordinatorRecoveryTest, BoundaryArrivalLagNamesTheRankThatWaitedLeast) {
  auto c = Make();
  auto job = *c->SubmitJob({Spec(), "", "", 0});
  const std::string id = job.job.record.job_id;
  auto calls = JoinAll(*c, job, 2);
  ASSERT_TRUE(Report(*c, calls[0], 0, 1.0, 0.75).ok());
  EXPECT_TRUE(c->GetJob(id, false)->slowest.empty());  // rank 1 has not reported window 0
  ASSERT_TRUE(Report(*c, calls[1], 0, 1.0, 0.25).ok());
  ASSERT_TRUE(Report(*c, calls[1], 1, 1.0, 0.5).ok());
  ASSERT_TRUE(Report(*c, calls[0], 1, 1.0, 0.0).ok());
  const JobView v = *c->GetJob(id, false);
  ASSERT_EQ(v.slowest.size(), 2u);
  EXPECT_EQ(v.slowest[0].window, 0);
  EXPECT_EQ(v.slowest[0].slowest_rank, 1);
  EXPECT_EQ(v.slowest[0].lag_seconds, 0.5);
  EXPECT_EQ(v.slowest[1].slowest_rank, 0);
  EXPECT_EQ(ToJobInfo(v).slowest.size(), 2u);
}

// A rank of a recovering job that has not joined within the liveness timeout of the recovery's
// start fails the attempt: the next recovery, then FAILED. A pending job waits.
TEST(CoordinatorRecoveryTest, RanksThatDoNotRejoinInTimeFailTheAttempt) {
  ManualClock clock;
  CoordinatorOptions opt;
  opt.clock = &clock;
  opt.liveness_timeout = absl::Seconds(30);
  auto c = Make(opt);
  auto job = *c->SubmitJob({Spec(2, 2), "", "", 0});
  const std::string id = job.job.record.job_id;
  auto pending = *c->SubmitJob({Spec(), "", "", 0});
  auto calls = JoinAll(*c, job, 2);
  ASSERT_EQ(c->ReportFailure(calls[1], "killed")->state, JobState::kRecovering);
  WorkerCall v0 = Join(*c, job, "v0", 0);
  clock.Advance(absl::Seconds(30));
  ASSERT_TRUE(c->Heartbeat(v0).ok());
  c->CheckLiveness();
  EXPECT_EQ(c->GetJob(id, false)->record.attempt, 2);  // not past the deadline yet
  clock.Advance(absl::Seconds(1));
  ASSERT_TRUE(c->Heartbeat(v0).ok());
  c->CheckLiveness();
  auto v = *c->GetJob(id, false);
  EXPECT_EQ(v.record.state, JobState::kRecovering);
  EXPECT_EQ(v.record.attempt, 3);
  EXPECT_EQ(v.record.restarts, 2);
  EXPECT_EQ(v.record.last_recovery_reason, "rank 1 did not rejoin attempt 2 within 30s");
  EXPECT_EQ(c->Heartbeat(v0).status().code(), absl::StatusCode::kAborted);  // fenced
  // The next attempt has its own deadline; past max_restarts the job fails.
  clock.Advance(absl::Seconds(30));
  c->CheckLiveness();
  EXPECT_EQ(c->GetJob(id, false)->record.state, JobState::kRecovering);
  clock.Advance(absl::Seconds(1));
  c->CheckLiveness();
  v = *c->GetJob(id, false);
  EXPECT_EQ(v.record.state, JobState::kFailed);
  EXPECT_EQ(v.record.failure_reason,
            "ranks 0, 1 did not rejoin attempt 3 within 30s (after 2 restarts)");
  EXPECT_EQ(EventKinds(*c, id), (std::vector<std::string>{"recovery", "recovery"}));
  EXPECT_EQ(c->GetJob(pending.job.record.job_id, false)->record.state, JobState::kPending);
}

// A restarted coordinator gives a recovery in progress a fresh rejoin deadline.
TEST(CoordinatorRecoveryTest, ReopenedRecoveryGetsAFreshRejoinDeadline) {
  ScopedTempDir dir;
  const std::string db = dir.path() + "/c.db";
  ManualClock clock;
  CoordinatorOptions opt;
  opt.clock = &clock;
  opt.liveness_timeout = absl::Seconds(30);
  SubmitResult job;
  {
    auto c = Make(opt, db);
    job = *c->SubmitJob({Spec(), "", "", 0});
    auto calls = JoinAll(*c, job, 2);
    ASSERT_EQ(c->ReportFailure(calls[0], "killed")->state, JobState::kRecovering);
  }
  clock.Advance(absl::Seconds(29));
  auto c = Make(opt, db);
  const std::string id = job.job.record.job_id;
  clock.Advance(absl::Seconds(29));
  c->CheckLiveness();
  EXPECT_EQ(c->GetJob(id, false)->record.attempt, 2);
  clock.Advance(absl::Seconds(2));
  c->CheckLiveness();
  auto v = *c->GetJob(id, false);
  EXPECT_EQ(v.record.attempt, 3);
  EXPECT_EQ(v.record.last_recovery_reason, "ranks 0, 1 did not rejoin attempt 2 within 30s");
}

// The last windows' boundary arrival lag survives a restart (rebuilt from the stored reports),
// and a window half reported before it completes after it.
TEST(CoordinatorRecoveryTest, ArrivalLagIsRebuiltOnLoad) {
  ScopedTempDir dir;
  const std::string db = dir.path() + "/c.db";
  SubmitResult job;
  std::vector<WorkerCall> calls;
  {
    auto c = Make({}, db);
    job = *c->SubmitJob({Spec(), "", "", 0});
    calls = JoinAll(*c, job, 2);
    ASSERT_TRUE(Report(*c, calls[0], 0, 1.0, 0.75).ok());
    ASSERT_TRUE(Report(*c, calls[1], 0, 1.0, 0.25).ok());
    ASSERT_TRUE(Report(*c, calls[0], 1, 1.0, 0.125).ok());
    ASSERT_TRUE(Report(*c, calls[1], 1, 1.0, 0.5).ok());
    ASSERT_TRUE(Report(*c, calls[0], 2, 1.0, 0.5).ok());
  }
  auto c = Make({}, db);
  const std::string id = job.job.record.job_id;
  JobView v = *c->GetJob(id, false);
  ASSERT_EQ(v.slowest.size(), 2u);
  EXPECT_EQ(v.slowest[0].window, 0);
  EXPECT_EQ(v.slowest[0].slowest_rank, 1);
  EXPECT_EQ(v.slowest[0].lag_seconds, 0.5);
  EXPECT_EQ(v.slowest[1].window, 1);
  EXPECT_EQ(v.slowest[1].slowest_rank, 0);
  EXPECT_EQ(v.slowest[1].lag_seconds, 0.375);
  ASSERT_TRUE(Report(*c, calls[1], 2, 1.0, 0.0).ok());
  v = *c->GetJob(id, false);
  ASSERT_EQ(v.slowest.size(), 3u);
  EXPECT_EQ(v.slowest[2].window, 2);
  EXPECT_EQ(v.slowest[2].slowest_rank, 1);
  EXPECT_EQ(v.slowest[2].lag_seconds, 0.5);
}

TEST(CoordinatorRecoveryTest, NewestCheckpointWinsAndACancelEndsARecovery) {
  auto c = Make();
  auto job = *c->SubmitJob({Spec(), "", "", 0});
  const std::string id = job.job.record.job_id;
  auto calls = JoinAll(*c, job, 2);
  for (const auto& call : calls) ASSERT_TRUE(Report(*c, call, 0, 1.0).ok());
  for (const auto& call : calls) ASSERT_TRUE(Report(*c, call, 1, 1.0).ok());
  ASSERT_TRUE(Checkpoint(*c, calls[0], 1, "one").ok());
  ASSERT_TRUE(Checkpoint(*c, calls[0], 0, "zero").ok());  // late report of an older one
  EXPECT_EQ(Checkpoint(*c, calls[0], 0, "").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Checkpoint(*c, calls[0], 99, "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c->GetJob(id, false)->record.last_checkpoint_step, 1);
  ASSERT_TRUE(c->ReportFailure(calls[0], "gone").ok());
  auto v = *c->GetJob(id, false);
  EXPECT_EQ(v.record.resume_step, 1);
  EXPECT_EQ(v.record.resume_manifest_sha256, "one");
  auto cancelled = c->CancelJob(id, "");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->record.state, JobState::kCancelled);
  JoinArgs late;
  late.call = {id, job.join_token, "v0", -1, 0};
  EXPECT_EQ(c->Join(late).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(HangDetectorTest, FurthestBehindInThePlanIsTheCulprit) {
  auto at = [](int rank, int64_t window, RankPhase phase, int64_t seq, double seconds) {
    RankWatch w;
    w.rank = rank;
    w.position.window = window;
    w.position.micro_batch = 0;
    w.position.phase = phase;
    w.position.seq = seq;
    if (phase == RankPhase::kCollective) {
      w.position.op = "all_gather";
      w.position.group = "dp";
    }
    w.position.seconds = seconds;
    w.since_heartbeat = absl::Milliseconds(500);
    return w;
  };
  const absl::Duration timeout = absl::Seconds(10);
  const absl::Duration silent = absl::Seconds(2);
  // Nobody past the timeout: no verdict; an idle rank alone never is one.
  EXPECT_FALSE(
      FindStall({at(0, 4, RankPhase::kCollective, 7, 9), at(1, 4, RankPhase::kCompute, 6, 9)},
                timeout, silent));
  EXPECT_FALSE(FindStall({at(0, -1, RankPhase::kIdle, 0, 60)}, timeout, silent));
  // At the same seq, a rank computing is behind one inside collective #seq.
  auto v = FindStall({at(0, 4, RankPhase::kCollective, 7, 30), at(1, 4, RankPhase::kCompute, 7, 2),
                      at(2, 4, RankPhase::kCollective, 7, 30)},
                     timeout, silent);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->stalled.rank, 1);
  EXPECT_EQ(v->message,
            "rank 1 stalled in window 4, micro-batch 0 (compute) for 2 s; ranks 0,2 waiting in "
            "all_gather/dp #7");
  // An earlier window is further behind than any seq of a later one.
  v = FindStall({at(0, 5, RankPhase::kLatch, 0, 30), at(1, 4, RankPhase::kCollective, 9, 30)},
                timeout, silent);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->stalled.rank, 1);
  EXPECT_EQ(v->message,
            "rank 1 stalled in window 4, micro-batch 0 (all_gather/dp #9) for 30 s; rank 0 "
            "waiting in latch");
}

}  // namespace
}  // namespace latchkey
