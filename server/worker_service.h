// gRPC adapter: latchkey.v1.WorkerService over Coordinator. Converts messages and statuses only.
// Thread-safety: as Coordinator.
#ifndef LATCHKEY_SERVER_WORKER_SERVICE_H_
#define LATCHKEY_SERVER_WORKER_SERVICE_H_

#include <string>

#include "absl/time/time.h"
#include "latchkey/v1/worker_service.grpc.pb.h"
#include "server/coordinator.h"

namespace latchkey {

class WorkerServiceImpl final : public latchkey::v1::WorkerService::Service {
 public:
  // `core` must outlive the service. `poll` bounds how long a stream handler waits before it
  // looks at the client's cancellation again.
  explicit WorkerServiceImpl(Coordinator* core, absl::Duration poll = absl::Milliseconds(200))
      : core_(core), poll_(poll) {}

  grpc::Status Join(grpc::ServerContext* ctx, const v1::JoinRequest* req,
                    v1::JoinResponse* resp) override;
  grpc::Status WatchLatches(grpc::ServerContext* ctx, const v1::WatchLatchesRequest* req,
                            grpc::ServerWriter<v1::WatchLatchesResponse>* writer) override;
  grpc::Status ReportStep(grpc::ServerContext* ctx, const v1::ReportStepRequest* req,
                          v1::ReportStepResponse* resp) override;
  grpc::Status Heartbeat(grpc::ServerContext* ctx, const v1::HeartbeatRequest* req,
                         v1::HeartbeatResponse* resp) override;
  grpc::Status ReportFailure(grpc::ServerContext* ctx, const v1::ReportFailureRequest* req,
                             v1::ReportFailureResponse* resp) override;

  // "ipv4:10.0.0.5:4321" -> "10.0.0.5", "ipv6:[::1]:4321" -> "::1"; "" when not an IP peer.
  static std::string PeerHost(const std::string& peer);

 private:
  Coordinator* const core_;
  const absl::Duration poll_;
};

}  // namespace latchkey

#endif  // LATCHKEY_SERVER_WORKER_SERVICE_H_
