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

namespace latchkey {

// How a client proves who it is and checks whom it talks to. All empty: plaintext, no token.
struct ChannelCredentials {
  // Sent as `authorization: Bearer TOKEN` on every call (a role token of --auth-tokens).
  std::string token{};
  // PEM file of the CA that signed the coordinator's certificate: the channel uses TLS.
  // Empty: plaintext.
  std::string tls_ca{};
  // PEM files of a client certificate and its key, for a coordinator that requires client
  // certificates (--tls-client-ca). Both or neither; they need tls_ca.
  std::string tls_cert{};
  std::string tls_key{};

  bool tls() const { return !tls_ca.empty(); }
};

// INVALID_ARGUMENT naming the field (--tls-ca, --tls-cert, --tls-key, --token) when a file
// cannot be read or the token cannot travel in a header.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeCoordinatorChannel(
    const std::string& target, const ChannelCredentials& credentials);
// Plaintext, no token.
std::shared_ptr<grpc::Channel> MakeCoordinatorChannel(const std::string& target);

// Whether a failed call may succeed if repeated later (the coordinator restarting or busy).
bool IsRetryable(int grpc_code);

}  // namespace latchkey

#endif  // LATCHKEY_PROTO_CHANNEL_H_
