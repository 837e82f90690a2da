// WorkerSession (worker_session.h): construction, lifetime and the public API's glue, and the
// helpers of the shared state that every thread of the session calls. The threads' own code
// lives one file per thread (session_impl.h lists them): latch_reader.cc, heartbeat.cc,
// unary_calls.cc.
//
// Thread contract: Join, Rejoin, Close and the accessors run on the training thread (the
// accessors and Flush are safe from any thread). Join starts the heartbeat thread; Rejoin stops
// the reader (StopReader) and drops the outbox; Close delivers the outbox, sets `closed` under
// `mu` (cancelling the stream), then joins the reader and the heartbeat thread and closes the
// outbox. The helpers below take `mu` themselves (the *Locked ones need it held) and are called
// from every thread; none makes a call to the coordinator.
#include "worker/session/worker_session.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <algorithm>
#include <atomic>
#include <iostream>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/error_info.h"
#include "common/worker_protocol.h"
#include "proto/channel.h"
#include "proto/wire.h"
#include "worker/session/session_impl.h"

namespace latchkey {
namespace {

// The process's worker id, and a count: two sessions of one process are two workers.
std::string DefaultWorkerId() {
  static std::atomic<int> counter{0};
  return absl::StrCat(ProcessWorkerId(), ":", counter++);
}

}  // namespace

WorkerIdentity WorkerSession::Impl::Identity() {
  absl::MutexLock lock(&mu);
  return WorkerIdentity{opt.job_id, opt.join_token, opt.worker_id, info.attempt};
}

int WorkerSession::Impl::Rank() {
  absl::MutexLock lock(&mu);
  return info.rank;
}

// Sleeps up to `d`; false if the session was closed (or, with `stream`, the stream stopped).
bool WorkerSession::Impl::Sleep(absl::Duration d, bool stream) {
  absl::MutexLock lock(&mu);
  const absl::Time until = clock->Now() + d;
  while (!closed && !(stream && stream_stop) && clock->Now() < until) {
    WaitUntil(cv, mu, *clock, until);
  }
  return !closed && !(stream && stream_stop);
}

void WorkerSession::Impl::SetEnd(JobState state, const std::string& reason) {
  if (!IsTerminal(state)) return;  // not an end
  absl::MutexLock lock(&mu);
  if (!end) end = JobEnd{state, reason};
  cv.SignalAll();
}

void WorkerSession::Impl::FenceLocked() {
  if (fenced) return;
  fenced = true;
  fenced_since = clock->Now();
  cv.SignalAll();
}

void WorkerSession::Impl::NoteAttempt(int64_t attempt) {
  absl::MutexLock lock(&mu);
  job_attempt = std::max(job_attempt, attempt);
  if (attempt > info.attempt) FenceLocked();
}

// Fences only on this join's attempt, and (a report: `always` false) only with the detail.
void WorkerSession::Impl::NoteRefusal(const absl::Status& st, bool always, int64_t sent) {
  if (st.code() != absl::StatusCode::kAborted) return;
  const bool fence = HasErrorReason(st, error_reason::kAttemptFenced);
  if (!always && !fence) return;
  int64_t theirs = 0;
  if (fence) theirs = GetErrorInfo(st)->IntMetadata("job_attempt").value_or(0);
  absl::MutexLock lock(&mu);
  job_attempt = std::max(job_attempt, theirs);
  if (sent == info.attempt) FenceLocked();
}

int64_t WorkerSession::Impl::JobAttemptLocked() const {
  return std::max(job_attempt, fenced ? info.attempt + 1 : info.attempt);
}

absl::Status WorkerSession::Impl::FencedErrorLocked() const {
  const int64_t theirs = JobAttemptLocked();
  return AttemptFencedError(absl::StrCat("attempt ", info.attempt, " of job ", opt.job_id,
                                         " was fenced: the job is at attempt ", theirs),
                            theirs, info.attempt);
}

void WorkerSession::Impl::Adopt(JoinInfo joined) {
  absl::MutexLock lock(&mu);
  info = std::move(joined);
  job_state = info.state;
  job_attempt = std::max(job_attempt, info.attempt);
  fenced = false;
  recovering = false;
}

WorkerSession::WorkerSession(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

WorkerSession::~WorkerSession() { Close(); }

absl::StatusOr<std::unique_ptr<WorkerSession>> WorkerSession::Join(WorkerSessionOptions options) {
  auto impl = std::make_unique<Impl>();
  if (options.worker_id.empty()) options.worker_id = DefaultWorkerId();
  impl->opt = std::move(options);
  impl->stop_grace_ms = absl::ToInt64Milliseconds(impl->opt.stop_grace);
  if (impl->opt.clock) impl->clock = impl->opt.clock;
  auto channel = MakeCoordinatorChannel(impl->opt.coordinator, impl->opt.credentials);
  if (!channel.ok()) return channel.status();
  impl->stub = v1::WorkerService::NewStub(*channel);
  if (!impl->opt.node_relay.empty()) {
    impl->relay_stub = v1::WorkerService::NewStub(
        grpc::CreateChannel(impl->opt.node_relay, grpc::InsecureChannelCredentials()));
  }
  if (impl->opt.probe_peers) {
    PeerProberOptions po;
    po.host = impl->opt.probe_host;
    auto prober = PeerProber::Start(po);
    if (prober.ok()) {
      impl->prober = *std::move(prober);
    } else {  // the job then forms its attempts without this rank's probes
      std::cerr << "latchkey-worker: no probe port (" << prober.status().message()
                << "): partitions are not told from stalls for this rank" << std::endl;
    }
  }
  auto joined = impl->DoJoin(impl->opt.join_timeout);
  if (!joined.ok()) return joined.status();
  impl->Adopt(*std::move(joined));
  std::unique_ptr<WorkerSession> session(new WorkerSession(std::move(impl)));
  Impl* raw = session->impl_.get();
  if (raw->opt.heartbeat) raw->heart = std::thread([raw] { raw->HeartbeatLoop(); });
  if (raw->opt.stop_signal != nullptr) {
    raw->stopper = std::thread([raw] {
      while (raw->Sleep(absl::Milliseconds(100))) raw->CheckStopSignal();
    });
  }
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

JobState WorkerSession::job_state() const {
  absl::MutexLock lock(&impl_->mu);
  return impl_->job_state;
}

bool WorkerSession::stop_signalled() const {
  return impl_->opt.stop_signal != nullptr && impl_->opt.stop_signal->load() != 0;
}

void WorkerSession::SetStopGrace(absl::Duration grace) {
  impl_->stop_grace_ms = absl::ToInt64Milliseconds(grace);
}

bool WorkerSession::fenced() const {
  absl::MutexLock lock(&impl_->mu);
  return impl_->fenced;
}

absl::Status WorkerSession::Rejoin() {
  {
    absl::MutexLock lock(&impl_->mu);
    if (impl_->closed) return SessionClosedError();
    // The training thread is back to recover: the stuck watchdog leaves it be while it joins
    // (a join waits for the attempt's rank 0 and may outlast stuck_exit_after).
    impl_->recovering = true;
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
  // Bounded apart from the reconnect timeout: an exiting worker waits for its coordinator at most
  // as long as a first Join does.
  (void)Flush(std::min(impl_->opt.reconnect_timeout, absl::FromChrono(kDefaultJoinTimeout)) +
              impl_->opt.rpc_timeout);
  {
    absl::MutexLock lock(&impl_->mu);
    impl_->closed = true;
    if (impl_->stream_ctx) impl_->stream_ctx->TryCancel();
    impl_->cv.SignalAll();
  }
  if (impl_->reader.joinable()) impl_->reader.join();
  if (impl_->heart.joinable()) impl_->heart.join();
  if (impl_->stopper.joinable()) impl_->stopper.join();
  impl_->outbox.Close();
}

}  // namespace latchkey
