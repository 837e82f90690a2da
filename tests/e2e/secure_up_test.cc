// Auth and TLS from the client side, end to end: real coordinator processes with --auth-tokens
// (and --tls-cert/--tls-key/--tls-client-ca, a CA made here with the openssl CLI), the real CLI,
// and `latchkey up`, which turns auth on by itself.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "client/credentials.h"
#include "tests/support/coordinator_process.h"
#include "tests/support/launch.h"
#include "tests/support/process.h"
#include "tests/support/specs.h"
#include "tests/support/temp_dir.h"

namespace latchkey::testing {
namespace {

using std::chrono::seconds;

constexpr char kAdminToken[] = "admin-token-0123456789abcdef";
constexpr char kReadToken[] = "read-token-0123456789abcdef";

int Mode(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return -1;
  return static_cast<int>(st.st_mode & 0777);
}

// A coordinator process on loopback with role tokens (admin "ops", read "viewer") and
// whatever else `extra` adds.
class SecureCoordinator {
 public:
  SecureCoordinator(const std::string& dir, const std::vector<std::string>& extra)
      : c_(LATCHKEY_COORDINATOR_BIN, dir, Options(dir, extra)) {}
  std::string address() const { return c_.ok() ? c_.address() : ""; }
  std::string log() const { return c_.Log(); }

 private:
  // Writes the tokens file the flags name.
  static CoordinatorOptions Options(const std::string& dir, const std::vector<std::string>& extra) {
    std::ofstream(dir + "/auth-tokens") << "# test tokens\nadmin ops " << Sha256Hex(kAdminToken)
                                        << "\nread viewer " << Sha256Hex(kReadToken) << "\n";
    CoordinatorOptions o = InRunDir(dir, {"--auth-tokens", dir + "/auth-tokens"});
    o.extra.insert(o.extra.end(), extra.begin(), extra.end());
    return o;
  }
  ScopedCoordinator c_;
};

// The CLI with a clean environment for its credentials: XDG_CONFIG_HOME=`config`, no
// LATCHKEY_TOKEN / LATCHKEY_TLS_* of the caller's.
Captured Cli(const std::string& config, const std::vector<std::string>& args,
             const std::vector<std::string>& env = {}) {
  std::vector<std::string> cmd = {"env",
                                  "-u",
                                  "LATCHKEY_TOKEN",
                                  "-u",
                                  "LATCHKEY_TLS_CA",
                                  "-u",
                                  "LATCHKEY_TLS_CERT",
                                  "-u",
                                  "LATCHKEY_TLS_KEY",
                                  "XDG_CONFIG_HOME=" + config};
  cmd.insert(cmd.end(), env.begin(), env.end());
  cmd.push_back(LATCHKEY_CLI_BIN);
  cmd.insert(cmd.end(), args.begin(), args.end());
  return RunAndCapture(cmd, seconds(60));
}

TEST(SecureClient, TokensFromFlagEnvAndCredentialsFileAndExit7SayingWhich) {
  const std::string dir = MakeTempDir("secure-tokens");
  SecureCoordinator coord(dir, {});
  ASSERT_FALSE(coord.address().empty()) << coord.log();
  const std::string a = coord.address();
  const std::string config = dir + "/config";

  Captured r = Cli(config, {"--coordinator", a, "list"});
  EXPECT_EQ(r.exit_code, 7) << r.output;
  EXPECT_NE(r.output.find("UNAUTHENTICATED"), std::string::npos) << r.output;

  r = Cli(config, {"--coordinator", a, "--token", "not-a-known-token", "list"});
  EXPECT_EQ(r.exit_code, 7) << r.output;
  EXPECT_NE(r.output.find("UNAUTHENTICATED"), std::string::npos) << r.output;

  r = Cli(config, {"--coordinator", a, "--token", kReadToken, "list"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = Cli(config, {"--coordinator", a, "--token", kReadToken, "cancel", "some-job"});
  EXPECT_EQ(r.exit_code, 7) << r.output;
  EXPECT_NE(r.output.find("PERMISSION_DENIED"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("UNAUTHENTICATED"), std::string::npos) << r.output;

  // LATCHKEY_TOKEN works like --token.
  r = Cli(config, {"--coordinator", a, "status", "no-such-job"},
          {std::string("LATCHKEY_TOKEN=") + kAdminToken});
  EXPECT_EQ(r.exit_code, 4) << r.output;  // authenticated: NOT_FOUND

  // The credentials file's entry for the address is used when no token is given ...
  ASSERT_TRUE(SaveCredentials(config + "/latchkey/credentials", a, {kReadToken, ""}).ok());
  r = Cli(config, {"--coordinator", a, "list"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = Cli(config, {"--coordinator", a, "cancel", "some-job"});
  EXPECT_EQ(r.exit_code, 7) << r.output;
  EXPECT_NE(r.output.find("PERMISSION_DENIED"), std::string::npos) << r.output;
  // ... and a token given explicitly wins over it.
  r = Cli(config, {"--coordinator", a, "--token", "wrong-token", "list"});
  EXPECT_EQ(r.exit_code, 7) << r.output;
  r = Cli(config, {"--coordinator", a, "status", "no-such-job"},
          {std::string("LATCHKEY_TOKEN=") + kAdminToken});
  EXPECT_EQ(r.exit_code, 4) << r.output;
  // No raw token in what the coordinator logged about the refused calls.
  const std::string log = coord.log();
  EXPECT_EQ(log.find("not-a-known-token"), std::string::npos) << log;
  EXPECT_EQ(log.find("wrong-token"), std::string::npos) << log;
}

// A CA, a server certificate for 127.0.0.1/localhost and a client certificate, all signed by
// it, and a second CA that signed nothing, made with the openssl CLI in `dir`.
bool MakeCertificates(const std::string& dir) {
  const std::string script =
      "set -e; cd '" + dir +
      "'; "
      "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 "
      "-subj /CN=latchkey-test-ca 2>/dev/null; "
      "openssl req -x509 -newkey rsa:2048 -nodes -keyout other-ca.key -out other-ca.pem -days 2 "
      "-subj /CN=other-ca 2>/dev/null; "
      "openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr "
      "-subj /CN=localhost 2>/dev/null; "
      "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\nextendedKeyUsage=serverAuth\\n' > "
      "server.ext; "
      "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem "
      "-days 2 -extfile server.ext 2>/dev/null; "
      "openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr "
      "-subj /CN=latchkey-client 2>/dev/null; "
      "printf 'extendedKeyUsage=clientAuth\\n' > client.ext; "
      "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem "
      "-days 2 -extfile client.ext 2>/dev/null";
  const Captured r = RunAndCapture({"sh", "-c", script}, seconds(60));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.exit_code == 0;
}

TEST(SecureClient, TlsNeedsTheRightCaAndTheCliSaysSo) {
  const std::string dir = MakeTempDir("secure-tls");
  ASSERT_TRUE(MakeCertificates(dir));
  SecureCoordinator coord(dir,
                          {"--tls-cert", dir + "/server.pem", "--tls-key", dir + "/server.key"});
  ASSERT_FALSE(coord.address().empty()) << coord.log();
  const std::string a = coord.address();
  const std::string config = dir + "/config";
  const std::vector<std::string> base = {"--coordinator", a,          "--timeout", "5",
                                         "--token",       kAdminToken};
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> args = base;
    args.insert(args.end(), more.begin(), more.end());
    return args;
  };

  Captured r = Cli(config, with({"--tls-ca", dir + "/ca.pem", "list"}));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = Cli(config, with({"list"}), {"LATCHKEY_TLS_CA=" + dir + "/ca.pem"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // A plaintext client: refused, and told about --tls-ca.
  r = Cli(config, with({"list"}));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--tls-ca"), std::string::npos) << r.output;
  // A CA that did not sign the coordinator's certificate.
  r = Cli(config, with({"--tls-ca", dir + "/other-ca.pem", "list"}));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--tls-ca"), std::string::npos) << r.output;
  // Token and CA from the credentials file.
  ASSERT_TRUE(
      SaveCredentials(config + "/latchkey/credentials", a, {kReadToken, dir + "/ca.pem"}).ok());
  r = Cli(config, {"--coordinator", a, "--timeout", "5", "list"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // TLS does not replace the token.
  r = Cli(dir + "/empty", {"--coordinator", a, "--tls-ca", dir + "/ca.pem", "list"});
  EXPECT_EQ(r.exit_code, 7) << r.output;
  EXPECT_NE(r.output.find("UNAUTHENTICATED"), std::string::npos) << r.output;
}

TEST(SecureClient, MutualTlsNeedsAClientCertificate) {
  const std::string dir = MakeTempDir("secure-mtls");
  ASSERT_TRUE(MakeCertificates(dir));
  SecureCoordinator coord(dir, {"--tls-cert", dir + "/server.pem", "--tls-key", dir + "/server.key",
                                "--tls-client-ca", dir + "/ca.pem"});
  ASSERT_FALSE(coord.address().empty()) << coord.log();
  const std::vector<std::string> base = {
      "--coordinator", coord.address(), "--timeout", "5",
      "--token",       kAdminToken,     "--tls-ca",  dir + "/ca.pem"};
  std::vector<std::string> args = base;
  args.push_back("list");
  Captured r = Cli(dir + "/config", args);
  EXPECT_NE(r.exit_code, 0) << r.output;
  args = base;
  args.insert(args.end(),
              {"--tls-cert", dir + "/client.pem", "--tls-key", dir + "/client.key", "list"});
  r = Cli(dir + "/config", args);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = Cli(dir + "/config",
          {"--coordinator", coord.address(), "--timeout", "5", "--token", kAdminToken, "list"},
          {"LATCHKEY_TLS_CA=" + dir + "/ca.pem", "LATCHKEY_TLS_CERT=" + dir + "/client.pem",
           "LATCHKEY_TLS_KEY=" + dir + "/client.key"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

// `latchkey up` starts its coordinator with auth on, keeps only the token's hash in the run's
// --auth-tokens, writes the user's credentials file, and the CLI reaches the run through it.
// With `tls`, `up --tls`: its workers and the CLI (the CA from the credentials file) use TLS.
void RunSecureUp(bool tls) {
  const std::string dir = MakeTempDir(tls ? "secure-up-tls" : "secure-up");
  const std::string config = dir + "/config";
  std::vector<std::string> cmd = {
      "env", "-u",        "LATCHKEY_TOKEN", "XDG_CONFIG_HOME=" + config, LATCHKEY_CLI_BIN,
      "up",  "--run-dir", dir + "/run"};
  if (tls) cmd.push_back("--tls");
  const int up = StartProcess(cmd, {}, dir + "/up.log");
  const std::string out = WaitForFile(
      dir + "/up.log",
      [](const std::string& t) { return t.find("worker 1     pid") != std::string::npos; },
      seconds(120));
  std::smatch coord, job, worker;
  ASSERT_TRUE(std::regex_search(out, coord, std::regex("coordinator  (127\\.0\\.0\\.1:[0-9]+)")))
      << out;
  ASSERT_TRUE(std::regex_search(out, job, std::regex("job          ([^ ]+) "))) << out;
  ASSERT_TRUE(std::regex_search(out, worker, std::regex("worker 1     pid ([0-9]+)"))) << out;
  const std::string address = coord[1].str();
  // The join token is not on the worker's command line.
  std::string cmdline = ReadText("/proc/" + worker[1].str() + "/cmdline");
  EXPECT_FALSE(cmdline.empty());
  EXPECT_EQ(cmdline.find("--join-token"), std::string::npos) << cmdline;

  Captured st = Cli(config, {"--coordinator", address, "status", job[1].str()});
  EXPECT_EQ(st.exit_code, 0) << st.output;
  EXPECT_NE(st.output.find(job[1].str()), std::string::npos) << st.output;
  st = Cli(config, {"--coordinator", address, "--token", "wrong", "status", job[1].str()});
  EXPECT_EQ(st.exit_code, 7) << st.output;
  EXPECT_NE(st.output.find("UNAUTHENTICATED"), std::string::npos) << st.output;
  st = Cli(dir + "/empty-config", {"--coordinator", address, "status", job[1].str()});
  if (tls) {
    // The right token without the CA: plaintext to a TLS port, refused naming --tls-ca.
    const std::string token =
        (*LookupCredentials(config + "/latchkey/credentials", address))->token;
    st = Cli(dir + "/empty-config", {"--coordinator", address, "--timeout", "5", "--token", token,
                                     "status", job[1].str()});
    EXPECT_NE(st.exit_code, 0) << st.output;
    EXPECT_NE(st.output.find("--tls-ca"), std::string::npos) << st.output;
  } else {
    EXPECT_EQ(st.exit_code, 7) << st.output;
  }

  const int code = WaitProcess(up, seconds(300));
  const std::string log = ReadText(dir + "/up.log");
  ASSERT_EQ(code, 0) << log;

  const std::string file = config + "/latchkey/credentials";
  EXPECT_EQ(Mode(file), 0600);
  EXPECT_EQ(Mode(config + "/latchkey"), 0700);
  // The entry served the CLI while up ran (status above); up removed it when it ended, since
  // its coordinator is gone. The run folder keeps the token.
  auto entry = LookupCredentials(file, address);
  ASSERT_TRUE(entry.ok()) << ReadText(file);
  EXPECT_FALSE(entry->has_value()) << "up left its entry behind: " << ReadText(file);
  entry = LookupCredentials(dir + "/run/credentials.json", address);
  ASSERT_TRUE(entry.ok() && entry->has_value()) << ReadText(dir + "/run/credentials.json");
  const std::string token = (*entry)->token;
  EXPECT_EQ(token.size(), 64u);
  EXPECT_EQ(Mode(dir + "/run/auth-tokens"), 0600);
  EXPECT_EQ(Mode(dir + "/run/credentials.json"), 0600);
  const std::string tokens = ReadText(dir + "/run/auth-tokens");
  EXPECT_NE(tokens.find("admin up " + Sha256Hex(token)), std::string::npos) << tokens;
  EXPECT_EQ(tokens.find(token), std::string::npos) << "raw token in auth-tokens";
  EXPECT_NE(ReadText(dir + "/run/credentials.json").find(token), std::string::npos);
  EXPECT_EQ((*entry)->tls_ca, tls ? dir + "/run/tls/ca.pem" : "");
}

TEST(SecureUp, JobSucceedsWithAuthAndTheCliUsesTheCredentialsFile) { RunSecureUp(false); }

TEST(SecureUp, JobSucceedsUnderTlsAndAuth) { RunSecureUp(true); }

// Mutual TLS all the way: the coordinator requires client certificates; the CLI submits with
// one; two workers present the CA, their certificate and the join token (from the environment)
// and the job succeeds. A worker with the CA and the token but no certificate never joins.
TEST(SecureWorkers, MutualTlsWorkersRunAJobAndOneWithoutACertificateNeverJoins) {
  const std::string dir = MakeTempDir("secure-mtls-workers");
  ASSERT_TRUE(MakeCertificates(dir));
  SecureCoordinator coord(dir, {"--tls-cert", dir + "/server.pem", "--tls-key", dir + "/server.key",
                                "--tls-client-ca", dir + "/ca.pem"});
  ASSERT_FALSE(coord.address().empty()) << coord.log();
  SpecParams p;
  p.steps = 3;
  p.gas = 2;
  std::ofstream(dir + "/spec.json") << SpecJson(p);
  const std::vector<std::string> tls = {"--tls-ca",          dir + "/ca.pem", "--tls-cert",
                                        dir + "/client.pem", "--tls-key",     dir + "/client.key"};
  std::vector<std::string> submit = {"--coordinator", coord.address(), "--timeout", "10",
                                     "--token",       kAdminToken};
  submit.insert(submit.end(), tls.begin(), tls.end());
  submit.insert(submit.end(), {"submit", dir + "/spec.json"});
  Captured sub = Cli(dir + "/config", submit);
  ASSERT_EQ(sub.exit_code, 0) << sub.output;
  std::smatch job, token;
  ASSERT_TRUE(std::regex_search(sub.output, job, std::regex("job_id: (\\S+)"))) << sub.output;
  ASSERT_TRUE(std::regex_search(sub.output, token, std::regex("join_token: (\\S+)"))) << sub.output;
  const std::vector<std::string> env = {"LATCHKEY_JOIN_TOKEN=" + token[1].str()};

  const int stranger = StartProcess({WorkerBinary(), "--coordinator", coord.address(), "--job",
                                     job[1].str(), "--tls-ca", dir + "/ca.pem", "--quiet"},
                                    env, dir + "/no-cert.log");
  std::vector<int> workers;
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<std::string> args = {WorkerBinary(), "--coordinator", coord.address(),
                                     "--job",        job[1].str(),    "--quiet"};
    args.insert(args.end(), tls.begin(), tls.end());
    std::vector<std::string> rank_env = env;
    rank_env.push_back("RANK=" + std::to_string(rank));
    workers.push_back(
        StartProcess(args, rank_env, dir + "/worker" + std::to_string(rank) + ".log"));
  }
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(WaitProcess(workers[rank], seconds(300)), 0)
        << ReadText(dir + "/worker" + std::to_string(rank) + ".log");
  }
  std::vector<std::string> status = {"--coordinator", coord.address(), "--timeout", "10",
                                     "--token",       kAdminToken};
  status.insert(status.end(), tls.begin(), tls.end());
  status.insert(status.end(), {"--json", "status", job[1].str()});
  Captured st = Cli(dir + "/config", status);
  ASSERT_EQ(st.exit_code, 0) << st.output;
  // The JSON line (stderr, captured with it, carries the --token warning).
  const size_t json_at = st.output.find("\n{") == std::string::npos ? 0 : st.output.find("\n{") + 1;
  auto view = nlohmann::json::parse(
      st.output.substr(json_at, st.output.find('\n', json_at) - json_at), nullptr, false);
  ASSERT_FALSE(view.is_discarded()) << st.output;
  EXPECT_EQ(view.value("state", ""), "JOB_STATE_SUCCEEDED") << st.output;
  // The two ranks are the two workers with certificates.
  EXPECT_EQ(view.value("workers_joined", 0), 2) << st.output;
  for (const auto& w : view["workers"]) {
    const std::string id = w.value("worker_id", "");
    const std::string pid = id.substr(id.rfind(':') + 1);
    EXPECT_TRUE(pid == std::to_string(workers[0]) || pid == std::to_string(workers[1])) << id;
  }

  // The worker without a certificate is still outside (the handshake fails before any RPC).
  kill(stranger, SIGTERM);
  WaitProcess(stranger, seconds(20));
  const std::string stranger_log = ReadText(dir + "/no-cert.log");
  EXPECT_EQ(stranger_log.find("joined"), std::string::npos) << stranger_log;
  // ... and says so, once, with the transport's reason.
  EXPECT_NE(stranger_log.find("coordinator " + coord.address() + " not answering, retrying"),
            std::string::npos)
      << stranger_log;
}

}  // namespace
}  // namespace latchkey::testing
