#include "server/worker_service.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
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

grpc::Status WorkerServiceImpl::Join(grpc::ServerContext* ctx, const v1::JoinRequest* req,
                                     v1::JoinResponse* resp) {
  JoinArgs args;
  grpc::Status st = ToCall(req->identity(), -1, &args.call);
  if (!st.ok()) return st;
  if (req->advertise_host().size() > kMaxHostBytes) {
    return Invalid(absl::StrCat("advertise_host: longer than ", kMaxHostBytes, " bytes"));
  }
  if (req->has_requested_rank()) args.requested_rank = req->requested_rank();
  args.advertise_host = req->advertise_host();
  args.peer_host = PeerHost(ctx->peer());
  auto r = core_->Join(args);
  if (!r.ok()) return ToGrpcStatus(r.status());
  resp->set_rank(r->rank);
  resp->set_world_size(r->world_size);
  resp->set_tp(r->tp);
  resp->set_dp(r->dp);
  resp->set_tp_rank(r->tp > 0 ? r->rank % r->tp : 0);
  resp->set_dp_rank(r->tp > 0 ? r->rank / r->tp : 0);
  resp->set_spec_json(r->spec_json);
  resp->set_base_dir(r->base_dir);
  resp->mutable_rendezvous()->set_host(r->rendezvous_host);
  resp->mutable_rendezvous()->set_port(r->rendezvous_port);
  resp->set_state(static_cast<v1::JobState>(r->state));
  *resp->mutable_heartbeat_interval() = ToProtoDuration(r->heartbeat_interval);
  *resp->mutable_liveness_timeout() = ToProtoDuration(r->liveness_timeout);
  resp->set_steps(r->steps);
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::WatchLatches(grpc::ServerContext* ctx,
                                             const v1::WatchLatchesRequest* req,
                                             grpc::ServerWriter<v1::WatchLatchesResponse>* writer) {
  WorkerCall call;
  grpc::Status st = ToCall(req->identity(), req->rank(), &call);
  if (!st.ok()) return st;
  int64_t window = req->start_window();
  while (!ctx->IsCancelled()) {
    auto batch = core_->WaitLatches(call, window, kLatchBatch, absl::Now() + poll_);
    if (!batch.ok()) {
      if (absl::IsDeadlineExceeded(batch.status())) continue;
      return ToGrpcStatus(batch.status());
    }
    for (const PublishedLatch& p : batch->latches) {
      v1::WatchLatchesResponse m;
      *m.mutable_latch() = ToProto(p.latch);
      *m.mutable_latch()->mutable_publish_time() = ToProtoTime(p.publish_time);
      if (!writer->Write(m)) return grpc::Status(grpc::StatusCode::CANCELLED, "client gone");
      window = p.latch.window + 1;
    }
    if (batch->job_ended) {
      v1::WatchLatchesResponse m;
      m.mutable_job_ended()->set_state(static_cast<v1::JobState>(batch->state));
      m.mutable_job_ended()->set_reason(batch->reason);
      writer->Write(m);
      return grpc::Status::OK;
    }
  }
  return grpc::Status(grpc::StatusCode::CANCELLED, "client cancelled");
}

grpc::Status WorkerServiceImpl::ReportStep(grpc::ServerContext*, const v1::ReportStepRequest* req,
                                           v1::ReportStepResponse* resp) {
  WorkerCall call;
  grpc::Status st = ToCall(req->identity(), req->rank(), &call);
  if (!st.ok()) return st;
  if (req->collective_calls_size() > kMaxCollectiveKeys) {
    return Invalid(absl::StrCat("collective_calls: more than ", kMaxCollectiveKeys, " keys"));
  }
  StepReportRecord r;
  r.step = req->step();
  r.micro_batches = req->micro_batches();
  r.loss = req->loss();
  r.grad_norm = req->grad_norm();
  auto mode = FromProto(req->kv_mode());
  if (!mode) return Invalid("kv_mode: required (the mode the step ran)");
  r.kv_mode = *mode;
  r.kv_allreduce_calls = req->kv_allreduce_calls();
  for (const auto& [k, v] : req->collective_calls()) r.collective_calls[k] = v;
  r.step_seconds = req->step_seconds();
  r.tokens = req->tokens();
  r.latch_generation = req->latch_generation();
  auto out = core_->ReportStep(call, std::move(r));
  if (!out.ok()) return ToGrpcStatus(out.status());
  resp->set_duplicate(out->duplicate);
  resp->set_state(static_cast<v1::JobState>(out->state));
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* req,
                                          v1::HeartbeatResponse* resp) {
  WorkerCall call;
  grpc::Status st = ToCall(req->identity(), req->rank(), &call);
  if (!st.ok()) return st;
  auto out = core_->Heartbeat(call);
  if (!out.ok()) return ToGrpcStatus(out.status());
  resp->set_state(static_cast<v1::JobState>(out->state));
  resp->set_reason(out->reason);
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::ReportFailure(grpc::ServerContext*,
                                              const v1::ReportFailureRequest* req,
                                              v1::ReportFailureResponse* resp) {
  WorkerCall call;
  grpc::Status st = ToCall(req->identity(), req->rank(), &call);
  if (!st.ok()) return st;
  auto out = core_->ReportFailure(call, req->message().substr(0, kMaxFailureBytes));
  if (!out.ok()) return ToGrpcStatus(out.status());
  resp->set_state(static_cast<v1::JobState>(out->state));
  return grpc::Status::OK;
}

}  // namespace latchkey
