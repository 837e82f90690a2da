#include "tests/coordinator/harness.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <thread>

#include "common/subprocess.h"
#include "nlohmann/json.hpp"
#include "server/sqlite_store.h"
#include "tests/support/process.h"

namespace latchkey::testing {

std::string CoordinatorBinary() { return LATCHKEY_COORDINATOR_BIN; }
std::string CliBinary() { return LATCHKEY_CLI_BIN; }

InProcessCoordinator::InProcessCoordinator(CoordinatorOptions options, const std::string& db) {
  auto store = SqliteStore::Open(db);
  if (!store.ok()) std::abort();
  auto core = Coordinator::Create(*std::move(store), options, &metrics_);
  if (!core.ok()) std::abort();
  core_ = *std::move(core);
  core_->StartLivenessChecker();
  ServerOptions so;
  so.listen = "127.0.0.1:0";
  so.stream_poll = absl::Milliseconds(50);
  auto server = CoordinatorServer::Start(core_.get(), so);
  if (!server.ok()) std::abort();
  server_ = *std::move(server);
}

InProcessCoordinator::~InProcessCoordinator() {
  server_->Shutdown(absl::Seconds(1));
  server_->Wait();
  server_.reset();
  core_.reset();
}

std::string InProcessCoordinator::address() const {
  return "127.0.0.1:" + std::to_string(server_->port());
}

CoordinatorProcess::CoordinatorProcess(std::string db_path, int grpc_port,
                                       std::vector<std::string> extra_args)
    : db_path_(std::move(db_path)), grpc_port_(grpc_port), extra_args_(std::move(extra_args)) {}

CoordinatorProcess::~CoordinatorProcess() {
  if (pid_ > 0) Kill9();
}

bool CoordinatorProcess::Start() {
  const std::string port_file = dir_ / "ports.json";
  unlink(port_file.c_str());
  std::vector<std::string> args = {CoordinatorBinary(),
                                   "--listen",
                                   "127.0.0.1:" + std::to_string(grpc_port_),
                                   "--db",
                                   db_path_,
                                   "--metrics-host",
                                   "127.0.0.1",
                                   "--metrics-port",
                                   "0",
                                   "--port-file",
                                   port_file,
                                   "--shutdown-grace",
                                   "1"};
  args.insert(args.end(), extra_args_.begin(), extra_args_.end());
  pid_ = StartProcess(args, env_, "");  // output inherited: it shows in the test's log
  if (pid_ <= 0) return false;
  for (int i = 0; i < 200; ++i) {  // up to 20 s
    std::ifstream in(port_file);
    if (in) {
      auto j = nlohmann::json::parse(in, nullptr, false);
      if (j.is_object()) {
        grpc_port_ = j.value("grpc_port", 0);
        metrics_port_ = j.value("metrics_port", -1);
        return grpc_port_ > 0;
      }
    }
    if (WaitFor(pid_, std::chrono::milliseconds(0)).has_value()) {
      pid_ = -1;
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

bool CoordinatorProcess::Exited(absl::Duration timeout) {
  if (pid_ <= 0) return true;
  if (!WaitFor(pid_, absl::ToChronoMilliseconds(timeout)).has_value()) return false;
  pid_ = -1;
  return true;
}

void CoordinatorProcess::Kill9() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  WaitProcess(pid_, std::chrono::seconds(10));
  pid_ = -1;
}

int CoordinatorProcess::Terminate() {
  if (pid_ <= 0) return -1;
  kill(pid_, SIGTERM);
  const std::optional<int> code = WaitFor(pid_, std::chrono::seconds(10));
  if (!code.has_value()) {
    Kill9();
    return -1;
  }
  pid_ = -1;
  return *code;
}

std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return "";
  }
  std::string resp;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) resp.append(buf, static_cast<size_t>(n));
  close(fd);
  const size_t body = resp.find("\r\n\r\n");
  return body == std::string::npos ? "" : resp.substr(body + 4);
}

}  // namespace latchkey::testing
