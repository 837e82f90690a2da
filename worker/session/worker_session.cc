#include "worker/session/worker_session.h"

#include <grpcpp/client_context.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "latchkey/v1/worker_service.grpc.pb.h"
#include "proto/channel.h"
#include "proto/grpc_status.h"
#include "proto/wire.h"

namespace latchkey {
namespace {

std::string DefaultWorkerId() {
  static std::atomic<int> counter{0};
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  return absl::StrCat(host, ":", getpid(), ":", counter++);
}

// Closing a session ends its calls with ABORTED: distinct from a cancelled job (CANCELLED).
absl::Status SessionClosed() { return absl::AbortedError("session closed"); }

// The stream may also break with these when the coordinator dies mid-call.
bool StreamRetryable(int code) {
  return IsRetryable(code) || code == grpc::StatusCode::CANCELLED ||
         code == grpc::StatusCode::UNKNOWN || code == grpc::StatusCode::INTERNAL;
}

}  // namespace

struct WorkerSession::Impl {
  WorkerSessionOptions opt;
  JoinInfo info;
  std::unique_ptr<v1::WorkerService::Stub> stub;

  absl::Mutex mu;
  absl::CondVar cv;
  std::map<int64_t, ReceivedLatch> latches ABSL_GUARDED_BY(mu);
  int64_t next_window ABSL_GUARDED_BY(mu) = 0;
  std::optional<JobEnd> end ABSL_GUARDED_BY(mu);
  absl::Status stream_error ABSL_GUARDED_BY(mu);
  bool closed ABSL_GUARDED_BY(mu) = false;
  bool started ABSL_GUARDED_BY(mu) = false;
  grpc::ClientContext* stream_ctx ABSL_GUARDED_BY(mu) = nullptr;
  std::thread reader;
  std::thread heart;

  v1::WorkerIdentity Identity() const {
    v1::WorkerIdentity id;
    id.set_job_id(opt.job_id);
    id.set_join_token(opt.join_token);
    id.set_worker_id(opt.worker_id);
    return id;
  }

  // Sleeps up to `d`; false if the session was closed meanwhile.
  bool Sleep(absl::Duration d) {
    absl::MutexLock lock(&mu);
    const absl::Time until = absl::Now() + d;
    while (!closed && absl::Now() < until) cv.WaitWithDeadline(&mu, until);
    return !closed;
  }

  void SetEnd(v1::JobState wire_state, const std::string& reason) {
    const std::optional<JobState> state = FromProto(wire_state);
    if (!state || !IsTerminal(*state)) return;  // not an end
    absl::MutexLock lock(&mu);
    if (!end) end = JobEnd{*state, reason};
    cv.SignalAll();
  }

  // Unary call with a deadline per attempt, retried with backoff while retryable.
  absl::Status Retry(const std::function<grpc::Status(grpc::ClientContext*)>& call) {
    absl::Duration backoff = opt.retry_initial;
    const absl::Time start = absl::Now();
    while (true) {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + opt.rpc_timeout));
      grpc::Status st = call(&ctx);
      if (st.ok()) return absl::OkStatus();
      if (!IsRetryable(st.error_code()) || absl::Now() - start > opt.reconnect_timeout) {
        return FromGrpcStatus(st);
      }
      if (!Sleep(backoff)) return SessionClosed();
      backoff = std::min(backoff * 2, opt.retry_max);
    }
  }

  void ReadLoop() {
    absl::Duration backoff = opt.retry_initial;
    absl::Time unreachable_since = absl::InfiniteFuture();
    while (true) {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + opt.stream_deadline));
      v1::WatchLatchesRequest req;
      *req.mutable_identity() = Identity();
      req.set_rank(info.rank);
      {
        absl::MutexLock lock(&mu);
        if (closed) return;
        req.set_start_window(next_window);
        stream_ctx = &ctx;
      }
      const absl::Time opened = absl::Now();
      auto stream = stub->WatchLatches(&ctx, req);
      v1::WatchLatchesResponse m;
      while (stream->Read(&m)) {
        unreachable_since = absl::InfiniteFuture();
        backoff = opt.retry_initial;
        if (m.has_latch()) {
          ReceivedLatch r{FromProto(m.latch()), FromProtoTime(m.latch().publish_time()),
                          absl::Now()};
          absl::MutexLock lock(&mu);
          if (r.latch.window == next_window) {
            latches.emplace(r.latch.window, std::move(r));
            next_window++;
            cv.SignalAll();
          }
        } else if (m.has_job_ended()) {
          SetEnd(m.job_ended().state(), m.job_ended().reason());
        }
      }
      grpc::Status st = stream->Finish();
      {
        absl::MutexLock lock(&mu);
        stream_ctx = nullptr;
        if (closed || end) return;
      }
      if (st.ok()) continue;
      if (!StreamRetryable(st.error_code())) {
        absl::MutexLock lock(&mu);
        stream_error = FromGrpcStatus(st);
        cv.SignalAll();
        return;
      }
      const absl::Time now = absl::Now();
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
      if (!Sleep(backoff)) return;
      backoff = std::min(backoff * 2, opt.retry_max);
    }
  }

  void HeartbeatLoop() {
    const absl::Duration period = std::max(absl::Milliseconds(50), info.heartbeat_interval);
    while (Sleep(period)) {
      v1::HeartbeatRequest req;
      *req.mutable_identity() = Identity();
      req.set_rank(info.rank);
      v1::HeartbeatResponse resp;
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + opt.rpc_timeout));
      if (stub->Heartbeat(&ctx, req, &resp).ok()) SetEnd(resp.state(), resp.reason());
    }
  }
};

WorkerSession::WorkerSession(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

WorkerSession::~WorkerSession() { Close(); }

absl::StatusOr<std::unique_ptr<WorkerSession>> WorkerSession::Join(WorkerSessionOptions options) {
  auto impl = std::make_unique<Impl>();
  if (options.worker_id.empty()) options.worker_id = DefaultWorkerId();
  impl->opt = std::move(options);
  impl->stub = v1::WorkerService::NewStub(MakeCoordinatorChannel(impl->opt.coordinator));
  const WorkerSessionOptions& opt = impl->opt;

  v1::JoinRequest req;
  *req.mutable_identity() = impl->Identity();
  if (opt.requested_rank) req.mutable_requested_rank()->set_value(*opt.requested_rank);
  req.set_advertise_host(opt.advertise_host);
  v1::JoinResponse resp;
  const absl::Time start = absl::Now();
  while (true) {
    absl::Status s =
        impl->Retry([&](grpc::ClientContext* ctx) { return impl->stub->Join(ctx, req, &resp); });
    if (!s.ok()) return s;
    // The host is unknown only while rank 0 has not joined (and the submitter named none).
    if (!resp.rendezvous().host().empty() || absl::Now() - start > opt.rendezvous_wait) break;
    if (!impl->Sleep(opt.retry_max)) return SessionClosed();
  }
  impl->info = FromProto(resp);
  std::unique_ptr<WorkerSession> session(new WorkerSession(std::move(impl)));
  Impl* raw = session->impl_.get();
  if (raw->opt.heartbeat) raw->heart = std::thread([raw] { raw->HeartbeatLoop(); });
  return session;
}

const JoinInfo& WorkerSession::info() const { return impl_->info; }
const std::string& WorkerSession::job_id() const { return impl_->opt.job_id; }

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
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&im.mu);
  if (!im.started) return absl::FailedPreconditionError("StartLatches() not called");
  while (true) {
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
    if (im.closed) return SessionClosed();
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("latch(", window, ") not published within ", absl::FormatDuration(timeout)));
    }
    im.cv.WaitWithDeadline(&im.mu, deadline);
  }
}

absl::Status WorkerSession::ReportStep(const StepMetrics& m) {
  v1::ReportStepRequest req = ToProto(m);
  *req.mutable_identity() = impl_->Identity();
  req.set_rank(impl_->info.rank);
  v1::ReportStepResponse resp;
  absl::Status s = impl_->Retry(
      [&](grpc::ClientContext* ctx) { return impl_->stub->ReportStep(ctx, req, &resp); });
  if (s.ok()) impl_->SetEnd(resp.state(), "");
  return s;
}

absl::Status WorkerSession::ReportFailure(const std::string& message) {
  v1::ReportFailureRequest req;
  *req.mutable_identity() = impl_->Identity();
  req.set_rank(impl_->info.rank);
  req.set_message(message);
  v1::ReportFailureResponse resp;
  return impl_->Retry(
      [&](grpc::ClientContext* ctx) { return impl_->stub->ReportFailure(ctx, req, &resp); });
}

absl::Status WorkerSession::Heartbeat() {
  v1::HeartbeatRequest req;
  *req.mutable_identity() = impl_->Identity();
  req.set_rank(impl_->info.rank);
  v1::HeartbeatResponse resp;
  absl::Status s = impl_->Retry(
      [&](grpc::ClientContext* ctx) { return impl_->stub->Heartbeat(ctx, req, &resp); });
  if (s.ok()) impl_->SetEnd(resp.state(), resp.reason());
  return s;
}

std::optional<JobEnd> WorkerSession::job_end() const {
  absl::MutexLock lock(&impl_->mu);
  return impl_->end;
}

void WorkerSession::Close() {
  {
    absl::MutexLock lock(&impl_->mu);
    impl_->closed = true;
    if (impl_->stream_ctx) impl_->stream_ctx->TryCancel();
    impl_->cv.SignalAll();
  }
  if (impl_->reader.joinable()) impl_->reader.join();
  if (impl_->heart.joinable()) impl_->heart.join();
}

}  // namespace latchkey
