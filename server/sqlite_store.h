// JobStore on SQLite (WAL journal). One read-write connection for every JobStore call, owned by
// the store; for a database in a file also a second, read-only connection behind audit_reader().
//
// Schema (version kSchemaVersion, in PRAGMA user_version) — the DDL and every migration, in
// order, are in sqlite_schema.cc:
//   jobs, workers, latches (append-only: triggers refuse UPDATE and DELETE),
//   policy_changes (append-only), step_reports (primary key (job_id, rank, step)),
//   checkpoints (primary key (job_id, step)), job_events (append-only).
// Open() brings an older file up to date with explicit migrations (v1 -> v2 -> ...), each in one
// transaction, and refuses a file from a newer build with FAILED_PRECONDITION naming the file and
// both versions. A value it cannot read back is DATA_LOSS (store.h).
//
// Durability: `sync` kNormal survives a crash of the process (kill -9): a committed transaction
// is in the WAL file. kFull also fsyncs every commit, surviving power loss, at ~1 fsync per
// call.
//
// Audit reader: for a file whose journal is WAL (Open asks for it; a file system without shared
// memory may refuse), audit_reader() reads the latches, policy changes and events on its own
// read-only connection (SQLITE_OPEN_READONLY), in one read transaction: with WAL a reader sees
// the last commit and neither waits for the writer nor makes it wait. An in-memory database
// (":memory:") cannot be opened twice, and in a rollback journal a reader would block commits:
// there, and if the second connection cannot be opened, audit_reader() is null.
//
// Group commit (step reports): StageStepReport keeps a report in memory (after checking, on the
// writer's connection, that it is not stored already); CommitGroup writes every staged report
// in one transaction (BEGIN IMMEDIATE, an INSERT each, COMMIT). For a file in WAL that is done
// on a connection of its own, the group writer, so a commit runs beside the other calls
// (CommitsBesideOtherCalls()): SQLite's write lock orders the two connections' transactions,
// and every other write first waits for a commit in progress and commits what is staged
// (group_mu_), so nothing written later is durable before a staged report. In WAL the writer's
// reads never wait for the group writer's commit. A failed commit keeps every report staged
// (in memory: nothing to write again), except a row SQLite refuses for itself (a constraint,
// too big): that report is DATA_LOSS. Without a second connection (":memory:") the commit runs
// on the writer's connection and CommitsBesideOtherCalls() is false.
//
// Thread-safety: the JobStore calls none (the Coordinator serialises them), except CommitGroup
// and HasStaged beside the others when CommitsBesideOtherCalls(); audit_reader() is
// thread-safe (its connection is used under its own mutex) and may run alongside them.
#ifndef LATCHKEY_SERVER_SQLITE_STORE_H_
#define LATCHKEY_SERVER_SQLITE_STORE_H_

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/store.h"

struct sqlite3;

namespace latchkey {

enum class SqliteSync { kNormal, kFull };

class SqliteStore : public JobStore {
 public:
  // The schema this build writes. v2: the policy's no_sync mask is stored. v3: each step
  // report's learning rate and evaluation loss. v4: attempts (the job's fault-tolerance fields,
  // each worker's attempt), each step report's boundary wait, the checkpoints and job_events
  // tables. v5: each job's submitter; join tokens stored only as their SHA-256 (hex). v6: each
  // latch's first_sample and the job's next one. v7: the attempts table (each attempt's layout),
  // latches keyed by the layout that decided them. v8: each step report's memory. v9:
  // step_reports WITHOUT ROWID (its key is the table).
  static constexpr int kSchemaVersion = 11;

  // Opens (creating if needed) the database at `path`; ":memory:" for tests.
  static absl::StatusOr<std::unique_ptr<SqliteStore>> Open(const std::string& path,
                                                           SqliteSync sync = SqliteSync::kNormal);
  ~SqliteStore() override;
  SqliteStore(const SqliteStore&) = delete;
  SqliteStore& operator=(const SqliteStore&) = delete;

  absl::Status CreateJob(const JobRecord& job) override;
  absl::Status UpdateJob(const JobRecord& job) override;
  absl::Status UpdateJobWithEvent(const JobRecord& job, const JobEventRecord& event) override;
  absl::Status BeginAttempt(const JobRecord& job, const AttemptRecord& attempt,
                            const PolicyChangeRecord* layout_change,
                            const JobEventRecord& event) override;
  absl::StatusOr<std::vector<AttemptRecord>> LoadAttempts(const std::string& job_id) override;
  absl::Status AppendEvent(const JobEventRecord& event) override;
  absl::Status PutCheckpoint(const CheckpointRecord& checkpoint, const JobRecord& job,
                             const JobEventRecord& event) override;
  absl::Status PutWorker(const WorkerRecord& worker) override;
  absl::Status AppendLatches(const std::string& job_id, const std::vector<PublishedLatch>& latches,
                             int64_t next_window, int64_t next_first_micro_batch,
                             int64_t next_first_sample) override;
  absl::Status AppendPolicyChange(const PolicyChangeRecord& change) override;
  absl::StatusOr<bool> InsertStepReport(const StepReportRecord& report) override;
  // See "Group commit" above.
  absl::StatusOr<bool> StageStepReport(const StepReportRecord& report) override;
  absl::Status CommitGroup() override;
  bool HasStaged() const override;
  bool CommitsBesideOtherCalls() const override { return group_writer_ != nullptr; }

  absl::StatusOr<std::vector<JobRecord>> LoadJobs() override;
  absl::StatusOr<std::vector<WorkerRecord>> LoadWorkers() override;
  absl::StatusOr<std::vector<RankProgress>> LoadProgress() override;
  absl::StatusOr<std::vector<PublishedLatch>> LoadLatches(const std::string& job_id,
                                                          int64_t start_window,
                                                          int64_t limit) override;
  absl::StatusOr<std::vector<PolicyChangeRecord>> LoadPolicyChanges(
      const std::string& job_id) override;
  absl::StatusOr<std::vector<StepReportRecord>> LoadStepReports(const std::string& job_id,
                                                                int64_t from_step) override;
  absl::StatusOr<StepReportRecord> LoadStepReport(const std::string& job_id, int rank,
                                                  int64_t step) override;
  absl::StatusOr<std::vector<CheckpointRecord>> LoadCheckpoints(const std::string& job_id) override;
  absl::StatusOr<std::vector<JobEventRecord>> LoadEvents(const std::string& job_id) override;

  AuditReader* audit_reader() override;

 private:
  class Stmt;
  class Reader;  // sqlite_store.cc
  explicit SqliteStore(sqlite3* db);
  // The read-only connection to the file of `writer`'s main database; null where there is none
  // (see "Audit reader").
  static std::unique_ptr<Reader> OpenReader(sqlite3* writer);
  // A second read-write connection to it, for group commits; null where there is none.
  static std::unique_ptr<SqliteStore> OpenGroupWriter(sqlite3* writer, SqliteSync sync);
  // Another connection to the file of `writer`'s main database, opened with `flags`
  // (SQLITE_OPEN_READONLY or _READWRITE); null for an in-memory or temporary database or when it
  // cannot be opened.
  static std::unique_ptr<SqliteStore> OpenSecond(sqlite3* writer, int flags);
  // The first column of the first row of `sql`.
  absl::StatusOr<std::string> QueryText(const char* sql);
  absl::StatusOr<int> SchemaVersion();
  // A damaged file refused before anything is written to it (sqlite_integrity.cc): the
  // write-ahead log's header, read before SQLite reads the log, and PRAGMA quick_check.
  static absl::Status CheckWalHeader(const std::string& path);
  absl::Status CheckSound();
  // Creates or migrates the schema to kSchemaVersion (sqlite_schema.cc); Open names the file in
  // its errors.
  absl::Status Upgrade();
  absl::Status Migrate(int from);  // from -> from + 1, inside the caller's transaction
  absl::Status MigrateV1ToV2();
  absl::Status MigrateV2ToV3();
  absl::Status MigrateV3ToV4();
  absl::Status MigrateV4ToV5();
  absl::Status MigrateV5ToV6();
  absl::Status MigrateV9ToV10();
  // The rows of a policy change and the job's current policy, inside the caller's transaction.
  absl::Status PolicyChangeRows(const PolicyChangeRecord& change);
  // Step reports with step in [from_step, to_step] of every rank (rank < 0) or one.
  absl::StatusOr<std::vector<StepReportRecord>> QueryStepReports(const std::string& job_id,
                                                                 int64_t from_step, int64_t to_step,
                                                                 int rank);
  // Binds JobRecord's fault-tolerance fields (9 of them) from parameter `first` on.
  static void BindFaults(Stmt& st, int first, const JobRecord& job);
  static absl::StatusOr<std::vector<StalledRank>> StalledFromJson(const std::string& row,
                                                                  const std::string& json);
  // BEGIN IMMEDIATE, `body`, COMMIT (ROLLBACK when it fails); the open group commits first.
  absl::Status InTransaction(const std::function<absl::Status()>& body);
  absl::Status Exec(const char* sql);
  // Cached by the sql text's address. A statement that writes commits the open group first
  // (the staged reports are durable before anything written after them), unless it is
  // `in_group` (the staged report's own INSERT).
  absl::StatusOr<Stmt*> Prepared(const char* sql, bool in_group = false);

  // The step reports' INSERT, inside the caller's transaction or on its own.
  absl::StatusOr<bool> WriteStepReport(const StepReportRecord& record);
  // What every other write does first: waits for a commit in progress and commits what is
  // staged (as CommitGroup, without an earlier loss).
  absl::Status CommitStaged();
  // Writes the staged reports in one transaction on `conn` (the group writer, or this
  // connection). OK: every one durable. A failure keeps them staged, but a row SQLite refuses
  // for itself is dropped into lost_ (the DATA_LOSS returned).
  absl::Status WriteStaged(SqliteStore& conn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(group_mu_);
  // The staged reports of `job_id` with step in [from_step, to_step] of every rank (rank < 0)
  // or one, as the table would give them back; copied before the table is read.
  std::vector<StepReportRecord> StagedOf(const std::string& job_id, int64_t from_step,
                                         int64_t to_step, int rank) const;
  // Calls `fn` on every staged report (the committing ones first), under staged_mu_.
  void ForEachStaged(const std::function<void(const StepReportRecord&)>& fn) const;
  // Adds to `stored` (what the table holds) the `staged` reports it lacks, in (step, rank) order.
  static void MergeStaged(const std::vector<StepReportRecord>& staged,
                          std::vector<StepReportRecord>& stored);

  sqlite3* db_;
  // The step reports staged and not yet durable: pending_ since the last commit began,
  // committing_ in the commit now writing them; keys_ holds both's (job, rank, step).
  using ReportKey = std::tuple<std::string, int, int64_t>;
  mutable absl::Mutex staged_mu_;
  std::vector<StepReportRecord> pending_ ABSL_GUARDED_BY(staged_mu_);
  std::vector<StepReportRecord> committing_ ABSL_GUARDED_BY(staged_mu_);
  std::set<ReportKey> keys_ ABSL_GUARDED_BY(staged_mu_);
  // One commit of the staged reports at a time, whoever commits them.
  absl::Mutex group_mu_ ABSL_ACQUIRED_BEFORE(staged_mu_);
  // Not OK once a staged report was refused (WriteStaged): CommitGroup returns it from then on.
  absl::Status lost_ ABSL_GUARDED_BY(group_mu_);
  struct StmtCache;
  std::unique_ptr<StmtCache> cache_;
  std::unique_ptr<Reader> reader_;  // null: no audit reader
  // The group writer's connection; null: commits run on db_.
  std::unique_ptr<SqliteStore> group_writer_;
};

}  // namespace latchkey

#endif  // LATCHKEY_SERVER_SQLITE_STORE_H_
