// A cluster on one machine for tests: simulated hosts (network namespaces on a bridge, each with
// its own address and its own /dev/shm), processes started on a host, and the faults of a real
// network between them (a cut link, an isolated host, a throttled link). tests/support/
// sim_hosts.sh spells the commands; this class owns a cluster's lifetime: the destructor kills
// every process on its hosts and deletes its namespaces on every exit path, and Create first
// removes the clusters of test processes that died without doing so.
//
// Needs root: LATCHKEY_REQUIRE_SIM_HOSTS() skips a test without it, and fails it under CI=true.
//
// Thread-safety: one thread drives a SimCluster; the processes it starts are independent.
#ifndef LATCHKEY_TESTS_SUPPORT_SIM_CLUSTER_H_
#define LATCHKEY_TESTS_SUPPORT_SIM_CLUSTER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tests/support/tools.h"

namespace latchkey::testing {

class SimCluster {
 public:
  // "" when this machine can run simulated hosts (root, `ip`, `tc`, `unshare`); else why not.
  static std::string Unavailable();
  // Hosts 1..n (addresses 10.77.0.1 .. 10.77.0.n).
  static absl::StatusOr<std::unique_ptr<SimCluster>> Create(int hosts);
  ~SimCluster();
  SimCluster(const SimCluster&) = delete;
  SimCluster& operator=(const SimCluster&) = delete;

  const std::string& name() const { return name_; }
  int hosts() const { return hosts_; }
  static std::string Address(int host);  // "10.77.0.<host>"

  // Starts `argv` on `host` (its own /dev/shm) with extra environment entries; stdout and
  // stderr to `log`. Returns the pid of the process that runs it (killed with the cluster).
  int Start(int host, const std::vector<std::string>& argv, const std::vector<std::string>& env,
            const std::string& log);
  // As Start, restarted after every exit a pod's supervisor restarts (any but 0, 1, 2, 3);
  // `pid_file` holds the current process's pid (what kill -9 or SIGSTOP of "the worker" hits).
  // Returns the supervisor's pid: it exits with the command's last exit code.
  int StartSupervised(int host, const std::vector<std::string>& argv,
                      const std::vector<std::string>& env, const std::string& log,
                      const std::string& pid_file);

  absl::Status Cut(int a, int b);   // nothing between a and b; both still reach the others
  absl::Status Heal(int a, int b);  // undoes Cut
  absl::Status Isolate(int host);   // its link down
  absl::Status Reconnect(int host);
  absl::Status Throttle(int host, const std::string& rate);  // e.g. "1mbit", both directions
  absl::Status Unthrottle(int host);

 private:
  SimCluster(std::string name, int hosts) : name_(std::move(name)), hosts_(hosts) {}
  absl::Status Run(const std::vector<std::string>& args);

  std::string name_;
  int hosts_;
};

// The path of sim_hosts.sh in the source tree.
std::string SimHostsScript();

}  // namespace latchkey::testing

// Skips (or, with CI=true, fails) the current test unless simulated hosts can run here.
#define LATCHKEY_REQUIRE_SIM_HOSTS()                                        \
  do {                                                                      \
    const std::string why = ::latchkey::testing::SimCluster::Unavailable(); \
    if (!why.empty()) {                                                     \
      if (::latchkey::testing::InCi())                                      \
        FAIL() << "simulated hosts: " << why << "; CI=true requires them";  \
      GTEST_SKIP() << "simulated hosts: " << why;                           \
    }                                                                       \
  } while (0)

#endif  // LATCHKEY_TESTS_SUPPORT_SIM_CLUSTER_H_
