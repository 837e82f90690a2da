// SqliteStore: the append-only latches and policy changes (triggers refuse UPDATE and DELETE),
// each appended in one transaction with the job's latch position or current policy.
#include <sqlite3.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/sqlite_stmt.h"
#include "server/sqlite_store.h"
#include "server/sqlite_values.h"

namespace latchkey {
absl::Status SqliteStore::AppendLatches(const std::string& job_id,
                                        const std::vector<PublishedLatch>& latches,
                                        int64_t next_window, int64_t next_first_micro_batch,
                                        int64_t next_first_sample) {
  static constexpr const char* kInsert =
      "INSERT INTO latches (job_id, window, generation, first_micro_batch, n, kv_mode, no_sync, "
      "reason, publish_us, first_sample) VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10)";
  static constexpr const char* kMove =
      "UPDATE jobs SET next_window=?2, next_first_micro_batch=?3, next_first_sample=?4 "
      "WHERE job_id=?1";
  LK_ASSIGN_STMT(ins, kInsert);
  LK_ASSIGN_STMT(mv, kMove);
  LK_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
  absl::Status s;
  for (const PublishedLatch& p : latches) {
    const Latch& l = p.latch;
    ins.Bind(1, job_id).Bind(2, l.window).Bind(3, l.generation).Bind(4, l.first_micro_batch);
    ins.Bind(5, l.n).Bind(6, std::string(KvModeName(l.kv_mode))).Bind(7, NoSyncText(l.no_sync));
    ins.Bind(8, l.reason).Bind(9, Us(p.publish_time)).Bind(10, l.first_sample);
    s = ins.Run();
    if (!s.ok()) break;
  }
  if (s.ok()) {
    mv.Bind(1, job_id).Bind(2, next_window).Bind(3, next_first_micro_batch);
    mv.Bind(4, next_first_sample);
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

absl::StatusOr<std::vector<PublishedLatch>> SqliteStore::LoadLatches(const std::string& job_id,
                                                                     int64_t start_window,
                                                                     int64_t limit) {
  LK_ASSIGN_STMT(st,
                 "SELECT job_id, window, generation, first_micro_batch, n, kv_mode, no_sync, "
                 "reason, publish_us, first_sample FROM latches WHERE job_id=?1 AND window>=?2 "
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
    l.first_sample = st.Int(9);
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

}  // namespace latchkey
