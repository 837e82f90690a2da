// Coordinator: restoring every job on load. Rebuilds every job's components from the store, gives
// every worker a fresh liveness deadline, and finishes what a crash may have interrupted between
// two writes (a job whose last rank joined but that never started, a recovery whose ranks all
// joined). Only the workers of a job's current attempt hold ranks; those of earlier attempts
// stay fenced. A rank's progress in an attempt after the first is not stored (a re-run's
// reports are duplicates): it restarts at the attempt's first window and moves on with the
// next report. The last windows' boundary arrival lag is rebuilt from the stored (first) step
// reports.
#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/coordinator.h"
#include "server/coordinator_internal.h"

namespace latchkey {

absl::Status Coordinator::Load() {
  LK_ASSIGN_OR_RETURN(std::vector<JobRecord> records, store_->LoadJobs());
  LK_ASSIGN_OR_RETURN(std::vector<WorkerRecord> workers, store_->LoadWorkers());
  LK_ASSIGN_OR_RETURN(std::vector<RankProgress> progress, store_->LoadProgress());
  const absl::Time now = clock_->Now();

  std::vector<std::pair<Job*, std::string>> unparsable;
  for (JobRecord& rec : records) {
    JobSpec spec;
    std::string invalid;
    if (auto parsed = ParseJobSpec(rec.spec_json, rec.base_dir); parsed.ok()) {
      spec = *std::move(parsed);
    } else {
      // A spec this build no longer accepts: the job cannot run on; keep it, failed.
      invalid = absl::StrCat("stored spec no longer valid: ", parsed.status().message());
      spec.world_size = 1;
      spec.tp = 1;
    }
    const AttemptLayout layout = SpecLayout(spec);
    last_seq_ = std::max(last_seq_, rec.seq);
    if (observer_) observer_->AddJobs(rec.state, 1);
    LK_ASSIGN_OR_RETURN(std::vector<AttemptRecord> attempts, store_->LoadAttempts(rec.job_id));
    auto job = std::make_unique<Job>(std::move(rec), std::move(spec), layout, options_.recent_steps,
                                     attempts);
    if (!invalid.empty()) unparsable.emplace_back(job.get(), std::move(invalid));
    std::string id = job->rec.job_id;
    jobs_.emplace(std::move(id), std::move(job));
  }
  for (auto& [id, job] : jobs_) {
    if (job->attempts.attempt() > 1) job->ranks.Reset(job->attempts.resume_step() + 1);
    // A recovery interrupted by the restart: its ranks get a fresh rejoin deadline.
    if (job->rec.state == JobState::kRecovering) job->attempts.set_recovery_start(now);
    if (observer_ && !IsTerminal(job->rec.state) && !job->rec.stalled.empty()) {
      observer_->AddStalledRanks(static_cast<int>(job->rec.stalled.size()));
    }
  }
  for (const WorkerRecord& w : workers) {
    auto it = jobs_.find(w.job_id);
    if (it == jobs_.end() || !it->second->ranks.grid().contains(w.rank)) continue;
    Job& job = *it->second;
    if (w.attempt != job.attempts.attempt()) {
      job.attempts.Fence(w.worker_id, w.attempt);
      continue;
    }
    job.ranks.Place(w, now);
    if (w.state == WorkerState::kDone) job.ranks.SetProgress(w.rank, job.spec.steps - 1);
    if (observer_) observer_->AddWorkers(w.state, 1);
  }
  // Completed steps (as stored) per job; each rank's progress in a first attempt.
  std::map<std::string, std::vector<int64_t>> stored;  // job -> highest step + 1 per rank
  for (const RankProgress& p : progress) {
    auto it = jobs_.find(p.job_id);
    if (it == jobs_.end() || !it->second->ranks.grid().contains(p.rank)) continue;
    Job& job = *it->second;
    auto& per_rank = stored[p.job_id];
    per_rank.resize(static_cast<size_t>(job.world_size()), 0);
    per_rank[static_cast<size_t>(p.rank)] = p.max_step + 1;
    if (job.attempts.attempt() == 1) job.ranks.SetProgress(p.rank, p.max_step);
  }
  for (auto& [id, per_rank] : stored) {
    Job& job = *jobs_[id];
    if (!job.ranks.all_joined() && job.attempts.attempt() == 1) continue;
    job.steps_completed = *std::min_element(per_rank.begin(), per_rank.end());
  }
  for (auto& [job, reason] : unparsable) {
    if (!IsTerminal(job->rec.state)) {
      LK_RETURN_IF_ERROR(EndJob(*job, JobState::kFailed, reason, WorkerState::kDone));
    }
  }
  for (auto& [id, job] : jobs_) {
    // Summaries of the steps not every rank has finished, and of the last completed one; the
    // boundary arrivals of the last windows.
    job->steps_completed = std::max(job->steps_completed, job->ranks.StepsCompleted());
    const int64_t summaries_from = std::max<int64_t>(0, job->steps_completed - 1);
    const int64_t arrivals_from = std::max<int64_t>(
        0, job->steps_completed - static_cast<int64_t>(BoundaryArrivals::kSlowestKept));
    LK_ASSIGN_OR_RETURN(std::vector<StepReportRecord> reports,
                        store_->LoadStepReports(id, arrivals_from));
    for (const StepReportRecord& r : reports) {
      if (r.report.step >= summaries_from) job->steps.Add(r);
    }
    // The ranks that reported a window of a live first attempt before the restart will not
    // report it again: its partial waits stay.
    job->arrivals.Restore(reports, job->world_size(),
                          job->attempts.attempt() == 1 && !IsTerminal(job->rec.state));
    if (IsTerminal(job->rec.state)) continue;
    LK_RETURN_IF_ERROR(job->latches.Restore(*store_));
    if (job->latches.next_window() > 0) {  // the split a change of it is audited against
      LK_ASSIGN_OR_RETURN(std::vector<PublishedLatch> newest,
                          job->latches.Read(*store_, job->latches.next_window() - 1, 1));
      job->last_split = newest.front().latch.replica_micro_batches;
    }
    if ((job->rec.state == JobState::kPending || job->rec.state == JobState::kRecovering ||
         job->rec.state == JobState::kPreempted) &&
        job->ranks.all_joined()) {
      LK_RETURN_IF_ERROR(StartJob(*job));
    }
    LK_RETURN_IF_ERROR(Advance(*job));
  }
  return absl::OkStatus();
}

}  // namespace latchkey
