// Everything latchkey-worker reads from its environment, read in one place (main), with the
// variable named in every error. torchrun's names where torchrun has one.
#ifndef LATCHKEY_WORKER_RUNNER_ENV_H_
#define LATCHKEY_WORKER_RUNNER_ENV_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace latchkey {

struct WorkerEnv {
  std::optional<int> rank;              // RANK, else JOB_COMPLETION_INDEX (Kubernetes)
  std::optional<int> world_size;        // WORLD_SIZE
  std::string master_addr;              // MASTER_ADDR (default 127.0.0.1)
  int master_port = 29500;              // MASTER_PORT
  std::optional<int> local_world_size;  // LOCAL_WORLD_SIZE: ranks sharing this machine's cores
  std::optional<int> local_rank;        // LOCAL_RANK: this rank's GPU (cuda:LOCAL_RANK)
  // LATCHKEY_GLOO_HOSTNAME: the address other machines reach this rank's transport at.
  std::string transport_host;
  // LATCHKEY_NODE_NAME: the node this rank runs on, as its node agent (`latchkey node`) names it;
  // the coordinator keeps a tensor-parallel group on one node. Empty: the host is the node.
  std::string node_name;
  // LATCHKEY_NODE_RELAY: where its node agent relays heartbeats and step reports (`latchkey
  // node` sets it: client/node_relay.h). Empty: straight to the coordinator.
  std::string node_relay;
  std::string coordinator;  // LATCHKEY_COORDINATOR
  std::string job_id;       // LATCHKEY_JOB_ID
  std::string join_token;   // LATCHKEY_JOIN_TOKEN
  std::string tls_ca{};     // LATCHKEY_TLS_CA: PEM CA of the coordinator's certificate
  std::string tls_cert{};   // LATCHKEY_TLS_CERT: PEM client certificate (mTLS)
  std::string tls_key{};    // LATCHKEY_TLS_KEY: its key
  // LATCHKEY_TEST_MIN_WINDOW_SECONDS (tests only): the least time a window lasts, read as atof
  // reads it (0 when unset or not a number).
  double test_min_window_seconds = 0;
  // LATCHKEY_TEST_SKIP_DEVICE_CHECK=1 (tests only; a variable because `latchkey up` passes its
  // environment to the workers it starts): PlaceRank leaves the CUDA device check to nccl.
  bool test_skip_device_check = false;
};

// INVALID_ARGUMENT naming the variable when a number is not a non-negative integer.
absl::StatusOr<WorkerEnv> ReadWorkerEnv();

// The join token in `path` (surrounding whitespace dropped); INVALID_ARGUMENT naming
// --join-token-file when it cannot be read or is empty.
absl::StatusOr<std::string> ReadJoinTokenFile(const std::string& path);

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_RUNNER_ENV_H_
