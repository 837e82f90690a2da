// The gRPC side of server/security.h: what every JobService and WorkerService method calls
// first. Admit takes a per-peer slot (RESOURCE_EXHAUSTED when the peer has too many open);
// Authenticate reads `authorization: Bearer TOKEN` (UNAUTHENTICATED when missing or unknown);
// Refuse logs a refused call (peer, RPC, reason; never a token) and returns its status.
// Thread-safety: immutable after construction; the limiter is thread-safe.
#ifndef LATCHKEY_SERVER_CALL_GATE_H_
#define LATCHKEY_SERVER_CALL_GATE_H_

#include <grpcpp/server_context.h>
#include <grpcpp/support/status.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/security.h"

namespace latchkey {

struct CallGate {
  std::shared_ptr<const TokenTable> tokens;  // null: JobService is open (an anonymous admin)
  PeerCallLimiter* limiter = nullptr;        // null: no cap
  std::function<void(const std::string&)> log;

  // The peer host a slot is counted under ("127.0.0.1"; the whole peer string otherwise).
  static std::string PeerKey(const grpc::ServerContextBase& ctx);
  // A slot for this call; when !ok(), return Refuse(..., ExhaustedStatus()).
  std::unique_ptr<PeerCallLimiter::Slot> Admit(const grpc::ServerContextBase& ctx) const;
  grpc::Status ExhaustedStatus() const;
  absl::StatusOr<Principal> Authenticate(const grpc::ServerContextBase& ctx) const;
  grpc::Status Refuse(const grpc::ServerContextBase& ctx, const char* method,
                      const grpc::Status& status) const;
};

}  // namespace latchkey

#endif  // LATCHKEY_SERVER_CALL_GATE_H_
