#include "server/sqlite_store.h"

#include <sqlite3.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace latchkey {
namespace {

JobRecord Job(const std::string& id, int64_t seq) {
  JobRecord j;
  j.job_id = id;
  j.seq = seq;
  j.spec_json = "{}";
  j.join_token = "t";
  j.rendezvous_port = 29500;
  j.warnings = {"unknown key x"};
  j.create_time = j.update_time = absl::FromUnixMicros(1234567);
  return j;
}

PublishedLatch L(const std::string& job, int64_t w, int64_t m, int n) {
  PublishedLatch p;
  p.latch.job_id = job;
  p.latch.window = w;
  p.latch.first_micro_batch = m;
  p.latch.first_sample = 2 * m;  // DP * MB = 2
  p.latch.n = n;
  p.latch.kv_mode = KvMode::kCoalesced;
  p.latch.no_sync.assign(static_cast<size_t>(n), true);
  p.latch.no_sync.back() = false;
  p.latch.reason = "auto → coalesced";
  p.publish_time = absl::FromUnixMicros(99);
  return p;
}

TEST(SqliteStoreTest, JobsWorkersLatchesSurviveReopen) {
  testing::ScopedTempDir dir;
  const std::string path = dir.path() + "/coord.db";
  {
    auto store = SqliteStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->CreateJob(Job("job-1", 1)).ok());
    WorkerRecord w{"job-1", 1, "w1", "10.0.0.2", WorkerState::kActive, absl::FromUnixMicros(5)};
    ASSERT_TRUE((*store)->PutWorker(w).ok());
    ASSERT_TRUE((*store)
                    ->AppendLatches("job-1", {L("job-1", 0, 0, 4), L("job-1", 1, 4, 4)}, 2, 8, 16)
                    .ok());
    PolicyChangeRecord c;
    c.job_id = "job-1";
    c.policy.kv_reduce = KvReducePolicy::kDeferred;
    c.policy.gradient_accumulation_steps = 2;
    c.policy.generation = 1;
    c.first_window = 2;
    ASSERT_TRUE((*store)->AppendPolicyChange(c).ok());
  }
  auto store = SqliteStore::Open(path);
  ASSERT_TRUE(store.ok());
  auto jobs = (*store)->LoadJobs();
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 1u);
  const JobRecord& j = (*jobs)[0];
  EXPECT_EQ(j.next_window, 2);
  EXPECT_EQ(j.next_first_micro_batch, 8);
  EXPECT_EQ(j.next_first_sample, 16);
  EXPECT_EQ(j.policy.kv_reduce, KvReducePolicy::kDeferred);
  EXPECT_EQ(j.policy.gradient_accumulation_steps, 2);
  EXPECT_EQ(j.policy.generation, 1);
  EXPECT_EQ(j.warnings, std::vector<std::string>{"unknown key x"});
  EXPECT_EQ(j.create_time, absl::FromUnixMicros(1234567));
  auto workers = (*store)->LoadWorkers();
  ASSERT_TRUE(workers.ok());
  ASSERT_EQ(workers->size(), 1u);
  EXPECT_EQ((*workers)[0].host, "10.0.0.2");
  EXPECT_EQ((*workers)[0].state, WorkerState::kActive);
  auto latches = (*store)->LoadLatches("job-1", 0, 100);
  ASSERT_TRUE(latches.ok());
  ASSERT_EQ(latches->size(), 2u);
  EXPECT_EQ((*latches)[1].latch, L("job-1", 1, 4, 4).latch);
  auto changes = (*store)->LoadPolicyChanges("job-1");
  ASSERT_TRUE(changes.ok());
  ASSERT_EQ(changes->size(), 1u);
  EXPECT_EQ((*changes)[0].first_window, 2);
}

TEST(SqliteStoreTest, LatchesAreAppendOnly) {
  testing::ScopedTempDir dir;
  const std::string path = dir.path() + "/coord.db";
  auto store = SqliteStore::Open(path);
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->CreateJob(Job("job-1", 1)).ok());
  ASSERT_TRUE((*store)->AppendLatches("job-1", {L("job-1", 0, 0, 4)}, 1, 4, 8).ok());
  // Publishing window 0 again is refused, and the job's position does not move.
  absl::Status again = (*store)->AppendLatches("job-1", {L("job-1", 0, 0, 2)}, 1, 2, 4);
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
  EXPECT_EQ((*store)->LoadJobs()->front().next_first_micro_batch, 4);
  EXPECT_EQ((*store)->LoadLatches("job-1", 0, 10)->front().latch.n, 4);

  // Even SQL from outside cannot rewrite or delete the audit.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char* err = nullptr;
  EXPECT_NE(sqlite3_exec(db, "UPDATE latches SET n=9", nullptr, nullptr, &err), SQLITE_OK);
  sqlite3_free(err);
  EXPECT_NE(sqlite3_exec(db, "DELETE FROM latches", nullptr, nullptr, &err), SQLITE_OK);
  sqlite3_free(err);
  sqlite3_close(db);
}

TEST(SqliteStoreTest, StepReportsAreIdempotentPerJobRankStep) {
  auto store = SqliteStore::Open(":memory:");
  ASSERT_TRUE(store.ok());
  StepReportRecord r;
  r.job_id = "job-1";
  r.rank = 1;
  r.report.step = 3;
  r.report.loss = 2.5;
  r.report.collective_calls = {{"all_reduce/tp", 96}, {"all_reduce/dp", 1}};
  auto first = (*store)->InsertStepReport(r);
  ASSERT_TRUE(first.ok());
  EXPECT_TRUE(*first);
  r.report.loss = 9.0;  // a repeat with different numbers does not overwrite the first
  auto second = (*store)->InsertStepReport(r);
  ASSERT_TRUE(second.ok());
  EXPECT_FALSE(*second);
  r.rank = 0;
  EXPECT_TRUE(*(*store)->InsertStepReport(r));
  auto all = (*store)->LoadStepReports("job-1", 0);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[1].report.loss, 2.5);
  EXPECT_EQ((*all)[1].report.collective_calls.at("all_reduce/tp"), 96);
  auto progress = (*store)->LoadProgress();
  ASSERT_TRUE(progress.ok());
  EXPECT_EQ(progress->size(), 2u);
}

TEST(SqliteStoreTest, StepReportKeepsLrAndEvalLossOnlyWhereEvaluationRan) {
  testing::ScopedTempDir dir;
  const std::string path = dir.path() + "/coord.db";
  {
    auto store = SqliteStore::Open(path);
    ASSERT_TRUE(store.ok());
    StepReportRecord r;
    r.job_id = "job-1";
    r.report.step = 0;
    r.report.lr = 1.2345678901234567e-4;
    ASSERT_TRUE(*(*store)->InsertStepReport(r));
    r.report.step = 1;
    r.report.lr = 0.0;  // a warmup's first steps run at lr 0
    r.report.eval_loss = 5.4321098765432109;
    ASSERT_TRUE(*(*store)->InsertStepReport(r));
  }
  auto store = SqliteStore::Open(path);
  ASSERT_TRUE(store.ok());
  auto all = (*store)->LoadStepReports("job-1", 0);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].report.lr, 1.2345678901234567e-4);  // float64, bit for bit
  EXPECT_FALSE((*all)[0].report.eval_loss.has_value());
  EXPECT_EQ((*all)[1].report.lr, 0.0);
  ASSERT_TRUE((*all)[1].report.eval_loss.has_value());
  EXPECT_EQ(*(*all)[1].report.eval_loss, 5.4321098765432109);
}

// The audit reader's rows are exactly what the writer's Load* calls return.
TEST(SqliteStoreTest, AuditReaderReadsWhatTheStoreLoads) {
  testing::ScopedTempDir dir;
  auto store = SqliteStore::Open(dir.path() + "/coord.db");
  ASSERT_TRUE(store.ok()) << store.status();
  AuditReader* reader = (*store)->audit_reader();
  ASSERT_NE(reader, nullptr);  // a file in WAL mode
  ASSERT_TRUE((*store)->CreateJob(Job("job-1", 1)).ok());
  ASSERT_TRUE(
      (*store)->AppendLatches("job-1", {L("job-1", 0, 0, 4), L("job-1", 1, 4, 4)}, 2, 8, 16).ok());
  PolicyChangeRecord c;
  c.job_id = "job-1";
  c.policy.generation = 1;
  c.first_window = 2;
  ASSERT_TRUE((*store)->AppendPolicyChange(c).ok());
  ASSERT_TRUE((*store)->AppendEvent({"job-1", absl::FromUnixMicros(7), 1, "recovery", "r"}).ok());

  auto rows = reader->ReadAudit("job-1", 1, 10);
  ASSERT_TRUE(rows.ok()) << rows.status();
  auto latches = (*store)->LoadLatches("job-1", 1, 10);
  ASSERT_EQ(rows->latches.size(), 1u);
  EXPECT_EQ(rows->latches[0].latch, (*latches)[0].latch);
  EXPECT_EQ(rows->latches[0].publish_time, (*latches)[0].publish_time);
  ASSERT_EQ(rows->policy_changes.size(), 1u);
  EXPECT_EQ(rows->policy_changes[0].first_window, 2);
  ASSERT_EQ(rows->events.size(), 1u);
  EXPECT_EQ(rows->events[0].kind, "recovery");
  EXPECT_EQ(rows->events[0].time, absl::FromUnixMicros(7));

  // A later commit is in the next read: a read leaves no snapshot behind.
  ASSERT_TRUE((*store)->AppendLatches("job-1", {L("job-1", 2, 8, 4)}, 3, 12, 24).ok());
  EXPECT_EQ(reader->ReadAudit("job-1", 0, 10)->latches.size(), 3u);
  EXPECT_TRUE(reader->ReadAudit("job-2", 0, 10)->latches.empty());
}

TEST(SqliteStoreTest, InMemoryStoreHasNoAuditReader) {
  auto store = SqliteStore::Open(":memory:");
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->audit_reader(), nullptr);
}

// A write transaction in progress on another connection neither blocks the reader nor shows
// through: it reads the last commit.
TEST(SqliteStoreTest, AuditReaderDoesNotWaitForAnOpenWrite) {
  testing::ScopedTempDir dir;
  const std::string path = dir.path() + "/coord.db";
  auto store = SqliteStore::Open(path);
  ASSERT_TRUE(store.ok());
  ASSERT_NE((*store)->audit_reader(), nullptr);
  ASSERT_TRUE((*store)->CreateJob(Job("job-1", 1)).ok());
  ASSERT_TRUE((*store)->AppendLatches("job-1", {L("job-1", 0, 0, 4)}, 1, 4, 8).ok());
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db,
                         "BEGIN IMMEDIATE; INSERT INTO latches (job_id, window, generation, "
                         "first_micro_batch, n, kv_mode, no_sync, reason, publish_us, "
                         "first_sample) VALUES "
                         "('job-1', 1, 0, 4, 4, 'coalesced', '1110', 'x', 99, 8);",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  const absl::Time start = absl::Now();
  auto rows = (*store)->audit_reader()->ReadAudit("job-1", 0, 10);
  // A reader that waited for the writer would wait out the 5 s busy timeout and then fail
  // (SQLITE_BUSY): the status tells the two apart whatever the machine's load, and the time
  // bound is that timeout itself, not a guess at how fast a read is.
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(rows->latches.size(), 1u);
  ASSERT_EQ(sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  EXPECT_EQ((*store)->audit_reader()->ReadAudit("job-1", 0, 10)->latches.size(), 2u);
}

// Reads on their own thread while the writer appends: each read is a whole prefix of the windows
// and never older than the one before.
TEST(SqliteStoreTest, AuditReaderRunsAlongsideTheWriter) {
  testing::ScopedTempDir dir;
  auto store = SqliteStore::Open(dir.path() + "/coord.db");
  ASSERT_TRUE(store.ok());
  AuditReader* reader = (*store)->audit_reader();
  ASSERT_NE(reader, nullptr);
  ASSERT_TRUE((*store)->CreateJob(Job("job-1", 1)).ok());
  constexpr int kWindows = 100;
  std::atomic<bool> done{false};
  std::vector<std::string> problems;
  std::thread read([&] {
    size_t last = 0;
    while (!done.load()) {
      auto rows = reader->ReadAudit("job-1", 0, kWindows);
      if (!rows.ok()) {
        problems.push_back(std::string(rows.status().message()));
        return;
      }
      for (size_t i = 0; i < rows->latches.size(); ++i) {
        if (rows->latches[i].latch.window != static_cast<int64_t>(i)) {
          problems.push_back("window " + std::to_string(i) + " missing");
        }
      }
      if (rows->latches.size() < last) problems.push_back("went back");
      last = rows->latches.size();
    }
  });
  for (int w = 0; w < kWindows; ++w) {
    absl::Status s =
        (*store)->AppendLatches("job-1", {L("job-1", w, 4 * w, 4)}, w + 1, 4 * w + 4, 8 * w + 8);
    EXPECT_TRUE(s.ok()) << s;  // no ASSERT: the reader thread must be joined
    if (!s.ok()) break;
  }
  done = true;
  read.join();
  EXPECT_TRUE(problems.empty()) << problems.front();
  EXPECT_EQ(reader->ReadAudit("job-1", 0, kWindows)->latches.size(), size_t{kWindows});
}

TEST(SqliteStoreTest, UnopenablePathIsUnavailable) {
  auto store = SqliteStore::Open("/nonexistent-dir/x/coord.db");
  EXPECT_EQ(store.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(store.status().message().find("--db"), absl::string_view::npos);
}

}  // namespace
}  // namespace latchkey
