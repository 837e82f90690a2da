// CoordinatorServer: the gRPC server of latchkey-coordinator — JobService, WorkerService,
// grpc.health.v1.Health and server reflection on one port.
//
// Lifecycle: Start() binds and serves; Shutdown(grace) marks health NOT_SERVING, shuts the core
// down (streams end with UNAVAILABLE so workers reconnect elsewhere or later), then gives
// in-flight calls `grace` before cancelling them; Wait() returns after Shutdown.
// Thread-safety: Shutdown and Wait may be called from any thread, Shutdown more than once.
#ifndef LATCHKEY_SERVER_SERVER_H_
#define LATCHKEY_SERVER_SERVER_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/timeouts.h"
#include "server/coordinator.h"
#include "server/security.h"

namespace grpc {
class Server;
}  // namespace grpc

namespace latchkey {

class JobServiceImpl;
class WorkerServiceImpl;

struct ServerOptions {
  std::string listen =
      "0.0.0.0:" + std::to_string(kDefaultCoordinatorPort);  // HOST:PORT; port 0 picks a free one
  int max_receive_message_bytes = 1 << 20;                   // every request; specs are far smaller
  int max_send_message_bytes = 16 << 20;  // a page of latches or jobs fits easily
  absl::Duration stream_poll = absl::Milliseconds(200);
  // TLS (PEM contents, not paths). Empty cert: plaintext. A client CA requires and verifies a
  // client certificate on every connection (mTLS).
  std::string tls_cert_pem;
  std::string tls_key_pem;
  std::string tls_client_ca_pem;
  // Role tokens every JobService call must present (docs/protocol.md "Security"); null: none.
  std::shared_ptr<const TokenTable> auth_tokens;
  // In-flight calls and streams per peer host; more are refused with RESOURCE_EXHAUSTED.
  // 0: derived from the live jobs' ranks (PeerCallLimiter).
  int max_calls_per_peer = 0;
  // Refused calls (peer, RPC, reason) are logged here; unset: stderr.
  std::function<void(const std::string&)> log;
};

class CoordinatorServer {
 public:
  // `core` must outlive the server.
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(Coordinator* core,
                                                                  const ServerOptions& options);
  ~CoordinatorServer();  // Shutdown(0) if not yet shut down

  int port() const { return port_; }
  void Shutdown(absl::Duration grace);
  void Wait();

 private:
  CoordinatorServer() = default;

  Coordinator* core_ = nullptr;
  std::unique_ptr<JobServiceImpl> jobs_;
  std::unique_ptr<WorkerServiceImpl> workers_;
  std::unique_ptr<PeerCallLimiter> limiter_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace latchkey

#endif  // LATCHKEY_SERVER_SERVER_H_
