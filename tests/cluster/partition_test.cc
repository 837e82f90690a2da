// Network faults across simulated hosts (docs/fault-tolerance.md "Partitions"): a DP 2 x TP 2
// job with the coordinator on host 1, ranks 0-1 on host 2 and ranks 2-3 on host 3, against the
// same job run without faults. A partition is not a crash: the job succeeds, no restart is
// counted for it, the link is named, and every step's loss and the final weights equal the
// uninterrupted run's bit for bit.
//
// LATCHKEY_CLUSTER_MATRIX=full runs every case of the matrix (minutes each); by default the
// cases marked `ci` run.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tests/cluster/cluster_job.h"
#include "tests/support/launch.h"
#include "tests/support/process.h"
#include "tests/support/specs.h"
#include "tests/support/temp_dir.h"

namespace latchkey::testing {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::seconds;

constexpr int kSteps = 40;
constexpr int kCheckpointEvery = 5;
constexpr int kHangTimeout = 8;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

nlohmann::json PartitionSpec(bool elastic) {
  SpecParams p = ClusterSpecParams(kSteps, 23, 5);
  p.extra_latchkey = {{"checkpoint", {{"dir", "ckpt"}, {"every_steps", kCheckpointEvery}}},
                      {"hang_timeout_seconds", kHangTimeout},
                      {"rejoin_timeout_seconds", 30},
                      {"partition_timeout_seconds", 300}};
  if (elastic) p.extra_latchkey["elastic"] = {{"min_dp", 1}};
  return SpecObject(p);
}

ClusterJobOptions Options(bool elastic) {
  ClusterJobOptions o;
  o.spec = PartitionSpec(elastic);
  o.coordinator_flags = {"--liveness-timeout", "15"};
  // Windows of at least 0.5 s (about 20 s of training): the faults meet a running job.
  o.worker_flags = {"--test-min-window-seconds", "0.5"};
  return o;
}

// The uninterrupted run, once per binary.
struct Baseline {
  std::map<int64_t, double> losses;
  std::vector<char> weights;
};

const Baseline& Uninterrupted() {
  static Baseline* b = [] {
    auto* out = new Baseline;
    static const ScopedTempDir dir("cluster-ref");
    auto job = ClusterJob::Start(dir.path(), Options(false));
    if (!job.ok()) {
      std::fprintf(stderr, "uninterrupted run: %s\n", std::string(job.status().message()).c_str());
      return out;
    }
    auto end = (*job)->WaitEnded(seconds(400));
    if (!end || end->value("state", "") != "SUCCEEDED") {
      std::fprintf(stderr, "uninterrupted run: %s\n%s\n", end ? end->dump(2).c_str() : "no end",
                   (*job)->CoordinatorLog().c_str());
      return out;
    }
    out->losses = (*job)->Losses();
    out->weights = FileBytes((*job)->FinalWeights());
    return out;
  }();
  return *b;
}

enum class FaultKind { kCut, kIsolate, kThrottle };

struct Case {
  const char* name;
  FaultKind kind;
  int host_a;  // kCut: hosts a and b; kIsolate, kThrottle: host a
  int host_b;
  int seconds;
  bool elastic;
  bool ci;
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) { return info.param.name; }

class PartitionMatrix : public ::testing::TestWithParam<Case> {};

TEST_P(PartitionMatrix, SucceedsWithoutRestartsAndEqualsTheUninterruptedRun) {
  LATCHKEY_REQUIRE_SIM_HOSTS();
  const Case& c = GetParam();
  const Baseline& ref = Uninterrupted();
  ASSERT_EQ(ref.losses.size(), static_cast<size_t>(kSteps)) << "the uninterrupted run failed";

  const ScopedTempDir dir("cluster-case");
  auto started = ClusterJob::Start(dir.path(), Options(c.elastic));
  ASSERT_TRUE(started.ok()) << started.status();
  ClusterJob& job = **started;
  ASSERT_TRUE(job.WaitStep(7, seconds(240))) << job.CoordinatorLog();

  const auto fault_start = Clock::now();
  SimCluster& net = job.cluster();
  switch (c.kind) {
    case FaultKind::kCut:
      ASSERT_TRUE(net.Cut(c.host_a, c.host_b).ok());
      break;
    case FaultKind::kIsolate:
      ASSERT_TRUE(net.Isolate(c.host_a).ok());
      break;
    case FaultKind::kThrottle:
      ASSERT_TRUE(net.Throttle(c.host_a, "1mbit").ok());
      break;
  }
  // While the fault lasts: when the coordinator first names it (a recovery's cause).
  double named_s = -1;
  std::string named;
  while (Since(fault_start) < c.seconds) {
    if (named_s < 0) {
      if (auto s = job.Status(); s.has_value() && (*s)["attempts"].size() > 1) {
        named_s = Since(fault_start);
        named = (*s)["attempts"].back().value("cause", "");
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  const int64_t before_heal = job.Losses().empty() ? -1 : job.Losses().rbegin()->first;
  switch (c.kind) {
    case FaultKind::kCut:
      ASSERT_TRUE(net.Heal(c.host_a, c.host_b).ok());
      break;
    case FaultKind::kIsolate:
      ASSERT_TRUE(net.Reconnect(c.host_a).ok());
      break;
    case FaultKind::kThrottle:
      ASSERT_TRUE(net.Unthrottle(c.host_a).ok());
      break;
  }
  const double fault_s = Since(fault_start);
  const auto healed = Clock::now();
  // From the heal to training again: a step past the last one before it, on every rank.
  const bool trained = job.WaitStep(before_heal + 1, seconds(300));
  const double to_train_s = trained ? Since(healed) : -1;
  auto end = job.WaitEnded(seconds(600));
  ASSERT_TRUE(end.has_value()) << job.CoordinatorLog();
  std::printf("case %s: fault %.0f s; state %s, restarts %d, attempts %zu\n", c.name, fault_s,
              end->value("state", "").c_str(), end->value("restarts", -1),
              (*end)["attempts"].size());
  for (const auto& a : (*end)["attempts"]) std::printf("  attempt: %s\n", a.dump().c_str());
  EXPECT_EQ(end->value("state", ""), "SUCCEEDED") << end->dump(2) << "\n" << job.CoordinatorLog();
  EXPECT_EQ(end->value("restarts", -1), 0) << end->dump(2);

  const std::map<int64_t, double> losses = job.Losses();
  ASSERT_EQ(losses.size(), ref.losses.size());
  double max_dev = 0;
  for (const auto& [step, loss] : ref.losses) {
    ASSERT_TRUE(losses.count(step)) << "step " << step;
    max_dev = std::max(max_dev, std::abs(losses.at(step) - loss));
    if (!c.elastic) {
      EXPECT_EQ(losses.at(step), loss) << "step " << step;
    }
  }
  EXPECT_LE(max_dev, 1e-6);
  int replayed = 0;
  for (const auto& [step, runs] : job.StepRuns()) replayed += runs - 1;
  std::printf("  max loss deviation %.3g, steps run again after a recovery %d\n", max_dev,
              replayed);
  std::printf("  named after %.1f s: %s\n  heal to training %.1f s\n", named_s,
              named.empty() ? "(nothing)" : named.c_str(), to_train_s);
  std::printf("| %s | %s | %d | %s | %s | %d | %.3g |\n", c.name, end->value("state", "").c_str(),
              end->value("restarts", -1),
              named_s < 0 ? "not named" : absl::StrFormat("%.1f s", named_s).c_str(),
              to_train_s < 0 ? "-" : absl::StrFormat("%.1f s", to_train_s).c_str(), replayed,
              max_dev);
  if (!c.elastic) {
    EXPECT_EQ(FileBytes(job.FinalWeights()), ref.weights) << "final weights differ";
  }
}

// Split brain: the link between the worker hosts is cut just as rank 0 commits a checkpoint (its
// step record is out; the save runs after it). Whatever the commit's fate, the coordinator
// records no checkpoint of a fenced attempt, every attempt resumes from the newest checkpoint it
// had recorded when the attempt began, and the run equals the uninterrupted one.
TEST(SplitBrain, ACutWhileACheckpointCommitsCommitsNothingFromTheFencedAttempt) {
  LATCHKEY_REQUIRE_SIM_HOSTS();
  const Baseline& ref = Uninterrupted();
  ASSERT_EQ(ref.losses.size(), static_cast<size_t>(kSteps)) << "the uninterrupted run failed";
  const ScopedTempDir dir("cluster-split");
  auto started = ClusterJob::Start(dir.path(), Options(false));
  ASSERT_TRUE(started.ok()) << started.status();
  ClusterJob& job = **started;
  // Checkpoints after steps 4, 9, 14, ...: cut as step 14's record lands on rank 0.
  const std::string jsonl = dir.path() + "/steps-0.jsonl";
  const std::string seen = WaitForFile(
      jsonl, [](const std::string& t) { return t.find("\"step\":14,") != std::string::npos; },
      std::chrono::milliseconds(240000));
  ASSERT_NE(seen.find("\"step\":14,"), std::string::npos) << job.CoordinatorLog();
  ASSERT_TRUE(job.cluster().Cut(2, 3).ok());
  std::this_thread::sleep_for(seconds(20));
  ASSERT_TRUE(job.cluster().Heal(2, 3).ok());
  auto end = job.WaitEnded(seconds(600));
  ASSERT_TRUE(end.has_value()) << job.CoordinatorLog();
  EXPECT_EQ(end->value("state", ""), "SUCCEEDED") << end->dump(2) << job.CoordinatorLog();
  EXPECT_EQ(end->value("restarts", -1), 0);
  EXPECT_GE((*end)["attempts"].size(), 2u) << "the cut caused no recovery: " << end->dump(2);

  // The audit, in order: each attempt began from the newest checkpoint recorded before it, and
  // every checkpoint was recorded by the attempt current then.
  const std::string audit = job.Cli({"--json", "audit", job.job_id()}, nullptr);
  const nlohmann::json a = nlohmann::json::parse(audit.substr(audit.find('{')));
  int64_t newest = -1;
  int64_t current = 1;
  std::map<int64_t, int64_t> resumed;  // attempt -> the newest checkpoint when it began
  for (const auto& e : a["events"]) {
    const std::string kind = e.value("kind", "");
    const nlohmann::json& at = e.contains("attempt") ? e["attempt"] : nlohmann::json(1);
    const int64_t attempt = at.is_number() ? at.get<int64_t>() : std::stoll(at.get<std::string>());
    if (kind == "checkpoint") {
      EXPECT_EQ(attempt, current) << e.dump();
      const std::string m = e.value("message", "");
      const int64_t step = std::stoll(m.substr(std::string("checkpoint after step ").size()));
      newest = std::max(newest, step);
    } else if (kind == "recovery") {
      current = attempt;
      resumed[attempt] = newest;
    }
  }
  for (const auto& at : (*end)["attempts"]) {
    const int64_t n = at.value("attempt", 0);
    if (resumed.count(n)) {
      EXPECT_EQ(at.value("resume_step", -2), resumed[n]) << at.dump();
    }
  }
  const std::map<int64_t, double> losses = job.Losses();
  for (const auto& [step, loss] : ref.losses) EXPECT_EQ(losses.at(step), loss) << "step " << step;
  EXPECT_EQ(FileBytes(job.FinalWeights()), ref.weights) << "final weights differ";
}

// The cases: CI's set by default, every one with LATCHKEY_CLUSTER_MATRIX=full (none is
// registered and skipped).
std::vector<Case> MatrixCases() {
  const std::vector<Case> all = {
      Case{"cut_workers_25s", FaultKind::kCut, 2, 3, 25, false, true},
      Case{"cut_workers_120s", FaultKind::kCut, 2, 3, 120, false, false},
      Case{"isolate_worker_5s", FaultKind::kIsolate, 3, 0, 5, false, false},
      Case{"isolate_worker_25s", FaultKind::kIsolate, 3, 0, 25, false, true},
      Case{"isolate_coordinator_25s", FaultKind::kIsolate, 1, 0, 25, false, true},
      Case{"isolate_coordinator_120s", FaultKind::kIsolate, 1, 0, 120, false, false},
      Case{"throttle_worker_30s", FaultKind::kThrottle, 3, 0, 30, false, true},
      Case{"elastic_cut_workers_25s", FaultKind::kCut, 2, 3, 25, true, false},
      Case{"elastic_cut_workers_120s", FaultKind::kCut, 2, 3, 120, true, false},
      Case{"elastic_isolate_worker_5s", FaultKind::kIsolate, 3, 0, 5, true, false},
      Case{"elastic_isolate_worker_25s", FaultKind::kIsolate, 3, 0, 25, true, false},
      Case{"elastic_isolate_coordinator_25s", FaultKind::kIsolate, 1, 0, 25, true, false},
      Case{"elastic_isolate_coordinator_120s", FaultKind::kIsolate, 1, 0, 120, true, false},
      Case{"elastic_throttle_worker_30s", FaultKind::kThrottle, 3, 0, 30, true, false}};
  const char* matrix = std::getenv("LATCHKEY_CLUSTER_MATRIX");
  if (matrix != nullptr && std::string(matrix) == "full") return all;
  std::vector<Case> ci;
  for (const Case& c : all) {
    if (c.ci) ci.push_back(c);
  }
  return ci;
}

INSTANTIATE_TEST_SUITE_P(Faults, PartitionMatrix, ::testing::ValuesIn(MatrixCases()), CaseName);

}  // namespace
}  // namespace latchkey::testing
