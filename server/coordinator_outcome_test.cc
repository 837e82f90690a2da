// How a job ends and what the coordinator keeps of it: a diverged step's report (NaN or ±Inf
// loss and gradient norm) is stored and read back as it was, a rank's TRAINING_DIVERGED failure
// fails the job at once with no recovery and the last checkpoint kept, and a cancel is an event
// of the audit.
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/error_info.h"
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

constexpr double kInf = std::numeric_limits<double>::infinity();

std::unique_ptr<Coordinator> Make(const std::string& db = ":memory:") {
  auto store = SqliteStore::Open(db);
  EXPECT_TRUE(store.ok()) << store.status();
  auto c = Coordinator::Create(*std::move(store), {}, nullptr);
  EXPECT_TRUE(c.ok()) << c.status();
  return *std::move(c);
}

// World 2 (TP 2), 6 steps, 3 restarts allowed: a failure that is not a divergence recovers.
std::string Spec() {
  SpecParams p;
  p.steps = 6;
  p.extra_latchkey["max_restarts"] = 3;
  return SpecJson(p);
}

std::vector<WorkerCall> JoinAll(Coordinator& c, const SubmitResult& job) {
  std::vector<WorkerCall> calls;
  for (int i = 0; i < 2; ++i) {
    JoinArgs a;
    a.call = {job.job.record.job_id, job.join_token, "w" + std::to_string(i), -1, 0};
    a.requested_rank = i;
    a.peer_host = "127.0.0.1";
    auto r = c.Join(a);
    EXPECT_TRUE(r.ok()) << r.status();
    if (r.ok())
      calls.push_back(
          {job.job.record.job_id, job.join_token, a.call.worker_id, r->rank, r->attempt});
  }
  return calls;
}

absl::StatusOr<WorkerStatus> Report(Coordinator& c, const WorkerCall& call, int64_t step,
                                    double loss, double grad_norm) {
  StepReportRecord r;
  r.report.step = step;
  r.report.loss = loss;
  r.report.grad_norm = grad_norm;
  r.report.tokens = 128;
  return c.ReportStep(call, r);
}

std::vector<JobEventRecord> Events(Coordinator& c, const std::string& id) {
  auto audit = c.ListLatches(id, 0, 0);
  EXPECT_TRUE(audit.ok()) << audit.status();
  return audit.ok() ? audit->events : std::vector<JobEventRecord>{};
}

// The store keeps NaN (as text: SQLite makes a NaN REAL NULL) and ±Inf, and reads them back.
TEST(StepReportStore, NonFiniteValuesReadBackAsTheyWere) {
  auto store = SqliteStore::Open(":memory:");
  ASSERT_TRUE(store.ok()) << store.status();
  const double values[][3] = {{std::nan(""), kInf, -kInf}, {kInf, std::nan(""), std::nan("")}};
  for (int rank = 0; rank < 2; ++rank) {
    StepReportRecord r;
    r.job_id = "job-000001";
    r.rank = rank;
    r.report.step = 1;
    r.report.loss = values[rank][0];
    r.report.grad_norm = values[rank][1];
    r.report.eval_loss = values[rank][2];
    auto inserted = (*store)->InsertStepReport(r);
    ASSERT_TRUE(inserted.ok()) << inserted.status();
    EXPECT_TRUE(*inserted) << "rank " << rank;
    // The same key again is a repeat, not an error.
    auto again = (*store)->InsertStepReport(r);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_FALSE(*again);
  }
  auto r0 = (*store)->LoadStepReport("job-000001", 0, 1);
  ASSERT_TRUE(r0.ok()) << r0.status();
  EXPECT_TRUE(std::isnan(r0->report.loss));
  EXPECT_EQ(r0->report.grad_norm, kInf);
  ASSERT_TRUE(r0->report.eval_loss.has_value());
  EXPECT_EQ(*r0->report.eval_loss, -kInf);
  auto r1 = (*store)->LoadStepReport("job-000001", 1, 1);
  ASSERT_TRUE(r1.ok()) << r1.status();
  EXPECT_EQ(r1->report.loss, kInf);
  EXPECT_TRUE(std::isnan(r1->report.grad_norm));
  ASSERT_TRUE(r1->report.eval_loss.has_value());
  EXPECT_TRUE(std::isnan(*r1->report.eval_loss));
}

// The report of a diverged step is stored (before: "step report 1 of job ... rank 0: not
// stored", the NaN row silently dropped by the insert), completes the step, and a coordinator
// that loads the store again sees it.
TEST(CoordinatorOutcomeTest, DivergedStepReportIsStoredAndCompletesTheStep) {
  ScopedTempDir dir;
  const std::string db = dir.path() + "/c.db";
  std::string id;
  {
    auto c = Make(db);
    auto job = c->SubmitJob({Spec(), "", "", 0});
    ASSERT_TRUE(job.ok()) << job.status();
    id = job->job.record.job_id;
    auto calls = JoinAll(*c, *job);
    ASSERT_EQ(calls.size(), 2u);
    for (const WorkerCall& call : calls) ASSERT_TRUE(Report(*c, call, 0, 5.5, 1.25).ok());
    for (const WorkerCall& call : calls) {
      auto r = Report(*c, call, 1, std::nan(""), kInf);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_FALSE(r->duplicate);
    }
    // A retry of the same report is acknowledged as a repeat (NaN's bits equal its own).
    auto again = Report(*c, calls[0], 1, std::nan(""), kInf);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_TRUE(again->duplicate);
    auto snap = c->Snapshot(id);
    ASSERT_TRUE(snap.ok()) << snap.status();
    EXPECT_EQ(snap->job.steps_completed, 2);
    ASSERT_EQ(snap->steps.size(), 2u);
    EXPECT_TRUE(std::isnan(snap->steps[1].report.loss));
    EXPECT_EQ(snap->steps[1].report.grad_norm, kInf);
    EXPECT_EQ(snap->job.record.determinism_violations, 0);
  }
  // A coordinator that loads the store rebuilds the last completed step from its reports.
  auto reloaded = Make(db);
  auto snap = reloaded->Snapshot(id);
  ASSERT_TRUE(snap.ok()) << snap.status();
  EXPECT_EQ(snap->job.steps_completed, 2);
  ASSERT_EQ(snap->steps.size(), 1u);
  EXPECT_EQ(snap->steps[0].report.step, 1);
  EXPECT_TRUE(std::isnan(snap->steps[0].report.loss));
  EXPECT_EQ(snap->steps[0].report.grad_norm, kInf);
}

// A rank's TRAINING_DIVERGED failure fails the job at once (3 restarts allowed, none spent),
// naming the rank's cause, with a "diverged" event, and the last checkpoint stays the newest.
TEST(CoordinatorOutcomeTest, DivergedTrainingFailsTheJobWithoutARecovery) {
  auto c = Make();
  auto job = c->SubmitJob({Spec(), "", "", 0});
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string id = job->job.record.job_id;
  auto calls = JoinAll(*c, *job);
  ASSERT_EQ(calls.size(), 2u);
  for (const WorkerCall& call : calls) ASSERT_TRUE(Report(*c, call, 0, 5.5, 1.25).ok());
  CheckpointReport ckpt;
  ckpt.step = 0;
  ckpt.manifest_sha256 = std::string(64, 'a');
  ckpt.bytes = 1000;
  ASSERT_TRUE(c->ReportCheckpoint(calls[0], ckpt).ok());
  auto failed = c->ReportFailure(calls[0], "loss is NaN at step 1 (rank 0)", /*permanent=*/true,
                                 error_reason::kTrainingDiverged);
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_EQ(failed->state, JobState::kFailed);
  EXPECT_EQ(failed->attempt, 1);
  // The other rank reaches the same verdict: its report changes nothing.
  auto second = c->ReportFailure(calls[1], "loss is NaN at step 1 (rank 1)", true,
                                 error_reason::kTrainingDiverged);
  ASSERT_TRUE(second.ok()) << second.status();
  auto view = c->GetJob(id, true);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->record.state, JobState::kFailed);
  EXPECT_EQ(view->record.restarts, 0);
  EXPECT_EQ(view->record.attempt, 1);
  EXPECT_EQ(view->record.last_checkpoint_step, 0);
  EXPECT_EQ(view->record.failure_reason,
            "rank 0 (worker w0): loss is NaN at step 1 (rank 0) (training diverged: not "
            "retried)");
  const std::vector<JobEventRecord> events = Events(*c, id);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().kind, "diverged");
  EXPECT_EQ(events.back().message, view->record.failure_reason);
  for (const JobEventRecord& e : events) EXPECT_NE(e.kind, "recovery") << e.message;
}

// A cancel is recorded in the audit as recoveries and stalls are: who ended the job, and why.
TEST(CoordinatorOutcomeTest, CancelIsAnEventOfTheAudit) {
  auto c = Make();
  auto job = c->SubmitJob({Spec(), "", "", 0});
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string id = job->job.record.job_id;
  ASSERT_TRUE(c->CancelJob(id, "interrupted by latchkey up (SIGINT)").ok());
  const std::vector<JobEventRecord> events = Events(*c, id);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, "cancel");
  EXPECT_EQ(events[0].message, "interrupted by latchkey up (SIGINT)");
  EXPECT_EQ(events[0].attempt, 1);
}

}  // namespace
}  // namespace latchkey
