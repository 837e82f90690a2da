// Private state of Coordinator, shared by coordinator.cc (jobs) and coordinator_workers.cc
// (workers, latch publication, liveness). Not part of the server's interface.
#ifndef LATCHKEY_SERVER_COORDINATOR_INTERNAL_H_
#define LATCHKEY_SERVER_COORDINATOR_INTERNAL_H_

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "server/coordinator.h"

namespace latchkey {

struct Coordinator::Rank {
  std::string worker_id;  // empty: free
  std::string host;
  WorkerState state = WorkerState::kJoined;
  absl::Time join_time = absl::UnixEpoch();
  absl::Time last_seen = absl::UnixEpoch();  // not persisted: a restart grants a fresh deadline
  int64_t steps_reported = 0;                // highest reported step + 1
  int open_streams = 0;                      // latch streams subscribed now
};

// Reports of one step while not every rank has reported it.
struct Coordinator::PartialStep {
  int count = 0;
  StepSummary summary;
};

struct Coordinator::Job {
  JobRecord rec;
  JobSpec spec;
  std::vector<Rank> ranks;  // world_size entries
  int joined = 0;
  // Published latches [latch_base, rec.next_window) kept in memory for the streams: from a few
  // windows behind the slowest rank on. Older ones (and all of an ended job's) are read from the
  // store when a resuming worker asks for them.
  std::deque<PublishedLatch> latches;
  int64_t latch_base = 0;
  std::map<int64_t, PartialStep> partial;
  std::map<int64_t, StepSummary> recent;  // completed steps, the last options.recent_steps
  int64_t steps_completed = 0;            // min over ranks of steps_reported
  uint64_t version = 1;                   // bumps on every change waiters may care about
  absl::CondVar cv;                       // signalled with version
  std::map<uint64_t, std::shared_ptr<JobListener>> listeners;  // latch streams
  bool dirty = false;                                          // queued for the notifier

  int world_size() const { return static_cast<int>(ranks.size()); }
};

// Codes with messages in one style: "<job>: <what>".
absl::Status JobNotFound(const std::string& job_id);
absl::Status Unavailable();

}  // namespace latchkey

#endif  // LATCHKEY_SERVER_COORDINATOR_INTERNAL_H_
