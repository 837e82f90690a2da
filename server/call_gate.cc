#include "server/call_gate.h"

#include "absl/strings/str_cat.h"
#include "proto/grpc_status.h"
#include "server/worker_service.h"

namespace latchkey {

std::string CallGate::PeerKey(const grpc::ServerContextBase& ctx) {
  const std::string peer = ctx.peer();
  std::string host = WorkerServiceImpl::PeerHost(peer);
  return host.empty() ? peer : host;
}

std::unique_ptr<PeerCallLimiter::Slot> CallGate::Admit(const grpc::ServerContextBase& ctx) const {
  return std::make_unique<PeerCallLimiter::Slot>(limiter, limiter ? PeerKey(ctx) : "");
}

grpc::Status CallGate::ExhaustedStatus() const {
  return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                      absl::StrCat("this peer already has ", limiter ? limiter->limit() : 0,
                                   " calls or streams open (--max-calls-per-peer)"));
}

absl::StatusOr<Principal> CallGate::Authenticate(const grpc::ServerContextBase& ctx) const {
  if (!tokens) return Principal{Role::kAdmin, ""};
  const auto& md = ctx.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) {
    return absl::UnauthenticatedError(
        "no token: send `authorization: Bearer TOKEN` (latchkey --token / LATCHKEY_TOKEN)");
  }
  std::optional<std::string> token =
      BearerToken(absl::string_view(it->second.data(), it->second.size()));
  if (!token) return absl::UnauthenticatedError("authorization: expected `Bearer TOKEN`");
  std::optional<Principal> who = tokens->Find(*token);
  if (!who) return absl::UnauthenticatedError("unknown token (not in --auth-tokens)");
  return *who;
}

grpc::Status CallGate::Refuse(const grpc::ServerContextBase& ctx, const char* method,
                              const grpc::Status& status) const {
  if (log) {
    log(absl::StrCat("refused ", method, " from ", ctx.peer(), ": ",
                     absl::StatusCodeToString(FromGrpcStatus(status).code()), ": ",
                     status.error_message()));
  }
  return status;
}

}  // namespace latchkey
