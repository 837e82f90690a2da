// The unary calls of a WorkerSession (worker_session.h, session_impl.h) and their retry: Join,
// ReportStep, ReportCheckpoint, ReportFailure; and the outbox (report_outbox.h) that holds the
// step and checkpoint reports the coordinator cannot take now, re-sent in order by its sender
// thread while training goes on.
//
// Thread contract:
//   DoJoin, Retry, Deliver, ReportStep, ReportCheckpoint, ReportFailure
//               run on the training thread (Join, Rejoin, the reports). Retry also on the
//               heartbeat thread (HeartbeatOnce of Heartbeat()) and the outbox's sender (Report).
//   Report      runs on the outbox's sender thread for a queued report.
//   None holds `mu` across a call: they read info under `mu` (Identity, Rank, the fence) and
//   record the answer under `mu` (SetEnd, NoteAttempt, NoteRefusal). Retry sleeps through
//   Sleep (woken by Close). said_retrying and answered are atomics shared with the other
//   threads; the outbox has its own lock.
#include <algorithm>
#include <iostream>
#include <string>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "common/error_info.h"
#include "proto/channel.h"
#include "proto/grpc_status.h"
#include "proto/wire.h"
#include "worker/session/call_retry.h"
#include "worker/session/session_impl.h"

namespace latchkey {

// The answer to a report: whether the job ended, or (a refusal) whether it fenced the attempt.
template <typename Response>
absl::Status WorkerSession::Impl::Answered(absl::Status s, const Response& resp, int64_t attempt) {
  if (s.ok()) {
    SetEnd(FromProto(resp).state, "");
  } else {
    NoteRefusal(s, /*always=*/false, attempt);
  }
  return s;
}

// A report of this join's attempt (ReportStep, ReportCheckpoint), retried while unreachable.
template <typename Request, typename Response>
absl::Status WorkerSession::Impl::Report(const Request& req, Rpc<Request, Response> method) {
  Response resp;
  absl::Status s = Retry(
      [&](grpc::ClientContext* ctx) { return (ReportStub<Request>()->*method)(ctx, req, &resp); });
  return Answered(std::move(s), resp, req.identity().attempt());
}

// A report the training thread makes: sent at once, or queued in the outbox (re-sent as Report
// does) when the coordinator is unreachable or earlier reports are queued. OK when delivered or
// queued; a queued report's failure is the answer of the next one.
template <typename Request, typename Response>
absl::Status WorkerSession::Impl::Deliver(const Request& req, Rpc<Request, Response> method) {
  const auto queue = [this, req, method] {
    return outbox.Enqueue([this, req, method] { return Report(req, method); });
  };
  if (absl::Status e = outbox.error(); !e.ok()) return e;
  if (outbox.pending() > 0) return queue();
  Response resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(GrpcDeadline(opt.rpc_timeout));
  const grpc::Status st = (ReportStub<Request>()->*method)(&ctx, req, &resp);
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

absl::Status WorkerSession::Impl::Retry(
    const std::function<grpc::Status(grpc::ClientContext*)>& call) {
  return Retry(call, opt.reconnect_timeout, /*joining=*/false);
}

absl::Status WorkerSession::Impl::Retry(
    const std::function<grpc::Status(grpc::ClientContext*)>& call, absl::Duration limit,
    bool joining) {
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
absl::StatusOr<JoinInfo> WorkerSession::Impl::DoJoin(absl::Duration limit) {
  WorkerIdentity who = Identity();
  who.attempt = 0;  // Join names no attempt
  const v1::JoinRequest req = MakeJoinRequest(who, opt.requested_rank, opt.advertise_host,
                                              prober ? prober->port() : 0, opt.node);
  v1::JoinResponse resp;
  const absl::Time start = clock->Now();
  bool said_spare = false;
  std::string said_held;  // the holder this join said it waits for
  while (true) {
    ClockProbe probe;  // each try is timed: the last one's round trip bounds the clock sample
    absl::Status s = Retry(
        [&](grpc::ClientContext* ctx) {
          probe.Start();
          return stub->Join(ctx, req, &resp);
        },
        limit, /*joining=*/true);
    if (s.ok()) probe.Finish(resp.coordinator_unix_micros(), opt.clock_sample);
    if (HasErrorReason(s, error_reason::kRankHeld) && clock->Now() - start < limit) {
      // A replacement of a process that died (or was preempted) while the job still counts its
      // holder: the rank is freed when the holder leaves, is fenced or misses its liveness
      // deadline, so it waits and asks again, saying for whom.
      const std::string holder = GetErrorInfo(s)->metadata["holder"];
      if (holder != said_held) {
        said_held = holder;
        std::cerr << "latchkey-worker: " << s.message()
                  << "; waiting for it to leave or miss its liveness deadline (up to "
                  << absl::FormatDuration(limit) << ")" << std::endl;
      }
      if (!Sleep(std::max(opt.retry_max, absl::Milliseconds(500)))) return SessionClosedError();
      continue;
    }
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

}  // namespace latchkey
