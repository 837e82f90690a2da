// Coordinator: recovery decisions (docs/fault-tolerance.md). A failure of a live job starts a
// new attempt while restarts remain, else fails the job; a new attempt frees every rank and
// fences the workers of the old one. What an attempt is, and the layout it runs, is the
// AttemptLog's (attempt_log.h).
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/crash_point.h"
#include "common/status_macros.h"
#include "server/coordinator.h"
#include "server/coordinator_internal.h"
#include "server/job_state_machine.h"

namespace latchkey {

absl::Status Coordinator::FailOrRecover(Job& job, int rank, WorkerState worker_state,
                                        const std::string& cause) {
  if (rank >= 0) LK_RETURN_IF_ERROR(SetWorkerState(job, rank, worker_state));
  const bool live = job.rec.state == JobState::kRunning || job.rec.state == JobState::kRecovering;
  const int restarts = job.attempts.restarts();
  if (live && restarts < job.spec.max_restarts) return BeginAttempt(job, cause);
  std::string reason = cause;
  if (restarts > 0) {
    absl::StrAppend(&reason, " (after ", restarts, restarts == 1 ? " restart)" : " restarts)");
  }
  return EndJob(job, JobState::kFailed, reason, WorkerState::kDone);
}

absl::Status Coordinator::BeginAttempt(Job& job, const std::string& cause) {
  AttemptLog::Attempt next =
      job.attempts.Next(cause, job.rec.last_checkpoint_step, job.rec.last_checkpoint_sha256);
  JobRecord rec = job.rec;
  AttemptLog::Record(next, &rec);
  JobEventRecord event = Event(job, "recovery", "");
  event.attempt = next.number;
  event.message = absl::StrCat(
      "attempt ", next.number, " (restart ", next.restarts, " of ", job.spec.max_restarts,
      ") resumes ",
      next.resume_step >= 0 ? absl::StrCat("from the checkpoint after step ", next.resume_step)
                            : std::string("from the start"),
      ": ", cause);
  // Persisted (with its event) before anything of the new attempt shows.
  absl::Status s = machine_->Recover(job.rec, std::move(rec), event);
  Touch(job);
  LK_RETURN_IF_ERROR(s);
  MaybeCrash("recovery.after_attempt");
  if (observer_) observer_->JobRestarted();
  Log(absl::StrCat(job.rec.job_id, ": ", event.message));
  job.attempts.Begin(std::move(next), clock_->Now());
  ResetRanks(job);
  return absl::OkStatus();
}

void Coordinator::ResetRanks(Job& job) {
  for (int i = 0; i < job.world_size(); ++i) {
    const RankTable::Rank& r = job.ranks.at(i);
    if (r.worker_id.empty()) continue;
    job.attempts.Fence(r.worker_id, r.attempt);
    if (observer_) observer_->AddWorkers(r.state, -1);  // it leaves the job's table
  }
  job.ranks.Reset(job.attempts.resume_step() + 1);
  job.arrivals.NewAttempt();
  // Waiters and latch streams of the old attempt look again and are refused (fenced).
  Touch(job);
}

}  // namespace latchkey
