// Node agents across simulated hosts (docs/deploy.md "One pod per node"): the coordinator on
// host 1 and one `latchkey node --nproc 2` per worker host (hosts 2 and 3, each with its own
// address and /dev/shm, each agent supervised as a pod is) run DP 2 x TP 2: every step's loss
// and the final weights equal four bare workers' on the same hosts bit for bit, each TP group
// inside its host. And four bare workers, one per host, with TP 2: each tensor-parallel group
// spans two hosts, so the job fails before any collective, naming the group, its ranks and
// their hosts.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "tests/cluster/cluster_job.h"
#include "tests/support/launch.h"
#include "tests/support/process.h"
#include "tests/support/sim_cluster.h"
#include "tests/support/specs.h"
#include "tests/support/temp_dir.h"

namespace latchkey::testing {
namespace {

using std::chrono::seconds;

constexpr int kSteps = 12;

ClusterJobOptions Options(bool node_agents) {
  ClusterJobOptions o;
  o.spec = SpecObject(ClusterSpecParams(kSteps, 29, 7));
  o.node_agents = node_agents;
  return o;
}

struct Outcome {
  std::string state;
  std::map<int64_t, double> losses;
  std::vector<char> weights;
};

Outcome RunToEnd(const std::string& dir, ClusterJobOptions o) {
  Outcome out;
  auto job = ClusterJob::Start(dir, std::move(o));
  EXPECT_TRUE(job.ok()) << job.status();
  if (!job.ok()) return out;
  const auto end = (*job)->WaitEnded(seconds(300));
  out.state = end ? end->value("state", "") : "no end";
  out.losses = (*job)->Losses();
  out.weights = FileBytes((*job)->FinalWeights());
  if (out.state != "SUCCEEDED") {
    std::fprintf(stderr, "%s\n%s\n", end ? end->dump(2).c_str() : "",
                 (*job)->CoordinatorLog().c_str());
  }
  return out;
}

TEST(NodeAgentCluster, TwoAgentsOnTwoHostsTrainAsFourBareWorkers) {
  LATCHKEY_REQUIRE_SIM_HOSTS();
  const ScopedTempDir bare_dir("cluster-bare");
  const Outcome bare = RunToEnd(bare_dir.path(), Options(false));
  const ScopedTempDir agents_dir("cluster-agents");
  const Outcome agents = RunToEnd(agents_dir.path(), Options(true));
  std::printf("| run | state | steps | final weights bytes |\n|---|---|---|---|\n");
  std::printf("| 4 bare workers, 2 hosts | %s | %zu | %zu |\n", bare.state.c_str(),
              bare.losses.size(), bare.weights.size());
  std::printf("| 2 agents x 2 ranks, 2 hosts | %s | %zu | %zu |\n", agents.state.c_str(),
              agents.losses.size(), agents.weights.size());
  EXPECT_EQ(bare.state, "SUCCEEDED");
  EXPECT_EQ(agents.state, "SUCCEEDED");
  EXPECT_EQ(bare.losses.size(), static_cast<size_t>(kSteps));
  EXPECT_EQ(agents.losses, bare.losses);  // bit for bit, every step
  EXPECT_FALSE(bare.weights.empty());
  EXPECT_TRUE(agents.weights == bare.weights) << "the final weights differ";
}

TEST(NodeAgentCluster, ATensorParallelGroupAcrossHostsFailsBeforeAnyCollective) {
  LATCHKEY_REQUIRE_SIM_HOSTS();
  const ScopedTempDir dir("cluster-spread");
  ClusterJobOptions o = Options(false);
  o.worker_hosts = 4;
  o.ranks_per_host = 1;
  auto job = ClusterJob::Start(dir.path(), std::move(o));
  ASSERT_TRUE(job.ok()) << job.status();
  const auto end = (*job)->WaitEnded(seconds(120));
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->value("state", ""), "FAILED");
  const std::string why = end->dump();
  EXPECT_NE(why.find("tensor-parallel group 0 (ranks 0..1) spans nodes: rank 0 on " +
                     SimCluster::Address(2) + ", rank 1 on " + SimCluster::Address(3)),
            std::string::npos)
      << why;
  EXPECT_TRUE((*job)->Losses().empty()) << "a step was trained";
}

}  // namespace
}  // namespace latchkey::testing
