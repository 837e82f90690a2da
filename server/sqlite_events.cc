// SqliteStore: the append-only job_events (recoveries, stalls, determinism violations,
// checkpoints), alone or in one transaction with the job's record.
#include <sqlite3.h>

#include <string>
#include <utility>
#include <vector>

#include "common/status_macros.h"
#include "server/sqlite_stmt.h"
#include "server/sqlite_store.h"

namespace latchkey {
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
