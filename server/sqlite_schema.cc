// SqliteStore's schema, version by version: v1 as the first release created it, then one
// migration per version, in order, each run in one transaction by Upgrade() (PRAGMA
// user_version names the version a file is at). Never edit a version here: a change of the
// schema is a new migration at the end and a new SqliteStore::kSchemaVersion.
#include <sqlite3.h>

#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/job_uid.h"
#include "common/status_macros.h"
#include "server/security.h"
#include "server/sqlite_stmt.h"
#include "server/sqlite_store.h"
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

// v4 -> v5 (docs/protocol.md "Security"): the submitter of each job (the NAME of the role token
// that submitted it; '' for the jobs before), and join tokens replaced by their SHA-256, so the
// file holds no secret a worker could present. MigrateV4ToV5 hashes the stored tokens.
constexpr const char* kMigrateV4ToV5 = R"sql(
ALTER TABLE jobs ADD COLUMN submitter TEXT NOT NULL DEFAULT '';
)sql";

// v5 -> v6 (docs/data.md): every latch carries first_sample, the global stream positions
// consumed before its window, and the job its next one. MigrateV5ToV6 fills both for the jobs
// before, which all ran their spec's layout: first_sample = M * DP * MB.
constexpr const char* kMigrateV5ToV6 = R"sql(
ALTER TABLE latches ADD COLUMN first_sample INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN next_first_sample INTEGER NOT NULL DEFAULT 0;
)sql";

// v6 -> v7 (docs/fault-tolerance.md "Elastic recovery"): an attempt may run another layout
// than the spec's. The attempts table keeps every attempt after the first with its layout,
// resume step and cause (the jobs of before ran the spec's layout in every attempt: no rows;
// the coordinator reads a missing attempt as the spec's layout). A new layout re-decides the
// windows after its resume step while the old layout's latches stay, immutable: latches are
// keyed by (job_id, layout_attempt, window), the existing ones decided by attempt 1's layout.
// SQLite cannot change a primary key in place: the table is rebuilt, its triggers with it.
constexpr const char* kMigrateV6ToV7 = R"sql(
CREATE TABLE attempts (
  job_id TEXT NOT NULL, attempt INTEGER NOT NULL, world_size INTEGER NOT NULL,
  tp INTEGER NOT NULL, dp INTEGER NOT NULL, gas INTEGER NOT NULL, resume_step INTEGER NOT NULL,
  cause TEXT NOT NULL, layout_attempt INTEGER NOT NULL, start_us INTEGER NOT NULL,
  PRIMARY KEY (job_id, attempt));
CREATE TABLE latches_by_layout (
  job_id TEXT NOT NULL, window INTEGER NOT NULL, generation INTEGER NOT NULL,
  first_micro_batch INTEGER NOT NULL, n INTEGER NOT NULL, kv_mode TEXT NOT NULL,
  no_sync TEXT NOT NULL, reason TEXT NOT NULL, publish_us INTEGER NOT NULL,
  layout_attempt INTEGER NOT NULL DEFAULT 1, first_sample INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (job_id, layout_attempt, window));
INSERT INTO latches_by_layout (job_id, window, generation, first_micro_batch, n, kv_mode,
                               no_sync, reason, publish_us, layout_attempt, first_sample)
  SELECT job_id, window, generation, first_micro_batch, n, kv_mode, no_sync, reason, publish_us,
         1, first_sample FROM latches;
DROP TRIGGER latches_no_update;
DROP TRIGGER latches_no_delete;
DROP TABLE latches;
ALTER TABLE latches_by_layout RENAME TO latches;
CREATE INDEX latches_by_window ON latches (job_id, window);
CREATE TRIGGER latches_no_update BEFORE UPDATE ON latches
  BEGIN SELECT RAISE(ABORT, 'latches are append-only'); END;
CREATE TRIGGER latches_no_delete BEFORE DELETE ON latches
  BEGIN SELECT RAISE(ABORT, 'latches are append-only'); END;
)sql";

// v7 -> v8 (docs/memory.md "Measuring memory"): every step report keeps the rank's memory in
// the step: the high-water mark of its tensors' bytes, the bytes its last micro-batch's forward
// left for the backward, and the CUDA caching allocator's reserved bytes. Reports stored before
// did not measure them: 0.
constexpr const char* kMigrateV7ToV8 = R"sql(
ALTER TABLE step_reports ADD COLUMN peak_memory_bytes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE step_reports ADD COLUMN activation_memory_bytes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE step_reports ADD COLUMN reserved_memory_bytes INTEGER NOT NULL DEFAULT 0;
)sql";

// v8 -> v9 (docs/performance.md, "The control plane at scale"): step_reports, the one table
// that grows with every rank's every step, is keyed by (job_id, rank, step) WITHOUT ROWID, so
// the key is the table: a rowid table kept a second B-tree, the key's index, with each row's
// key again (about 20 of each report's 100 bytes). Same columns, same key, same rows; SQLite
// cannot drop a rowid in place: the table is rebuilt (it has no triggers or other indexes).
constexpr const char* kMigrateV8ToV9 = R"sql(
CREATE TABLE step_reports_by_key (
  job_id TEXT NOT NULL, rank INTEGER NOT NULL, step INTEGER NOT NULL,
  micro_batches INTEGER NOT NULL, loss REAL NOT NULL, grad_norm REAL NOT NULL,
  kv_mode TEXT NOT NULL, kv_allreduce_calls INTEGER NOT NULL, collective_calls_json TEXT NOT NULL,
  step_seconds REAL NOT NULL, tokens INTEGER NOT NULL, latch_generation INTEGER NOT NULL,
  report_us INTEGER NOT NULL, lr REAL NOT NULL DEFAULT 0, eval_loss REAL,
  boundary_wait_seconds REAL, peak_memory_bytes INTEGER NOT NULL DEFAULT 0,
  activation_memory_bytes INTEGER NOT NULL DEFAULT 0,
  reserved_memory_bytes INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (job_id, rank, step)) WITHOUT ROWID;
INSERT INTO step_reports_by_key (job_id, rank, step, micro_batches, loss, grad_norm, kv_mode,
    kv_allreduce_calls, collective_calls_json, step_seconds, tokens, latch_generation, report_us,
    lr, eval_loss, boundary_wait_seconds, peak_memory_bytes, activation_memory_bytes,
    reserved_memory_bytes)
  SELECT job_id, rank, step, micro_batches, loss, grad_norm, kv_mode, kv_allreduce_calls,
         collective_calls_json, step_seconds, tokens, latch_generation, report_us, lr, eval_loss,
         boundary_wait_seconds, peak_memory_bytes, activation_memory_bytes,
         reserved_memory_bytes FROM step_reports;
DROP TABLE step_reports;
ALTER TABLE step_reports_by_key RENAME TO step_reports;
)sql";

// v9 -> v10 (docs/fault-tolerance.md "Whose checkpoint is it"): every job keeps its uid, drawn
// at submit, which its checkpoints carry (job ids repeat across coordinators). MigrateV9ToV10
// draws one for every job before, as if it had been submitted now: the checkpoints such a job
// wrote before carry none, so they are resumed by their manifest's SHA-256 and never pruned.
constexpr const char* kMigrateV9ToV10 = R"sql(
ALTER TABLE jobs ADD COLUMN job_uid TEXT NOT NULL DEFAULT '';
)sql";

// v10 -> v11 (docs/fault-tolerance.md "Stragglers"): a latch may split its window unevenly over
// the DP replicas ("5,3": micro-batches by dp rank); '' is the even split every latch before had.
constexpr const char* kMigrateV10ToV11 = R"sql(
ALTER TABLE latches ADD COLUMN replica_micro_batches TEXT NOT NULL DEFAULT '';
)sql";

}  // namespace

absl::StatusOr<int> SqliteStore::SchemaVersion() {
  LK_ASSIGN_STMT(st, "PRAGMA user_version");
  LK_ASSIGN_OR_RETURN(bool row, st.Step());
  const int version = row ? static_cast<int>(st.Int(0)) : 0;
  st.Reset();
  return version;
}

absl::Status SqliteStore::Upgrade() {
  LK_ASSIGN_OR_RETURN(int version, SchemaVersion());
  if (version > kSchemaVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "schema version ", version, " is newer than this coordinator's (", kSchemaVersion,
        "); open it with the latchkey-coordinator that wrote it, or a newer one"));
  }
  if (version == 0) {
    // A new file, or a v1 one (v1 left user_version at 0): the DDL is idempotent on both.
    LK_RETURN_IF_ERROR(Exec(kSchemaV1));
    version = 1;
  }
  // A file written by an older coordinator (a new one starts at 0) is told of: rebuilding a
  // table (v7, v9) reads every row, minutes for a long job's reports.
  const bool older_file = version > 1;
  while (version < kSchemaVersion) {
    if (older_file) {
      std::fprintf(stderr, "latchkey-coordinator: migrating the database from schema v%d to v%d\n",
                   version, version + 1);
    }
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
    case 5:
      return MigrateV5ToV6();
    case 6:
      return Exec(kMigrateV6ToV7);
    case 7:
      return Exec(kMigrateV7ToV8);
    case 8:
      return Exec(kMigrateV8ToV9);
    case 9:
      return MigrateV9ToV10();
    case 10:
      return Exec(kMigrateV10ToV11);
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

absl::Status SqliteStore::MigrateV3ToV4() { return Exec(kMigrateV3ToV4); }

absl::Status SqliteStore::MigrateV4ToV5() {
  LK_RETURN_IF_ERROR(Exec(kMigrateV4ToV5));
  std::vector<std::pair<std::string, std::string>> hashed;  // job_id, SHA-256 of its token
  {
    LK_ASSIGN_STMT(st, "SELECT job_id, join_token FROM jobs");
    while (true) {
      LK_ASSIGN_OR_RETURN(bool row, st.Step());
      if (!row) break;
      hashed.emplace_back(st.Text(0), Sha256Hex(st.Text(1)));
    }
    st.Reset();
  }
  for (const auto& [job_id, hash] : hashed) {
    LK_ASSIGN_STMT(st, "UPDATE jobs SET join_token = ?1 WHERE job_id = ?2");
    st.Bind(1, hash).Bind(2, job_id);
    LK_RETURN_IF_ERROR(st.Run());
  }
  return absl::OkStatus();
}

absl::Status SqliteStore::MigrateV5ToV6() {
  LK_RETURN_IF_ERROR(Exec(kMigrateV5ToV6));
  std::vector<std::pair<std::string, int64_t>> per_micro_batch;  // job_id, DP * MB
  {
    LK_ASSIGN_STMT(st, "SELECT job_id, spec_json FROM jobs");
    while (true) {
      LK_ASSIGN_OR_RETURN(bool row, st.Step());
      if (!row) break;
      // A spec without a valid layout had no latches a worker could run: its rows stay 0.
      if (std::optional<int64_t> per = SpecSamplesPerMicroBatch(st.Text(1))) {
        per_micro_batch.emplace_back(st.Text(0), *per);
      }
    }
    st.Reset();
  }
  // latches are append-only; the trigger steps aside for the backfill only.
  LK_RETURN_IF_ERROR(Exec("DROP TRIGGER latches_no_update"));
  for (const auto& [job_id, samples] : per_micro_batch) {
    LK_ASSIGN_STMT(latches,
                   "UPDATE latches SET first_sample = first_micro_batch * ?2 WHERE job_id = ?1");
    latches.Bind(1, job_id).Bind(2, samples);
    LK_RETURN_IF_ERROR(latches.Run());
    LK_ASSIGN_STMT(job,
                   "UPDATE jobs SET next_first_sample = next_first_micro_batch * ?2 "
                   "WHERE job_id = ?1");
    job.Bind(1, job_id).Bind(2, samples);
    LK_RETURN_IF_ERROR(job.Run());
  }
  return Exec(
      "CREATE TRIGGER latches_no_update BEFORE UPDATE ON latches "
      "BEGIN SELECT RAISE(ABORT, 'latches are append-only'); END;");
}

absl::Status SqliteStore::MigrateV9ToV10() {
  LK_RETURN_IF_ERROR(Exec(kMigrateV9ToV10));
  std::vector<std::string> jobs;
  {
    LK_ASSIGN_STMT(st, "SELECT job_id FROM jobs");
    while (true) {
      LK_ASSIGN_OR_RETURN(bool row, st.Step());
      if (!row) break;
      jobs.push_back(st.Text(0));
    }
    st.Reset();
  }
  for (const std::string& job_id : jobs) {
    LK_ASSIGN_STMT(st, "UPDATE jobs SET job_uid = ?1 WHERE job_id = ?2");
    st.Bind(1, NewJobUid()).Bind(2, job_id);
    LK_RETURN_IF_ERROR(st.Run());
  }
  return absl::OkStatus();
}

}  // namespace latchkey
