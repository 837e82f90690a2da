// How a client proves who it is to the coordinator and checks whom it talks to: four strings,
// with no gRPC in sight, so that the worker's headers (worker_session.h, coordinated.h) can
// carry them without including grpcpp. proto/channel.h turns them into a channel.
#ifndef LATCHKEY_COMMON_CHANNEL_CREDENTIALS_H_
#define LATCHKEY_COMMON_CHANNEL_CREDENTIALS_H_

#include <string>

namespace latchkey {

// All empty: plaintext, no token.
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

}  // namespace latchkey

#endif  // LATCHKEY_COMMON_CHANNEL_CREDENTIALS_H_
