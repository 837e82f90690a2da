#include "server/call_gate.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/grpc_status.h"
#include "server/worker_service.h"

namespace latchkey {
namespace {

// Credentials refused, by the gate or by the core behind it. RESOURCE_EXHAUSTED is the gate's
// own (Admit logs it): the core's (a full rendezvous port range) is an answer, not a refusal.
bool IsRefusal(const absl::Status& st) {
  return st.code() == absl::StatusCode::kUnauthenticated ||
         st.code() == absl::StatusCode::kPermissionDenied;
}

void LogRefusal(const CallGate& gate, const grpc::ServerContextBase& ctx, const char* method,
                const absl::Status& status) {
  if (!gate.log) return;
  gate.log(absl::StrCat("refused ", method, " from ", ctx.peer(), ": ",
                        absl::StatusCodeToString(status.code()), ": ", status.message()));
}

}  // namespace

grpc::Status CallGate::Run(const grpc::ServerContextBase& ctx, const char* method,
                           const std::function<absl::Status()>& body) const {
  auto slot = Admit(ctx, method);
  if (!slot.ok()) return ToGrpcStatus(slot.status());
  return Answer(ctx, method, body());
}

std::string CallGate::PeerKey(const grpc::ServerContextBase& ctx) {
  const std::string peer = ctx.peer();
  std::string host = WorkerServiceImpl::PeerHost(peer);
  return host.empty() ? peer : host;
}

absl::StatusOr<std::unique_ptr<PeerCallLimiter::Slot>> CallGate::Admit(
    const grpc::ServerContextBase& ctx, const char* method) const {
  auto slot = std::make_unique<PeerCallLimiter::Slot>(limiter, limiter ? PeerKey(ctx) : "");
  if (slot->ok()) return slot;
  absl::Status exhausted = absl::ResourceExhaustedError(
      absl::StrCat("this peer already has ", limiter ? limiter->limit() : 0,
                   " calls or streams open (--max-calls-per-peer)"));
  LogRefusal(*this, ctx, method, exhausted);
  return exhausted;
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

grpc::Status CallGate::Answer(const grpc::ServerContextBase& ctx, const char* method,
                              const absl::Status& status) const {
  if (IsRefusal(status)) LogRefusal(*this, ctx, method, status);
  return ToGrpcStatus(status);
}

}  // namespace latchkey
