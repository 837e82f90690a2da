#include "server/coordinator.h"

#include <unistd.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/job_spec.h"
#include "common/latch.h"
#include "gtest/gtest.h"
#include "server/sqlite_store.h"
#include "tests/support/specs.h"
#include "tests/support/temp_dir.h"

namespace latchkey {
namespace {

using testing::ScopedTempDir;
using testing::SpecJson;
using testing::SpecParams;

// The default spec with latchkey.max_restarts 0: a failure fails the job.
std::string NoRestartsSpec() {
  SpecParams p;
  p.extra_latchkey = {{"max_restarts", 0}};
  return SpecJson(p);
}

std::unique_ptr<Coordinator> Make(CoordinatorOptions opt = {}, const std::string& db = ":memory:") {
  auto store = SqliteStore::Open(db);
  EXPECT_TRUE(store.ok()) << store.status();
  auto c = Coordinator::Create(*std::move(store), opt, nullptr);
  EXPECT_TRUE(c.ok()) << c.status();
  return *std::move(c);
}

WorkerCall Call(const SubmitResult& job, const std::string& worker, int rank = -1) {
  return WorkerCall{job.job.record.job_id, job.join_token, worker, rank};
}

// Joins world_size workers named w0.. and returns their ranks' calls.
std::vector<WorkerCall> JoinAll(Coordinator& c, const SubmitResult& job, int world) {
  std::vector<WorkerCall> calls;
  for (int i = 0; i < world; ++i) {
    JoinArgs a;
    a.call = Call(job, "w" + std::to_string(i));
    a.peer_host = "127.0.0.1";
    auto r = c.Join(a);
    EXPECT_TRUE(r.ok()) << r.status();
    calls.push_back(Call(job, a.call.worker_id, r->rank));
  }
  return calls;
}

std::vector<PublishedLatch> Latches(Coordinator& c, const WorkerCall& call, int64_t from) {
  auto b = c.WaitLatches(call, from, 1000, absl::Now());
  EXPECT_TRUE(b.ok() || absl::IsDeadlineExceeded(b.status())) << b.status();
  return b.ok() ? b->latches : std::vector<PublishedLatch>{};
}

StepReportRecord ReportOf(int64_t step, int64_t gen) {
  StepReportRecord r;
  r.report.step = step;
  r.report.latch_generation = gen;
  r.report.loss = 1.0 / (step + 1);
  r.report.tokens = 128;
  r.report.step_seconds = 0.01;
  return r;
}

absl::Status Report(Coordinator& c, const WorkerCall& call, int64_t step, int64_t gen) {
  return c.ReportStep(call, ReportOf(step, gen)).status();
}

TEST(CoordinatorTest, SubmitValidatesNamingTheField) {
  auto c = Make();
  SpecParams p;
  p.tp = 3;
  p.world_size = 3;
  auto r = c->SubmitJob({SpecJson(p), "", "", 0});
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("tensor_parallel.autotp_size"), absl::string_view::npos)
      << r.status();
  p = SpecParams();
  p.zero_stage = 3;
  r = c->SubmitJob({SpecJson(p), "", "", 0});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("zero_optimization.stage"), absl::string_view::npos);
  r = c->SubmitJob({std::string(300 * 1024, ' '), "", "", 0});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CoordinatorTest, JoinAssignsRanksIdempotentlyAndRefusesConflicts) {
  auto c = Make();
  auto job = c->SubmitJob({SpecJson(), "/data", "", 0});
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->job.record.state, JobState::kPending);
  EXPECT_EQ(job->job.record.rendezvous_port, 29500);

  JoinArgs a;
  a.call = Call(*job, "alpha");
  a.requested_rank = 1;
  a.advertise_host = "node-b";
  a.node = "node-1";  // one node (an agent's identity) at two addresses: the TP group may form
  auto r1 = c->Join(a);
  ASSERT_TRUE(r1.ok()) << r1.status();
  EXPECT_EQ(r1->rank, 1);
  EXPECT_EQ(r1->rendezvous_host, "");  // rank 0 not joined, no host named at submit
  EXPECT_EQ(c->Join(a)->rank, 1);      // idempotent

  JoinArgs b = a;
  b.call.worker_id = "beta";
  EXPECT_EQ(c->Join(b).status().code(), absl::StatusCode::kAborted);  // rank 1 is alpha's
  b.requested_rank = 7;
  EXPECT_EQ(c->Join(b).status().code(), absl::StatusCode::kInvalidArgument);
  b.requested_rank.reset();
  b.advertise_host = "node-a";
  auto r0 = c->Join(b);
  ASSERT_TRUE(r0.ok());
  EXPECT_EQ(r0->rank, 0);
  EXPECT_EQ(r0->rendezvous_host, "node-a");  // rank 0's host hosts the store
  EXPECT_EQ(r0->base_dir, "/data");
  EXPECT_EQ(c->GetJob(job->job.record.job_id, false)->record.state, JobState::kRunning);

  JoinArgs late = b;
  late.call.worker_id = "gamma";
  EXPECT_EQ(c->Join(late).status().code(), absl::StatusCode::kAborted);  // full
  late.call.join_token = "wrong";
  EXPECT_EQ(c->Join(late).status().code(), absl::StatusCode::kUnauthenticated);
  late.call.job_id = "job-999999";
  EXPECT_EQ(c->Join(late).status().code(), absl::StatusCode::kNotFound);
}

TEST(CoordinatorTest, PublishesWithinLookaheadAndSucceeds) {
  CoordinatorOptions opt;
  opt.latch_lookahead = 2;
  auto c = Make(opt);
  SpecParams p;
  p.steps = 6;
  auto job = c->SubmitJob({SpecJson(p), "", "", 0});
  auto calls = JoinAll(*c, *job, 2);
  auto l = Latches(*c, calls[0], 0);
  ASSERT_EQ(l.size(), 3u);  // window 0 plus two ahead
  EXPECT_EQ(l[2].latch.first_micro_batch, 8);
  EXPECT_EQ(l[0].latch.kv_mode, KvMode::kCoalesced);
  EXPECT_EQ(l[0].latch.no_sync, (std::vector<bool>{true, true, true, false}));

  EXPECT_EQ(Report(*c, calls[0], 5, 0).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Report(*c, calls[0], 0, 7).code(), absl::StatusCode::kAborted);  // wrong generation
  ASSERT_TRUE(Report(*c, calls[0], 0, 0).ok());
  EXPECT_EQ(Latches(*c, calls[0], 3).size(), 0u);  // slowest rank (1) is still at window 0
  ASSERT_TRUE(Report(*c, calls[1], 0, 0).ok());
  EXPECT_EQ(Latches(*c, calls[0], 3).size(), 1u);
  auto dup = c->ReportStep(calls[1], ReportOf(0, 0));  // a retry: the report sent again
  ASSERT_TRUE(dup.ok()) << dup.status();
  EXPECT_TRUE(dup->duplicate);

  for (int64_t s = 1; s < 6; ++s) {
    for (const auto& call : calls) ASSERT_TRUE(Report(*c, call, s, 0).ok()) << s;
  }
  auto v = c->GetJob(job->job.record.job_id, true);
  EXPECT_EQ(v->record.state, JobState::kSucceeded);
  EXPECT_EQ(v->steps_completed, 6);
  ASSERT_TRUE(v->last_step.has_value());
  EXPECT_EQ(v->last_step->report.step, 5);
  EXPECT_EQ(v->last_step->ranks_reported, 2);
  EXPECT_EQ(v->workers[0].state, WorkerState::kDone);
  auto end = c->WaitLatches(calls[0], 6, 10, absl::Now());
  ASSERT_TRUE(end.ok());
  EXPECT_TRUE(end->job_ended);
}

TEST(CoordinatorTest, PolicyUpdateStartsAtFirstUnpublishedWindowAndKeepsDataOrder) {
  CoordinatorOptions opt;
  opt.latch_lookahead = 1;
  auto c = Make(opt);
  SpecParams p;
  p.steps = 8;
  auto job = c->SubmitJob({SpecJson(p), "", "", 0});
  const std::string id = job->job.record.job_id;
  auto calls = JoinAll(*c, *job, 2);  // publishes windows 0, 1
  JobPolicyUpdate u;
  u.job_id = id;
  u.gradient_accumulation_steps = 2;
  u.kv_reduce = KvReducePolicy::kDeferred;
  u.expected_generation = 0;
  auto r = c->UpdateJobPolicy(u);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->first_window, 2);
  EXPECT_EQ(r->policy.generation, 1);
  EXPECT_EQ(c->UpdateJobPolicy(u).status().code(), absl::StatusCode::kAborted);  // stale

  for (int64_t s = 0; s < 3; ++s) {
    for (const auto& call : calls) ASSERT_TRUE(Report(*c, call, s, s < 2 ? 0 : 1).ok()) << s;
  }
  auto l = Latches(*c, calls[1], 0);
  ASSERT_GE(l.size(), 4u);
  EXPECT_EQ(l[1].latch.n, 4);
  EXPECT_EQ(l[1].latch.generation, 0);
  EXPECT_EQ(l[2].latch.n, 2);
  EXPECT_EQ(l[2].latch.generation, 1);
  EXPECT_EQ(l[2].latch.kv_mode, KvMode::kDeferred);
  EXPECT_EQ(l[2].latch.first_micro_batch, 8);   // 4 + 4
  EXPECT_EQ(l[3].latch.first_micro_batch, 10);  // + 2
  // The stream positions follow the micro-batches: DP * MB of them each.
  const int64_t per = SamplesPerMicroBatch(*ParseJobSpec(SpecJson(p), ""));
  EXPECT_EQ(l[2].latch.first_sample, 8 * per);
  EXPECT_EQ(l[3].latch.first_sample, 10 * per);
  auto audit = c->ListLatches(id, 0, 0);
  ASSERT_TRUE(audit.ok());
  ASSERT_EQ(audit->policy_changes.size(), 1u);
  EXPECT_EQ(audit->policy_changes[0].first_window, 2);

  JobPolicyUpdate bad;
  bad.job_id = id;
  EXPECT_EQ(c->UpdateJobPolicy(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad.gradient_accumulation_steps = 0;
  EXPECT_EQ(c->UpdateJobPolicy(bad).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(c->CancelJob(id, "").ok());
  bad.gradient_accumulation_steps = 3;
  EXPECT_EQ(c->UpdateJobPolicy(bad).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(c->CancelJob(id, "").status().code(), absl::StatusCode::kFailedPrecondition);
}

// The status page's read (the store's own read-only connection, no coordinator lock) returns
// what ListLatches returns, page limits and errors included.
TEST(CoordinatorTest, ReadAuditIsListLatchesOffTheLock) {
  ScopedTempDir dir;
  CoordinatorOptions opt;
  opt.latch_lookahead = 3;
  auto c = Make(opt, dir.path() + "/c.db");
  auto job = c->SubmitJob({SpecJson(), "", "", 0});
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string id = job->job.record.job_id;
  JoinAll(*c, *job, 2);  // publishes windows 0..3
  JobPolicyUpdate u;
  u.job_id = id;
  u.gradient_accumulation_steps = 2;
  ASSERT_TRUE(c->UpdateJobPolicy(u).ok());
  ASSERT_TRUE(c->CancelJob(id, "enough").ok());
  for (const auto& [from, limit] : std::vector<std::pair<int64_t, int>>{{0, 0}, {1, 2}, {3, 20}}) {
    auto want = c->ListLatches(id, from, limit);
    auto got = c->ReadAudit(id, from, limit);
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->latches.size(), want->latches.size()) << from;
    for (size_t i = 0; i < want->latches.size(); ++i) {
      EXPECT_EQ(got->latches[i].latch, want->latches[i].latch);
      EXPECT_EQ(got->latches[i].publish_time, want->latches[i].publish_time);
    }
    EXPECT_EQ(got->next_start_window, want->next_start_window);
    ASSERT_EQ(got->policy_changes.size(), want->policy_changes.size());
    EXPECT_EQ(got->policy_changes[0].first_window, want->policy_changes[0].first_window);
    ASSERT_EQ(got->events.size(), want->events.size());
  }
  EXPECT_GE(c->ReadAudit(id, 0, 0)->latches.size(), 4u);
  EXPECT_EQ(c->ReadAudit(id, 1, 2)->next_start_window, 3);
  EXPECT_EQ(c->ReadAudit("job-404", 0, 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c->ReadAudit(id, -1, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c->ReadAudit(id, 0, -1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CoordinatorTest, GasUpdateRefusedForUnmanagedSchedule) {
  auto c = Make();
  SpecParams p;
  p.managed = false;
  p.extra_latchkey = {{"window_schedule", {1, 3}}};
  auto job = c->SubmitJob({SpecJson(p), "", "", 0});
  ASSERT_TRUE(job.ok()) << job.status();
  JobPolicyUpdate u;
  u.job_id = job->job.record.job_id;
  u.gradient_accumulation_steps = 2;
  EXPECT_EQ(c->UpdateJobPolicy(u).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CoordinatorTest, MissedLivenessDeadlineFailsJobNamingRank) {
  ManualClock clock;
  CoordinatorOptions opt;
  opt.liveness_timeout = absl::Seconds(30);
  opt.clock = &clock;
  auto c = Make(opt);
  auto job = c->SubmitJob({NoRestartsSpec(), "", "", 0});
  auto calls = JoinAll(*c, *job, 2);
  const std::string id = job->job.record.job_id;
  clock.Advance(absl::Seconds(20));
  ASSERT_TRUE(c->Heartbeat(calls[0]).ok());  // rank 0 is alive, rank 1 is not
  c->CheckLiveness();
  EXPECT_EQ(c->GetJob(id, false)->record.state, JobState::kRunning);  // 20 s: within the deadline
  clock.Advance(absl::Seconds(11));  // rank 1: 31 s unseen; rank 0: 11 s
  c->CheckLiveness();
  auto v = c->GetJob(id, true);
  EXPECT_EQ(v->record.state, JobState::kFailed);
  EXPECT_NE(v->record.failure_reason.find("rank 1 (worker w1, unseen for 31s)"), std::string::npos)
      << v->record.failure_reason;
  EXPECT_EQ(v->record.failure_reason.find("rank 0"), std::string::npos) << v->record.failure_reason;
  EXPECT_EQ(v->workers[0].state, WorkerState::kDone);
  EXPECT_EQ(v->workers[1].state, WorkerState::kLost);
  auto end = c->WaitLatches(calls[0], 0, 10, absl::Now());
  ASSERT_TRUE(end.ok());
  EXPECT_TRUE(end->job_ended);
  EXPECT_EQ(end->state, JobState::kFailed);
}

class NullListener : public JobListener {
 public:
  void OnJobChanged() override {}
};

TEST(CoordinatorTest, OpenLatchStreamKeepsARankAliveAndItsEndStartsTheDeadline) {
  ManualClock clock;
  CoordinatorOptions opt;
  opt.liveness_timeout = absl::Seconds(30);
  opt.clock = &clock;
  auto c = Make(opt);
  auto job = c->SubmitJob({NoRestartsSpec(), "", "", 0});
  auto calls = JoinAll(*c, *job, 2);
  const std::string id = job->job.record.job_id;
  auto sub = c->SubscribeLatches(calls[1], std::make_shared<NullListener>());
  ASSERT_TRUE(sub.ok()) << sub.status();
  for (int i = 0; i < 4; ++i) {  // two minutes: rank 0 heartbeats, rank 1 only has its stream
    clock.Advance(absl::Seconds(29));
    ASSERT_TRUE(c->Heartbeat(calls[0]).ok());
    c->CheckLiveness();
    ASSERT_EQ(c->GetJob(id, false)->record.state, JobState::kRunning) << i;
  }
  c->Unsubscribe(*sub);
  clock.Advance(absl::Seconds(29));
  ASSERT_TRUE(c->Heartbeat(calls[0]).ok());
  c->CheckLiveness();
  EXPECT_EQ(c->GetJob(id, false)->record.state, JobState::kRunning);
  clock.Advance(absl::Seconds(2));  // 31 s after the stream closed
  ASSERT_TRUE(c->Heartbeat(calls[0]).ok());
  c->CheckLiveness();
  auto v = c->GetJob(id, false);
  EXPECT_EQ(v->record.state, JobState::kFailed);
  EXPECT_NE(v->record.failure_reason.find("rank 1 (worker w1"), std::string::npos)
      << v->record.failure_reason;
}

TEST(CoordinatorTest, RecordsAreStampedWithTheInjectedClock) {
  ManualClock clock(absl::FromUnixSeconds(1000));
  CoordinatorOptions opt;
  opt.clock = &clock;
  auto c = Make(opt);
  auto job = c->SubmitJob({SpecJson(), "", "", 0});
  EXPECT_EQ(job->job.record.create_time, absl::FromUnixSeconds(1000));
  clock.Advance(absl::Seconds(5));
  auto calls = JoinAll(*c, *job, 2);
  auto latches = Latches(*c, calls[0], 0);
  ASSERT_FALSE(latches.empty());
  EXPECT_EQ(latches[0].publish_time, absl::FromUnixSeconds(1005));
  auto v = c->GetJob(job->job.record.job_id, true);
  EXPECT_EQ(v->record.update_time, absl::FromUnixSeconds(1005));
  EXPECT_EQ(v->workers[0].last_seen, absl::FromUnixSeconds(1005));
}

TEST(CoordinatorTest, WorkerFailureFailsJobWithItsMessage) {
  auto c = Make();
  auto job = c->SubmitJob({NoRestartsSpec(), "", "", 0});
  auto calls = JoinAll(*c, *job, 2);
  auto r = c->ReportFailure(calls[1], "latchkey.data.tokens_file: /x/data.bin not found");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->state, JobState::kFailed);
  EXPECT_NE(r->reason.find("latchkey.data.tokens_file"), std::string::npos);
}

TEST(CoordinatorTest, OldLatchesAreServedFromTheStoreToAResumingWorker) {
  auto c = Make();
  SpecParams p;
  p.steps = 60;
  auto job = c->SubmitJob({SpecJson(p), "", "", 0});
  auto calls = JoinAll(*c, *job, 2);
  std::vector<PublishedLatch> seen;
  for (int64_t s = 0; s < 40; ++s) {
    auto l = Latches(*c, calls[0], s);
    ASSERT_FALSE(l.empty()) << s;
    seen.push_back(l.front());
    for (const auto& call : calls) ASSERT_TRUE(Report(*c, call, s, 0).ok()) << s;
  }
  // A worker restarting from window 0 (e.g. from a checkpoint) gets the very same latches,
  // although the coordinator no longer keeps them in memory.
  std::vector<PublishedLatch> again = Latches(*c, calls[1], 0);
  ASSERT_GE(again.size(), 40u);
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(again[i].latch, seen[i].latch) << i;
  EXPECT_TRUE(Report(*c, calls[0], 3, 0).ok());  // an old duplicate is still recognised
}

// The step's summary takes rank 0's lr and eval loss, whichever rank reports first, and keeps
// "no evaluation" apart from an evaluation loss of 0; both survive a restart.
TEST(CoordinatorTest, StepSummaryCarriesRankZerosLrAndEvalLossAcrossARestart) {
  ScopedTempDir dir;
  const std::string db = dir.path() + "/c.db";
  SubmitResult job;
  auto report = [](Coordinator& c, const WorkerCall& call, int64_t step, double lr,
                   std::optional<double> eval) {
    StepReportRecord r;
    r.report.step = step;
    r.report.lr = lr;
    r.report.eval_loss = eval;
    return c.ReportStep(call, r).status();
  };
  {
    auto c = Make({}, db);
    SpecParams p;
    p.steps = 4;
    job = *c->SubmitJob({SpecJson(p), "", "", 0});
    auto calls = JoinAll(*c, job, 2);
    ASSERT_EQ(calls[1].rank, 1);
    ASSERT_TRUE(report(*c, calls[1], 0, 9.0, 99.0).ok());  // rank 1 first
    ASSERT_TRUE(report(*c, calls[0], 0, 1e-3, std::nullopt).ok());
    ASSERT_TRUE(report(*c, calls[1], 1, 9.0, std::nullopt).ok());
    ASSERT_TRUE(report(*c, calls[0], 1, 7.5e-4, 2.5).ok());
    auto v = c->GetJob(job.job.record.job_id, false);
    ASSERT_TRUE(v.ok() && v->last_step.has_value());
    EXPECT_EQ(v->last_step->report.lr, 7.5e-4);
    EXPECT_EQ(v->last_step->report.eval_loss, std::optional<double>(2.5));
    auto watch = c->WaitJobChange(job.job.record.job_id, 0, -1, absl::Now());
    ASSERT_TRUE(watch.ok()) << watch.status();
    ASSERT_EQ(watch->steps.size(), 2u);
    EXPECT_EQ(watch->steps[0].report.lr, 1e-3);
    EXPECT_FALSE(watch->steps[0].report.eval_loss.has_value());  // rank 1's is not the step's
  }
  auto c = Make({}, db);
  auto v = c->GetJob(job.job.record.job_id, false);
  ASSERT_TRUE(v.ok() && v->last_step.has_value());
  EXPECT_EQ(v->last_step->report.step, 1);
  EXPECT_EQ(v->last_step->report.lr, 7.5e-4);
  EXPECT_EQ(v->last_step->report.eval_loss, std::optional<double>(2.5));
  ASSERT_TRUE(report(*c, Call(job, "w1", 1), 2, 9.0, 0.0).ok());
  ASSERT_TRUE(report(*c, Call(job, "w0", 0), 2, 5e-4, 0.0).ok());
  v = c->GetJob(job.job.record.job_id, false);
  ASSERT_TRUE(v.ok() && v->last_step.has_value());
  EXPECT_EQ(v->last_step->report.lr, 5e-4);
  EXPECT_EQ(v->last_step->report.eval_loss, std::optional<double>(0.0));
}

TEST(CoordinatorTest, RestartOnSameFileServesSameLatchesAndState) {
  ScopedTempDir dir;
  const std::string db = dir.path() + "/c.db";
  std::vector<PublishedLatch> before;
  std::string id;
  SubmitResult job;
  {
    auto c = Make({}, db);
    SpecParams p;
    p.steps = 5;
    job = *c->SubmitJob({SpecJson(p), "", "", 0});
    id = job.job.record.job_id;
    auto calls = JoinAll(*c, job, 2);
    for (const auto& call : calls) ASSERT_TRUE(Report(*c, call, 0, 0).ok());
    JobPolicyUpdate u;
    u.job_id = id;
    u.gradient_accumulation_steps = 1;
    ASSERT_TRUE(c->UpdateJobPolicy(u).ok());
    ASSERT_TRUE(Report(*c, calls[0], 1, 0).ok());
    before = Latches(*c, calls[0], 0);
  }
  auto c = Make({}, db);
  auto v = c->GetJob(id, true);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->record.state, JobState::kRunning);
  EXPECT_EQ(v->workers_joined, 2);
  EXPECT_EQ(v->workers[0].steps_reported, 2);
  EXPECT_EQ(v->steps_completed, 1);
  EXPECT_EQ(v->record.policy.generation, 1);
  auto after = Latches(*c, Call(job, "w0", 0), 0);
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(after[i].latch, before[i].latch) << i;
  // The duplicate report from before the restart is still recognised.
  auto dup = c->ReportStep(Call(job, "w0", 0), ReportOf(1, 0));
  ASSERT_TRUE(dup.ok()) << dup.status();
  EXPECT_TRUE(dup->duplicate);
  // Next job id continues the sequence.
  EXPECT_EQ(c->SubmitJob({SpecJson(), "", "", 0})->job.record.seq, 2);
}

// A job's heartbeat interval: the configured one up to job_heartbeats_per_second x it ranks,
// then world_size / job_heartbeats_per_second, never past a third of the liveness timeout; the
// interval Join tells a 16,384-rank job's workers.
TEST(CoordinatorTest, LargeJobsAreToldALongerHeartbeatInterval) {
  CoordinatorOptions opt;  // 1 s, 4,096 a second, liveness 30 s
  auto c = Make(opt);
  EXPECT_EQ(c->HeartbeatInterval(2), absl::Seconds(1));
  EXPECT_EQ(c->HeartbeatInterval(4096), absl::Seconds(1));
  EXPECT_EQ(c->HeartbeatInterval(8192), absl::Seconds(2));
  EXPECT_EQ(c->HeartbeatInterval(16384), absl::Seconds(4));
  EXPECT_EQ(c->HeartbeatInterval(65536), absl::Seconds(10));  // liveness 30 s / 3
  opt.job_heartbeats_per_second = 0;
  EXPECT_EQ(Make(opt)->HeartbeatInterval(65536), absl::Seconds(1));

  SpecParams p;
  p.world_size = 16384;
  auto job = c->SubmitJob({SpecJson(p), "", "", 0});
  ASSERT_TRUE(job.ok()) << job.status();
  JoinArgs a;
  a.call = Call(*job, "w0");
  a.requested_rank = 0;
  a.peer_host = "127.0.0.1";
  auto joined = c->Join(a);
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(joined->heartbeat_interval, absl::Seconds(4));
}

}  // namespace
}  // namespace latchkey
