// WorkerService's node calls (docs/protocol.md "Node calls"): a node agent's heartbeats of its
// local ranks in one call, and their reports of one step in one call. Each entry runs the
// per-rank path (DoHeartbeat, SubmitReport) and gets its own status, so a fenced or refused
// rank is answered as its own call would be while the others go on. One per-peer slot per call.
#include <atomic>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/grpc_status.h"
#include "proto/wire.h"
#include "server/worker_service.h"

namespace latchkey {
namespace {

// More entries than any node has ranks: a bound on one call's work under the lock.
constexpr int kMaxNodeEntries = 1024;

void SetStatus(const absl::Status& st, v1::CallStatus* out) {
  const grpc::Status wire = ToGrpcStatus(st);
  out->set_code(static_cast<int>(wire.error_code()));
  out->set_message(wire.error_message());
  out->set_details(wire.error_details());
}

}  // namespace

grpc::ServerUnaryReactor* WorkerServiceImpl::NodeHeartbeat(grpc::CallbackServerContext* ctx,
                                                           const v1::NodeHeartbeatRequest* req,
                                                           v1::NodeHeartbeatResponse* resp) {
  return Run(ctx, "NodeHeartbeat", [&]() -> absl::Status {
    if (req->heartbeats_size() > kMaxNodeEntries) {
      return absl::InvalidArgumentError(
          absl::StrCat("heartbeats: more than ", kMaxNodeEntries, " in one call"));
    }
    for (const v1::HeartbeatRequest& hb : req->heartbeats()) {
      v1::HeartbeatResponse* one = resp->add_responses();
      SetStatus(DoHeartbeat(hb, one), resp->add_statuses());
    }
    return absl::OkStatus();
  });
}

// Answered once every report is durable: the last of the core's answers finishes the call.
grpc::ServerUnaryReactor* WorkerServiceImpl::ReportSteps(grpc::CallbackServerContext* ctx,
                                                         const v1::ReportStepsRequest* req,
                                                         v1::ReportStepsResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  auto slot = gate_.Admit(*ctx, "ReportSteps");
  if (!slot.ok()) {
    reactor->Finish(ToGrpcStatus(slot.status()));
    return reactor;
  }
  const int n = req->reports_size();
  if (n > kMaxNodeEntries || n == 0) {
    reactor->Finish(
        gate_.Answer(*ctx, "ReportSteps",
                     absl::InvalidArgumentError(absl::StrCat(
                         "reports: between 1 and ", kMaxNodeEntries, " in one call, not ", n))));
    return reactor;
  }
  for (int i = 0; i < n; ++i) {
    resp->add_responses();
    resp->add_statuses();
  }
  std::shared_ptr<PeerCallLimiter::Slot> held = *std::move(slot);
  auto left = std::make_shared<std::atomic<int>>(n);
  for (int i = 0; i < n; ++i) {
    SubmitReport(req->reports(i),
                 [this, ctx, resp, reactor, held, left, i](absl::StatusOr<WorkerStatus> out) {
                   if (out.ok()) ToProto(ToReply(*out), resp->mutable_responses(i));
                   SetStatus(out.status(), resp->mutable_statuses(i));
                   if (left->fetch_sub(1) == 1) {
                     reactor->Finish(gate_.Answer(*ctx, "ReportSteps", absl::OkStatus()));
                   }
                 });
  }
  return reactor;
}

}  // namespace latchkey
