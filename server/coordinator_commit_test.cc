// Group commit of step reports when the commit fails: real SQLite on a file and a real write
// fault. While a WriteFault is in scope every write to a regular file past its first byte fails
// with EFBIG (RLIMIT_FSIZE of 1 byte, SIGXFSZ ignored): SQLite's COMMIT, which appends frames to
// the WAL, fails with a disk I/O error, while BEGIN IMMEDIATE and INSERTs that fit the page
// cache write nothing and succeed. A report is acknowledged only once it is in the file, a
// retry of it is not counted twice, and reports the store cannot keep stop the coordinator.
#include <signal.h>
#include <sqlite3.h>
#include <sys/resource.h>

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
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

// Writes to regular files fail (EFBIG) from construction until Lift() or destruction. Applies to
// the whole test process: what the test prints meanwhile goes to a pipe or a terminal, not a
// file.
class WriteFault {
 public:
  WriteFault() {
    signal(SIGXFSZ, SIG_IGN);
    EXPECT_EQ(getrlimit(RLIMIT_FSIZE, &saved_), 0);
    rlimit one = saved_;
    one.rlim_cur = 1;
    EXPECT_EQ(setrlimit(RLIMIT_FSIZE, &one), 0);
  }
  ~WriteFault() { Lift(); }
  WriteFault(const WriteFault&) = delete;
  WriteFault& operator=(const WriteFault&) = delete;
  void Lift() {
    if (on_) {
      EXPECT_EQ(setrlimit(RLIMIT_FSIZE, &saved_), 0);
    }
    on_ = false;
  }

 private:
  rlimit saved_{};
  bool on_ = true;
};

StepReportRecord Report(const std::string& job_id, int rank, int64_t step, int64_t generation) {
  StepReportRecord r;
  r.job_id = job_id;
  r.rank = rank;
  r.report.step = step;
  r.report.latch_generation = generation;
  r.report.loss = 1.0 / (step + 1);
  r.report.tokens = 128;
  r.report.step_seconds = 0.01;
  r.report_time = absl::FromUnixSeconds(1700000000);
  return r;
}

// A report whose row is larger than SQLite's page cache (2 MiB by default): inserting it writes
// pages into the WAL before the commit.
StepReportRecord LargeReport(const std::string& job_id, int rank, int64_t step) {
  StepReportRecord r = Report(job_id, rank, step, 1);
  r.report.collective_calls[std::string(4 << 20, 'x')] = 1;
  return r;
}

std::unique_ptr<SqliteStore> OpenStore(const std::string& path) {
  auto store = SqliteStore::Open(path);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? *std::move(store) : nullptr;
}

size_t StoredReports(const std::string& path, const std::string& job_id) {
  std::unique_ptr<SqliteStore> store = OpenStore(path);
  if (store == nullptr) return 0;
  auto rows = store->LoadStepReports(job_id, 0);
  EXPECT_TRUE(rows.ok()) << rows.status();
  return rows.ok() ? rows->size() : 0;
}

JobEventRecord Event(const std::string& job_id) {
  JobEventRecord e;
  e.job_id = job_id;
  e.kind = "checkpoint";
  e.message = "m";
  return e;
}

TEST(SqliteGroupCommitTest, AFailedCommitKeepsTheReportsStagedForTheNextOne) {
  ScopedTempDir dir("group-commit");
  const std::string db = dir / "latchkey.db";
  {
    std::unique_ptr<SqliteStore> store = OpenStore(db);
    ASSERT_NE(store, nullptr);
    WriteFault fault;
    ASSERT_TRUE(*store->StageStepReport(Report("j", 0, 0, 1)));
    ASSERT_TRUE(*store->StageStepReport(Report("j", 1, 0, 1)));
    absl::Status commit = store->CommitGroup();
    EXPECT_FALSE(commit.ok());
    EXPECT_NE(commit.code(), absl::StatusCode::kDataLoss) << commit;
    EXPECT_TRUE(store->HasStaged());
    // A repeat finds its report staged.
    auto again = store->StageStepReport(Report("j", 0, 0, 1));
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_FALSE(*again);
    // Another write commits the group first; that fails too and keeps it staged.
    EXPECT_FALSE(store->AppendEvent(Event("j")).ok());
    EXPECT_TRUE(store->HasStaged());
    EXPECT_EQ(store->LoadStepReports("j", 0)->size(), 2u);  // reads see the staged reports
    fault.Lift();
    ASSERT_TRUE(store->CommitGroup().ok());
    EXPECT_FALSE(store->HasStaged());
  }
  EXPECT_EQ(StoredReports(db, "j"), 2u);
}

TEST(SqliteGroupCommitTest, AnInsertThatFailsInTheCommitKeepsEveryReportStaged) {
  ScopedTempDir dir("group-commit");
  const std::string db = dir / "latchkey.db";
  {
    std::unique_ptr<SqliteStore> store = OpenStore(db);
    ASSERT_NE(store, nullptr);
    WriteFault fault;
    ASSERT_TRUE(*store->StageStepReport(Report("j", 0, 0, 1)));
    // Too large for the page cache: its INSERT writes into the WAL, fails, and SQLite rolls the
    // whole transaction back. Nothing is lost: the reports are staged in memory.
    ASSERT_TRUE(*store->StageStepReport(LargeReport("j", 1, 0)));
    absl::Status commit = store->CommitGroup();
    EXPECT_FALSE(commit.ok());
    EXPECT_NE(commit.code(), absl::StatusCode::kDataLoss) << commit;
    EXPECT_TRUE(store->HasStaged());
    fault.Lift();
    ASSERT_TRUE(store->CommitGroup().ok());
    EXPECT_FALSE(store->HasStaged());
  }
  std::unique_ptr<SqliteStore> reopened = OpenStore(db);
  ASSERT_NE(reopened, nullptr);
  EXPECT_TRUE(reopened->LoadStepReport("j", 0, 0).ok());
  EXPECT_TRUE(reopened->LoadStepReport("j", 1, 0).ok());
}

// A trigger, made through a connection of the test's own, that refuses every INSERT into
// step_reports after `deadline`: a report staged before it can never be stored after it.
void RefuseReportsAfter(const std::string& db, absl::Time deadline) {
  sqlite3* conn = nullptr;
  ASSERT_EQ(sqlite3_open(db.c_str(), &conn), SQLITE_OK);
  sqlite3_busy_timeout(conn, 5000);
  const std::string sql = absl::StrCat(
      "CREATE TRIGGER refuse_late BEFORE INSERT ON step_reports "
      "WHEN (julianday('now') - 2440587.5) * 86400.0 > ",
      absl::StrFormat("%.3f", absl::ToDoubleSeconds(deadline - absl::UnixEpoch())),
      " BEGIN SELECT RAISE(ABORT, 'step_reports: refused after the deadline'); END");
  char* err = nullptr;
  EXPECT_EQ(sqlite3_exec(conn, sql.c_str(), nullptr, nullptr, &err), SQLITE_OK) << err;
  sqlite3_free(err);
  sqlite3_close(conn);
}

TEST(SqliteGroupCommitTest, AReportSqliteRefusesIsDataLossAndTheOthersAreStored) {
  ScopedTempDir dir("group-commit");
  const std::string db = dir / "latchkey.db";
  {
    std::unique_ptr<SqliteStore> store = OpenStore(db);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(*store->StageStepReport(Report("j", 0, 0, 1)));
    ASSERT_TRUE(*store->StageStepReport(Report("j", 1, 0, 1)));
    // Refused from now on, but only while the first report is written: the second is stored.
    sqlite3* conn = nullptr;
    ASSERT_EQ(sqlite3_open(db.c_str(), &conn), SQLITE_OK);
    char* err = nullptr;
    ASSERT_EQ(sqlite3_exec(conn,
                           "CREATE TRIGGER refuse_rank0 BEFORE INSERT ON step_reports "
                           "WHEN NEW.rank = 0 BEGIN SELECT RAISE(ABORT, 'rank 0 refused'); END",
                           nullptr, nullptr, &err),
              SQLITE_OK)
        << err;
    sqlite3_free(err);
    sqlite3_close(conn);
    absl::Status commit = store->CommitGroup();
    EXPECT_EQ(commit.code(), absl::StatusCode::kDataLoss) << commit;
    EXPECT_TRUE(absl::StrContains(commit.message(), "1 staged step reports lost")) << commit;
    EXPECT_TRUE(absl::StrContains(commit.message(), "rank 0")) << commit;
    EXPECT_TRUE(store->HasStaged());  // rank 1's report, not refused
    // Later commits store what else is staged and keep saying the loss; other writes go on.
    EXPECT_EQ(store->CommitGroup().code(), absl::StatusCode::kDataLoss);
    EXPECT_FALSE(store->HasStaged());
    EXPECT_TRUE(store->AppendEvent(Event("j")).ok());
  }
  std::unique_ptr<SqliteStore> reopened = OpenStore(db);
  ASSERT_NE(reopened, nullptr);
  EXPECT_TRUE(absl::IsNotFound(reopened->LoadStepReport("j", 0, 0).status()));
  EXPECT_TRUE(reopened->LoadStepReport("j", 1, 0).ok());
}

// Another connection holds SQLite's write lock (BEGIN IMMEDIATE) until Release: a commit of the
// store waits for it (its busy timeout is 5 s), as it would for a slow disk.
class WriteLockHolder {
 public:
  explicit WriteLockHolder(const std::string& db) {
    EXPECT_EQ(sqlite3_open(db.c_str(), &conn_), SQLITE_OK);
    EXPECT_EQ(sqlite3_exec(conn_, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK);
  }
  ~WriteLockHolder() { Release(); }
  WriteLockHolder(const WriteLockHolder&) = delete;
  WriteLockHolder& operator=(const WriteLockHolder&) = delete;
  void Release() {
    if (conn_ == nullptr) return;
    sqlite3_exec(conn_, "COMMIT", nullptr, nullptr, nullptr);
    sqlite3_close(conn_);
    conn_ = nullptr;
  }

 private:
  sqlite3* conn_ = nullptr;
};

TEST(SqliteGroupCommitTest, StagingAndReadsDoNotWaitForACommitInProgress) {
  ScopedTempDir dir("group-commit");
  const std::string db = dir / "latchkey.db";
  std::unique_ptr<SqliteStore> store = OpenStore(db);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->CommitsBesideOtherCalls());
  ASSERT_TRUE(*store->StageStepReport(Report("j", 0, 0, 1)));
  WriteLockHolder holder(db);
  absl::Notification committed;
  absl::Status commit;
  std::thread committer([&] {
    commit = store->CommitGroup();  // waits for the write lock
    committed.Notify();
  });
  absl::SleepFor(absl::Milliseconds(200));
  ASSERT_FALSE(committed.HasBeenNotified());
  // Meanwhile, on this thread: staging, a repeat of the report being committed, and reads.
  const absl::Time begin = absl::Now();
  ASSERT_TRUE(*store->StageStepReport(Report("j", 1, 0, 1)));
  EXPECT_FALSE(*store->StageStepReport(Report("j", 0, 0, 1)));
  EXPECT_TRUE(store->HasStaged());
  auto both = store->LoadStepReports("j", 0);
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(both->size(), 2u);
  EXPECT_TRUE(store->LoadJobs().ok());
  // Far below the 5 s the commit may wait: nothing above waited for it.
  EXPECT_LT(absl::Now() - begin, absl::Seconds(1));
  EXPECT_FALSE(committed.HasBeenNotified());
  holder.Release();
  committer.join();
  ASSERT_TRUE(commit.ok()) << commit;
  // The commit took the report staged before it; the one staged meanwhile is still staged.
  EXPECT_TRUE(store->HasStaged());
  ASSERT_TRUE(store->CommitGroup().ok());
  EXPECT_FALSE(store->HasStaged());
  store.reset();
  EXPECT_EQ(StoredReports(db, "j"), 2u);
}

TEST(SqliteGroupCommitTest, AnotherWriteWaitsForACommitInProgressThenCommitsWhatIsStaged) {
  ScopedTempDir dir("group-commit");
  const std::string db = dir / "latchkey.db";
  std::unique_ptr<SqliteStore> store = OpenStore(db);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(*store->StageStepReport(Report("j", 0, 0, 1)));
  WriteLockHolder holder(db);
  std::thread committer([&] { EXPECT_TRUE(store->CommitGroup().ok()); });
  absl::SleepFor(absl::Milliseconds(200));
  ASSERT_TRUE(*store->StageStepReport(Report("j", 1, 0, 1)));  // staged during the commit
  absl::Notification written;
  std::thread writer([&] {
    EXPECT_TRUE(store->AppendEvent(Event("j")).ok());
    written.Notify();
  });
  // The write waits: written now, it could be durable before the reports staged before it.
  EXPECT_FALSE(written.WaitForNotificationWithTimeout(absl::Milliseconds(500)));
  holder.Release();
  committer.join();
  writer.join();
  // It committed the report staged during the commit before its own row.
  EXPECT_FALSE(store->HasStaged());
  store.reset();
  EXPECT_EQ(StoredReports(db, "j"), 2u);
}

// The answer of an asynchronous ReportStep.
class Answer {
 public:
  void Set(absl::StatusOr<WorkerStatus> r) {
    absl::MutexLock lock(&mu_);
    result_ = std::move(r);
  }
  // Whether it came within `timeout`.
  bool WaitFor(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(this, &Answer::Has), timeout);
  }
  absl::StatusOr<WorkerStatus> Get() {
    absl::MutexLock lock(&mu_);
    return result_.value_or(absl::UnknownError("no answer"));
  }

 private:
  bool Has() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return result_.has_value(); }
  absl::Mutex mu_;
  std::optional<absl::StatusOr<WorkerStatus>> result_ ABSL_GUARDED_BY(mu_);
};

// What the coordinator logged and the fatal errors it raised (options.log and on_fatal).
struct Heard {
  absl::Mutex mu;
  std::vector<std::string> lines ABSL_GUARDED_BY(mu);
  std::vector<absl::Status> fatal ABSL_GUARDED_BY(mu);

  int Lines(const std::string& part) {
    absl::MutexLock lock(&mu);
    int n = 0;
    for (const std::string& l : lines) n += absl::StrContains(l, part) ? 1 : 0;
    return n;
  }
  bool AwaitFatal(absl::Duration timeout) {
    absl::MutexLock lock(&mu);
    return mu.AwaitWithTimeout(
        absl::Condition(
            +[](std::vector<absl::Status>* f) { return !f->empty(); }, &fatal),
        timeout);
  }
};

// A 2-rank job on a database file, both ranks joined; step 0's latch generation.
struct Running {
  std::unique_ptr<Coordinator> c;
  std::string id;
  std::vector<WorkerCall> calls;
  int64_t generation = 0;
};

// `catch_fatal`: on_fatal records into `heard`; false: the default (the process ends).
Running Start(const std::string& db, Heard& heard, bool catch_fatal = true) {
  CoordinatorOptions opt;
  opt.log = [&heard](const std::string& line) {
    absl::MutexLock lock(&heard.mu);
    heard.lines.push_back(line);
  };
  if (catch_fatal) {
    opt.on_fatal = [&heard](const absl::Status& s) {
      absl::MutexLock lock(&heard.mu);
      heard.fatal.push_back(s);
    };
  }
  auto c = Coordinator::Create(OpenStore(db), opt, nullptr);
  EXPECT_TRUE(c.ok()) << c.status();
  Running r{*std::move(c), "", {}, 0};
  SpecParams p;
  p.world_size = 2;
  p.steps = 20;
  auto job = r.c->SubmitJob({SpecJson(p), "", "", 0});
  EXPECT_TRUE(job.ok()) << job.status();
  r.id = job->job.record.job_id;
  for (int i = 0; i < 2; ++i) {
    JoinArgs a;
    a.call = {r.id, job->join_token, "w" + std::to_string(i), -1, 0};
    a.requested_rank = i;
    a.peer_host = "127.0.0.1";
    auto joined = r.c->Join(a);
    EXPECT_TRUE(joined.ok()) << joined.status();
    r.calls.push_back({r.id, job->join_token, a.call.worker_id, joined->rank, joined->attempt});
  }
  auto latches = r.c->WaitLatches(r.calls[0], 0, 1, absl::Now() + absl::Seconds(5));
  EXPECT_TRUE(latches.ok() && !latches->latches.empty()) << latches.status();
  if (latches.ok() && !latches->latches.empty()) {
    r.generation = latches->latches.front().latch.generation;
  }
  return r;
}

std::shared_ptr<Answer> ReportAsync(Running& r, int rank, int64_t step) {
  auto answer = std::make_shared<Answer>();
  r.c->ReportStep(r.calls[rank], Report("", 0, step, r.generation),
                  [answer](absl::StatusOr<WorkerStatus> s) { answer->Set(std::move(s)); });
  return answer;
}

constexpr char kFailed[] = "group commit of step reports failed";
constexpr char kRecovered[] = "group commit of step reports succeeded again";

TEST(CoordinatorCommitTest, AReportIsAcknowledgedOnlyOnceItsCommitWorks) {
  ScopedTempDir dir("commit");
  const std::string db = dir / "latchkey.db";
  Heard heard;
  Running r = Start(db, heard);
  ASSERT_NE(r.c, nullptr);
  WriteFault fault;
  std::shared_ptr<Answer> first = ReportAsync(r, 0, 0);
  EXPECT_FALSE(first->WaitFor(absl::Seconds(1))) << first->Get().status();
  // The worker gives up waiting and sends the report again: it waits for the same commit.
  std::shared_ptr<Answer> retry = ReportAsync(r, 0, 0);
  EXPECT_FALSE(retry->WaitFor(absl::Milliseconds(300))) << retry->Get().status();
  // Rank 0's report counts once: step 0 waits for rank 1 (counted twice it would be complete).
  auto view = r.c->GetJob(r.id, false);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_FALSE(view->last_step.has_value());
  EXPECT_EQ(view->steps_completed, 0);
  EXPECT_EQ(heard.Lines(kFailed), 1);  // once for the whole streak
  EXPECT_EQ(heard.Lines(kRecovered), 0);

  fault.Lift();
  ASSERT_TRUE(first->WaitFor(absl::Seconds(10)));
  ASSERT_TRUE(first->Get().ok()) << first->Get().status();
  EXPECT_FALSE(first->Get()->duplicate);
  ASSERT_TRUE(retry->WaitFor(absl::Seconds(10)));
  ASSERT_TRUE(retry->Get().ok()) << retry->Get().status();
  EXPECT_TRUE(retry->Get()->duplicate);
  EXPECT_EQ(heard.Lines(kFailed), 1);
  EXPECT_EQ(heard.Lines(kRecovered), 1);

  ASSERT_TRUE(r.c->ReportStep(r.calls[1], Report("", 0, 0, r.generation)).ok());
  view = r.c->GetJob(r.id, false);
  ASSERT_TRUE(view.ok()) << view.status();
  ASSERT_TRUE(view->last_step.has_value());
  EXPECT_EQ(view->last_step->report.step, 0);
  EXPECT_EQ(view->last_step->ranks_reported, 2);
  EXPECT_EQ(view->steps_completed, 1);
  r.c.reset();
  std::unique_ptr<SqliteStore> reopened = OpenStore(db);
  ASSERT_NE(reopened, nullptr);
  EXPECT_TRUE(reopened->LoadStepReport(r.id, 0, 0).ok());
  EXPECT_EQ(reopened->LoadStepReports(r.id, 0)->size(), 2u);
  absl::MutexLock lock(&heard.mu);
  EXPECT_TRUE(heard.fatal.empty());
}

TEST(CoordinatorCommitTest, HeartbeatsAndReadsAreAnsweredWhileACommitWaitsForTheDisk) {
  ScopedTempDir dir("commit");
  const std::string db = dir / "latchkey.db";
  Heard heard;
  Running r = Start(db, heard);
  ASSERT_NE(r.c, nullptr);
  WriteLockHolder holder(db);  // the commit waits (up to SQLite's 5 s busy timeout)
  std::shared_ptr<Answer> report = ReportAsync(r, 0, 0);
  absl::SleepFor(absl::Milliseconds(100) + Coordinator::kGroupCommitWindow);
  // The coordinator's lock is not held by the waiting commit: each call is answered at once.
  for (int i = 0; i < 5; ++i) {
    const absl::Time begin = absl::Now();
    auto beat = r.c->Heartbeat(r.calls[1]);
    ASSERT_TRUE(beat.ok()) << beat.status();
    ASSERT_TRUE(r.c->GetJob(r.id, false).ok());
    EXPECT_LT(absl::Now() - begin, absl::Milliseconds(500)) << "call " << i;
  }
  EXPECT_FALSE(report->WaitFor(absl::Milliseconds(100))) << report->Get().status();
  holder.Release();
  ASSERT_TRUE(report->WaitFor(absl::Seconds(10)));
  EXPECT_TRUE(report->Get().ok()) << report->Get().status();
  r.c.reset();
  EXPECT_EQ(StoredReports(db, r.id), 1u);
}

TEST(CoordinatorCommitTest, AnotherWriteThatFailsToCommitTheGroupDoesNotAcknowledgeIt) {
  ScopedTempDir dir("commit");
  const std::string db = dir / "latchkey.db";
  Heard heard;
  Running r = Start(db, heard);
  ASSERT_NE(r.c, nullptr);
  WriteFault fault;
  std::shared_ptr<Answer> report = ReportAsync(r, 0, 0);
  // A checkpoint's write commits the staged report first, before the committer does, and fails.
  CheckpointReport checkpoint;
  checkpoint.step = 0;
  checkpoint.manifest_sha256 = std::string(64, 'a');
  checkpoint.bytes = 1;
  EXPECT_FALSE(r.c->ReportCheckpoint(r.calls[0], checkpoint).ok());
  EXPECT_FALSE(report->WaitFor(absl::Milliseconds(500))) << report->Get().status();
  fault.Lift();
  ASSERT_TRUE(report->WaitFor(absl::Seconds(10)));
  EXPECT_TRUE(report->Get().ok()) << report->Get().status();
  r.c.reset();
  std::unique_ptr<SqliteStore> reopened = OpenStore(db);
  ASSERT_NE(reopened, nullptr);
  EXPECT_TRUE(reopened->LoadStepReport(r.id, 0, 0).ok());
  EXPECT_TRUE(reopened->LoadCheckpoints(r.id)->empty());
}

TEST(CoordinatorCommitTest, ReportsTheStoreLostStopTheCoordinator) {
  ScopedTempDir dir("commit");
  const std::string db = dir / "latchkey.db";
  Heard heard;
  Running r = Start(db, heard);
  ASSERT_NE(r.c, nullptr);
  RefuseReportsAfter(db, absl::Now() + absl::Seconds(2));
  WriteFault fault;
  std::shared_ptr<Answer> report = ReportAsync(r, 0, 0);  // staged before the deadline
  EXPECT_FALSE(report->WaitFor(absl::Milliseconds(200))) << report->Get().status();
  // The commits fail; the retry after the deadline cannot stage the report again.
  ASSERT_TRUE(heard.AwaitFatal(absl::Seconds(20)));
  {
    absl::MutexLock lock(&heard.mu);
    ASSERT_EQ(heard.fatal.size(), 1u);
    EXPECT_EQ(heard.fatal[0].code(), absl::StatusCode::kDataLoss) << heard.fatal[0];
    EXPECT_TRUE(absl::StrContains(heard.fatal[0].message(), "1 staged step reports lost"))
        << heard.fatal[0];
  }
  // Never acknowledged: its call ends with the loss.
  ASSERT_TRUE(report->WaitFor(absl::Seconds(5)));
  EXPECT_EQ(report->Get().status().code(), absl::StatusCode::kDataLoss) << report->Get().status();
  EXPECT_EQ(heard.Lines("fatal: acknowledged progress is not in the store"), 1);
  fault.Lift();
  r.c.reset();
  EXPECT_EQ(StoredReports(db, r.id), 0u);
}

TEST(CoordinatorCommitDeathTest, ByDefaultLostReportsEndTheProcess) {
  ScopedTempDir dir("commit");
  const std::string db = dir / "latchkey.db";
  // Aborted (SIGABRT). Its message is not checked: the death test's stderr is a file, which the
  // fault cuts after one byte.
  EXPECT_EXIT(
      {
        Heard heard;
        Running r = Start(db, heard, /*catch_fatal=*/false);
        RefuseReportsAfter(db, absl::Now() + absl::Seconds(1));
        WriteFault fault;
        std::shared_ptr<Answer> report = ReportAsync(r, 0, 0);
        report->WaitFor(absl::Seconds(20));  // the process ends before the answer
      },
      ::testing::KilledBySignal(SIGABRT), "");
}

}  // namespace
}  // namespace latchkey
