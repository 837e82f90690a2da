// gRPC adapter: latchkey.v1.WorkerService over Coordinator. Converts messages (proto/wire.h) and
// statuses only; every call passes the CallGate (server/call_gate.h): the unary ones through
// Run, the latch stream through the gate's parts (its slot lives as long as the stream).
// Thread-safety: as Coordinator.
#ifndef LATCHKEY_SERVER_WORKER_SERVICE_H_
#define LATCHKEY_SERVER_WORKER_SERVICE_H_

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/worker_protocol.h"
#include "latchkey/v1/worker_service.grpc.pb.h"
#include "server/call_gate.h"
#include "server/coordinator.h"

namespace latchkey {

// Every method uses gRPC's callback API. A latch stream is a reactor woken by the coordinator's
// notifier thread rather than a thread of its own, so a thousand ranks cost a thousand small
// objects; the unary calls run to completion on gRPC's own threads (the core's work is short:
// a lock and at most one SQLite commit), which saves the sync server's hand-off between threads.
class WorkerServiceImpl final : public latchkey::v1::WorkerService::CallbackService {
 public:
  // `core` must outlive the service (and the server must be shut down before the core).
  // `gate`: the per-peer cap and the log of refused calls. The join token in each request is
  // the only credential: it opens WorkerService for its own job.
  explicit WorkerServiceImpl(Coordinator* core, CallGate gate = {})
      : core_(core), gate_(std::move(gate)) {}

  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* ctx, const v1::JoinRequest* req,
                                 v1::JoinResponse* resp) override;
  grpc::ServerWriteReactor<v1::WatchLatchesResponse>* WatchLatches(
      grpc::CallbackServerContext* ctx, const v1::WatchLatchesRequest* req) override;
  grpc::ServerUnaryReactor* ReportStep(grpc::CallbackServerContext* ctx,
                                       const v1::ReportStepRequest* req,
                                       v1::ReportStepResponse* resp) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const v1::HeartbeatRequest* req,
                                      v1::HeartbeatResponse* resp) override;
  grpc::ServerUnaryReactor* ReportFailure(grpc::CallbackServerContext* ctx,
                                          const v1::ReportFailureRequest* req,
                                          v1::ReportFailureResponse* resp) override;
  grpc::ServerUnaryReactor* ReportCheckpoint(grpc::CallbackServerContext* ctx,
                                             const v1::ReportCheckpointRequest* req,
                                             v1::ReportCheckpointResponse* resp) override;
  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* ctx, const v1::LeaveRequest* req,
                                  v1::LeaveResponse* resp) override;
  // A node agent's batches (worker_service_node.cc): each entry as its own call would be.
  grpc::ServerUnaryReactor* NodeHeartbeat(grpc::CallbackServerContext* ctx,
                                          const v1::NodeHeartbeatRequest* req,
                                          v1::NodeHeartbeatResponse* resp) override;
  grpc::ServerUnaryReactor* ReportSteps(grpc::CallbackServerContext* ctx,
                                        const v1::ReportStepsRequest* req,
                                        v1::ReportStepsResponse* resp) override;
  grpc::ServerUnaryReactor* PutTrace(grpc::CallbackServerContext* ctx,
                                     const v1::PutTraceRequest* req,
                                     v1::PutTraceResponse* resp) override;

  // The core's answer to a worker, as WorkerService's responses carry it.
  static WorkerReply ToReply(const WorkerStatus& status);

  // "ipv4:10.0.0.5:4321" -> "10.0.0.5", "ipv6:[::1]:4321" -> "::1"; "" when not an IP peer.
  static std::string PeerHost(const std::string& peer);

 private:
  absl::Status DoJoin(const std::string& peer, const v1::JoinRequest& req, v1::JoinResponse* resp);
  absl::Status DoHeartbeat(const v1::HeartbeatRequest& req, v1::HeartbeatResponse* resp);
  // One step report checked and handed to the core; `done` runs once it is durable (or
  // refused), on the committer's thread or this one.
  void SubmitReport(const v1::ReportStepRequest& req,
                    std::function<void(absl::StatusOr<WorkerStatus>)> done);
  absl::Status DoReportFailure(const v1::ReportFailureRequest& req,
                               v1::ReportFailureResponse* resp);
  absl::Status DoReportCheckpoint(const v1::ReportCheckpointRequest& req,
                                  v1::ReportCheckpointResponse* resp);
  absl::Status DoLeave(const v1::LeaveRequest& req, v1::LeaveResponse* resp);

  // gate_.Run around `body`, finished on the call's default reactor.
  grpc::ServerUnaryReactor* Run(grpc::CallbackServerContext* ctx, const char* method,
                                const std::function<absl::Status()>& body);

  Coordinator* const core_;
  const CallGate gate_;
};

}  // namespace latchkey

#endif  // LATCHKEY_SERVER_WORKER_SERVICE_H_
