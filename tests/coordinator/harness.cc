#include "tests/coordinator/harness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "nlohmann/json.hpp"
#include "server/sqlite_store.h"

namespace latchkey::testing {

std::string CoordinatorBinary() { return LATCHKEY_COORDINATOR_BIN; }
std::string CliBinary() { return LATCHKEY_CLI_BIN; }

namespace {

// Folders made by TempDir(), removed when the test binary exits.
class TempDirs {
 public:
  ~TempDirs() {
    for (const std::string& d : dirs_) {
      std::error_code ec;
      std::filesystem::remove_all(d, ec);
    }
  }
  std::string Make() {
    char tmpl[] = "/tmp/latchkey_coord_test_XXXXXX";
    const char* dir = mkdtemp(tmpl);
    if (dir == nullptr) std::abort();
    std::lock_guard<std::mutex> lock(mu_);
    dirs_.emplace_back(dir);
    return dir;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> dirs_;
};

TempDirs& AllTempDirs() {
  static TempDirs* dirs = new TempDirs();  // leaked on purpose: see RemoveTempDirsAtExit
  return *dirs;
}

// Runs at exit, after the tests' own objects are gone (registered on first use).
void RemoveTempDirsAtExit() { delete &AllTempDirs(); }

}  // namespace

std::string TempDir() {
  static const bool registered = (std::atexit(RemoveTempDirsAtExit), true);
  (void)registered;
  return AllTempDirs().Make();
}

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
    : db_path_(std::move(db_path)),
      grpc_port_(grpc_port),
      extra_args_(std::move(extra_args)),
      dir_(TempDir()) {}

CoordinatorProcess::~CoordinatorProcess() {
  if (pid_ > 0) Kill9();
}

bool CoordinatorProcess::Start() {
  const std::string port_file = dir_ + "/ports.json";
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
  pid_ = fork();
  if (pid_ == 0) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
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
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

void CoordinatorProcess::Kill9() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
}

int CoordinatorProcess::Terminate() {
  if (pid_ <= 0) return -1;
  kill(pid_, SIGTERM);
  for (int i = 0; i < 200; ++i) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  Kill9();
  return -1;
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

CommandResult RunCommand(const std::vector<std::string>& argv_in, int timeout_s) {
  CommandResult result;
  int pipefd[2];
  if (pipe(pipefd) != 0) return result;
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(pipefd[1], STDOUT_FILENO);
    dup2(pipefd[1], STDERR_FILENO);
    close(pipefd[0]);
    close(pipefd[1]);
    std::vector<std::string> args = argv_in;
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(pipefd[1]);
  fcntl(pipefd[0], F_SETFL, O_NONBLOCK);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  int status = 0;
  bool done = false;
  while (!done) {
    char buf[4096];
    ssize_t n;
    while ((n = read(pipefd[0], buf, sizeof(buf))) > 0)
      result.output.append(buf, static_cast<size_t>(n));
    if (waitpid(pid, &status, WNOHANG) == pid) {
      done = true;
      while ((n = read(pipefd[0], buf, sizeof(buf))) > 0)
        result.output.append(buf, static_cast<size_t>(n));
      break;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      close(pipefd[0]);
      result.output += "\n[killed at deadline]";
      return result;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  close(pipefd[0]);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

}  // namespace latchkey::testing
