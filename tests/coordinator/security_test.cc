// The coordinator's security (docs/protocol.md "Security") over real gRPC on loopback: TLS and
// mTLS with a CA made here with the openssl CLI, every RPC against a table of callers, join
// tokens absent from the database file, the log of refused calls, and the start-up refusals of
// the real latchkey-coordinator binary.
#include "server/security.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "latchkey/v1/job_service.grpc.pb.h"
#include "latchkey/v1/worker_service.grpc.pb.h"
#include "server/coordinator.h"
#include "server/server.h"
#include "server/sqlite_store.h"
#include "tests/support/process.h"
#include "tests/support/specs.h"
#include "tests/support/temp_dir.h"

namespace latchkey::testing {
namespace {

using grpc::StatusCode;

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A coordinator on 127.0.0.1:0 over a SQLite file, with the given server options; its log kept.
class SecureCoordinator {
 public:
  SecureCoordinator(const std::string& db, ServerOptions so) {
    auto store = SqliteStore::Open(db);
    EXPECT_TRUE(store.ok()) << store.status();
    CoordinatorOptions opt;
    opt.latch_lookahead = 1;
    auto core = Coordinator::Create(*std::move(store), opt, nullptr);
    EXPECT_TRUE(core.ok()) << core.status();
    core_ = *std::move(core);
    so.listen = "127.0.0.1:0";
    so.stream_poll = absl::Milliseconds(50);
    so.log = [this](const std::string& line) {
      absl::MutexLock lock(&mu_);
      log_ += line + "\n";
    };
    auto server = CoordinatorServer::Start(core_.get(), so);
    EXPECT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }
  ~SecureCoordinator() {
    server_->Shutdown(absl::Seconds(1));
    server_->Wait();
    server_.reset();
    core_.reset();
  }
  int port() const { return server_->port(); }
  std::string log() {
    absl::MutexLock lock(&mu_);
    return log_;
  }

 private:
  std::unique_ptr<Coordinator> core_;
  std::unique_ptr<CoordinatorServer> server_;
  absl::Mutex mu_;
  std::string log_;
};

std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token, int ms = 5000) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(ms));
  if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
  return ctx;
}

// ---- TLS ----

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string script =
        "set -e; cd " + dir_.path() +
        "; K='-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes'"
        "; openssl req -x509 $K -keyout ca.key -out ca.pem -days 2 -subj /CN=latchkey-test-ca"
        "; openssl req $K -keyout server.key -out server.csr -subj /CN=localhost"
        "; printf 'subjectAltName=DNS:localhost,IP:127.0.0.1' > san.ext"
        "; openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial"
        " -out server.pem -days 2 -extfile san.ext"
        "; openssl req $K -keyout client.key -out client.csr -subj /CN=client"
        "; openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial"
        " -out client.pem -days 2"
        // A second CA, and a client certificate of the same name signed by it.
        "; openssl req -x509 $K -keyout other-ca.key -out other-ca.pem -days 2"
        " -subj /CN=latchkey-test-ca"
        "; openssl req $K -keyout other-client.key -out other-client.csr -subj /CN=client"
        "; openssl x509 -req -in other-client.csr -CA other-ca.pem -CAkey other-ca.key"
        " -CAcreateserial -out other-client.pem -days 2";
    Captured r = RunAndCapture({"sh", "-c", script});
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  std::string Pem(const std::string& name) { return Slurp(dir_.path() + "/" + name); }

  ServerOptions Tls(bool mtls) {
    ServerOptions so;
    so.tls_cert_pem = Pem("server.pem");
    so.tls_key_pem = Pem("server.key");
    if (mtls) so.tls_client_ca_pem = Pem("ca.pem");
    return so;
  }

  // ListJobs over `creds`; the status.
  grpc::Status Call(int port, std::shared_ptr<grpc::ChannelCredentials> creds) {
    auto stub =
        v1::JobService::NewStub(grpc::CreateChannel("localhost:" + std::to_string(port), creds));
    v1::ListJobsRequest req;
    v1::ListJobsResponse resp;
    return stub->ListJobs(Ctx("", 3000).get(), req, &resp);
  }

  grpc::SslCredentialsOptions WithCa() {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = Pem("ca.pem");
    return o;
  }

  ScopedTempDir dir_{"tls"};
};

TEST_F(TlsTest, PlaintextAndCaLessClientsFailAndTheCaWorks) {
  SecureCoordinator c(dir_.path() + "/coord.db", Tls(false));
  EXPECT_EQ(Call(c.port(), grpc::InsecureChannelCredentials()).error_code(),
            StatusCode::UNAVAILABLE);
  grpc::SslCredentialsOptions no_ca;
  no_ca.pem_root_certs = Pem("client.pem");  // trusts something else, not our CA
  EXPECT_EQ(Call(c.port(), grpc::SslCredentials(no_ca)).error_code(), StatusCode::UNAVAILABLE);
  grpc::Status ok = Call(c.port(), grpc::SslCredentials(WithCa()));
  EXPECT_TRUE(ok.ok()) << ok.error_message();
}

TEST_F(TlsTest, MutualTlsRefusesAClientWithoutACertificate) {
  SecureCoordinator c(dir_.path() + "/coord.db", Tls(true));
  EXPECT_EQ(Call(c.port(), grpc::SslCredentials(WithCa())).error_code(), StatusCode::UNAVAILABLE);
  grpc::SslCredentialsOptions full = WithCa();
  full.pem_cert_chain = Pem("client.pem");
  full.pem_private_key = Pem("client.key");
  grpc::Status ok = Call(c.port(), grpc::SslCredentials(full));
  EXPECT_TRUE(ok.ok()) << ok.error_message();
}

// A client certificate another CA signed (same subject, a valid chain of its own) is refused;
// the same call with our CA's certificate works.
TEST_F(TlsTest, MutualTlsRefusesAClientCertificateFromAnotherCa) {
  SecureCoordinator c(dir_.path() + "/coord.db", Tls(true));
  grpc::SslCredentialsOptions other = WithCa();
  other.pem_cert_chain = Pem("other-client.pem");
  other.pem_private_key = Pem("other-client.key");
  EXPECT_EQ(Call(c.port(), grpc::SslCredentials(other)).error_code(), StatusCode::UNAVAILABLE);
  grpc::SslCredentialsOptions ours = WithCa();
  ours.pem_cert_chain = Pem("client.pem");
  ours.pem_private_key = Pem("client.key");
  grpc::Status ok = Call(c.port(), grpc::SslCredentials(ours));
  EXPECT_TRUE(ok.ok()) << ok.error_message();
}

TEST_F(TlsTest, TheBinaryRefusesUnreadableOrMalformedPemNamingTheFlag) {
  const std::string db = dir_.path() + "/c.db";
  const std::string bin = std::string(LATCHKEY_COORDINATOR_BIN);
  std::ofstream(dir_.path() + "/junk.pem") << "not a certificate\n";
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  const std::string d = dir_.path() + "/";
  const std::vector<Case> cases = {
      {{"--tls-cert", d + "missing.pem", "--tls-key", d + "server.key"}, "--tls-cert"},
      {{"--tls-cert", d + "junk.pem", "--tls-key", d + "server.key"}, "--tls-cert"},
      {{"--tls-cert", d + "server.pem", "--tls-key", d + "junk.pem"}, "--tls-key"},
      {{"--tls-cert", d + "server.pem", "--tls-key", d + "client.key"}, "--tls-key"},
      {{"--tls-cert", d + "server.pem", "--tls-key", d + "server.key", "--tls-client-ca",
        d + "junk.pem"},
       "--tls-client-ca"},
      {{"--tls-cert", d + "server.pem"}, "--tls-key"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {bin, "--listen",       "127.0.0.1:0", "--db",
                                     db,  "--metrics-port", "-1"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    Captured r = RunAndCapture(args, std::chrono::seconds(20));
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find(c.says), std::string::npos) << r.output;
  }
}

TEST(SecurityStartupTest, NonLoopbackWithoutAuthRefusesAndAMalformedTokenFileNamesTheLine) {
  ScopedTempDir dir("startup");
  const std::string db = dir.path() + "/c.db";
  Captured open = RunAndCapture({std::string(LATCHKEY_COORDINATOR_BIN), "--listen", "0.0.0.0:0",
                                 "--db", db, "--metrics-port", "-1"},
                                std::chrono::seconds(20));
  EXPECT_EQ(open.exit_code, 1) << open.output;
  EXPECT_NE(open.output.find("--auth-tokens"), std::string::npos) << open.output;
  EXPECT_NE(open.output.find("--allow-unauthenticated"), std::string::npos) << open.output;
  EXPECT_FALSE(std::filesystem::exists(db)) << "refused before the database is created";

  const std::string tokens = dir.path() + "/tokens";
  std::ofstream(tokens) << "# ok\nadmin root " << Sha256Hex("x") << "\nwriter bob abcd\n";
  Captured bad = RunAndCapture({std::string(LATCHKEY_COORDINATOR_BIN), "--listen", "127.0.0.1:0",
                                "--db", db, "--metrics-port", "-1", "--auth-tokens", tokens},
                               std::chrono::seconds(20));
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_NE(bad.output.find("line 3"), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace latchkey::testing
