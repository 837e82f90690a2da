// Coordinator: stops that lose nothing (docs/fault-tolerance.md "Preemption"). A rank that got
// a stop signal (a node drain, a preemption: Leave) or a user's suspend (SuspendJob) stops the
// whole attempt, since a collective needs every rank: no latch from the first unpublished
// window on is published, every rank runs the windows already decided, saves the state after
// the last of them and stops. Once that checkpoint commits the job is `preempted` (a new
// attempt from it, no restart spent, waiting without a deadline for its ranks to join) or
// `suspended` (waiting for ResumeJob). The stop point is the first unpublished window because
// the coordinator is the one authority on windows: every rank reaches it, none passes it, and
// no collective or latch changes for it; the price is that the ranks run up to latch_lookahead
// windows after the signal before they save.
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "server/coordinator.h"
#include "server/coordinator_internal.h"
#include "server/job_state_machine.h"

namespace latchkey {

void Coordinator::BeginStop(Job& job, JobState to, const std::string& cause) {
  Job::Stop stop;
  stop.before_window = job.latches.next_window();
  stop.to = to;
  stop.cause = cause;
  job.stop = std::move(stop);
  const std::string message =
      absl::StrCat(cause, "; the attempt saves the state after step ", job.stop->before_window - 1,
                   " and stops (no latch from window ", job.stop->before_window, " on)");
  RecordEvent(job, "stopping", message);
  Touch(job);  // waiters for the stop window hear of it
  // No window has run yet: there is nothing to save, and the stop is done now.
  if (job.stop->before_window == 0) (void)MaybeFinishStop(job, -1);
}

absl::Status Coordinator::MaybeFinishStop(Job& job, int64_t step) {
  if (!job.stop || step != job.stop->before_window - 1) return absl::OkStatus();
  const Job::Stop stop = *std::move(job.stop);
  job.stop.reset();
  std::string why = stop.cause;
  if (!stop.left.empty())
    absl::StrAppend(&why, "; ranks that left: ", absl::StrJoin(stop.left, ","));
  absl::StrAppend(&why, "; saved after step ", step, ", no restart spent");
  if (stop.to == JobState::kSuspended) {
    // The ranks keep their places (their heartbeats hear `suspended`, and they exit for their
    // supervisor to stop); ResumeJob's new attempt frees every rank.
    const JobEventRecord event = Event(job, "suspended", why);
    absl::Status s = machine_->Pause(job.rec, JobState::kSuspended, why, event);
    Touch(job);
    return s;
  }
  // Preempted: the next attempt, resumed from the checkpoint just committed, waits for its
  // ranks without the rejoin deadline of a recovery (the replacements of drained nodes may take
  // minutes to be scheduled).
  AttemptLog::Recovery r;
  r.cause = why;
  r.spend_restart = false;
  LK_RETURN_IF_ERROR(BeginAttempt(job, r));
  const JobEventRecord event = Event(job, "preempted", why);
  absl::Status s = machine_->Pause(job.rec, JobState::kPreempted, why, event);
  Touch(job);
  return s;
}

absl::Status Coordinator::ReleaseRank(Job& job, int rank, const std::string& why) {
  RankTable::Rank& r = job.ranks.at(rank);
  if (r.worker_id.empty()) return absl::OkStatus();
  Log(absl::StrCat(job.rec.job_id, ": rank ", rank, " (worker ", r.worker_id, ") ", why, "; rank ",
                   rank, " is free for another worker"));
  LK_RETURN_IF_ERROR(SetWorkerState(job, rank, WorkerState::kLost));
  if (observer_) observer_->AddWorkers(r.state, -1);  // it leaves the job's table
  job.attempts.Fence(r.worker_id, r.attempt);
  job.ranks.Release(rank);
  Touch(job);
  return absl::OkStatus();
}

absl::StatusOr<WorkerStatus> Coordinator::Leave(const WorkerCall& call, const std::string& reason) {
  absl::MutexLock lock(&mu_);
  LK_ASSIGN_OR_RETURN(Job * found, FindForWorker(call, /*check_rank=*/true));
  Job& j = *found;
  j.ranks.at(call.rank).last_seen = clock_->Now();
  const std::string who = absl::StrCat("rank ", call.rank, " (worker ", call.worker_id, ")");
  const std::string why = reason.empty() ? std::string("a stop signal") : reason;
  switch (j.rec.state) {
    case JobState::kRunning:
      if (!j.spec.checkpoint.enabled()) {
        // Nothing can be saved: the rank's exit is recovered from as a crash, from the start.
        Log(absl::StrCat(j.rec.job_id, ": ", who, " leaves (", why,
                         "); no latchkey.checkpoint.dir, so nothing is saved"));
        break;
      }
      if (!j.stop && j.latches.next_window() >= j.spec.steps) {
        // Every window left is decided: the job ends within them, sooner than a stop would.
        Log(absl::StrCat(j.rec.job_id, ": ", who, " leaves (", why,
                         "); every remaining window is decided, so the job finishes first"));
        break;
      }
      if (!j.stop) BeginStop(j, JobState::kPreempted, absl::StrCat(who, " left (", why, ")"));
      if (j.stop) j.stop->left.insert(call.rank);  // (none left: a stop before window 0 ended)
      break;
    case JobState::kPending:
    case JobState::kRecovering:
    case JobState::kPreempted:
      // Not training: nothing to save. Its rank is free for a replacement at once.
      LK_RETURN_IF_ERROR(ReleaseRank(j, call.rank, absl::StrCat("left (", why, ")")));
      break;
    default:  // suspended or ended: nothing runs
      break;
  }
  WorkerStatus out{j.rec.state, j.rec.failure_reason, false, j.attempts.attempt(), {}};
  out.stop = j.stop.has_value();
  return out;
}

absl::StatusOr<JobView> Coordinator::SuspendJob(const std::string& job_id,
                                                const std::string& reason) {
  absl::MutexLock lock(&mu_);
  LK_ASSIGN_OR_RETURN(Job * found, FindJob(job_id));
  Job& j = *found;
  const std::string why = reason.empty() ? std::string("suspended by user") : reason;
  switch (j.rec.state) {
    case JobState::kRunning:
      if (!j.spec.checkpoint.enabled()) {
        return absl::FailedPreconditionError(absl::StrCat(
            job_id,
            ": latchkey.checkpoint.dir is not set, so a suspend would lose every step; "
            "cancel it instead"));
      }
      if (j.stop) {
        j.stop->to = JobState::kSuspended;  // a preemption under way ends suspended instead
      } else if (j.latches.next_window() >= j.spec.steps) {
        return absl::FailedPreconditionError(absl::StrCat(
            job_id, ": every remaining window (to step ", j.spec.steps - 1,
            ") is decided, so it finishes sooner than a suspend could save; nothing to suspend"));
      } else {
        BeginStop(j, JobState::kSuspended, why);
      }
      break;
    case JobState::kPending:
    case JobState::kRecovering:
    case JobState::kPreempted: {
      // No attempt is training: its last checkpoint is where it resumes. Its joined ranks hear
      // `suspended` at their next join or heartbeat and exit.
      const JobEventRecord event = Event(j, "suspended", why);
      LK_RETURN_IF_ERROR(machine_->Pause(j.rec, JobState::kSuspended, why, event));
      Log(absl::StrCat(job_id, ": ", why));
      Touch(j);
      break;
    }
    case JobState::kSuspended:
      break;  // idempotent
    default:
      return absl::FailedPreconditionError(
          absl::StrCat(job_id, ": already ended (", JobStateName(j.rec.state), ")"));
  }
  return View(j, true);
}

}  // namespace latchkey
