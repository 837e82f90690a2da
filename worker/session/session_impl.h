// The inside of a WorkerSession (worker_session.h): the state its threads share, and the
// members each thread runs, defined one file per thread. Internal to worker/session/ (it
// includes gRPC; the public header does not).
//
//   worker_session.cc  construction, lifetime (Join, Rejoin, Close) and the public API's glue;
//                      the helpers below that any thread calls (Identity, Sleep, SetEnd,
//                      the fencing notes)
//   latch_reader.cc    the reader thread (ReadLoop: the WatchLatches stream) and the training
//                      thread's end of it (StartLatches, AwaitLatch, StopReader)
//   heartbeat.cc       the heartbeat thread (HeartbeatLoop, CheckStuck: the stuck-rank
//                      watchdog) and the one heartbeat every thread may send (HeartbeatOnce)
//   unary_calls.cc     the unary calls and their retry (Retry, DoJoin, ReportStep,
//                      ReportCheckpoint, ReportFailure), and the outbox (report_outbox.h) whose
//                      sender thread re-sends the reports the coordinator could not take
//
// Threads: the training thread (the caller of the public methods), the reader (`reader`, while
// the latch stream is open), the heartbeat thread (`heart`, options.heartbeat) and the outbox's
// sender. Locking: one mutex `mu` guards every field marked ABSL_GUARDED_BY(mu); `cv` is
// signalled on each change a waiter may care about (a latch, the end, the fence, closing). No
// gRPC call is made under `mu`. `opt`, `clock` and `stub` are set before any thread starts and
// read-only after; `reader` and `heart` are started and joined by the training thread only.
#ifndef LATCHKEY_WORKER_SESSION_SESSION_IMPL_H_
#define LATCHKEY_WORKER_SESSION_SESSION_IMPL_H_

#include <grpcpp/client_context.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/worker_protocol.h"
#include "latchkey/v1/worker_service.grpc.pb.h"
#include "worker/session/peer_prober.h"
#include "worker/session/report_outbox.h"
#include "worker/session/worker_session.h"

namespace latchkey {

// gRPC measures its deadlines on the real clock, whatever the session's Clock says.
inline std::chrono::system_clock::time_point GrpcDeadline(absl::Duration d) {
  return absl::ToChronoTime(absl::Now() + d);
}

template <typename Request, typename Response>  // a unary WorkerService call of the stub
using Rpc = grpc::Status (v1::WorkerService::Stub::*)(grpc::ClientContext*, const Request&,
                                                      Response*);

// Times one call that answers with the coordinator's clock (coordinator_unix_micros): the sample
// is that clock minus the steady clock at the call's midpoint, within half the round trip.
class ClockProbe {
 public:
  void Start() { start_ = std::chrono::steady_clock::now(); }
  void Finish(int64_t coordinator_unix_micros,
              const std::function<void(int64_t, int64_t)>& sample) const {
    if (coordinator_unix_micros == 0 || !sample) return;  // an older coordinator
    const auto end = std::chrono::steady_clock::now();
    auto micros = [](std::chrono::steady_clock::time_point t) {
      return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
    };
    const int64_t mid = (micros(start_) + micros(end)) / 2;
    sample(coordinator_unix_micros - mid, (micros(end) - micros(start_) + 1) / 2);
  }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

struct WorkerSession::Impl {
  WorkerSessionOptions opt;
  const Clock* clock = RealClock();  // opt.clock, or the real one
  std::unique_ptr<v1::WorkerService::Stub> stub;
  // opt.node_relay's: the calls it relays (Heartbeat, ReportStep) go there; null: to `stub`.
  std::unique_ptr<v1::WorkerService::Stub> relay_stub;
  v1::WorkerService::Stub* HeartbeatStub() { return relay_stub ? relay_stub.get() : stub.get(); }
  template <typename Request>
  v1::WorkerService::Stub* ReportStub() {
    if constexpr (std::is_same_v<Request, v1::ReportStepRequest>) {
      if (relay_stub) return relay_stub.get();
    }
    return stub.get();
  }

  absl::Mutex mu;
  absl::CondVar cv;
  // Written under mu by Join/Rejoin (the training thread); the threads read it under mu.
  JoinInfo info ABSL_GUARDED_BY(mu);
  std::map<int64_t, ReceivedLatch> latches ABSL_GUARDED_BY(mu);
  int64_t next_window ABSL_GUARDED_BY(mu) = 0;
  std::optional<JobEnd> end ABSL_GUARDED_BY(mu);
  absl::Status stream_error ABSL_GUARDED_BY(mu);
  bool closed ABSL_GUARDED_BY(mu) = false;
  std::atomic<bool> said_retrying{false};  // the first retried call was reported on stderr
  std::atomic<bool> answered{false};       // some call reached the coordinator
  bool started ABSL_GUARDED_BY(mu) = false;
  bool stream_stop ABSL_GUARDED_BY(mu) = false;  // Rejoin ends the stream of the old join
  grpc::ClientContext* stream_ctx ABSL_GUARDED_BY(mu) = nullptr;
  // Attempts: the newest the coordinator mentioned, whether this join's attempt is over (and
  // since when), and whether the training thread began its recovery.
  int64_t job_attempt ABSL_GUARDED_BY(mu) = 0;
  bool fenced ABSL_GUARDED_BY(mu) = false;
  absl::Time fenced_since ABSL_GUARDED_BY(mu);
  bool recovering ABSL_GUARDED_BY(mu) = false;
  // A stop of this join's attempt (docs/fault-tolerance.md "Preemption"): the window the latch
  // stream said it stops before (-1: none), and whether a heartbeat said one is under way.
  int64_t stop_before ABSL_GUARDED_BY(mu) = -1;
  bool stop_heard ABSL_GUARDED_BY(mu) = false;
  // The process's stop signal as the heartbeat thread saw it: when it came, and whether the
  // coordinator has been told (Leave).
  absl::Time signalled_at = absl::InfiniteFuture();
  std::atomic<int64_t> stop_grace_ms{25000};  // opt.stop_grace, then SetStopGrace's
  bool left_sent = false;
  int64_t trace_answered = 0;  // the newest trace request answered (heartbeat thread only)
  std::thread reader;
  std::thread heart;
  // Watches opt.stop_signal (CheckStopSignal every 100 ms) apart from the heartbeats, which a
  // coordinator that does not answer can hold for an RPC's timeout.
  std::thread stopper;
  // Partition detection (peer_prober.h): null when opt.probe_peers is off or it could not
  // listen. `job_state` is the job's state as the coordinator last said it; the heartbeat
  // thread asks for the peer list while the prober's version is not `peers_version`.
  std::unique_ptr<PeerProber> prober;
  JobState job_state ABSL_GUARDED_BY(mu) = JobState::kPending;
  int64_t peers_version ABSL_GUARDED_BY(mu) = 0;
  // The bytes the rank's peer connections moved at the last look, and when they last moved,
  // in the position they were measured in (heartbeat thread; under quiet_mu).
  absl::Mutex quiet_mu;
  std::string quiet_key ABSL_GUARDED_BY(quiet_mu);
  uint64_t quiet_bytes ABSL_GUARDED_BY(quiet_mu) = 0;
  absl::Time quiet_since ABSL_GUARDED_BY(quiet_mu);
  // Reports the coordinator could not take when made, and those queued behind them (Deliver).
  ReportOutbox outbox;

  // --- Any thread (worker_session.cc). Each takes mu itself; the *Locked ones need it held.
  WorkerIdentity Identity();
  int Rank();
  // Sleeps up to `d`; false if the session was closed (or, with `stream`, the stream stopped).
  bool Sleep(absl::Duration d, bool stream = false);
  void SetEnd(JobState state, const std::string& reason);
  void FenceLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The coordinator said the job is at `attempt`.
  void NoteAttempt(int64_t attempt);
  // A call of this join's attempt was refused. The coordinator fences with ABORTED and an
  // ATTEMPT_FENCED detail (job_attempt: the job's current attempt). A heartbeat or the latch
  // stream (`always`) is refused ABORTED only for that; a report also for a stale latch
  // generation, so it fences only with the detail. `sent`: the attempt the call named (a call
  // of an earlier join, in flight across a Rejoin, says nothing about the current one).
  void NoteRefusal(const absl::Status& st, bool always, int64_t sent);
  int64_t JobAttemptLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu);
  // The coordinator's refusal, said locally: ABORTED with the same ATTEMPT_FENCED detail.
  absl::Status FencedErrorLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu);
  // The training thread adopts a join's answer (Join, Rejoin): no longer fenced.
  void Adopt(JoinInfo joined);

  // --- The latch stream (latch_reader.cc).
  // The reader thread's body: keeps the stream open from next_window, reopening with backoff.
  void ReadLoop();
  // Training thread: ends the latch stream of the current join and forgets its latches.
  void StopReader();

  // --- Heartbeats and the watchdog (heartbeat.cc).
  // One heartbeat (no retry when `retry` is false); learns the job's state and attempt. Returns
  // the last call's status (retried: the last try's, even when the session closed meanwhile).
  // Answers the coordinator's trace request (HeartbeatResponse.trace_request_id) once: the
  // rank's spans (options.trace) through PutTrace, straight to the coordinator.
  void AnswerTrace(const TraceAsk& ask);
  absl::Status HeartbeatOnce(bool retry);
  // Heartbeat thread: exits the process when fenced and not recovering past stuck_exit_after.
  void CheckStuck();
  // Stopper thread: once the process got a stop signal, tells the coordinator (Leave, once)
  // and ends the process with kExitPreempted past the grace, or at once when the coordinator
  // does not answer the leave.
  void CheckStopSignal();
  // One Leave call (a second's deadline); true when the coordinator took it.
  bool SendLeave(int signal);
  // Heartbeat thread: probes while the attempt forms or a collective lasts probe_after; true
  // when a new probe round is ready to go out.
  bool SteerProber(const RankPosition* position);
  // Sets position->quiet_seconds from the peer connections' bytes (a collective past
  // probe_after only).
  void MeasureQuiet(RankPosition* position);
  // The heartbeat thread's body.
  void HeartbeatLoop();

  // --- Unary calls (unary_calls.cc); training thread, or the outbox's sender (Report).
  // Unary call with a deadline per attempt, retried with backoff while retryable, for up to
  // reconnect_timeout.
  absl::Status Retry(const std::function<grpc::Status(grpc::ClientContext*)>& call);
  // As above for up to `limit` (call_retry.h); `joining`: a Join, whose wait is said every
  // waiting_line_every.
  absl::Status Retry(const std::function<grpc::Status(grpc::ClientContext*)>& call,
                     absl::Duration limit, bool joining);
  // Join (retrying while unreachable, for up to `limit`, and while the rendezvous host is
  // unknown).
  absl::StatusOr<JoinInfo> DoJoin(absl::Duration limit);
  // The answer to a report: whether the job ended, or (a refusal) whether it fenced the attempt.
  template <typename Response>
  absl::Status Answered(absl::Status s, const Response& resp, int64_t attempt);
  // A report of this join's attempt (ReportStep, ReportCheckpoint), retried while unreachable.
  template <typename Request, typename Response>
  absl::Status Report(const Request& req, Rpc<Request, Response> method);
  // A report the training thread makes: sent at once, or queued in the outbox (re-sent as
  // Report does) when the coordinator is unreachable or earlier reports are queued. OK when
  // delivered or queued; a queued report's failure is the answer of the next one.
  template <typename Request, typename Response>
  absl::Status Deliver(const Request& req, Rpc<Request, Response> method);
};

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_SESSION_SESSION_IMPL_H_
