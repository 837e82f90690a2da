// Coordinator: recovery decisions (docs/fault-tolerance.md). A failure of a live job starts a
// new attempt while restarts remain, else fails the job; a new attempt frees every rank and
// fences the workers of the old one. An elastic job (latchkey.elastic) whose recovery cannot
// get its ranks back shrinks to the layout its workers fill, and grows back toward the spec's
// dp when spares fill a whole replica at a checkpoint; a new layout re-forms the rank table and
// re-decides the latches from its first window. A user's resume (ResumeJob) reopens a failed or
// cancelled job into a new attempt the same way. What an attempt is, and the layout it runs, is
// the AttemptLog's (attempt_log.h).
#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/crash_point.h"
#include "common/status_macros.h"
#include "server/coordinator.h"
#include "server/coordinator_internal.h"
#include "server/job_state_machine.h"

namespace latchkey {
namespace {

std::string LayoutText(const AttemptLayout& l) {
  return absl::StrCat("world ", l.world_size, " = dp ", l.dp, " x tp ", l.tp,
                      ", gradient_accumulation_steps ", l.gradient_accumulation_steps);
}

}  // namespace

absl::Status Coordinator::FailOrRecover(Job& job, int rank, WorkerState worker_state,
                                        const std::string& cause) {
  if (rank >= 0) LK_RETURN_IF_ERROR(SetWorkerState(job, rank, worker_state));
  const bool live = job.rec.state == JobState::kRunning || job.rec.state == JobState::kRecovering ||
                    job.rec.state == JobState::kPreempted;
  // A failure while the job's ranks report a cut link between them is the partition's: the
  // recovery names the link and spends no restart; the next attempt forms once the link is back
  // (MaybeStart), or the job fails after latchkey.partition_timeout_seconds.
  if (live) {
    const absl::Time now = clock_->Now();
    if (std::optional<PartitionVerdict> cut = CurrentPartition(job, now)) {
      if (!job.partition) job.partition = Job::PartitionWait{now - absl::Seconds(cut->Longest())};
      if (observer_) observer_->UnreachablePeers(cut->pairs);
      AttemptLog::Recovery r;
      r.cause = absl::StrCat("network partition: ", cut->message, " (", cause, ")");
      r.spend_restart = false;
      return BeginAttempt(job, r);
    }
  }
  const int restarts = job.attempts.restarts();
  if (live && restarts < job.spec.max_restarts) {
    AttemptLog::Recovery r;
    r.cause = cause;
    return BeginAttempt(job, r);
  }
  std::string reason = cause;
  if (restarts > 0) {
    absl::StrAppend(&reason, " (after ", restarts, restarts == 1 ? " restart)" : " restarts)");
  }
  return EndJob(job, JobState::kFailed, reason, WorkerState::kDone);
}

absl::Status Coordinator::BeginAttempt(Job& job, AttemptLog::Recovery recovery) {
  job.stop.reset();  // a failure during a stop: recovered from as any other
  recovery.checkpoint_step = job.rec.last_checkpoint_step;
  recovery.checkpoint_sha256 = job.rec.last_checkpoint_sha256;
  LK_ASSIGN_OR_RETURN(AttemptLog::Attempt next, job.attempts.Next(recovery));
  const bool new_layout = next.layout != job.attempts.layout();
  const absl::Time now = clock_->Now();
  JobRecord rec = job.rec;
  AttemptLog::Record(next, &rec);
  // A new layout decides every window after the resume step again, under a new policy
  // generation whose accumulation steps are the layout's (the global batch kept); the data
  // position there is the checkpoint's: M and the samples consumed through the resume step.
  PolicyChangeRecord change;
  int64_t first_sample = 0;
  if (new_layout) {
    const int64_t first_window = next.resume_step + 1;
    int64_t m = 0;
    if (next.resume_step >= 0) {
      LK_ASSIGN_OR_RETURN(std::vector<PublishedLatch> at,
                          job.latches.Read(*store_, next.resume_step, 1));
      const Latch& l = at.front().latch;
      m = l.first_micro_batch + l.n;
      first_sample = l.first_sample + static_cast<int64_t>(l.n) *
                                          job.attempts.layout(at.front().layout_attempt).dp *
                                          job.spec.micro_batch_size;
    }
    change.job_id = job.rec.job_id;
    change.policy = job.rec.policy;
    change.policy.gradient_accumulation_steps = next.layout.gradient_accumulation_steps;
    change.policy.no_sync.clear();  // a mask of the old window length means nothing now
    change.policy.generation++;
    change.first_window = first_window;
    change.change_time = now;
    rec.policy = change.policy;
    rec.next_window = first_window;
    rec.next_first_micro_batch = m;
    rec.next_first_sample = first_sample;
  }
  JobEventRecord event = Event(job,
                               recovery.resume ? "resumed"
                               : new_layout    ? "layout"
                                               : "recovery",
                               "");
  event.attempt = next.number;
  std::string spent;
  if (recovery.resume) {
    spent = absl::StrCat(" (resumed after ", JobStateName(job.rec.state),
                         "; no restart spent, max_restarts ", job.spec.max_restarts,
                         " counts from here)");
  } else if (recovery.spend_restart) {
    spent = absl::StrCat(" (restart ", next.restarts, " of ", job.spec.max_restarts, ")");
  } else {
    spent = " (no restart spent)";
  }
  event.message = absl::StrCat(
      "attempt ", next.number, spent, " resumes ",
      next.resume_step >= 0 ? absl::StrCat("from the checkpoint after step ", next.resume_step)
                            : std::string("from the start"),
      new_layout ? absl::StrCat(" in a new layout (", LayoutText(next.layout), "; was ",
                                LayoutText(job.attempts.layout()), "), windows from ",
                                next.resume_step + 1, " re-decided under policy generation ",
                                change.policy.generation)
                 : std::string(),
      ": ", recovery.cause);
  const AttemptRecord record = AttemptLog::ToRecord(job.rec.job_id, next, now);
  // Persisted (with its event, and a new layout's policy and latch position) before anything
  // of the new attempt shows.
  absl::Status s =
      machine_->Recover(job.rec, std::move(rec), event, record, new_layout ? &change : nullptr);
  Touch(job);
  LK_RETURN_IF_ERROR(s);
  MaybeCrash("recovery.after_attempt");
  if (observer_) observer_->JobRestarted();
  Log(absl::StrCat(job.rec.job_id, ": ", event.message));
  const AttemptLayout layout = next.layout;
  const int64_t layout_attempt = next.layout_attempt;
  job.attempts.Begin(std::move(next), now);
  ResetRanks(job);
  if (new_layout) {
    job.ranks = RankTable(layout.grid());  // every rank free already (ResetRanks)
    job.ranks.Reset(job.attempts.resume_step() + 1);
    job.steps = StepAggregator(layout.world_size, job.recent_steps_kept);
    job.stragglers.NewAttempt(layout.grid());
    job.latches.SetLayout(layout_attempt, layout.dp);
    job.latches.Rewind(job.rec.next_window, job.rec.next_first_micro_batch, first_sample);
  }
  return absl::OkStatus();
}

absl::StatusOr<JobView> Coordinator::ResumeJob(const std::string& job_id,
                                               const std::string& reason) {
  absl::MutexLock lock(&mu_);
  LK_ASSIGN_OR_RETURN(Job * found, FindJob(job_id));
  Job& job = *found;
  const JobState state = job.rec.state;
  if (state != JobState::kFailed && state != JobState::kCancelled &&
      state != JobState::kSuspended) {
    return absl::FailedPreconditionError(
        absl::StrCat(job_id, ": is ", JobStateName(state),
                     "; only a failed, cancelled or suspended job can be resumed"));
  }
  // A job failed on load because this build no longer accepts its spec would only fail again.
  if (auto parsed = ParseJobSpec(job.rec.spec_json, job.rec.base_dir); !parsed.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(job_id, ": its stored spec is no longer valid: ", parsed.status().message()));
  }
  // Ended jobs give up their rendezvous port (PickRendezvousPort): another job may hold it now,
  // and two jobs' rank 0 cannot serve one store.
  for (const auto& [id, other] : jobs_) {
    if (id != job_id && !IsTerminal(other->rec.state) &&
        other->rec.rendezvous_port == job.rec.rendezvous_port) {
      return absl::FailedPreconditionError(
          absl::StrCat(job_id, ": its rendezvous port ", job.rec.rendezvous_port,
                       " is held by live job ", id, "; resume it once that job ended"));
    }
  }
  // An ended job dropped its latch cache (EndJob) and one loaded ended never read it: the new
  // attempt serves the published latches from memory again.
  LK_RETURN_IF_ERROR(job.latches.Restore(*store_));
  AttemptLog::Recovery r;
  r.cause = reason.empty() ? "resumed by user" : reason;
  r.spend_restart = false;
  r.resume = true;
  // The checkpoints are layout-independent: an elastic job asks for the spec's layout again,
  // and shrinks (MaybeShrink) if fewer workers come back.
  if (job.attempts.elastic()) r.workers = job.attempts.spec_layout().world_size;
  const int stalled = static_cast<int>(job.rec.stalled.size());
  LK_RETURN_IF_ERROR(BeginAttempt(job, r));
  job.resume_awaits_first_join = true;
  // EndJob stopped counting the stall verdicts; they are a live job's again until a step of
  // the new attempt clears them.
  if (observer_ && stalled > 0) observer_->AddStalledRanks(stalled);
  return View(job, true);
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
  job.stragglers.NewAttempt(job.ranks.grid());
  // Waiters and latch streams of the old attempt look again and are refused (fenced).
  Touch(job);
}

int Coordinator::LiveSpares(Job& job, absl::Time now) {
  for (auto it = job.spares.begin(); it != job.spares.end();) {
    // A spare polls Join; one that stopped polling is gone.
    if (now - it->second.last_seen > options_.liveness_timeout) {
      Log(absl::StrCat(job.rec.job_id, ": spare ", it->first, " unseen, dropped"));
      it = job.spares.erase(it);
    } else {
      ++it;
    }
  }
  return static_cast<int>(job.spares.size());
}

bool Coordinator::MaybeShrink(Job& job, const std::string& cause, absl::Time now) {
  if (!job.attempts.elastic()) return false;
  const int workers = job.ranks.joined() + LiveSpares(job, now);
  const int dp = job.attempts.ElasticDpFor(workers);
  if (dp == 0 || dp >= job.attempts.layout().dp) return false;
  AttemptLog::Recovery r;
  r.cause = absl::StrCat(cause, "; shrinking to dp ", dp, " with the ", workers,
                         workers == 1 ? " worker" : " workers", " at hand");
  r.workers = workers;
  r.spend_restart = false;  // it completes the recovery that began the attempt
  return BeginAttempt(job, r).ok();
}

absl::Status Coordinator::MaybeGrow(Job& job) {
  if (!job.attempts.elastic() || job.rec.state != JobState::kRunning) return absl::OkStatus();
  const AttemptLayout& cur = job.attempts.layout();
  if (cur.dp >= job.attempts.spec_layout().dp) return absl::OkStatus();
  // A checkpoint after the last step leaves nothing to train: the job ends as it is.
  if (job.rec.last_checkpoint_step >= job.spec.steps - 1) return absl::OkStatus();
  const int spares = LiveSpares(job, clock_->Now());
  if (spares < cur.tp) return absl::OkStatus();  // no whole replica yet
  const int workers = cur.world_size + spares;
  const int dp = job.attempts.ElasticDpFor(workers);
  if (dp <= cur.dp) return absl::OkStatus();
  AttemptLog::Recovery r;
  r.cause = absl::StrCat(spares, spares == 1 ? " spare" : " spares", " fill ", dp - cur.dp,
                         dp - cur.dp == 1 ? " DP replica" : " DP replicas", "; growing to dp ", dp,
                         " at the checkpoint after step ", job.rec.last_checkpoint_step);
  r.workers = workers;
  r.spend_restart = false;
  return BeginAttempt(job, r);
}

}  // namespace latchkey
