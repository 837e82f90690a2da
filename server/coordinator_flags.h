// latchkey-coordinator's command line: the flag table (every flag's name, default, help text
// and LATCHKEY_* environment fallback, in --help's order) and what the process runs with,
// derived from the flags and checked before anything is opened or bound.
//
//   CLI::App app{...};
//   CoordinatorFlags flags;
//   AddCoordinatorFlags(app, &flags);
//   app.parse(argc, argv);
//   absl::StatusOr<CoordinatorProcessOptions> options = FromFlags(flags);
//
// FromFlags refuses with INVALID_ARGUMENT for a usage error (exit 2: --db, --rendezvous-ports)
// and FAILED_PRECONDITION for a setting that cannot be served (exit 1: the TLS files, the token
// file, an open non-loopback --listen); each message names its flag. It reads the TLS and token
// files and logs its warnings through the options' log (stderr, timestamped).
// Thread-safety: free functions on values.
#ifndef LATCHKEY_SERVER_COORDINATOR_FLAGS_H_
#define LATCHKEY_SERVER_COORDINATOR_FLAGS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/timeouts.h"
#include "server/coordinator.h"
#include "server/server.h"
#include "server/sqlite_store.h"

namespace CLI {
class App;
}  // namespace CLI

namespace latchkey {

// The flags' values as given (or their defaults).
struct CoordinatorFlags {
  std::string listen = "0.0.0.0:" + std::to_string(kDefaultCoordinatorPort);
  std::string db;
  std::string db_sync = "normal";
  int metrics_port = 9464;
  std::string metrics_host = "0.0.0.0";
  int lookahead = 2;
  double liveness_s = static_cast<double>(kDefaultLivenessTimeout.count());
  double heartbeat_s = 0;  // 0: the default interval (see FromFlags)
  std::string rendezvous_ports = "29500-29999";
  std::string port_file;
  double max_model_parameters = 2e10;
  std::vector<std::string> data_roots;
  double grace_s = 5;
  bool cancel_on_shutdown = false;
  std::string tls_cert, tls_key, tls_client_ca, auth_tokens;
  bool allow_unauthenticated = false;
  int job_heartbeats_per_second = 4096;
  int max_calls_per_peer = 0;
  int max_message_mib = 1;
};

// Registers every flag on `app`, writing into `*flags` (which must outlive parsing).
void AddCoordinatorFlags(CLI::App& app, CoordinatorFlags* flags);

// What the process serves with.
struct CoordinatorProcessOptions {
  std::string db;
  SqliteSync db_sync = SqliteSync::kNormal;
  CoordinatorOptions core;  // its log: stderr, timestamped
  ServerOptions server;     // the gRPC port: PEM contents and the token table, read
  int metrics_port = -1;    // the HTTP port (-1: off)
  std::string metrics_host;
  std::string tls_cert_file, tls_key_file;  // the HTTP port serves HTTPS with these
  std::string port_file;                    // empty: none
  absl::Duration shutdown_grace;
  // On a stop signal, every job not yet ended is cancelled before the server stops (a
  // coordinator whose jobs end with it: `latchkey up`'s).
  bool cancel_on_shutdown = false;
};

absl::StatusOr<CoordinatorProcessOptions> FromFlags(const CoordinatorFlags& flags);

}  // namespace latchkey

#endif  // LATCHKEY_SERVER_COORDINATOR_FLAGS_H_
