// The SQLite store's schema version: migration of an older file, refusal of a newer one, and
// DATA_LOSS (never a default) for a stored value this build cannot read.
#include <sqlite3.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

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

// The schema the first release wrote (user_version 0, version in `meta`), frozen here as the
// fixture an old file is made from.
constexpr const char* kV1Schema = R"sql(
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO meta VALUES ('schema_version', '1');
CREATE TABLE jobs (
  job_id TEXT PRIMARY KEY, seq INTEGER NOT NULL UNIQUE, state INTEGER NOT NULL,
  spec_json TEXT NOT NULL, base_dir TEXT NOT NULL, join_token TEXT NOT NULL,
  rendezvous_host TEXT NOT NULL, rendezvous_port INTEGER NOT NULL,
  rendezvous_host_fixed INTEGER NOT NULL,
  kv_reduce TEXT NOT NULL, gas INTEGER NOT NULL, generation INTEGER NOT NULL,
  next_window INTEGER NOT NULL, next_first_micro_batch INTEGER NOT NULL,
  failure_reason TEXT NOT NULL, warnings_json TEXT NOT NULL,
  create_us INTEGER NOT NULL, update_us INTEGER NOT NULL);
CREATE TABLE workers (
  job_id TEXT NOT NULL, rank INTEGER NOT NULL, worker_id TEXT NOT NULL, host TEXT NOT NULL,
  state INTEGER NOT NULL, join_us INTEGER NOT NULL, PRIMARY KEY (job_id, rank));
CREATE TABLE latches (
  job_id TEXT NOT NULL, window INTEGER NOT NULL, generation INTEGER NOT NULL,
  first_micro_batch INTEGER NOT NULL, n INTEGER NOT NULL, kv_mode TEXT NOT NULL,
  no_sync TEXT NOT NULL, reason TEXT NOT NULL, publish_us INTEGER NOT NULL,
  PRIMARY KEY (job_id, window));
CREATE TRIGGER latches_no_update BEFORE UPDATE ON latches
  BEGIN SELECT RAISE(ABORT, 'latches are append-only'); END;
CREATE TRIGGER latches_no_delete BEFORE DELETE ON latches
  BEGIN SELECT RAISE(ABORT, 'latches are append-only'); END;
CREATE TABLE policy_changes (
  job_id TEXT NOT NULL, generation INTEGER NOT NULL, kv_reduce TEXT NOT NULL,
  gas INTEGER NOT NULL, first_window INTEGER NOT NULL, change_us INTEGER NOT NULL,
  PRIMARY KEY (job_id, generation));
CREATE TRIGGER policy_changes_no_update BEFORE UPDATE ON policy_changes
  BEGIN SELECT RAISE(ABORT, 'policy_changes are append-only'); END;
CREATE TABLE step_reports (
  job_id TEXT NOT NULL, rank INTEGER NOT NULL, step INTEGER NOT NULL,
  micro_batches INTEGER NOT NULL, loss REAL NOT NULL, grad_norm REAL NOT NULL,
  kv_mode TEXT NOT NULL, kv_allreduce_calls INTEGER NOT NULL, collective_calls_json TEXT NOT NULL,
  step_seconds REAL NOT NULL, tokens INTEGER NOT NULL, latch_generation INTEGER NOT NULL,
  report_us INTEGER NOT NULL, PRIMARY KEY (job_id, rank, step));
INSERT INTO jobs VALUES ('job-000001', 1, 2,
  '{"latchkey": {"no_sync": [false, true, true, false], "steps": 4}}', '', 'tok', '', 29500, 0,
  'auto', 0, 1, 1, 4, '', '[]', 1, 1);
INSERT INTO policy_changes VALUES ('job-000001', 1, 'deferred', 0, 1, 2);
INSERT INTO latches VALUES ('job-000001', 0, 0, 0, 4, 'coalesced', '0110', 'r', 1);
)sql";

// Runs SQL on the file as any other SQLite client would. Returns SQLite's error, or "".
std::string RawSql(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  if (sqlite3_open(path.c_str(), &db) != SQLITE_OK) return "cannot open";
  char* err = nullptr;
  std::string out;
  if (sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    out = err ? err : "error";
  }
  sqlite3_free(err);
  sqlite3_close(db);
  return out;
}

int64_t RawInt(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  if (sqlite3_open(path.c_str(), &db) != SQLITE_OK) return -1;
  sqlite3_stmt* st = nullptr;
  int64_t v = -1;
  if (sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr) == SQLITE_OK &&
      sqlite3_step(st) == SQLITE_ROW) {
    v = sqlite3_column_int64(st, 0);
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
  return v;
}

const std::vector<bool> kMask = {false, true, true, false};

TEST(SqliteSchemaTest, NewFileIsAtTheCurrentVersion) {
  ScopedTempDir dir;
  const std::string path = dir.path() + "/coord.db";
  ASSERT_TRUE(SqliteStore::Open(path).ok());
  EXPECT_EQ(RawInt(path, "PRAGMA user_version"), SqliteStore::kSchemaVersion);
  EXPECT_EQ(SqliteStore::kSchemaVersion, 11);
}

// v9: step_reports is its key's B-tree (WITHOUT ROWID): no second B-tree repeats every
// report's key, and a report sent again is still ignored, kept once.
TEST(SqliteSchemaTest, StepReportsAreOneBTreeKeyedByJobRankAndStep) {
  ScopedTempDir dir;
  const std::string path = dir.path() + "/coord.db";
  {
    auto store = SqliteStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    StepReportRecord r;
    r.job_id = "job-000001";
    r.rank = 3;
    r.report.step = 5;
    r.report.loss = 2.5;
    ASSERT_TRUE(*(*store)->InsertStepReport(r));
    r.report.loss = 9.0;
    EXPECT_FALSE(*(*store)->InsertStepReport(r));  // the same (job, rank, step): ignored
    auto kept = (*store)->LoadStepReports("job-000001", 5);
    ASSERT_TRUE(kept.ok()) << kept.status();
    ASSERT_EQ(kept->size(), 1u);
    EXPECT_EQ(kept->front().report.loss, 2.5);
  }
  EXPECT_EQ(RawInt(path, "SELECT wr FROM pragma_table_list WHERE name='step_reports'"), 1);
  EXPECT_EQ(RawInt(path, "SELECT COUNT(*) FROM sqlite_master WHERE tbl_name='step_reports'"), 1);
}

// Latches stored before first_sample existed get M_s * DP * MB of their job's spec (every job
// then ran its spec's layout), and the job its next one; the latches stay append-only.
TEST(SqliteSchemaTest, MigrationFillsFirstSampleFromTheSpecsLayout) {
  ScopedTempDir dir;
  const std::string path = dir.path() + "/coord.db";
  ASSERT_EQ(RawSql(path, kV1Schema), "");
  // DP 2 (world 4, tp 2) x MB 3: 6 stream positions per micro-batch.
  ASSERT_EQ(RawSql(path, R"sql(
INSERT INTO jobs VALUES ('job-000002', 2, 2,
  '{"train_micro_batch_size_per_gpu": 3, "tensor_parallel": {"autotp_size": 2},
    "latchkey": {"world_size": 4, "steps": 4}}', '', 'tok', '', 29501, 0,
  'auto', 0, 0, 2, 8, '', '[]', 1, 1);
INSERT INTO latches VALUES ('job-000002', 0, 0, 0, 4, 'coalesced', '1110', 'r', 1);
INSERT INTO latches VALUES ('job-000002', 1, 0, 4, 4, 'coalesced', '1110', 'r', 2);
)sql"),
            "");
  auto store = SqliteStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  auto latches = (*store)->LoadLatches("job-000002", 0, 10);
  ASSERT_TRUE(latches.ok()) << latches.status();
  ASSERT_EQ(latches->size(), 2u);
  EXPECT_EQ((*latches)[0].latch.first_sample, 0);
  EXPECT_EQ((*latches)[1].latch.first_sample, 4 * 6);
  auto jobs = (*store)->LoadJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 2u);
  EXPECT_EQ((*jobs)[1].next_first_sample, 8 * 6);
  EXPECT_EQ((*jobs)[0].next_first_sample, 4);  // the defaults: DP 1, MB 1
  EXPECT_NE(RawSql(path, "UPDATE latches SET first_sample=7"), "");
}

TEST(SqliteSchemaTest, MigratesAVersion1FileAndFillsTheMaskFromTheSpec) {
  ScopedTempDir dir;
  const std::string path = dir.path() + "/coord.db";
  ASSERT_EQ(RawSql(path, kV1Schema), "");
  ASSERT_EQ(RawInt(path, "PRAGMA user_version"), 0);
  {
    auto store = SqliteStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    auto jobs = (*store)->LoadJobs();
    ASSERT_TRUE(jobs.ok()) << jobs.status();
    ASSERT_EQ(jobs->size(), 1u);
    EXPECT_EQ(jobs->front().policy.no_sync, kMask);
    EXPECT_EQ(jobs->front().policy.generation, 1);
    EXPECT_EQ(jobs->front().next_window, 1);
    auto changes = (*store)->LoadPolicyChanges("job-000001");
    ASSERT_TRUE(changes.ok()) << changes.status();
    ASSERT_EQ(changes->size(), 1u);
    EXPECT_EQ(changes->front().policy.no_sync, kMask);
    EXPECT_EQ(changes->front().policy.kv_reduce, KvReducePolicy::kDeferred);
    auto latches = (*store)->LoadLatches("job-000001", 0, 10);
    ASSERT_TRUE(latches.ok()) << latches.status();
    ASSERT_EQ(latches->size(), 1u);
    EXPECT_EQ(latches->front().latch.no_sync, kMask);
  }
  EXPECT_EQ(RawInt(path, "PRAGMA user_version"), 11);  // v1 -> v2 -> ... -> v11
  EXPECT_EQ(RawInt(path, "SELECT COUNT(*) FROM sqlite_master WHERE name='meta'"), 0);
  // The migration kept the audit append-only.
  EXPECT_NE(RawSql(path, "UPDATE policy_changes SET gas=7"), "");
  EXPECT_NE(RawSql(path, "UPDATE latches SET n=9"), "");
  // A second open finds nothing to migrate.
  auto again = SqliteStore::Open(path);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->LoadJobs()->front().policy.no_sync, kMask);
}

// v10: a job keeps the uid drawn at its submit (its checkpoints carry it). The jobs of a file from
// before get one each, kept by every later open; a malformed stored uid is DATA_LOSS.
TEST(SqliteSchemaTest, MigrationGivesEveryJobAUidOfItsOwn) {
  ScopedTempDir dir;
  const std::string path = dir.path() + "/coord.db";
  ASSERT_EQ(RawSql(path, kV1Schema), "");
  ASSERT_EQ(RawSql(path,
                   "INSERT INTO jobs VALUES ('job-000002', 2, 2, "
                   "'{\"latchkey\": {\"steps\": 4}}', '', 'tok', '', 29501, 0, 'auto', 0, "
                   "0, 0, 0, '', '[]', 1, 1);"),
            "");
  std::vector<std::string> uids;
  {
    auto store = SqliteStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    auto jobs = (*store)->LoadJobs();
    ASSERT_TRUE(jobs.ok()) << jobs.status();
    ASSERT_EQ(jobs->size(), 2u);
    for (const JobRecord& j : *jobs) {
      EXPECT_TRUE(IsJobUid(j.job_uid)) << j.job_id << ": '" << j.job_uid << "'";
      uids.push_back(j.job_uid);
    }
    EXPECT_NE(uids[0], uids[1]);
  }
  auto again = SqliteStore::Open(path);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->LoadJobs()->at(0).job_uid, uids[0]);
  EXPECT_EQ((*again)->LoadJobs()->at(1).job_uid, uids[1]);
  ASSERT_EQ(RawSql(path, "UPDATE jobs SET job_uid='../x' WHERE seq=2"), "");
  EXPECT_EQ((*again)->LoadJobs().status().code(), absl::StatusCode::kDataLoss);
}

// A v2 file (the v1 tables with the no_sync columns, PRAGMA user_version 2) holding step reports
// of two jobs, one whose spec names the optimizer's lr and one whose spec does not.
constexpr const char* kV2FromV1 = R"sql(
ALTER TABLE jobs ADD COLUMN no_sync TEXT NOT NULL DEFAULT '';
ALTER TABLE policy_changes ADD COLUMN no_sync TEXT NOT NULL DEFAULT '';
DROP TABLE meta;
UPDATE jobs SET no_sync='0110';
INSERT INTO jobs VALUES ('job-000002', 2, 2,
  '{"optimizer": {"type": "AdamW", "params": {"lr": 0.0025}}, "latchkey": {"steps": 4}}', '',
  'tok', '', 29501, 0, 'auto', 0, 0, 1, 4, '', '[]', 1, 1, '');
INSERT INTO step_reports VALUES ('job-000002', 0, 0, 4, 2.5, 1.5, 'coalesced', 1, '{}', 0.1,
  512, 0, 7);
INSERT INTO step_reports VALUES ('job-000002', 1, 0, 4, 2.5, 1.5, 'coalesced', 1, '{}', 0.2,
  512, 0, 8);
INSERT INTO step_reports VALUES ('job-000001', 0, 0, 4, 3.5, 1.0, 'coalesced', 1, '{}', 0.1,
  512, 1, 9);
PRAGMA user_version = 2;
)sql";

TEST(SqliteSchemaTest, MigratesAVersion2FileFillingTheLrOfEarlierReportsFromTheSpec) {
  ScopedTempDir dir;
  const std::string path = dir.path() + "/coord.db";
  ASSERT_EQ(RawSql(path, kV1Schema), "");
  ASSERT_EQ(RawSql(path, kV2FromV1), "");
  ASSERT_EQ(RawInt(path, "PRAGMA user_version"), 2);
  {
    auto store = SqliteStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    auto reports = (*store)->LoadStepReports("job-000002", 0);
    ASSERT_TRUE(reports.ok()) << reports.status();
    ASSERT_EQ(reports->size(), 2u);
    for (const StepReportRecord& r : *reports) {
      // Before v3 every step ran at the spec's constant lr, and none evaluated.
      EXPECT_EQ(r.report.lr, 0.0025) << "rank " << r.rank;
      EXPECT_FALSE(r.report.eval_loss.has_value()) << "rank " << r.rank;
      EXPECT_EQ(r.report.loss, 2.5);
      EXPECT_EQ(r.report.tokens, 512);
    }
    EXPECT_EQ((*reports)[1].report.step_seconds, 0.2);
    // A spec without an optimizer lr leaves 0: unknown, never a guess.
    auto other = (*store)->LoadStepReports("job-000001", 0);
    ASSERT_TRUE(other.ok()) << other.status();
    ASSERT_EQ(other->size(), 1u);
    EXPECT_EQ(other->front().report.lr, 0.0);
    EXPECT_EQ(other->front().report.latch_generation, 1);
    // The v2 state is untouched.
    auto jobs = (*store)->LoadJobs();
    ASSERT_TRUE(jobs.ok()) << jobs.status();
    ASSERT_EQ(jobs->size(), 2u);
    EXPECT_EQ(jobs->front().policy.no_sync, kMask);
    // New reports keep their own lr and eval loss.
    StepReportRecord next;
    next.job_id = "job-000002";
    next.report.step = 1;
    next.report.lr = 0.002;
    next.report.eval_loss = 2.25;
    ASSERT_TRUE(*(*store)->InsertStepReport(next));
  }
  EXPECT_EQ(RawInt(path, "PRAGMA user_version"), 11);
  // Reopening finds nothing to migrate and overwrites nothing.
  auto again = SqliteStore::Open(path);
  ASSERT_TRUE(again.ok()) << again.status();
  auto reports = (*again)->LoadStepReports("job-000002", 1);
  ASSERT_TRUE(reports.ok()) << reports.status();
  ASSERT_EQ(reports->size(), 1u);
  EXPECT_EQ(reports->front().report.lr, 0.002);
  EXPECT_EQ(reports->front().report.eval_loss, std::optional<double>(2.25));
}

// A v3 file: the v2 one above with the step reports' lr and eval_loss columns, a worker of
// job-000001 and PRAGMA user_version 3.
constexpr const char* kV3FromV2 = R"sql(
ALTER TABLE step_reports ADD COLUMN lr REAL NOT NULL DEFAULT 0;
ALTER TABLE step_reports ADD COLUMN eval_loss REAL;
INSERT INTO workers VALUES ('job-000001', 0, 'host:1', '10.0.0.1', 2, 5);
PRAGMA user_version = 3;
)sql";

TEST(SqliteSchemaTest, MigratesAVersion3FileToAttemptOneWithNoCheckpointOrEvents) {
  ScopedTempDir dir;
  const std::string path = dir.path() + "/coord.db";
  ASSERT_EQ(RawSql(path, kV1Schema), "");
  ASSERT_EQ(RawSql(path, kV2FromV1), "");
  ASSERT_EQ(RawSql(path, kV3FromV2), "");
  ASSERT_EQ(RawInt(path, "PRAGMA user_version"), 3);
  {
    auto store = SqliteStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    auto jobs = (*store)->LoadJobs();
    ASSERT_TRUE(jobs.ok()) << jobs.status();
    ASSERT_EQ(jobs->size(), 2u);
    for (const JobRecord& j : *jobs) {
      EXPECT_EQ(j.attempt, 1) << j.job_id;
      EXPECT_EQ(j.restarts, 0) << j.job_id;
      EXPECT_EQ(j.resume_step, -1) << j.job_id;
      EXPECT_EQ(j.last_checkpoint_step, -1) << j.job_id;
      EXPECT_TRUE(j.stalled.empty()) << j.job_id;
      EXPECT_EQ(j.determinism_violations, 0) << j.job_id;
    }
    EXPECT_EQ(jobs->front().policy.no_sync, kMask);  // the v3 state is untouched
    auto workers = (*store)->LoadWorkers();
    ASSERT_TRUE(workers.ok()) << workers.status();
    ASSERT_EQ(workers->size(), 1u);
    EXPECT_EQ(workers->front().attempt, 1);
    EXPECT_EQ(workers->front().worker_id, "host:1");
    EXPECT_TRUE((*store)->LoadCheckpoints("job-000001")->empty());
    EXPECT_TRUE((*store)->LoadEvents("job-000001")->empty());
    // v6: no attempt records (every attempt of before ran the spec's layout); the stored
    // latches were decided by attempt 1's layout and stay append-only after the rebuild.
    EXPECT_TRUE((*store)->LoadAttempts("job-000001")->empty());
    auto latches = (*store)->LoadLatches("job-000001", 0, 100);
    ASSERT_TRUE(latches.ok()) << latches.status();
    for (const PublishedLatch& p : *latches) EXPECT_EQ(p.layout_attempt, 1) << p.latch.window;
    // The reports stored before v4 carry no boundary wait; a new one does.
    auto before = (*store)->LoadStepReports("job-000002", 0);
    ASSERT_TRUE(before.ok()) << before.status();
    ASSERT_EQ(before->size(), 2u);
    for (const StepReportRecord& r : *before) EXPECT_FALSE(r.boundary_wait_stored) << r.rank;
    StepReportRecord fresh;
    fresh.job_id = "job-000002";
    fresh.report.step = 1;
    fresh.report.boundary_wait_seconds = 0.375;
    ASSERT_TRUE((*store)->InsertStepReport(fresh).ok());
    // The new tables take a checkpoint and an event with the job's new attempt, atomically.
    JobRecord next = jobs->front();
    next.attempt = 2;
    next.restarts = 1;
    next.last_checkpoint_step = 3;
    next.last_checkpoint_sha256 = "ab12";
    next.stalled.push_back({1, 3, 2, "all_reduce/tp #5", 21.5, 1});
    CheckpointRecord c{"job-000001", 3, "ab12", 4096, 2, absl::FromUnixSeconds(9)};
    JobEventRecord e{"job-000001", absl::FromUnixSeconds(9), 2, "checkpoint", "after step 3"};
    ASSERT_TRUE((*store)->PutCheckpoint(c, next, e).ok());
  }
  EXPECT_EQ(RawInt(path, "PRAGMA user_version"), 11);
  // The events are append-only, and so are the rebuilt latches.
  EXPECT_NE(RawSql(path, "UPDATE latches SET n=9"), "");
  EXPECT_NE(RawSql(path, "DELETE FROM latches"), "");
  EXPECT_NE(RawSql(path, "UPDATE job_events SET kind='x'"), "");
  EXPECT_NE(RawSql(path, "DELETE FROM job_events"), "");
  auto again = SqliteStore::Open(path);
  ASSERT_TRUE(again.ok()) << again.status();
  const JobRecord j = (*again)->LoadJobs()->front();
  EXPECT_EQ(j.attempt, 2);
  EXPECT_EQ(j.restarts, 1);
  EXPECT_EQ(j.last_checkpoint_step, 3);
  EXPECT_EQ(j.last_checkpoint_sha256, "ab12");
  ASSERT_EQ(j.stalled.size(), 1u);
  EXPECT_EQ(j.stalled[0].where, "all_reduce/tp #5");
  EXPECT_EQ(j.stalled[0].seconds, 21.5);
  auto checkpoints = (*again)->LoadCheckpoints("job-000001");
  ASSERT_EQ(checkpoints->size(), 1u);
  EXPECT_EQ(checkpoints->front().bytes, 4096);
  EXPECT_EQ(checkpoints->front().attempt, 2);
  auto events = (*again)->LoadEvents("job-000001");
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ(events->front().kind, "checkpoint");
  EXPECT_EQ(events->front().time, absl::FromUnixSeconds(9));
  auto fresh = (*again)->LoadStepReport("job-000002", 0, 1);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_TRUE(fresh->boundary_wait_stored);
  EXPECT_EQ(fresh->report.boundary_wait_seconds, 0.375);
}

TEST(SqliteSchemaTest, CorruptStalledListIsDataLoss) {
  ScopedTempDir dir;
  const std::string path = dir.path() + "/coord.db";
  {
    auto store = SqliteStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    JobRecord j;
    j.job_id = "job-000001";
    j.seq = 1;
    ASSERT_TRUE((*store)->CreateJob(j).ok());
  }
  ASSERT_EQ(RawSql(path, "UPDATE jobs SET stalled_json='{\"rank\": 1}'"), "");
  auto store = SqliteStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  auto jobs = (*store)->LoadJobs();
  EXPECT_EQ(jobs.status().code(), absl::StatusCode::kDataLoss) << jobs.status();
  EXPECT_NE(jobs.status().message().find("job-000001"), std::string::npos) << jobs.status();
}

TEST(SqliteSchemaTest, RefusesAFileFromANewerVersionNamingFileAndVersions) {
  ScopedTempDir dir;
  const std::string path = dir.path() + "/coord.db";
  ASSERT_TRUE(SqliteStore::Open(path).ok());
  ASSERT_EQ(RawSql(path, "PRAGMA user_version = 12"), "");
  auto store = SqliteStore::Open(path);
  ASSERT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition) << store.status();
  const std::string msg(store.status().message());
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("schema version 12"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(11)"), std::string::npos) << msg;
  EXPECT_EQ(RawInt(path, "PRAGMA user_version"), 12);  // left as it was
}

TEST(SqliteSchemaTest, PolicyMaskIsStoredWithTheJobAndEveryChange) {
  ScopedTempDir dir;
  const std::string path = dir.path() + "/coord.db";
  {
    auto store = SqliteStore::Open(path);
    ASSERT_TRUE(store.ok());
    JobRecord j;
    j.job_id = "job-1";
    j.seq = 1;
    j.spec_json = "{}";
    j.policy.no_sync = kMask;
    ASSERT_TRUE((*store)->CreateJob(j).ok());
    PolicyChangeRecord c;
    c.job_id = "job-1";
    c.policy.no_sync = {true, false};
    c.policy.gradient_accumulation_steps = 2;
    c.policy.generation = 1;
    ASSERT_TRUE((*store)->AppendPolicyChange(c).ok());
  }
  auto store = SqliteStore::Open(path);
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->LoadJobs()->front().policy.no_sync, (std::vector<bool>{true, false}));
  EXPECT_EQ((*store)->LoadPolicyChanges("job-1")->front().policy.no_sync,
            (std::vector<bool>{true, false}));
}

// A running job with latches [0, 3) published, in a file; returns its id.
std::string RunningJob(const std::string& path) {
  auto store = SqliteStore::Open(path);
  EXPECT_TRUE(store.ok()) << store.status();
  auto c = Coordinator::Create(*std::move(store), {}, nullptr);
  EXPECT_TRUE(c.ok()) << c.status();
  auto job = (*c)->SubmitJob({SpecJson(), "", "", 0});
  EXPECT_TRUE(job.ok()) << job.status();
  for (int i = 0; i < 2; ++i) {
    JoinArgs a;
    a.call = {job->job.record.job_id, job->join_token, "w" + std::to_string(i), -1};
    EXPECT_TRUE((*c)->Join(a).ok());
  }
  EXPECT_EQ((*c)->GetJob(job->job.record.job_id, false)->record.next_window, 3);
  return job->job.record.job_id;
}

TEST(SqliteSchemaTest, CorruptStoredKvModeIsDataLossNotADefault) {
  ScopedTempDir dir;
  const std::string path = dir.path() + "/coord.db";
  const std::string id = RunningJob(path);
  ASSERT_EQ(RawSql(path,
                   "DROP TRIGGER latches_no_update; "
                   "UPDATE latches SET kv_mode='sideways' WHERE window=1;"),
            "");
  auto store = SqliteStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  auto latches = (*store)->LoadLatches(id, 0, 10);
  ASSERT_EQ(latches.status().code(), absl::StatusCode::kDataLoss) << latches.status();
  EXPECT_NE(latches.status().message().find("latch(1)"), absl::string_view::npos)
      << latches.status();
  EXPECT_NE(latches.status().message().find("sideways"), absl::string_view::npos);
  // The coordinator refuses to serve the job from it rather than guess.
  auto c = Coordinator::Create(*std::move(store), {}, nullptr);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kDataLoss) << c.status();
}

TEST(SqliteSchemaTest, CorruptStoredMaskIsDataLoss) {
  ScopedTempDir dir;
  const std::string path = dir.path() + "/coord.db";
  const std::string id = RunningJob(path);
  ASSERT_EQ(RawSql(path,
                   "DROP TRIGGER latches_no_update; "
                   "UPDATE latches SET no_sync='1x10' WHERE window=0; "
                   "UPDATE latches SET no_sync='11' WHERE window=2;"),
            "");
  auto store = SqliteStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->LoadLatches(id, 0, 1).status().code(), absl::StatusCode::kDataLoss);
  // A mask of the wrong length, or one whose boundary micro-batch skips the reduction.
  EXPECT_EQ((*store)->LoadLatches(id, 2, 1).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE((*store)->LoadLatches(id, 1, 1).ok());
}

TEST(SqliteSchemaTest, CorruptJobRowIsDataLoss) {
  ScopedTempDir dir;
  const std::string path = dir.path() + "/coord.db";
  RunningJob(path);
  ASSERT_EQ(RawSql(path, "UPDATE jobs SET state=42"), "");
  auto store = SqliteStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  auto jobs = (*store)->LoadJobs();
  EXPECT_EQ(jobs.status().code(), absl::StatusCode::kDataLoss) << jobs.status();
  ASSERT_EQ(RawSql(path, "UPDATE jobs SET state=2, kv_reduce='sometimes'"), "");
  EXPECT_EQ((*store)->LoadJobs().status().code(), absl::StatusCode::kDataLoss);
}

TEST(SqliteSchemaTest, RestartKeepsTheSpecMaskForLaterWindows) {
  ScopedTempDir dir;
  const std::string path = dir.path() + "/coord.db";
  SpecParams p;
  p.extra_latchkey = {{"no_sync", {false, true, true, false}}};
  p.steps = 6;
  std::string id;
  std::string token;
  {
    auto c = Coordinator::Create(*SqliteStore::Open(path), {}, nullptr);
    ASSERT_TRUE(c.ok()) << c.status();
    auto job = (*c)->SubmitJob({SpecJson(p), "", "", 0});
    ASSERT_TRUE(job.ok()) << job.status();
    id = job->job.record.job_id;
    token = job->join_token;
    for (int i = 0; i < 2; ++i) {
      JoinArgs a;
      a.call = {id, token, "w" + std::to_string(i), -1};
      ASSERT_TRUE((*c)->Join(a).ok());
    }
    EXPECT_EQ((*c)->GetJob(id, false)->record.next_window, 3);
  }
  auto c = Coordinator::Create(*SqliteStore::Open(path), {}, nullptr);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->GetJob(id, false)->record.policy.no_sync, kMask);
  for (int64_t s = 0; s < 3; ++s) {
    for (int r = 0; r < 2; ++r) {
      StepReportRecord rec;
      rec.report.step = s;
      ASSERT_TRUE((*c)->ReportStep({id, token, "w" + std::to_string(r), r}, rec).ok()) << s;
    }
  }
  auto audit = (*c)->ListLatches(id, 0, 0);
  ASSERT_TRUE(audit.ok());
  ASSERT_EQ(audit->latches.size(), 6u);  // 3..5 published after the restart
  for (const PublishedLatch& l : audit->latches) {
    EXPECT_EQ(l.latch.no_sync, kMask) << "window " << l.latch.window;
  }
}

}  // namespace
}  // namespace latchkey
