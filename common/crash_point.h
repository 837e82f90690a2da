// Injected crashes for fault tests: at a named point the process kills itself with SIGKILL,
// exactly as `kill -9` would, so tests can stop a real process at the worst moment.
//
//   LATCHKEY_TEST_CRASH=POINT          the point (e.g. checkpoint.after_rank_files); unset: never
//   LATCHKEY_TEST_CRASH_RANK=R         only on rank R (default: any rank)
//   LATCHKEY_TEST_CRASH_STEP=S         only at step S (default: any step)
//   LATCHKEY_TEST_CRASH_ONCE=FILE      only while FILE does not exist (created just before the
//                                      crash), so a restarted process runs on
//
// Points (docs/fault-tolerance.md lists them): worker checkpoint.after_rank_files,
// checkpoint.background_write, checkpoint.before_commit; coordinator recovery.after_attempt.
#ifndef LATCHKEY_COMMON_CRASH_POINT_H_
#define LATCHKEY_COMMON_CRASH_POINT_H_

#include <signal.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

namespace latchkey {

// Kills this process (SIGKILL) when the environment asks for a crash at `point` here.
inline void MaybeCrash(const char* point, int rank = -1, int64_t step = -1) {
  const char* want = std::getenv("LATCHKEY_TEST_CRASH");
  if (want == nullptr || std::string(want) != point) return;
  if (const char* r = std::getenv("LATCHKEY_TEST_CRASH_RANK");
      r && rank >= 0 && std::atoi(r) != rank) {
    return;
  }
  if (const char* s = std::getenv("LATCHKEY_TEST_CRASH_STEP");
      s && step >= 0 && std::atoll(s) != step) {
    return;
  }
  if (const char* once = std::getenv("LATCHKEY_TEST_CRASH_ONCE"); once && *once) {
    if (std::ifstream(once).good()) return;
    std::ofstream(once) << point << "\n";
  }
  ::kill(::getpid(), SIGKILL);
}

}  // namespace latchkey

#endif  // LATCHKEY_COMMON_CRASH_POINT_H_
