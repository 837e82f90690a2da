// SqliteStore's prepared statements: private to sqlite_*.cc.
#ifndef LATCHKEY_SERVER_SQLITE_STMT_H_
#define LATCHKEY_SERVER_SQLITE_STMT_H_

#include <sqlite3.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "server/sqlite_store.h"

namespace latchkey {

inline int64_t Us(absl::Time t) { return absl::ToUnixMicros(t); }
inline absl::Time FromUs(int64_t us) { return absl::FromUnixMicros(us); }

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
  // A measured value that may not be finite (a diverged step's loss or gradient norm). SQLite
  // keeps ±Inf in a REAL but turns a NaN into NULL (which a NOT NULL column refuses), so a NaN is
  // bound as the text 'NaN': a REAL column keeps text that is no number as text. Measure reads
  // it back as NaN.
  Stmt& BindMeasure(int i, double v) {
    if (std::isnan(v)) return Bind(i, std::string("NaN"));
    return Bind(i, v);
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
  bool read_only() const { return sqlite3_stmt_readonly(stmt_) != 0; }
  int64_t Int(int c) { return sqlite3_column_int64(stmt_, c); }
  double Real(int c) { return sqlite3_column_double(stmt_, c); }
  // A column bound with BindMeasure (only a NaN is stored as text).
  double Measure(int c) {
    return sqlite3_column_type(stmt_, c) == SQLITE_TEXT ? std::nan("") : Real(c);
  }
  bool Null(int c) { return sqlite3_column_type(stmt_, c) == SQLITE_NULL; }
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

// A prepared statement from the cache, or the caller returns the prepare error.
#define LK_ASSIGN_STMT(var, sql)                       \
  LK_ASSIGN_OR_RETURN(Stmt* var##_ptr, Prepared(sql)); \
  Stmt& var = *var##_ptr

}  // namespace latchkey

#endif  // LATCHKEY_SERVER_SQLITE_STMT_H_
