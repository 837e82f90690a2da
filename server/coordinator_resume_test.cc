// Resuming an ended job (Coordinator::ResumeJob, docs/fault-tolerance.md "Resuming a job"): a
// failed or cancelled job continues from its newest committed checkpoint as a new attempt,
// persisted, with a "resumed" event; no restart is spent and max_restarts counts from there;
// every other state is refused naming it. Real SQLite, a ManualClock.
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/job_uid.h"
#include "gtest/gtest.h"
#include "server/coordinator.h"
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

std::string Spec(int max_restarts = 3) {
  SpecParams p;
  p.world_size = 2;
  p.steps = 6;
  p.extra_latchkey["max_restarts"] = max_restarts;
  return SpecJson(p);
}

WorkerCall Join(Coordinator& c, const SubmitResult& job, const std::string& worker, int rank) {
  JoinArgs a;
  a.call = {job.job.record.job_id, job.join_token, worker, -1, 0};
  a.requested_rank = rank;
  a.peer_host = "127.0.0.1";
  auto r = c.Join(a);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return {};
  return {job.job.record.job_id, job.join_token, worker, r->rank, r->attempt};
}

std::vector<WorkerCall> JoinAll(Coordinator& c, const SubmitResult& job,
                                const std::string& prefix) {
  return {Join(c, job, prefix + "0", 0), Join(c, job, prefix + "1", 1)};
}

void Steps(Coordinator& c, const std::vector<WorkerCall>& calls, int64_t from, int64_t to) {
  for (int64_t s = from; s <= to; ++s) {
    for (const WorkerCall& call : calls) {
      auto r = [&] {
        StepReportRecord rec;
        rec.report.step = s;
        rec.report.loss = 3.0 - 0.125 * static_cast<double>(s);  // a re-run reports the same
        rec.report.tokens = 128;
        return c.ReportStep(call, rec);
      }();
      ASSERT_TRUE(r.ok()) << "step " << s << ": " << r.status();
    }
  }
}

absl::Status Checkpoint(Coordinator& c, const WorkerCall& call, int64_t step,
                        const std::string& sha) {
  CheckpointReport r;
  r.step = step;
  r.manifest_sha256 = sha;
  r.bytes = 1000;
  return c.ReportCheckpoint(call, r).status();
}

std::vector<JobEventRecord> Events(Coordinator& c, const std::string& id, const std::string& kind) {
  auto audit = c.ListLatches(id, 0, 0);
  EXPECT_TRUE(audit.ok()) << audit.status();
  std::vector<JobEventRecord> out;
  if (!audit.ok()) return out;
  for (const JobEventRecord& e : audit->events) {
    if (e.kind == kind) out.push_back(e);
  }
  return out;
}

TEST(CoordinatorResumeTest, ACancelledJobResumesFromItsCheckpointAndSucceeds) {
  ScopedTempDir dir;
  const std::string db = dir.path() + "/coordinator.db";
  std::string id;
  SubmitResult job;
  {
    auto c = Make({}, db);
    job = *c->SubmitJob({Spec(), "", "", 0});
    id = job.job.record.job_id;
    auto calls = JoinAll(*c, job, "w");
    Steps(*c, calls, 0, 3);
    ASSERT_TRUE(Checkpoint(*c, calls[0], 2, "two").ok());
    ASSERT_TRUE(c->CancelJob(id, "stop for the night").ok());

    auto resumed = c->ResumeJob(id, "");
    ASSERT_TRUE(resumed.ok()) << resumed.status();
    EXPECT_EQ(resumed->record.state, JobState::kRecovering);
    EXPECT_EQ(resumed->record.attempt, 2);
    EXPECT_EQ(resumed->record.restarts, 0);  // the user's decision spends none
    EXPECT_EQ(resumed->record.resume_step, 2);
    EXPECT_EQ(resumed->record.resume_manifest_sha256, "two");
    EXPECT_EQ(resumed->record.last_recovery_reason, "resumed by user");
    EXPECT_TRUE(resumed->record.failure_reason.empty()) << resumed->record.failure_reason;
    EXPECT_EQ(resumed->workers_joined, 0);
    // The old attempt's workers are fenced.
    StepReportRecord old;
    old.report.step = 4;
    EXPECT_EQ(c->ReportStep(calls[0], old).status().code(), absl::StatusCode::kAborted);
    const auto events = Events(*c, id, "resumed");
    ASSERT_EQ(events.size(), 1u);
    EXPECT_EQ(events[0].attempt, 2);
    EXPECT_EQ(events[0].message,
              "attempt 2 (resumed after cancelled; no restart spent, max_restarts 3 counts from "
              "here) resumes from the checkpoint after step 2: resumed by user");
  }
  // Persisted like a recovery: a restarted coordinator has the resumed attempt, and its new
  // workers run it to the end from the step after the checkpoint.
  auto c = Make({}, db);
  auto v = *c->GetJob(id, false);
  EXPECT_EQ(v.record.state, JobState::kRecovering);
  EXPECT_EQ(v.record.attempt, 2);
  EXPECT_EQ(v.record.resume_step, 2);
  auto calls = JoinAll(*c, job, "v");
  EXPECT_EQ(calls[0].attempt, 2);
  EXPECT_EQ(c->GetJob(id, false)->record.state, JobState::kRunning);
  Steps(*c, calls, 3, 5);
  v = *c->GetJob(id, false);
  EXPECT_EQ(v.record.state, JobState::kSucceeded) << v.record.failure_reason;
  EXPECT_EQ(v.steps_completed, 6);
}

TEST(CoordinatorResumeTest, MaxRestartsCountsFromTheResume) {
  auto c = Make();
  auto job = *c->SubmitJob({Spec(/*max_restarts=*/1), "", "", 0});
  const std::string id = job.job.record.job_id;
  auto calls = JoinAll(*c, job, "a");
  Steps(*c, calls, 0, 1);
  ASSERT_EQ(c->ReportFailure(calls[0], "first")->state, JobState::kRecovering);
  calls = JoinAll(*c, job, "b");
  ASSERT_EQ(c->ReportFailure(calls[0], "second")->state, JobState::kFailed);
  EXPECT_EQ(c->GetJob(id, false)->record.restarts, 1);

  // No checkpoint was committed: the resumed attempt starts over, and says so.
  auto resumed = c->ResumeJob(id, "the disk is back");
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->record.attempt, 3);
  EXPECT_EQ(resumed->record.restarts, 0);
  EXPECT_EQ(resumed->record.resume_step, -1);
  const auto events = Events(*c, id, "resumed");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_NE(events[0].message.find("(resumed after failed; no restart spent"), std::string::npos)
      << events[0].message;
  EXPECT_NE(events[0].message.find("resumes from the start: the disk is back"), std::string::npos)
      << events[0].message;
  // One restart again (max_restarts 1 from the resume), then the job fails.
  calls = JoinAll(*c, job, "c");
  auto r = c->ReportFailure(calls[1], "third");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->state, JobState::kRecovering);
  EXPECT_EQ(c->GetJob(id, false)->record.restarts, 1);
  calls = JoinAll(*c, job, "d");
  EXPECT_EQ(c->ReportFailure(calls[1], "fourth")->state, JobState::kFailed);
  EXPECT_NE(c->GetJob(id, false)->record.failure_reason.find("fourth (after 1 restart)"),
            std::string::npos)
      << c->GetJob(id, false)->record.failure_reason;
}

TEST(CoordinatorResumeTest, OnlyAFailedCancelledOrSuspendedJobResumes) {
  auto c = Make();
  auto job = *c->SubmitJob({Spec(), "", "", 0});
  const std::string id = job.job.record.job_id;
  auto refused = [&](const std::string& state) {
    auto r = c->ResumeJob(id, "");
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
    EXPECT_EQ(r.status().message(),
              id + ": is " + state + "; only a failed, cancelled or suspended job can be resumed");
  };
  refused("pending");
  auto calls = JoinAll(*c, job, "w");
  refused("running");
  ASSERT_EQ(c->ReportFailure(calls[0], "lost")->state, JobState::kRecovering);
  refused("recovering");
  calls = JoinAll(*c, job, "v");
  Steps(*c, calls, 0, 5);
  ASSERT_EQ(c->GetJob(id, false)->record.state, JobState::kSucceeded);
  refused("succeeded");
  EXPECT_EQ(c->GetJob(id, false)->record.attempt, 2);  // nothing changed
  EXPECT_EQ(c->ResumeJob("job-999999", "").status().code(), absl::StatusCode::kNotFound);
}

// The user starts the workers after resuming: the rejoin window opens at the first join, not
// at the resume.
TEST(CoordinatorResumeTest, TheRejoinWindowOpensAtTheFirstJoin) {
  ManualClock clock;
  CoordinatorOptions opt;
  opt.clock = &clock;
  opt.liveness_timeout = absl::Seconds(30);
  auto c = Make(opt);
  auto job = *c->SubmitJob({Spec(), "", "", 0});
  const std::string id = job.job.record.job_id;
  ASSERT_TRUE(c->CancelJob(id, "").ok());  // cancelled while pending
  ASSERT_TRUE(c->ResumeJob(id, "").ok());
  clock.Advance(absl::Minutes(10));
  c->CheckLiveness();
  EXPECT_EQ(c->GetJob(id, false)->record.attempt, 2);  // still waiting for its workers
  WorkerCall w0 = Join(*c, job, "w0", 0);
  clock.Advance(absl::Seconds(30));
  ASSERT_TRUE(c->Heartbeat(w0).ok());
  c->CheckLiveness();
  EXPECT_EQ(c->GetJob(id, false)->record.attempt, 2);
  clock.Advance(absl::Seconds(1));
  ASSERT_TRUE(c->Heartbeat(w0).ok());
  c->CheckLiveness();
  auto v = *c->GetJob(id, false);
  EXPECT_EQ(v.record.attempt, 3);
  EXPECT_EQ(v.record.restarts, 1);
  EXPECT_EQ(v.record.last_recovery_reason, "rank 1 did not rejoin attempt 2 within 30s");
}

// A job's uid (the identity its checkpoints carry) is drawn at submit, differs between the
// job-000001 of two coordinators, reaches every rank at Join and GetJob, and stays the same
// through a recovery, a resume and a restart of the coordinator.
TEST(CoordinatorResumeTest, TheJobUidIsDrawnAtSubmitAndKeptAcrossAttemptsAndRestarts) {
  ScopedTempDir dir;
  const std::string db = dir.path() + "/coordinator.db";
  auto other = Make();  // another coordinator, its own database
  const SubmitResult elsewhere = *other->SubmitJob({Spec(), "", "", 0});
  std::string uid;
  SubmitResult job;
  {
    auto c = Make({}, db);
    job = *c->SubmitJob({Spec(), "", "", 0});
    ASSERT_EQ(job.job.record.job_id, elsewhere.job.record.job_id);  // both job-000001
    uid = job.job.record.job_uid;
    EXPECT_TRUE(IsJobUid(uid)) << uid;
    EXPECT_EQ(uid.size(), static_cast<size_t>(kJobUidDigits));
    EXPECT_NE(uid, elsewhere.job.record.job_uid);
    const SubmitResult second = *c->SubmitJob({Spec(), "", "", 0});
    EXPECT_NE(second.job.record.job_uid, uid);
    EXPECT_EQ(ToJobInfo(*c->GetJob(job.job.record.job_id, false)).job_uid, uid);

    JoinArgs a;
    a.call = {job.job.record.job_id, job.join_token, "w0", -1, 0};
    a.requested_rank = 0;
    a.peer_host = "127.0.0.1";
    EXPECT_EQ(c->Join(a)->job_uid, uid);
    auto calls = JoinAll(*c, job, "w");
    Steps(*c, calls, 0, 2);
    ASSERT_TRUE(Checkpoint(*c, calls[0], 1, "one").ok());
    ASSERT_EQ(c->ReportFailure(calls[1], "lost")->state, JobState::kRecovering);
    a.call.worker_id = "v0";
    auto rejoined = c->Join(a);
    ASSERT_TRUE(rejoined.ok()) << rejoined.status();
    EXPECT_EQ(rejoined->attempt, 2);
    EXPECT_EQ(rejoined->resume_step, 1);
    EXPECT_EQ(rejoined->job_uid, uid);
    ASSERT_TRUE(c->CancelJob(job.job.record.job_id, "").ok());
    auto resumed = c->ResumeJob(job.job.record.job_id, "");
    ASSERT_TRUE(resumed.ok()) << resumed.status();
    EXPECT_EQ(resumed->record.job_uid, uid);
  }
  auto c = Make({}, db);
  EXPECT_EQ(c->GetJob(job.job.record.job_id, false)->record.job_uid, uid);
  auto calls = JoinAll(*c, job, "u");
  JoinArgs a;
  a.call = {job.job.record.job_id, job.join_token, "u0", -1, 0};
  a.requested_rank = 0;
  a.peer_host = "127.0.0.1";
  auto joined = c->Join(a);
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(joined->attempt, 3);
  EXPECT_EQ(joined->job_uid, uid);
}

}  // namespace
}  // namespace latchkey
