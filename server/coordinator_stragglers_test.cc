// The coordinator and stragglers (docs/fault-tolerance.md "Stragglers"): from the ranks' step
// reports it names the slow rank in the job's view, the audit and the slowdown gauges; with
// latchkey.stragglers.rebalance the latches it publishes split the window unevenly, the split
// persisted with the latch (read back the same by a restarted coordinator); without it every
// latch stays even; a policy's mid-window DP reduction keeps the window even.
#include <memory>
#include <string>
#include <vector>

#include "common/job_spec.h"
#include "common/latch.h"
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

class SlowdownObserver : public CoordinatorObserver {
 public:
  void AddJobs(JobState, int) override {}
  void AddWorkers(WorkerState, int) override {}
  void LatchPublished(KvMode) override {}
  void RankSlowdowns(const std::string& job, const std::vector<double>& s) override {
    last_job = job;
    last = s;
    calls++;
  }
  std::string last_job;
  std::vector<double> last;
  int calls = 0;
};

std::unique_ptr<Coordinator> Make(const std::string& db, CoordinatorObserver* observer = nullptr) {
  auto store = SqliteStore::Open(db);
  EXPECT_TRUE(store.ok()) << store.status();
  auto c = Coordinator::Create(*std::move(store), {}, observer);
  EXPECT_TRUE(c.ok()) << c.status();
  return *std::move(c);
}

// DP 2 x TP 1, GAS 4, `steps` steps.
std::string Spec(bool rebalance, int steps) {
  SpecParams p;
  p.tp = 1;
  p.world_size = 2;
  p.gas = 4;
  p.steps = steps;
  p.extra_latchkey = {{"stragglers", {{"rebalance", rebalance}}}};
  return SpecJson(p);
}

struct Job {
  SubmitResult submitted;
  std::vector<WorkerCall> calls;
};

Job Start(Coordinator& c, const std::string& spec) {
  Job j;
  auto r = c.SubmitJob({spec, "", "", 0});
  EXPECT_TRUE(r.ok()) << r.status();
  j.submitted = *r;
  for (int i = 0; i < 2; ++i) {
    JoinArgs a;
    a.call = WorkerCall{r->job.record.job_id, r->join_token, "w" + std::to_string(i), -1};
    a.peer_host = "10.0.0." + std::to_string(i + 1);
    auto joined = c.Join(a);
    EXPECT_TRUE(joined.ok()) << joined.status();
    j.calls.push_back(WorkerCall{a.call.job_id, a.call.join_token, a.call.worker_id, joined->rank});
  }
  return j;
}

Latch LatchOf(Coordinator& c, const WorkerCall& call, int64_t window) {
  auto b = c.WaitLatches(call, window, 1, absl::Now() + absl::Seconds(5));
  EXPECT_TRUE(b.ok() && !b->latches.empty()) << window;
  return b.ok() && !b->latches.empty() ? b->latches.front().latch : Latch{};
}

// Both ranks report `step` as they would have run its latch: rank r computes `pace[r]` seconds
// per micro-batch of its replica's share.
void RunStep(Coordinator& c, const Job& j, int64_t step, const std::vector<double>& pace) {
  const Latch l = LatchOf(c, j.calls[0], step);
  for (int r = 0; r < 2; ++r) {
    StepReportRecord rec;
    rec.report.step = step;
    rec.report.latch_generation = l.generation;
    rec.report.micro_batches = l.n;
    rec.report.replica_micro_batches = ReplicaMicroBatches(l, r);
    rec.report.compute_seconds = pace[static_cast<size_t>(r)] * rec.report.replica_micro_batches;
    rec.report.micro_batch_seconds = rec.report.compute_seconds;
    rec.report.step_seconds = 1.0;
    rec.report.loss = 2.0;
    rec.report.tokens = 64;
    ASSERT_TRUE(c.ReportStep(j.calls[static_cast<size_t>(r)], rec).ok()) << step;
  }
}

TEST(CoordinatorStragglersTest, NamesTheSlowRankAndSplitsTheWindowsAfter) {
  ScopedTempDir dir;
  const std::string db = dir.path() + "/c.db";
  std::vector<Latch> before;
  std::string id;
  Job job;
  {
    SlowdownObserver observer;
    auto c = Make(db, &observer);
    job = Start(*c, Spec(true, 12));
    id = job.submitted.job.record.job_id;
    for (int64_t s = 0; s < 8; ++s) RunStep(*c, job, s, {1.0, 2.0});
    auto v = c->GetJob(id, false);
    ASSERT_TRUE(v.ok());
    ASSERT_EQ(v->stragglers.size(), 1u);
    EXPECT_EQ(v->stragglers[0].rank, 1);
    EXPECT_EQ(v->stragglers[0].host, "10.0.0.2");
    EXPECT_NEAR(v->stragglers[0].slowdown, 2.0, 1e-9);
    EXPECT_EQ(v->stragglers[0].since_step, 0);
    // The windows published after the first measured step split 6 + 2 (equal to 5 + 3 at
    // paces 1 and 2; the greedy deal gives the faster replica the tie).
    EXPECT_TRUE(LatchOf(*c, job.calls[0], 0).replica_micro_batches.empty());
    const Latch later = LatchOf(*c, job.calls[0], 6);
    EXPECT_EQ(later.replica_micro_batches, (std::vector<int>{6, 2}));
    EXPECT_EQ(v->replica_micro_batches, (std::vector<int>{6, 2}));
    EXPECT_EQ(SplitProblem(later, 2, later.replica_micro_batches), "");
    // The gauges: every rank's slowdown, the slow one's 2.
    EXPECT_EQ(observer.last_job, id);
    ASSERT_EQ(observer.last.size(), 2u);
    EXPECT_NEAR(observer.last[1], 2.0, 1e-9);
    EXPECT_NEAR(observer.last[0], 0.5, 1e-9);
    // The audit: the straggler named, the split's change.
    auto audit = c->ReadAudit(id, 0, 100);
    ASSERT_TRUE(audit.ok()) << audit.status();
    int named = 0, rebalanced = 0;
    for (const JobEventRecord& e : audit->events) {
      if (e.kind == "straggler") {
        named++;
        EXPECT_NE(e.message.find("rank 1 (host 10.0.0.2) is 2.00x slower"), std::string::npos)
            << e.message;
      }
      if (e.kind == "rebalance") {
        rebalanced++;
        EXPECT_NE(e.message.find("micro-batches per DP replica 6,2 (was even)"), std::string::npos)
            << e.message;
      }
    }
    EXPECT_EQ(named, 1);
    EXPECT_EQ(rebalanced, 1);
    for (int64_t w = 0; w < 10; ++w) before.push_back(LatchOf(*c, job.calls[0], w));
  }
  // Persisted with the latches: a restarted coordinator serves the same splits, and audits a
  // change against the newest one it published (measured again, the same split: no change).
  auto c = Make(db);
  for (int64_t w = 0; w < 10; ++w) EXPECT_EQ(LatchOf(*c, job.calls[0], w), before[w]) << w;
  RunStep(*c, job, 8, {1.0, 2.0});
  EXPECT_EQ(LatchOf(*c, job.calls[0], 11).replica_micro_batches, (std::vector<int>{6, 2}));
  auto audit = c->ReadAudit(id, 0, 100);
  ASSERT_TRUE(audit.ok()) << audit.status();
  int rebalanced = 0;
  for (const JobEventRecord& e : audit->events) rebalanced += e.kind == "rebalance";
  EXPECT_EQ(rebalanced, 1);
}

TEST(CoordinatorStragglersTest, WithoutRebalanceEveryWindowIsEvenAndTheRankIsStillNamed) {
  ScopedTempDir dir;
  auto c = Make(dir.path() + "/c.db");
  Job job = Start(*c, Spec(false, 10));
  for (int64_t s = 0; s < 8; ++s) RunStep(*c, job, s, {2.0, 1.0});
  for (int64_t w = 0; w < 10; ++w) {
    EXPECT_TRUE(LatchOf(*c, job.calls[0], w).replica_micro_batches.empty()) << w;
  }
  auto v = c->GetJob(job.submitted.job.record.job_id, false);
  ASSERT_TRUE(v.ok());
  ASSERT_EQ(v->stragglers.size(), 1u);
  EXPECT_EQ(v->stragglers[0].rank, 0);
  EXPECT_TRUE(v->replica_micro_batches.empty());
}

TEST(CoordinatorStragglersTest, RebalanceWithAMidWindowSyncInTheSpecIsRefusedNamingTheKey) {
  ScopedTempDir dir;
  auto c = Make(dir.path() + "/c.db");
  SpecParams p;
  p.tp = 1;
  p.world_size = 2;
  p.gas = 4;
  p.extra_latchkey = {{"stragglers", {{"rebalance", true}}},
                      {"no_sync", {true, false, true, false}}};
  auto r = c->SubmitJob({SpecJson(p), "", "", 0});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(r.status().message()).find("latchkey.stragglers.rebalance"),
            std::string::npos)
      << r.status();
}

}  // namespace
}  // namespace latchkey
