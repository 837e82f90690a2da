#include "server/worker_service.h"

#include <deque>
#include <memory>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "proto/grpc_status.h"
#include "proto/wire.h"

namespace latchkey {
namespace {

// Bounds on caller-chosen strings and maps (the transport bounds the whole message).
constexpr size_t kMaxWorkerIdBytes = 256;
constexpr size_t kMaxHostBytes = 256;
constexpr size_t kMaxFailureBytes = 4096;
constexpr int kMaxUnreachableRanks = 1 << 16;  // more ranks than any job's
constexpr int kLatchBatch = 64;

absl::Status Invalid(const std::string& msg) { return absl::InvalidArgumentError(msg); }

// Who calls, checked for size, as the core names it.
absl::Status ToCall(const v1::WorkerIdentity& wire, int rank, WorkerCall* call) {
  WorkerIdentity id = FromProto(wire);
  if (id.worker_id.size() > kMaxWorkerIdBytes) {
    return Invalid(absl::StrCat("identity.worker_id: longer than ", kMaxWorkerIdBytes, " bytes"));
  }
  call->job_id = std::move(id.job_id);
  call->join_token = std::move(id.join_token);
  call->worker_id = std::move(id.worker_id);
  call->rank = rank;
  call->attempt = id.attempt;
  return absl::OkStatus();
}

}  // namespace

WorkerReply WorkerServiceImpl::ToReply(const WorkerStatus& status) {
  WorkerReply out;
  out.state = status.state;
  out.reason = status.reason;
  out.duplicate = status.duplicate;
  out.attempt = status.attempt;
  out.peers = status.peers;
  out.stop = status.stop;
  out.trace = status.trace;
  return out;
}

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

}  // namespace

grpc::ServerUnaryReactor* WorkerServiceImpl::Run(grpc::CallbackServerContext* ctx,
                                                 const char* method,
                                                 const std::function<absl::Status()>& body) {
  return Done(ctx, gate_.Run(*ctx, method, body));
}

grpc::ServerUnaryReactor* WorkerServiceImpl::Join(grpc::CallbackServerContext* ctx,
                                                  const v1::JoinRequest* req,
                                                  v1::JoinResponse* resp) {
  return Run(ctx, "Join", [&] { return DoJoin(ctx->peer(), *req, resp); });
}

// Answered once the report is durable (the core's group commit), from the committer's thread:
// no gRPC thread waits for the disk.
grpc::ServerUnaryReactor* WorkerServiceImpl::ReportStep(grpc::CallbackServerContext* ctx,
                                                        const v1::ReportStepRequest* req,
                                                        v1::ReportStepResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  auto slot = gate_.Admit(*ctx, "ReportStep");
  if (!slot.ok()) {
    reactor->Finish(ToGrpcStatus(slot.status()));
    return reactor;
  }
  std::shared_ptr<PeerCallLimiter::Slot> held = *std::move(slot);
  SubmitReport(*req, [this, ctx, resp, reactor, held](absl::StatusOr<WorkerStatus> out) {
    if (out.ok()) ToProto(ToReply(*out), resp);
    reactor->Finish(gate_.Answer(*ctx, "ReportStep", out.status()));
  });
  return reactor;
}

void WorkerServiceImpl::SubmitReport(const v1::ReportStepRequest& req,
                                     std::function<void(absl::StatusOr<WorkerStatus>)> done) {
  WorkerCall call;
  StepReportRecord r;
  // The report's sizes are checked by the core, which records a refusal in the job's audit.
  absl::Status st = ToCall(req.identity(), req.rank(), &call);
  if (st.ok()) {
    auto report = FromProto(req);
    if (report.ok()) {
      r.report = *std::move(report);
    } else {
      st = report.status();
    }
  }
  if (!st.ok()) {
    done(st);
    return;
  }
  core_->ReportStep(call, std::move(r), std::move(done));
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

// A rank's spans for an open trace request: at most kMaxTraceUploadBytes (the worker keeps the
// newest spans within it).
grpc::ServerUnaryReactor* WorkerServiceImpl::PutTrace(grpc::CallbackServerContext* ctx,
                                                      const v1::PutTraceRequest* req,
                                                      v1::PutTraceResponse*) {
  return Run(ctx, "PutTrace", [&]() -> absl::Status {
    WorkerCall call;
    LK_RETURN_IF_ERROR(ToCall(req->identity(), req->rank(), &call));
    if (req->jsonl().size() > kMaxTraceUploadBytes) {
      return Invalid(absl::StrCat("jsonl: more than ", kMaxTraceUploadBytes, " bytes"));
    }
    return core_->PutTrace(call, req->request_id(), req->jsonl());
  });
}

grpc::ServerUnaryReactor* WorkerServiceImpl::Leave(grpc::CallbackServerContext* ctx,
                                                   const v1::LeaveRequest* req,
                                                   v1::LeaveResponse* resp) {
  return Run(ctx, "Leave", [&] { return DoLeave(*req, resp); });
}

absl::Status WorkerServiceImpl::DoJoin(const std::string& peer, const v1::JoinRequest& req,
                                       v1::JoinResponse* resp) {
  JoinArgs args;
  LK_RETURN_IF_ERROR(ToCall(req.identity(), -1, &args.call));
  if (req.advertise_host().size() > kMaxHostBytes) {
    return Invalid(absl::StrCat("advertise_host: longer than ", kMaxHostBytes, " bytes"));
  }
  if (req.has_requested_rank()) args.requested_rank = req.requested_rank().value();
  args.advertise_host = req.advertise_host();
  args.peer_host = PeerHost(peer);
  if (req.probe_port() < 0 || req.probe_port() > 65535) {
    return Invalid("probe_port: must be 0..65535");
  }
  args.probe_port = req.probe_port();
  if (req.node().size() > kMaxHostBytes) {
    return Invalid(absl::StrCat("node: longer than ", kMaxHostBytes, " bytes"));
  }
  args.node = req.node();
  LK_ASSIGN_OR_RETURN(JoinResult r, core_->Join(args));
  *resp = ToProto(r);
  resp->set_coordinator_unix_micros(absl::ToUnixMicros(absl::Now()));  // the ranks' trace clock
  return absl::OkStatus();
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
      FinishLocked(gate.Answer(ctx, "WatchLatches", sub.status()));
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
        pending_.push_back(MakeLatchMessage(p.latch, p.publish_time));
        next_window_ = p.latch.window + 1;
      }
      if (batch->job_ended) {
        pending_.push_back(MakeJobEndedMessage(batch->state, batch->reason));
        ended_ = true;
      } else if (batch->stop_before >= 0) {
        pending_.push_back(MakeStopMessage(batch->stop_before));
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
  // The stream keeps its slot until it is done: the gate's parts, not Run.
  auto slot = gate_.Admit(*ctx, "WatchLatches");
  WorkerCall call;
  absl::Status st = ToCall(req->identity(), req->rank(), &call);
  if (!slot.ok()) st = slot.status();
  if (st.ok() && req->start_window() < 0) st = Invalid("start_window: must be >= 0");
  if (!st.ok()) {
    // A reactor that only finishes: the same shape for every error.
    class Refusal : public grpc::ServerWriteReactor<v1::WatchLatchesResponse> {
     public:
      explicit Refusal(grpc::Status s) { Finish(std::move(s)); }
      void OnDone() override { delete this; }
    };
    return new Refusal(gate_.Answer(*ctx, "WatchLatches", st));
  }
  return new LatchStreamReactor(core_, call, req->start_window(), *std::move(slot), gate_, *ctx);
}

absl::Status WorkerServiceImpl::DoHeartbeat(const v1::HeartbeatRequest& req,
                                            v1::HeartbeatResponse* resp) {
  WorkerCall call;
  LK_RETURN_IF_ERROR(ToCall(req.identity(), req.rank(), &call));
  HeartbeatArgs args;
  if (req.has_position()) args.position = FromProto(req.position());
  if (req.has_reachability()) {
    if (req.reachability().unreachable_ranks_size() > kMaxUnreachableRanks) {
      return Invalid(
          absl::StrCat("reachability.unreachable_ranks: more than ", kMaxUnreachableRanks));
    }
    args.reach = FromProto(req.reachability());
  }
  args.want_peers = req.want_peers();
  if (req.probe_port() < 0 || req.probe_port() > 65535) {
    return Invalid("probe_port: must be 0..65535");
  }
  args.probe_port = req.probe_port();
  LK_ASSIGN_OR_RETURN(WorkerStatus out, core_->Heartbeat(call, args));
  ToProto(ToReply(out), resp);
  resp->set_coordinator_unix_micros(absl::ToUnixMicros(absl::Now()));  // the ranks' trace clock
  return absl::OkStatus();
}

absl::Status WorkerServiceImpl::DoReportFailure(const v1::ReportFailureRequest& req,
                                                v1::ReportFailureResponse* resp) {
  WorkerCall call;
  LK_RETURN_IF_ERROR(ToCall(req.identity(), req.rank(), &call));
  LK_ASSIGN_OR_RETURN(
      WorkerStatus out,
      core_->ReportFailure(call, req.message().substr(0, kMaxFailureBytes), req.permanent(),
                           req.reason().substr(0, kMaxFailureBytes)));
  ToProto(ToReply(out), resp);
  return absl::OkStatus();
}

absl::Status WorkerServiceImpl::DoReportCheckpoint(const v1::ReportCheckpointRequest& req,
                                                   v1::ReportCheckpointResponse* resp) {
  WorkerCall call;
  LK_RETURN_IF_ERROR(ToCall(req.identity(), req.rank(), &call));
  // The manifest's size is checked by the core, which records a refusal in the job's audit.
  LK_ASSIGN_OR_RETURN(CheckpointReport report, FromProto(req));
  LK_ASSIGN_OR_RETURN(WorkerStatus out, core_->ReportCheckpoint(call, report));
  ToProto(ToReply(out), resp);
  return absl::OkStatus();
}

absl::Status WorkerServiceImpl::DoLeave(const v1::LeaveRequest& req, v1::LeaveResponse* resp) {
  WorkerCall call;
  LK_RETURN_IF_ERROR(ToCall(req.identity(), req.rank(), &call));
  LK_ASSIGN_OR_RETURN(WorkerStatus out,
                      core_->Leave(call, req.reason().substr(0, kMaxFailureBytes)));
  ToProto(ToReply(out), resp);
  return absl::OkStatus();
}

}  // namespace latchkey
