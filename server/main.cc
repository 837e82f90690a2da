// latchkey-coordinator: the control plane. See README/--help for the flags (a table in
// coordinator_flags.cc).
//
//   latchkey-coordinator --listen 0.0.0.0:50051 --db /var/lib/latchkey/coord.db
//     --metrics-port 9464 --auth-tokens /etc/latchkey/tokens --tls-cert cert.pem --tls-key key.pem
//
// main parses the flags, derives and checks the options (FromFlags), then serves until
// SIGTERM, SIGINT or SIGHUP (a closed terminal). With --cancel-on-shutdown (`latchkey up` passes
// it: its jobs end with it) every job not yet ended is cancelled first, naming the signal, so the
// database says what happened however the run was stopped.
//
// Exit codes: 0 after a stop signal and a clean shutdown; 2 bad flags; 1 cannot start
// (database, ports).
#include <signal.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/synchronization/mutex.h"
#include "common/metrics_endpoint.h"
#include "latchkey_version.h"
#include "server/coordinator.h"
#include "server/coordinator_flags.h"
#include "server/database_lock.h"
#include "server/metrics.h"
#include "server/security.h"
#include "server/server.h"
#include "server/sqlite_store.h"
#include "server/status_page.h"

namespace {

constexpr int kCannotStart = 1;
constexpr int kBadFlags = 2;

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

// Cancels every job not yet ended (the jobs end with this process), in pages.
void CancelLiveJobs(latchkey::Coordinator& core, int sig) {
  const std::string reason = std::string("the coordinator stopped (signal ") + std::to_string(sig) +
                             ", " + strsignal(sig) +
                             ") and --cancel-on-shutdown ends its jobs with it";
  const std::vector<latchkey::JobState> live = {
      latchkey::JobState::kPending, latchkey::JobState::kRunning, latchkey::JobState::kRecovering};
  while (true) {
    const auto jobs = core.ListJobs(live, 1000);
    if (!jobs.ok() || jobs->empty()) return;
    int cancelled = 0;
    for (const latchkey::JobView& j : *jobs) {
      const auto done = core.CancelJob(j.record.job_id, reason);
      if (done.ok()) {
        ++cancelled;
      } else {
        std::cerr << "latchkey-coordinator: cannot cancel " << j.record.job_id << ": "
                  << done.status().message() << std::endl;
      }
    }
    if (cancelled == 0) return;  // what is left cannot be cancelled: do not spin
  }
}

int Fail(absl::string_view message, int exit_code = kCannotStart) {
  std::cerr << "latchkey-coordinator: " << message << "\n";
  return exit_code;
}

// The HTTP port: /metrics (never behind a token) and the status page, which needs a token
// when auth is on and the port binds a non-loopback address; HTTPS with the gRPC certificate.
// The status page must outlive the endpoint serving it.
absl::StatusOr<std::unique_ptr<latchkey::MetricsEndpoint>> StartHttp(
    const latchkey::CoordinatorProcessOptions& o, latchkey::Coordinator* core,
    latchkey::CoordinatorMetrics* metrics, std::unique_ptr<latchkey::StatusPage>* status_page) {
  const std::string http_addr =
      (o.metrics_host.find(':') != std::string::npos ? "[" + o.metrics_host + "]"
                                                     : o.metrics_host) +
      ":" + std::to_string(o.metrics_port);
  *status_page = std::make_unique<latchkey::StatusPage>(
      core, latchkey::IsLoopbackListen(http_addr) ? nullptr : o.server.auth_tokens);
  latchkey::HttpEndpointOptions http;
  http.host = o.metrics_host;
  http.port = o.metrics_port;
  http.server_name = "latchkey-coordinator";
  http.render = [metrics] { return metrics->Serialize(); };
  http.routes = (*status_page)->Routes();
  http.tls_cert_file = o.tls_cert_file;
  http.tls_key_file = o.tls_key_file;
  return latchkey::MetricsEndpoint::Start(std::move(http));
}

// Opens the database, serves gRPC (and HTTP), writes the port file, and shuts down on the
// first stop signal.
int Serve(const latchkey::CoordinatorProcessOptions& o) {
  // Block the stop signals in every thread; the main thread takes them with sigwait.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  // A closed terminal (or a hang-up of a session): a clean shutdown rather than the default
  // death, unless the user asked for SIGHUP to be ignored (nohup).
  struct sigaction hup {};
  if (sigaction(SIGHUP, nullptr, &hup) == 0 && hup.sa_handler != SIG_IGN) {
    sigaddset(&stop_signals, SIGHUP);
  }
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  // One coordinator per database (server/database_lock.h), held until the process ends.
  auto db_lock = latchkey::DatabaseLock::Acquire(o.db);
  if (!db_lock.ok()) return Fail(db_lock.status().message());
  auto store = latchkey::SqliteStore::Open(o.db, o.db_sync);
  if (!store.ok()) return Fail(store.status().message());
  latchkey::CoordinatorMetrics metrics;
  auto core = latchkey::Coordinator::Create(*std::move(store), o.core, &metrics);
  if (!core.ok()) return Fail(core.status().message());
  (*core)->StartLivenessChecker();

  std::unique_ptr<latchkey::StatusPage> status_page;  // outlives the endpoint serving it
  std::unique_ptr<latchkey::MetricsEndpoint> endpoint;
  if (o.metrics_port >= 0) {
    auto ep = StartHttp(o, core->get(), &metrics, &status_page);
    if (!ep.ok()) return Fail(ep.status().message());
    endpoint = *std::move(ep);
  }
  auto server = latchkey::CoordinatorServer::Start(core->get(), o.server);
  if (!server.ok()) return Fail(server.status().message());
  const int bound_metrics = endpoint ? endpoint->port() : -1;
  std::cerr << "latchkey-coordinator: serving gRPC on port " << (*server)->port() << ", metrics on "
            << (endpoint ? std::to_string(bound_metrics) + " (" + endpoint->scheme() +
                               ", status page at /)"
                         : "(off)")
            << ", db " << o.db << std::endl;
  if (!o.port_file.empty() && !WritePortFile(o.port_file, (*server)->port(), bound_metrics)) {
    return Fail("--port-file " + o.port_file + ": cannot write");
  }

  int sig = 0;
  sigwait(&stop_signals, &sig);
  std::cerr << "latchkey-coordinator: signal " << sig << " (" << strsignal(sig)
            << "), shutting down" << std::endl;
  // Before the server stops: the workers' latch streams tell them the job ended.
  if (o.cancel_on_shutdown) CancelLiveJobs(**core, sig);
  (*server)->Shutdown(o.shutdown_grace);
  (*server)->Wait();
  server->reset();
  endpoint.reset();  // the status page's handlers hold the core too
  core->reset();     // after the server: handlers hold the core
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"latchkey-coordinator: jobs, rank assignment and the window latch authority"};
  latchkey::CoordinatorFlags flags;
  latchkey::AddCoordinatorFlags(app, &flags);
  app.set_version_flag("--version", LATCHKEY_VERSION_LINE("latchkey-coordinator"),
                       "print the version, git commit, libtorch version and CUDA on/off, and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : kBadFlags;
  }

  // Debian's abseil is built with Mutex deadlock detection on; with a mutex per latch stream its
  // bookkeeping showed up in profiles. The lock order is documented where the locks live.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);

  // Every flag, the security ones included, is checked before the database is touched.
  const absl::StatusOr<latchkey::CoordinatorProcessOptions> options = latchkey::FromFlags(flags);
  if (!options.ok()) {
    return Fail(options.status().message(),
                absl::IsInvalidArgument(options.status()) ? kBadFlags : kCannotStart);
  }
  return Serve(*options);
}
