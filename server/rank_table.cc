#include "server/rank_table.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/error_info.h"

namespace latchkey {

std::optional<int> RankTable::RankOf(const std::string& worker_id) const {
  auto it = by_worker_.find(worker_id);
  if (it == by_worker_.end()) return std::nullopt;
  return it->second;
}

void RankTable::SetStepsReported(int rank, int64_t steps) {
  Rank& r = at(rank);
  if (r.steps_reported == steps) return;
  auto it = progress_.find(r.steps_reported);
  if (--it->second == 0) progress_.erase(it);
  progress_[steps]++;
  r.steps_reported = steps;
}

absl::Status RankTable::CheckHolder(const std::string& job_id, int rank,
                                    const std::string& worker_id) const {
  if (!grid_.contains(rank)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank: ", rank, " is outside [0, ", world_size(), ")"));
  }
  const Rank& r = at(rank);
  if (r.worker_id != worker_id) {
    return absl::AbortedError(absl::StrCat("rank ", rank, " of job ", job_id, " is held by ",
                                           r.worker_id.empty()
                                               ? std::string("no worker (join first)")
                                               : absl::StrCat("worker ", r.worker_id),
                                           ", not ", worker_id));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> RankTable::Claim(const std::string& job_id,
                                     std::optional<int> requested) const {
  if (requested) {
    if (!grid_.contains(*requested)) {
      return absl::InvalidArgumentError(
          absl::StrCat("requested_rank: ", *requested, " is outside [0, ", world_size(), ")"));
    }
    const Rank& held = at(*requested);
    if (!held.worker_id.empty()) {
      ErrorInfo info;
      info.reason = error_reason::kRankHeld;
      info.metadata = {{"rank", std::to_string(*requested)}, {"holder", held.worker_id}};
      return WithErrorInfo(absl::AbortedError(absl::StrCat("rank ", *requested, " of job ", job_id,
                                                           " is held by worker ", held.worker_id)),
                           info);
    }
    return *requested;
  }
  for (int i = 0; i < world_size(); ++i) {
    if (at(i).worker_id.empty()) return i;
  }
  return absl::AbortedError(absl::StrCat(job_id, ": all ", world_size(), " ranks taken"));
}

void RankTable::Place(const WorkerRecord& worker, absl::Time now) {
  Rank& r = at(worker.rank);
  if (r.worker_id.empty()) joined_++;
  if (!r.worker_id.empty()) by_worker_.erase(r.worker_id);
  // A worker holds one rank: one that held another before gives it up in the map only (the
  // coordinator frees ranks through Reset).
  by_worker_[worker.worker_id] = worker.rank;
  r.worker_id = worker.worker_id;
  r.host = worker.host;
  r.state = worker.state;
  r.join_time = worker.join_time;
  r.last_seen = now;
  r.attempt = worker.attempt;
  r.position.reset();
  r.heartbeat_time = now;
  r.probe_port = 0;
  r.node.clear();
  r.reach.reset();
  ++peers_version_;
}

void RankTable::Reset(int64_t steps_reported) {
  ++peers_version_;
  for (Rank& r : ranks_) {
    r = Rank{};
    r.steps_reported = steps_reported;
  }
  joined_ = 0;
  by_worker_.clear();
  progress_.clear();
  progress_[steps_reported] = world_size();
}

void RankTable::Release(int rank) {
  Rank& r = at(rank);
  if (r.worker_id.empty()) return;
  by_worker_.erase(r.worker_id);
  --joined_;
  const int64_t steps = r.steps_reported;
  r = Rank{};
  r.steps_reported = steps;
  ++peers_version_;
}

int64_t RankTable::StepsCompleted() const {
  if (!all_joined()) return 0;
  return progress_.begin()->first;
}

std::vector<int> RankTable::Late(absl::Time now, absl::Duration timeout) {
  std::vector<int> late;
  for (int i = 0; i < world_size(); ++i) {
    Rank& r = at(i);
    if (r.worker_id.empty() || !IsLive(r.state)) continue;
    if (r.open_streams > 0) r.last_seen = now;
    if (now - r.last_seen > timeout) late.push_back(i);
  }
  return late;
}

namespace {

// The node a rank's holder runs on: the agent's identity it joined with, else its host.
const std::string& NodeOf(const RankTable::Rank& r) { return r.node.empty() ? r.host : r.node; }

}  // namespace

std::optional<std::string> TensorParallelAcrossNodes(const RankTable& ranks) {
  const RankGrid& grid = ranks.grid();
  if (grid.tp < 2) return std::nullopt;
  for (int d = 0; d < grid.dp(); ++d) {
    const int first = grid.rank(d, 0);
    const int last = grid.rank(d, grid.tp - 1);
    bool spans = false;
    for (int r = first + 1; r <= last; ++r) {
      spans = spans || NodeOf(ranks.at(r)) != NodeOf(ranks.at(first));
    }
    if (!spans) continue;
    std::vector<std::string> where;
    for (int r = first; r <= last; ++r) {
      const std::string& node = NodeOf(ranks.at(r));
      where.push_back(absl::StrCat("rank ", r, " on ", node.empty() ? "?" : node));
    }
    return absl::StrCat(
        "tensor-parallel group ", d, " (ranks ", first, "..", last,
        ") spans nodes: ", absl::StrJoin(where, ", "),
        "; a tensor-parallel group must be on one node (it all-reduces in every layer): run "
        "`latchkey node` with --nproc a multiple of tensor_parallel.autotp_size (",
        grid.tp, "), or start each group's ranks on one host");
  }
  return std::nullopt;
}

}  // namespace latchkey
