// One latchkey-coordinator process for a test or a benchmark: started on 127.0.0.1 (a free port
// unless a fixed one is asked for) with its own database, waited for until its port file says it
// serves, and stopped with SIGTERM (SIGKILL after a deadline) by StopCoordinator or by
// ScopedCoordinator's destructor, on every path. A test that restarts "the same" coordinator
// starts another on the first one's port and database (CoordinatorOptions::port, ::db).
#ifndef LATCHKEY_TESTS_SUPPORT_COORDINATOR_PROCESS_H_
#define LATCHKEY_TESTS_SUPPORT_COORDINATOR_PROCESS_H_

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace latchkey::testing {

struct CoordinatorOptions {
  std::vector<std::string> extra;  // flags after the others (TLS, auth, liveness, ...)
  std::string log;                 // its stdout+stderr ("": inherited)
  std::string db;                  // "": DIR/coord.db
  std::string port_file;           // "": DIR/ports.json; removed before the start
  int port = 0;                    // the gRPC port on 127.0.0.1 (0: a free one)
  int metrics_port = -1;           // --metrics-port (-1: off, 0: a free one)
  std::string metrics_host;        // --metrics-host ("": the coordinator's default)
  std::chrono::seconds wait{30};   // for the port file
};

// Its database and log named as `latchkey up` names them in a run folder (DIR/coordinator.db,
// DIR/coordinator.log), the metrics port on a free port of 127.0.0.1, and `extra`.
CoordinatorOptions InRunDir(const std::string& dir, const std::vector<std::string>& extra = {});

struct CoordinatorProcess {
  pid_t pid = -1;
  int port = 0;          // 0: it did not start serving
  int metrics_port = 0;  // from the port file (-1 when off)
  std::string db;
  std::string log;  // "" when inherited
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
};

// Starts `bin` with `o`'s flags and waits up to o.wait for its port file.
CoordinatorProcess StartCoordinator(const std::string& bin, const std::string& dir,
                                    const CoordinatorOptions& o);
// The same with only `extra`, `log` and `db` set.
CoordinatorProcess StartCoordinator(const std::string& bin, const std::string& dir,
                                    const std::vector<std::string>& extra,
                                    const std::string& log = "", const std::string& db = "");
// SIGTERM, then SIGKILL if it has not exited within 30 s. Returns whether it exited with 0.
bool StopCoordinator(const CoordinatorProcess& c);

// A coordinator stopped when the object goes.
class ScopedCoordinator {
 public:
  ScopedCoordinator(const std::string& bin, const std::string& dir, const CoordinatorOptions& o)
      : c_(StartCoordinator(bin, dir, o)) {}
  ScopedCoordinator(const std::string& bin, const std::string& dir,
                    const std::vector<std::string>& extra, const std::string& log,
                    const std::string& db = "")
      : c_(StartCoordinator(bin, dir, extra, log, db)) {}
  ~ScopedCoordinator() { StopCoordinator(c_); }
  ScopedCoordinator(const ScopedCoordinator&) = delete;
  ScopedCoordinator& operator=(const ScopedCoordinator&) = delete;
  bool ok() const { return c_.port > 0; }
  std::string address() const { return c_.address(); }
  int metrics_port() const { return c_.metrics_port; }
  // What it has written to its log so far ("" when its output is inherited).
  std::string Log() const;
  const CoordinatorProcess& process() const { return c_; }

 private:
  CoordinatorProcess c_;
};

}  // namespace latchkey::testing

#endif  // LATCHKEY_TESTS_SUPPORT_COORDINATOR_PROCESS_H_
