#include "server/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>

#include <iostream>

#include "absl/strings/str_cat.h"
#include "server/job_service.h"
#include "server/worker_service.h"

namespace latchkey {

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    Coordinator* core, const ServerOptions& options) {
  std::unique_ptr<CoordinatorServer> s(new CoordinatorServer());
  s->core_ = core;
  s->limiter_ = std::make_unique<PeerCallLimiter>(options.max_calls_per_peer,
                                                  [core] { return core->LiveRanks(); });
  std::function<void(const std::string&)> log = options.log;
  if (!log) log = [](const std::string& line) { std::cerr << line << std::endl; };
  CallGate gate{options.auth_tokens, s->limiter_.get(), log};
  s->jobs_ = std::make_unique<JobServiceImpl>(core, options.stream_poll, gate);
  s->workers_ = std::make_unique<WorkerServiceImpl>(core, gate);

  // Both are process-wide switches that must be set before the first builder.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  grpc::ServerBuilder builder;
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (!options.tls_cert_pem.empty()) {
    grpc::SslServerCredentialsOptions ssl(
        options.tls_client_ca_pem.empty()
            ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
            : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    ssl.pem_root_certs = options.tls_client_ca_pem;
    ssl.pem_key_cert_pairs.push_back({options.tls_key_pem, options.tls_cert_pem});
    creds = grpc::SslServerCredentials(ssl);
  }
  builder.AddListeningPort(options.listen, creds, &s->port_);
  builder.RegisterService(s->jobs_.get());
  builder.RegisterService(s->workers_.get());
  builder.SetMaxReceiveMessageSize(options.max_receive_message_bytes);
  builder.SetMaxSendMessageSize(options.max_send_message_bytes);
  // gRPC's default on Linux is SO_REUSEPORT, with which a second coordinator given the same
  // port binds it too and the kernel splits the workers' connections between the two (and
  // their databases). Without it, a port in use is refused.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
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
  if (!server_) return;  // Start failed: nothing was served
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
