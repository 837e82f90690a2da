// N simulated workers (threads, each with its own WorkerSession and gRPC channel) run a job
// against a real in-process coordinator: every rank gets the same latch sequence, and a policy
// update mid-job changes every rank's latches from the same window.
#include <set>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "client/job_client.h"
#include "gtest/gtest.h"
#include "tests/coordinator/harness.h"
#include "tests/support/specs.h"
#include "worker/session/worker_session.h"

namespace latchkey::testing {
namespace {

struct SimResult {
  int rank = -1;
  std::vector<Latch> latches;
  absl::Status status;
};

WorkerSessionOptions SessionOptions(const std::string& address, const SubmittedJob& job,
                                    const std::string& worker) {
  WorkerSessionOptions o;
  o.coordinator = address;
  o.job_id = job.job_id;
  o.join_token = job.join_token;
  o.worker_id = worker;
  o.retry_max = absl::Milliseconds(200);
  return o;
}

StepMetrics MetricsFor(const Latch& latch) {
  StepMetrics m;
  m.step = latch.window;
  m.micro_batches = latch.n;
  m.kv_mode = latch.kv_mode;
  m.kv_allreduce_calls = latch.kv_mode == KvMode::kCoalesced ? 1 : 4;
  m.collective_calls = {{"all_reduce/tp", 16}, {"all_reduce/dp", 1}};
  m.loss = 5.0 / (1.0 + static_cast<double>(latch.window));
  m.step_seconds = 0.001;
  m.tokens = 4 * 32 * latch.n;
  m.latch_generation = latch.generation;
  return m;
}

TEST(ClusterTest, EightRanksSameLatchesAndPolicyUpdateFromOneWindow) {
  constexpr int kWorld = 8;
  constexpr int kSteps = 16;
  constexpr int kPauseAt = 6;
  constexpr int kLookahead = 2;
  CoordinatorOptions opt;
  opt.latch_lookahead = kLookahead;
  InProcessCoordinator server(opt);
  JobClient client({server.address(), absl::Seconds(10), absl::ZeroDuration(), {}});
  SpecParams p;
  p.world_size = kWorld;
  p.tp = 2;
  p.steps = kSteps;
  JobSubmission req;
  req.spec_json = SpecJson(p);
  auto job = client.SubmitJob(req);
  ASSERT_TRUE(job.ok()) << job.status();

  absl::Mutex mu;
  int paused = 0;
  bool release = false;
  std::vector<SimResult> results(kWorld);
  std::vector<std::thread> threads;
  for (int i = 0; i < kWorld; ++i) {
    threads.emplace_back([&, i] {
      SimResult& out = results[static_cast<size_t>(i)];
      auto session =
          WorkerSession::Join(SessionOptions(server.address(), *job, "sim-" + std::to_string(i)));
      if (!session.ok()) {
        out.status = session.status();
        return;
      }
      out.rank = (*session)->info().rank;
      (*session)->StartLatches(0);
      for (int64_t s = 0; s < kSteps; ++s) {
        if (s == kPauseAt) {  // hold every rank here while the test changes the policy
          absl::MutexLock lock(&mu);
          paused++;
          mu.Await(absl::Condition(&release));
        }
        auto latch = (*session)->AwaitLatch(s, absl::Seconds(30));
        if (!latch.ok()) {
          out.status = latch.status();
          return;
        }
        out.latches.push_back(latch->latch);
        out.status = (*session)->ReportStep(MetricsFor(latch->latch));
        if (!out.status.ok()) return;
      }
    });
  }
  {
    absl::MutexLock lock(&mu);
    auto all_paused = [&] { return paused == kWorld; };
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&all_paused), absl::Seconds(60)));
  }
  // Every rank reported windows 0..5, so 0..(6 + lookahead) are published and immutable.
  JobPolicyUpdate update;
  update.job_id = job->job_id;
  update.gradient_accumulation_steps = 2;
  update.kv_reduce = KvReducePolicy::kDeferred;
  auto updated = client.UpdateJobPolicy(update);
  ASSERT_TRUE(updated.ok()) << updated.status();
  const int64_t first = updated->first_window;
  EXPECT_EQ(first, kPauseAt + 1 + kLookahead);
  {
    absl::MutexLock lock(&mu);
    release = true;
  }
  for (auto& t : threads) t.join();

  std::set<int> ranks;
  for (const SimResult& r : results) {
    ASSERT_TRUE(r.status.ok()) << "rank " << r.rank << ": " << r.status;
    ranks.insert(r.rank);
    ASSERT_EQ(r.latches.size(), static_cast<size_t>(kSteps));
    EXPECT_EQ(r.latches, results[0].latches) << "rank " << r.rank << " saw other latches";
  }
  EXPECT_EQ(ranks.size(), static_cast<size_t>(kWorld));
  const std::vector<Latch>& l = results[0].latches;
  int64_t m = 0;
  for (int64_t s = 0; s < kSteps; ++s) {
    const Latch& x = l[static_cast<size_t>(s)];
    EXPECT_EQ(x.window, s);
    EXPECT_EQ(x.first_micro_batch, m) << "data order broken at window " << s;
    m += x.n;
    if (s < first) {
      EXPECT_EQ(x.generation, 0) << s;
      EXPECT_EQ(x.n, 4) << s;
      EXPECT_EQ(x.kv_mode, KvMode::kCoalesced) << s;
    } else {
      EXPECT_EQ(x.generation, 1) << s;
      EXPECT_EQ(x.n, 2) << s;
      EXPECT_EQ(x.kv_mode, KvMode::kDeferred) << s;
    }
  }
  auto final_job = client.GetJob(job->job_id);
  ASSERT_TRUE(final_job.ok());
  EXPECT_EQ(final_job->state, JobState::kSucceeded);
  EXPECT_EQ(final_job->steps_completed, kSteps);
  // The audit is what the ranks ran.
  auto audit = client.ListLatches(job->job_id);
  ASSERT_TRUE(audit.ok());
  ASSERT_EQ(audit->latches.size(), static_cast<size_t>(kSteps));
  for (size_t s = 0; s < static_cast<size_t>(kSteps); ++s) {
    EXPECT_EQ(audit->latches[s].latch.n, l[s].n);
    EXPECT_EQ(audit->latches[s].latch.generation, l[s].generation);
  }
}

TEST(ClusterTest, CancelReachesWaitingWorkersThroughTheirStream) {
  InProcessCoordinator server;
  JobClient client({server.address(), absl::Seconds(10), absl::ZeroDuration(), {}});
  SpecParams p;
  p.steps = 100;
  JobSubmission req;
  req.spec_json = SpecJson(p);
  auto job = client.SubmitJob(req);
  ASSERT_TRUE(job.ok());
  std::vector<std::unique_ptr<WorkerSession>> sessions;
  for (int i = 0; i < 2; ++i) {
    auto s = WorkerSession::Join(SessionOptions(server.address(), *job, "w" + std::to_string(i)));
    ASSERT_TRUE(s.ok()) << s.status();
    (*s)->StartLatches(50);  // far ahead: nothing to receive until the others progress
    sessions.push_back(*std::move(s));
  }
  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(200));
    EXPECT_TRUE(client.CancelJob(job->job_id, "operator said stop").ok());
  });
  for (auto& s : sessions) {
    auto latch = s->AwaitLatch(50, absl::Seconds(20));
    EXPECT_EQ(latch.status().code(), absl::StatusCode::kCancelled) << latch.status();
    EXPECT_NE(latch.status().message().find("operator said stop"), absl::string_view::npos);
    ASSERT_TRUE(s->job_end().has_value());
    EXPECT_EQ(s->job_end()->state, JobState::kCancelled);
  }
  canceller.join();
}

TEST(ClusterTest, SilentWorkerFailsJobAfterLivenessDeadline) {
  CoordinatorOptions opt;
  opt.liveness_timeout = absl::Milliseconds(400);
  opt.heartbeat_interval = absl::Milliseconds(100);
  InProcessCoordinator server(opt);
  JobClient client({server.address(), absl::Seconds(10), absl::ZeroDuration(), {}});
  JobSubmission req;
  SpecParams p;
  p.extra_latchkey = {{"max_restarts", 0}};  // a lost worker fails the job
  req.spec_json = SpecJson(p);
  auto job = client.SubmitJob(req);
  ASSERT_TRUE(job.ok());
  auto alive = WorkerSession::Join(SessionOptions(server.address(), *job, "alive"));
  ASSERT_TRUE(alive.ok());
  WorkerSessionOptions silent_opts = SessionOptions(server.address(), *job, "silent");
  silent_opts.heartbeat = false;  // joins, then never speaks again
  auto silent = WorkerSession::Join(silent_opts);
  ASSERT_TRUE(silent.ok());
  const int silent_rank = (*silent)->info().rank;
  (*alive)->StartLatches(100);
  auto latch = (*alive)->AwaitLatch(100, absl::Seconds(20));
  EXPECT_EQ(latch.status().code(), absl::StatusCode::kFailedPrecondition) << latch.status();
  auto j = client.GetJob(job->job_id);
  ASSERT_TRUE(j.ok());
  EXPECT_EQ(j->state, JobState::kFailed);
  EXPECT_NE(j->failure_reason.find("rank " + std::to_string(silent_rank) + " (worker silent"),
            std::string::npos)
      << j->failure_reason;
  EXPECT_NE(j->failure_reason.find("liveness"), std::string::npos);
}

}  // namespace
}  // namespace latchkey::testing
