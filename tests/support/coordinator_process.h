// One latchkey-coordinator process for a test or a benchmark: started on 127.0.0.1 (a free
// port) with its own database, the metrics port off (unless the extra flags set one), waited for
// until it serves, and stopped with SIGTERM (SIGKILL after a deadline) by StopCoordinator or by
// ScopedCoordinator's destructor, on every path.
#ifndef LATCHKEY_TESTS_SUPPORT_COORDINATOR_PROCESS_H_
#define LATCHKEY_TESTS_SUPPORT_COORDINATOR_PROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

namespace latchkey::testing {

struct CoordinatorProcess {
  pid_t pid = -1;
  int port = 0;  // 0: it did not start serving
  std::string db;
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
};

// Starts `bin` with its database at `db` ("": DIR/coord.db), its port file in `dir`, and
// `extra` flags after the others; waits up to 30 s for the port file. Output goes to `log`
// ("": inherited).
CoordinatorProcess StartCoordinator(const std::string& bin, const std::string& dir,
                                    const std::vector<std::string>& extra,
                                    const std::string& log = "", const std::string& db = "");
// SIGTERM, then SIGKILL if it has not exited within 30 s. Returns whether it exited with 0.
bool StopCoordinator(const CoordinatorProcess& c);

// A coordinator stopped when the object goes.
class ScopedCoordinator {
 public:
  ScopedCoordinator(const std::string& bin, const std::string& dir,
                    const std::vector<std::string>& extra, const std::string& log,
                    const std::string& db = "")
      : c_(StartCoordinator(bin, dir, extra, log, db)) {}
  ~ScopedCoordinator() { StopCoordinator(c_); }
  ScopedCoordinator(const ScopedCoordinator&) = delete;
  ScopedCoordinator& operator=(const ScopedCoordinator&) = delete;
  bool ok() const { return c_.port > 0; }
  std::string address() const { return c_.address(); }
  const CoordinatorProcess& process() const { return c_; }

 private:
  CoordinatorProcess c_;
};

}  // namespace latchkey::testing

#endif  // LATCHKEY_TESTS_SUPPORT_COORDINATOR_PROCESS_H_
