// What an UNAVAILABLE from a coordinator call means for the user, from gRPC's message: one
// explanation shared by the CLI (client/job_client.cc) and the worker (worker/session), so
// both say the same thing in the same words.
//
//   refused connection       "nothing is listening at ADDR: is the coordinator running?"
//   TLS client, handshake    "the TLS handshake with ADDR failed: does --tls-ca name the CA that
//                             signed the coordinator's certificate, and does it serve TLS?"
//   plaintext client, closed "ADDR closed the plaintext connection: if the coordinator serves
//                             TLS, pass --tls-ca (LATCHKEY_TLS_CA)"
//   anything else            no hint
//
// Thread-safety: pure functions.
#ifndef LATCHKEY_COMMON_CONNECTION_HINT_H_
#define LATCHKEY_COMMON_CONNECTION_HINT_H_

#include <string>

#include "absl/strings/string_view.h"

namespace latchkey {

enum class ConnectionProblem {
  kNone,          // no diagnosis: the message stands alone
  kRefused,       // nothing listens at the address
  kTlsHandshake,  // a TLS client whose handshake failed (wrong CA, or a plaintext server)
  kTlsExpected,   // a plaintext client whose connection the server closed (a TLS server)
};

// The diagnosis of gRPC's UNAVAILABLE message `grpc_message` on a channel to a coordinator.
ConnectionProblem DiagnoseConnection(absl::string_view grpc_message, bool tls);

// The hint for `problem` at `address` (the table above); "" for kNone.
std::string ConnectionHint(ConnectionProblem problem, absl::string_view address);

// A TLS mismatch no retry can fix (kTlsHandshake, kTlsExpected).
inline bool IsTlsMismatch(ConnectionProblem p) {
  return p == ConnectionProblem::kTlsHandshake || p == ConnectionProblem::kTlsExpected;
}

// "<hint> (<grpc_message>)", or `grpc_message` alone when there is no hint.
std::string ExplainUnavailable(absl::string_view grpc_message, absl::string_view address, bool tls);

}  // namespace latchkey

#endif  // LATCHKEY_COMMON_CONNECTION_HINT_H_
