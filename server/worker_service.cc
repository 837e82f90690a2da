#include "server/worker_service.h"

#include <deque>
#include <memory>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "proto/grpc_status.h"
#include "proto/wire.h"

namespace latchkey {
namespace {

// Bounds on caller-chosen strings and maps (the transport bounds the whole message).
constexpr size_t kMaxWorkerIdBytes = 256;
constexpr size_t kMaxHostBytes = 256;
constexpr size_t kMaxFailureBytes = 4096;
constexpr int kMaxCollectiveKeys = 1024;
constexpr int kLatchBatch = 64;

grpc::Status Invalid(const std::string& msg) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, msg);
}

grpc::Status ToCall(const v1::WorkerIdentity& id, int rank, WorkerCall* call) {
  if (id.worker_id().size() > kMaxWorkerIdBytes) {
    return Invalid(absl::StrCat("identity.worker_id: longer than ", kMaxWorkerIdBytes, " bytes"));
  }
  call->job_id = id.job_id();
  call->join_token = id.join_token();
  call->worker_id = id.worker_id();
  call->rank = rank;
  call->attempt = id.attempt();
  return grpc::Status::OK;
}

}  // namespace

std::string WorkerServiceImpl::PeerHost(const std::string& peer) {
  std::string rest;
  if (absl::StartsWith(peer, "ipv4:")) {
    rest = peer.substr(5);
    return rest.substr(0, rest.rfind(':'));
  }
  if (absl::StartsWith(peer, "ipv6:")) {
    rest = peer.substr(5);
    const size_t close = rest.find(']');
    if (!rest.empty() && rest[0] == '[' && close != std::string::npos) {
      return rest.substr(1, close - 1);
    }
    return rest.substr(0, rest.rfind(':'));
  }
  return "";
}

namespace {

grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* ctx, grpc::Status status) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(std::move(status));
  return reactor;
}

bool IsRefusal(const grpc::Status& st) {
  return st.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
         st.error_code() == grpc::StatusCode::PERMISSION_DENIED ||
         st.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
}

}  // namespace

grpc::ServerUnaryReactor* WorkerServiceImpl::Run(grpc::CallbackServerContext* ctx,
                                                 const char* method,
                                                 const std::function<grpc::Status()>& body) {
  auto slot = gate_.Admit(*ctx);
  if (!slot->ok()) return Done(ctx, gate_.Refuse(*ctx, method, gate_.ExhaustedStatus()));
  grpc::Status st = body();
  if (IsRefusal(st)) gate_.Refuse(*ctx, method, st);
  return Done(ctx, std::move(st));
}

grpc::ServerUnaryReactor* WorkerServiceImpl::Join(grpc::CallbackServerContext* ctx,
                                                  const v1::JoinRequest* req,
                                                  v1::JoinResponse* resp) {
  return Run(ctx, "Join", [&] { return DoJoin(ctx->peer(), *req, resp); });
}

grpc::ServerUnaryReactor* WorkerServiceImpl::ReportStep(grpc::CallbackServerContext* ctx,
                                                        const v1::ReportStepRequest* req,
                                                        v1::ReportStepResponse* resp) {
  return Run(ctx, "ReportStep", [&] { return DoReportStep(*req, resp); });
}

grpc::ServerUnaryReactor* WorkerServiceImpl::Heartbeat(grpc::CallbackServerContext* ctx,
                                                       const v1::HeartbeatRequest* req,
                                                       v1::HeartbeatResponse* resp) {
  return Run(ctx, "Heartbeat", [&] { return DoHeartbeat(*req, resp); });
}

grpc::ServerUnaryReactor* WorkerServiceImpl::ReportFailure(grpc::CallbackServerContext* ctx,
                                                           const v1::ReportFailureRequest* req,
                                                           v1::ReportFailureResponse* resp) {
  return Run(ctx, "ReportFailure", [&] { return DoReportFailure(*req, resp); });
}

grpc::ServerUnaryReactor* WorkerServiceImpl::ReportCheckpoint(
    grpc::CallbackServerContext* ctx, const v1::ReportCheckpointRequest* req,
    v1::ReportCheckpointResponse* resp) {
  return Run(ctx, "ReportCheckpoint", [&] { return DoReportCheckpoint(*req, resp); });
}

grpc::Status WorkerServiceImpl::DoJoin(const std::string& peer, const v1::JoinRequest& request,
                                       v1::JoinResponse* resp) {
  const v1::JoinRequest* req = &request;
  JoinArgs args;
  grpc::Status st = ToCall(req->identity(), -1, &args.call);
  if (!st.ok()) return st;
  if (req->advertise_host().size() > kMaxHostBytes) {
    return Invalid(absl::StrCat("advertise_host: longer than ", kMaxHostBytes, " bytes"));
  }
  if (req->has_requested_rank()) args.requested_rank = req->requested_rank().value();
  args.advertise_host = req->advertise_host();
  args.peer_host = PeerHost(peer);
  auto r = core_->Join(args);
  if (!r.ok()) return ToGrpcStatus(r.status());
  *resp = ToProto(*r);
  return grpc::Status::OK;
}

namespace {

// One latch stream. Writes one message at a time; when it runs dry it waits for the coordinator
// to say the job changed (OnJobChanged via Listener), then polls again.
//
// Locks: mu_ (this reactor) may be held while calling into the Coordinator, never the reverse:
// the coordinator calls Listener::OnJobChanged without its own lock.
class LatchStreamReactor : public grpc::ServerWriteReactor<v1::WatchLatchesResponse> {
 public:
  // `slot`: this stream's place under the per-peer cap, released when the stream is done.
  LatchStreamReactor(Coordinator* core, const WorkerCall& call, int64_t start_window,
                     std::unique_ptr<PeerCallLimiter::Slot> slot, const CallGate& gate,
                     const grpc::CallbackServerContext& ctx)
      : core_(core), call_(call), slot_(std::move(slot)), next_window_(start_window) {
    listener_ = std::make_shared<Listener>(this);
    auto sub = core_->SubscribeLatches(call_, listener_);
    absl::MutexLock lock(&mu_);
    if (!sub.ok()) {
      grpc::Status st = ToGrpcStatus(sub.status());
      if (IsRefusal(st)) gate.Refuse(ctx, "WatchLatches", st);
      FinishLocked(std::move(st));
      return;
    }
    subscription_ = *sub;
    PumpLocked();
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (finished_) {  // FinishLocked waited for this write
      Finish(final_status_);
      return;
    }
    if (!ok) {
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "stream broken"));
      return;
    }
    pending_.pop_front();
    PumpLocked();
  }

  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
  }

  void OnDone() override {
    listener_->Detach();
    if (subscription_) core_->Unsubscribe(*subscription_);
    delete this;
  }

 private:
  // Forwards the coordinator's notifications for as long as the reactor lives.
  class Listener : public JobListener {
   public:
    explicit Listener(LatchStreamReactor* r) : reactor_(r) {}
    void OnJobChanged() override {
      absl::MutexLock lock(&mu_);
      if (reactor_) reactor_->Pump();
    }
    void Detach() {
      absl::MutexLock lock(&mu_);
      reactor_ = nullptr;
    }

   private:
    absl::Mutex mu_;
    LatchStreamReactor* reactor_ ABSL_GUARDED_BY(mu_);
  };

  void Pump() {
    absl::MutexLock lock(&mu_);
    PumpLocked();
  }

  void PumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_ || writing_) return;
    if (pending_.empty()) {
      if (ended_) {
        FinishLocked(grpc::Status::OK);
        return;
      }
      auto batch = core_->PollLatches(call_, next_window_, kLatchBatch);
      if (!batch.ok()) {
        FinishLocked(ToGrpcStatus(batch.status()));
        return;
      }
      for (const PublishedLatch& p : batch->latches) {
        v1::WatchLatchesResponse m;
        *m.mutable_latch() = ToProto(p.latch);
        *m.mutable_latch()->mutable_publish_time() = ToProtoTime(p.publish_time);
        pending_.push_back(std::move(m));
        next_window_ = p.latch.window + 1;
      }
      if (batch->job_ended) {
        v1::WatchLatchesResponse m;
        m.mutable_job_ended()->set_state(ToProto(batch->state));
        m.mutable_job_ended()->set_reason(batch->reason);
        pending_.push_back(std::move(m));
        ended_ = true;
      }
      if (pending_.empty()) return;  // wait for OnJobChanged
    }
    writing_ = true;
    StartWrite(&pending_.front());  // stays put until OnWriteDone pops it
  }

  // Finish once; while a write is in flight, after it completes.
  void FinishLocked(grpc::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    final_status_ = std::move(status);
    if (!writing_) Finish(final_status_);
  }

  Coordinator* const core_;
  const WorkerCall call_;
  const std::unique_ptr<PeerCallLimiter::Slot> slot_;
  std::shared_ptr<Listener> listener_;
  std::optional<Subscription> subscription_;
  absl::Mutex mu_;
  int64_t next_window_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::WatchLatchesResponse> pending_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status final_status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

grpc::ServerWriteReactor<v1::WatchLatchesResponse>* WorkerServiceImpl::WatchLatches(
    grpc::CallbackServerContext* ctx, const v1::WatchLatchesRequest* req) {
  auto slot = gate_.Admit(*ctx);
  WorkerCall call;
  grpc::Status st = ToCall(req->identity(), req->rank(), &call);
  if (!slot->ok()) st = gate_.Refuse(*ctx, "WatchLatches", gate_.ExhaustedStatus());
  if (st.ok() && req->start_window() < 0) st = Invalid("start_window: must be >= 0");
  if (!st.ok()) {
    // A reactor that only finishes: the same shape for every error.
    class Refusal : public grpc::ServerWriteReactor<v1::WatchLatchesResponse> {
     public:
      explicit Refusal(grpc::Status s) { Finish(std::move(s)); }
      void OnDone() override { delete this; }
    };
    return new Refusal(std::move(st));
  }
  return new LatchStreamReactor(core_, call, req->start_window(), std::move(slot), gate_, *ctx);
}

grpc::Status WorkerServiceImpl::DoReportStep(const v1::ReportStepRequest& request,
                                             v1::ReportStepResponse* resp) {
  const v1::ReportStepRequest* req = &request;
  WorkerCall call;
  grpc::Status st = ToCall(req->identity(), req->rank(), &call);
  if (!st.ok()) return st;
  if (req->collective_calls_size() > kMaxCollectiveKeys) {
    return Invalid(absl::StrCat("collective_calls: more than ", kMaxCollectiveKeys, " keys"));
  }
  auto report = FromProto(*req);
  if (!report.ok()) return ToGrpcStatus(report.status());
  StepReportRecord r;
  r.report = *std::move(report);
  auto out = core_->ReportStep(call, std::move(r));
  if (!out.ok()) return ToGrpcStatus(out.status());
  resp->set_duplicate(out->duplicate);
  resp->set_state(ToProto(out->state));
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::DoHeartbeat(const v1::HeartbeatRequest& request,
                                            v1::HeartbeatResponse* resp) {
  const v1::HeartbeatRequest* req = &request;
  WorkerCall call;
  grpc::Status st = ToCall(req->identity(), req->rank(), &call);
  if (!st.ok()) return st;
  std::optional<RankPosition> position;
  if (req->has_position()) position = FromProto(req->position());
  auto out = core_->Heartbeat(call, position);
  if (!out.ok()) return ToGrpcStatus(out.status());
  resp->set_state(ToProto(out->state));
  resp->set_reason(out->reason);
  resp->set_attempt(out->attempt);
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::DoReportFailure(const v1::ReportFailureRequest& request,
                                                v1::ReportFailureResponse* resp) {
  const v1::ReportFailureRequest* req = &request;
  WorkerCall call;
  grpc::Status st = ToCall(req->identity(), req->rank(), &call);
  if (!st.ok()) return st;
  auto out =
      core_->ReportFailure(call, req->message().substr(0, kMaxFailureBytes), req->permanent());
  if (!out.ok()) return ToGrpcStatus(out.status());
  resp->set_state(ToProto(out->state));
  resp->set_attempt(out->attempt);
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::DoReportCheckpoint(const v1::ReportCheckpointRequest& req,
                                                   v1::ReportCheckpointResponse* resp) {
  WorkerCall call;
  grpc::Status st = ToCall(req.identity(), req.rank(), &call);
  if (!st.ok()) return st;
  if (req.manifest_sha256().size() > kMaxHostBytes) {
    return Invalid(absl::StrCat("manifest_sha256: longer than ", kMaxHostBytes, " bytes"));
  }
  auto report = FromProto(req);
  if (!report.ok()) return ToGrpcStatus(report.status());
  auto out = core_->ReportCheckpoint(call, *report);
  if (!out.ok()) return ToGrpcStatus(out.status());
  resp->set_state(ToProto(out->state));
  return grpc::Status::OK;
}

}  // namespace latchkey
