#include "server/sqlite_store.h"

#include <sqlite3.h>

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace latchkey {
namespace {

constexpr const char* kSchema = R"sql(
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

int64_t Us(absl::Time t) { return absl::ToUnixMicros(t); }
absl::Time FromUs(int64_t us) { return absl::FromUnixMicros(us); }

std::string NoSyncText(const std::vector<bool>& mask) {
  std::string s;
  for (bool b : mask) s.push_back(b ? '1' : '0');
  return s;
}
std::vector<bool> NoSyncFromText(const std::string& s) {
  std::vector<bool> mask;
  for (char c : s) mask.push_back(c == '1');
  return mask;
}

}  // namespace

// A prepared statement with 1-based binds and 0-based columns.
class SqliteStore::Stmt {
 public:
  Stmt(sqlite3* db, sqlite3_stmt* stmt) : db_(db), stmt_(stmt) {}
  ~Stmt() { sqlite3_finalize(stmt_); }

  Stmt& Bind(int i, int64_t v) {
    sqlite3_bind_int64(stmt_, i, v);
    return *this;
  }
  Stmt& Bind(int i, int v) { return Bind(i, static_cast<int64_t>(v)); }
  Stmt& Bind(int i, double v) {
    sqlite3_bind_double(stmt_, i, v);
    return *this;
  }
  Stmt& Bind(int i, const std::string& v) {
    sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  // true: a row is available; false: done. Errors carry SQLite's message.
  absl::StatusOr<bool> Step() {
    const int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    const int ext = sqlite3_extended_errcode(db_);
    std::string msg = absl::StrCat("sqlite: ", sqlite3_errmsg(db_));
    sqlite3_reset(stmt_);
    if (ext == SQLITE_CONSTRAINT_PRIMARYKEY || ext == SQLITE_CONSTRAINT_TRIGGER ||
        ext == SQLITE_CONSTRAINT_UNIQUE) {
      return absl::FailedPreconditionError(msg);
    }
    return absl::InternalError(msg);
  }
  // Runs a statement that returns no rows and resets it.
  absl::Status Run() {
    auto r = Step();
    Reset();
    return r.status();
  }
  void Reset() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }
  int64_t Int(int c) { return sqlite3_column_int64(stmt_, c); }
  double Real(int c) { return sqlite3_column_double(stmt_, c); }
  std::string Text(int c) {
    const unsigned char* p = sqlite3_column_text(stmt_, c);
    return p ? std::string(reinterpret_cast<const char*>(p),
                           static_cast<size_t>(sqlite3_column_bytes(stmt_, c)))
             : std::string();
  }

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_;
};

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
  if (s.ok()) s = store->Exec(kSchema);
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat("--db ", path, ": ", s.message()));
  return store;
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

#define LK_ASSIGN_STMT(var, sql)                \
  auto var##_or = Prepared(sql);                \
  if (!var##_or.ok()) return var##_or.status(); \
  Stmt& var = **var##_or

#define LK_RETURN_IF_ERROR(expr) \
  do {                           \
    absl::Status _s = (expr);    \
    if (!_s.ok()) return _s;     \
  } while (0)

absl::Status SqliteStore::CreateJob(const JobRecord& j) {
  static constexpr const char* kSql =
      "INSERT INTO jobs VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17,?18)";
  LK_ASSIGN_STMT(st, kSql);
  st.Bind(1, j.job_id).Bind(2, j.seq).Bind(3, static_cast<int>(j.state)).Bind(4, j.spec_json);
  st.Bind(5, j.base_dir).Bind(6, j.join_token).Bind(7, j.rendezvous_host);
  st.Bind(8, j.rendezvous_port).Bind(9, j.rendezvous_host_fixed ? 1 : 0);
  st.Bind(10, std::string(KvReducePolicyName(j.policy.kv_reduce)));
  st.Bind(11, j.policy.gradient_accumulation_steps).Bind(12, j.policy.generation);
  st.Bind(13, j.next_window).Bind(14, j.next_first_micro_batch).Bind(15, j.failure_reason);
  st.Bind(16, nlohmann::json(j.warnings).dump());
  st.Bind(17, Us(j.create_time)).Bind(18, Us(j.update_time));
  return st.Run();
}

absl::Status SqliteStore::UpdateJob(const JobRecord& j) {
  static constexpr const char* kSql =
      "UPDATE jobs SET state=?2, rendezvous_host=?3, rendezvous_port=?4, failure_reason=?5, "
      "update_us=?6 WHERE job_id=?1";
  LK_ASSIGN_STMT(st, kSql);
  st.Bind(1, j.job_id).Bind(2, static_cast<int>(j.state)).Bind(3, j.rendezvous_host);
  st.Bind(4, j.rendezvous_port).Bind(5, j.failure_reason).Bind(6, Us(j.update_time));
  return st.Run();
}

absl::Status SqliteStore::PutWorker(const WorkerRecord& w) {
  static constexpr const char* kSql = "INSERT OR REPLACE INTO workers VALUES (?1,?2,?3,?4,?5,?6)";
  LK_ASSIGN_STMT(st, kSql);
  st.Bind(1, w.job_id).Bind(2, w.rank).Bind(3, w.worker_id).Bind(4, w.host);
  st.Bind(5, static_cast<int>(w.state)).Bind(6, Us(w.join_time));
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
  static constexpr const char* kInsert = "INSERT INTO policy_changes VALUES (?1,?2,?3,?4,?5,?6)";
  static constexpr const char* kJob =
      "UPDATE jobs SET kv_reduce=?2, gas=?3, generation=?4, update_us=?5 WHERE job_id=?1";
  LK_ASSIGN_STMT(ins, kInsert);
  LK_ASSIGN_STMT(job, kJob);
  const std::string kv = KvReducePolicyName(c.policy.kv_reduce);
  LK_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
  ins.Bind(1, c.job_id).Bind(2, c.policy.generation).Bind(3, kv);
  ins.Bind(4, c.policy.gradient_accumulation_steps).Bind(5, c.first_window);
  ins.Bind(6, Us(c.change_time));
  absl::Status s = ins.Run();
  if (s.ok()) {
    job.Bind(1, c.job_id).Bind(2, kv).Bind(3, c.policy.gradient_accumulation_steps);
    job.Bind(4, c.policy.generation).Bind(5, Us(c.change_time));
    s = job.Run();
  }
  if (!s.ok()) {
    Exec("ROLLBACK").IgnoreError();
    return s;
  }
  return Exec("COMMIT");
}

absl::StatusOr<bool> SqliteStore::InsertStepReport(const StepReportRecord& r) {
  static constexpr const char* kSql =
      "INSERT OR IGNORE INTO step_reports VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13)";
  LK_ASSIGN_STMT(st, kSql);
  st.Bind(1, r.job_id).Bind(2, r.rank).Bind(3, r.step).Bind(4, r.micro_batches);
  st.Bind(5, r.loss).Bind(6, r.grad_norm).Bind(7, std::string(KvModeName(r.kv_mode)));
  st.Bind(8, r.kv_allreduce_calls).Bind(9, nlohmann::json(r.collective_calls).dump());
  st.Bind(10, r.step_seconds).Bind(11, r.tokens).Bind(12, r.latch_generation);
  st.Bind(13, Us(r.report_time));
  LK_RETURN_IF_ERROR(st.Run());
  return sqlite3_changes(db_) > 0;
}

absl::StatusOr<std::vector<JobRecord>> SqliteStore::LoadJobs() {
  LK_ASSIGN_STMT(st, "SELECT * FROM jobs ORDER BY seq");
  std::vector<JobRecord> out;
  while (true) {
    auto row = st.Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    JobRecord j;
    j.job_id = st.Text(0);
    j.seq = st.Int(1);
    j.state = static_cast<JobState>(st.Int(2));
    j.spec_json = st.Text(3);
    j.base_dir = st.Text(4);
    j.join_token = st.Text(5);
    j.rendezvous_host = st.Text(6);
    j.rendezvous_port = static_cast<int>(st.Int(7));
    j.rendezvous_host_fixed = st.Int(8) != 0;
    j.policy.kv_reduce = ParseKvReducePolicy(st.Text(9)).value_or(KvReducePolicy::kAuto);
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
    out.push_back(std::move(j));
  }
  st.Reset();
  return out;
}

absl::StatusOr<std::vector<WorkerRecord>> SqliteStore::LoadWorkers() {
  LK_ASSIGN_STMT(st, "SELECT * FROM workers ORDER BY job_id, rank");
  std::vector<WorkerRecord> out;
  while (true) {
    auto row = st.Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    WorkerRecord w;
    w.job_id = st.Text(0);
    w.rank = static_cast<int>(st.Int(1));
    w.worker_id = st.Text(2);
    w.host = st.Text(3);
    w.state = static_cast<WorkerState>(st.Int(4));
    w.join_time = FromUs(st.Int(5));
    out.push_back(std::move(w));
  }
  st.Reset();
  return out;
}

absl::StatusOr<std::vector<RankProgress>> SqliteStore::LoadProgress() {
  LK_ASSIGN_STMT(st, "SELECT job_id, rank, MAX(step) FROM step_reports GROUP BY job_id, rank");
  std::vector<RankProgress> out;
  while (true) {
    auto row = st.Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    out.push_back({st.Text(0), static_cast<int>(st.Int(1)), st.Int(2)});
  }
  st.Reset();
  return out;
}

absl::StatusOr<std::vector<PublishedLatch>> SqliteStore::LoadLatches(const std::string& job_id,
                                                                     int64_t start_window,
                                                                     int64_t limit) {
  LK_ASSIGN_STMT(st,
                 "SELECT * FROM latches WHERE job_id=?1 AND window>=?2 ORDER BY window LIMIT ?3");
  st.Bind(1, job_id).Bind(2, start_window).Bind(3, limit);
  std::vector<PublishedLatch> out;
  while (true) {
    auto row = st.Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    PublishedLatch p;
    p.latch.job_id = st.Text(0);
    p.latch.window = st.Int(1);
    p.latch.generation = st.Int(2);
    p.latch.first_micro_batch = st.Int(3);
    p.latch.n = static_cast<int>(st.Int(4));
    p.latch.kv_mode = ParseKvMode(st.Text(5)).value_or(KvMode::kPerMicroBatch);
    p.latch.no_sync = NoSyncFromText(st.Text(6));
    p.latch.reason = st.Text(7);
    p.publish_time = FromUs(st.Int(8));
    out.push_back(std::move(p));
  }
  st.Reset();
  return out;
}

absl::StatusOr<std::vector<PolicyChangeRecord>> SqliteStore::LoadPolicyChanges(
    const std::string& job_id) {
  LK_ASSIGN_STMT(st, "SELECT * FROM policy_changes WHERE job_id=?1 ORDER BY generation");
  st.Bind(1, job_id);
  std::vector<PolicyChangeRecord> out;
  while (true) {
    auto row = st.Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    PolicyChangeRecord c;
    c.job_id = st.Text(0);
    c.policy.generation = st.Int(1);
    c.policy.kv_reduce = ParseKvReducePolicy(st.Text(2)).value_or(KvReducePolicy::kAuto);
    c.policy.gradient_accumulation_steps = static_cast<int>(st.Int(3));
    c.first_window = st.Int(4);
    c.change_time = FromUs(st.Int(5));
    out.push_back(std::move(c));
  }
  st.Reset();
  return out;
}

absl::StatusOr<std::vector<StepReportRecord>> SqliteStore::LoadStepReports(
    const std::string& job_id, int64_t from_step) {
  LK_ASSIGN_STMT(st, "SELECT * FROM step_reports WHERE job_id=?1 AND step>=?2 ORDER BY step, rank");
  st.Bind(1, job_id).Bind(2, from_step);
  std::vector<StepReportRecord> out;
  while (true) {
    auto row = st.Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    StepReportRecord r;
    r.job_id = st.Text(0);
    r.rank = static_cast<int>(st.Int(1));
    r.step = st.Int(2);
    r.micro_batches = static_cast<int>(st.Int(3));
    r.loss = st.Real(4);
    r.grad_norm = st.Real(5);
    r.kv_mode = ParseKvMode(st.Text(6)).value_or(KvMode::kPerMicroBatch);
    r.kv_allreduce_calls = st.Int(7);
    auto calls = nlohmann::json::parse(st.Text(8), nullptr, false);
    if (calls.is_object()) r.collective_calls = calls.get<std::map<std::string, int64_t>>();
    r.step_seconds = st.Real(9);
    r.tokens = st.Int(10);
    r.latch_generation = st.Int(11);
    r.report_time = FromUs(st.Int(12));
    out.push_back(std::move(r));
  }
  st.Reset();
  return out;
}

}  // namespace latchkey
