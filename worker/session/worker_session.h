// WorkerSession: a rank's connection to the coordinator (WorkerService), in plain C++ types.
// The worker engine (and the simulated workers of tests and benchmarks) use it to join a job,
// receive window latches in order, report steps and stay alive.
//
//   auto session = WorkerSession::Join(options);          // rank, world, spec, rendezvous
//   session->StartLatches(first_window);
//   for (s = first_window; s < steps; ++s) {
//     auto latch = session->AwaitLatch(s, timeout);       // run window s exactly as it says
//     ... train ...
//     session->ReportStep(metrics);
//   }
//
// Resilience: the latch stream reopens by itself when the coordinator goes away (restart,
// network), from the first window not yet received, with exponential backoff; unary calls
// retry the same way (ReportStep is idempotent per step). After `reconnect_timeout` without
// the coordinator, calls fail UNAVAILABLE. A background thread heartbeats at the interval the
// coordinator asked for.
//
// Thread-safety: all methods are thread-safe. Close() (or the destructor) stops the threads.
#ifndef LATCHKEY_WORKER_SESSION_WORKER_SESSION_H_
#define LATCHKEY_WORKER_SESSION_WORKER_SESSION_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/join_info.h"
#include "common/latch.h"
#include "common/states.h"
#include "common/step_report.h"
#include "common/timeouts.h"

namespace latchkey {

struct WorkerSessionOptions {
  std::string coordinator = kDefaultCoordinatorAddress;
  std::string job_id;
  std::string join_token;
  std::string worker_id;  // stable for the process, e.g. "host:pid"; a rejoin presents it again
  std::optional<int> requested_rank;
  std::string advertise_host;  // empty: the address the coordinator sees
  absl::Duration rpc_timeout = absl::FromChrono(kDefaultRpcTimeout);
  absl::Duration retry_initial = absl::Milliseconds(100);
  absl::Duration retry_max = absl::Seconds(2);
  absl::Duration reconnect_timeout = absl::FromChrono(kDefaultReconnectTimeout);
  // Each WatchLatches call ends after this and is reopened transparently (a bounded deadline).
  absl::Duration stream_deadline = absl::Hours(1);
  // Join waits (re-joining) until the rendezvous host is known, at most this long.
  absl::Duration rendezvous_wait = absl::Minutes(10);
  bool heartbeat = true;
};

struct ReceivedLatch {
  Latch latch;
  absl::Time publish_time;  // coordinator's clock
  absl::Time receive_time;  // this process's clock
};

// The per-step report a rank sends (common/step_report.h).
using StepMetrics = StepReport;

// How the job ended, as the coordinator said. `state` is terminal (IsTerminal).
struct JobEnd {
  JobState state = JobState::kFailed;
  std::string reason;
};

class WorkerSession {
 public:
  // Joins (retrying while the coordinator is unreachable). Errors: UNAUTHENTICATED (token),
  // NOT_FOUND (job), ABORTED (rank conflict / job full), FAILED_PRECONDITION (job ended).
  // info() (common/join_info.h) is what the coordinator answered.
  static absl::StatusOr<std::unique_ptr<WorkerSession>> Join(WorkerSessionOptions options);
  ~WorkerSession();
  WorkerSession(const WorkerSession&) = delete;
  WorkerSession& operator=(const WorkerSession&) = delete;

  const JoinInfo& info() const;
  const std::string& job_id() const;

  // Opens the latch stream from `start_window` (once; later calls are ignored).
  void StartLatches(int64_t start_window = 0);
  // latch(window), waiting up to `timeout`. Errors: DEADLINE_EXCEEDED (not yet), CANCELLED
  // (the job was cancelled), FAILED_PRECONDITION (the job failed, or ended before this window),
  // ABORTED (this session was closed: Close() ran; a new session may join again),
  // OUT_OF_RANGE (the window was consumed already), UNAVAILABLE (coordinator gone past
  // reconnect_timeout), or the stream's own error.
  absl::StatusOr<ReceivedLatch> AwaitLatch(int64_t window, absl::Duration timeout);
  // Unary calls retry while the coordinator is unreachable; ABORTED once the session is closed.
  absl::Status ReportStep(const StepMetrics& metrics);
  absl::Status ReportFailure(const std::string& message);
  absl::Status Heartbeat();
  // Set once the coordinator said the job ended (stream or heartbeat).
  std::optional<JobEnd> job_end() const;
  void Close();

 private:
  struct Impl;
  explicit WorkerSession(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_SESSION_WORKER_SESSION_H_
