// The benchmarks' launcher: started without RANK, a benchmark runs itself once per rank, all on
// this machine, with RANK, WORLD_SIZE and MASTER_PORT (a random port in 30000-49999) in each
// one's environment, and waits for every one.
#ifndef LATCHKEY_BENCH_SELF_RANKS_H_
#define LATCHKEY_BENCH_SELF_RANKS_H_

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "common/subprocess.h"

namespace latchkey::bench {

// /proc/self/exe with argv[1..] as `world` ranks; 0 when every rank exited 0, else 1.
inline int RunSelfAsRanks(int argc, char** argv, int world) {
  std::mt19937 rng(static_cast<unsigned>(getpid()));
  const int port = 30000 + static_cast<int>(rng() % 20000);
  std::vector<std::string> args(argv, argv + argc);
  args[0] = "/proc/self/exe";
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    auto pid = Spawn({args,
                      {"RANK=" + std::to_string(r), "WORLD_SIZE=" + std::to_string(world),
                       "MASTER_PORT=" + std::to_string(port)},
                      ""});
    if (!pid.ok()) {
      std::fprintf(stderr, "%s\n", std::string(pid.status().message()).c_str());
      return 1;
    }
    pids.push_back(*pid);
  }
  int rc = 0;
  for (pid_t p : pids) {
    if (WaitOrKill(p, std::chrono::hours(24)) != 0) rc = 1;
  }
  return rc;
}

}  // namespace latchkey::bench

#endif  // LATCHKEY_BENCH_SELF_RANKS_H_
