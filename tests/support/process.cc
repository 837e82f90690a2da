#include "tests/support/process.h"

#include <fstream>
#include <sstream>

#include "common/subprocess.h"
#include "tests/support/temp_dir.h"

namespace latchkey::testing {

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int StartProcess(const std::vector<std::string>& args, const std::vector<std::string>& env,
                 const std::string& log) {
  auto pid = Spawn({args, env, log});
  return pid.ok() ? *pid : -1;
}

int WaitProcess(int pid, std::chrono::milliseconds deadline) { return WaitOrKill(pid, deadline); }

Captured RunAndCapture(const std::vector<std::string>& args, std::chrono::milliseconds deadline) {
  ScopedTempDir dir("cmd");
  const std::string log = dir / "output.log";
  Captured c;
  const int pid = StartProcess(args, {}, log);
  if (pid <= 0) return c;
  c.exit_code = WaitProcess(pid, deadline);
  c.output = ReadText(log);
  if (c.exit_code == -1) c.output += "\n[killed at the deadline]";
  return c;
}

}  // namespace latchkey::testing
