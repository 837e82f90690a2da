#include "tests/cli/cli_support.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include "client/cli/builtin_spec.h"
#include "common/sha256.h"
#include "common/subprocess.h"
#include "tests/support/temp_dir.h"

namespace latchkey::testing {
namespace {

namespace fs = std::filesystem;

// The scratch homes, made once and exported before any child starts.
const std::string& Homes() {
  static const std::string dir = [] {
    const std::string d = MakeTempDir("cli-homes");
    fs::create_directories(d + "/config");
    fs::create_directories(d + "/state");
    setenv("XDG_CONFIG_HOME", (d + "/config").c_str(), 1);
    setenv("XDG_STATE_HOME", (d + "/state").c_str(), 1);
    // The user's own settings would change what the CLI does.
    for (const char* v : {"LATCHKEY_COORDINATOR", "LATCHKEY_TOKEN", "LATCHKEY_TLS_CA",
                          "LATCHKEY_TLS_CERT", "LATCHKEY_TLS_KEY", "LATCHKEY_JOB_ID"}) {
      unsetenv(v);
    }
    return d;
  }();
  return dir;
}

Captured RunWithEnv(const std::vector<std::string>& args, const std::vector<std::string>& env,
                    std::chrono::seconds deadline) {
  Homes();
  const std::string log = MakeTempDir("cli-run") + "/out.log";
  const int pid = StartProcess(args, env, log);
  Captured c;
  c.exit_code = WaitProcess(pid, deadline);
  c.output = ReadText(log);
  fs::remove_all(fs::path(log).parent_path());
  return c;
}

}  // namespace

std::string ConfigHome() { return Homes() + "/config"; }
std::string StateHome() { return Homes() + "/state"; }

bool Has(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

bool WaitForStep(const std::string& jsonl, int step) {
  const std::string needle = "\"step\":" + std::to_string(step) + ",";
  const std::string text = WaitForFile(
      jsonl, [&](const std::string& t) { return Has(t, needle); }, std::chrono::seconds(240));
  return Has(text, needle);
}

Captured Cli(const std::vector<std::string>& args, const std::vector<std::string>& global,
             std::chrono::seconds deadline) {
  std::vector<std::string> argv = {LATCHKEY_CLI_BIN};
  argv.insert(argv.end(), global.begin(), global.end());
  argv.insert(argv.end(), args.begin(), args.end());
  return RunWithEnv(argv, {}, deadline);
}

Captured Worker(const std::vector<std::string>& args, const std::vector<std::string>& env,
                std::chrono::seconds deadline) {
  std::vector<std::string> argv = {LATCHKEY_WORKER_BIN};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunWithEnv(argv, env, deadline);
}

nlohmann::json BuiltInSpec() { return nlohmann::json::parse(cli::kBuiltInJobSpec); }

std::string WriteSpec(const std::string& dir, const nlohmann::json& spec, const std::string& name) {
  const std::string path = dir + "/" + name;
  std::ofstream(path) << spec.dump(2) << "\n";
  return path;
}

void WritePrivate(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::trunc) << text;
  chmod(path.c_str(), 0600);
}

std::string WriteAuthTokens(const std::string& dir, const std::string& token) {
  const std::string path = dir + "/auth-tokens";
  WritePrivate(path, "admin test " + Sha256Hex(token) + "\n");
  return path;
}

Certificates MakeCertificates(const std::string& dir) {
  Certificates c;
  c.ca_pem = dir + "/ca.pem";
  c.server_pem = dir + "/server.pem";
  c.server_key = dir + "/server.key";
  std::ofstream(dir + "/server.ext") << "subjectAltName=IP:127.0.0.1,DNS:localhost\n";
  const std::vector<std::vector<std::string>> steps = {
      {"openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", dir + "/ca.key",
       "-out", c.ca_pem, "-days", "2", "-subj", "/CN=latchkey-test-ca"},
      {"openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", c.server_key, "-out",
       dir + "/server.csr", "-subj", "/CN=localhost"},
      {"openssl", "x509", "-req", "-in", dir + "/server.csr", "-CA", c.ca_pem, "-CAkey",
       dir + "/ca.key", "-CAcreateserial", "-out", c.server_pem, "-days", "2", "-extfile",
       dir + "/server.ext"}};
  for (const auto& step : steps) {
    const Captured r = RunAndCapture(step);
    c.log += r.output;
    if (r.exit_code != 0) return c;
  }
  c.ok = true;
  return c;
}

namespace {

CoordinatorOptions TaggedOptions(const std::string& dir, const std::vector<std::string>& extra,
                                 const std::string& db) {
  Homes();
  static int n = 0;
  const std::string tag = std::to_string(getpid()) + "-" + std::to_string(++n);
  CoordinatorOptions o;
  o.extra = extra;
  o.db = db.empty() ? dir + "/coordinator-" + tag + ".db" : db;
  o.log = dir + "/coordinator-" + tag + ".log";
  o.port_file = dir + "/coordinator-" + tag + ".ports.json";
  return o;
}

}  // namespace

Coordinator::Coordinator(const std::string& dir, const std::vector<std::string>& extra,
                         const std::string& db)
    : ScopedCoordinator(LATCHKEY_COORDINATOR_BIN, dir, TaggedOptions(dir, extra, db)) {}

UpRun::UpRun(const std::vector<std::string>& args, const std::string& log) : log_(log) {
  Homes();
  SpawnOptions o;
  o.args = {LATCHKEY_CLI_BIN, "up"};
  o.args.insert(o.args.end(), args.begin(), args.end());
  o.log_path = log;
  o.own_process_group = true;
  const absl::StatusOr<pid_t> pid = Spawn(o);
  pid_ = pid.ok() ? *pid : -1;
}

UpRun::~UpRun() {
  if (pid_ <= 0 || waited_) return;
  kill(-pid_, SIGTERM);
  if (WaitProcess(pid_, std::chrono::seconds(30)) == -1) kill(-pid_, SIGKILL);
}

std::string UpRun::Output() const { return ReadText(log_); }

std::string UpRun::Grab(const std::string& pattern, std::chrono::seconds deadline) const {
  const std::regex re(pattern);
  std::smatch m;
  const auto until = std::chrono::steady_clock::now() + deadline;
  while (std::chrono::steady_clock::now() < until) {
    const std::string text = Output();
    if (std::regex_search(text, m, re)) return m[1].str();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return "";
}

bool UpRun::Interrupt() { return pid_ > 0 && kill(-pid_, SIGINT) == 0; }

int UpRun::Wait(std::chrono::seconds deadline) {
  if (pid_ <= 0) return -1;
  const int code = WaitProcess(pid_, deadline);
  waited_ = true;
  return code;
}

}  // namespace latchkey::testing
