// SqliteStore: schema v4 (attempts, checkpoints, job events) and the calls that use it.
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "server/sqlite_stmt.h"
#include "server/sqlite_store.h"
#include "server/sqlite_values.h"

namespace latchkey {
namespace {

// v3 -> v4: attempts. A job keeps its attempt, restarts, the checkpoint it resumed from, its
// newest committed checkpoint, the cause of its latest recovery, the stall verdicts still
// listed and its determinism violations; a worker the attempt it joined. Every existing job and
// worker is at attempt 1 with no checkpoint (the defaults). A step report keeps its boundary
// wait (NULL in the reports stored before). New tables: checkpoints (one row per committed step)
// and job_events (append-only audit of recoveries, stalls, ...).
constexpr const char* kMigrateV3ToV4 = R"sql(
ALTER TABLE jobs ADD COLUMN attempt INTEGER NOT NULL DEFAULT 1;
ALTER TABLE jobs ADD COLUMN restarts INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN resume_step INTEGER NOT NULL DEFAULT -1;
ALTER TABLE jobs ADD COLUMN resume_sha256 TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN last_checkpoint_step INTEGER NOT NULL DEFAULT -1;
ALTER TABLE jobs ADD COLUMN last_checkpoint_sha256 TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN last_recovery_reason TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN stalled_json TEXT NOT NULL DEFAULT '[]';
ALTER TABLE jobs ADD COLUMN determinism_violations INTEGER NOT NULL DEFAULT 0;
ALTER TABLE workers ADD COLUMN attempt INTEGER NOT NULL DEFAULT 1;
ALTER TABLE step_reports ADD COLUMN boundary_wait_seconds REAL;
CREATE TABLE checkpoints (
  job_id TEXT NOT NULL, step INTEGER NOT NULL, manifest_sha256 TEXT NOT NULL,
  bytes INTEGER NOT NULL, attempt INTEGER NOT NULL, report_us INTEGER NOT NULL,
  PRIMARY KEY (job_id, step));
CREATE TABLE job_events (
  id INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, event_us INTEGER NOT NULL,
  attempt INTEGER NOT NULL, kind TEXT NOT NULL, message TEXT NOT NULL);
CREATE INDEX job_events_by_job ON job_events (job_id, id);
CREATE TRIGGER job_events_no_update BEFORE UPDATE ON job_events
  BEGIN SELECT RAISE(ABORT, 'job_events are append-only'); END;
CREATE TRIGGER job_events_no_delete BEFORE DELETE ON job_events
  BEGIN SELECT RAISE(ABORT, 'job_events are append-only'); END;
)sql";

std::string StalledJson(const std::vector<StalledRank>& stalled) {
  nlohmann::json out = nlohmann::json::array();
  for (const StalledRank& s : stalled) {
    out.push_back({{"rank", s.rank},
                   {"window", s.window},
                   {"micro_batch", s.micro_batch},
                   {"where", s.where},
                   {"seconds", s.seconds},
                   {"attempt", s.attempt}});
  }
  return out.dump();
}

}  // namespace

absl::Status SqliteStore::MigrateV3ToV4() { return Exec(kMigrateV3ToV4); }

void SqliteStore::BindFaults(Stmt& st, int first, const JobRecord& j) {
  st.Bind(first, j.attempt).Bind(first + 1, j.restarts).Bind(first + 2, j.resume_step);
  st.Bind(first + 3, j.resume_manifest_sha256).Bind(first + 4, j.last_checkpoint_step);
  st.Bind(first + 5, j.last_checkpoint_sha256).Bind(first + 6, j.last_recovery_reason);
  st.Bind(first + 7, StalledJson(j.stalled)).Bind(first + 8, j.determinism_violations);
}

absl::StatusOr<std::vector<StalledRank>> SqliteStore::StalledFromJson(const std::string& row,
                                                                      const std::string& text) {
  auto parsed = nlohmann::json::parse(text, nullptr, false);
  if (!parsed.is_array()) return Corrupt(row, absl::StrCat("stalled_json '", text, "'"));
  std::vector<StalledRank> out;
  for (const auto& e : parsed) {
    if (!e.is_object() || !e.contains("rank") || !e["rank"].is_number_integer() ||
        !e.contains("where") || !e["where"].is_string()) {
      return Corrupt(row, absl::StrCat("stalled_json entry '", e.dump(), "'"));
    }
    StalledRank s;
    s.rank = e["rank"].get<int>();
    s.window = e.value("window", int64_t{-1});
    s.micro_batch = e.value("micro_batch", -1);
    s.where = e["where"].get<std::string>();
    s.seconds = e.value("seconds", 0.0);
    s.attempt = e.value("attempt", int64_t{0});
    out.push_back(std::move(s));
  }
  return out;
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

absl::Status SqliteStore::AppendEvent(const JobEventRecord& e) {
  static constexpr const char* kSql =
      "INSERT INTO job_events (job_id, event_us, attempt, kind, message) VALUES (?1,?2,?3,?4,?5)";
  LK_ASSIGN_STMT(st, kSql);
  st.Bind(1, e.job_id).Bind(2, Us(e.time)).Bind(3, e.attempt).Bind(4, e.kind).Bind(5, e.message);
  return st.Run();
}

absl::Status SqliteStore::UpdateJobWithEvent(const JobRecord& job, const JobEventRecord& event) {
  return InTransaction([&]() -> absl::Status {
    LK_RETURN_IF_ERROR(UpdateJob(job));
    return AppendEvent(event);
  });
}

absl::Status SqliteStore::PutCheckpoint(const CheckpointRecord& c, const JobRecord& job,
                                        const JobEventRecord& event) {
  static constexpr const char* kSql =
      "INSERT OR REPLACE INTO checkpoints (job_id, step, manifest_sha256, bytes, attempt, "
      "report_us) VALUES (?1,?2,?3,?4,?5,?6)";
  return InTransaction([&]() -> absl::Status {
    LK_ASSIGN_STMT(st, kSql);
    st.Bind(1, c.job_id).Bind(2, c.step).Bind(3, c.manifest_sha256).Bind(4, c.bytes);
    st.Bind(5, c.attempt).Bind(6, Us(c.report_time));
    LK_RETURN_IF_ERROR(st.Run());
    LK_RETURN_IF_ERROR(UpdateJob(job));
    return AppendEvent(event);
  });
}

absl::StatusOr<std::vector<CheckpointRecord>> SqliteStore::LoadCheckpoints(
    const std::string& job_id) {
  LK_ASSIGN_STMT(st,
                 "SELECT job_id, step, manifest_sha256, bytes, attempt, report_us "
                 "FROM checkpoints WHERE job_id=?1 ORDER BY step");
  st.Bind(1, job_id);
  std::vector<CheckpointRecord> out;
  while (true) {
    LK_ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) break;
    CheckpointRecord c;
    c.job_id = st.Text(0);
    c.step = st.Int(1);
    c.manifest_sha256 = st.Text(2);
    c.bytes = st.Int(3);
    c.attempt = st.Int(4);
    c.report_time = FromUs(st.Int(5));
    out.push_back(std::move(c));
  }
  st.Reset();
  return out;
}

absl::StatusOr<std::vector<JobEventRecord>> SqliteStore::LoadEvents(const std::string& job_id) {
  LK_ASSIGN_STMT(st,
                 "SELECT job_id, event_us, attempt, kind, message FROM job_events "
                 "WHERE job_id=?1 ORDER BY id");
  st.Bind(1, job_id);
  std::vector<JobEventRecord> out;
  while (true) {
    LK_ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) break;
    JobEventRecord e;
    e.job_id = st.Text(0);
    e.time = FromUs(st.Int(1));
    e.attempt = st.Int(2);
    e.kind = st.Text(3);
    e.message = st.Text(4);
    out.push_back(std::move(e));
  }
  st.Reset();
  return out;
}

}  // namespace latchkey
