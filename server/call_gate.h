// The one guard every JobService and WorkerService call passes, in the manner of a server
// middleware (Arrow Flight's server_middleware.h): a per-peer slot around the call, the call's
// body, its absl::Status put on the wire (proto/grpc_status.h, with any error details), and a
// log line for each refused call.
//
//   return gate_.Run(*ctx, "GetJob", [&]() -> absl::Status {   // unary or synchronous stream
//     LK_ASSIGN_OR_RETURN(Principal who, Authorize(...));       // JobService: the role token
//     ...
//   });
//
// Admit takes a per-peer slot (RESOURCE_EXHAUSTED when the peer has too many open; a stream
// keeps its slot until it is done); Authenticate reads `authorization: Bearer TOKEN`
// (UNAUTHENTICATED when missing or unknown). A refusal (the slot's RESOURCE_EXHAUSTED, or
// UNAUTHENTICATED / PERMISSION_DENIED from the body: a role token, or a join token the core
// checked) is logged once: peer, RPC, reason, never a token.
//
// Thread-safety: immutable after construction; the limiter is thread-safe.
#ifndef LATCHKEY_SERVER_CALL_GATE_H_
#define LATCHKEY_SERVER_CALL_GATE_H_

#include <grpcpp/server_context.h>
#include <grpcpp/support/status.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/security.h"

namespace latchkey {

struct CallGate {
  std::shared_ptr<const TokenTable> tokens;  // null: JobService is open (an anonymous admin)
  PeerCallLimiter* limiter = nullptr;        // null: no cap
  std::function<void(const std::string&)> log;

  // Admit, `body`, Answer: one call that ends when its handler returns.
  grpc::Status Run(const grpc::ServerContextBase& ctx, const char* method,
                   const std::function<absl::Status()>& body) const;

  // The peer host a slot is counted under ("127.0.0.1"; the whole peer string otherwise).
  static std::string PeerKey(const grpc::ServerContextBase& ctx);
  // A slot for this call, held until it is destroyed. RESOURCE_EXHAUSTED (logged) when the peer
  // is at its cap.
  absl::StatusOr<std::unique_ptr<PeerCallLimiter::Slot>> Admit(const grpc::ServerContextBase& ctx,
                                                               const char* method) const;
  // The caller's role (JobService); an open gate makes everyone an anonymous admin.
  absl::StatusOr<Principal> Authenticate(const grpc::ServerContextBase& ctx) const;
  // `status` on the wire, logged first when it is a refusal.
  grpc::Status Answer(const grpc::ServerContextBase& ctx, const char* method,
                      const absl::Status& status) const;
};

}  // namespace latchkey

#endif  // LATCHKEY_SERVER_CALL_GATE_H_
