#include "tests/support/process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>

extern char** environ;

namespace latchkey::testing {

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int StartProcess(const std::vector<std::string>& args, const std::vector<std::string>& env,
                 const std::string& log) {
  std::vector<std::string> all_env = env;
  for (char** e = environ; *e; ++e) all_env.push_back(*e);
  std::vector<std::string> a = args;
  std::vector<char*> argv, envp;
  for (auto& s : a) argv.push_back(s.data());
  argv.push_back(nullptr);
  for (auto& s : all_env) envp.push_back(s.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  pid_t pid = -1;
  if (posix_spawnp(&pid, argv[0], &fa, nullptr, argv.data(), envp.data()) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&fa);
  return pid;
}

int WaitProcess(int pid, std::chrono::milliseconds deadline) {
  const auto until = std::chrono::steady_clock::now() + deadline;
  while (true) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    if (std::chrono::steady_clock::now() > until) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

Captured RunAndCapture(const std::vector<std::string>& args, std::chrono::milliseconds deadline) {
  static std::atomic<int> n{0};
  const std::string log = std::filesystem::temp_directory_path().string() + "/latchkey-cmd-" +
                          std::to_string(getpid()) + "-" + std::to_string(n++) + ".log";
  Captured c;
  const int pid = StartProcess(args, {}, log);
  if (pid <= 0) return c;
  c.exit_code = WaitProcess(pid, deadline);
  c.output = ReadText(log);
  std::filesystem::remove(log);
  return c;
}

}  // namespace latchkey::testing
