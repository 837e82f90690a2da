// The Coordinator's per-job state: one component per concern, composed. Private to the
// coordinator's .cc files; not part of the server's interface.
#ifndef LATCHKEY_SERVER_COORDINATOR_INTERNAL_H_
#define LATCHKEY_SERVER_COORDINATOR_INTERNAL_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/attempt_log.h"
#include "server/boundary_arrivals.h"
#include "server/coordinator.h"
#include "server/latch_log.h"
#include "server/rank_table.h"
#include "server/step_aggregator.h"
#include "server/stragglers.h"

namespace latchkey {

struct Coordinator::Job {
  // `rec` as stored; `layout` from the spec (1 x 1 for a spec this build cannot parse);
  // `stored`: the records of its attempts after the first. The rank table, the step summaries
  // and the latch log are in the current attempt's layout.
  Job(JobRecord record, JobSpec job_spec, const AttemptLayout& layout, size_t recent_steps,
      const std::vector<AttemptRecord>& stored = {})
      : rec(std::move(record)),
        spec(std::move(job_spec)),
        attempts(rec, layout, spec.elastic.min_dp, stored),
        ranks(attempts.layout().grid()),
        latches(rec.job_id, rec.next_window, rec.next_first_micro_batch, rec.next_first_sample),
        steps(attempts.layout().world_size, recent_steps),
        stragglers(spec.stragglers, attempts.layout().grid()),
        recent_steps_kept(recent_steps) {
    latches.SetLayout(attempts.current().layout_attempt, attempts.layout().dp);
  }

  // A spare (latchkey.elastic): a live worker without a rank, waiting for the job to grow.
  struct Spare {
    std::optional<int> requested_rank;
    std::string host;
    absl::Time last_seen = absl::UnixEpoch();
  };

  // The durable record. rec.next_window / next_first_micro_batch follow latches after every
  // publication (LatchLog owns them); rec.attempt ... last_recovery_reason follow attempts
  // (AttemptLog owns them).
  JobRecord rec;
  JobSpec spec;
  AttemptLog attempts;
  RankTable ranks;  // the current attempt's ranks, in its layout
  LatchLog latches;
  StepAggregator steps;
  BoundaryArrivals arrivals;
  StragglerTracker stragglers;  // in memory only: a restarted coordinator measures again
  // The split of the newest latch this coordinator published (audited when it changes).
  std::vector<int> last_split;
  TraceRequest trace;  // an open GetTrace (coordinator_trace.cc); never persisted
  size_t recent_steps_kept;
  std::map<std::string, Spare> spares;  // worker id -> its wait; never persisted
  // The most ranks.StepsCompleted() has been as of the last Advance: it does not go back when
  // a recovery resumes from an older checkpoint (the steps stay completed and stored).
  int64_t steps_completed = 0;
  // No hang verdict before this time: set when the coordinator finds it did not run for a
  // while (Coordinator::GraceAfterPause). Never persisted.
  absl::Time hang_grace_until = absl::InfinitePast();
  absl::Time liveness_grace_until = absl::InfinitePast();  // no liveness verdict before it
  // A resumed attempt (Coordinator::ResumeJob) whose workers have not begun to join: the user
  // starts them after resuming, so its rejoin window opens at the first join. Never persisted
  // (a restarted coordinator opens it at load, as for any recovery).
  bool resume_awaits_first_join = false;
  // A network partition the job waits out (coordinator_partition.cc): since when its link has
  // been cut, and when the waiting cause was last written to the record. Never persisted (a
  // restarted coordinator learns of it again from the ranks' probes).
  struct PartitionWait {
    absl::Time since;
    absl::Time written = absl::InfinitePast();
  };
  std::optional<PartitionWait> partition;
  // A stop in progress (coordinator_stop.cc): a rank left on a stop signal, or a suspend. No
  // latch from `before_window` on is published; the ranks save the state after
  // before_window - 1 and leave; once that checkpoint commits the job becomes `to`. Never
  // persisted (a restarted coordinator publishes on; the ranks that left are recovered from as
  // after a crash).
  struct Stop {
    int64_t before_window = 0;
    JobState to = JobState::kPreempted;
    std::string cause;
    std::set<int> left;  // the ranks that said they leave
  };
  std::optional<Stop> stop;

  // Waiters (WaitJobChange, WaitLatches) and latch streams.
  uint64_t version = 1;  // bumps on every change waiters may care about
  absl::CondVar cv;      // signalled with version
  std::map<uint64_t, std::shared_ptr<JobListener>> listeners;
  bool dirty = false;         // queued for the notifier
  bool counted_live = false;  // its world size is in Coordinator::live_ranks_
  // The join token a worker call last presented that matched rec.join_token's hash: a call
  // presenting the same bytes is checked by comparison, without hashing under the lock. Never
  // persisted.
  std::string verified_token;
  // Reports refused as ones no worker of the job could honestly send, recorded as events in
  // attempt `refusals_attempt` (Coordinator::RefuseReport). Never persisted.
  int64_t refusals_attempt = 0;
  int refusals_recorded = 0;

  int world_size() const { return ranks.world_size(); }
};

// Codes with messages in one style: "<job>: <what>".
absl::Status JobNotFound(const std::string& job_id);
absl::Status Unavailable();

}  // namespace latchkey

#endif  // LATCHKEY_SERVER_COORDINATOR_INTERNAL_H_
