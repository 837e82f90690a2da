#include "server/sqlite_store.h"

#include <sqlite3.h>

#include <limits>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "server/sqlite_stmt.h"
#include "server/sqlite_values.h"

namespace latchkey {
namespace {

// Version 1, as the first release created it. v1 kept its version in the table `meta`, not in
// PRAGMA user_version (0 there). Never edit: later versions are migrations below.
constexpr const char* kSchemaV1 = R"sql(
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT OR IGNORE INTO meta VALUES ('schema_version', '1');
CREATE TABLE IF NOT EXISTS jobs (
  job_id TEXT PRIMARY KEY, seq INTEGER NOT NULL UNIQUE, state INTEGER NOT NULL,
  spec_json TEXT NOT NULL, base_dir TEXT NOT NULL, join_token TEXT NOT NULL,
  rendezvous_host TEXT NOT NULL, rendezvous_port INTEGER NOT NULL,
  rendezvous_host_fixed INTEGER NOT NULL,
  kv_reduce TEXT NOT NULL, gas INTEGER NOT NULL, generation INTEGER NOT NULL,
  next_window INTEGER NOT NULL, next_first_micro_batch INTEGER NOT NULL,
  failure_reason TEXT NOT NULL, warnings_json TEXT NOT NULL,
  create_us INTEGER NOT NULL, update_us INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS workers (
  job_id TEXT NOT NULL, rank INTEGER NOT NULL, worker_id TEXT NOT NULL, host TEXT NOT NULL,
  state INTEGER NOT NULL, join_us INTEGER NOT NULL, PRIMARY KEY (job_id, rank));
CREATE TABLE IF NOT EXISTS latches (
  job_id TEXT NOT NULL, window INTEGER NOT NULL, generation INTEGER NOT NULL,
  first_micro_batch INTEGER NOT NULL, n INTEGER NOT NULL, kv_mode TEXT NOT NULL,
  no_sync TEXT NOT NULL, reason TEXT NOT NULL, publish_us INTEGER NOT NULL,
  PRIMARY KEY (job_id, window));
CREATE TRIGGER IF NOT EXISTS latches_no_update BEFORE UPDATE ON latches
  BEGIN SELECT RAISE(ABORT, 'latches are append-only'); END;
CREATE TRIGGER IF NOT EXISTS latches_no_delete BEFORE DELETE ON latches
  BEGIN SELECT RAISE(ABORT, 'latches are append-only'); END;
CREATE TABLE IF NOT EXISTS policy_changes (
  job_id TEXT NOT NULL, generation INTEGER NOT NULL, kv_reduce TEXT NOT NULL,
  gas INTEGER NOT NULL, first_window INTEGER NOT NULL, change_us INTEGER NOT NULL,
  PRIMARY KEY (job_id, generation));
CREATE TRIGGER IF NOT EXISTS policy_changes_no_update BEFORE UPDATE ON policy_changes
  BEGIN SELECT RAISE(ABORT, 'policy_changes are append-only'); END;
CREATE TABLE IF NOT EXISTS step_reports (
  job_id TEXT NOT NULL, rank INTEGER NOT NULL, step INTEGER NOT NULL,
  micro_batches INTEGER NOT NULL, loss REAL NOT NULL, grad_norm REAL NOT NULL,
  kv_mode TEXT NOT NULL, kv_allreduce_calls INTEGER NOT NULL, collective_calls_json TEXT NOT NULL,
  step_seconds REAL NOT NULL, tokens INTEGER NOT NULL, latch_generation INTEGER NOT NULL,
  report_us INTEGER NOT NULL, PRIMARY KEY (job_id, rank, step));
)sql";

// v1 -> v2: the policy's no_sync mask is stored with the job and with every policy change (v1
// lost it on a restart); the version moves to PRAGMA user_version. The masks of existing jobs
// are filled in from their specs by MigrateV1ToV2.
constexpr const char* kMigrateV1ToV2 = R"sql(
ALTER TABLE jobs ADD COLUMN no_sync TEXT NOT NULL DEFAULT '';
ALTER TABLE policy_changes ADD COLUMN no_sync TEXT NOT NULL DEFAULT '';
DROP TABLE IF EXISTS meta;
)sql";

// v2 -> v3: every step report keeps the learning rate of its update and, on the steps where
// evaluation ran, the evaluation loss (NULL otherwise). Reports stored before v3 ran at the
// constant learning rate of their job's spec, which MigrateV2ToV3 fills in.
constexpr const char* kMigrateV2ToV3 = R"sql(
ALTER TABLE step_reports ADD COLUMN lr REAL NOT NULL DEFAULT 0;
ALTER TABLE step_reports ADD COLUMN eval_loss REAL;
)sql";

}  // namespace

struct SqliteStore::StmtCache {
  std::map<const char*, std::unique_ptr<Stmt>> by_sql;
};

SqliteStore::SqliteStore(sqlite3* db) : db_(db), cache_(std::make_unique<StmtCache>()) {}

SqliteStore::~SqliteStore() {
  cache_.reset();  // finalize statements before closing
  sqlite3_close(db_);
}

absl::StatusOr<std::unique_ptr<SqliteStore>> SqliteStore::Open(const std::string& path,
                                                               SqliteSync sync) {
  sqlite3* db = nullptr;
  const int rc = sqlite3_open_v2(
      path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    sqlite3_close(db);
    return absl::UnavailableError(absl::StrCat("--db ", path, ": cannot open: ", msg));
  }
  std::unique_ptr<SqliteStore> store(new SqliteStore(db));
  sqlite3_busy_timeout(db, 5000);
  // WAL: readers never block the writer and a commit is one append. NORMAL sync is durable
  // against a process crash; FULL adds an fsync per commit for power loss.
  absl::Status s = store->Exec("PRAGMA journal_mode=WAL;");
  if (s.ok()) {
    s = store->Exec(sync == SqliteSync::kFull ? "PRAGMA synchronous=FULL;"
                                              : "PRAGMA synchronous=NORMAL;");
  }
  if (s.ok()) s = store->Upgrade(path);
  if (!s.ok()) {
    if (absl::StartsWith(s.message(), "--db ")) return s;
    return absl::Status(s.code(), absl::StrCat("--db ", path, ": ", s.message()));
  }
  return store;
}

absl::StatusOr<int> SqliteStore::SchemaVersion() {
  LK_ASSIGN_STMT(st, "PRAGMA user_version");
  LK_ASSIGN_OR_RETURN(bool row, st.Step());
  const int version = row ? static_cast<int>(st.Int(0)) : 0;
  st.Reset();
  return version;
}

absl::Status SqliteStore::Upgrade(const std::string& path) {
  LK_ASSIGN_OR_RETURN(int version, SchemaVersion());
  if (version > kSchemaVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--db ", path, ": schema version ", version, " is newer than this coordinator's (",
        kSchemaVersion, "); open it with the latchkey-coordinator that wrote it, or a newer one"));
  }
  if (version == 0) {
    // A new file, or a v1 one (v1 left user_version at 0): the DDL is idempotent on both.
    LK_RETURN_IF_ERROR(Exec(kSchemaV1));
    version = 1;
  }
  while (version < kSchemaVersion) {
    LK_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
    absl::Status s = Migrate(version);
    if (s.ok()) s = Exec(absl::StrCat("PRAGMA user_version = ", version + 1).c_str());
    if (s.ok()) s = Exec("COMMIT");
    if (!s.ok()) {
      Exec("ROLLBACK").IgnoreError();
      return absl::Status(s.code(), absl::StrCat("migrating schema v", version, " -> v",
                                                 version + 1, ": ", s.message()));
    }
    version++;
  }
  return absl::OkStatus();
}

absl::Status SqliteStore::Migrate(int from) {
  switch (from) {
    case 1:
      return MigrateV1ToV2();
    case 2:
      return MigrateV2ToV3();
    case 3:
      return MigrateV3ToV4();
    case 4:
      return MigrateV4ToV5();
  }
  return absl::InternalError(absl::StrCat("no migration from schema v", from));
}

absl::Status SqliteStore::MigrateV1ToV2() {
  LK_RETURN_IF_ERROR(Exec(kMigrateV1ToV2));
  std::vector<std::pair<std::string, std::string>> masks;  // job_id, no_sync
  {
    LK_ASSIGN_STMT(st, "SELECT job_id, spec_json FROM jobs");
    while (true) {
      LK_ASSIGN_OR_RETURN(bool row, st.Step());
      if (!row) break;
      // The mask a v1 job ran with: its spec's (v1 never let it change).
      masks.emplace_back(st.Text(0), SpecNoSync(st.Text(1)));
    }
    st.Reset();
  }
  // policy_changes are append-only; the trigger steps aside for the backfill only.
  LK_RETURN_IF_ERROR(Exec("DROP TRIGGER policy_changes_no_update"));
  for (const auto& [job_id, mask] : masks) {
    if (mask.empty()) continue;
    LK_ASSIGN_STMT(job, "UPDATE jobs SET no_sync=?2 WHERE job_id=?1");
    job.Bind(1, job_id).Bind(2, mask);
    LK_RETURN_IF_ERROR(job.Run());
    LK_ASSIGN_STMT(change, "UPDATE policy_changes SET no_sync=?2 WHERE job_id=?1");
    change.Bind(1, job_id).Bind(2, mask);
    LK_RETURN_IF_ERROR(change.Run());
  }
  return Exec(
      "CREATE TRIGGER policy_changes_no_update BEFORE UPDATE ON policy_changes "
      "BEGIN SELECT RAISE(ABORT, 'policy_changes are append-only'); END;");
}

absl::Status SqliteStore::MigrateV2ToV3() {
  LK_RETURN_IF_ERROR(Exec(kMigrateV2ToV3));
  std::vector<std::pair<std::string, double>> rates;  // job_id, lr
  {
    LK_ASSIGN_STMT(st, "SELECT job_id, spec_json FROM jobs");
    while (true) {
      LK_ASSIGN_OR_RETURN(bool row, st.Step());
      if (!row) break;
      // Before v3 there were no schedules: every step ran at the optimizer's lr.
      if (std::optional<double> lr = SpecLr(st.Text(1))) rates.emplace_back(st.Text(0), *lr);
    }
    st.Reset();
  }
  for (const auto& [job_id, lr] : rates) {
    LK_ASSIGN_STMT(st, "UPDATE step_reports SET lr=?2 WHERE job_id=?1");
    st.Bind(1, job_id).Bind(2, lr);
    LK_RETURN_IF_ERROR(st.Run());
  }
  return absl::OkStatus();
}

absl::Status SqliteStore::Exec(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = absl::StrCat("sqlite: ", err ? err : "error");
    sqlite3_free(err);
    return absl::InternalError(msg);
  }
  return absl::OkStatus();
}

absl::StatusOr<SqliteStore::Stmt*> SqliteStore::Prepared(const char* sql) {
  auto it = cache_->by_sql.find(sql);
  if (it != cache_->by_sql.end()) {
    it->second->Reset();
    return it->second.get();
  }
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db_, sql, -1, &stmt, nullptr) != SQLITE_OK) {
    return absl::InternalError(absl::StrCat("sqlite: prepare: ", sqlite3_errmsg(db_)));
  }
  auto owned = std::make_unique<Stmt>(db_, stmt);
  Stmt* raw = owned.get();
  cache_->by_sql.emplace(sql, std::move(owned));
  return raw;
}

absl::Status SqliteStore::CreateJob(const JobRecord& j) {
  static constexpr const char* kSql =
      "INSERT INTO jobs (job_id, seq, state, spec_json, base_dir, join_token, rendezvous_host, "
      "rendezvous_port, rendezvous_host_fixed, kv_reduce, gas, generation, next_window, "
      "next_first_micro_batch, failure_reason, warnings_json, create_us, update_us, no_sync, "
      "attempt, restarts, resume_step, resume_sha256, last_checkpoint_step, "
      "last_checkpoint_sha256, last_recovery_reason, stalled_json, determinism_violations, "
      "submitter) VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17,?18,?19,"
      "?20,?21,?22,?23,?24,?25,?26,?27,?28,?29)";
  LK_ASSIGN_STMT(st, kSql);
  st.Bind(1, j.job_id).Bind(2, j.seq).Bind(3, static_cast<int>(j.state)).Bind(4, j.spec_json);
  st.Bind(5, j.base_dir).Bind(6, j.join_token).Bind(7, j.rendezvous_host);
  st.Bind(8, j.rendezvous_port).Bind(9, j.rendezvous_host_fixed ? 1 : 0);
  st.Bind(10, std::string(KvReducePolicyName(j.policy.kv_reduce)));
  st.Bind(11, j.policy.gradient_accumulation_steps).Bind(12, j.policy.generation);
  st.Bind(13, j.next_window).Bind(14, j.next_first_micro_batch).Bind(15, j.failure_reason);
  st.Bind(16, nlohmann::json(j.warnings).dump());
  st.Bind(17, Us(j.create_time)).Bind(18, Us(j.update_time));
  st.Bind(19, NoSyncText(j.policy.no_sync));
  BindFaults(st, 20, j);
  st.Bind(29, j.submitter);
  return st.Run();
}

absl::Status SqliteStore::UpdateJob(const JobRecord& j) {
  static constexpr const char* kSql =
      "UPDATE jobs SET state=?2, rendezvous_host=?3, rendezvous_port=?4, failure_reason=?5, "
      "update_us=?6, attempt=?7, restarts=?8, resume_step=?9, resume_sha256=?10, "
      "last_checkpoint_step=?11, last_checkpoint_sha256=?12, last_recovery_reason=?13, "
      "stalled_json=?14, determinism_violations=?15 WHERE job_id=?1";
  LK_ASSIGN_STMT(st, kSql);
  st.Bind(1, j.job_id).Bind(2, static_cast<int>(j.state)).Bind(3, j.rendezvous_host);
  st.Bind(4, j.rendezvous_port).Bind(5, j.failure_reason).Bind(6, Us(j.update_time));
  BindFaults(st, 7, j);
  return st.Run();
}

absl::Status SqliteStore::PutWorker(const WorkerRecord& w) {
  static constexpr const char* kSql =
      "INSERT OR REPLACE INTO workers (job_id, rank, worker_id, host, state, join_us, attempt) "
      "VALUES (?1,?2,?3,?4,?5,?6,?7)";
  LK_ASSIGN_STMT(st, kSql);
  st.Bind(1, w.job_id).Bind(2, w.rank).Bind(3, w.worker_id).Bind(4, w.host);
  st.Bind(5, static_cast<int>(w.state)).Bind(6, Us(w.join_time)).Bind(7, w.attempt);
  return st.Run();
}

absl::Status SqliteStore::AppendLatches(const std::string& job_id,
                                        const std::vector<PublishedLatch>& latches,
                                        int64_t next_window, int64_t next_first_micro_batch) {
  static constexpr const char* kInsert = "INSERT INTO latches VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9)";
  static constexpr const char* kMove =
      "UPDATE jobs SET next_window=?2, next_first_micro_batch=?3 WHERE job_id=?1";
  LK_ASSIGN_STMT(ins, kInsert);
  LK_ASSIGN_STMT(mv, kMove);
  LK_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
  absl::Status s;
  for (const PublishedLatch& p : latches) {
    const Latch& l = p.latch;
    ins.Bind(1, job_id).Bind(2, l.window).Bind(3, l.generation).Bind(4, l.first_micro_batch);
    ins.Bind(5, l.n).Bind(6, std::string(KvModeName(l.kv_mode))).Bind(7, NoSyncText(l.no_sync));
    ins.Bind(8, l.reason).Bind(9, Us(p.publish_time));
    s = ins.Run();
    if (!s.ok()) break;
  }
  if (s.ok()) {
    mv.Bind(1, job_id).Bind(2, next_window).Bind(3, next_first_micro_batch);
    s = mv.Run();
  }
  if (!s.ok()) {
    Exec("ROLLBACK").IgnoreError();
    return s;
  }
  return Exec("COMMIT");
}

absl::Status SqliteStore::AppendPolicyChange(const PolicyChangeRecord& c) {
  static constexpr const char* kInsert =
      "INSERT INTO policy_changes (job_id, generation, kv_reduce, gas, first_window, change_us, "
      "no_sync) VALUES (?1,?2,?3,?4,?5,?6,?7)";
  static constexpr const char* kJob =
      "UPDATE jobs SET kv_reduce=?2, gas=?3, generation=?4, update_us=?5, no_sync=?6 "
      "WHERE job_id=?1";
  LK_ASSIGN_STMT(ins, kInsert);
  LK_ASSIGN_STMT(job, kJob);
  const std::string kv = KvReducePolicyName(c.policy.kv_reduce);
  const std::string mask = NoSyncText(c.policy.no_sync);
  LK_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
  ins.Bind(1, c.job_id).Bind(2, c.policy.generation).Bind(3, kv);
  ins.Bind(4, c.policy.gradient_accumulation_steps).Bind(5, c.first_window);
  ins.Bind(6, Us(c.change_time)).Bind(7, mask);
  absl::Status s = ins.Run();
  if (s.ok()) {
    job.Bind(1, c.job_id).Bind(2, kv).Bind(3, c.policy.gradient_accumulation_steps);
    job.Bind(4, c.policy.generation).Bind(5, Us(c.change_time)).Bind(6, mask);
    s = job.Run();
  }
  if (!s.ok()) {
    Exec("ROLLBACK").IgnoreError();
    return s;
  }
  return Exec("COMMIT");
}

absl::StatusOr<bool> SqliteStore::InsertStepReport(const StepReportRecord& record) {
  static constexpr const char* kSql =
      "INSERT OR IGNORE INTO step_reports (job_id, rank, step, micro_batches, loss, grad_norm, "
      "kv_mode, kv_allreduce_calls, collective_calls_json, step_seconds, tokens, "
      "latch_generation, report_us, lr, eval_loss, boundary_wait_seconds) "
      "VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16)";
  LK_ASSIGN_STMT(st, kSql);
  const StepReport& r = record.report;
  st.Bind(1, record.job_id).Bind(2, record.rank).Bind(3, r.step).Bind(4, r.micro_batches);
  st.Bind(5, r.loss).Bind(6, r.grad_norm).Bind(7, std::string(KvModeName(r.kv_mode)));
  st.Bind(8, r.kv_allreduce_calls).Bind(9, nlohmann::json(r.collective_calls).dump());
  st.Bind(10, r.step_seconds).Bind(11, r.tokens).Bind(12, r.latch_generation);
  st.Bind(13, Us(record.report_time)).Bind(14, r.lr);
  if (r.eval_loss) st.Bind(15, *r.eval_loss);  // unbound: NULL, no evaluation in this step
  st.Bind(16, r.boundary_wait_seconds);
  LK_RETURN_IF_ERROR(st.Run());
  return sqlite3_changes(db_) > 0;
}

absl::StatusOr<std::vector<JobRecord>> SqliteStore::LoadJobs() {
  LK_ASSIGN_STMT(st,
                 "SELECT job_id, seq, state, spec_json, base_dir, join_token, rendezvous_host, "
                 "rendezvous_port, rendezvous_host_fixed, kv_reduce, gas, generation, "
                 "next_window, next_first_micro_batch, failure_reason, warnings_json, create_us, "
                 "update_us, no_sync, attempt, restarts, resume_step, resume_sha256, "
                 "last_checkpoint_step, last_checkpoint_sha256, last_recovery_reason, "
                 "stalled_json, determinism_violations, submitter FROM jobs ORDER BY seq");
  std::vector<JobRecord> out;
  while (true) {
    LK_ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) break;
    JobRecord j;
    j.job_id = st.Text(0);
    const std::string where = absl::StrCat("job ", j.job_id);
    j.seq = st.Int(1);
    LK_ASSIGN_OR_RETURN(j.state, JobStateFromInt(where, st.Int(2)));
    j.spec_json = st.Text(3);
    j.base_dir = st.Text(4);
    j.join_token = st.Text(5);
    j.submitter = st.Text(28);
    j.rendezvous_host = st.Text(6);
    j.rendezvous_port = static_cast<int>(st.Int(7));
    j.rendezvous_host_fixed = st.Int(8) != 0;
    LK_ASSIGN_OR_RETURN(j.policy.kv_reduce, KvReduceFromText(where, st.Text(9)));
    j.policy.gradient_accumulation_steps = static_cast<int>(st.Int(10));
    j.policy.generation = st.Int(11);
    j.next_window = st.Int(12);
    j.next_first_micro_batch = st.Int(13);
    j.failure_reason = st.Text(14);
    auto warnings = nlohmann::json::parse(st.Text(15), nullptr, false);
    if (warnings.is_array()) {
      for (const auto& w : warnings) {
        if (w.is_string()) j.warnings.push_back(w.get<std::string>());
      }
    }
    j.create_time = FromUs(st.Int(16));
    j.update_time = FromUs(st.Int(17));
    LK_ASSIGN_OR_RETURN(j.policy.no_sync, NoSyncFromText(where, st.Text(18)));
    j.attempt = st.Int(19);
    j.restarts = static_cast<int>(st.Int(20));
    j.resume_step = st.Int(21);
    j.resume_manifest_sha256 = st.Text(22);
    j.last_checkpoint_step = st.Int(23);
    j.last_checkpoint_sha256 = st.Text(24);
    j.last_recovery_reason = st.Text(25);
    LK_ASSIGN_OR_RETURN(j.stalled, StalledFromJson(where, st.Text(26)));
    j.determinism_violations = st.Int(27);
    if (j.attempt < 1) return Corrupt(where, absl::StrCat("attempt ", j.attempt, " is not >= 1"));
    out.push_back(std::move(j));
  }
  st.Reset();
  return out;
}

absl::StatusOr<std::vector<WorkerRecord>> SqliteStore::LoadWorkers() {
  LK_ASSIGN_STMT(st,
                 "SELECT job_id, rank, worker_id, host, state, join_us, attempt FROM workers "
                 "ORDER BY job_id, rank");
  std::vector<WorkerRecord> out;
  while (true) {
    LK_ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) break;
    WorkerRecord w;
    w.job_id = st.Text(0);
    w.rank = static_cast<int>(st.Int(1));
    w.worker_id = st.Text(2);
    w.host = st.Text(3);
    LK_ASSIGN_OR_RETURN(
        w.state,
        WorkerStateFromInt(absl::StrCat("worker ", w.job_id, "/rank ", w.rank), st.Int(4)));
    w.join_time = FromUs(st.Int(5));
    w.attempt = st.Int(6);
    out.push_back(std::move(w));
  }
  st.Reset();
  return out;
}

absl::StatusOr<std::vector<RankProgress>> SqliteStore::LoadProgress() {
  LK_ASSIGN_STMT(st, "SELECT job_id, rank, MAX(step) FROM step_reports GROUP BY job_id, rank");
  std::vector<RankProgress> out;
  while (true) {
    LK_ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) break;
    out.push_back({st.Text(0), static_cast<int>(st.Int(1)), st.Int(2)});
  }
  st.Reset();
  return out;
}

absl::StatusOr<std::vector<PublishedLatch>> SqliteStore::LoadLatches(const std::string& job_id,
                                                                     int64_t start_window,
                                                                     int64_t limit) {
  LK_ASSIGN_STMT(st,
                 "SELECT job_id, window, generation, first_micro_batch, n, kv_mode, no_sync, "
                 "reason, publish_us FROM latches WHERE job_id=?1 AND window>=?2 "
                 "ORDER BY window LIMIT ?3");
  st.Bind(1, job_id).Bind(2, start_window).Bind(3, limit);
  std::vector<PublishedLatch> out;
  while (true) {
    LK_ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) break;
    PublishedLatch p;
    Latch& l = p.latch;
    l.job_id = st.Text(0);
    l.window = st.Int(1);
    const std::string where = absl::StrCat("latch(", l.window, ") of job ", l.job_id);
    l.generation = st.Int(2);
    l.first_micro_batch = st.Int(3);
    l.n = static_cast<int>(st.Int(4));
    LK_ASSIGN_OR_RETURN(l.kv_mode, KvModeFromText(where, st.Text(5)));
    LK_ASSIGN_OR_RETURN(l.no_sync, NoSyncFromText(where, st.Text(6)));
    if (l.n < 1 || l.no_sync.size() != static_cast<size_t>(l.n) || l.no_sync.back()) {
      return Corrupt(where, absl::StrCat("no_sync '", st.Text(6), "' is not a mask of ", l.n,
                                         " micro-batches ending in a synchronizing one"));
    }
    l.reason = st.Text(7);
    p.publish_time = FromUs(st.Int(8));
    out.push_back(std::move(p));
  }
  st.Reset();
  return out;
}

absl::StatusOr<std::vector<PolicyChangeRecord>> SqliteStore::LoadPolicyChanges(
    const std::string& job_id) {
  LK_ASSIGN_STMT(st,
                 "SELECT job_id, generation, kv_reduce, gas, first_window, change_us, no_sync "
                 "FROM policy_changes WHERE job_id=?1 ORDER BY generation");
  st.Bind(1, job_id);
  std::vector<PolicyChangeRecord> out;
  while (true) {
    LK_ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) break;
    PolicyChangeRecord c;
    c.job_id = st.Text(0);
    c.policy.generation = st.Int(1);
    const std::string where =
        absl::StrCat("policy change ", c.policy.generation, " of job ", c.job_id);
    LK_ASSIGN_OR_RETURN(c.policy.kv_reduce, KvReduceFromText(where, st.Text(2)));
    c.policy.gradient_accumulation_steps = static_cast<int>(st.Int(3));
    c.first_window = st.Int(4);
    c.change_time = FromUs(st.Int(5));
    LK_ASSIGN_OR_RETURN(c.policy.no_sync, NoSyncFromText(where, st.Text(6)));
    out.push_back(std::move(c));
  }
  st.Reset();
  return out;
}

absl::StatusOr<std::vector<StepReportRecord>> SqliteStore::LoadStepReports(
    const std::string& job_id, int64_t from_step) {
  return QueryStepReports(job_id, from_step, std::numeric_limits<int64_t>::max(), -1);
}

absl::StatusOr<StepReportRecord> SqliteStore::LoadStepReport(const std::string& job_id, int rank,
                                                             int64_t step) {
  LK_ASSIGN_OR_RETURN(std::vector<StepReportRecord> found,
                      QueryStepReports(job_id, step, step, rank));
  if (found.empty()) {
    return absl::NotFoundError(
        absl::StrCat("step report ", step, " of job ", job_id, " rank ", rank, ": not stored"));
  }
  return std::move(found.front());
}

absl::StatusOr<std::vector<StepReportRecord>> SqliteStore::QueryStepReports(
    const std::string& job_id, int64_t from_step, int64_t to_step, int rank) {
  LK_ASSIGN_STMT(
      st,
      "SELECT job_id, rank, step, micro_batches, loss, grad_norm, kv_mode, "
      "kv_allreduce_calls, collective_calls_json, step_seconds, tokens, "
      "latch_generation, report_us, lr, eval_loss, boundary_wait_seconds "
      "FROM step_reports WHERE job_id=?1 AND step>=?2 AND step<=?3 AND (?4<0 OR rank=?4) "
      "ORDER BY step, rank");
  st.Bind(1, job_id).Bind(2, from_step).Bind(3, to_step).Bind(4, rank);
  std::vector<StepReportRecord> out;
  while (true) {
    LK_ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) break;
    StepReportRecord record;
    StepReport& r = record.report;
    record.job_id = st.Text(0);
    record.rank = static_cast<int>(st.Int(1));
    r.step = st.Int(2);
    const std::string where =
        absl::StrCat("step report ", r.step, " of job ", record.job_id, " rank ", record.rank);
    r.micro_batches = static_cast<int>(st.Int(3));
    r.loss = st.Real(4);
    r.grad_norm = st.Real(5);
    LK_ASSIGN_OR_RETURN(r.kv_mode, KvModeFromText(where, st.Text(6)));
    r.kv_allreduce_calls = st.Int(7);
    auto calls = nlohmann::json::parse(st.Text(8), nullptr, false);
    if (calls.is_object()) r.collective_calls = calls.get<std::map<std::string, int64_t>>();
    r.step_seconds = st.Real(9);
    r.tokens = st.Int(10);
    r.latch_generation = st.Int(11);
    record.report_time = FromUs(st.Int(12));
    r.lr = st.Real(13);
    if (!st.Null(14)) r.eval_loss = st.Real(14);
    record.boundary_wait_stored = !st.Null(15);
    if (record.boundary_wait_stored) r.boundary_wait_seconds = st.Real(15);
    out.push_back(std::move(record));
  }
  st.Reset();
  return out;
}

}  // namespace latchkey
