#include "common/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
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

absl::Status CannotStart(const std::string& program, int err) {
  const std::string msg = "cannot start " + program + ": " + std::strerror(err);
  return err == ENOENT ? absl::NotFoundError(msg) : absl::InternalError(msg);
}

// A thread that lives as long as the process and runs what it is handed, one at a time. Children
// with a parent-death signal are forked here: PR_SET_PDEATHSIG fires when the forking thread
// ends, and the threads of a supervisor (a restart loop, a signal thread) end before it does.
// Its signal mask is that of the thread that first needed it (a launcher blocks its stop
// signals before starting any thread), so it never takes a signal meant for sigwait.
class ForkingThread {
 public:
  static ForkingThread& Get() {
    static ForkingThread* const thread = new ForkingThread();  // never destroyed: see above
    return *thread;
  }
  void Run(const std::function<void()>& task) {
    std::unique_lock<std::mutex> lock(mu_);
    bool done = false;
    queue_.push_back({&task, &done});
    cv_.notify_all();
    cv_.wait(lock, [&] { return done; });
  }

 private:
  struct Task {
    const std::function<void()>* run;
    bool* done;
  };
  ForkingThread() {
    std::thread([this] { Loop(); }).detach();
  }
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return !queue_.empty(); });
      const Task task = queue_.front();
      queue_.pop_front();
      lock.unlock();
      (*task.run)();
      lock.lock();
      *task.done = true;
      cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
};

// args[0] as posix_spawnp finds it: a name without '/' is looked up on this process's PATH.
std::string ResolveProgram(const std::string& program) {
  if (program.find('/') != std::string::npos) return program;
  const char* path_env = std::getenv("PATH");
  const std::string path = path_env != nullptr ? path_env : "/bin:/usr/bin";
  size_t begin = 0;
  while (begin <= path.size()) {
    const size_t end = std::min(path.find(':', begin), path.size());
    const std::string dir = end > begin ? path.substr(begin, end - begin) : ".";
    const std::string candidate = dir + "/" + program;
    struct stat st {};
    if (stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
    begin = end + 1;
  }
  return "";
}

// fork + exec for the options posix_spawn has no attribute for (the parent-death signal). Only
// async-signal-safe calls run in the child (the parent has other threads); an exec that fails
// sends its errno back through a close-on-exec pipe, so the caller gets it as posix_spawn's.
absl::StatusOr<pid_t> ForkExec(const SpawnOptions& options, char* const* argv, char* const* envp) {
  const std::string program = ResolveProgram(options.args[0]);
  if (program.empty()) return CannotStart(options.args[0], ENOENT);
  const int log_flags = O_WRONLY | O_CREAT | O_CLOEXEC | (options.append_log ? O_APPEND : O_TRUNC);
  int report[2];
  if (pipe2(report, O_CLOEXEC) != 0) return CannotStart(options.args[0], errno);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    const int err = errno;
    close(report[0]);
    close(report[1]);
    return CannotStart(options.args[0], err);
  }
  if (pid == 0) {
    auto fail = [&](int err) {
      (void)!write(report[1], &err, sizeof(err));
      _exit(127);
    };
    if (options.own_process_group && setpgid(0, 0) != 0) fail(errno);
    if (prctl(PR_SET_PDEATHSIG, options.parent_death_signal) != 0) fail(errno);
    // The parent may have ended before the line above: then nobody would send the signal.
    if (getppid() != parent) _exit(128 + options.parent_death_signal);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    const int in = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (in < 0 || dup2(in, 0) < 0) fail(errno);
    if (!options.log_path.empty()) {
      const int out = open(options.log_path.c_str(), log_flags, 0644);
      if (out < 0 || dup2(out, 1) < 0 || dup2(out, 2) < 0) fail(errno);
    }
    execve(program.c_str(), argv, envp);
    fail(errno);
  }
  // Also here, so a signal sent to the group right after Spawn returns finds it formed.
  if (options.own_process_group) setpgid(pid, pid);
  close(report[1]);
  int err = 0;
  ssize_t n;
  do {
    n = read(report[0], &err, sizeof(err));
  } while (n < 0 && errno == EINTR);
  close(report[0]);
  if (n == static_cast<ssize_t>(sizeof(err))) {
    waitpid(pid, nullptr, 0);
    return CannotStart(options.args[0], err);
  }
  return pid;
}

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

  if (options.parent_death_signal != 0) {
    absl::StatusOr<pid_t> forked = absl::InternalError("not started");
    ForkingThread::Get().Run([&] { forked = ForkExec(options, argv.data(), envp.data()); });
    return forked;
  }
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
  short flags = POSIX_SPAWN_SETSIGMASK;
  if (options.own_process_group) {
    posix_spawnattr_setpgroup(&attr, 0);
    flags |= POSIX_SPAWN_SETPGROUP;
  }
  posix_spawnattr_setflags(&attr, flags);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, argv[0], &fa, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return CannotStart(options.args[0], rc);
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
             std::chrono::milliseconds patience, const std::atomic<bool>* hurry) {
  const auto patient_until = std::chrono::steady_clock::now() + patience;
  std::vector<pid_t> running;
  for (pid_t p : pids) {
    if (p > 0) running.push_back(p);
  }
  // Every child is looked at each round, so one that ends late does not hold up the others'
  // reaping.
  while (!running.empty()) {
    std::vector<pid_t> still;
    for (pid_t p : running) {
      if (!WaitFor(p, std::chrono::milliseconds(0)).has_value()) still.push_back(p);
    }
    running.swap(still);
    if (running.empty() || std::chrono::steady_clock::now() >= patient_until ||
        (hurry != nullptr && hurry->load())) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (pid_t p : running) {
    kill(p, SIGTERM);
    kill(p, SIGCONT);  // a stopped child acts on SIGTERM (cleans up) instead of dying at SIGKILL
  }
  const auto until = std::chrono::steady_clock::now() + grace;
  for (pid_t p : running) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    WaitOrKill(p, std::max(left, std::chrono::milliseconds(0)));
  }
}

}  // namespace latchkey
