#include "worker/runner/coordinated.h"

#include <unistd.h>

#include "worker/session/coordinator_latch_source.h"
#include "worker/session/worker_session.h"

namespace latchkey {

absl::Status RunCoordinated(const CoordinatedOptions& options, const WorkerEnv& env) {
  WorkerSessionOptions so;
  so.coordinator = options.coordinator;
  so.job_id = options.job_id;
  so.join_token = options.join_token;
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  so.worker_id = std::string(host) + ":" + std::to_string(getpid());
  if (options.requested_rank >= 0) so.requested_rank = options.requested_rank;
  so.advertise_host = options.advertise_host;
  auto session_or = WorkerSession::Join(so);
  if (!session_or.ok()) {
    return absl::Status(session_or.status().code(), "join " + options.job_id + " at " +
                                                        options.coordinator + ": " +
                                                        std::string(session_or.status().message()));
  }
  WorkerSession& session = **session_or;
  const JoinInfo& info = session.info();
  comm::RendezvousConfig rdv;
  rdv.local_address = env.transport_host;
  rdv.collective_timeout = options.collective_timeout;
  CoordinatorLatchSource source(&session, rdv);

  RankJob job;
  auto spec = ParseJobSpec(info.spec_json, info.base_dir);
  if (!spec.ok()) return source.Recover(spec.status()).status();
  job.spec = *std::move(spec);
  job.local_ranks = env.local_world_size.value_or(info.world_size);
  return RunRank(job, source, options.run);
}

}  // namespace latchkey
