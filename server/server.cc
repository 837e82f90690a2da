#include "server/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>

#include "absl/strings/str_cat.h"
#include "server/job_service.h"
#include "server/worker_service.h"

namespace latchkey {

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    Coordinator* core, const ServerOptions& options) {
  std::unique_ptr<CoordinatorServer> s(new CoordinatorServer());
  s->core_ = core;
  s->jobs_ = std::make_unique<JobServiceImpl>(core, options.stream_poll);
  s->workers_ = std::make_unique<WorkerServiceImpl>(core);

  // Both are process-wide switches that must be set before the first builder.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, grpc::InsecureServerCredentials(), &s->port_);
  builder.RegisterService(s->jobs_.get());
  builder.RegisterService(s->workers_.get());
  builder.SetMaxReceiveMessageSize(options.max_receive_message_bytes);
  builder.SetMaxSendMessageSize(options.max_send_message_bytes);
  // Workers keep long streams open and ping to notice a dead peer; allow it.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 30000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  s->server_ = builder.BuildAndStart();
  if (!s->server_ || s->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("--listen ", options.listen, ": cannot bind"));
  }
  if (auto* health = s->server_->GetHealthCheckService()) {
    health->SetServingStatus(true);
    health->SetServingStatus("latchkey.v1.JobService", true);
    health->SetServingStatus("latchkey.v1.WorkerService", true);
  }
  return s;
}

CoordinatorServer::~CoordinatorServer() {
  Shutdown(absl::ZeroDuration());
  Wait();
}

void CoordinatorServer::Shutdown(absl::Duration grace) {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  if (auto* health = server_->GetHealthCheckService()) health->SetServingStatus(false);
  // Wake the stream handlers first: they would otherwise hold Shutdown for the whole grace.
  core_->Shutdown();
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
}

void CoordinatorServer::Wait() { server_->Wait(); }

}  // namespace latchkey
