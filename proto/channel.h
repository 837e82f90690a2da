// The one way the client side opens a channel to the coordinator: keepalive on (a dead
// coordinator is noticed), a short reconnect backoff (a restarted one is found again quickly),
// TLS when a CA is given (with a client certificate for mTLS), and a bearer token on every call
// when one is given.
#ifndef LATCHKEY_PROTO_CHANNEL_H_
#define LATCHKEY_PROTO_CHANNEL_H_

#include <grpcpp/channel.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/channel_credentials.h"

namespace latchkey {

// The channel for `credentials` (common/channel_credentials.h). INVALID_ARGUMENT naming the
// field (--tls-ca, --tls-cert, --tls-key, --token) when a file cannot be read or the token
// cannot travel in a header.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeCoordinatorChannel(
    const std::string& target, const ChannelCredentials& credentials);
// Plaintext, no token.
std::shared_ptr<grpc::Channel> MakeCoordinatorChannel(const std::string& target);

// Whether a failed call may succeed if repeated later (the coordinator restarting or busy).
bool IsRetryable(int grpc_code);

}  // namespace latchkey

#endif  // LATCHKEY_PROTO_CHANNEL_H_
