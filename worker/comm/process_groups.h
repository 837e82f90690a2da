// The one way latchkey forms process groups: CreateProcessGroups(backend, rendezvous config).
// Runners, tests and benchmarks never name a backend's implementation; they pick a CommBackend
// value (the spec's, common/backend.h) and get a rank's world, TP and DP groups of the DP x TP grid
// (common/rank_grid.h: rank = dp_rank * tp + tp_rank; TP groups hold consecutive ranks, DP
// groups the ranks with the same tp_rank).
//
// Rendezvous is backend-neutral: every backend connects through a comm::Store (store.h),
// either the one given in the config (ranks as threads: an InMemoryStore) or the TCP store
// that rank 0 hosts at host:port.
//
// Groups are formed for their device once: the config names the rank's device, every group of
// one is a SingleRankGroup on it, and the parallel groups are their backend's (gloo, shm: the
// CPU; nccl: the config's cuda:N, made this thread's current device).
#ifndef LATCHKEY_WORKER_COMM_PROCESS_GROUPS_H_
#define LATCHKEY_WORKER_COMM_PROCESS_GROUPS_H_

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/backend.h"
#include "common/rank_grid.h"
#include "common/timeouts.h"
#include "worker/comm/comm.h"
#include "worker/comm/store.h"

namespace latchkey::comm {

// The backends are CommBackend's values (common/backend.h): kGloo (gloo/), kShm (shm/,
// docs/transport.md), kNccl (nccl/), kAuto (per group, shm where every rank of the group maps
// the segment, else gloo).

struct RendezvousConfig {
  int rank = 0;
  int world_size = 1;
  int tp = 1;
  // The rank's device: every group's buffers live there. The CPU for gloo, shm and auto; cuda:N
  // for nccl (the runner's placement, worker/runner/device.h).
  Device device;
  // The store every rank reaches: when `store` is set it is used as is (all ranks share it);
  // otherwise rank 0 hosts a TCP store at host:port and the others connect to it.
  std::shared_ptr<Store> store;
  std::string host = "127.0.0.1";
  int port = 29500;
  // Namespace for the keys (a job id under the coordinator), so stale keys never mix.
  std::string prefix = "latchkey";
  // The address this rank's transport binds to, which its peers must reach. Ignored (127.0.0.1)
  // when `host` is a loopback address or `store` is set; empty: this machine's hostname.
  std::string local_address;
  std::chrono::milliseconds rendezvous_timeout{kDefaultRendezvousTimeout};
  // Default timeout of every collective on the groups formed.
  std::chrono::milliseconds collective_timeout{kDefaultCollectiveTimeout};
  // The counters the groups record into; null: a fresh CollectiveStats. A rank that forms new
  // groups for a new attempt passes the same one, so its metrics keep counting.
  std::shared_ptr<CollectiveStats> stats;
  // Where the groups mark every collective's entry and exit; null: nowhere.
  std::shared_ptr<FlightRecorder> recorder;
  // Ranks of the job sharing this machine's cores (LOCAL_WORLD_SIZE); 0: unknown. The shm
  // backend never spins when they outnumber the usable cores.
  int local_ranks = 0;
  // shm: the tmpfs directory where this rank creates and opens segments. A rank whose directory
  // is not the one its group's rank 0 used cannot open the segment, exactly as containers with
  // separate /dev/shm mounts (tests use that to make a rank unable to map).
  std::string shm_dir = "/dev/shm";
  // shm: bytes per rank and data buffer in a segment (a collective moves larger buffers in
  // chunks of this size).
  size_t shm_slot_bytes = size_t{1} << 20;
};

// The process groups of one rank.
struct ProcessGroups {
  int rank = 0;
  int world_size = 1;
  int tp = 1;
  int dp = 1;
  int tp_rank = 0;
  int dp_rank = 0;
  std::shared_ptr<Group> world;
  std::shared_ptr<Group> tp_group;
  std::shared_ptr<Group> dp_group;
  std::shared_ptr<CollectiveStats> stats;
  std::shared_ptr<FlightRecorder> recorder;  // may be null
  // Keeps the rendezvous store alive (rank 0 hosts it: ranks still connecting need it after
  // this rank has finished).
  std::shared_ptr<Store> store;

  RankGrid grid() const { return RankGrid{world_size, tp}; }
};

// Forms the world, TP and DP groups of this rank, in that order on every rank. Blocks until
// every rank has joined or the rendezvous timeout passes (DEADLINE_EXCEEDED); UNAVAILABLE when
// the store cannot be reached; INVALID_ARGUMENT (naming latchkey.world_size / RANK) when
// world_size is not a positive multiple of tp or rank is out of range; FAILED_PRECONDITION
// naming latchkey.backend when kShm is asked for a group whose ranks cannot share a segment, or
// when a world of several ranks asks for a backend whose groups cannot take the config's device
// (nccl on the CPU; gloo, shm or auto on cuda). Dimensions of size 1 get a SingleRankGroup on
// the config's device; a world of one needs no store at all.
absl::StatusOr<ProcessGroups> CreateProcessGroups(CommBackend backend,
                                                  const RendezvousConfig& config);

// Single-process groups (world size 1) on `device`: nothing is ever issued. `stats` null: a
// fresh one.
ProcessGroups MakeSingleProcessGroups(std::shared_ptr<CollectiveStats> stats = nullptr,
                                      Device device = Device::Cpu());

}  // namespace latchkey::comm

#endif  // LATCHKEY_WORKER_COMM_PROCESS_GROUPS_H_
