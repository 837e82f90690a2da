// A latchkey job across simulated hosts (tests/support/sim_cluster.h), laid out as a small GPU
// cluster is: the coordinator alone on host 1 (listening on its address, role tokens), and
// `ranks_per_host` workers on each of hosts 2, 3, ... (TP over shm inside a host, DP over Gloo
// between hosts; --advertise-host and LATCHKEY_GLOO_HOSTNAME as the Kubernetes manifests set
// them), each worker restarted after a failure as a pod is. The test drives the network faults
// through cluster() and reads the outcome: the job's status, each step's loss, the final weights.
//
// Thread-safety: one thread drives a ClusterJob.
#ifndef LATCHKEY_TESTS_CLUSTER_CLUSTER_JOB_H_
#define LATCHKEY_TESTS_CLUSTER_CLUSTER_JOB_H_

#include <chrono>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tests/support/sim_cluster.h"
#include "tests/support/specs.h"

namespace latchkey::testing {

struct ClusterJobOptions {
  nlohmann::json spec;  // world_size = ranks_per_host * worker_hosts
  int worker_hosts = 2;
  int ranks_per_host = 2;
  std::vector<std::string> coordinator_flags;  // e.g. {"--liveness-timeout", "10"}
  int collective_timeout_s = 30;
  std::vector<std::string> worker_flags;  // after the others, e.g. --test-min-window-seconds
  // One node agent per worker host (`latchkey node --nproc ranks_per_host`, supervised as a pod
  // is) instead of one supervised worker per rank; its node identity is its host's.
  bool node_agents = false;
};

class ClusterJob {
 public:
  static constexpr int kCoordinatorHost = 1;
  // Creates the hosts, starts the coordinator, submits the job and starts its workers.
  static absl::StatusOr<std::unique_ptr<ClusterJob>> Start(const std::string& dir,
                                                           ClusterJobOptions o);
  ~ClusterJob();

  SimCluster& cluster() { return *cluster_; }
  int HostOf(int rank) const { return 2 + rank / o_.ranks_per_host; }
  const std::string& job_id() const { return job_id_; }

  // `latchkey --json status JOB` run on the coordinator's host (its "state" without the
  // JOB_STATE_ prefix); nullopt when it did not answer.
  std::optional<nlohmann::json> Status();
  // Polls Status until the job ended (succeeded, failed, cancelled) or the deadline.
  std::optional<nlohmann::json> WaitEnded(std::chrono::seconds deadline);
  // Polls until the newest step every rank has reported in its JSONL is >= step.
  bool WaitStep(int64_t step, std::chrono::seconds deadline);
  // The last loss each step reported (rank 0's JSONL: a restarted rank appends).
  std::map<int64_t, double> Losses() const;
  // How often each step's record appears in rank 0's JSONL (> 1: run again after a recovery).
  std::map<int64_t, int> StepRuns() const;
  std::string FinalWeights() const { return dir_ + "/final/model.safetensors"; }
  std::string CoordinatorLog() const;
  std::string WorkerLog(int rank) const;  // its path
  // The current process of the rank (its supervisor restarts it); -1 under node agents.
  int WorkerPid(int rank) const;
  // `latchkey ARGS` run on the coordinator's host with the admin token; its output.
  std::string Cli(const std::vector<std::string>& args, int* exit_code) const;
  // kill -9 of the coordinator, then the same coordinator (database, address) started again.
  absl::Status RestartCoordinator();

 private:
  ClusterJob(std::string dir, ClusterJobOptions o) : dir_(std::move(dir)), o_(std::move(o)) {}
  absl::Status Launch();
  absl::Status StartCoordinator();

  std::string dir_;
  ClusterJobOptions o_;
  std::unique_ptr<SimCluster> cluster_;
  std::string token_;  // the admin token of the CLI
  std::string address_;
  std::string job_id_;
  std::vector<std::string> coordinator_argv_;
  int coordinator_pid_ = -1;
  int coordinator_starts_ = 0;
};

// The cluster tests' job: a small GPTBigCode (n_embd 64, 32 positions), DP 2 x TP 2, ZeRO-1
// AdamW, GAS 2, synthetic data; the caller adds its latchkey keys and makes it a spec.
SpecParams ClusterSpecParams(int steps, int seed, int data_seed);

// A file's bytes (empty when it does not read).
std::vector<char> FileBytes(const std::string& path);

}  // namespace latchkey::testing

#endif  // LATCHKEY_TESTS_CLUSTER_CLUSTER_JOB_H_
