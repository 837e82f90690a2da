// The Coordinator's per-job state: one component per concern, composed. Private to the
// coordinator's .cc files; not part of the server's interface.
#ifndef LATCHKEY_SERVER_COORDINATOR_INTERNAL_H_
#define LATCHKEY_SERVER_COORDINATOR_INTERNAL_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/rank_grid.h"
#include "server/coordinator.h"
#include "server/latch_log.h"
#include "server/rank_table.h"
#include "server/step_aggregator.h"

namespace latchkey {

struct Coordinator::Job {
  // `rec` as stored; `grid` from the spec (1 x 1 for a spec this build cannot parse).
  Job(JobRecord record, JobSpec job_spec, RankGrid grid, size_t recent_steps)
      : rec(std::move(record)),
        spec(std::move(job_spec)),
        ranks(grid),
        latches(rec.job_id, rec.next_window, rec.next_first_micro_batch),
        steps(grid.world_size, recent_steps) {}

  // The durable record. rec.next_window / next_first_micro_batch follow latches after every
  // publication (LatchLog owns them).
  JobRecord rec;
  JobSpec spec;
  RankTable ranks;
  LatchLog latches;
  StepAggregator steps;
  // The most ranks.StepsCompleted() has been as of the last Advance: it does not go back when
  // a recovery resumes from an older checkpoint (the steps stay completed and stored).
  int64_t steps_completed = 0;

  // Attempts: the workers of earlier attempts (worker id -> the attempt it last held a rank
  // in; a worker that joins the current attempt leaves it), the steps of this attempt already
  // counted as determinism violations, each window's boundary waits of this attempt by rank
  // until every rank reported it, and the last windows' slowest ranks (newest last).
  std::map<std::string, int64_t> fenced;
  std::set<int64_t> violated_steps;
  std::map<int64_t, std::map<int, double>> arrivals;
  std::deque<WindowArrival> slowest;
  static constexpr size_t kSlowestKept = 8;
  // When the current recovery began (not persisted: a restarted coordinator grants a fresh
  // deadline); a rank still free a liveness timeout later fails the attempt.
  absl::Time recovery_start = absl::UnixEpoch();

  // Waiters (WaitJobChange, WaitLatches) and latch streams.
  uint64_t version = 1;  // bumps on every change waiters may care about
  absl::CondVar cv;      // signalled with version
  std::map<uint64_t, std::shared_ptr<JobListener>> listeners;
  bool dirty = false;  // queued for the notifier

  int world_size() const { return ranks.world_size(); }
};

// Codes with messages in one style: "<job>: <what>".
absl::Status JobNotFound(const std::string& job_id);
absl::Status Unavailable();

}  // namespace latchkey

#endif  // LATCHKEY_SERVER_COORDINATOR_INTERNAL_H_
