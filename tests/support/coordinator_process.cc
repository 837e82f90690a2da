#include "tests/support/coordinator_process.h"

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/subprocess.h"
#include "tests/support/process.h"

namespace latchkey::testing {
namespace {

std::vector<std::string> Flags(const std::string& bin, const CoordinatorOptions& o,
                               const std::string& db, const std::string& port_file) {
  std::vector<std::string> args = {
      bin,      "--listen",       "127.0.0.1:" + std::to_string(o.port), "--db",
      db,       "--metrics-port", std::to_string(o.metrics_port),        "--port-file",
      port_file};
  if (!o.metrics_host.empty()) args.insert(args.end(), {"--metrics-host", o.metrics_host});
  args.insert(args.end(), o.extra.begin(), o.extra.end());
  return args;
}

}  // namespace

CoordinatorOptions InRunDir(const std::string& dir, const std::vector<std::string>& extra) {
  CoordinatorOptions o;
  o.extra = extra;
  o.db = dir + "/coordinator.db";
  o.log = dir + "/coordinator.log";
  o.metrics_host = "127.0.0.1";
  o.metrics_port = 0;
  return o;
}

CoordinatorProcess StartCoordinator(const std::string& bin, const std::string& dir,
                                    const CoordinatorOptions& o) {
  CoordinatorProcess c;
  c.db = o.db.empty() ? dir + "/coord.db" : o.db;
  c.log = o.log;
  const std::string port_file = o.port_file.empty() ? dir + "/ports.json" : o.port_file;
  std::remove(port_file.c_str());  // a previous coordinator's, on a restart
  auto pid = Spawn({Flags(bin, o, c.db, port_file), {}, o.log});
  if (!pid.ok()) {
    std::cerr << pid.status() << "\n";
    return c;
  }
  c.pid = *pid;
  const auto until = std::chrono::steady_clock::now() + o.wait;
  while (c.port == 0 && std::chrono::steady_clock::now() < until) {
    // Written whole (renamed into place) once every port is bound.
    const auto j = nlohmann::json::parse(ReadText(port_file), nullptr, false);
    if (j.is_object() && j.contains("grpc_port")) {
      c.port = j.value("grpc_port", 0);
      c.metrics_port = j.value("metrics_port", -1);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  return c;
}

CoordinatorProcess StartCoordinator(const std::string& bin, const std::string& dir,
                                    const std::vector<std::string>& extra, const std::string& log,
                                    const std::string& db) {
  CoordinatorOptions o;
  o.extra = extra;
  o.log = log;
  o.db = db;
  return StartCoordinator(bin, dir, o);
}

bool StopCoordinator(const CoordinatorProcess& c) {
  if (c.pid <= 0) return false;
  kill(c.pid, SIGTERM);
  return WaitOrKill(c.pid, std::chrono::seconds(30)) == 0;
}

std::string ScopedCoordinator::Log() const { return c_.log.empty() ? "" : ReadText(c_.log); }

}  // namespace latchkey::testing
