// Test harness for the coordinator's end-to-end tests: an in-process server on loopback, an
// out-of-process latchkey-coordinator (started with tests/support/process.h) and a plain HTTP
// GET. Scratch folders, commands and job specs come from tests/support. Test-only.
#ifndef LATCHKEY_TESTS_COORDINATOR_HARNESS_H_
#define LATCHKEY_TESTS_COORDINATOR_HARNESS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "server/coordinator.h"
#include "server/metrics.h"
#include "server/server.h"
#include "tests/support/temp_dir.h"

namespace latchkey::testing {

// Coordinator (SQLite ":memory:" unless `db` names a file) + gRPC server on 127.0.0.1:0.
class InProcessCoordinator {
 public:
  explicit InProcessCoordinator(CoordinatorOptions options = {},
                                const std::string& db = ":memory:");
  ~InProcessCoordinator();
  std::string address() const;  // "127.0.0.1:PORT"
  Coordinator& core() { return *core_; }
  CoordinatorMetrics& metrics() { return metrics_; }

 private:
  CoordinatorMetrics metrics_;
  std::unique_ptr<Coordinator> core_;
  std::unique_ptr<CoordinatorServer> server_;
};

// latchkey-coordinator as a child process. Start() waits for its port file.
class CoordinatorProcess {
 public:
  // `grpc_port` 0: any free port (a restart can pass the previous one).
  CoordinatorProcess(std::string db_path, int grpc_port = 0,
                     std::vector<std::string> extra_args = {});
  ~CoordinatorProcess();  // SIGKILL if still running
  // Extra environment ("NAME=value") for the next Start(), e.g. a crash point.
  void set_env(std::vector<std::string> env) { env_ = std::move(env); }
  bool Start();
  // true once the process has exited on its own (waited for up to `timeout`); reaps it.
  bool Exited(absl::Duration timeout);
  void Kill9();
  int Terminate();  // SIGTERM, then the exit status (-1 if it had to be killed)
  int grpc_port() const { return grpc_port_; }
  int metrics_port() const { return metrics_port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(grpc_port_); }
  pid_t pid() const { return pid_; }

 private:
  std::string db_path_;
  int grpc_port_;
  int metrics_port_ = -1;
  std::vector<std::string> extra_args_;
  std::vector<std::string> env_;
  ScopedTempDir dir_{"coord-process"};  // its port file
  pid_t pid_ = -1;
};

// GET http://127.0.0.1:port/path; the body ("" on failure).
std::string HttpGet(int port, const std::string& path);

std::string CoordinatorBinary();
std::string CliBinary();

}  // namespace latchkey::testing

#endif  // LATCHKEY_TESTS_COORDINATOR_HARNESS_H_
