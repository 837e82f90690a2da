// JobStateMachine: the job and worker state transitions, each persisted before it shows, counted
// for the metrics and logged. Part of the Coordinator's private implementation.
//
//   pending -> running               every rank joined (its workers become active)
//   running | recovering -> recovering   a rank failed, restarts remain: a new attempt
//   recovering -> running            every rank of the new attempt joined
//   running -> succeeded             every rank reported the last step
//   pending | running | recovering -> failed      a worker failed past max_restarts
//   pending | running | recovering -> cancelled   a user cancelled it
//   failed | cancelled -> recovering     a user resumed it (Coordinator::ResumeJob): a new
//                                        attempt from the newest committed checkpoint
//
// Succeeded, failed and cancelled are terminal: nothing but a user's resume leaves failed or
// cancelled, and nothing leaves succeeded. Asking for any other transition is a bug in the
// caller and returns INTERNAL, changing nothing.
//
// Thread-safety: none; the Coordinator holds its lock around every call. The store, observer,
// log and clock passed at construction must outlive the machine.
#ifndef LATCHKEY_SERVER_JOB_STATE_MACHINE_H_
#define LATCHKEY_SERVER_JOB_STATE_MACHINE_H_

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "common/clock.h"
#include "common/states.h"
#include "server/coordinator.h"
#include "server/rank_table.h"
#include "server/store.h"

namespace latchkey {

class JobStateMachine {
 public:
  using Log = std::function<void(const std::string&)>;
  // `observer` may be null; `log` may be empty.
  JobStateMachine(JobStore* store, CoordinatorObserver* observer, const Log* log,
                  const Clock* clock)
      : store_(store), observer_(observer), log_(log), clock_(clock) {}

  static bool Allowed(JobState from, JobState to);

  // pending | recovering -> running; every joined rank becomes active.
  absl::Status Start(JobRecord& job, RankTable& ranks);
  // running | recovering (or, resumed, failed | cancelled) -> recovering as `next` says (its
  // attempt, restarts, resume step, cause), persisted with the attempt's record, `event` and a new
  // layout's policy change (may be null) in one transaction (JobStore::BeginAttempt); the failure
  // reason is cleared.
  absl::Status Recover(JobRecord& job, JobRecord next, const JobEventRecord& event,
                       const AttemptRecord& attempt, const PolicyChangeRecord* layout_change);
  // -> `state` (terminal) with `reason`; every live rank becomes `worker_state`. `event`, when
  // not null, is persisted with the job's new state in one transaction (the audit's record of
  // the end, e.g. a cancel).
  absl::Status End(JobRecord& job, RankTable& ranks, JobState state, const std::string& reason,
                   WorkerState worker_state, const JobEventRecord* event = nullptr);
  // A stop's end (coordinator_stop.cc): running | recovering -> preempted, or running | pending
  // | recovering | preempted -> suspended, with `reason`, persisted with `event`.
  absl::Status Pause(JobRecord& job, JobState state, const std::string& reason,
                     const JobEventRecord& event);
  // One rank's worker state (no-op for a free rank or an unchanged state).
  absl::Status SetWorkerState(const std::string& job_id, RankTable& ranks, int rank,
                              WorkerState state);

 private:
  absl::Status SetJobState(JobRecord& job, JobState state, const std::string& reason,
                           const JobEventRecord* event = nullptr);

  JobStore* store_;
  CoordinatorObserver* observer_;
  const Log* log_;
  const Clock* clock_;
};

}  // namespace latchkey

#endif  // LATCHKEY_SERVER_JOB_STATE_MACHINE_H_
