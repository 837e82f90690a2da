// latchkey-coordinator as a separate process: kill -9 and restart on the same SQLite file while
// workers stream latches; the metrics endpoint under promtool; the CLI's exit codes; SIGTERM.
#include "tests/support/process.h"

#include <signal.h>

#include <algorithm>
#include <fstream>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/job_client.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/coordinator/harness.h"
#include "tests/support/specs.h"
#include "tests/support/temp_dir.h"
#include "worker/session/worker_session.h"

namespace latchkey::testing {
namespace {

// GetJob from a client whose coordinator was killed and started again on the same port. The
// client's channel saw the first one die and reconnects with gRPC's backoff: a call made inside
// that backoff fails UNAVAILABLE at once though the second one serves (seen under ASan). What a
// test checks is what the restarted coordinator answers, so this waits for it (up to 10 s).
absl::StatusOr<JobInfo> GetJobAfterRestart(JobClient& client, const std::string& job_id) {
  auto job = client.GetJob(job_id);
  for (const absl::Time until = absl::Now() + absl::Seconds(10);
       absl::IsUnavailable(job.status()) && absl::Now() < until; job = client.GetJob(job_id)) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  return job;
}

SubmittedJob SubmitOrDie(JobClient& client, const SpecParams& p) {
  JobSubmission req;
  req.spec_json = SpecJson(p);
  auto r = client.SubmitJob(req);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : SubmittedJob();
}

std::vector<AuditedLatch> Audit(JobClient& client, const std::string& job_id) {
  auto r = client.ListAllLatches(job_id);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? r->latches : std::vector<AuditedLatch>();
}

// Options of a simulated worker that rides out a coordinator restart.
WorkerSessionOptions RestartTolerantWorker(const std::string& address, const SubmittedJob& job,
                                           const std::string& name, int rank) {
  WorkerSessionOptions o;
  o.coordinator = address;
  o.job_id = job.job_id;
  o.join_token = job.join_token;
  o.worker_id = name + "-" + std::to_string(rank);
  o.requested_rank = rank;
  o.retry_max = absl::Milliseconds(200);
  o.reconnect_timeout = absl::Seconds(60);
  return o;
}

// Joins ranks 0..world-1 in order; empty on the first failure (reported as a test failure).
std::vector<std::unique_ptr<WorkerSession>> JoinAll(const std::string& address,
                                                    const SubmittedJob& job,
                                                    const std::string& name, int world) {
  std::vector<std::unique_ptr<WorkerSession>> sessions;
  for (int i = 0; i < world; ++i) {
    auto session = WorkerSession::Join(RestartTolerantWorker(address, job, name, i));
    if (!session.ok()) {
      ADD_FAILURE() << "rank " << i << ": " << session.status();
      return {};
    }
    sessions.push_back(*std::move(session));
  }
  return sessions;
}

TEST(ProcessTest, KillNineAndRestartKeepsLatchesAndReportsAndWorkersResume) {
  constexpr int kWorld = 4;
  constexpr int kSteps = 30;
  const ScopedTempDir dir("coord-db");
  const std::string db = dir / "coord.db";
  const std::vector<std::string> args = {"--latch-lookahead", "2", "--liveness-timeout", "60"};
  auto first = std::make_unique<CoordinatorProcess>(db, 0, args);
  ASSERT_TRUE(first->Start());
  const int port = first->grpc_port();
  const std::string address = first->address();
  JobClient client({address, absl::Seconds(5), absl::ZeroDuration(), {}});
  SpecParams p;
  p.world_size = kWorld;
  p.tp = 2;
  p.steps = kSteps;
  const SubmittedJob job = SubmitOrDie(client, p);

  absl::Mutex mu;
  std::vector<int64_t> acked(kWorld, -1);  // highest step whose report the coordinator acked
  std::vector<std::vector<Latch>> received(kWorld);
  std::vector<absl::Status> status(kWorld);
  std::vector<std::thread> workers;
  for (int i = 0; i < kWorld; ++i) {
    workers.emplace_back([&, i] {
      WorkerSessionOptions o = RestartTolerantWorker(address, job, "proc-worker", i);
      o.retry_max = absl::Milliseconds(300);
      auto session = WorkerSession::Join(o);
      if (!session.ok()) {
        status[i] = session.status();
        return;
      }
      (*session)->StartLatches(0);
      for (int64_t s = 0; s < kSteps; ++s) {
        auto latch = (*session)->AwaitLatch(s, absl::Seconds(60));
        if (!latch.ok()) {
          status[i] = latch.status();
          return;
        }
        absl::SleepFor(absl::Milliseconds(30));  // "training"
        StepMetrics m;
        m.step = s;
        m.micro_batches = latch->latch.n;
        m.kv_mode = latch->latch.kv_mode;
        m.latch_generation = latch->latch.generation;
        m.loss = 1.0 + s;
        absl::Status st = (*session)->ReportStep(m);
        absl::MutexLock lock(&mu);
        received[i].push_back(latch->latch);
        if (!st.ok()) {
          status[i] = st;
          return;
        }
        acked[i] = s;
      }
    });
  }
  // Let the job get going, then kill the coordinator without warning.
  for (int i = 0; i < 300; ++i) {
    auto j = client.GetJob(job.job_id);
    if (j.ok() && j->steps_completed >= 8) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  const std::vector<AuditedLatch> before = Audit(client, job.job_id);
  ASSERT_GE(before.size(), 9u);
  // The reports the coordinator acknowledged, taken before the kill: once it is gone a
  // ReportStep returns OK as soon as the report is queued in the session's outbox (to be
  // re-sent), which is not an acknowledgement.
  std::vector<int64_t> acked_at_kill;
  {
    absl::MutexLock lock(&mu);
    acked_at_kill = acked;
  }
  first->Kill9();
  absl::SleepFor(absl::Milliseconds(700));  // workers are now retrying

  CoordinatorProcess second(db, port, args);
  ASSERT_TRUE(second.Start());
  auto restarted = GetJobAfterRestart(client, job.job_id);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  EXPECT_NE(restarted->state, JobState::kFailed) << restarted->failure_reason;
  for (const JobWorkerInfo& w : restarted->workers) {
    // Nothing acknowledged before the kill is lost.
    EXPECT_GE(w.steps_reported, acked_at_kill[static_cast<size_t>(w.rank)] + 1)
        << "rank " << w.rank;
  }
  const std::vector<AuditedLatch> after_restart = Audit(client, job.job_id);
  ASSERT_GE(after_restart.size(), before.size());
  for (size_t w = 0; w < before.size(); ++w) {
    EXPECT_EQ(before[w].latch, after_restart[w].latch)
        << "latch " << w << " changed across the restart";
    EXPECT_EQ(before[w].publish_time, after_restart[w].publish_time) << "latch " << w;
  }

  for (auto& t : workers) t.join();
  for (int i = 0; i < kWorld; ++i) {
    EXPECT_TRUE(status[i].ok()) << "worker " << i << ": " << status[i];
    EXPECT_EQ(received[i].size(), static_cast<size_t>(kSteps)) << "worker " << i;
    EXPECT_EQ(received[i], received[0]) << "worker " << i;
  }
  auto done = client.GetJob(job.job_id);
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->state, JobState::kSucceeded) << done->failure_reason;
  EXPECT_EQ(done->steps_completed, kSteps);
  const std::vector<AuditedLatch> final_audit = Audit(client, job.job_id);
  ASSERT_EQ(final_audit.size(), static_cast<size_t>(kSteps));
  for (int s = 0; s < kSteps; ++s) {
    EXPECT_EQ(final_audit[s].latch.first_micro_batch, received[0][s].first_micro_batch);
    EXPECT_EQ(final_audit[s].latch.generation, received[0][s].generation);
  }
  EXPECT_EQ(second.Terminate(), 0);
}

// latchkey.no_sync is part of the job's policy: windows published after a kill -9 and restart
// carry the submitted mask, not the default one.
TEST(ProcessTest, NoSyncMaskSurvivesKillNineAndRestart) {
  constexpr int kWorld = 2;
  constexpr int kSteps = 8;
  constexpr int kStepsBeforeKill = 3;
  const std::vector<bool> mask = {false, true, true, false};  // default: {true, true, true, false}
  const ScopedTempDir dir("coord-db");
  const std::string db = dir / "coord.db";
  const std::vector<std::string> args = {"--latch-lookahead", "1", "--liveness-timeout", "60"};
  auto first = std::make_unique<CoordinatorProcess>(db, 0, args);
  ASSERT_TRUE(first->Start());
  const int port = first->grpc_port();
  JobClient client({first->address(), absl::Seconds(5), absl::ZeroDuration(), {}});
  SpecParams p;
  p.world_size = kWorld;
  p.tp = 1;
  p.gas = 4;
  p.steps = kSteps;
  p.extra_latchkey = {{"no_sync", {false, true, true, false}}};
  const SubmittedJob job = SubmitOrDie(client, p);
  ASSERT_FALSE(job.job_id.empty());

  std::vector<std::unique_ptr<WorkerSession>> sessions =
      JoinAll(first->address(), job, "mask-worker", kWorld);
  ASSERT_EQ(sessions.size(), static_cast<size_t>(kWorld));
  for (auto& s : sessions) s->StartLatches(0);
  std::vector<Latch> received;  // rank 0's, window order
  auto run_step = [&](int64_t step) {
    for (int i = 0; i < kWorld; ++i) {
      auto latch = sessions[static_cast<size_t>(i)]->AwaitLatch(step, absl::Seconds(60));
      ASSERT_TRUE(latch.ok()) << "rank " << i << " step " << step << ": " << latch.status();
      if (i == 0) received.push_back(latch->latch);
      StepMetrics m;
      m.step = step;
      m.micro_batches = latch->latch.n;
      m.kv_mode = latch->latch.kv_mode;
      m.latch_generation = latch->latch.generation;
      ASSERT_TRUE(sessions[static_cast<size_t>(i)]->ReportStep(m).ok()) << step;
    }
  };
  for (int64_t s = 0; s < kStepsBeforeKill; ++s) run_step(s);
  const size_t published_before_kill = Audit(client, job.job_id).size();
  // Windows [0, completed + 1 + lookahead): the rest are published by the restarted coordinator.
  ASSERT_EQ(published_before_kill, static_cast<size_t>(kStepsBeforeKill + 2));
  ASSERT_LT(published_before_kill, static_cast<size_t>(kSteps));
  first->Kill9();

  CoordinatorProcess second(db, port, args);
  ASSERT_TRUE(second.Start());
  for (int64_t s = kStepsBeforeKill; s < kSteps; ++s) run_step(s);
  for (auto& s : sessions) s->Close();

  const std::vector<AuditedLatch> audit = Audit(client, job.job_id);
  ASSERT_EQ(audit.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(received.size(), static_cast<size_t>(kSteps));
  for (int s = 0; s < kSteps; ++s) {
    const std::vector<bool>& stored = audit[s].latch.no_sync;
    EXPECT_EQ(stored, mask) << "latch " << s << " (published "
                            << (static_cast<size_t>(s) < published_before_kill ? "before" : "after")
                            << " the restart)";
    EXPECT_EQ(received[static_cast<size_t>(s)].no_sync, mask) << "window " << s;
  }
  auto done = client.GetJob(job.job_id);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state, JobState::kSucceeded) << done->failure_reason;
  EXPECT_EQ(second.Terminate(), 0);
}

// Each step's learning rate and evaluation loss (rank 0's; rank 1 reports other numbers first)
// survive a kill -9 and restart: GetJob and WatchJob (one watch kept open across the restart,
// one opened after the job ended) show them, and a step without evaluation shows none.
TEST(ProcessTest, LrAndEvalLossSurviveKillNineAndComeBackInGetJobAndWatchJob) {
  constexpr int kWorld = 2;
  constexpr int kSteps = 6;
  constexpr int kStepsBeforeKill = 3;
  auto lr = [](int64_t s) { return 1e-3 * std::min<double>(1.0, (s + 1) / 3.0) / (1.0 + s * s); };
  auto eval = [](int64_t s) -> std::optional<double> {
    if (s % 3 == 0) return std::nullopt;  // steps 1, 2, 4, 5 evaluate
    return 4.0 - 0.3 * static_cast<double>(s) + 1.0 / 3.0;
  };
  const ScopedTempDir dir("coord-db");
  const std::string db = dir / "coord.db";
  const std::vector<std::string> args = {"--latch-lookahead", "1", "--liveness-timeout", "60"};
  auto first = std::make_unique<CoordinatorProcess>(db, 0, args);
  ASSERT_TRUE(first->Start());
  const int port = first->grpc_port();
  JobClient client({first->address(), absl::Seconds(5), absl::ZeroDuration(), {}});
  SpecParams p;
  p.world_size = kWorld;
  p.tp = 1;
  p.steps = kSteps;
  const SubmittedJob job = SubmitOrDie(client, p);
  ASSERT_FALSE(job.job_id.empty());

  // One watch for the whole job: JobClient reconnects it across the restart.
  absl::Mutex mu;
  std::vector<CompletedStep> watched;  // every step the watch showed, as step or last_step
  absl::StatusOr<JobInfo> watch_end;
  std::thread watcher([&] {
    watch_end = client.WatchJob(
        job.job_id,
        [&](const JobUpdate& u) {
          absl::MutexLock lock(&mu);
          if (u.step) watched.push_back(*u.step);
          if (u.job.last_step) watched.push_back(*u.job.last_step);
          return true;
        },
        absl::Now() + absl::Seconds(120));
  });

  std::vector<std::unique_ptr<WorkerSession>> sessions =
      JoinAll(first->address(), job, "lr-worker", kWorld);
  ASSERT_EQ(sessions.size(), static_cast<size_t>(kWorld));
  for (auto& s : sessions) s->StartLatches(0);
  auto run_step = [&](int64_t step) {
    for (int i = kWorld - 1; i >= 0; --i) {  // rank 0 last
      auto latch = sessions[static_cast<size_t>(i)]->AwaitLatch(step, absl::Seconds(60));
      ASSERT_TRUE(latch.ok()) << "rank " << i << " step " << step << ": " << latch.status();
      StepMetrics m;
      m.step = step;
      m.micro_batches = latch->latch.n;
      m.kv_mode = latch->latch.kv_mode;
      m.latch_generation = latch->latch.generation;
      m.loss = 3.0;
      m.lr = i == 0 ? lr(step) : 9.0;
      m.eval_loss = i == 0 ? eval(step) : std::optional<double>(99.0);
      ASSERT_TRUE(sessions[static_cast<size_t>(i)]->ReportStep(m).ok()) << step;
    }
  };
  auto expect_step = [&](const CompletedStep& c, const std::string& where) {
    const int64_t s = c.report.step;
    EXPECT_EQ(c.report.lr, lr(s)) << where << ", step " << s;
    EXPECT_EQ(c.report.eval_loss, eval(s)) << where << ", step " << s;
    EXPECT_EQ(c.ranks_reported, kWorld) << where << ", step " << s;
  };
  for (int64_t s = 0; s < kStepsBeforeKill; ++s) run_step(s);
  first->Kill9();
  // Down long enough that the watch's backoff has grown past a second: the steps after the
  // restart complete before it reopens, and it must still show each of them.
  absl::SleepFor(absl::Milliseconds(3500));

  CoordinatorProcess second(db, port, args);
  ASSERT_TRUE(second.Start());
  auto restarted = GetJobAfterRestart(client, job.job_id);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  EXPECT_EQ(restarted->steps_completed, kStepsBeforeKill);
  ASSERT_TRUE(restarted->last_step.has_value());
  EXPECT_EQ(restarted->last_step->report.step, kStepsBeforeKill - 1);
  expect_step(*restarted->last_step, "GetJob after the restart");
  for (int64_t s = kStepsBeforeKill; s < kSteps; ++s) run_step(s);
  for (auto& s : sessions) s->Close();
  watcher.join();

  ASSERT_TRUE(watch_end.ok()) << watch_end.status();
  EXPECT_EQ(watch_end->state, JobState::kSucceeded) << watch_end->failure_reason;
  std::set<int64_t> seen;
  for (const CompletedStep& c : watched) {
    expect_step(c, "WatchJob across the restart");
    seen.insert(c.report.step);
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(kSteps));
  // A watch opened now starts with the job as it is: the last step, evaluated.
  std::optional<CompletedStep> last;
  auto fresh = client.WatchJob(
      job.job_id,
      [&](const JobUpdate& u) {
        if (u.job.last_step) last = u.job.last_step;
        return true;
      },
      absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->report.step, kSteps - 1);
  ASSERT_TRUE(last->report.eval_loss.has_value());
  expect_step(*last, "WatchJob after the job ended");
  EXPECT_EQ(second.Terminate(), 0);
}

TEST(ProcessTest, MetricsEndpointPassesPromtoolAndSigtermExitsCleanly) {
  const ScopedTempDir dir("coord-db");
  CoordinatorProcess proc(dir / "coord.db");
  ASSERT_TRUE(proc.Start());
  ASSERT_GT(proc.metrics_port(), 0);
  JobClient client({proc.address(), absl::Seconds(5), absl::ZeroDuration(), {}});
  SpecParams p;
  p.world_size = 1;
  p.tp = 1;
  p.steps = 3;
  const SubmittedJob job = SubmitOrDie(client, p);
  SubmitOrDie(client, SpecParams());  // stays pending
  WorkerSessionOptions o;
  o.coordinator = proc.address();
  o.job_id = job.job_id;
  o.join_token = job.join_token;
  auto session = WorkerSession::Join(o);
  ASSERT_TRUE(session.ok()) << session.status();
  (*session)->StartLatches(0);
  for (int64_t s = 0; s < 3; ++s) {
    auto latch = (*session)->AwaitLatch(s, absl::Seconds(10));
    ASSERT_TRUE(latch.ok()) << latch.status();
    StepMetrics m;
    m.step = s;
    m.kv_mode = latch->latch.kv_mode;
    ASSERT_TRUE((*session)->ReportStep(m).ok());
  }
  (*session)->Close();

  const std::string text = HttpGet(proc.metrics_port(), "/metrics");
  EXPECT_NE(text.find("latchkey_jobs{state=\"succeeded\"} 1"), std::string::npos) << text;
  EXPECT_NE(text.find("latchkey_jobs{state=\"pending\"} 1"), std::string::npos) << text;
  EXPECT_NE(text.find("latchkey_workers{state=\"done\"} 1"), std::string::npos) << text;
  EXPECT_NE(text.find("latchkey_latches_published_total{kv_mode=\"coalesced\"} 3"),
            std::string::npos)
      << text;
  const std::string file = dir / "metrics.txt";
  std::ofstream(file) << text;
  const Captured lint = RunAndCapture({"/bin/sh", "-c", "promtool check metrics < " + file});
  EXPECT_EQ(lint.exit_code, 0) << lint.output;
  EXPECT_EQ(proc.Terminate(), 0);
}

// One coordinator per database (server/database_lock.h): a second coordinator started on the
// database a live one serves exits non-zero within seconds, naming the lock file and the holder
// (its pid), and the first keeps serving; once the first is killed with -9, a successor on the
// same database starts at once (the kernel let go of the dead holder's lock).
TEST(ProcessTest, ASecondCoordinatorOnALiveDatabaseIsRefusedAndAKilledHolderBlocksNoSuccessor) {
  const ScopedTempDir dir("coord-db");
  const std::string db = dir / "coord.db";
  CoordinatorProcess first(db);
  ASSERT_TRUE(first.Start());
  JobClient client({first.address(), absl::Seconds(5), absl::ZeroDuration(), {}});
  const SubmittedJob job = SubmitOrDie(client, SpecParams());

  const absl::Time t0 = absl::Now();
  const Captured second = RunAndCapture(
      {CoordinatorBinary(), "--listen", "127.0.0.1:0", "--db", db, "--metrics-port", "-1"},
      std::chrono::seconds(30));
  const double took = absl::ToDoubleSeconds(absl::Now() - t0);
  EXPECT_NE(second.exit_code, 0) << second.output;
  EXPECT_LT(took, 10.0);
  EXPECT_NE(second.output.find("--db " + db + " is served by another coordinator"),
            std::string::npos)
      << second.output;
  EXPECT_NE(second.output.find("pid " + std::to_string(first.pid())), std::string::npos)
      << second.output;
  EXPECT_NE(second.output.find("lock file " + db + ".lock"), std::string::npos) << second.output;
  // The first still serves, its job intact.
  auto seen = client.GetJob(job.job_id);
  ASSERT_TRUE(seen.ok()) << seen.status();
  EXPECT_EQ(seen->job_id, job.job_id);

  first.Kill9();
  CoordinatorProcess successor(db);
  const absl::Time t1 = absl::Now();
  ASSERT_TRUE(successor.Start());
  EXPECT_LT(absl::ToDoubleSeconds(absl::Now() - t1), 10.0);
  JobClient again({successor.address(), absl::Seconds(5), absl::ZeroDuration(), {}});
  auto kept = again.GetJob(job.job_id);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(successor.Terminate(), 0);
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    proc_ = std::make_unique<CoordinatorProcess>(dir_ / "coord.db");
    ASSERT_TRUE(proc_->Start());
  }
  Captured Cli(std::vector<std::string> args, int timeout_s = 30) {
    args.insert(args.begin(), {CliBinary(), "--coordinator", proc_->address(), "--timeout", "5"});
    return RunAndCapture(args, std::chrono::seconds(timeout_s));
  }
  std::string WriteFile(const std::string& name, const std::string& text) {
    const std::string path = dir_ / name;
    std::ofstream(path) << text;
    return path;
  }
  ScopedTempDir dir_{"cli"};  // declared first: outlives the coordinator using its db
  std::unique_ptr<CoordinatorProcess> proc_;
};

TEST_F(CliTest, ExitCodesScriptsCanRelyOn) {
  const std::string spec = WriteFile("spec.json", SpecJson());
  Captured r = Cli({"submit", spec});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("job_id: job-000001"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("join_token: "), std::string::npos);

  SpecParams bad;
  bad.zero_stage = 3;
  r = Cli({"submit", WriteFile("bad.json", SpecJson(bad))});
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("zero_optimization.stage"), std::string::npos) << r.output;
  EXPECT_EQ(Cli({"submit", dir_ / "missing.json"}).exit_code, 2);
  EXPECT_EQ(Cli({"status", "job-424242"}).exit_code, 4);
  EXPECT_EQ(Cli({"frobnicate"}).exit_code, 2);
  EXPECT_EQ(Cli({"update", "job-000001"}).exit_code, 2);
  // An invalid value is 3 whichever layer refuses it (here the CLI, for --gas 0 the coordinator).
  EXPECT_EQ(Cli({"update", "job-000001", "--kv-reduce", "sideways"}).exit_code, 3);
  EXPECT_EQ(Cli({"update", "job-000001", "--gas", "0"}).exit_code, 3);
  r = Cli({"update", "job-000001", "--gas", "2", "--expected-generation", "0"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("from window 0"), std::string::npos) << r.output;
  EXPECT_EQ(Cli({"update", "job-000001", "--gas", "3", "--expected-generation", "0"}).exit_code,
            5);  // stale generation: ABORTED

  r = Cli({"status", "job-000001"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("pending"), std::string::npos) << r.output;  // states are lowercase
  r = Cli({"--json", "list"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto listed = nlohmann::json::parse(r.output, nullptr, false);
  ASSERT_TRUE(listed.is_object()) << r.output;
  EXPECT_EQ(listed["jobs"][0]["job_id"], "job-000001");
  EXPECT_EQ(Cli({"latches", "job-000001"}).exit_code, 0);

  // submit --watch on a job nobody runs: the watch deadline passes.
  r = Cli({"submit", spec, "--watch", "--watch-timeout", "1"});
  EXPECT_EQ(r.exit_code, 6) << r.output;

  EXPECT_EQ(Cli({"cancel", "job-000001"}).exit_code, 0);
  EXPECT_EQ(Cli({"cancel", "job-000001"}).exit_code, 5);
  r = Cli({"watch", "job-000001"});
  EXPECT_EQ(r.exit_code, 11) << r.output;

  // Unreachable coordinator.
  const Captured down =
      RunAndCapture({CliBinary(), "--coordinator", "127.0.0.1:1", "--timeout", "1", "list"});
  EXPECT_EQ(down.exit_code, 6) << down.output;
}

TEST_F(CliTest, WatchFollowsAJobToSuccess) {
  JobClient client({proc_->address(), absl::Seconds(5), absl::ZeroDuration(), {}});
  SpecParams p;
  p.world_size = 1;
  p.tp = 1;
  p.steps = 5;
  const SubmittedJob job = SubmitOrDie(client, p);
  Captured watch;
  std::thread watcher([&] { watch = Cli({"watch", job.job_id}, 60); });
  WorkerSessionOptions o;
  o.coordinator = proc_->address();
  o.job_id = job.job_id;
  o.join_token = job.join_token;
  auto session = WorkerSession::Join(o);
  ASSERT_TRUE(session.ok()) << session.status();
  (*session)->StartLatches(0);
  for (int64_t s = 0; s < 5; ++s) {
    auto latch = (*session)->AwaitLatch(s, absl::Seconds(10));
    ASSERT_TRUE(latch.ok()) << latch.status();
    absl::SleepFor(absl::Milliseconds(100));
    StepMetrics m;
    m.step = s;
    m.kv_mode = latch->latch.kv_mode;
    m.loss = 2.5;
    m.tokens = 1000;
    m.step_seconds = 0.1;
    m.lr = 2.5e-4 * static_cast<double>(s + 1);
    if (s == 2 || s == 4) m.eval_loss = 2.0 + 0.125 * static_cast<double>(s);
    ASSERT_TRUE((*session)->ReportStep(m).ok());
  }
  watcher.join();
  EXPECT_EQ(watch.exit_code, 0) << watch.output;
  EXPECT_NE(watch.output.find("step 5/5"), std::string::npos) << watch.output;
  // Each step's lr; the eval loss on (and only on) the steps that evaluated (2 and 4). The
  // step counter is the job's when the line was drawn, so it is not matched here.
  for (const char* line : {"loss 2.5000 lr 2.500e-04 ", "loss 2.5000 lr 5.000e-04 ",
                           "loss 2.5000 eval 2.2500 lr 7.500e-04 ", "loss 2.5000 lr 1.000e-03 ",
                           "loss 2.5000 eval 2.5000 lr 1.250e-03 "}) {
    EXPECT_NE(watch.output.find(line), std::string::npos) << line << "\n" << watch.output;
  }
  const Captured status = Cli({"status", job.job_id});
  EXPECT_EQ(status.exit_code, 0) << status.output;
  EXPECT_NE(status.output.find("last step:    4 loss 2.5000 eval_loss 2.5000 lr 1.250e-03"),
            std::string::npos)
      << status.output;
  // --json status is the wire's proto JSON, new fields included.
  const Captured json = Cli({"--json", "status", job.job_id});
  ASSERT_EQ(json.exit_code, 0) << json.output;
  const auto parsed =
      nlohmann::json::parse(json.output.substr(0, json.output.find('\n')), nullptr, false);
  ASSERT_TRUE(parsed.is_object()) << json.output;
  const nlohmann::json& last =
      parsed.contains("job") ? parsed["job"]["last_step"] : parsed["last_step"];
  EXPECT_EQ(last["lr"], 1.25e-3) << json.output;
  EXPECT_EQ(last["eval_loss"], 2.5) << json.output;
  EXPECT_NE(watch.output.find("loss 2.5000"), std::string::npos) << watch.output;
  EXPECT_NE(watch.output.find("tok/s 10000"), std::string::npos) << watch.output;
  EXPECT_NE(watch.output.find("succeeded"), std::string::npos) << watch.output;
}

}  // namespace
}  // namespace latchkey::testing
