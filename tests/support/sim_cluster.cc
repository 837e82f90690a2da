#include "tests/support/sim_cluster.h"

#include <unistd.h>

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/support/process.h"
#include "tests/support/tools.h"

namespace latchkey::testing {

std::string SimHostsScript() {
  return std::string(LATCHKEY_SOURCE_DIR) + "/tests/support/sim_hosts.sh";
}

std::string SimCluster::Unavailable() {
  if (geteuid() != 0) return "needs root (network and mount namespaces)";
  for (const char* tool : {"ip", "tc", "unshare"}) {
    if (!HaveTool(tool))
      return absl::StrCat(tool, " is not installed (Debian iproute2, util-linux)");
  }
  return "";
}

std::string SimCluster::Address(int host) { return absl::StrCat("10.77.0.", host); }

absl::StatusOr<std::unique_ptr<SimCluster>> SimCluster::Create(int hosts) {
  if (std::string why = Unavailable(); !why.empty()) return absl::FailedPreconditionError(why);
  // Clusters of test processes that died without their destructor.
  (void)RunAndCapture({SimHostsScript(), "gc"});
  static int serial = 0;
  // One cluster per process at a time is the common case; the serial keeps two apart.
  std::string name = absl::StrCat("lk", getpid());
  if (serial++ > 0) absl::StrAppend(&name, "x", serial);
  std::unique_ptr<SimCluster> c(new SimCluster(name, hosts));
  if (absl::Status st = c->Run({"create", name, std::to_string(hosts)}); !st.ok()) return st;
  return c;
}

SimCluster::~SimCluster() { (void)Run({"destroy", name_}); }

absl::Status SimCluster::Run(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {SimHostsScript()};
  argv.insert(argv.end(), args.begin(), args.end());
  const Captured c = RunAndCapture(argv, std::chrono::seconds(30));
  if (c.exit_code != 0) {
    return absl::InternalError(absl::StrCat("sim_hosts.sh ", absl::StrJoin(args, " "), ": exit ",
                                            c.exit_code, ": ", c.output));
  }
  return absl::OkStatus();
}

int SimCluster::Start(int host, const std::vector<std::string>& argv,
                      const std::vector<std::string>& env, const std::string& log) {
  std::vector<std::string> args = {SimHostsScript(), "exec", name_, std::to_string(host), "env"};
  args.insert(args.end(), env.begin(), env.end());
  args.insert(args.end(), argv.begin(), argv.end());
  return StartProcess(args, {}, log);
}

int SimCluster::StartSupervised(int host, const std::vector<std::string>& argv,
                                const std::vector<std::string>& env, const std::string& log,
                                const std::string& pid_file) {
  std::vector<std::string> args = {SimHostsScript(),     "supervise", name_,
                                   std::to_string(host), pid_file,    "env"};
  args.insert(args.end(), env.begin(), env.end());
  args.insert(args.end(), argv.begin(), argv.end());
  return StartProcess(args, {}, log);
}

absl::Status SimCluster::Cut(int a, int b) {
  return Run({"cut", name_, std::to_string(a), std::to_string(b)});
}
absl::Status SimCluster::Heal(int a, int b) {
  return Run({"heal", name_, std::to_string(a), std::to_string(b)});
}
absl::Status SimCluster::Isolate(int host) { return Run({"isolate", name_, std::to_string(host)}); }
absl::Status SimCluster::Reconnect(int host) {
  return Run({"reconnect", name_, std::to_string(host)});
}
absl::Status SimCluster::Throttle(int host, const std::string& rate) {
  return Run({"throttle", name_, std::to_string(host), rate});
}
absl::Status SimCluster::Unthrottle(int host) {
  return Run({"unthrottle", name_, std::to_string(host)});
}

}  // namespace latchkey::testing
