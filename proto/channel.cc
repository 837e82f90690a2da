#include "proto/channel.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>
#include <grpcpp/support/client_interceptor.h>

#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

namespace latchkey {
namespace {

grpc::ChannelArguments CoordinatorChannelArgs() {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // gRPC's default reconnect backoff grows to 120 s; a restarted coordinator should be found
  // within a second. (Leave GRPC_ARG_MIN_RECONNECT_BACKOFF_MS alone: it is also the connect
  // timeout, and 100 ms cut handshakes short while a restarted coordinator was busy.)
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // Each caller gets its own connection rather than a process-wide shared subchannel, so a
  // simulated cluster in one process behaves like many processes.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // Answers are small except a trace (JobService.GetTrace caps its answer at 64 MiB).
  args.SetMaxReceiveMessageSize(80 << 20);
  return args;
}

absl::StatusOr<std::string> ReadPem(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(flag + ": cannot read '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string pem = ss.str();
  if (pem.find("-----BEGIN") == std::string::npos) {
    return absl::InvalidArgumentError(flag + ": '" + path + "' is not a PEM file");
  }
  // A CA or certificate flag given a key (or another PEM) would reach gRPC, which logs its own
  // lines and fails the call with "empty address list": refuse it here, naming the flag.
  if (flag != "--tls-key" && pem.find("-----BEGIN CERTIFICATE-----") == std::string::npos) {
    return absl::InvalidArgumentError(flag + ": '" + path + "' holds no certificate");
  }
  return pem;
}

// Adds the bearer token to the initial metadata of every call on the channel (plaintext or
// TLS alike: gRPC's call credentials refuse plaintext channels).
class BearerInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit BearerInterceptor(const std::string& value) : value_(value) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({"authorization", value_});
    }
    methods->Proceed();
  }

 private:
  const std::string& value_;
};

class BearerInterceptorFactory : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerInterceptorFactory(std::string token) : value_("Bearer " + std::move(token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* /*info*/) override {
    return new BearerInterceptor(value_);
  }

 private:
  const std::string value_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeCoordinatorChannel(
    const std::string& target, const ChannelCredentials& credentials) {
  std::shared_ptr<grpc::ChannelCredentials> transport = grpc::InsecureChannelCredentials();
  if (credentials.tls_cert.empty() != credentials.tls_key.empty()) {
    return absl::InvalidArgumentError(credentials.tls_cert.empty()
                                          ? "--tls-cert: required with --tls-key"
                                          : "--tls-key: required with --tls-cert");
  }
  if (!credentials.tls_cert.empty() && !credentials.tls()) {
    return absl::InvalidArgumentError("--tls-ca: required with --tls-cert/--tls-key");
  }
  if (credentials.tls()) {
    grpc::SslCredentialsOptions ssl;
    auto ca = ReadPem("--tls-ca", credentials.tls_ca);
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *std::move(ca);
    if (!credentials.tls_cert.empty()) {
      auto cert = ReadPem("--tls-cert", credentials.tls_cert);
      if (!cert.ok()) return cert.status();
      auto key = ReadPem("--tls-key", credentials.tls_key);
      if (!key.ok()) return key.status();
      ssl.pem_cert_chain = *std::move(cert);
      ssl.pem_private_key = *std::move(key);
    }
    transport = grpc::SslCredentials(ssl);
  }
  if (credentials.token.empty()) {
    return grpc::CreateCustomChannel(target, transport, CoordinatorChannelArgs());
  }
  for (const char c : credentials.token) {
    // A header value: printable ASCII without spaces (hex and base64 tokens qualify).
    if (c <= ' ' || c > '~') {
      return absl::InvalidArgumentError(
          "--token: only printable characters without spaces may be sent in a header");
    }
  }
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> factories;
  factories.push_back(std::make_unique<BearerInterceptorFactory>(credentials.token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      target, transport, CoordinatorChannelArgs(), std::move(factories));
}

std::shared_ptr<grpc::Channel> MakeCoordinatorChannel(const std::string& target) {
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(),
                                   CoordinatorChannelArgs());
}

bool IsRetryable(int grpc_code) {
  return grpc_code == grpc::StatusCode::UNAVAILABLE ||
         grpc_code == grpc::StatusCode::DEADLINE_EXCEEDED ||
         grpc_code == grpc::StatusCode::RESOURCE_EXHAUSTED;
}

}  // namespace latchkey
