#include "common/connection_hint.h"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace latchkey {
namespace {

// gRPC reports a refused connection, a failed TLS handshake and a closed socket all as
// UNAVAILABLE with no detail but its transport's words: the text is the only signal there is.
// Only the hint shown to the user (and a worker's giving up on a TLS mismatch) depends on it;
// the status code stays gRPC's.
bool Contains(absl::string_view text, absl::string_view lowercase_word) {
  return absl::AsciiStrToLower(text).find(std::string(lowercase_word)) != std::string::npos;
}

}  // namespace

ConnectionProblem DiagnoseConnection(absl::string_view grpc_message, bool tls) {
  // gRPC's own words (1.5x): "Failed to connect to remote host: Connection refused",
  // "Ssl handshake failed: SSL_ERROR_SSL: ..." (a TLS client), "Socket closed" (a plaintext
  // client whose bytes a TLS server refused).
  if (Contains(grpc_message, "connection refused")) {
    return ConnectionProblem::kRefused;
  }
  if (tls && (Contains(grpc_message, "handshake") || Contains(grpc_message, "ssl"))) {
    return ConnectionProblem::kTlsHandshake;
  }
  if (!tls && Contains(grpc_message, "socket closed")) {
    return ConnectionProblem::kTlsExpected;
  }
  return ConnectionProblem::kNone;
}

std::string ConnectionHint(ConnectionProblem problem, absl::string_view address) {
  switch (problem) {
    case ConnectionProblem::kRefused:
      return absl::StrCat("nothing is listening at ", address, ": is the coordinator running?");
    case ConnectionProblem::kTlsHandshake:
      return absl::StrCat("the TLS handshake with ", address,
                          " failed: does --tls-ca name the CA that signed the coordinator's "
                          "certificate, and does it serve TLS?");
    case ConnectionProblem::kTlsExpected:
      return absl::StrCat(address,
                          " closed the plaintext connection: if the coordinator serves TLS, pass "
                          "--tls-ca (LATCHKEY_TLS_CA)");
    case ConnectionProblem::kNone:
      break;
  }
  return "";
}

std::string ExplainUnavailable(absl::string_view grpc_message, absl::string_view address,
                               bool tls) {
  const std::string hint = ConnectionHint(DiagnoseConnection(grpc_message, tls), address);
  if (hint.empty()) return std::string(grpc_message);
  return absl::StrCat(hint, " (", grpc_message, ")");
}

}  // namespace latchkey
