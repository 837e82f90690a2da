// The one way the client side opens a channel to the coordinator: keepalive on (a dead
// coordinator is noticed), a short reconnect backoff (a restarted one is found again quickly).
#ifndef LATCHKEY_PROTO_CHANNEL_H_
#define LATCHKEY_PROTO_CHANNEL_H_

#include <grpcpp/channel.h>

#include <memory>
#include <string>

namespace latchkey {

std::shared_ptr<grpc::Channel> MakeCoordinatorChannel(const std::string& target);

// Whether a failed call may succeed if repeated later (the coordinator restarting or busy).
bool IsRetryable(int grpc_code);

}  // namespace latchkey

#endif  // LATCHKEY_PROTO_CHANNEL_H_
