// Gloo implementation of comm::Group (CPU, TCP transport), built on libgloo directly: the same
// libgloo.so.0 libtorch links, called in the caller's thread (about 3x lower latency here than
// c10d's ProcessGroupGloo, which also lacks reduce_scatter in libtorch 1.13).
//
// Rendezvous goes through a TCP key/value store (libtorch's c10d::TCPStore) hosted by rank 0 at
// `host:port`; every group of the DP x TP grid connects through its own key prefix.
#ifndef LATCHKEY_WORKER_COMM_GLOO_GLOO_GROUPS_H_
#define LATCHKEY_WORKER_COMM_GLOO_GLOO_GROUPS_H_

#include <chrono>
#include <string>

#include "absl/status/statusor.h"
#include "worker/comm/comm.h"

namespace latchkey::comm {

inline constexpr std::chrono::milliseconds kDefaultRendezvousTimeout{std::chrono::seconds(120)};

struct RendezvousConfig {
  std::string host = "127.0.0.1";  // where rank 0 hosts the store
  int port = 29500;
  int rank = 0;
  int world_size = 1;
  int tp = 1;
  // Namespace for the keys (a job id under the coordinator), so stale keys never mix.
  std::string prefix = "latchkey";
  // Address this rank's Gloo transport binds to; empty = 127.0.0.1 when `host` is a loopback
  // address, else $LATCHKEY_GLOO_HOSTNAME or this machine's hostname.
  std::string local_address;
  std::chrono::milliseconds rendezvous_timeout = kDefaultRendezvousTimeout;
  // Default timeout of every collective on the groups formed.
  std::chrono::milliseconds collective_timeout = kDefaultCollectiveTimeout;
};

// Forms the world, TP and DP groups of this rank. Blocks until every rank has joined or the
// rendezvous timeout passes (DEADLINE_EXCEEDED). Dimensions of size 1 get a SingleRankGroup.
// INVALID_ARGUMENT if world_size is not a positive multiple of tp or rank is out of range.
absl::StatusOr<ProcessGroups> CreateGlooProcessGroups(const RendezvousConfig& config);

}  // namespace latchkey::comm

#endif  // LATCHKEY_WORKER_COMM_GLOO_GLOO_GROUPS_H_
