// Coordinator mode: the rank joins a job at the coordinator, forms its Gloo groups through the
// rendezvous the coordinator hands out, runs every window exactly as the published latch says
// (latches are prefetched by the session's stream, so a window only waits when the coordinator
// is behind), reports every step, and stops on cancel or job failure. A failure of its own (a
// missing file, a latch it cannot execute, a collective timeout) is reported to the coordinator,
// which fails the job with that reason.
#ifndef LATCHKEY_WORKER_RUNNER_COORDINATED_H_
#define LATCHKEY_WORKER_RUNNER_COORDINATED_H_

#include <string>

#include "absl/status/status.h"
#include "worker/runner/rank_outputs.h"
#include "worker/train/engine.h"

namespace latchkey {

struct CoordinatedOptions {
  std::string coordinator = "localhost:50051";  // --coordinator / LATCHKEY_COORDINATOR
  std::string job_id;                           // --job / LATCHKEY_JOB_ID
  std::string join_token;                       // --join-token / LATCHKEY_JOIN_TOKEN
  int requested_rank = -1;                      // RANK when set; -1 = any free rank
  std::string advertise_host;                   // --advertise-host
  std::string save_dir;
  OutputOptions outputs;
  EngineOptions engine;
  int collective_timeout_seconds = 120;
};

absl::Status RunCoordinated(const CoordinatedOptions& options);

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_RUNNER_COORDINATED_H_
