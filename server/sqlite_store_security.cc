// Schema v4 -> v5 (docs/protocol.md "Security"): the submitter of each job, and join tokens
// replaced by their SHA-256 so the file holds no secret a worker could present.
#include <string>
#include <utility>
#include <vector>

#include "common/status_macros.h"
#include "server/security.h"
#include "server/sqlite_stmt.h"
#include "server/sqlite_store.h"

namespace latchkey {

absl::Status SqliteStore::MigrateV4ToV5() {
  LK_RETURN_IF_ERROR(Exec("ALTER TABLE jobs ADD COLUMN submitter TEXT NOT NULL DEFAULT ''"));
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

}  // namespace latchkey
