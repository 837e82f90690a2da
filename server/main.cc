// latchkey-coordinator: the control plane. See README/--help for the flags.
//
//   latchkey-coordinator --listen 0.0.0.0:50051 --db /var/lib/latchkey/coord.db
//     --metrics-port 9464 --auth-tokens /etc/latchkey/tokens --tls-cert cert.pem --tls-key key.pem
//
// Exit codes: 0 after SIGTERM/SIGINT and a clean shutdown; 2 bad flags; 1 cannot start
// (database, ports).
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/cli_checks.h"
#include "common/metrics_endpoint.h"
#include "common/timeouts.h"
#include "server/coordinator.h"
#include "server/metrics.h"
#include "server/security.h"
#include "server/server.h"
#include "server/sqlite_store.h"
#include "server/status_page.h"

namespace {

bool ParsePortRange(const std::string& text, int* first, int* last) {
  std::vector<std::string> parts = absl::StrSplit(text, '-');
  return parts.size() == 2 && absl::SimpleAtoi(parts[0], first) && absl::SimpleAtoi(parts[1], last);
}

// Written after every port is bound, so a launcher or test can wait for it and read the ports.
bool WritePortFile(const std::string& path, int grpc_port, int metrics_port) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << "{\"grpc_port\": " << grpc_port << ", \"metrics_port\": " << metrics_port << "}\n";
    if (!out) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

int Fail(const std::string& message) {
  std::cerr << "latchkey-coordinator: " << message << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"latchkey-coordinator: jobs, rank assignment and the window latch authority"};
  std::string listen = "0.0.0.0:" + std::to_string(latchkey::kDefaultCoordinatorPort);
  std::string db;
  std::string db_sync = "normal";
  int metrics_port = 9464;
  std::string metrics_host = "0.0.0.0";
  int lookahead = 2;
  double liveness_s = static_cast<double>(latchkey::kDefaultLivenessTimeout.count());
  double heartbeat_s = 0;
  std::string rendezvous_ports = "29500-29999";
  std::string port_file;
  double max_model_parameters = 2e10;
  std::vector<std::string> data_roots;
  app.add_option("--max-model-parameters", max_model_parameters,
                 "largest model a spec may describe, in parameters")
      ->check(latchkey::cli::Positive())
      ->capture_default_str();
  app.add_option("--data-root", data_roots,
                 "folder every path a spec names must lie in (repeatable; none: unconfined)")
      ->check(CLI::ExistingDirectory);
  double grace_s = 5;
  std::string tls_cert, tls_key, tls_client_ca, auth_tokens;
  bool allow_unauthenticated = false;
  int max_calls_per_peer = 0;
  int max_message_mib = 1;
  app.add_option("--listen", listen, "gRPC address HOST:PORT (port 0: any free port)")
      ->check(latchkey::cli::HostPort())
      ->envname("LATCHKEY_LISTEN")
      ->capture_default_str();
  app.add_option("--db", db, "SQLite database file (created if missing)")
      ->envname("LATCHKEY_DB")
      ->required();
  app.add_option("--db-sync", db_sync,
                 "normal: survives a process crash; full: also power loss (fsync per commit)")
      ->check(CLI::IsMember({"normal", "full"}))
      ->capture_default_str();
  app.add_option("--metrics-port", metrics_port,
                 "Prometheus /metrics port (0: any free port, -1: off)")
      ->check(latchkey::cli::Port(-1))
      ->envname("LATCHKEY_METRICS_PORT")
      ->capture_default_str();
  app.add_option("--metrics-host", metrics_host, "address the metrics endpoint binds")
      ->envname("LATCHKEY_METRICS_HOST")
      ->capture_default_str();
  app.add_option("--latch-lookahead", lookahead,
                 "windows published beyond the slowest rank's current one")
      ->check(latchkey::cli::NonNegative())
      ->capture_default_str();
  app.add_option("--liveness-timeout", liveness_s,
                 "seconds a worker may go unseen before its job fails")
      ->check(latchkey::cli::Positive())
      ->capture_default_str();
  app.add_option("--heartbeat-interval", heartbeat_s,
                 "seconds between worker heartbeats (default: 1, at most liveness timeout / 3)")
      ->check(latchkey::cli::NonNegative());
  app.add_option("--rendezvous-ports", rendezvous_ports,
                 "FIRST-LAST: ports handed to jobs whose submitter names none")
      ->capture_default_str();
  app.add_option("--port-file", port_file,
                 "write {\"grpc_port\":N,\"metrics_port\":M} here once serving");
  app.add_option("--shutdown-grace", grace_s, "seconds in-flight calls get on SIGTERM")
      ->check(latchkey::cli::NonNegative())
      ->capture_default_str();
  app.add_option("--tls-cert", tls_cert, "PEM certificate (chain) the gRPC port serves TLS with")
      ->envname("LATCHKEY_SERVER_TLS_CERT");
  app.add_option("--tls-key", tls_key, "PEM private key of --tls-cert")
      ->envname("LATCHKEY_SERVER_TLS_KEY");
  app.add_option("--tls-client-ca", tls_client_ca,
                 "PEM CA: require and verify a client certificate signed by it (mTLS)")
      ->envname("LATCHKEY_SERVER_TLS_CLIENT_CA");
  app.add_option("--auth-tokens", auth_tokens,
                 "role tokens, lines `ROLE NAME SHA256HEX` (docs/protocol.md, Security)")
      ->envname("LATCHKEY_AUTH_TOKENS");
  app.add_flag("--allow-unauthenticated", allow_unauthenticated,
               "serve a non-loopback --listen without --auth-tokens");
  app.add_option("--max-calls-per-peer", max_calls_per_peer,
                 "in-flight calls and streams one peer host may hold; 0: max(64, 4 x the live "
                 "jobs' ranks + 16)")
      ->check(latchkey::cli::NonNegative())
      ->capture_default_str();
  app.add_option("--max-message-mib", max_message_mib, "largest request accepted, MiB")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }

  // Debian's abseil is built with Mutex deadlock detection on; with a mutex per latch stream its
  // bookkeeping showed up in profiles. The lock order is documented where the locks live.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);

  if (db == ":memory:" || db.empty()) {
    std::cerr << "latchkey-coordinator: --db: needs a file (an in-memory database loses every job "
                 "and latch on exit; it is for tests)\n";
    return 2;
  }

  latchkey::CoordinatorOptions options;
  options.latch_lookahead = lookahead;
  options.spec_limits.max_model_parameters = static_cast<int64_t>(max_model_parameters);
  options.spec_limits.data_roots = data_roots;
  options.log = [](const std::string& line) {
    std::cerr << absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ ", absl::Now(), absl::UTCTimeZone()) << line
              << "\n";
  };
  if (data_roots.empty()) {
    options.log("warning: no --data-root: the paths specs name are unconfined");
  }
  options.liveness_timeout = absl::Seconds(liveness_s);
  options.heartbeat_interval = heartbeat_s > 0
                                   ? absl::Seconds(heartbeat_s)
                                   : std::min(absl::FromChrono(latchkey::kDefaultHeartbeatInterval),
                                              options.liveness_timeout / 3);
  if (!ParsePortRange(rendezvous_ports, &options.rendezvous_port_first,
                      &options.rendezvous_port_last)) {
    std::cerr << "latchkey-coordinator: --rendezvous-ports: expected FIRST-LAST, got "
              << rendezvous_ports << "\n";
    return 2;
  }

  // Every security flag is checked before the database is touched.
  latchkey::ServerOptions server_options;
  server_options.listen = listen;
  server_options.max_calls_per_peer = max_calls_per_peer;
  server_options.max_receive_message_bytes = max_message_mib << 20;
  server_options.log = options.log;
  if (tls_cert.empty() != tls_key.empty()) return Fail("--tls-cert and --tls-key go together");
  if (!tls_client_ca.empty() && tls_cert.empty()) return Fail("--tls-client-ca needs --tls-cert");
  if (!tls_cert.empty()) {
    auto cert = latchkey::ReadPemFile("--tls-cert", tls_cert, "cert");
    if (!cert.ok()) return Fail(std::string(cert.status().message()));
    auto key = latchkey::ReadPemFile("--tls-key", tls_key, "key");
    if (!key.ok()) return Fail(std::string(key.status().message()));
    if (!latchkey::KeyMatchesCert(*cert, *key)) {
      return Fail("--tls-key " + tls_key + ": not the private key of --tls-cert " + tls_cert);
    }
    server_options.tls_cert_pem = *cert;
    server_options.tls_key_pem = *key;
    if (!tls_client_ca.empty()) {
      auto ca = latchkey::ReadPemFile("--tls-client-ca", tls_client_ca, "cert");
      if (!ca.ok()) return Fail(std::string(ca.status().message()));
      server_options.tls_client_ca_pem = *ca;
    }
  }
  if (!auth_tokens.empty()) {
    auto table = latchkey::TokenTable::Load(auth_tokens);
    if (!table.ok()) return Fail(std::string(table.status().message()));
    if (table->size() == 0) return Fail("--auth-tokens " + auth_tokens + ": no tokens");
    server_options.auth_tokens = std::make_shared<latchkey::TokenTable>(*std::move(table));
  } else if (!latchkey::IsLoopbackListen(listen) && !allow_unauthenticated) {
    return Fail("--listen " + listen +
                " is not loopback and --auth-tokens is not given: anyone who reaches the port "
                "could submit and cancel jobs; give --auth-tokens FILE, or "
                "--allow-unauthenticated to run open anyway");
  }
  if (server_options.auth_tokens == nullptr) {
    options.log("warning: no --auth-tokens: JobService is open to every caller");
  }

  // Block the stop signals in every thread; the main thread takes them with sigwait.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  auto store = latchkey::SqliteStore::Open(
      db, db_sync == "full" ? latchkey::SqliteSync::kFull : latchkey::SqliteSync::kNormal);
  if (!store.ok()) return Fail(std::string(store.status().message()));
  latchkey::CoordinatorMetrics metrics;
  auto core = latchkey::Coordinator::Create(*std::move(store), options, &metrics);
  if (!core.ok()) return Fail(std::string(core.status().message()));
  (*core)->StartLivenessChecker();

  // The HTTP port: /metrics (never behind a token) and the status page, which needs a token
  // when auth is on and the port binds a non-loopback address; HTTPS with the gRPC certificate.
  std::unique_ptr<latchkey::StatusPage> status_page;  // outlives the endpoint serving it
  std::unique_ptr<latchkey::MetricsEndpoint> endpoint;
  if (metrics_port >= 0) {
    const std::string http_addr =
        (metrics_host.find(':') != std::string::npos ? "[" + metrics_host + "]" : metrics_host) +
        ":" + std::to_string(metrics_port);
    status_page = std::make_unique<latchkey::StatusPage>(
        core->get(), latchkey::IsLoopbackListen(http_addr) ? nullptr : server_options.auth_tokens);
    latchkey::HttpEndpointOptions http;
    http.host = metrics_host;
    http.port = metrics_port;
    http.server_name = "latchkey-coordinator";
    http.render = [&metrics] { return metrics.Serialize(); };
    http.routes = status_page->Routes();
    http.tls_cert_file = tls_cert;
    http.tls_key_file = tls_key;
    auto ep = latchkey::MetricsEndpoint::Start(std::move(http));
    if (!ep.ok()) return Fail(std::string(ep.status().message()));
    endpoint = *std::move(ep);
  }
  auto server = latchkey::CoordinatorServer::Start(core->get(), server_options);
  if (!server.ok()) return Fail(std::string(server.status().message()));
  const int bound_metrics = endpoint ? endpoint->port() : -1;
  std::cerr << "latchkey-coordinator: serving gRPC on port " << (*server)->port() << ", metrics on "
            << (endpoint ? std::to_string(bound_metrics) + " (" + endpoint->scheme() +
                               ", status page at /)"
                         : "(off)")
            << ", db " << db << std::endl;
  if (!port_file.empty() && !WritePortFile(port_file, (*server)->port(), bound_metrics)) {
    return Fail("--port-file " + port_file + ": cannot write");
  }

  int sig = 0;
  sigwait(&stop_signals, &sig);
  std::cerr << "latchkey-coordinator: signal " << sig << ", shutting down" << std::endl;
  (*server)->Shutdown(absl::Seconds(grace_s));
  (*server)->Wait();
  server->reset();
  endpoint.reset();  // the status page's handlers hold the core too
  core->reset();     // after the server: handlers hold the core
  return 0;
}
