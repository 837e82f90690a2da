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
// Thread-safety: the JobStore calls none (the Coordinator serialises them); audit_reader() is
// thread-safe (its connection is used under its own mutex) and may run alongside them.
#ifndef LATCHKEY_SERVER_SQLITE_STORE_H_
#define LATCHKEY_SERVER_SQLITE_STORE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
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
  static constexpr int kSchemaVersion = 10;

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
  // One transaction holds the staged reports until CommitGroup (or another write) commits it.
  // The store also keeps in memory the records the group inserted: when the group's COMMIT
  // fails, whichever call commits it, the transaction is rolled back and begun again with them
  // (BEGIN IMMEDIATE, one INSERT each), so the group stays open and the next commit retries
  // it; the call returns the COMMIT's error. When SQLite rolls the group back because a staged
  // INSERT failed (an I/O error, a full disk), the group's earlier records are staged again the
  // same way and the INSERT's error is returned. Only when staging them again fails too are
  // they lost: the call returns DATA_LOSS naming how many, the group is closed, and every later
  // CommitGroup returns that DATA_LOSS (whoever staged them must not take them for durable;
  // other writes go on).
  absl::StatusOr<bool> StageStepReport(const StepReportRecord& report) override;
  absl::Status CommitGroup() override;
  bool HasStaged() const override { return group_open_; }

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
  // The first column of the first row of `sql`.
  absl::StatusOr<std::string> QueryText(const char* sql);
  absl::StatusOr<int> SchemaVersion();
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

  // The step reports' INSERT, with the group open or not.
  absl::StatusOr<bool> WriteStepReport(const StepReportRecord& record);
  // Commits the open group (CommitGroup without the earlier loss): what every other write does
  // first.
  absl::Status CommitOpenGroup();
  // After the group's COMMIT or one of its INSERTs failed (`cause`): rolls the group back and
  // stages staged_ again. Returns `cause` with the group open again; OK with the group closed
  // when staged_ is empty (the group held only reports already stored); DATA_LOSS (lost_) with
  // the group closed when staging them again failed.
  absl::Status Restage(const absl::Status& cause);

  sqlite3* db_;
  bool group_open_ = false;  // a transaction of staged step reports is open
  // The reports the open group inserted (not those it found stored), in staging order.
  std::vector<StepReportRecord> staged_;
  // Not OK once staged reports were lost (Restage): CommitGroup returns it from then on.
  absl::Status lost_;
  struct StmtCache;
  std::unique_ptr<StmtCache> cache_;
  std::unique_ptr<Reader> reader_;  // null: no audit reader
};

}  // namespace latchkey

#endif  // LATCHKEY_SERVER_SQLITE_STORE_H_
