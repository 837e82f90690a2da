// The latch stream of a WorkerSession (worker_session.h, session_impl.h): the reader thread that
// keeps WatchLatches open, and the training thread's end of it.
//
// Thread contract:
//   ReadLoop    runs on the reader thread (`reader`), started by StartLatches and joined by
//               StopReader (Rejoin) or Close. Under `mu` it reads info, closed, stream_stop,
//               end; writes latches, next_window, stream_ctx, stream_error (and, through
//               SetEnd / NoteRefusal, end and the fence), signalling `cv` on each. The stream's
//               own reads and Finish run without `mu`; Close and StopReader cancel it through
//               stream_ctx under `mu`.
//   StartLatches, AwaitLatch, StopReader
//               run on the training thread. AwaitLatch waits on `cv` under `mu` and consumes
//               latches; StartLatches and StopReader start and join the reader.
#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/error_info.h"
#include "proto/channel.h"
#include "proto/grpc_status.h"
#include "proto/wire.h"
#include "worker/session/session_impl.h"

namespace latchkey {
namespace {

// The stream may also break with these when the coordinator dies mid-call.
bool StreamRetryable(int code) {
  return IsRetryable(code) || code == grpc::StatusCode::CANCELLED ||
         code == grpc::StatusCode::UNKNOWN || code == grpc::StatusCode::INTERNAL;
}

}  // namespace

void WorkerSession::Impl::ReadLoop() {
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
      } else if (m.has_stop()) {
        absl::MutexLock lock(&mu);
        stop_before = m.stop().before_window();
        cv.SignalAll();
      }
    }
    grpc::Status st = stream->Finish();
    {
      absl::MutexLock lock(&mu);
      stream_ctx = nullptr;
      if (closed || end || stream_stop || stop_before >= 0) return;
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
void WorkerSession::Impl::StopReader() {
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
  stop_before = -1;
  stop_heard = false;
  stream_error = absl::OkStatus();
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
    if (im.stop_before >= 0 && window >= im.stop_before) {
      return AttemptStoppedError(im.stop_before);
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

}  // namespace latchkey
