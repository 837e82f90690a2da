// SqliteStore: the connection (opening, durability, the schema brought up to date by
// sqlite_schema.cc), statements and transactions. The tables' reads and writes are one file per
// concern: sqlite_jobs.cc (jobs, workers), sqlite_latches.cc (latches, policy changes),
// sqlite_steps.cc (step reports, checkpoints), sqlite_events.cc (job events).
#include "server/sqlite_store.h"

#include <sqlite3.h>

#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/sqlite_stmt.h"

namespace latchkey {

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
  if (s.ok()) s = store->Upgrade();
  // Every error of opening names the file as the flag does.
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

absl::Status SqliteStore::InTransaction(const std::function<absl::Status()>& body) {
  LK_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
  absl::Status s = body();
  if (!s.ok()) {
    Exec("ROLLBACK").IgnoreError();
    return s;
  }
  return Exec("COMMIT");
}

}  // namespace latchkey
