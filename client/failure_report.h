// A supervisor's report that one of a job's worker processes died (WorkerService.ReportFailure
// on the worker's behalf), so the coordinator recovers at once instead of waiting for the
// liveness deadline. `latchkey up` uses it; any other supervisor can.
//
//   auto r = ReportWorkerFailure(options, {.job_id = job, .join_token = token,
//                                          .worker_id = "host:4242", .rank = 1,
//                                          .message = "process exited: killed by signal 9"});
//
// The identity's attempt is 0: "whatever attempt this worker is in" (a dead process cannot
// say). Thread-safe: every call opens its own channel.
#ifndef LATCHKEY_CLIENT_FAILURE_REPORT_H_
#define LATCHKEY_CLIENT_FAILURE_REPORT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "client/job_client.h"
#include "common/states.h"
#include "common/worker_protocol.h"  // WorkerIdOf: the id a worker process joined as

namespace latchkey {

struct WorkerFailure {
  std::string job_id;
  std::string join_token;
  std::string worker_id;  // what the worker joined as: "<hostname>:<pid>"
  int rank = 0;
  std::string message;  // one line, e.g. "process exited: killed by signal 9"
  // A failure no restart fixes (the job fails at once), and its ErrorInfo reason
  // (common/error_info.h; e.g. TRAINING_DIVERGED for a worker that exited
  // kExitTrainingDiverged); "" for none.
  bool permanent = false;
  std::string reason;
};

struct WorkerFailureResult {
  JobState state = JobState::kRunning;  // the job after the report
  int64_t attempt = 0;                  // its attempt after the report
};

// The coordinator's errors as they are (ABORTED: the worker was already fenced, NOT_FOUND:
// it never joined, FAILED_PRECONDITION: the job has ended).
absl::StatusOr<WorkerFailureResult> ReportWorkerFailure(const ClientOptions& options,
                                                        const WorkerFailure& failure);

}  // namespace latchkey

#endif  // LATCHKEY_CLIENT_FAILURE_REPORT_H_
