// Child processes, in one place: `latchkey up` starts its coordinator-side workers with it,
// tests and benchmarks start ranks, coordinators and the CLI with it.
//
//   auto pid = Spawn({.args = {"latchkey-worker", ...}, .extra_env = {"RANK=1"},
//                     .log_path = "worker-1.log"});
//   int code = WaitOrKill(*pid, std::chrono::seconds(60));
//
// Children get a normal signal mask back (a parent may block signals for a signal thread),
// stdin from /dev/null, and stdout+stderr into `log_path` (inherited when empty). A supervisor
// (`latchkey up`) asks for two more things: `own_process_group`, so a terminal's Ctrl-C and
// hang-up reach the supervisor alone (it stops its children in order), and
// `parent_death_signal`, which the kernel sends the child when this process ends, however it
// ends (kill -9 included; PR_SET_PDEATHSIG). Such children are forked by one thread that lives
// as long as the process, because the kernel sends that signal when the forking *thread* ends.
// Thread-safety: every function is thread-safe (system calls; the forking thread is internal).
#ifndef LATCHKEY_COMMON_SUBPROCESS_H_
#define LATCHKEY_COMMON_SUBPROCESS_H_

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace latchkey {

struct SpawnOptions {
  std::vector<std::string> args;       // args[0]: a path, or a name looked up on PATH
  std::vector<std::string> extra_env;  // "NAME=value", before this process's environment
  std::string log_path;                // stdout and stderr (truncated); empty: inherited
  bool append_log = false;             // append to `log_path` instead (a restarted process)
  bool own_process_group = false;      // setpgid(0, 0): signals to our group do not reach it
  int parent_death_signal = 0;         // e.g. SIGTERM: sent to it when this process ends
};

// How a child ended: its exit code, or the signal that killed it.
struct ExitInfo {
  int code = 0;    // exit code when signal == 0; -1: not a child of this process
  int signal = 0;  // the signal that ended it, 0 if it exited
  // The WaitFor convention: the exit code, or 128 + signal.
  int combined() const { return signal != 0 ? 128 + signal : code; }
};
// "killed by signal 9", "exited with code 75", "not a child of this process".
std::string DescribeExit(const ExitInfo& exit);

// The child's pid. NOT_FOUND/INTERNAL naming args[0] when it cannot be started (a program that
// does not exist or cannot be executed is reported here, not as the child's exit).
absl::StatusOr<pid_t> Spawn(const SpawnOptions& options);

// Exit code (128 + signal when a signal ended it) once the child ended within `timeout`;
// nullopt while it still runs; -1 when `pid` is not a child of this process (or was reaped).
std::optional<int> WaitFor(pid_t pid, std::chrono::milliseconds timeout);

// Reaps `pid` if it has ended, without waiting: nullopt while it still runs; code -1 when `pid`
// is not a child of this process (or was reaped).
std::optional<ExitInfo> PollExit(pid_t pid);

// As WaitFor, but a child still running at the deadline is killed (SIGKILL) and -1 returned.
int WaitOrKill(pid_t pid, std::chrono::milliseconds deadline);

// Waits up to `patience` for the children to end by themselves (less once `*hurry` turns true),
// then sends the rest SIGTERM (and SIGCONT, so a stopped one acts on it), and SIGKILL after
// `grace`. Reaps them all.
void StopAll(const std::vector<pid_t>& pids, std::chrono::milliseconds grace,
             std::chrono::milliseconds patience = std::chrono::milliseconds(0),
             const std::atomic<bool>* hurry = nullptr);

}  // namespace latchkey

#endif  // LATCHKEY_COMMON_SUBPROCESS_H_
