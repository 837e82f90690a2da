#include "server/job_state_machine.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace latchkey {

bool JobStateMachine::Allowed(JobState from, JobState to) {
  switch (to) {
    case JobState::kRunning:
      return from == JobState::kPending || from == JobState::kRecovering ||
             from == JobState::kPreempted;
    case JobState::kRecovering:
      // A failure while running, or another one during a recovery (a new attempt each time);
      // a user's resume of a failed, cancelled or suspended job (Coordinator::ResumeJob); the
      // ranks of a preempted job joining again.
      return from == JobState::kRunning || from == JobState::kRecovering ||
             from == JobState::kFailed || from == JobState::kCancelled ||
             from == JobState::kPreempted || from == JobState::kSuspended;
    case JobState::kPreempted:
      // The attempt after a stop (Coordinator::MaybeFinishStop) begins recovering, then waits.
      return from == JobState::kRunning || from == JobState::kRecovering;
    case JobState::kSuspended:
      return from == JobState::kRunning || from == JobState::kPending ||
             from == JobState::kRecovering || from == JobState::kPreempted;
    case JobState::kSucceeded:
      return from == JobState::kRunning;
    case JobState::kFailed:
    case JobState::kCancelled:
      return !IsTerminal(from);
    case JobState::kPending:
      return false;
  }
  return false;
}

absl::Status JobStateMachine::SetJobState(JobRecord& job, JobState state, const std::string& reason,
                                          const JobEventRecord* event) {
  if (!Allowed(job.state, state)) {
    return absl::InternalError(absl::StrCat(job.job_id, ": no transition ", JobStateName(job.state),
                                            " -> ", JobStateName(state)));
  }
  JobRecord next = job;
  next.state = state;
  next.failure_reason = reason;
  next.update_time = clock_->Now();
  LK_RETURN_IF_ERROR(event != nullptr ? store_->UpdateJobWithEvent(next, *event)
                                      : store_->UpdateJob(next));
  if (observer_) {
    observer_->AddJobs(job.state, -1);
    observer_->AddJobs(state, 1);
  }
  if (log_ && *log_) {
    (*log_)(absl::StrCat(job.job_id, ": ", JobStateName(job.state), " -> ", JobStateName(state),
                         reason.empty() ? "" : absl::StrCat(" (", reason, ")")));
  }
  job = std::move(next);
  return absl::OkStatus();
}

absl::Status JobStateMachine::Pause(JobRecord& job, JobState state, const std::string& reason,
                                    const JobEventRecord& event) {
  if (state != JobState::kPreempted && state != JobState::kSuspended) {
    return absl::InternalError(absl::StrCat(job.job_id, ": Pause to ", JobStateName(state)));
  }
  return SetJobState(job, state, reason, &event);
}

absl::Status JobStateMachine::SetWorkerState(const std::string& job_id, RankTable& ranks, int rank,
                                             WorkerState state) {
  RankTable::Rank& r = ranks.at(rank);
  if (r.worker_id.empty() || r.state == state) return absl::OkStatus();
  WorkerRecord w;
  w.job_id = job_id;
  w.rank = rank;
  w.worker_id = r.worker_id;
  w.host = r.host;
  w.state = state;
  w.join_time = r.join_time;
  w.attempt = r.attempt;  // the row is replaced whole: a restarted coordinator reads it back
  LK_RETURN_IF_ERROR(store_->PutWorker(w));
  if (observer_) {
    observer_->AddWorkers(r.state, -1);
    observer_->AddWorkers(state, 1);
  }
  r.state = state;
  return absl::OkStatus();
}

absl::Status JobStateMachine::Recover(JobRecord& job, JobRecord next, const JobEventRecord& event,
                                      const AttemptRecord& attempt,
                                      const PolicyChangeRecord* layout_change) {
  if (!Allowed(job.state, JobState::kRecovering)) {
    return absl::InternalError(absl::StrCat(job.job_id, ": no transition ", JobStateName(job.state),
                                            " -> ", JobStateName(JobState::kRecovering)));
  }
  next.state = JobState::kRecovering;
  next.failure_reason.clear();
  next.update_time = clock_->Now();
  LK_RETURN_IF_ERROR(store_->BeginAttempt(next, attempt, layout_change, event));
  if (observer_) {
    observer_->AddJobs(job.state, -1);
    observer_->AddJobs(JobState::kRecovering, 1);
  }
  if (log_ && *log_) {
    (*log_)(absl::StrCat(job.job_id, ": ", JobStateName(job.state), " -> recovering (attempt ",
                         next.attempt, ", restart ", next.restarts,
                         "): ", next.last_recovery_reason));
  }
  job = std::move(next);
  return absl::OkStatus();
}

absl::Status JobStateMachine::Start(JobRecord& job, RankTable& ranks) {
  LK_RETURN_IF_ERROR(SetJobState(job, JobState::kRunning, ""));
  for (int i = 0; i < ranks.world_size(); ++i) {
    LK_RETURN_IF_ERROR(SetWorkerState(job.job_id, ranks, i, WorkerState::kActive));
  }
  return absl::OkStatus();
}

absl::Status JobStateMachine::End(JobRecord& job, RankTable& ranks, JobState state,
                                  const std::string& reason, WorkerState worker_state,
                                  const JobEventRecord* event) {
  if (!IsTerminal(state) || !Allowed(job.state, state)) {
    return absl::InternalError(absl::StrCat(job.job_id, ": cannot end ", JobStateName(job.state),
                                            " as ", JobStateName(state)));
  }
  for (int i = 0; i < ranks.world_size(); ++i) {
    if (IsLive(ranks.at(i).state)) {
      LK_RETURN_IF_ERROR(SetWorkerState(job.job_id, ranks, i, worker_state));
    }
  }
  return SetJobState(job, state, reason, event);
}

}  // namespace latchkey
