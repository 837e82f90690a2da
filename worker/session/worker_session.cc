#include "worker/session/worker_session.h"

#include <grpcpp/client_context.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <functional>
#include <iostream>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/error_info.h"
#include "common/worker_protocol.h"
#include "latchkey/v1/worker_service.grpc.pb.h"
#include "proto/channel.h"
#include "proto/grpc_status.h"
#include "proto/wire.h"
#include "worker/session/call_retry.h"
#include "worker/session/report_outbox.h"

namespace latchkey {
namespace {

// The process's worker id, and a count: two sessions of one process are two workers.
std::string DefaultWorkerId() {
  static std::atomic<int> counter{0};
  return absl::StrCat(ProcessWorkerId(), ":", counter++);
}

// gRPC measures its deadlines on the real clock, whatever the session's Clock says.
std::chrono::system_clock::time_point GrpcDeadline(absl::Duration d) {
  return absl::ToChronoTime(absl::Now() + d);
}

// The stream may also break with these when the coordinator dies mid-call.
bool StreamRetryable(int code) {
  return IsRetryable(code) || code == grpc::StatusCode::CANCELLED ||
         code == grpc::StatusCode::UNKNOWN || code == grpc::StatusCode::INTERNAL;
}

}  // namespace

template <typename Request, typename Response>  // a unary WorkerService call of the stub
using Rpc = grpc::Status (v1::WorkerService::Stub::*)(grpc::ClientContext*, const Request&,
                                                      Response*);

struct WorkerSession::Impl {
  WorkerSessionOptions opt;
  const Clock* clock = RealClock();  // opt.clock, or the real one
  std::unique_ptr<v1::WorkerService::Stub> stub;

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
  std::thread reader;
  std::thread heart;
  // Reports the coordinator could not take when made, and those queued behind them (Deliver).
  ReportOutbox outbox;

  WorkerIdentity Identity() {
    absl::MutexLock lock(&mu);
    return WorkerIdentity{opt.job_id, opt.join_token, opt.worker_id, info.attempt};
  }
  int Rank() {
    absl::MutexLock lock(&mu);
    return info.rank;
  }

  // Sleeps up to `d`; false if the session was closed (or, with `stream`, the stream stopped).
  bool Sleep(absl::Duration d, bool stream = false) {
    absl::MutexLock lock(&mu);
    const absl::Time until = clock->Now() + d;
    while (!closed && !(stream && stream_stop) && clock->Now() < until) {
      WaitUntil(cv, mu, *clock, until);
    }
    return !closed && !(stream && stream_stop);
  }

  void SetEnd(JobState state, const std::string& reason) {
    if (!IsTerminal(state)) return;  // not an end
    absl::MutexLock lock(&mu);
    if (!end) end = JobEnd{state, reason};
    cv.SignalAll();
  }

  void FenceLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (fenced) return;
    fenced = true;
    fenced_since = clock->Now();
    cv.SignalAll();
  }
  void NoteAttempt(int64_t attempt) {  // the coordinator said the job is at `attempt`
    absl::MutexLock lock(&mu);
    job_attempt = std::max(job_attempt, attempt);
    if (attempt > info.attempt) FenceLocked();
  }
  // A call of this join's attempt was refused. The coordinator fences with ABORTED and an
  // ATTEMPT_FENCED detail (job_attempt: the job's current attempt). A heartbeat or the latch
  // stream (`always`) is refused ABORTED only for that; a report also for a stale latch
  // generation, so it fences only with the detail. `sent`: the attempt the call named (a call
  // of an earlier join, in flight across a Rejoin, says nothing about the current one).
  void NoteRefusal(const absl::Status& st, bool always, int64_t sent) {
    if (st.code() != absl::StatusCode::kAborted) return;
    const bool fence = HasErrorReason(st, error_reason::kAttemptFenced);
    if (!always && !fence) return;
    int64_t theirs = 0;
    if (fence) theirs = GetErrorInfo(st)->IntMetadata("job_attempt").value_or(0);
    absl::MutexLock lock(&mu);
    job_attempt = std::max(job_attempt, theirs);
    if (sent == info.attempt) FenceLocked();
  }
  int64_t JobAttemptLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu) {
    return std::max(job_attempt, fenced ? info.attempt + 1 : info.attempt);
  }
  // The coordinator's refusal, said locally: ABORTED with the same ATTEMPT_FENCED detail.
  absl::Status FencedErrorLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu) {
    const int64_t theirs = JobAttemptLocked();
    return AttemptFencedError(absl::StrCat("attempt ", info.attempt, " of job ", opt.job_id,
                                           " was fenced: the job is at attempt ", theirs),
                              theirs, info.attempt);
  }

  // Unary call with a deadline per attempt, retried with backoff while retryable, for up to
  // reconnect_timeout.
  absl::Status Retry(const std::function<grpc::Status(grpc::ClientContext*)>& call) {
    return Retry(call, opt.reconnect_timeout, /*joining=*/false);
  }
  // As above for up to `limit` (call_retry.h); `joining`: a Join, whose wait is said every
  // waiting_line_every.
  absl::Status Retry(const std::function<grpc::Status(grpc::ClientContext*)>& call,
                     absl::Duration limit, bool joining) {
    CallRetry r;
    r.clock = clock;
    r.coordinator = opt.coordinator;
    r.job_id = opt.job_id;
    r.tls = opt.credentials.tls();
    r.rpc_timeout = opt.rpc_timeout;
    r.initial = opt.retry_initial;
    r.max = opt.retry_max;
    r.limit = limit;
    r.joining = joining;
    r.waiting_line_every = opt.waiting_line_every;
    r.answered = &answered;
    r.said_retrying = &said_retrying;
    r.sleep = [this](absl::Duration d) { return Sleep(d); };
    r.closed = SessionClosedError();
    return RetryCall(r, call);
  }

  // Join (retrying while unreachable, for up to `limit`, and while the rendezvous host is
  // unknown).
  absl::StatusOr<JoinInfo> DoJoin(absl::Duration limit) {
    WorkerIdentity who = Identity();
    who.attempt = 0;  // Join names no attempt
    const v1::JoinRequest req = MakeJoinRequest(who, opt.requested_rank, opt.advertise_host);
    v1::JoinResponse resp;
    const absl::Time start = clock->Now();
    bool said_spare = false;
    while (true) {
      absl::Status s = Retry([&](grpc::ClientContext* ctx) { return stub->Join(ctx, req, &resp); },
                             limit, /*joining=*/true);
      if (!s.ok()) return s;
      if (resp.spare()) {
        // latchkey.elastic: no rank for this worker now. It joins again (the coordinator counts
        // a spare alive while it does) until the job grows into it or ends without it.
        JoinInfo spare = FromProto(resp);
        if (IsTerminal(spare.state)) return spare;
        if (!said_spare) {
          said_spare = true;
          std::cerr << "latchkey-worker: job " << opt.job_id << " has no rank for this worker "
                    << "now (world " << spare.world_size << "): waiting as a spare" << std::endl;
        }
        const absl::Duration poll = spare.heartbeat_interval > absl::ZeroDuration()
                                        ? spare.heartbeat_interval
                                        : opt.retry_max;
        if (!Sleep(poll)) return SessionClosedError();
        continue;
      }
      // The host is unknown only while rank 0 (of the attempt) has not joined (and the
      // submitter named none).
      if (!resp.rendezvous().host().empty() || clock->Now() - start > opt.rendezvous_wait) break;
      if (!Sleep(opt.retry_max)) return SessionClosedError();
    }
    return FromProto(resp);
  }

  void Adopt(JoinInfo joined) {
    absl::MutexLock lock(&mu);
    info = std::move(joined);
    job_attempt = std::max(job_attempt, info.attempt);
    fenced = false;
    recovering = false;
  }

  void ReadLoop() {
    absl::Duration backoff = opt.retry_initial;
    absl::Time unreachable_since = absl::InfiniteFuture();
    while (true) {
      grpc::ClientContext ctx;
      ctx.set_deadline(GrpcDeadline(opt.stream_deadline));
      const WorkerIdentity who = Identity();
      const int rank = Rank();
      v1::WatchLatchesRequest req;
      {
        absl::MutexLock lock(&mu);
        if (closed || stream_stop) return;
        req = MakeWatchLatchesRequest(who, rank, next_window);
        stream_ctx = &ctx;
      }
      const absl::Time opened = clock->Now();
      auto stream = stub->WatchLatches(&ctx, req);
      v1::WatchLatchesResponse m;
      while (stream->Read(&m)) {
        unreachable_since = absl::InfiniteFuture();
        backoff = opt.retry_initial;
        if (m.has_latch()) {
          ReceivedLatch r{FromProto(m.latch()), FromProtoTime(m.latch().publish_time()),
                          clock->Now()};
          absl::MutexLock lock(&mu);
          if (r.latch.window == next_window) {
            latches.emplace(r.latch.window, std::move(r));
            next_window++;
            cv.SignalAll();
          }
        } else if (m.has_job_ended()) {
          SetEnd(FromProto(m.job_ended().state()).value_or(JobState::kPending),
                 m.job_ended().reason());
        }
      }
      grpc::Status st = stream->Finish();
      {
        absl::MutexLock lock(&mu);
        stream_ctx = nullptr;
        if (closed || end || stream_stop) return;
      }
      if (st.ok()) continue;
      if (!StreamRetryable(st.error_code())) {
        absl::Status error = FromGrpcStatus(st);
        NoteRefusal(error, /*always=*/true, who.attempt);
        absl::MutexLock lock(&mu);
        stream_error = std::move(error);
        cv.SignalAll();
        return;
      }
      const absl::Time now = clock->Now();
      // A stream that stayed up a while was healthy; count unreachability from this failure.
      if (now - opened > opt.retry_max) unreachable_since = absl::InfiniteFuture();
      if (unreachable_since == absl::InfiniteFuture()) unreachable_since = now;
      if (now - unreachable_since > opt.reconnect_timeout) {
        absl::MutexLock lock(&mu);
        stream_error = absl::UnavailableError(
            absl::StrCat("coordinator ", opt.coordinator, " unreachable for ",
                         absl::FormatDuration(now - unreachable_since), ": ", st.error_message()));
        cv.SignalAll();
        return;
      }
      if (!Sleep(backoff, /*stream=*/true)) return;
      backoff = std::min(backoff * 2, opt.retry_max);
    }
  }

  // Ends the latch stream of the current join and forgets its latches.
  void StopReader() {
    {
      absl::MutexLock lock(&mu);
      stream_stop = true;
      if (stream_ctx) stream_ctx->TryCancel();
      cv.SignalAll();
    }
    if (reader.joinable()) reader.join();
    absl::MutexLock lock(&mu);
    stream_stop = false;
    started = false;
    latches.clear();
    next_window = 0;
    stream_error = absl::OkStatus();
  }

  // One heartbeat (no retry when `retry` is false); learns the job's state and attempt. Returns
  // the last call's status (retried: the last try's, even when the session closed meanwhile).
  absl::Status HeartbeatOnce(bool retry) {
    const WorkerIdentity who = Identity();
    std::optional<RankPosition> position;
    if (opt.position) position = opt.position();
    const v1::HeartbeatRequest req =
        MakeHeartbeatRequest(who, Rank(), position ? &*position : nullptr);
    v1::HeartbeatResponse resp;
    grpc::Status st;
    if (retry) {
      (void)Retry([&](grpc::ClientContext* ctx) {
        st = stub->Heartbeat(ctx, req, &resp);
        return st;
      });
    } else {
      grpc::ClientContext ctx;
      ctx.set_deadline(GrpcDeadline(opt.rpc_timeout));
      st = stub->Heartbeat(&ctx, req, &resp);
    }
    absl::Status s = FromGrpcStatus(st);
    if (s.ok()) {
      const WorkerReply reply = FromProto(resp);
      SetEnd(reply.state, reply.reason);
      NoteAttempt(reply.attempt);
    } else {
      NoteRefusal(s, /*always=*/true, who.attempt);
    }
    return s;
  }

  // The answer to a report: whether the job ended, or (a refusal) whether it fenced the attempt.
  template <typename Response>
  absl::Status Answered(absl::Status s, const Response& resp, int64_t attempt) {
    if (s.ok()) {
      SetEnd(FromProto(resp).state, "");
    } else {
      NoteRefusal(s, /*always=*/false, attempt);
    }
    return s;
  }

  // A report of this join's attempt (ReportStep, ReportCheckpoint), retried while unreachable.
  template <typename Request, typename Response>
  absl::Status Report(const Request& req, Rpc<Request, Response> method) {
    Response resp;
    absl::Status s =
        Retry([&](grpc::ClientContext* ctx) { return (stub.get()->*method)(ctx, req, &resp); });
    return Answered(std::move(s), resp, req.identity().attempt());
  }

  // A report the training thread makes: sent at once, or queued in the outbox (re-sent as Report
  // does) when the coordinator is unreachable or earlier reports are queued. OK when delivered or
  // queued; a queued report's failure is the answer of the next one.
  template <typename Request, typename Response>
  absl::Status Deliver(const Request& req, Rpc<Request, Response> method) {
    const auto queue = [this, req, method] {
      return outbox.Enqueue([this, req, method] { return Report(req, method); });
    };
    if (absl::Status e = outbox.error(); !e.ok()) return e;
    if (outbox.pending() > 0) return queue();
    Response resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(GrpcDeadline(opt.rpc_timeout));
    const grpc::Status st = (stub.get()->*method)(&ctx, req, &resp);
    if (st.ok() || !IsRetryable(st.error_code())) {
      return Answered(FromGrpcStatus(st), resp, req.identity().attempt());
    }
    if (!said_retrying.exchange(true)) {
      std::cerr << "latchkey-worker: coordinator " << opt.coordinator
                << " not answering; training goes on, reports are kept and re-sent for up to "
                << absl::FormatDuration(opt.reconnect_timeout) << ": "
                << FromGrpcStatus(st).ToString() << std::endl;
    }
    return queue();
  }

  // The watchdog: a fenced session whose training thread never came back to recover is stuck
  // where no error reaches it (a collective with a stopped peer).
  void CheckStuck() {
    if (opt.stuck_exit_after == absl::InfiniteDuration()) return;
    int rank = 0;
    int64_t mine = 0;
    int64_t theirs = 0;
    {
      absl::MutexLock lock(&mu);
      if (!fenced || recovering || end || closed) return;
      if (clock->Now() - fenced_since < opt.stuck_exit_after) return;
      rank = info.rank;
      mine = info.attempt;
      theirs = JobAttemptLocked();
    }
    const std::string where = opt.position ? WhereName(opt.position()) : "training";
    std::fprintf(stderr,
                 "latchkey-worker: rank %d stuck in %s of attempt %lld while the job is at "
                 "attempt %lld; exiting for a restart\n",
                 rank, where.c_str(), static_cast<long long>(mine), static_cast<long long>(theirs));
    std::fflush(stderr);
    _exit(kExitRestartMe);
  }

  // Heartbeats every `period`, and also as soon as the rank entered another window or attempt
  // (checked every tick), so the coordinator's last view of a rank that goes silent is fresh.
  void HeartbeatLoop() {
    absl::Duration period = opt.heartbeat_interval;
    if (period <= absl::ZeroDuration()) {
      absl::MutexLock lock(&mu);
      period = info.heartbeat_interval;
    }
    period = std::max(absl::Milliseconds(50), period);
    // The watchdog and the position look more often than the heartbeat goes out.
    const absl::Duration tick = std::min(period, absl::Milliseconds(100));
    absl::Time next = clock->Now() + period;
    int64_t sent_window = -1;
    int64_t sent_attempt = 0;
    while (Sleep(tick)) {
      CheckStuck();
      bool moved = false;
      if (opt.position) {
        const RankPosition p = opt.position();
        moved = p.window != sent_window || p.attempt != sent_attempt;
        sent_window = p.window;
        sent_attempt = p.attempt;
      }
      if (!moved && clock->Now() < next) continue;
      next = clock->Now() + period;
      (void)HeartbeatOnce(/*retry=*/false);
    }
  }
};

WorkerSession::WorkerSession(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

WorkerSession::~WorkerSession() { Close(); }

absl::StatusOr<std::unique_ptr<WorkerSession>> WorkerSession::Join(WorkerSessionOptions options) {
  auto impl = std::make_unique<Impl>();
  if (options.worker_id.empty()) options.worker_id = DefaultWorkerId();
  impl->opt = std::move(options);
  if (impl->opt.clock) impl->clock = impl->opt.clock;
  auto channel = MakeCoordinatorChannel(impl->opt.coordinator, impl->opt.credentials);
  if (!channel.ok()) return channel.status();
  impl->stub = v1::WorkerService::NewStub(*channel);
  auto joined = impl->DoJoin(impl->opt.join_timeout);
  if (!joined.ok()) return joined.status();
  impl->Adopt(*std::move(joined));
  std::unique_ptr<WorkerSession> session(new WorkerSession(std::move(impl)));
  Impl* raw = session->impl_.get();
  if (raw->opt.heartbeat) raw->heart = std::thread([raw] { raw->HeartbeatLoop(); });
  return session;
}

// Only the training thread writes info (Rejoin), so its own reads need no lock.
const JoinInfo& WorkerSession::info() const ABSL_NO_THREAD_SAFETY_ANALYSIS { return impl_->info; }
const std::string& WorkerSession::job_id() const { return impl_->opt.job_id; }

int64_t WorkerSession::attempt() const {
  absl::MutexLock lock(&impl_->mu);
  return impl_->info.attempt;
}

int64_t WorkerSession::job_attempt() const {
  absl::MutexLock lock(&impl_->mu);
  return impl_->JobAttemptLocked();
}

bool WorkerSession::fenced() const {
  absl::MutexLock lock(&impl_->mu);
  return impl_->fenced;
}

void WorkerSession::StartLatches(int64_t start_window) {
  {
    absl::MutexLock lock(&impl_->mu);
    if (impl_->started || impl_->closed) return;
    impl_->started = true;
    impl_->next_window = std::max<int64_t>(0, start_window);
  }
  Impl* raw = impl_.get();
  impl_->reader = std::thread([raw] { raw->ReadLoop(); });
}

absl::StatusOr<ReceivedLatch> WorkerSession::AwaitLatch(int64_t window, absl::Duration timeout) {
  Impl& im = *impl_;
  const absl::Time deadline = im.clock->Now() + timeout;
  absl::MutexLock lock(&im.mu);
  if (!im.started) return absl::FailedPreconditionError("StartLatches() not called");
  while (true) {
    if (im.fenced && !im.end) return im.FencedErrorLocked();
    auto it = im.latches.find(window);
    if (it != im.latches.end()) {
      ReceivedLatch r = it->second;
      im.latches.erase(im.latches.begin(), it);  // the caller has moved on
      return r;
    }
    if (window < im.next_window && (im.latches.empty() || window < im.latches.begin()->first)) {
      return absl::OutOfRangeError(absl::StrCat("latch(", window, ") was already consumed"));
    }
    if (im.end) {
      const std::string msg = absl::StrCat("job ", im.opt.job_id, " ", JobStateName(im.end->state),
                                           im.end->reason.empty() ? "" : ": ", im.end->reason);
      if (im.end->state == JobState::kCancelled) return absl::CancelledError(msg);
      return absl::FailedPreconditionError(msg);
    }
    if (!im.stream_error.ok()) return im.stream_error;
    if (im.closed) return SessionClosedError();
    if (im.clock->Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("latch(", window, ") not published within ", absl::FormatDuration(timeout)));
    }
    WaitUntil(im.cv, im.mu, *im.clock, deadline);
  }
}

absl::Status WorkerSession::ReportStep(const StepMetrics& m) {
  {
    absl::MutexLock lock(&impl_->mu);
    if (impl_->fenced) return impl_->FencedErrorLocked();
  }
  return impl_->Deliver(MakeReportStepRequest(impl_->Identity(), impl_->Rank(), m),
                        &v1::WorkerService::Stub::ReportStep);
}

absl::Status WorkerSession::ReportFailure(const std::string& message, bool permanent,
                                          const std::string& reason) {
  const v1::ReportFailureRequest req =
      MakeReportFailureRequest(impl_->Identity(), impl_->Rank(), message, permanent, reason);
  v1::ReportFailureResponse resp;
  absl::Status s = impl_->Retry(
      [&](grpc::ClientContext* ctx) { return impl_->stub->ReportFailure(ctx, req, &resp); });
  if (s.ok()) impl_->NoteAttempt(FromProto(resp).attempt);
  return s;
}

absl::Status WorkerSession::ReportCheckpoint(int64_t step, const std::string& manifest_sha256,
                                             int64_t bytes, double blocked_seconds) {
  CheckpointReport report;
  report.step = step;
  report.manifest_sha256 = manifest_sha256;
  report.bytes = bytes;
  report.blocked_seconds = blocked_seconds;
  return impl_->Deliver(MakeReportCheckpointRequest(impl_->Identity(), impl_->Rank(), report),
                        &v1::WorkerService::Stub::ReportCheckpoint);
}

absl::Status WorkerSession::Heartbeat() { return impl_->HeartbeatOnce(/*retry=*/true); }

void WorkerSession::BeginRecovery() {
  absl::MutexLock lock(&impl_->mu);
  impl_->recovering = true;
}

absl::Status WorkerSession::Rejoin() {
  {
    absl::MutexLock lock(&impl_->mu);
    if (impl_->closed) return SessionClosedError();
  }
  impl_->StopReader();
  impl_->outbox.Drop();  // what the old attempt queued is moot: the coordinator refuses it
  auto joined = impl_->DoJoin(impl_->opt.reconnect_timeout);
  if (!joined.ok()) return joined.status();
  impl_->Adopt(*std::move(joined));
  return absl::OkStatus();
}

std::optional<JobEnd> WorkerSession::job_end() const {
  absl::MutexLock lock(&impl_->mu);
  return impl_->end;
}

absl::Status WorkerSession::Flush(absl::Duration timeout) {
  if (job_end().has_value()) return absl::OkStatus();  // the coordinator has what it needs
  return impl_->outbox.Flush(timeout);
}

void WorkerSession::Close() {
  // Steps reported during an outage are delivered before the session goes (nothing lost).
  (void)Flush(impl_->opt.reconnect_timeout + impl_->opt.rpc_timeout);
  {
    absl::MutexLock lock(&impl_->mu);
    impl_->closed = true;
    if (impl_->stream_ctx) impl_->stream_ctx->TryCancel();
    impl_->cv.SignalAll();
  }
  if (impl_->reader.joinable()) impl_->reader.join();
  if (impl_->heart.joinable()) impl_->heart.join();
  impl_->outbox.Close();
}

}  // namespace latchkey
