// Elastic recovery in the coordinator (docs/fault-tolerance.md "Elastic recovery"): the shrink
// of a recovery whose ranks do not come back, the layout each attempt runs and the windows a
// new layout re-decides, spares, the grow-back at a checkpoint, a coordinator restart that
// keeps the layouts, and the determinism check within a layout. Real SQLite, a ManualClock.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
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

std::unique_ptr<Coordinator> Make(CoordinatorOptions opt, const std::string& db = ":memory:") {
  auto store = SqliteStore::Open(db);
  EXPECT_TRUE(store.ok()) << store.status();
  auto c = Coordinator::Create(*std::move(store), opt, nullptr);
  EXPECT_TRUE(c.ok()) << c.status();
  return *std::move(c);
}

// DP2 x TP2, GAS 2, 16 steps, elastic down to one replica, rejoin within 5 s, max_restarts
// restarts (1 unless a test says otherwise).
std::string ElasticSpec(int max_restarts = 1) {
  SpecParams p;
  p.world_size = 4;
  p.tp = 2;
  p.gas = 2;
  p.steps = 16;
  p.extra_latchkey["elastic"] = {{"min_dp", 1}};
  p.extra_latchkey["rejoin_timeout_seconds"] = 5;
  p.extra_latchkey["max_restarts"] = max_restarts;
  return SpecJson(p);
}

absl::StatusOr<JoinResult> TryJoin(Coordinator& c, const SubmitResult& job,
                                   const std::string& worker, std::optional<int> rank) {
  JoinArgs a;
  a.call = {job.job.record.job_id, job.join_token, worker, -1, 0};
  a.requested_rank = rank;
  a.peer_host = "127.0.0.1";
  return c.Join(a);
}

WorkerCall Call(const SubmitResult& job, const std::string& worker, const JoinResult& r) {
  return {job.job.record.job_id, job.join_token, worker, r.rank, r.attempt};
}

absl::Status Report(Coordinator& c, const WorkerCall& call, int64_t step, double loss,
                    int64_t generation) {
  StepReportRecord r;
  r.report.step = step;
  r.report.loss = loss;
  r.report.tokens = 128;
  r.report.latch_generation = generation;
  return c.ReportStep(call, r).status();
}

absl::Status Checkpoint(Coordinator& c, const WorkerCall& call, int64_t step) {
  CheckpointReport r;
  r.step = step;
  r.manifest_sha256 = "sha-" + std::to_string(step);
  r.bytes = 1000;
  return c.ReportCheckpoint(call, r).status();
}

std::vector<PublishedLatch> Latches(Coordinator& c, const std::string& id) {
  auto audit = c.ListLatches(id, 0, 0);
  EXPECT_TRUE(audit.ok()) << audit.status();
  return audit.ok() ? audit->latches : std::vector<PublishedLatch>{};
}

class ElasticTest : public ::testing::Test {
 protected:
  void SetUp() override {
    opt_.clock = &clock_;
    opt_.liveness_timeout = absl::Seconds(30);
    opt_.latch_lookahead = 2;
  }

  // Submits the job, joins w0..w3, reports steps 0..3 and the checkpoint after step 3, then
  // loses ranks 2 and 3 (a failure report of rank 2: a recovery, attempt 2).
  void RunToLoss(Coordinator& c) {
    auto submitted = c.SubmitJob({ElasticSpec(max_restarts_), "", "", 0});
    ASSERT_TRUE(submitted.ok()) << submitted.status();
    job_ = *submitted;
    id_ = job_.job.record.job_id;
    calls_.clear();
    for (int i = 0; i < 4; ++i) {
      auto r = TryJoin(c, job_, "w" + std::to_string(i), i);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->gradient_accumulation_steps, 2);
      EXPECT_TRUE(r->elastic);
      calls_.push_back(Call(job_, "w" + std::to_string(i), *r));
    }
    for (int64_t s = 0; s < 4; ++s) {
      for (const WorkerCall& w : calls_) ASSERT_TRUE(Report(c, w, s, 4.0 - s, 0).ok());
    }
    ASSERT_TRUE(Checkpoint(c, calls_[0], 3).ok());
    for (const WorkerCall& w : calls_) ASSERT_TRUE(Report(c, w, 4, 0.5, 0).ok());
    ASSERT_TRUE(c.ReportFailure(calls_[2], "killed").ok());
    ASSERT_EQ(c.GetJob(id_, false)->record.attempt, 2);
  }

  // w0 and w1 rejoin attempt 2; ranks 2 and 3 never come back: past the rejoin timeout the job
  // shrinks to DP1 x TP2 (attempt 3) and w0, w1 join it.
  void Shrink(Coordinator& c) {
    for (int i = 0; i < 2; ++i) ASSERT_TRUE(TryJoin(c, job_, "w" + std::to_string(i), i).ok());
    clock_.Advance(absl::Seconds(4));
    c.CheckLiveness();
    ASSERT_EQ(c.GetJob(id_, false)->record.attempt, 2);  // within the rejoin timeout
    clock_.Advance(absl::Seconds(2));
    c.CheckLiveness();
    calls_.clear();
    for (int i = 0; i < 2; ++i) {
      auto r = TryJoin(c, job_, "w" + std::to_string(i), i);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_FALSE(r->spare);
      calls_.push_back(Call(job_, "w" + std::to_string(i), *r));
    }
  }

  ManualClock clock_;
  CoordinatorOptions opt_;
  int max_restarts_ = 1;
  SubmitResult job_;
  std::string id_;
  std::vector<WorkerCall> calls_;
};

TEST_F(ElasticTest, ARecoveryWithoutItsRanksShrinksAndKeepsTheGlobalBatch) {
  auto c = Make(opt_);
  RunToLoss(*c);
  Shrink(*c);
  const JobView v = *c->GetJob(id_, false);
  EXPECT_EQ(v.record.state, JobState::kRunning);
  EXPECT_EQ(v.record.attempt, 3);
  EXPECT_EQ(v.record.restarts, 1);  // one recovery: the shrink spends no restart
  EXPECT_EQ(v.world_size, 2);
  EXPECT_EQ(v.dp, 1);
  EXPECT_EQ(v.tp, 2);
  EXPECT_EQ(v.spec_world_size, 4);
  ASSERT_EQ(v.attempts.size(), 3u);
  EXPECT_EQ(v.attempts[1].world, 4);
  EXPECT_EQ(v.attempts[2].world, 2);
  EXPECT_EQ(v.attempts[2].dp, 1);
  EXPECT_EQ(v.attempts[2].gradient_accumulation_steps, 4);  // 2 * 2 / 1
  EXPECT_EQ(v.attempts[2].resume_step, 3);
  EXPECT_NE(v.attempts[2].cause.find("did not rejoin attempt 2"), std::string::npos)
      << v.attempts[2].cause;
  EXPECT_NE(v.attempts[2].cause.find("shrinking to dp 1"), std::string::npos);

  // Windows 0..3 keep the first layout's latches; from window 4 on they are decided again for
  // DP1 with 4 micro-batches, under a new generation, M and first_sample continuing.
  const std::vector<PublishedLatch> latches = Latches(*c, id_);
  ASSERT_GE(latches.size(), 5u);
  for (int w = 0; w < 4; ++w) {
    EXPECT_EQ(latches[w].layout_attempt, 1);
    EXPECT_EQ(latches[w].latch.n, 2);
    EXPECT_EQ(latches[w].latch.generation, 0);
    EXPECT_EQ(latches[w].latch.first_sample, w * 2 * 2 * 2);  // n * dp * micro_batch
  }
  for (size_t w = 4; w < latches.size(); ++w) {
    SCOPED_TRACE(w);
    EXPECT_EQ(latches[w].layout_attempt, 3);
    EXPECT_EQ(latches[w].latch.n, 4);
    EXPECT_EQ(latches[w].latch.generation, 1);
    EXPECT_EQ(latches[w].latch.first_micro_batch, 8 + 4 * (static_cast<int64_t>(w) - 4));
    // The same global samples per window as before: 8 per window (n * dp * MB).
    EXPECT_EQ(latches[w].latch.first_sample, static_cast<int64_t>(w) * 8);
  }
  auto audit = c->ListLatches(id_, 0, 0);
  ASSERT_TRUE(audit.ok());
  ASSERT_FALSE(audit->policy_changes.empty());
  EXPECT_EQ(audit->policy_changes.back().first_window, 4);
  EXPECT_EQ(audit->policy_changes.back().policy.gradient_accumulation_steps, 4);
  bool named = false;
  for (const JobEventRecord& e : audit->events) {
    if (e.kind == "layout") {
      named = true;
      EXPECT_NE(e.message.find("world 2 = dp 1 x tp 2"), std::string::npos) << e.message;
      EXPECT_NE(e.message.find("was world 4 = dp 2 x tp 2"), std::string::npos) << e.message;
    }
  }
  EXPECT_TRUE(named);

  // The re-run of window 4 in the new layout sums in another order: not a violation.
  ASSERT_TRUE(Report(*c, calls_[0], 4, 0.5000001, 1).ok());
  ASSERT_TRUE(Report(*c, calls_[1], 4, 0.5000001, 1).ok());
  EXPECT_EQ(c->GetJob(id_, false)->record.determinism_violations, 0);
  // A report under the old layout's generation is refused.
  EXPECT_EQ(Report(*c, calls_[0], 5, 0.4, 0).code(), absl::StatusCode::kAborted);
}

TEST_F(ElasticTest, SparesWaitAndGrowTheJobBackAtTheNextCheckpoint) {
  auto c = Make(opt_);
  RunToLoss(*c);
  Shrink(*c);
  // Two workers start later with ranks 2 and 3: the shrunk job has no rank for them.
  for (const char* w : {"s2", "s3"}) {
    auto r = TryJoin(*c, job_, w, w[1] - '0');
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->spare);
    EXPECT_EQ(r->rank, -1);
  }
  for (int64_t s = 4; s < 8; ++s) {
    for (const WorkerCall& w : calls_) ASSERT_TRUE(Report(*c, w, s, 0.25, 1).ok());
    // Spares poll Join; each poll keeps them alive.
    for (const char* w : {"s2", "s3"}) ASSERT_TRUE(TryJoin(*c, job_, w, w[1] - '0').ok());
  }
  EXPECT_EQ(c->GetJob(id_, false)->record.attempt, 3);
  ASSERT_TRUE(Checkpoint(*c, calls_[0], 7).ok());
  JobView v = *c->GetJob(id_, false);
  EXPECT_EQ(v.record.attempt, 4);
  EXPECT_EQ(v.record.restarts, 1);  // the grow spends no restart
  EXPECT_EQ(v.record.state, JobState::kRecovering);
  EXPECT_EQ(v.world_size, 4);
  EXPECT_EQ(v.dp, 2);
  EXPECT_EQ(v.attempts.back().resume_step, 7);
  EXPECT_EQ(v.attempts.back().gradient_accumulation_steps, 2);
  // Everyone joins the grown attempt: the survivors and the former spares.
  for (int i = 0; i < 4; ++i) {
    const std::string w = i < 2 ? "w" + std::to_string(i) : "s" + std::to_string(i);
    auto r = TryJoin(*c, job_, w, i);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_FALSE(r->spare);
    EXPECT_EQ(r->world_size, 4);
    EXPECT_EQ(r->gradient_accumulation_steps, 2);
  }
  v = *c->GetJob(id_, false);
  EXPECT_EQ(v.record.state, JobState::kRunning);
  const std::vector<PublishedLatch> latches = Latches(*c, id_);
  ASSERT_GE(latches.size(), 9u);
  EXPECT_EQ(latches[7].layout_attempt, 3);
  EXPECT_EQ(latches[8].layout_attempt, 4);
  EXPECT_EQ(latches[8].latch.n, 2);
  EXPECT_EQ(latches[8].latch.generation, 2);
  EXPECT_EQ(latches[8].latch.first_sample, 8 * 8);

  // A fifth worker of the full job is a spare, never a rank above the spec; when the job ends
  // it hears so (not needed).
  auto extra = TryJoin(*c, job_, "x", std::nullopt);
  ASSERT_TRUE(extra.ok()) << extra.status();
  EXPECT_TRUE(extra->spare);
  ASSERT_TRUE(c->CancelJob(id_, "done here").ok());
  auto after = TryJoin(*c, job_, "x", std::nullopt);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE(after->spare);
  EXPECT_EQ(after->state, JobState::kCancelled);
}

// The spares arrive late: the first checkpoint they could grow the job at is the one after its
// last step. Nothing is left to train, so it grows nothing; the job ends when the step's reports
// arrive (a grow there would fence the attempt that just finished and leave a new one with no
// window to run).
TEST_F(ElasticTest, ACheckpointAfterTheLastStepGrowsNothingAndTheJobSucceeds) {
  auto c = Make(opt_);
  RunToLoss(*c);
  Shrink(*c);
  for (int64_t s = 4; s < 15; ++s) {
    for (const WorkerCall& w : calls_) ASSERT_TRUE(Report(*c, w, s, 0.25, 1).ok());
  }
  for (const char* w : {"s2", "s3"}) {
    auto r = TryJoin(*c, job_, w, w[1] - '0');
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->spare);
  }
  ASSERT_TRUE(Report(*c, calls_[1], 15, 0.25, 1).ok());
  ASSERT_TRUE(Checkpoint(*c, calls_[0], 15).ok());
  JobView v = *c->GetJob(id_, false);
  EXPECT_EQ(v.record.attempt, 3);
  EXPECT_EQ(v.record.state, JobState::kRunning);
  ASSERT_TRUE(Report(*c, calls_[0], 15, 0.25, 1).ok());
  v = *c->GetJob(id_, false);
  EXPECT_EQ(v.record.state, JobState::kSucceeded) << v.record.failure_reason;
  EXPECT_EQ(v.record.attempt, 3);
}

// Spares wait beside a shrunk job; a survivor is lost, so the recovery fills its ranks from
// the spares, whose own rank numbers (2, 3) are past the shrunk world. At the grow they ask for
// those numbers again: in an elastic job the rank a worker holds wins over the one it asks for
// (the layout is the coordinator's), so every rejoin is taken and the job grows.
TEST_F(ElasticTest, ASparePlacedAtAnotherRankKeepsItWhenItAsksForItsOwnAgain) {
  max_restarts_ = 3;
  auto c = Make(opt_);
  RunToLoss(*c);
  Shrink(*c);
  for (const char* w : {"s2", "s3"}) ASSERT_TRUE(TryJoin(*c, job_, w, w[1] - '0')->spare);
  ASSERT_TRUE(c->ReportFailure(calls_[1], "killed").ok());
  ASSERT_EQ(c->GetJob(id_, false)->record.attempt, 4)
      << JobStateName(c->GetJob(id_, false)->record.state) << " "
      << c->GetJob(id_, false)->record.failure_reason;
  // The spares poll first and take the free ranks of the DP1 attempt.
  std::map<std::string, int> held;
  for (const char* w : {"s2", "s3"}) {
    auto r = TryJoin(*c, job_, w, w[1] - '0');
    ASSERT_TRUE(r.ok()) << r.status();
    if (!r->spare) held[w] = r->rank;
  }
  ASSERT_FALSE(held.empty());
  for (const auto& [w, rank] : held) {
    // Asking for its own number again keeps the rank it holds.
    auto again = TryJoin(*c, job_, w, w[1] - '0');
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->rank, rank);
  }
  // Outside an elastic job the mismatch stays an error (a worker started with the wrong rank).
  SpecParams p;
  p.world_size = 2;
  p.tp = 2;
  p.steps = 4;
  auto fixed = *c->SubmitJob({SpecJson(p), "", "", 0});
  ASSERT_TRUE(TryJoin(*c, fixed, "f0", 0).ok());
  EXPECT_EQ(TryJoin(*c, fixed, "f0", 1).status().code(), absl::StatusCode::kAborted);
}

TEST_F(ElasticTest, ARestartedCoordinatorKeepsEveryAttemptsLayout) {
  ScopedTempDir dir;
  const std::string db = dir.path() + "/c.db";
  {
    auto c = Make(opt_, db);
    RunToLoss(*c);
    Shrink(*c);
    for (const WorkerCall& w : calls_) ASSERT_TRUE(Report(*c, w, 4, 0.5, 1).ok());
  }
  auto c = Make(opt_, db);
  const JobView v = *c->GetJob(id_, false);
  EXPECT_EQ(v.record.attempt, 3);
  EXPECT_EQ(v.world_size, 2);
  EXPECT_EQ(v.dp, 1);
  ASSERT_EQ(v.attempts.size(), 3u);
  EXPECT_EQ(v.attempts[2].gradient_accumulation_steps, 4);
  const std::vector<PublishedLatch> latches = Latches(*c, id_);
  ASSERT_GE(latches.size(), 5u);
  EXPECT_EQ(latches[4].layout_attempt, 3);
  EXPECT_EQ(latches[4].latch.n, 4);
}

TEST_F(ElasticTest, WithoutElasticTheRejoinFailureSpendsARestartAsBefore) {
  auto c = Make(opt_);
  SpecParams p;
  p.world_size = 4;
  p.tp = 2;
  p.steps = 8;
  p.extra_latchkey["max_restarts"] = 1;
  auto job = *c->SubmitJob({SpecJson(p), "", "", 0});
  std::vector<WorkerCall> calls;
  for (int i = 0; i < 4; ++i) {
    auto r = TryJoin(*c, job, "w" + std::to_string(i), i);
    ASSERT_TRUE(r.ok());
    EXPECT_FALSE(r->elastic);
    calls.push_back(Call(job, "w" + std::to_string(i), *r));
  }
  ASSERT_TRUE(c->ReportFailure(calls[3], "killed").ok());
  ASSERT_TRUE(TryJoin(*c, job, "w0", 0).ok());
  // A rank past the world is refused as before (no spares without latchkey.elastic).
  EXPECT_EQ(TryJoin(*c, job, "z", 7).status().code(), absl::StatusCode::kInvalidArgument);
  clock_.Advance(absl::Seconds(31));  // the liveness timeout: no rejoin_timeout_seconds
  c->CheckLiveness();
  const JobView v = *c->GetJob(job.job.record.job_id, false);
  EXPECT_EQ(v.record.state, JobState::kFailed);
  EXPECT_EQ(v.world_size, 4);
}

// A resumed elastic job (Coordinator::ResumeJob) asks for the spec's layout again: the
// checkpoint a shrunk attempt committed is layout-independent, so the resumed attempt runs DP2
// from it, its windows decided again for that layout.
TEST_F(ElasticTest, AResumedShrunkJobRunsTheSpecsLayoutFromItsCheckpoint) {
  auto c = Make(opt_);
  RunToLoss(*c);
  Shrink(*c);
  for (int64_t s = 4; s < 7; ++s) {
    for (const WorkerCall& w : calls_) ASSERT_TRUE(Report(*c, w, s, 0.25, 1).ok()) << s;
  }
  ASSERT_TRUE(Checkpoint(*c, calls_[0], 6).ok());
  ASSERT_TRUE(c->CancelJob(id_, "").ok());

  auto resumed = c->ResumeJob(id_, "");
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->record.attempt, 4);
  EXPECT_EQ(resumed->record.restarts, 0);
  EXPECT_EQ(resumed->record.resume_step, 6);
  EXPECT_EQ(resumed->world_size, 4);
  EXPECT_EQ(resumed->dp, 2);
  ASSERT_EQ(resumed->attempts.size(), 4u);
  EXPECT_EQ(resumed->attempts[3].gradient_accumulation_steps, 2);  // the global batch kept
  calls_.clear();
  for (int i = 0; i < 4; ++i) {
    auto r = TryJoin(*c, job_, "v" + std::to_string(i), i);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->attempt, 4);
    EXPECT_EQ(r->resume_step, 6);
    EXPECT_EQ(r->gradient_accumulation_steps, 2);
    calls_.push_back(Call(job_, "v" + std::to_string(i), *r));
  }
  ASSERT_EQ(c->GetJob(id_, false)->record.state, JobState::kRunning);
  for (int64_t s = 7; s < 16; ++s) {
    for (const WorkerCall& w : calls_) ASSERT_TRUE(Report(*c, w, s, 0.125, 2).ok()) << s;
  }
  EXPECT_EQ(c->GetJob(id_, false)->record.state, JobState::kSucceeded);
  const auto latches = Latches(*c, id_);
  ASSERT_EQ(latches.size(), 16u);
  EXPECT_EQ(latches[6].layout_attempt, 3);
  EXPECT_EQ(latches[7].layout_attempt, 4);  // decided again for the resumed layout
  EXPECT_EQ(latches[7].latch.n, 2);
  EXPECT_EQ(latches[7].latch.generation, 2);
}

}  // namespace
}  // namespace latchkey
