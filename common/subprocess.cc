#include "common/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

extern char** environ;

namespace latchkey {
namespace {

ExitInfo FromStatus(int status) {
  ExitInfo e;
  if (WIFEXITED(status)) {
    e.code = WEXITSTATUS(status);
  } else {
    e.signal = WTERMSIG(status);
  }
  return e;
}

int ExitCode(int status) { return FromStatus(status).combined(); }

}  // namespace

absl::StatusOr<pid_t> Spawn(const SpawnOptions& options) {
  if (options.args.empty()) return absl::InvalidArgumentError("Spawn: no program given");
  std::vector<std::string> env = options.extra_env;
  for (char** e = environ; *e != nullptr; ++e) env.push_back(*e);
  std::vector<std::string> args = options.args;
  std::vector<char*> argv, envp;
  for (std::string& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  for (std::string& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);

  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  if (!options.log_path.empty()) {
    posix_spawn_file_actions_addopen(&fa, 1, options.log_path.c_str(),
                                     O_WRONLY | O_CREAT | (options.append_log ? O_APPEND : O_TRUNC),
                                     0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
  }
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, argv[0], &fa, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    const std::string msg = "cannot start " + options.args[0] + ": " + std::strerror(rc);
    return rc == ENOENT ? absl::NotFoundError(msg) : absl::InternalError(msg);
  }
  return pid;
}

std::optional<int> WaitFor(pid_t pid, std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (true) {
    int status = 0;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return ExitCode(status);
    if (r < 0 && errno != EINTR) return -1;  // not our child (or already reaped)
    if (std::chrono::steady_clock::now() >= until) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::string DescribeExit(const ExitInfo& exit) {
  if (exit.signal != 0) return "killed by signal " + std::to_string(exit.signal);
  if (exit.code < 0) return "not a child of this process";
  return "exited with code " + std::to_string(exit.code);
}

std::optional<ExitInfo> PollExit(pid_t pid) {
  while (true) {
    int status = 0;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return FromStatus(status);
    if (r == 0) return std::nullopt;
    if (errno != EINTR) return ExitInfo{-1, 0};
  }
}

int WaitOrKill(pid_t pid, std::chrono::milliseconds deadline) {
  if (auto code = WaitFor(pid, deadline)) return *code;
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return -1;
}

void StopAll(const std::vector<pid_t>& pids, std::chrono::milliseconds grace,
             std::chrono::milliseconds patience) {
  const auto patient_until = std::chrono::steady_clock::now() + patience;
  std::vector<pid_t> running;
  for (pid_t p : pids) {
    if (p <= 0) continue;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        patient_until - std::chrono::steady_clock::now());
    if (!WaitFor(p, std::max(left, std::chrono::milliseconds(0))).has_value()) {
      running.push_back(p);
    }
  }
  for (pid_t p : running) kill(p, SIGTERM);
  const auto until = std::chrono::steady_clock::now() + grace;
  for (pid_t p : running) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    WaitOrKill(p, std::max(left, std::chrono::milliseconds(0)));
  }
}

}  // namespace latchkey
