// What the CLI tests (tests/cli/) share: the binaries run with a deadline, a coordinator of
// their own on a free loopback port, certificates made with the openssl CLI, and specs. Every
// child runs with XDG_CONFIG_HOME and XDG_STATE_HOME in one scratch folder of this test process
// (set before the first child starts), so the user's credentials file and run registry are
// never read or written. Not thread-safe: one test thread.
#ifndef LATCHKEY_TESTS_CLI_CLI_SUPPORT_H_
#define LATCHKEY_TESTS_CLI_CLI_SUPPORT_H_

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/support/coordinator_process.h"
#include "tests/support/free_port.h"
#include "tests/support/process.h"

namespace latchkey::testing {

// True when `text` contains `needle`.
bool Has(const std::string& text, const std::string& needle);
// Waits (up to 240 s) until the steps JSONL at `jsonl` has a line for `step`.
bool WaitForStep(const std::string& jsonl, int step);

// `latchkey GLOBAL... ARGS...`, stdin from /dev/null, stdout+stderr captured.
Captured Cli(const std::vector<std::string>& args, const std::vector<std::string>& global = {},
             std::chrono::seconds deadline = std::chrono::seconds(60));
// `latchkey-worker ARGS...` with extra environment entries.
Captured Worker(const std::vector<std::string>& args, const std::vector<std::string>& env,
                std::chrono::seconds deadline = std::chrono::seconds(60));

// The spec bare `latchkey up` runs (client/cli/builtin_spec.h).
nlohmann::json BuiltInSpec();
// Writes `spec` to dir/name and returns the path.
std::string WriteSpec(const std::string& dir, const nlohmann::json& spec,
                      const std::string& name = "spec.json");
void WritePrivate(const std::string& path, const std::string& text);  // mode 0600
// An --auth-tokens file in `dir` giving `token` the admin role; returns its path.
std::string WriteAuthTokens(const std::string& dir, const std::string& token);
// The scratch XDG_CONFIG_HOME / XDG_STATE_HOME of this test process.
std::string ConfigHome();
std::string StateHome();

struct Certificates {
  bool ok = false;
  std::string ca_pem, server_pem, server_key, log;
};
// A CA and a certificate for 127.0.0.1 signed by it, in `dir` (openssl CLI).
Certificates MakeCertificates(const std::string& dir);

// latchkey-coordinator on 127.0.0.1 (a free port), its database in `dir` (or `db`), metrics
// off, with `extra` flags (tests/support/coordinator_process.h); stopped (SIGTERM, then SIGKILL)
// when the object goes. Its files carry a tag of their own, so several share one folder.
class Coordinator : public ScopedCoordinator {
 public:
  explicit Coordinator(const std::string& dir, const std::vector<std::string>& extra = {},
                       const std::string& db = "");
  int port() const { return process().port; }
  std::string log() const { return Log(); }
};

// `latchkey up ARGS...` in a process group of its own (as a shell's foreground job), its output
// in `log`; a run still going when the object goes is stopped (SIGTERM to its group: `up`
// cancels its job and stops its children).
class UpRun {
 public:
  UpRun(const std::vector<std::string>& args, const std::string& log);
  ~UpRun();
  UpRun(const UpRun&) = delete;
  UpRun& operator=(const UpRun&) = delete;
  bool started() const { return pid_ > 0; }
  std::string Output() const;
  // The first group of `pattern`'s first match in the output, waiting up to `deadline`; "" when
  // none came.
  std::string Grab(const std::string& pattern,
                   std::chrono::seconds deadline = std::chrono::seconds(120)) const;
  // SIGINT to the group, as Ctrl-C in a terminal.
  bool Interrupt();
  // Its exit code (-1 when it had to be killed at the deadline).
  int Wait(std::chrono::seconds deadline);

 private:
  int pid_ = -1;
  bool waited_ = false;
  std::string log_;
};

}  // namespace latchkey::testing

#endif  // LATCHKEY_TESTS_CLI_CLI_SUPPORT_H_
