#include "proto/channel.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

namespace latchkey {

std::shared_ptr<grpc::Channel> MakeCoordinatorChannel(const std::string& target) {
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
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

bool IsRetryable(int grpc_code) {
  return grpc_code == grpc::StatusCode::UNAVAILABLE ||
         grpc_code == grpc::StatusCode::DEADLINE_EXCEEDED ||
         grpc_code == grpc::StatusCode::RESOURCE_EXHAUSTED;
}

}  // namespace latchkey
