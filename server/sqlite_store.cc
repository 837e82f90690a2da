// SqliteStore: the connection (opening, durability, the schema brought up to date by
// sqlite_schema.cc), statements and transactions. The tables' reads and writes are one file per
// concern: sqlite_jobs.cc (jobs, workers), sqlite_latches.cc (latches, policy changes),
// sqlite_steps.cc (step reports, checkpoints), sqlite_events.cc (job events). The audit reader's
// connection is here too.
#include "server/sqlite_store.h"

#include <sqlite3.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "server/sqlite_stmt.h"

namespace latchkey {

struct SqliteStore::StmtCache {
  std::map<const char*, std::unique_ptr<Stmt>> by_sql;
};

// The read-only connection is a SqliteStore of its own (its Load* calls, its statement cache) that
// only this class reaches, under `mu_`: a sqlite3 connection opened NOMUTEX must not be used by
// two threads at once, and the writer's connection is the Coordinator's alone.
class SqliteStore::Reader : public AuditReader {
 public:
  explicit Reader(std::unique_ptr<SqliteStore> conn) : conn_(std::move(conn)) {}

  absl::StatusOr<AuditRows> ReadAudit(const std::string& job_id, int64_t start_window,
                                      int64_t limit) override {
    absl::MutexLock lock(&mu_);
    // One read transaction: the three reads see the same commit (WAL gives a reader the snapshot
    // of its first read), as they did when the writer's connection read them in one locked call.
    LK_RETURN_IF_ERROR(conn_->Exec("BEGIN"));
    absl::StatusOr<AuditRows> rows = Read(job_id, start_window, limit);
    // A read transaction left open would pin its snapshot: every later page would see old rows
    // and the WAL could not be checkpointed past it.
    absl::Status end = conn_->Exec(rows.ok() ? "COMMIT" : "ROLLBACK");
    if (!end.ok() && rows.ok()) conn_->Exec("ROLLBACK").IgnoreError();
    if (!rows.ok() || !end.ok()) return rows.ok() ? end : rows.status();
    return rows;
  }

 private:
  absl::StatusOr<AuditRows> Read(const std::string& job_id, int64_t start_window, int64_t limit)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    AuditRows out;
    LK_ASSIGN_OR_RETURN(out.latches, conn_->LoadLatches(job_id, start_window, limit));
    LK_ASSIGN_OR_RETURN(out.policy_changes, conn_->LoadPolicyChanges(job_id));
    LK_ASSIGN_OR_RETURN(out.events, conn_->LoadEvents(job_id));
    return out;
  }

  absl::Mutex mu_;
  std::unique_ptr<SqliteStore> conn_ ABSL_GUARDED_BY(mu_);
};

SqliteStore::SqliteStore(sqlite3* db) : db_(db), cache_(std::make_unique<StmtCache>()) {}

SqliteStore::~SqliteStore() {
  CommitGroup().IgnoreError();  // what is staged was not acknowledged; store it if possible
  // The other connections close first: the writer, closing last, checkpoints the WAL and
  // removes it as it did when it was the only connection.
  reader_.reset();
  group_writer_.reset();
  cache_.reset();  // finalize statements before closing
  sqlite3_close(db_);
}

AuditReader* SqliteStore::audit_reader() { return reader_.get(); }

namespace {

// Waits for another connection's write lock for up to 5 s, polling every 100 us: the two
// writers of one store (sqlite_store.h, "Group commit") hold it about a millisecond, and
// SQLite's own busy timeout sleeps 1, 2, 5, 10 ... ms at a time, which the coordinator's lock
// would wait out. Returns 0 (SQLITE_BUSY to the caller) once the 5 s are spent.
int WaitForWriteLock(void* /*unused*/, int tries) {
  constexpr int kPollMicros = 100;
  constexpr int kMaxTries = 5'000'000 / kPollMicros;
  if (tries >= kMaxTries) return 0;
  usleep(kPollMicros);
  return 1;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SqliteStore>> SqliteStore::Open(const std::string& path,
                                                               SqliteSync sync) {
  // Every error of opening names the file as the flag does.
  const auto named = [&path](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("--db ", path, ": ", s.message()));
  };
  // Before SQLite reads the log, which it would treat as empty (sqlite_integrity.cc).
  if (absl::Status wal = CheckWalHeader(path); !wal.ok()) return named(wal);
  sqlite3* db = nullptr;
  const int rc = sqlite3_open_v2(
      path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    sqlite3_close(db);
    return absl::UnavailableError(absl::StrCat("--db ", path, ": cannot open: ", msg));
  }
  std::unique_ptr<SqliteStore> store(new SqliteStore(db));
  sqlite3_busy_handler(db, &WaitForWriteLock, nullptr);
  // A damaged file is refused before anything is written to it.
  absl::Status s = store->CheckSound();
  // WAL: readers never block the writer and a commit is one append. NORMAL sync is durable
  // against a process crash; FULL adds an fsync per commit for power loss.
  if (s.ok()) s = store->Exec("PRAGMA journal_mode=WAL;");
  if (s.ok()) {
    s = store->Exec(sync == SqliteSync::kFull ? "PRAGMA synchronous=FULL;"
                                              : "PRAGMA synchronous=NORMAL;");
  }
  if (s.ok()) s = store->Upgrade();
  if (!s.ok()) return named(s);
  auto mode = store->QueryText("PRAGMA journal_mode");
  // Only with WAL do a reader and the writer not block each other. Without a reader the audit is
  // read on the writer's connection, as `latchkey audit` reads it: correct, only serialised.
  if (mode.ok() && *mode == "wal") {
    store->reader_ = OpenReader(db);
    store->group_writer_ = OpenGroupWriter(db, sync);
  }
  return store;
}

std::unique_ptr<SqliteStore> SqliteStore::OpenSecond(sqlite3* writer, int flags) {
  // The writer's own resolved path: the same file whatever the working directory is now. Empty
  // for an in-memory or temporary database, which no second connection can see.
  const char* file = sqlite3_db_filename(writer, "main");
  if (file == nullptr || *file == '\0') return nullptr;
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(file, &db, flags | SQLITE_OPEN_NOMUTEX, nullptr) != SQLITE_OK) {
    sqlite3_close(db);
    return nullptr;
  }
  if (flags & SQLITE_OPEN_READWRITE) {
    sqlite3_busy_handler(db, &WaitForWriteLock, nullptr);
  } else {
    sqlite3_busy_timeout(db, 5000);
  }
  return std::unique_ptr<SqliteStore>(new SqliteStore(db));
}

std::unique_ptr<SqliteStore> SqliteStore::OpenGroupWriter(sqlite3* writer, SqliteSync sync) {
  std::unique_ptr<SqliteStore> conn = OpenSecond(writer, SQLITE_OPEN_READWRITE);
  if (conn == nullptr) return nullptr;
  // The journal mode is the file's; durability is each connection's own.
  if (!conn->Exec(sync == SqliteSync::kFull ? "PRAGMA synchronous=FULL;"
                                            : "PRAGMA synchronous=NORMAL;")
           .ok()) {
    return nullptr;
  }
  auto mode = conn->QueryText("PRAGMA journal_mode");
  if (!mode.ok() || *mode != "wal") return nullptr;
  return conn;
}

std::unique_ptr<SqliteStore::Reader> SqliteStore::OpenReader(sqlite3* writer) {
  std::unique_ptr<SqliteStore> conn = OpenSecond(writer, SQLITE_OPEN_READONLY);
  if (conn == nullptr) return nullptr;
  // A read-only connection finds out whether it can use the WAL (its shared-memory index) at its
  // first read: read now, and the schema must be the one the writer just brought up to date.
  auto version = conn->SchemaVersion();
  if (!version.ok() || *version != kSchemaVersion) return nullptr;
  return std::make_unique<Reader>(std::move(conn));
}

absl::StatusOr<std::string> SqliteStore::QueryText(const char* sql) {
  LK_ASSIGN_OR_RETURN(Stmt * st, Prepared(sql));
  LK_ASSIGN_OR_RETURN(bool row, st->Step());
  std::string text = row ? st->Text(0) : std::string();
  st->Reset();
  return text;
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

absl::StatusOr<SqliteStore::Stmt*> SqliteStore::Prepared(const char* sql, bool in_group) {
  Stmt* st = nullptr;
  auto it = cache_->by_sql.find(sql);
  if (it != cache_->by_sql.end()) {
    st = it->second.get();
    st->Reset();
  } else {
    sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v2(db_, sql, -1, &stmt, nullptr) != SQLITE_OK) {
      return absl::InternalError(absl::StrCat("sqlite: prepare: ", sqlite3_errmsg(db_)));
    }
    auto owned = std::make_unique<Stmt>(db_, stmt);
    st = owned.get();
    cache_->by_sql.emplace(sql, std::move(owned));
  }
  // A write outside a transaction commits what is staged first (inside one, InTransaction did).
  if (!in_group && !st->read_only() && sqlite3_get_autocommit(db_)) {
    LK_RETURN_IF_ERROR(CommitStaged());
  }
  return st;
}

bool SqliteStore::HasStaged() const {
  absl::MutexLock lock(&staged_mu_);
  return !pending_.empty() || !committing_.empty();
}

absl::Status SqliteStore::CommitGroup() {
  absl::MutexLock lock(&group_mu_);
  absl::Status s = WriteStaged(group_writer_ ? *group_writer_ : *this);
  return lost_.ok() ? s : lost_;
}

absl::Status SqliteStore::CommitStaged() {
  if (!HasStaged()) return absl::OkStatus();
  absl::MutexLock lock(&group_mu_);
  return WriteStaged(group_writer_ ? *group_writer_ : *this);
}

namespace {

// Errors of a row itself, which no retry of the same INSERT can store.
bool RowRefused(int code) {
  const int primary = code & 0xff;
  return primary == SQLITE_CONSTRAINT || primary == SQLITE_TOOBIG || primary == SQLITE_MISMATCH ||
         primary == SQLITE_RANGE;
}

}  // namespace

absl::Status SqliteStore::WriteStaged(SqliteStore& conn) {
  std::vector<StepReportRecord> batch;
  {
    absl::MutexLock lock(&staged_mu_);
    committing_.insert(committing_.end(), std::make_move_iterator(pending_.begin()),
                       std::make_move_iterator(pending_.end()));
    pending_.clear();
    batch = committing_;
  }
  if (batch.empty()) return absl::OkStatus();
  absl::Status s = conn.Exec("BEGIN IMMEDIATE");
  size_t refused = batch.size();  // the index of a row SQLite refused, if any
  for (size_t i = 0; s.ok() && i < batch.size(); ++i) {
    s = conn.WriteStepReport(batch[i]).status();
    if (!s.ok() && RowRefused(sqlite3_extended_errcode(conn.db_))) refused = i;
  }
  if (s.ok()) s = conn.Exec("COMMIT");
  absl::MutexLock lock(&staged_mu_);
  if (s.ok()) {
    for (const StepReportRecord& r : committing_) keys_.erase({r.job_id, r.rank, r.report.step});
    committing_.clear();
    return s;
  }
  // SQLite rolls a transaction back by itself after some failures (an I/O error in COMMIT, a
  // full disk); otherwise it is rolled back here. The reports stay staged, before any staged
  // meanwhile.
  if (!sqlite3_get_autocommit(conn.db_)) conn.Exec("ROLLBACK").IgnoreError();
  if (refused < batch.size()) {
    const StepReportRecord& r = committing_[refused];
    keys_.erase({r.job_id, r.rank, r.report.step});
    lost_ = absl::DataLossError(absl::StrCat(
        "1 staged step reports lost: SQLite refused the report of step ", r.report.step, " of job ",
        r.job_id, " rank ", r.rank, " (", s.message(), ")"));
    committing_.erase(committing_.begin() + static_cast<std::ptrdiff_t>(refused));
    s = lost_;
  }
  pending_.insert(pending_.begin(), std::make_move_iterator(committing_.begin()),
                  std::make_move_iterator(committing_.end()));
  committing_.clear();
  return s;
}

absl::Status SqliteStore::InTransaction(const std::function<absl::Status()>& body) {
  LK_RETURN_IF_ERROR(CommitStaged());
  LK_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
  absl::Status s = body();
  if (!s.ok()) {
    Exec("ROLLBACK").IgnoreError();
    return s;
  }
  return Exec("COMMIT");
}

}  // namespace latchkey
