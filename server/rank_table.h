// RankTable: which worker holds which rank of one job, where it runs, how far it has reported
// and when it was last seen. Part of the Coordinator's private implementation.
//
// The table owns rank assignment (Claim/Place) and the liveness verdict (Late); it does not
// persist anything or change worker states itself: the Coordinator writes WorkerRecords and
// calls back with the outcome.
//
// Thread-safety: none; the Coordinator holds its lock around every call.
#ifndef LATCHKEY_SERVER_RANK_TABLE_H_
#define LATCHKEY_SERVER_RANK_TABLE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/rank_grid.h"
#include "common/rank_position.h"
#include "common/reachability.h"
#include "common/states.h"
#include "server/store.h"

namespace latchkey {

class RankTable {
 public:
  struct Rank {
    std::string worker_id;  // empty: free
    std::string host;
    WorkerState state = WorkerState::kJoined;
    absl::Time join_time = absl::UnixEpoch();
    absl::Time last_seen = absl::UnixEpoch();  // not persisted: a restart grants a fresh deadline
    // Highest reported step + 1. Read it here; change it through SetStepsReported (the table
    // keeps the minimum over its ranks).
    int64_t steps_reported = 0;
    int open_streams = 0;  // latch streams subscribed now
    int64_t attempt = 1;   // the job attempt the holder joined
    // Where the rank is, as its latest heartbeat said (none: it never sent a position), and
    // when that heartbeat arrived (not persisted).
    std::optional<RankPosition> position;
    absl::Time heartbeat_time = absl::UnixEpoch();
    // Partitions (server/partition.h): the holder's probe port on `host` (0: it has none), and
    // its newest probe round of its peers with the time it arrived (not persisted).
    int probe_port = 0;
    std::optional<Reachability> reach;
    // The node the holder runs on, as it joined (JoinArgs::node; not persisted): "" = its host.
    std::string node;
    absl::Time reach_time = absl::UnixEpoch();
  };

  // REQUIRES: grid.valid().
  explicit RankTable(RankGrid grid) : grid_(grid), ranks_(static_cast<size_t>(grid.world_size)) {
    progress_[0] = grid.world_size;
  }

  const RankGrid& grid() const { return grid_; }
  int world_size() const { return grid_.world_size; }
  int joined() const { return joined_; }
  bool all_joined() const { return joined_ == world_size(); }
  // REQUIRES: grid().contains(rank).
  Rank& at(int rank) { return ranks_[static_cast<size_t>(rank)]; }
  const Rank& at(int rank) const { return ranks_[static_cast<size_t>(rank)]; }

  // The rank `worker_id` holds, if any (a hash lookup: every worker call asks).
  std::optional<int> RankOf(const std::string& worker_id) const;
  // OK when `worker_id` holds `rank`. INVALID_ARGUMENT for a rank outside the grid, ABORTED
  // when another worker (or none) holds it.
  absl::Status CheckHolder(const std::string& job_id, int rank, const std::string& worker_id) const;
  // The rank a new worker gets: `requested` if free, else the lowest free one. INVALID_ARGUMENT
  // for a requested rank outside the grid; ABORTED when it is held (reason RANK_HELD) or every
  // rank is taken.
  absl::StatusOr<int> Claim(const std::string& job_id, std::optional<int> requested) const;
  // Records `worker` (already persisted) as the holder of worker.rank.
  void Place(const WorkerRecord& worker, absl::Time now);
  // Progress after a restart: the highest step each rank had reported.
  void SetProgress(int rank, int64_t max_step) { SetStepsReported(rank, max_step + 1); }
  // at(rank).steps_reported = steps.
  void SetStepsReported(int rank, int64_t steps);
  // Frees one rank (its holder left: Coordinator::Leave); the others keep theirs.
  void Release(int rank);
  // A new attempt: every rank free, each rank's progress `steps_reported` (the first window the
  // attempt runs).
  void Reset(int64_t steps_reported);

  // Changes whenever a rank gets another holder (Place, Reset): the version of the peer list
  // the ranks probe (common/reachability.h).
  int64_t peers_version() const { return peers_version_; }
  void PeersChanged() { ++peers_version_; }

  // min over ranks of steps_reported; 0 until every rank has joined. O(1).
  int64_t StepsCompleted() const;

  // Ranks past the liveness deadline at `now`. A rank with an open latch stream counts as seen
  // now (its connection closes if the process dies).
  std::vector<int> Late(absl::Time now, absl::Duration timeout);

 private:
  RankGrid grid_;
  std::vector<Rank> ranks_;
  int joined_ = 0;
  int64_t peers_version_ = 1;
  std::unordered_map<std::string, int> by_worker_;  // worker id -> the rank it holds
  std::map<int64_t, int> progress_;                 // steps_reported -> ranks at it
};

// A worker that can still take part (joined or active).
inline bool IsLive(WorkerState s) { return s == WorkerState::kJoined || s == WorkerState::kActive; }

// The rule of topology: the ranks of a tensor-parallel group (consecutive ranks) run on one node
// (the node a holder joined with, else its host). The first group that spans nodes, named with
// its ranks, their nodes and what to change; none when every group is on one node (or tp is 1).
std::optional<std::string> TensorParallelAcrossNodes(const RankTable& ranks);

}  // namespace latchkey

#endif  // LATCHKEY_SERVER_RANK_TABLE_H_
