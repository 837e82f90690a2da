// A chaos soak across simulated hosts (docs/fault-tolerance.md "Partitions"): a DP 2 x TP 2 job
// (coordinator on host 1, ranks 0-1 on host 2, ranks 2-3 on host 3, workers restarted as pods
// are) trains while a seeded schedule injects one fault after another from {kill -9 a worker,
// SIGSTOP a worker 15 s, cut the worker hosts' link 25 s, isolate a worker host 25 s, kill -9
// and restart the coordinator, throttle a worker host's link to 1 Mbit/s 20 s}. At the end the
// job succeeded, every step's loss and the final weights equal an uninterrupted run's bit for
// bit (the layout never changes), and restarts were counted for the crashes only (kill -9 and
// SIGSTOP of a worker), never for the network.
//
// CI runs the short schedule (6 faults, about 4 minutes after the 2-minute uninterrupted run);
// LATCHKEY_SOAK_FAULTS=N runs N (the
// long soak: 40 and more, 15 minutes and more). LATCHKEY_SOAK_SEED picks the schedule.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/cluster/cluster_job.h"
#include "tests/support/launch.h"
#include "tests/support/specs.h"
#include "tests/support/temp_dir.h"

namespace latchkey::testing {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::seconds;

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v == nullptr || *v == '\0' ? fallback : std::atoi(v);
}

ClusterJobOptions SoakOptions(int steps) {
  SpecParams p = ClusterSpecParams(steps, 31, 7);
  p.extra_latchkey = {{"checkpoint", {{"dir", "ckpt"}, {"every_steps", 10}}},
                      {"hang_timeout_seconds", 8},
                      {"rejoin_timeout_seconds", 40},
                      {"max_restarts", 100},
                      {"partition_timeout_seconds", 300}};
  ClusterJobOptions o;
  o.spec = SpecObject(p);
  o.coordinator_flags = {"--liveness-timeout", "15"};
  // Windows of at least 0.5 s: the job outlasts the schedule.
  o.worker_flags = {"--test-min-window-seconds", "0.5"};
  return o;
}

enum class Fault { kKill, kStop, kCut, kIsolate, kCoordinator, kThrottle };
const char* Name(Fault f) {
  switch (f) {
    case Fault::kKill:
      return "kill -9 a worker";
    case Fault::kStop:
      return "SIGSTOP a worker 15 s";
    case Fault::kCut:
      return "cut the worker hosts' link 25 s";
    case Fault::kIsolate:
      return "isolate a worker host 25 s";
    case Fault::kCoordinator:
      return "kill -9 and restart the coordinator";
    case Fault::kThrottle:
      return "throttle a worker host 1 Mbit/s 20 s";
  }
  return "?";
}

TEST(ClusterSoak, EveryFaultSurvivedAndTheRunEqualsAnUninterruptedOne) {
  LATCHKEY_REQUIRE_SIM_HOSTS();
  const int faults = EnvInt("LATCHKEY_SOAK_FAULTS", 6);
  const unsigned seed = static_cast<unsigned>(EnvInt("LATCHKEY_SOAK_SEED", 20261205));
  const int steps = std::max(200, faults * 40);
  std::printf("soak: %d faults, seed %u, %d steps\n", faults, seed, steps);

  const ScopedTempDir ref_dir("soak-ref");
  auto ref = ClusterJob::Start(ref_dir.path(), SoakOptions(steps));
  ASSERT_TRUE(ref.ok()) << ref.status();
  auto ref_end = (*ref)->WaitEnded(seconds(60 + steps * 3));
  ASSERT_TRUE(ref_end.has_value() && ref_end->value("state", "") == "SUCCEEDED")
      << (*ref)->CoordinatorLog();
  const std::map<int64_t, double> ref_losses = (*ref)->Losses();
  const std::vector<char> ref_weights = FileBytes((*ref)->FinalWeights());
  ref->reset();

  const ScopedTempDir dir("soak");
  auto started = ClusterJob::Start(dir.path(), SoakOptions(steps));
  ASSERT_TRUE(started.ok()) << started.status();
  ClusterJob& job = **started;
  ASSERT_TRUE(job.WaitStep(3, seconds(240))) << job.CoordinatorLog();
  SimCluster& net = job.cluster();

  // Every kind once in the first six (shuffled by the seed), then drawn at random.
  std::mt19937 rng(seed);
  std::vector<Fault> kinds = {Fault::kKill,    Fault::kStop,        Fault::kCut,
                              Fault::kIsolate, Fault::kCoordinator, Fault::kThrottle};
  std::shuffle(kinds.begin(), kinds.end(), rng);
  int crashes = 0;
  int injected = 0;
  for (int i = 0; i < faults; ++i) {
    const auto status = job.Status();
    if (status && status->value("state", "") != "RUNNING" &&
        status->value("state", "") != "RECOVERING" && status->value("state", "") != "PENDING") {
      break;  // ended early: the assertions below say how
    }
    const Fault f = i < static_cast<int>(kinds.size())
                        ? kinds[static_cast<size_t>(i)]
                        : kinds[std::uniform_int_distribution<size_t>(0, kinds.size() - 1)(rng)];
    const int rank = std::uniform_int_distribution<int>(0, 3)(rng);
    const int host = std::uniform_int_distribution<int>(2, 3)(rng);
    const auto t0 = Clock::now();
    switch (f) {
      case Fault::kKill:
        kill(job.WorkerPid(rank), SIGKILL);
        ++crashes;
        break;
      case Fault::kStop: {
        const int pid = job.WorkerPid(rank);
        kill(pid, SIGSTOP);
        std::this_thread::sleep_for(seconds(15));
        kill(pid, SIGCONT);
        ++crashes;
        break;
      }
      case Fault::kCut:
        ASSERT_TRUE(net.Cut(2, 3).ok());
        std::this_thread::sleep_for(seconds(25));
        ASSERT_TRUE(net.Heal(2, 3).ok());
        break;
      case Fault::kIsolate:
        ASSERT_TRUE(net.Isolate(host).ok());
        std::this_thread::sleep_for(seconds(25));
        ASSERT_TRUE(net.Reconnect(host).ok());
        break;
      case Fault::kCoordinator:
        ASSERT_TRUE(job.RestartCoordinator().ok()) << job.CoordinatorLog();
        break;
      case Fault::kThrottle:
        ASSERT_TRUE(net.Throttle(host, "1mbit").ok());
        std::this_thread::sleep_for(seconds(20));
        ASSERT_TRUE(net.Unthrottle(host).ok());
        break;
    }
    ++injected;
    std::printf("fault %d at %.0f s: %s (rank %d, host %d)\n", i + 1,
                std::chrono::duration<double>(Clock::now() - t0).count(), Name(f), rank, host);
    std::fflush(stdout);
    std::this_thread::sleep_for(seconds(8));
  }
  auto end = job.WaitEnded(seconds(900));
  ASSERT_TRUE(end.has_value()) << job.CoordinatorLog();
  std::printf("soak: %d faults injected, %d crashes; job %s, restarts %d\n", injected, crashes,
              end->value("state", "").c_str(), end->value("restarts", -1));
  for (const auto& a : (*end)["attempts"]) std::printf("  attempt: %s\n", a.dump().c_str());
  EXPECT_EQ(injected, faults) << "the job ended before the schedule did";
  EXPECT_EQ(end->value("state", ""), "SUCCEEDED") << end->dump(2) << job.CoordinatorLog();
  // A SIGSTOP'd worker that is resumed in time may rejoin its attempt without a recovery.
  EXPECT_LE(end->value("restarts", -1), crashes) << end->dump(2);

  const std::map<int64_t, double> losses = job.Losses();
  EXPECT_EQ(losses.size(), ref_losses.size());
  for (const auto& [step, loss] : ref_losses) {
    ASSERT_TRUE(losses.count(step)) << "step " << step;
    EXPECT_EQ(losses.at(step), loss) << "step " << step;
  }
  EXPECT_EQ(FileBytes(job.FinalWeights()), ref_weights) << "final weights differ";
}

}  // namespace
}  // namespace latchkey::testing
