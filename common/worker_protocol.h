// The plain values of WorkerService's calls that no other header owns (the messages themselves:
// proto/wire.h): who calls (WorkerIdentity, with the worker id a process joins as) and what the
// coordinator answers a rank's report or heartbeat with (WorkerReply).
//
// Thread-safety: plain values and pure functions.
#ifndef LATCHKEY_COMMON_WORKER_PROTOCOL_H_
#define LATCHKEY_COMMON_WORKER_PROTOCOL_H_

#include <unistd.h>

#include <cstdint>
#include <string>

#include "common/reachability.h"
#include "common/states.h"

namespace latchkey {

// The exit code of a latchkey-worker whose training diverged (a non-finite loss or gradient norm,
// common/error_info.h TRAINING_DIVERGED): the job failed with it; a supervisor does not restart
// the process (a re-run diverges the same way). Documented in docs/fault-tolerance.md.
inline constexpr int kExitTrainingDiverged = 3;
// The exit code of a worker that left on a stop signal (SIGTERM, SIGINT) after its attempt
// saved, or whose grace ran out first: "preempted, replace me". Its supervisor replaces it
// without counting a failure (the manifests' podFailurePolicy: Ignore).
inline constexpr int kExitPreempted = 76;

// Who a worker call comes from (latchkey.v1.WorkerIdentity).
struct WorkerIdentity {
  std::string job_id;
  std::string join_token;
  std::string worker_id;
  // The attempt of the worker's current join. 0 in Join; in ReportFailure, "whatever attempt
  // this worker is in".
  int64_t attempt = 0;
};

// The coordinator's answer to ReportStep, Heartbeat, ReportFailure and ReportCheckpoint; each
// response carries the fields it documents (docs/protocol.md).
// Heartbeat: an open trace request (JobService.GetTrace) that the rank answers with its spans of
// steps first_step..last_step (-1: no bound) through PutTrace. id 0: none.
struct TraceAsk {
  int64_t id = 0;
  int64_t first_step = 0;
  int64_t last_step = -1;
};
// The largest answer (PutTrace's JSON lines): under the coordinator's default request bound
// (--max-message-mib 1). A rank with more spans in the asked steps sends the newest that fit.
inline constexpr size_t kMaxTraceUploadBytes = 960 * 1024;

struct WorkerReply {
  JobState state = JobState::kPending;  // the job after the call
  std::string reason;                   // Heartbeat: why the job ended, once it has
  bool duplicate = false;               // ReportStep: the step was reported already
  int64_t attempt = 0;                  // Heartbeat, ReportFailure: the job's current attempt
  // Heartbeat: the job's peer list version, and its peers when asked for (common/reachability.h).
  PeerList peers;
  bool stop = false;  // Heartbeat, Leave: the attempt is stopping (save and leave)
  TraceAsk trace{};   // Heartbeat
};

// "<hostname>:<pid>": the worker id a latchkey-worker process joins with, and the id its
// supervisor names it by when it reports the process dead.
inline std::string WorkerIdOf(int pid) {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  return std::string(host) + ":" + std::to_string(pid);
}

// WorkerIdOf this process.
inline std::string ProcessWorkerId() { return WorkerIdOf(static_cast<int>(getpid())); }

}  // namespace latchkey

#endif  // LATCHKEY_COMMON_WORKER_PROTOCOL_H_
