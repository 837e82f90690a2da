// SqliteStore: the jobs table (a job's record, its fault-tolerance fields and stall verdicts) and
// the workers table (who holds each rank, in which attempt).
#include <sqlite3.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/job_uid.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "server/sqlite_stmt.h"
#include "server/sqlite_store.h"
#include "server/sqlite_values.h"

namespace latchkey {
namespace {

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

absl::Status SqliteStore::CreateJob(const JobRecord& j) {
  static constexpr const char* kSql =
      "INSERT INTO jobs (job_id, seq, state, spec_json, base_dir, join_token, rendezvous_host, "
      "rendezvous_port, rendezvous_host_fixed, kv_reduce, gas, generation, next_window, "
      "next_first_micro_batch, failure_reason, warnings_json, create_us, update_us, no_sync, "
      "attempt, restarts, resume_step, resume_sha256, last_checkpoint_step, "
      "last_checkpoint_sha256, last_recovery_reason, stalled_json, determinism_violations, "
      "submitter, next_first_sample, job_uid) VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,"
      "?14,?15,?16,?17,?18,?19,?20,?21,?22,?23,?24,?25,?26,?27,?28,?29,?30,?31)";
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
  st.Bind(29, j.submitter).Bind(30, j.next_first_sample).Bind(31, j.job_uid);
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

void SqliteStore::BindFaults(Stmt& st, int first, const JobRecord& j) {
  st.Bind(first, j.attempt).Bind(first + 1, j.restarts).Bind(first + 2, j.resume_step);
  st.Bind(first + 3, j.resume_manifest_sha256).Bind(first + 4, j.last_checkpoint_step);
  st.Bind(first + 5, j.last_checkpoint_sha256).Bind(first + 6, j.last_recovery_reason);
  st.Bind(first + 7, StalledJson(j.stalled)).Bind(first + 8, j.determinism_violations);
}

absl::StatusOr<std::vector<JobRecord>> SqliteStore::LoadJobs() {
  LK_ASSIGN_STMT(
      st,
      "SELECT job_id, seq, state, spec_json, base_dir, join_token, rendezvous_host, "
      "rendezvous_port, rendezvous_host_fixed, kv_reduce, gas, generation, "
      "next_window, next_first_micro_batch, failure_reason, warnings_json, create_us, "
      "update_us, no_sync, attempt, restarts, resume_step, resume_sha256, "
      "last_checkpoint_step, last_checkpoint_sha256, last_recovery_reason, "
      "stalled_json, determinism_violations, submitter, next_first_sample, job_uid FROM jobs "
      "ORDER BY seq");
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
    j.next_first_sample = st.Int(29);
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
    j.job_uid = st.Text(30);
    if (!j.job_uid.empty() && !IsJobUid(j.job_uid)) {
      return Corrupt(where, absl::StrCat("job_uid '", j.job_uid, "'"));
    }
    out.push_back(std::move(j));
  }
  st.Reset();
  return out;
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

absl::Status SqliteStore::PutWorker(const WorkerRecord& w) {
  static constexpr const char* kSql =
      "INSERT OR REPLACE INTO workers (job_id, rank, worker_id, host, state, join_us, attempt) "
      "VALUES (?1,?2,?3,?4,?5,?6,?7)";
  LK_ASSIGN_STMT(st, kSql);
  st.Bind(1, w.job_id).Bind(2, w.rank).Bind(3, w.worker_id).Bind(4, w.host);
  st.Bind(5, static_cast<int>(w.state)).Bind(6, Us(w.join_time)).Bind(7, w.attempt);
  return st.Run();
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

}  // namespace latchkey
