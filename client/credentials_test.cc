// The credentials file (real files in a temp folder), tokens, and the channel helper's refusals
// of unusable credentials.
#include "client/credentials.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "common/connection_hint.h"
#include "proto/channel.h"

namespace latchkey {
namespace {

namespace fs = std::filesystem;

std::string TempDir() {
  std::string templ = (fs::temp_directory_path() / "latchkey-credentials-XXXXXX").string();
  const char* made = mkdtemp(templ.data());
  EXPECT_NE(made, nullptr);
  return templ;
}

int Mode(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(stat(path.c_str(), &st), 0) << path;
  return static_cast<int>(st.st_mode & 0777);
}

TEST(Credentials, SaveThenLookupMergesEntriesWithPrivateModes) {
  const std::string dir = TempDir();
  const std::string path = dir + "/cfg/latchkey/credentials";
  ASSERT_TRUE(SaveCredentials(path, "127.0.0.1:1", {"aaa", ""}).ok());
  ASSERT_TRUE(SaveCredentials(path, "127.0.0.1:2", {"bbb", "/ca.pem"}).ok());
  ASSERT_TRUE(SaveCredentials(path, "127.0.0.1:1", {"ccc", ""}).ok());  // replaces
  EXPECT_EQ(Mode(path), 0600);
  EXPECT_EQ(Mode(dir + "/cfg/latchkey"), 0700);
  auto one = LookupCredentials(path, "127.0.0.1:1");
  ASSERT_TRUE(one.ok() && one->has_value());
  EXPECT_EQ((*one)->token, "ccc");
  EXPECT_EQ((*one)->tls_ca, "");
  auto two = LookupCredentials(path, "127.0.0.1:2");
  ASSERT_TRUE(two.ok() && two->has_value());
  EXPECT_EQ((*two)->token, "bbb");
  EXPECT_EQ((*two)->tls_ca, "/ca.pem");
  auto none = LookupCredentials(path, "127.0.0.1:3");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  auto missing = LookupCredentials(dir + "/nope", "127.0.0.1:1");
  ASSERT_TRUE(missing.ok());
  EXPECT_FALSE(missing->has_value());
  fs::remove_all(dir);
}

// Processes that save and remove entries at once (several `latchkey up` on one machine) lose
// none: each read-change-write holds the file's lock. Without it, one process wrote back the
// file as it had read it and another's entry was gone.
TEST(Credentials, ProcessesSavingAtOnceKeepEveryEntry) {
  const std::string dir = TempDir();
  const std::string path = dir + "/credentials";
  constexpr int kProcesses = 6, kEach = 15;
  std::vector<pid_t> pids;
  for (int p = 0; p < kProcesses; ++p) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      bool ok = true;
      for (int i = 0; i < kEach; ++i) {
        const std::string me = "127.0.0.1:" + std::to_string(1000 + p * 100 + i);
        ok = ok && SaveCredentials(path, me, {"t" + std::to_string(p), ""}).ok();
        // A transient entry, saved and removed again (as an `up` that ends).
        const std::string gone = "127.0.0.1:" + std::to_string(9000 + p * 100 + i);
        ok = ok && SaveCredentials(path, gone, {"x", ""}).ok();
        ok = ok && RemoveCredentials(path, gone, "x").ok();
      }
      _exit(ok ? 0 : 1);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }
  const std::vector<std::string> entries = CredentialsEntries(path);
  EXPECT_EQ(entries.size(), static_cast<size_t>(kProcesses * kEach));
  for (int p = 0; p < kProcesses; ++p) {
    for (int i = 0; i < kEach; ++i) {
      auto got = LookupCredentials(path, "127.0.0.1:" + std::to_string(1000 + p * 100 + i));
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_TRUE(got->has_value() && (*got)->token == "t" + std::to_string(p)) << p << " " << i;
    }
  }
  fs::remove_all(dir);
}

TEST(Credentials, AddressesOfOneCoordinatorAreOneEntry) {
  const std::string dir = TempDir();
  const std::string path = dir + "/credentials";
  ASSERT_TRUE(SaveCredentials(path, "127.0.0.1:4100", {"aaa", ""}).ok());
  ASSERT_TRUE(SaveCredentials(path, "Node-7:4101", {"bbb", ""}).ok());
  EXPECT_EQ(NormalizeCoordinatorAddress("localhost:4100"), "127.0.0.1:4100");
  EXPECT_EQ(NormalizeCoordinatorAddress("dns:///[::1]:4100"), "127.0.0.1:4100");
  for (const char* spelling : {"localhost:4100", "LOCALHOST:4100", "[::1]:4100"}) {
    auto found = LookupCredentials(path, spelling);
    ASSERT_TRUE(found.ok() && found->has_value()) << spelling;
    EXPECT_EQ((*found)->token, "aaa") << spelling;
  }
  auto other_host = LookupCredentials(path, "node-7:4101");
  ASSERT_TRUE(other_host.ok() && other_host->has_value());
  EXPECT_EQ((*other_host)->token, "bbb");
  auto other_port = LookupCredentials(path, "localhost:4101");
  ASSERT_TRUE(other_port.ok());
  EXPECT_FALSE(other_port->has_value());
  EXPECT_EQ(CredentialsEntries(path), (std::vector<std::string>{"127.0.0.1:4100", "Node-7:4101"}));
  // Removed only while it holds the token of the run that wrote it.
  ASSERT_TRUE(RemoveCredentials(path, "127.0.0.1:4100", "not-mine").ok());
  EXPECT_EQ(CredentialsEntries(path).size(), 2u);
  ASSERT_TRUE(RemoveCredentials(path, "127.0.0.1:4100", "aaa").ok());
  EXPECT_EQ(CredentialsEntries(path), (std::vector<std::string>{"Node-7:4101"}));
  EXPECT_EQ(Mode(path), 0600);
  fs::remove_all(dir);
}

TEST(Credentials, MalformedFileIsRefusedNamingIt) {
  const std::string dir = TempDir();
  const std::string path = dir + "/credentials";
  std::ofstream(path) << "[1, 2]";
  auto r = LookupCredentials(path, "a:1");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(path), std::string::npos);
  std::ofstream(path) << R"({"a:1": {"token": 5}})";
  r = LookupCredentials(path, "a:1");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("a:1"), std::string::npos);
  // Saving over a file that is not an object refuses rather than dropping what it holds.
  std::ofstream(path) << "[1, 2]";
  EXPECT_FALSE(SaveCredentials(path, "b:1", {"t", ""}).ok());
  fs::remove_all(dir);
}

TEST(Credentials, DefaultPathFollowsXdgThenHome) {
  const char* xdg = std::getenv("XDG_CONFIG_HOME");
  const std::string saved = xdg ? xdg : "";
  setenv("XDG_CONFIG_HOME", "/x/cfg", 1);
  EXPECT_EQ(DefaultCredentialsPath(), "/x/cfg/latchkey/credentials");
  unsetenv("XDG_CONFIG_HOME");
  setenv("HOME", "/home/u", 1);
  EXPECT_EQ(DefaultCredentialsPath(), "/home/u/.config/latchkey/credentials");
  if (xdg) setenv("XDG_CONFIG_HOME", saved.c_str(), 1);
}

TEST(Credentials, TokensAreRandomHexAndHashesAreSha256) {
  auto a = RandomHexToken(32);
  auto b = RandomHexToken(32);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), 64u);
  EXPECT_EQ(a->find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_NE(*a, *b);
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Credentials, WritePrivateFileTightensAnExistingFile) {
  const std::string dir = TempDir();
  const std::string path = dir + "/f";
  std::ofstream(path) << "old";
  chmod(path.c_str(), 0644);
  ASSERT_TRUE(WritePrivateFile(path, "new").ok());
  EXPECT_EQ(Mode(path), 0600);
  std::ifstream in(path);
  std::string text;
  in >> text;
  EXPECT_EQ(text, "new");
  fs::remove_all(dir);
}

TEST(Channel, UnusableCredentialsAreRefusedNamingTheFlag) {
  const std::string dir = TempDir();
  std::ofstream(dir + "/not.pem") << "hello";
  auto expect_refused = [](const ChannelCredentials& c, const std::string& flag) {
    auto ch = MakeCoordinatorChannel("127.0.0.1:1", c);
    ASSERT_FALSE(ch.ok()) << flag;
    EXPECT_EQ(ch.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(ch.status().message().find(flag), std::string::npos) << ch.status();
  };
  auto creds = [](std::string token, std::string ca, std::string cert, std::string key) {
    ChannelCredentials c;
    c.token = std::move(token);
    c.tls_ca = std::move(ca);
    c.tls_cert = std::move(cert);
    c.tls_key = std::move(key);
    return c;
  };
  expect_refused(creds("", dir + "/missing.pem", "", ""), "--tls-ca");
  expect_refused(creds("", dir + "/not.pem", "", ""), "--tls-ca");
  // A PEM without a certificate (a key given as the CA) is refused before gRPC sees it.
  std::ofstream(dir + "/key.pem")
      << "-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n";
  expect_refused(creds("", dir + "/key.pem", "", ""), "--tls-ca");
  auto key_as_ca = MakeCoordinatorChannel("127.0.0.1:1", creds("", dir + "/key.pem", "", ""));
  EXPECT_NE(key_as_ca.status().message().find("holds no certificate"), std::string::npos)
      << key_as_ca.status();
  expect_refused(creds("", "", "c.pem", ""), "--tls-key");
  expect_refused(creds("", "", "c.pem", "k.pem"), "--tls-ca");
  expect_refused(creds("two words", "", "", ""), "--token");
  expect_refused(creds("line\nbreak", "", "", ""), "--token");
  EXPECT_TRUE(MakeCoordinatorChannel("127.0.0.1:1", ChannelCredentials{}).ok());
  EXPECT_TRUE(MakeCoordinatorChannel("127.0.0.1:1", creds("abc123", "", "", "")).ok());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace latchkey

namespace latchkey {
namespace {

TEST(ConnectionHint, SaysWhatFailedInGrpcsWords) {
  const std::string refused =
      "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Failed to "
      "connect to remote host: Connection refused";
  EXPECT_EQ(ExplainUnavailable(refused, "127.0.0.1:1", false),
            "nothing is listening at 127.0.0.1:1: is the coordinator running? (" + refused + ")");
  EXPECT_EQ(DiagnoseConnection(refused, true), ConnectionProblem::kRefused);  // no TLS hint
  const std::string handshake =
      "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:2: Ssl handshake "
      "failed: SSL_ERROR_SSL: error:0A00010B:SSL routines::wrong version number";
  EXPECT_EQ(DiagnoseConnection(handshake, true), ConnectionProblem::kTlsHandshake);
  EXPECT_NE(ExplainUnavailable(handshake, "h:2", true).find("the TLS handshake with h:2 failed"),
            std::string::npos);
  const std::string closed =
      "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:3: Socket "
      "closed";
  EXPECT_EQ(DiagnoseConnection(closed, false), ConnectionProblem::kTlsExpected);
  EXPECT_NE(ExplainUnavailable(closed, "h:3", false).find("pass --tls-ca"), std::string::npos);
  EXPECT_EQ(ExplainUnavailable("Deadline Exceeded", "h:4", false), "Deadline Exceeded");
}

}  // namespace
}  // namespace latchkey
