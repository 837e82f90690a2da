// `latchkey up --tls`: a CA and a server certificate signed by it, made with the openssl CLI.
// Each openssl step runs through the one launcher (common/subprocess.h) with an argv, never a
// shell, so no path is ever parsed by a shell.
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "client/cli/up.h"
#include "common/subprocess.h"

namespace latchkey::cli {
namespace {

namespace fs = std::filesystem;

// The process's umask for this object's lifetime. `up` makes its certificates before it starts
// any thread, so nothing else creates files meanwhile; the openssl children inherit it.
class ScopedUmask {
 public:
  explicit ScopedUmask(mode_t mask) : old_(umask(mask)) {}
  ~ScopedUmask() { umask(old_); }
  ScopedUmask(const ScopedUmask&) = delete;
  ScopedUmask& operator=(const ScopedUmask&) = delete;

 private:
  const mode_t old_;
};

// Runs one step with its output appended to `log`; false when it could not start (the reason
// appended to the log, as a shell would have written it) or did not exit 0.
bool RunStep(const std::vector<std::string>& args, const std::string& log) {
  SpawnOptions step;
  step.args = args;
  step.log_path = log;
  step.append_log = true;
  const absl::StatusOr<pid_t> pid = Spawn(step);
  if (!pid.ok()) {
    std::ofstream(log, std::ios::app) << pid.status().message() << "\n";
    return false;
  }
  // RSA-2048 key generation takes well under a second; a step still running after minutes is
  // stuck and is killed (a failure).
  return WaitOrKill(*pid, std::chrono::minutes(5)) == 0;
}

}  // namespace

absl::Status MakeLocalCertificates(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError("--tls: cannot create " + dir + ": " + ec.message());
  const std::string log = dir + "/openssl.log";
  const auto failed = [&] {
    return absl::FailedPreconditionError("--tls: openssl could not make a certificate; see " + dir +
                                         "/openssl.log");
  };
  // The log is made before the umask below, as an ordinary file; it holds no secret.
  if (!std::ofstream(log, std::ios::trunc)) return failed();
  // Everything made from here on (keys, certificates, the serial) is private to this user.
  const ScopedUmask private_files(077);
  const auto in_dir = [&](const char* name) { return dir + "/" + name; };
  if (!RunStep(
          {"openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", in_dir("ca.key"),
           "-out", in_dir("ca.pem"), "-days", "30", "-subj", "/CN=latchkey-up-ca"},
          log)) {
    return failed();
  }
  if (!RunStep({"openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", in_dir("server.key"),
                "-out", in_dir("server.csr"), "-subj", "/CN=localhost"},
               log)) {
    return failed();
  }
  if (!(std::ofstream(in_dir("server.ext")) << "subjectAltName=IP:127.0.0.1,DNS:localhost\n")) {
    return failed();
  }
  // -CAcreateserial writes the serial beside the CA (ca.srl).
  if (!RunStep({"openssl", "x509", "-req", "-in", in_dir("server.csr"), "-CA", in_dir("ca.pem"),
                "-CAkey", in_dir("ca.key"), "-CAcreateserial", "-out", in_dir("server.pem"),
                "-days", "30", "-extfile", in_dir("server.ext")},
               log)) {
    return failed();
  }
  return absl::OkStatus();
}

}  // namespace latchkey::cli
