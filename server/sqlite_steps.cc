// SqliteStore: a job's progress. Step reports (the first report of each (job, rank, step) kept)
// and committed checkpoints (one per (job, step), the latest report kept).
#include <sqlite3.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "server/sqlite_stmt.h"
#include "server/sqlite_store.h"
#include "server/sqlite_values.h"

namespace latchkey {
absl::StatusOr<bool> SqliteStore::InsertStepReport(const StepReportRecord& record) {
  LK_RETURN_IF_ERROR(CommitStaged());
  return WriteStepReport(record);
}

absl::StatusOr<bool> SqliteStore::StageStepReport(const StepReportRecord& record) {
  absl::MutexLock lock(&staged_mu_);
  if (keys_.count({record.job_id, record.rank, record.report.step}) > 0) return false;
  // Stored already? One lookup of the key on this connection: in WAL it does not wait for the
  // group writer.
  LK_ASSIGN_STMT(st, "SELECT 1 FROM step_reports WHERE job_id=?1 AND rank=?2 AND step=?3");
  st.Bind(1, record.job_id).Bind(2, record.rank).Bind(3, record.report.step);
  LK_ASSIGN_OR_RETURN(bool stored, st.Step());
  st.Reset();
  if (stored) return false;
  pending_.push_back(record);
  keys_.insert({record.job_id, record.rank, record.report.step});
  return true;
}

// The first report of a (job, rank, step) is kept: a repeat of the key is no change (false), and
// only that; any other constraint (a NULL where none may be) is the statement's error, never a
// report silently dropped. The loss, gradient norm and eval loss of a diverged step may be NaN or
// ±Inf: bound as measures (Stmt::BindMeasure), they are stored and read back as they were.
absl::StatusOr<bool> SqliteStore::WriteStepReport(const StepReportRecord& record) {
  static constexpr const char* kSql =
      "INSERT INTO step_reports (job_id, rank, step, micro_batches, loss, grad_norm, "
      "kv_mode, kv_allreduce_calls, collective_calls_json, step_seconds, tokens, "
      "latch_generation, report_us, lr, eval_loss, boundary_wait_seconds, peak_memory_bytes, "
      "activation_memory_bytes, reserved_memory_bytes) "
      "VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17,?18,?19) "
      "ON CONFLICT (job_id, rank, step) DO NOTHING";
  LK_ASSIGN_OR_RETURN(Stmt * st_ptr, Prepared(kSql, /*in_group=*/true));
  Stmt& st = *st_ptr;
  const StepReport& r = record.report;
  st.Bind(1, record.job_id).Bind(2, record.rank).Bind(3, r.step).Bind(4, r.micro_batches);
  st.BindMeasure(5, r.loss).BindMeasure(6, r.grad_norm);
  st.Bind(7, std::string(KvModeName(r.kv_mode)));
  st.Bind(8, r.kv_allreduce_calls).Bind(9, nlohmann::json(r.collective_calls).dump());
  st.Bind(10, r.step_seconds).Bind(11, r.tokens).Bind(12, r.latch_generation);
  st.Bind(13, Us(record.report_time)).Bind(14, r.lr);
  if (r.eval_loss) st.BindMeasure(15, *r.eval_loss);  // unbound: NULL, no evaluation
  st.Bind(16, r.boundary_wait_seconds).Bind(17, r.peak_memory_bytes);
  st.Bind(18, r.activation_memory_bytes).Bind(19, r.reserved_memory_bytes);
  LK_RETURN_IF_ERROR(st.Run());
  return sqlite3_changes(db_) > 0;
}

absl::StatusOr<std::vector<RankProgress>> SqliteStore::LoadProgress() {
  std::map<std::pair<std::string, int>, int64_t> newest;
  ForEachStaged([&](const StepReportRecord& r) {  // before the table: see StagedOf
    int64_t& step = newest.try_emplace({r.job_id, r.rank}, r.report.step).first->second;
    step = std::max(step, r.report.step);
  });
  LK_ASSIGN_STMT(st, "SELECT job_id, rank, MAX(step) FROM step_reports GROUP BY job_id, rank");
  while (true) {
    LK_ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) break;
    int64_t& step =
        newest.try_emplace({st.Text(0), static_cast<int>(st.Int(1))}, st.Int(2)).first->second;
    step = std::max(step, st.Int(2));
  }
  st.Reset();
  std::vector<RankProgress> out;
  for (const auto& [key, step] : newest) out.push_back({key.first, key.second, step});
  return out;
}

absl::StatusOr<std::vector<StepReportRecord>> SqliteStore::LoadStepReports(
    const std::string& job_id, int64_t from_step) {
  const int64_t to_step = std::numeric_limits<int64_t>::max();
  const std::vector<StepReportRecord> staged = StagedOf(job_id, from_step, to_step, -1);
  LK_ASSIGN_OR_RETURN(std::vector<StepReportRecord> out,
                      QueryStepReports(job_id, from_step, to_step, -1));
  MergeStaged(staged, out);
  return out;
}

absl::StatusOr<StepReportRecord> SqliteStore::LoadStepReport(const std::string& job_id, int rank,
                                                             int64_t step) {
  const std::vector<StepReportRecord> staged = StagedOf(job_id, step, step, rank);
  LK_ASSIGN_OR_RETURN(std::vector<StepReportRecord> found,
                      QueryStepReports(job_id, step, step, rank));
  MergeStaged(staged, found);
  if (found.empty()) {
    return absl::NotFoundError(
        absl::StrCat("step report ", step, " of job ", job_id, " rank ", rank, ": not stored"));
  }
  return std::move(found.front());
}

// Copied before the table is read: a commit that ends in between moves a report from memory to
// the table, where the read then finds it.
std::vector<StepReportRecord> SqliteStore::StagedOf(const std::string& job_id, int64_t from_step,
                                                    int64_t to_step, int rank) const {
  std::vector<StepReportRecord> out;
  ForEachStaged([&](const StepReportRecord& r) {
    if (r.job_id != job_id || r.report.step < from_step || r.report.step > to_step) return;
    if (rank >= 0 && r.rank != rank) return;
    out.push_back(r);
    // As the table gives it back: the boundary wait is stored, collective seconds are not.
    out.back().boundary_wait_stored = true;
    out.back().collective_seconds_stored = false;
  });
  return out;
}

void SqliteStore::ForEachStaged(const std::function<void(const StepReportRecord&)>& fn) const {
  absl::MutexLock lock(&staged_mu_);
  for (const StepReportRecord& r : committing_) fn(r);
  for (const StepReportRecord& r : pending_) fn(r);
}

void SqliteStore::MergeStaged(const std::vector<StepReportRecord>& staged,
                              std::vector<StepReportRecord>& stored) {
  if (staged.empty()) return;
  std::set<std::pair<int64_t, int>> in_table;
  for (const StepReportRecord& r : stored) in_table.insert({r.report.step, r.rank});
  for (const StepReportRecord& r : staged) {
    if (in_table.count({r.report.step, r.rank}) == 0) stored.push_back(r);
  }
  std::stable_sort(stored.begin(), stored.end(), [](const auto& a, const auto& b) {
    return std::tie(a.report.step, a.rank) < std::tie(b.report.step, b.rank);
  });
}

absl::StatusOr<std::vector<StepReportRecord>> SqliteStore::QueryStepReports(
    const std::string& job_id, int64_t from_step, int64_t to_step, int rank) {
  LK_ASSIGN_STMT(
      st,
      "SELECT job_id, rank, step, micro_batches, loss, grad_norm, kv_mode, "
      "kv_allreduce_calls, collective_calls_json, step_seconds, tokens, "
      "latch_generation, report_us, lr, eval_loss, boundary_wait_seconds, peak_memory_bytes, "
      "activation_memory_bytes, reserved_memory_bytes "
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
    r.loss = st.Measure(4);
    r.grad_norm = st.Measure(5);
    LK_ASSIGN_OR_RETURN(r.kv_mode, KvModeFromText(where, st.Text(6)));
    r.kv_allreduce_calls = st.Int(7);
    auto calls = nlohmann::json::parse(st.Text(8), nullptr, false);
    if (calls.is_object()) r.collective_calls = calls.get<std::map<std::string, int64_t>>();
    r.step_seconds = st.Real(9);
    r.tokens = st.Int(10);
    r.latch_generation = st.Int(11);
    record.report_time = FromUs(st.Int(12));
    r.lr = st.Real(13);
    if (!st.Null(14)) r.eval_loss = st.Measure(14);
    record.boundary_wait_stored = !st.Null(15);
    if (record.boundary_wait_stored) r.boundary_wait_seconds = st.Real(15);
    r.peak_memory_bytes = st.Int(16);
    r.activation_memory_bytes = st.Int(17);
    r.reserved_memory_bytes = st.Int(18);
    record.collective_seconds_stored = false;
    out.push_back(std::move(record));
  }
  st.Reset();
  return out;
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

}  // namespace latchkey
