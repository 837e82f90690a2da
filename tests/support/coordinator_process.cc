#include "tests/support/coordinator_process.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "common/subprocess.h"
#include "tests/support/process.h"

namespace latchkey::testing {

CoordinatorProcess StartCoordinator(const std::string& bin, const std::string& dir,
                                    const std::vector<std::string>& extra, const std::string& log,
                                    const std::string& db) {
  CoordinatorProcess c;
  c.db = db.empty() ? dir + "/coord.db" : db;
  const std::string port_file = dir + "/ports.json";
  std::vector<std::string> args = {bin,  "--listen",    "127.0.0.1:0", "--db",
                                   c.db, "--port-file", port_file};
  // The metrics port is off unless `extra` sets one.
  if (std::find(extra.begin(), extra.end(), "--metrics-port") == extra.end()) {
    args.insert(args.end(), {"--metrics-port", "-1"});
  }
  args.insert(args.end(), extra.begin(), extra.end());
  auto pid = Spawn({args, {}, log});
  if (!pid.ok()) {
    std::cerr << pid.status() << "\n";
    return c;
  }
  c.pid = *pid;
  for (int i = 0; i < 300 && c.port == 0; ++i) {
    const std::string text = ReadText(port_file);
    const size_t at = text.find("\"grpc_port\": ");
    if (at != std::string::npos) c.port = std::atoi(text.c_str() + at + 13);
    if (c.port == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return c;
}

bool StopCoordinator(const CoordinatorProcess& c) {
  if (c.pid <= 0) return false;
  kill(c.pid, SIGTERM);
  return WaitOrKill(c.pid, std::chrono::seconds(30)) == 0;
}

}  // namespace latchkey::testing
