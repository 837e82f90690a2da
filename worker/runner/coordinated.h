// Coordinator mode: the rank joins a job at the coordinator (WorkerSession), forms its groups
// through the rendezvous the coordinator hands out, and runs the one runner loop (run_rank.h)
// over the coordinator's latch stream (CoordinatorLatchSource): every window exactly as the
// published latch says, every step reported, stopping on cancel or job failure; a failure of
// its own is reported, and the coordinator fails the job with that reason.
#ifndef LATCHKEY_WORKER_RUNNER_COORDINATED_H_
#define LATCHKEY_WORKER_RUNNER_COORDINATED_H_

#include <chrono>
#include <string>

#include "absl/status/status.h"
#include "common/channel_credentials.h"
#include "common/timeouts.h"
#include "worker/runner/env.h"
#include "worker/runner/run_rank.h"

namespace latchkey {

struct CoordinatedOptions {
  std::string coordinator = kDefaultCoordinatorAddress;  // --coordinator / LATCHKEY_COORDINATOR
  std::string job_id;                                    // --job / LATCHKEY_JOB_ID
  std::string join_token;            // LATCHKEY_JOIN_TOKEN / --join-token-file (/ --join-token)
  ChannelCredentials credentials{};  // --tls-ca, --tls-cert, --tls-key (LATCHKEY_TLS_*)
  int requested_rank = -1;           // RANK when set; -1 = any free rank
  std::string advertise_host;        // --advertise-host
  RunOptions run;
  std::chrono::milliseconds collective_timeout{kDefaultCollectiveTimeout};
  // --join-timeout: how long the join waits for a coordinator that does not answer.
  std::chrono::milliseconds join_timeout{kDefaultJoinTimeout};
};

absl::Status RunCoordinated(const CoordinatedOptions& options, const WorkerEnv& env);

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_RUNNER_COORDINATED_H_
