// The CLI as a new user meets it, with real processes (latchkey, latchkey-coordinator,
// latchkey-worker): errors that say what to do (unknown commands and keys, folders given as
// specs, missing files the spec names, connection and TLS failures, the credentials file), the
// exit codes, --version, validate / submit --dry-run, completion, and the one JSON mapping of
// every --json output (docs/cli.md). Every test runs with XDG_CONFIG_HOME and XDG_STATE_HOME in a
// scratch folder, so the user's credentials file and run registry are never touched.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "tests/cli/cli_support.h"
#include "tests/support/process.h"
#include "tests/support/temp_dir.h"

namespace latchkey::testing {
namespace {

using json = nlohmann::json;
using std::chrono::seconds;

TEST(CliErrors, UnknownCommandIsNamedWithTheList) {
  const Captured c = Cli({"stauts", "job-1"});
  EXPECT_EQ(c.exit_code, 2) << c.output;
  EXPECT_TRUE(Has(c.output, "unknown command 'stauts'")) << c.output;
  for (const char* cmd : {"submit", "validate", "status", "logs", "checkpoints", "completion"}) {
    EXPECT_TRUE(Has(c.output, cmd)) << cmd << "\n" << c.output;
  }
  // Global options and their values before the command are not taken for it.
  const Captured ok = Cli({"--timeout", "2", "--json", "completion", "bash"});
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
}

TEST(CliErrors, UsageIsTwoAndInvalidValuesThree) {
  // A value refused: 3, whichever layer refuses it (the command itself, an option's check).
  EXPECT_EQ(Cli({"update", "job-1", "--kv-reduce", "bogus"}).exit_code, 3);
  EXPECT_EQ(Cli({"list", "--state", "bogus"}).exit_code, 3);
  EXPECT_EQ(Cli({"--timeout", "-1", "list"}).exit_code, 3);
  EXPECT_EQ(Cli({"completion", "fish"}).exit_code, 3);
  // The command line itself wrong: 2.
  EXPECT_EQ(Cli({"status"}).exit_code, 2);
  EXPECT_EQ(Cli({"update", "job-1"}).exit_code, 2);
  EXPECT_EQ(Cli({"list", "--no-such-flag"}).exit_code, 2);
}

TEST(CliErrors, AFolderGivenAsASpecSaysSo) {
  const ScopedTempDir dir("cli-folder");
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"submit", dir.path()},
        {"validate", dir.path()},
        {"up", "--spec", dir.path(), "--run-dir", dir / "run"}}) {
    const Captured c = Cli(args, {"--coordinator", "127.0.0.1:1"});
    EXPECT_NE(c.exit_code, 0) << c.output;
    EXPECT_TRUE(Has(c.output, "is a folder")) << args[0] << ": " << c.output;
  }
}

TEST(CliErrors, UnknownSpecKeySuggestsTheNearestOne) {
  const ScopedTempDir dir("cli-typo");
  json spec = BuiltInSpec();
  spec["latchkey"]["stpes"] = spec["latchkey"]["steps"];
  spec["latchkey"].erase("steps");
  const std::string path = WriteSpec(dir.path(), spec);
  const Captured c = Cli({"validate", path});
  EXPECT_EQ(c.exit_code, 3) << c.output;
  EXPECT_TRUE(Has(c.output, "latchkey.stpes: unknown key; did you mean latchkey.steps?"))
      << c.output;
}

// Every file the spec names is checked before anything is submitted or started, naming the
// field; --no-file-check leaves it to the workers.
TEST(CliErrors, FilesTheSpecNamesAreCheckedAtSubmit) {
  const ScopedTempDir dir("cli-files");
  const auto with = [&](const std::string& field, const std::string& path) {
    json spec = BuiltInSpec();
    if (field == "data") spec["latchkey"]["data"] = {{"tokens_file", path}};
    if (field == "eval")
      spec["latchkey"]["eval"] = {{"tokens_file", path}, {"every_steps", 2}, {"samples", 2}};
    if (field == "init_from") spec["latchkey"]["init_from"] = path;
    return WriteSpec(dir.path(), spec, field + ".json");
  };
  const struct {
    std::string spec;
    std::string names;
  } cases[] = {
      {with("data", "missing.bin"), "latchkey.data.tokens_file: cannot read '" + dir.path() +
                                        "/missing.bin': No such file or directory"},
      {with("eval", "."), "latchkey.eval.tokens_file: cannot read '"},
      {with("init_from", "no-model"), "latchkey.init_from: cannot read '"},
  };
  for (const auto& c : cases) {
    // Nothing listens at the coordinator's address: the refusal comes first.
    for (const std::vector<std::string>& args : {std::vector<std::string>{"submit", c.spec},
                                                 {"validate", c.spec},
                                                 {"submit", "--dry-run", c.spec}}) {
      const Captured r = Cli(args, {"--coordinator", "127.0.0.1:1"});
      EXPECT_EQ(r.exit_code, 3) << args[0] << " " << c.spec << "\n" << r.output;
      EXPECT_TRUE(Has(r.output, c.names)) << r.output;
    }
    const Captured up = Cli({"up", "--spec", c.spec, "--run-dir", dir / "run"}, {}, seconds(30));
    EXPECT_EQ(up.exit_code, 3) << up.output;
    EXPECT_TRUE(Has(up.output, c.names)) << up.output;
    EXPECT_FALSE(Has(up.output, "coordinator  ")) << "started something\n" << up.output;
  }
  // --no-file-check: submit goes on to the coordinator (here: nothing listening).
  const Captured skip =
      Cli({"submit", "--no-file-check", cases[0].spec}, {"--coordinator", "127.0.0.1:1"});
  EXPECT_EQ(skip.exit_code, 6) << skip.output;
}

// A file missing where the workers run fails the job at once, naming the field, without a
// single recovery (before: three recoveries, then the job failed).
TEST(CliErrors, AMissingTokenFileFailsTheJobAtOnce) {
  const ScopedTempDir dir("cli-missing-tokens");
  json spec = BuiltInSpec();
  spec["latchkey"]["data"] = {{"tokens_file", "missing.bin"}};
  spec["latchkey"]["max_restarts"] = 3;
  const std::string path = WriteSpec(dir.path(), spec);
  const auto start = std::chrono::steady_clock::now();
  const Captured up =
      Cli({"up", "--no-file-check", "--spec", path, "--run-dir", dir / "run"}, {}, seconds(120));
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(up.exit_code, 10) << up.output;
  EXPECT_TRUE(Has(up.output, "latchkey.data.tokens_file: cannot read")) << up.output;
  EXPECT_TRUE(Has(up.output, "a configuration error: not retried")) << up.output;
  EXPECT_FALSE(Has(up.output, "recovery     attempt")) << up.output;
  EXPECT_LT(took, 60) << up.output;
}

TEST(CliErrors, ConnectionFailuresSayWhatFailed) {
  const ScopedTempDir dir("cli-connect");
  const int free_port = FreePort();
  const std::string nobody = "127.0.0.1:" + std::to_string(free_port);
  const Captured refused = Cli({"list"}, {"--coordinator", nobody});
  EXPECT_EQ(refused.exit_code, 6) << refused.output;
  EXPECT_TRUE(
      Has(refused.output, "nothing is listening at " + nobody + ": is the coordinator running?"))
      << refused.output;
  EXPECT_FALSE(Has(refused.output, "--tls-ca")) << "a TLS hint for a refused connection\n"
                                                << refused.output;

  const Certificates certs = MakeCertificates(dir.path());
  ASSERT_TRUE(certs.ok) << certs.log;
  Coordinator tls(dir.path(), {"--tls-cert", certs.server_pem, "--tls-key", certs.server_key});
  ASSERT_TRUE(tls.ok()) << tls.log();
  // A plaintext client at a TLS coordinator: the TLS hint.
  const Captured plain = Cli({"list"}, {"--coordinator", tls.address(), "--timeout", "5"});
  EXPECT_EQ(plain.exit_code, 6) << plain.output;
  EXPECT_TRUE(Has(plain.output, "if the coordinator serves TLS, pass --tls-ca")) << plain.output;
  // A key given as the CA: refused naming the flag, without gRPC's own log lines.
  const Captured key_as_ca =
      Cli({"list"}, {"--coordinator", tls.address(), "--tls-ca", certs.server_key});
  EXPECT_EQ(key_as_ca.exit_code, 3) << key_as_ca.output;
  EXPECT_TRUE(Has(key_as_ca.output, "--tls-ca: '" + certs.server_key + "' holds no certificate"))
      << key_as_ca.output;
  EXPECT_FALSE(Has(key_as_ca.output, "ssl_transport_security")) << key_as_ca.output;
  EXPECT_EQ(Cli({"list"}, {"--coordinator", tls.address(), "--tls-ca", certs.ca_pem}).exit_code, 0);

  // The worker: no join token says how to give one; no --tls-ca against TLS stops at once with
  // the CLI's hint instead of retrying for its reconnect timeout.
  const Captured no_token =
      Worker({"--coordinator", tls.address(), "--job", "job-1"}, {"LATCHKEY_JOIN_TOKEN="});
  EXPECT_EQ(no_token.exit_code, 2) << no_token.output;
  EXPECT_TRUE(Has(no_token.output, "set LATCHKEY_JOIN_TOKEN or --join-token-file"))
      << no_token.output;
  const auto start = std::chrono::steady_clock::now();
  const Captured plain_worker = Worker({"--coordinator", tls.address(), "--job", "job-1"},
                                       {"LATCHKEY_JOIN_TOKEN=abc"}, seconds(60));
  EXPECT_EQ(plain_worker.exit_code, 1) << plain_worker.output;
  EXPECT_TRUE(Has(plain_worker.output, "if the coordinator serves TLS, pass --tls-ca"))
      << plain_worker.output;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 20);
}

TEST(CliErrors, TheCredentialsFile) {
  const ScopedTempDir dir("cli-credentials");
  const std::string token = "0123456789abcdef0123456789abcdef";
  Coordinator c(dir.path(), {"--auth-tokens", WriteAuthTokens(dir.path(), token)});
  ASSERT_TRUE(c.ok()) << c.log();
  const std::string file = dir / "credentials";
  // An explicit file that does not exist is an error, not "no token".
  const Captured missing =
      Cli({"list"}, {"--coordinator", c.address(), "--credentials-file", file});
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_TRUE(Has(missing.output, "--credentials-file: '" + file + "' does not exist"))
      << missing.output;
  // No entry for this coordinator: the refusal lists the entries there are.
  WritePrivate(file, json{{"127.0.0.1:1", {{"token", "x"}}}}.dump());
  const Captured none = Cli({"list"}, {"--coordinator", c.address(), "--credentials-file", file});
  EXPECT_EQ(none.exit_code, 7) << none.output;
  EXPECT_TRUE(
      Has(none.output, "has no entry for " + c.address() + " (it has entries for 127.0.0.1:1"))
      << none.output;
  // Written under 127.0.0.1:P, found for localhost:P.
  WritePrivate(file, json{{c.address(), {{"token", token}}}}.dump());
  const std::string localhost = "localhost:" + std::to_string(c.port());
  const Captured normalised =
      Cli({"list"}, {"--coordinator", localhost, "--credentials-file", file});
  EXPECT_EQ(normalised.exit_code, 0) << normalised.output;
  EXPECT_FALSE(Has(normalised.output, "readable by others")) << normalised.output;
  // A token file others can read: a warning (the call still works).
  ASSERT_EQ(chmod(file.c_str(), 0644), 0);
  const Captured readable = Cli({"list"}, {"--coordinator", localhost, "--credentials-file", file});
  EXPECT_EQ(readable.exit_code, 0) << readable.output;
  EXPECT_TRUE(Has(readable.output, "readable by others (mode 0644): chmod 600 " + file))
      << readable.output;
}

// A token on the command line is visible to anyone who can list processes: --token warns, as
// the worker's --join-token does, naming the environment variable and the credentials file; a
// token from the credentials file does not warn.
TEST(CliErrors, ATokenOnTheCommandLineWarns) {
  const ScopedTempDir dir("cli-token-warning");
  const std::string token = "0123456789abcdef0123456789abcdef";
  Coordinator c(dir.path(), {"--auth-tokens", WriteAuthTokens(dir.path(), token)});
  ASSERT_TRUE(c.ok()) << c.log();
  const std::string warning =
      "latchkey: warning: --token shows the token to anyone who can list processes; use "
      "LATCHKEY_TOKEN or --credentials-file";
  const Captured flag = Cli({"list"}, {"--coordinator", c.address(), "--token", token});
  EXPECT_EQ(flag.exit_code, 0) << flag.output;
  EXPECT_TRUE(Has(flag.output, warning)) << flag.output;
  const std::string file = dir / "credentials";
  WritePrivate(file, json{{c.address(), {{"token", token}}}}.dump());
  const Captured from_file =
      Cli({"list"}, {"--coordinator", c.address(), "--credentials-file", file});
  EXPECT_EQ(from_file.exit_code, 0) << from_file.output;
  EXPECT_FALSE(Has(from_file.output, "warning: --token")) << from_file.output;
}

// Two processes of one machine given the same --metrics-port: the second fails naming the flag
// (before, both listened on it, SO_REUSEPORT, and a scrape reached either).
TEST(CliErrors, AMetricsPortInUseIsRefusedNamingTheFlag) {
  const ScopedTempDir dir("cli-metrics-port");
  // The port held as another worker held it (cpp-httplib's default options: SO_REUSEPORT).
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  int yes = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &yes, sizeof(yes));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 4), 0);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);
  json spec = BuiltInSpec();
  spec["tensor_parallel"]["autotp_size"] = 1;
  spec["latchkey"]["world_size"] = 1;
  spec["latchkey"]["steps"] = 2;
  const std::string path = WriteSpec(dir.path(), spec);
  const Captured w =
      Worker({"--standalone", "--spec", path, "--metrics-host", "127.0.0.1", "--metrics-port",
              std::to_string(port)},
             {"RANK=0", "WORLD_SIZE=1", "MASTER_PORT=" + std::to_string(FreePort())}, seconds(120));
  close(fd);
  EXPECT_NE(w.exit_code, 0) << w.output;
  EXPECT_TRUE(Has(w.output, "--metrics-port: cannot listen on 127.0.0.1:" + std::to_string(port)))
      << w.output;
}

TEST(CliCommands, VersionOnTheThreeBinaries) {
  for (const auto& [name, run] :
       {std::pair<std::string, Captured>{"latchkey", Cli({"--version"})},
        {"latchkey-coordinator", RunAndCapture({LATCHKEY_COORDINATOR_BIN, "--version"})},
        {"latchkey-worker", RunAndCapture({LATCHKEY_WORKER_BIN, "--version"})}}) {
    EXPECT_EQ(run.exit_code, 0) << name << ": " << run.output;
    EXPECT_EQ(run.output.rfind(name + " ", 0), 0u) << run.output;
    for (const char* part : {"(commit ", ", libtorch ", ", CUDA "}) {
      EXPECT_TRUE(Has(run.output, part)) << name << ": " << run.output;
    }
  }
}

TEST(CliCommands, ValidateAndDryRunSubmitNothing) {
  const ScopedTempDir dir("cli-validate");
  const std::string path = WriteSpec(dir.path(), BuiltInSpec());
  const Captured v = Cli({"validate", path}, {"--coordinator", "127.0.0.1:1"});
  EXPECT_EQ(v.exit_code, 0) << v.output;
  // The built-in model: 4 layers of n_embd 128, multi-query, vocab 256, 128 positions.
  EXPECT_TRUE(Has(v.output, "world:        2 ranks (tp 2 x dp 1)")) << v.output;
  EXPECT_TRUE(Has(v.output, " parameters (4 layers")) << v.output;
  EXPECT_TRUE(Has(v.output, "memory/rank:  ")) << v.output;
  const Captured vj = Cli({"--json", "validate", path});
  ASSERT_EQ(vj.exit_code, 0) << vj.output;
  const json j = json::parse(vj.output);
  EXPECT_EQ(j["valid"], true);
  EXPECT_EQ(j["world_size"], 2);
  EXPECT_GT(j["parameters"].get<int64_t>(), 700000);
  Coordinator c(dir.path());
  ASSERT_TRUE(c.ok()) << c.log();
  const Captured dry = Cli({"submit", "--dry-run", path}, {"--coordinator", c.address()});
  EXPECT_EQ(dry.exit_code, 0) << dry.output;
  EXPECT_TRUE(Has(dry.output, "dry run: nothing submitted")) << dry.output;
  const Captured list = Cli({"--json", "list"}, {"--coordinator", c.address()});
  ASSERT_EQ(list.exit_code, 0) << list.output;
  EXPECT_EQ(json::parse(list.output)["jobs"], json::array()) << list.output;
}

TEST(CliCommands, CompletionScriptsParseAndNameEveryCommand) {
  for (const char* shell : {"bash", "zsh"}) {
    const Captured c = Cli({"completion", shell});
    ASSERT_EQ(c.exit_code, 0) << c.output;
    for (const char* word : {"submit", "validate", "logs", "checkpoints", "--run-dir", "inspect"}) {
      EXPECT_TRUE(Has(c.output, word)) << shell << ": " << word;
    }
  }
  const ScopedTempDir dir("cli-completion");
  std::ofstream(dir / "c.bash") << Cli({"completion", "bash"}).output;
  // Loaded into bash, it completes commands and a command's options.
  const Captured run = RunAndCapture(
      {"bash", "-c",
       "source " + dir / "c.bash" +
           " && COMP_WORDS=(latchkey chec); COMP_CWORD=1; _latchkey; echo ${COMPREPLY[@]}; "
           "COMP_WORDS=(latchkey logs job --r); COMP_CWORD=3; _latchkey; echo ${COMPREPLY[@]}; "
           // An alias completes, and completes its command's options: `audit` is `latches`.
           "COMP_WORDS=(latchkey aud); COMP_CWORD=1; _latchkey; echo A ${COMPREPLY[@]}; "
           "COMP_WORDS=(latchkey audit job --fr); COMP_CWORD=3; _latchkey; echo B "
           "${COMPREPLY[@]}"});
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_TRUE(Has(run.output, "checkpoints checkpoint")) << run.output;
  EXPECT_TRUE(Has(run.output, "--rank --run-dir")) << run.output;
  EXPECT_TRUE(Has(run.output, "\nA audit\n")) << run.output;
  EXPECT_TRUE(Has(run.output, "\nB --from\n")) << run.output;
}

}  // namespace
}  // namespace latchkey::testing
