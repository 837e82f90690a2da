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
// retry the same way (ReportStep is idempotent per step). Step and checkpoint reports do not
// hold training up during an outage: one the coordinator cannot take is queued and re-sent in
// order by a sender thread, with the same backoff, and ReportStep returns at once (training goes
// on through the latches already published); Close() first delivers what is queued. After
// `reconnect_timeout` without the coordinator, calls fail UNAVAILABLE. A background thread
// heartbeats at the interval the coordinator asked for, carrying the rank's position
// (options.position).
//
// Attempts (docs/fault-tolerance.md): every call carries the attempt of the current join. The
// session is fenced once the coordinator moved on to a newer attempt (a heartbeat said so, or a
// call or the latch stream was refused ABORTED with an ATTEMPT_FENCED detail, common/error_info.h):
// AwaitLatch and ReportStep then fail at once with that same error (ABORTED, ATTEMPT_FENCED,
// metadata job_attempt and worker_attempt), and Rejoin() joins the job's current attempt with the
// same worker id. Decisions are made on codes and details only, never on message text. Watchdog:
// when the session is fenced and the training thread has not begun its recovery (BeginRecovery)
// within options.stuck_exit_after, the heartbeat thread prints one line and exits the process with
// kExitRestartMe (it is stuck in a collective with a stopped peer; its supervisor restarts it).
//
// Time: the watchdog, the backoffs, the heartbeat period and every deadline the session measures
// read options.clock (common/clock.h), so tests move a ManualClock instead of sleeping; only the
// gRPC deadline of each call is real time.
//
// Thread-safety: all methods are thread-safe. Close() (or the destructor) stops the threads.
#ifndef LATCHKEY_WORKER_SESSION_WORKER_SESSION_H_
#define LATCHKEY_WORKER_SESSION_WORKER_SESSION_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/channel_credentials.h"
#include "common/clock.h"
#include "common/join_info.h"
#include "common/latch.h"
#include "common/rank_position.h"
#include "common/states.h"
#include "common/step_report.h"
#include "common/timeouts.h"
#include "common/worker_protocol.h"

namespace latchkey {

// The exit code of a worker that gave up on an attempt it cannot leave (stuck in a collective
// of a fenced attempt): its supervisor (`latchkey up`, a pod's restart policy) restarts it.
inline constexpr int kExitRestartMe = 75;

struct WorkerSessionOptions {
  std::string coordinator = kDefaultCoordinatorAddress;
  std::string job_id;
  std::string join_token;
  // TLS to the coordinator (common/channel_credentials.h); the join token travels in each request.
  ChannelCredentials credentials{};
  // Stable for the process, e.g. ProcessWorkerId() ("host:pid"); a rejoin presents it again.
  // Empty: ProcessWorkerId() and a count.
  std::string worker_id;
  std::optional<int> requested_rank;
  std::string advertise_host;  // empty: the address the coordinator sees
  std::string node;            // the node it runs on (a node agent's identity); empty: its host
  // Its node agent's relay (client/node_relay.h): Heartbeat and ReportStep go there, batched
  // with the node's other ranks'. Empty: every call goes to the coordinator.
  std::string node_relay;
  absl::Duration rpc_timeout = absl::FromChrono(kDefaultRpcTimeout);
  absl::Duration retry_initial = absl::Milliseconds(100);
  absl::Duration retry_max = absl::Seconds(2);
  absl::Duration reconnect_timeout = absl::FromChrono(kDefaultReconnectTimeout);
  // How long Join waits for a coordinator that does not answer (nothing listening, unreachable)
  // before it fails with the last error (latchkey-worker --join-timeout).
  absl::Duration join_timeout = absl::FromChrono(kDefaultJoinTimeout);
  // While Join (or Rejoin) waits for the coordinator, a line on stderr this often: the address,
  // the time waited so far and the last error.
  absl::Duration waiting_line_every = absl::Seconds(5);
  // Each WatchLatches call ends after this and is reopened transparently (a bounded deadline).
  absl::Duration stream_deadline = absl::Hours(1);
  // Join waits (re-joining) until the rendezvous host is known, at most this long.
  absl::Duration rendezvous_wait = absl::Minutes(10);
  bool heartbeat = true;
  // Heartbeat period; zero: the interval the coordinator said at Join.
  absl::Duration heartbeat_interval = absl::ZeroDuration();
  // Where the rank is (sent with every heartbeat); null: no position.
  std::function<RankPosition()> position;
  // Called with each measurement of the coordinator's clock (Join and every heartbeat answer):
  // the coordinator's Unix time in microseconds minus this process's steady clock at the call's
  // midpoint, and its uncertainty (half the round trip). Null: not measured.
  std::function<void(int64_t offset_micros, int64_t error_micros)> clock_sample;
  // The rank's spans of steps first..last (-1: no bound) as JSON lines, at most `max_bytes`
  // (the newest spans): the answer to a trace request (docs/observability.md "Traces"). Null:
  // the rank answers none.
  std::function<std::string(int64_t first_step, int64_t last_step, size_t max_bytes)> trace;
  // Watchdog: once fenced, if the training thread has not called BeginRecovery() (or Rejoin())
  // within this long, print one line to stderr and _exit(kExitRestartMe). Infinite: never.
  absl::Duration stuck_exit_after = absl::InfiniteDuration();
  // Partition detection (docs/fault-tolerance.md "Partitions"; peer_prober.h): listen on a probe
  // port at `probe_host` ("": every address), sent with Join, and probe the peers while the
  // attempt forms and while a collective of the rank lasts `probe_after`.
  bool probe_peers = true;
  std::string probe_host;
  absl::Duration probe_after = absl::Seconds(2);
  // The time the session measures its waits on; null: RealClock(). Not owned; must outlive the
  // session.
  const Clock* clock = nullptr;
  // The process's stop signal (worker/runner/stop_signal.h): non-zero once SIGTERM or SIGINT
  // came (its number). The heartbeat thread then tells the coordinator the rank leaves (Leave)
  // and, past stop_grace, ends the process with kExitPreempted whatever the training thread
  // is doing. Null: none. Not owned.
  const std::atomic<int>* stop_signal = nullptr;
  absl::Duration stop_grace = absl::Seconds(25);
};

struct ReceivedLatch {
  Latch latch;
  absl::Time publish_time;  // coordinator's clock
  absl::Time receive_time;  // the session's clock (options.clock)
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
  // Joins (retrying while the coordinator is unreachable, for up to join_timeout, saying so on
  // stderr every waiting_line_every). Errors: UNAUTHENTICATED (token), NOT_FOUND (job), ABORTED
  // (rank conflict / job full), FAILED_PRECONDITION (job ended), the last error (UNAVAILABLE,
  // DEADLINE_EXCEEDED) when the coordinator did not answer within join_timeout.
  // info() (common/join_info.h) is what the coordinator answered.
  static absl::StatusOr<std::unique_ptr<WorkerSession>> Join(WorkerSessionOptions options);
  ~WorkerSession();
  WorkerSession(const WorkerSession&) = delete;
  WorkerSession& operator=(const WorkerSession&) = delete;

  // The current join's answer; replaced by Rejoin() (call both from the training thread).
  const JoinInfo& info() const;
  const std::string& job_id() const;
  // The attempt of the current join (info().attempt).
  int64_t attempt() const;
  // The newest attempt of the job the coordinator mentioned (Join, heartbeats, ReportFailure);
  // at least attempt() + 1 once the session is fenced.
  int64_t job_attempt() const;
  // True once the coordinator moved past this session's attempt (until Rejoin()).
  bool fenced() const;
  // Whether the process got its stop signal (options.stop_signal): it leaves after the stop's
  // save instead of joining the next attempt.
  bool stop_signalled() const;
  // The job's state as the coordinator last said it (heartbeats, joins).
  JobState job_state() const;
  // The spec's latchkey.preemption.grace_seconds, once known (options.stop_grace until then).
  void SetStopGrace(absl::Duration grace);

  // Opens the latch stream from `start_window` (once per join; later calls are ignored).
  void StartLatches(int64_t start_window = 0);
  // latch(window), waiting up to `timeout`. Errors: DEADLINE_EXCEEDED (not yet), CANCELLED
  // (the job was cancelled), FAILED_PRECONDITION (the job failed, or ended before this window;
  // or, with reason SESSION_CLOSED, this session was closed: Close() ran), ABORTED with reason
  // ATTEMPT_FENCED (fenced: the job moved to a newer attempt),
  // OUT_OF_RANGE (the window was consumed already), UNAVAILABLE (coordinator gone past
  // reconnect_timeout), or the stream's own error.
  absl::StatusOr<ReceivedLatch> AwaitLatch(int64_t window, absl::Duration timeout);
  // Unary calls retry while the coordinator is unreachable; FAILED_PRECONDITION (SESSION_CLOSED)
  // once the session is closed while they wait; ReportStep fails ABORTED (ATTEMPT_FENCED) at once
  // once the session is fenced. ReportStep and ReportCheckpoint queue a report the coordinator
  // cannot take now (see Resilience) and return OK; a queued report that is later refused (or
  // undeliverable past reconnect_timeout) is the error of the next report and of Flush().
  absl::Status ReportStep(const StepMetrics& metrics);
  // `permanent`: a configuration error no restart can fix; the job fails at once. `reason`: the
  // error's ErrorInfo reason (common/error_info.h), "" when it has none; TRAINING_DIVERGED also
  // fails the job at once, marked as a diverged training.
  absl::Status ReportFailure(const std::string& message, bool permanent = false,
                             const std::string& reason = "");
  // A checkpoint after `step` was committed (rank 0 reports it). Idempotent.
  absl::Status ReportCheckpoint(int64_t step, const std::string& manifest_sha256, int64_t bytes,
                                double blocked_seconds);
  absl::Status Heartbeat();
  // The training thread left the fenced attempt and is recovering: disarms the watchdog.
  void BeginRecovery();
  // Joins again with the same worker id, for the job's current attempt, waiting (up to
  // options.rendezvous_wait) while the rendezvous host is empty. Stops the latch stream: call
  // StartLatches again for the new attempt's first window. On success info() is the new answer
  // and the session is no longer fenced. Errors as Join.
  absl::Status Rejoin();
  // Set once the coordinator said the job ended (stream or heartbeat).
  std::optional<JobEnd> job_end() const;
  // Waits up to `timeout` (real time) for the queued reports to be delivered: OK, the refusal of
  // one, or UNAVAILABLE naming how many are still queued. OK at once when nothing is queued.
  absl::Status Flush(absl::Duration timeout);
  // Delivers what is queued (up to reconnect_timeout), then stops the threads.
  void Close();

 private:
  struct Impl;
  explicit WorkerSession(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_SESSION_WORKER_SESSION_H_
