#include "server/coordinator_flags.h"

#include <algorithm>
#include <iostream>
#include <memory>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/cli_checks.h"
#include "server/security.h"

namespace latchkey {
namespace {

bool ParsePortRange(const std::string& text, int* first, int* last) {
  std::vector<std::string> parts = absl::StrSplit(text, '-');
  return parts.size() == 2 && absl::SimpleAtoi(parts[0], first) && absl::SimpleAtoi(parts[1], last);
}

void LogToStderr(const std::string& line) {
  std::cerr << absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ ", absl::Now(), absl::UTCTimeZone()) << line
            << "\n";
}

absl::Status Refused(absl::string_view message) { return absl::FailedPreconditionError(message); }

// The gRPC port's TLS material and tokens, each file read and checked here, before the database
// is touched. Refusals are FAILED_PRECONDITION naming the flag.
absl::Status ReadSecurity(const CoordinatorFlags& f, ServerOptions* server) {
  if (f.tls_cert.empty() != f.tls_key.empty()) {
    return Refused("--tls-cert and --tls-key go together");
  }
  if (!f.tls_client_ca.empty() && f.tls_cert.empty()) {
    return Refused("--tls-client-ca needs --tls-cert");
  }
  if (!f.tls_cert.empty()) {
    auto cert = ReadPemFile("--tls-cert", f.tls_cert, "cert");
    if (!cert.ok()) return Refused(cert.status().message());
    auto key = ReadPemFile("--tls-key", f.tls_key, "key");
    if (!key.ok()) return Refused(key.status().message());
    if (!KeyMatchesCert(*cert, *key)) {
      return Refused("--tls-key " + f.tls_key + ": not the private key of --tls-cert " +
                     f.tls_cert);
    }
    server->tls_cert_pem = *cert;
    server->tls_key_pem = *key;
    if (!f.tls_client_ca.empty()) {
      auto ca = ReadPemFile("--tls-client-ca", f.tls_client_ca, "cert");
      if (!ca.ok()) return Refused(ca.status().message());
      server->tls_client_ca_pem = *ca;
    }
  }
  if (!f.auth_tokens.empty()) {
    auto table = TokenTable::Load(f.auth_tokens);
    if (!table.ok()) return Refused(table.status().message());
    if (table->size() == 0) return Refused("--auth-tokens " + f.auth_tokens + ": no tokens");
    server->auth_tokens = std::make_shared<TokenTable>(*std::move(table));
  } else if (!IsLoopbackListen(f.listen) && !f.allow_unauthenticated) {
    return Refused("--listen " + f.listen +
                   " is not loopback and --auth-tokens is not given: anyone who reaches the port "
                   "could submit and cancel jobs; give --auth-tokens FILE, or "
                   "--allow-unauthenticated to run open anyway");
  }
  return absl::OkStatus();
}

}  // namespace

// The order here is --help's order.
void AddCoordinatorFlags(CLI::App& app, CoordinatorFlags* f) {
  app.add_option("--max-model-parameters", f->max_model_parameters,
                 "largest model a spec may describe, in parameters")
      ->check(cli::Positive())
      ->capture_default_str();
  app.add_option("--data-root", f->data_roots,
                 "folder every path a spec names must lie in (repeatable; none: unconfined)")
      ->check(CLI::ExistingDirectory);
  app.add_option("--listen", f->listen, "gRPC address HOST:PORT (port 0: any free port)")
      ->check(cli::HostPort())
      ->envname("LATCHKEY_LISTEN")
      ->capture_default_str();
  app.add_option("--db", f->db, "SQLite database file (created if missing)")
      ->envname("LATCHKEY_DB")
      ->required();
  app.add_option("--db-sync", f->db_sync,
                 "normal: survives a process crash; full: also power loss (fsync per commit)")
      ->check(CLI::IsMember({"normal", "full"}))
      ->capture_default_str();
  app.add_option("--metrics-port", f->metrics_port,
                 "Prometheus /metrics port (0: any free port, -1: off)")
      ->check(cli::Port(-1))
      ->envname("LATCHKEY_METRICS_PORT")
      ->capture_default_str();
  app.add_option("--metrics-host", f->metrics_host, "address the metrics endpoint binds")
      ->envname("LATCHKEY_METRICS_HOST")
      ->capture_default_str();
  app.add_option("--latch-lookahead", f->lookahead,
                 "windows published beyond the slowest rank's current one")
      ->check(cli::NonNegative())
      ->capture_default_str();
  app.add_option("--liveness-timeout", f->liveness_s,
                 "seconds a worker may go unseen before its rank counts as lost: the job "
                 "recovers in a new attempt (up to latchkey.max_restarts), then fails")
      ->check(cli::Positive())
      ->capture_default_str();
  app.add_option("--heartbeat-interval", f->heartbeat_s,
                 "seconds between worker heartbeats (default: 1, at most liveness timeout / 3)")
      ->check(cli::NonNegative());
  app.add_option("--job-heartbeats-per-second", f->job_heartbeats_per_second,
                 "the most heartbeats a second one job's ranks send together: a larger job is "
                 "told a longer interval, at most liveness timeout / 3 (0: no bound)")
      ->check(cli::NonNegative())
      ->capture_default_str();
  app.add_option("--rendezvous-ports", f->rendezvous_ports,
                 "FIRST-LAST: ports handed to jobs whose submitter names none")
      ->capture_default_str();
  app.add_option("--port-file", f->port_file,
                 "write {\"grpc_port\":N,\"metrics_port\":M} here once serving");
  app.add_option("--shutdown-grace", f->grace_s, "seconds in-flight calls get on SIGTERM")
      ->check(cli::NonNegative())
      ->capture_default_str();
  app.add_flag("--cancel-on-shutdown", f->cancel_on_shutdown,
               "on SIGTERM/SIGINT/SIGHUP, cancel every job not yet ended before stopping (for "
               "a coordinator whose jobs end with it, as latchkey up's)");
  app.add_option("--tls-cert", f->tls_cert, "PEM certificate (chain) the gRPC port serves TLS with")
      ->envname("LATCHKEY_SERVER_TLS_CERT");
  app.add_option("--tls-key", f->tls_key, "PEM private key of --tls-cert")
      ->envname("LATCHKEY_SERVER_TLS_KEY");
  app.add_option("--tls-client-ca", f->tls_client_ca,
                 "PEM CA: require and verify a client certificate signed by it (mTLS)")
      ->envname("LATCHKEY_SERVER_TLS_CLIENT_CA");
  app.add_option("--auth-tokens", f->auth_tokens,
                 "role tokens, lines `ROLE NAME SHA256HEX` (docs/protocol.md, Security)")
      ->envname("LATCHKEY_AUTH_TOKENS");
  app.add_flag("--allow-unauthenticated", f->allow_unauthenticated,
               "serve a non-loopback --listen without --auth-tokens");
  app.add_option("--max-calls-per-peer", f->max_calls_per_peer,
                 "in-flight calls and streams one peer host may hold; 0: max(64, 4 x the live "
                 "jobs' ranks + 16)")
      ->check(cli::NonNegative())
      ->capture_default_str();
  app.add_option("--max-message-mib", f->max_message_mib, "largest request accepted, MiB")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
}

// The checks run in this order, and the warnings are logged between them, as a user has
// always seen them.
absl::StatusOr<CoordinatorProcessOptions> FromFlags(const CoordinatorFlags& f) {
  if (f.db == ":memory:" || f.db.empty()) {
    return absl::InvalidArgumentError(
        "--db: needs a file (an in-memory database loses every job and latch on exit; it is for "
        "tests)");
  }
  CoordinatorProcessOptions o;
  o.db = f.db;
  o.db_sync = f.db_sync == "full" ? SqliteSync::kFull : SqliteSync::kNormal;
  o.core.latch_lookahead = f.lookahead;
  o.core.spec_limits.max_model_parameters = static_cast<int64_t>(f.max_model_parameters);
  o.core.spec_limits.data_roots = f.data_roots;
  o.core.log = LogToStderr;
  if (f.data_roots.empty()) {
    o.core.log("warning: no --data-root: the paths specs name are unconfined");
  }
  o.core.liveness_timeout = absl::Seconds(f.liveness_s);
  o.core.job_heartbeats_per_second = f.job_heartbeats_per_second;
  o.core.heartbeat_interval =
      f.heartbeat_s > 0
          ? absl::Seconds(f.heartbeat_s)
          : std::min(absl::FromChrono(kDefaultHeartbeatInterval), o.core.liveness_timeout / 3);
  if (!ParsePortRange(f.rendezvous_ports, &o.core.rendezvous_port_first,
                      &o.core.rendezvous_port_last)) {
    return absl::InvalidArgumentError("--rendezvous-ports: expected FIRST-LAST, got " +
                                      f.rendezvous_ports);
  }

  o.server.listen = f.listen;
  o.server.max_calls_per_peer = f.max_calls_per_peer;
  o.server.max_receive_message_bytes = f.max_message_mib << 20;
  o.server.log = o.core.log;
  if (absl::Status st = ReadSecurity(f, &o.server); !st.ok()) return st;
  if (o.server.auth_tokens == nullptr) {
    o.core.log("warning: no --auth-tokens: JobService is open to every caller");
  }
  o.metrics_port = f.metrics_port;
  o.metrics_host = f.metrics_host;
  o.tls_cert_file = f.tls_cert;
  o.tls_key_file = f.tls_key;
  o.port_file = f.port_file;
  o.shutdown_grace = absl::Seconds(f.grace_s);
  o.cancel_on_shutdown = f.cancel_on_shutdown;
  return o;
}

}  // namespace latchkey
