// SqliteStore: the append-only latches and policy changes (triggers refuse UPDATE and DELETE),
// each appended in one transaction with the job's latch position or current policy; the
// attempts (each one's layout), with the job, its event and a new layout's policy change.
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
      "reason, publish_us, layout_attempt, first_sample, replica_micro_batches) VALUES "
      "(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12)";
  static constexpr const char* kMove =
      "UPDATE jobs SET next_window=?2, next_first_micro_batch=?3, next_first_sample=?4 "
      "WHERE job_id=?1";
  LK_ASSIGN_STMT(ins, kInsert);
  LK_ASSIGN_STMT(mv, kMove);
  return InTransaction([&]() -> absl::Status {
    for (const PublishedLatch& p : latches) {
      const Latch& l = p.latch;
      ins.Bind(1, job_id).Bind(2, l.window).Bind(3, l.generation).Bind(4, l.first_micro_batch);
      ins.Bind(5, l.n).Bind(6, std::string(KvModeName(l.kv_mode))).Bind(7, NoSyncText(l.no_sync));
      ins.Bind(8, l.reason).Bind(9, Us(p.publish_time)).Bind(10, p.layout_attempt);
      ins.Bind(11, l.first_sample).Bind(12, SplitText(l.replica_micro_batches));
      LK_RETURN_IF_ERROR(ins.Run());
    }
    mv.Bind(1, job_id).Bind(2, next_window).Bind(3, next_first_micro_batch);
    mv.Bind(4, next_first_sample);
    return mv.Run();
  });
}

absl::Status SqliteStore::PolicyChangeRows(const PolicyChangeRecord& c) {
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
  ins.Bind(1, c.job_id).Bind(2, c.policy.generation).Bind(3, kv);
  ins.Bind(4, c.policy.gradient_accumulation_steps).Bind(5, c.first_window);
  ins.Bind(6, Us(c.change_time)).Bind(7, mask);
  LK_RETURN_IF_ERROR(ins.Run());
  job.Bind(1, c.job_id).Bind(2, kv).Bind(3, c.policy.gradient_accumulation_steps);
  job.Bind(4, c.policy.generation).Bind(5, Us(c.change_time)).Bind(6, mask);
  return job.Run();
}

absl::Status SqliteStore::AppendPolicyChange(const PolicyChangeRecord& c) {
  return InTransaction([&] { return PolicyChangeRows(c); });
}

// The attempt, the job, the event and (a new layout) its policy change and the latch position
// moved back, all or nothing: a coordinator killed between them would otherwise resume a new
// layout with the old latches, or the other way round.
absl::Status SqliteStore::BeginAttempt(const JobRecord& job, const AttemptRecord& a,
                                       const PolicyChangeRecord* layout_change,
                                       const JobEventRecord& event) {
  static constexpr const char* kInsert =
      "INSERT OR REPLACE INTO attempts (job_id, attempt, world_size, tp, dp, gas, resume_step, "
      "cause, layout_attempt, start_us) VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10)";
  static constexpr const char* kMove =
      "UPDATE jobs SET next_window=?2, next_first_micro_batch=?3, next_first_sample=?4 "
      "WHERE job_id=?1";
  LK_ASSIGN_STMT(ins, kInsert);
  LK_ASSIGN_STMT(mv, kMove);
  return InTransaction([&]() -> absl::Status {
    LK_RETURN_IF_ERROR(UpdateJob(job));
    ins.Bind(1, a.job_id).Bind(2, a.attempt).Bind(3, a.world_size).Bind(4, a.tp).Bind(5, a.dp);
    ins.Bind(6, a.gradient_accumulation_steps).Bind(7, a.resume_step).Bind(8, a.cause);
    ins.Bind(9, a.layout_attempt).Bind(10, Us(a.start_time));
    LK_RETURN_IF_ERROR(ins.Run());
    if (layout_change != nullptr) {
      LK_RETURN_IF_ERROR(PolicyChangeRows(*layout_change));
      mv.Bind(1, job.job_id).Bind(2, job.next_window).Bind(3, job.next_first_micro_batch);
      mv.Bind(4, job.next_first_sample);
      LK_RETURN_IF_ERROR(mv.Run());
    }
    return AppendEvent(event);
  });
}

absl::StatusOr<std::vector<AttemptRecord>> SqliteStore::LoadAttempts(const std::string& job_id) {
  LK_ASSIGN_STMT(st,
                 "SELECT job_id, attempt, world_size, tp, dp, gas, resume_step, cause, "
                 "layout_attempt, start_us FROM attempts WHERE job_id=?1 ORDER BY attempt");
  st.Bind(1, job_id);
  std::vector<AttemptRecord> out;
  while (true) {
    LK_ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) break;
    AttemptRecord a;
    a.job_id = st.Text(0);
    a.attempt = st.Int(1);
    a.world_size = static_cast<int>(st.Int(2));
    a.tp = static_cast<int>(st.Int(3));
    a.dp = static_cast<int>(st.Int(4));
    a.gradient_accumulation_steps = static_cast<int>(st.Int(5));
    a.resume_step = st.Int(6);
    a.cause = st.Text(7);
    a.layout_attempt = st.Int(8);
    a.start_time = FromUs(st.Int(9));
    if (a.tp < 1 || a.dp < 1 || a.world_size != a.tp * a.dp || a.gradient_accumulation_steps < 1 ||
        a.layout_attempt < 1 || a.layout_attempt > a.attempt) {
      st.Reset();
      return Corrupt(absl::StrCat("attempt ", a.attempt, " of job ", a.job_id),
                     absl::StrCat("world ", a.world_size, " = tp ", a.tp, " x dp ", a.dp, ", gas ",
                                  a.gradient_accumulation_steps, ", layout of attempt ",
                                  a.layout_attempt, " is not a layout"));
    }
    out.push_back(std::move(a));
  }
  st.Reset();
  return out;
}

absl::StatusOr<std::vector<PublishedLatch>> SqliteStore::LoadLatches(const std::string& job_id,
                                                                     int64_t start_window,
                                                                     int64_t limit) {
  // Per window the row of the newest layout: a layout re-decides every window from its first
  // one on, so the newest row of a window is the latch that counts.
  LK_ASSIGN_STMT(
      st,
      "SELECT job_id, window, generation, first_micro_batch, n, kv_mode, no_sync, "
      "reason, publish_us, layout_attempt, first_sample, replica_micro_batches FROM latches l "
      "WHERE job_id=?1 AND "
      "window>=?2 AND layout_attempt=(SELECT MAX(layout_attempt) FROM latches m "
      "WHERE m.job_id=l.job_id AND m.window=l.window) ORDER BY window LIMIT ?3");
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
    p.layout_attempt = st.Int(9);
    l.first_sample = st.Int(10);
    LK_ASSIGN_OR_RETURN(l.replica_micro_batches, SplitFromText(where, st.Text(11)));
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
