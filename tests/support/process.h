// Child processes for end-to-end tests (over common/subprocess.h): start with output to a file,
// wait with a deadline, run-and-capture. Every wait has a deadline; stragglers are killed.
#ifndef LATCHKEY_TESTS_SUPPORT_PROCESS_H_
#define LATCHKEY_TESTS_SUPPORT_PROCESS_H_

#include <chrono>
#include <string>
#include <vector>

namespace latchkey::testing {

// Starts `args` (PATH lookup) with extra environment entries; stdout+stderr go to `log`.
int StartProcess(const std::vector<std::string>& args, const std::vector<std::string>& env,
                 const std::string& log);
// Exit code (128+signal when killed by one), or -1 when it had to be killed at the deadline.
int WaitProcess(int pid, std::chrono::milliseconds deadline);
struct Captured {
  int exit_code = -1;
  std::string output;  // stdout + stderr
};
// Runs `args` (PATH lookup, stdin from /dev/null) and returns its exit code and output; one still
// running at the deadline is killed (exit code -1).
Captured RunAndCapture(const std::vector<std::string>& args,
                       std::chrono::milliseconds deadline = std::chrono::seconds(60));
std::string ReadText(const std::string& path);
// Polls `path` until `pred(contents)` or the deadline; returns the last contents read.
template <typename Pred>
std::string WaitForFile(const std::string& path, Pred pred, std::chrono::milliseconds deadline);

}  // namespace latchkey::testing

#include <thread>

namespace latchkey::testing {
template <typename Pred>
std::string WaitForFile(const std::string& path, Pred pred, std::chrono::milliseconds deadline) {
  const auto until = std::chrono::steady_clock::now() + deadline;
  std::string text;
  while (std::chrono::steady_clock::now() < until) {
    text = ReadText(path);
    if (pred(text)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return text;
}
}  // namespace latchkey::testing

#endif  // LATCHKEY_TESTS_SUPPORT_PROCESS_H_
