// Coordinator: the progress a rank reports. Step reports (stored once per (rank, step); a re-run
// after a recovery is a duplicate checked bitwise against the first report, the determinism
// check), each report's boundary wait (BoundaryArrivals), and committed checkpoints, the resume
// points of later attempts.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "server/coordinator.h"
#include "server/coordinator_internal.h"

namespace latchkey {
namespace {

bool SameBits(double a, double b) { return std::memcmp(&a, &b, sizeof(double)) == 0; }

// A measure as stored: a NaN reads back as a NaN, whatever its bits were.
bool SameMeasure(double a, double b) { return (std::isnan(a) && std::isnan(b)) || SameBits(a, b); }

std::string Named(const char* rpc, int64_t step) { return absl::StrCat(rpc, " of step ", step); }

}  // namespace

absl::Status Coordinator::RefuseReport(Job& j, const WorkerCall& call, const std::string& what,
                                       absl::Status why) {
  if (j.refusals_attempt != j.attempts.attempt()) {
    j.refusals_attempt = j.attempts.attempt();
    j.refusals_recorded = 0;
  }
  if (j.refusals_recorded >= kMaxRefusalEvents) return why;
  ++j.refusals_recorded;
  std::string message =
      absl::StrCat(what, " from worker ", call.worker_id, " as rank ", call.rank, " refused (",
                   absl::StatusCodeToString(why.code()), "): ", why.message());
  if (j.refusals_recorded == kMaxRefusalEvents) {
    absl::StrAppend(&message, "; the later refusals of attempt ", j.attempts.attempt(),
                    " are not recorded");
  }
  RecordEvent(j, "refused_report", message);
  return why;
}

absl::StatusOr<Coordinator::Job*> Coordinator::FindReporter(const WorkerCall& call,
                                                            const std::string& what) {
  // The token and the attempt fence first: a caller without the token is no worker of the job
  // (nothing is recorded), and a fenced one is a survivor of an earlier attempt, not a liar.
  LK_ASSIGN_OR_RETURN(Job * j, FindForWorker(call, /*check_rank=*/false));
  absl::Status held = j->ranks.CheckHolder(call.job_id, call.rank, call.worker_id);
  if (!held.ok()) return RefuseReport(*j, call, what, std::move(held));
  return j;
}

absl::StatusOr<WorkerStatus> Coordinator::ReportStep(const WorkerCall& call,
                                                     StepReportRecord record) {
  absl::Mutex mu;
  std::optional<absl::StatusOr<WorkerStatus>> result;
  ReportStep(call, std::move(record), [&](absl::StatusOr<WorkerStatus> r) {
    absl::MutexLock lock(&mu);
    result = std::move(r);
  });
  absl::MutexLock lock(&mu);
  mu.Await(absl::Condition(
      +[](std::optional<absl::StatusOr<WorkerStatus>>* r) { return r->has_value(); }, &result));
  return *std::move(result);
}

void Coordinator::ReportStep(const WorkerCall& call, StepReportRecord record,
                             std::function<void(absl::StatusOr<WorkerStatus>)> done) {
  uint64_t ticket = 0;
  absl::StatusOr<WorkerStatus> out = StageReport(call, std::move(record), &ticket);
  if (!out.ok()) return done(out.status());
  WhenDurable(ticket, [out = *std::move(out), done = std::move(done)](absl::Status s) {
    if (!s.ok()) return done(s);
    done(out);
  });
}

void Coordinator::WhenDurable(uint64_t ticket, std::function<void(absl::Status)> done) {
  absl::Status now = absl::OkStatus();
  {
    absl::MutexLock lock(&mu_);
    if (ticket > durable_ && committer_stop_) {
      now = Unavailable();
    } else if (ticket > durable_) {
      durable_waiters_.emplace_back(ticket, std::move(done));
      if (durable_waiters_.size() == 1) commit_cv_.Signal();
      return;
    }
  }
  done(now);
}

void Coordinator::CommitterLoop() {
  absl::MutexLock lock(&mu_);
  // A streak of failed commits: logged when it begins and when it ends.
  int failures = 0;
  absl::Time failing_since;
  absl::Duration backoff = kCommitRetryFirst;
  while (true) {
    while (durable_waiters_.empty() && !committer_stop_) commit_cv_.Wait(&mu_);
    if (!committer_stop_ && failures == 0) {
      // The reports that arrive meanwhile share the commit.
      mu_.Unlock();
      absl::SleepFor(kGroupCommitWindow);
      mu_.Lock();
    }
    const uint64_t staged = staged_;  // every report staged so far is in this commit
    // A store that orders its own writers commits with the lock released: the RPCs (heartbeats,
    // latch streams, reports staging the next group) go on meanwhile.
    const bool beside = store_->CommitsBesideOtherCalls();
    const absl::Time begin = absl::Now();
    if (beside) mu_.Unlock();
    absl::Status s = store_->CommitGroup();
    if (beside) mu_.Lock();
    if (observer_) {
      observer_->GroupCommitted(absl::ToDoubleSeconds(absl::Now() - begin), !beside);
    }
    if (s.ok()) {
      durable_ = staged;
      if (failures > 0) {
        Log(absl::StrCat("group commit of step reports succeeded again after ", failures,
                         " failed attempts over ",
                         absl::FormatDuration(absl::Now() - failing_since),
                         "; the waiting reports are acknowledged"));
        failures = 0;
        backoff = kCommitRetryFirst;
      }
    } else if (s.code() != absl::StatusCode::kDataLoss && store_->HasStaged()) {
      // Nothing is lost: the reports stay staged and their calls wait for a commit that works.
      if (failures++ == 0) {
        failing_since = absl::Now();
        Log(absl::StrCat("group commit of step reports failed: ", s.message(), "; ",
                         durable_waiters_.size(), " reports wait unacknowledged, retrying every ",
                         absl::FormatDuration(kCommitRetryFirst), " to ",
                         absl::FormatDuration(kCommitRetryMax)));
      }
      if (!committer_stop_) {
        // Only a stop cuts the wait short: new reports join the waiting group.
        const absl::Time retry = absl::Now() + backoff;
        while (!committer_stop_ && absl::Now() < retry) commit_cv_.WaitWithDeadline(&mu_, retry);
        backoff = std::min(backoff * 2, kCommitRetryMax);
        continue;
      }
      // Stopping: the calls end with the error; the store's own close tries once more.
    } else {
      // The staged reports are gone (DATA_LOSS; or the store closed its group on a failed
      // commit): the progress already counted for them is not in the store.
      if (s.code() != absl::StatusCode::kDataLoss) {
        s = absl::DataLossError(
            absl::StrCat("group commit of step reports failed and the store kept nothing staged: ",
                         s.message()));
      }
      TerminateOnLostReports(s);
    }
    // A success answers the reports this commit covered; those staged while it ran (the lock
    // released) wait for the next one, which follows at once. A failure for good (DATA_LOSS, or
    // a failed commit while stopping) answers every waiting report with it.
    std::vector<std::pair<uint64_t, std::function<void(absl::Status)>>> ready;
    if (s.ok()) {
      auto later = std::stable_partition(durable_waiters_.begin(), durable_waiters_.end(),
                                         [&](const auto& w) { return w.first <= durable_; });
      ready.assign(std::make_move_iterator(durable_waiters_.begin()),
                   std::make_move_iterator(later));
      durable_waiters_.erase(durable_waiters_.begin(), later);
    } else {
      ready.swap(durable_waiters_);
    }
    const bool stop = committer_stop_;
    mu_.Unlock();
    for (auto& [ticket, fn] : ready) fn(s);
    mu_.Lock();
    if (stop && durable_waiters_.empty()) return;
  }
}

void Coordinator::TerminateOnLostReports(const absl::Status& why) {
  const std::string line = absl::StrCat(
      "fatal: acknowledged progress is not in the store, the coordinator stops serving (a "
      "restart reloads the store; workers send their unacknowledged reports again): ",
      why.ToString());
  Log(line);
  if (options_.on_fatal) return options_.on_fatal(why);
  std::fprintf(stderr, "latchkey-coordinator: %s\n", line.c_str());
  std::abort();
}

absl::StatusOr<WorkerStatus> Coordinator::StageReport(const WorkerCall& call,
                                                      StepReportRecord record, uint64_t* ticket) {
  absl::MutexLock lock(&mu_);
  const StepReport& report = record.report;
  const std::string what = Named("ReportStep", report.step);
  LK_ASSIGN_OR_RETURN(Job * found, FindReporter(call, what));
  Job& j = *found;
  RankTable::Rank& rank = j.ranks.at(call.rank);
  rank.last_seen = clock_->Now();
  WorkerStatus out;
  out.state = j.rec.state;
  out.reason = j.rec.failure_reason;
  out.attempt = j.attempts.attempt();
  if (report.step < 0 || report.step >= j.spec.steps) {
    return RefuseReport(j, call, what,
                        absl::InvalidArgumentError(absl::StrCat(
                            "step: ", report.step, " is outside [0, ", j.spec.steps, ")")));
  }
  if (report.collective_calls.size() > static_cast<size_t>(kMaxCollectiveKeys)) {
    return RefuseReport(j, call, what,
                        absl::InvalidArgumentError(
                            absl::StrCat("collective_calls: ", report.collective_calls.size(),
                                         " keys, more than ", kMaxCollectiveKeys)));
  }
  for (const auto& [key, calls] : report.collective_calls) {
    if (key.size() > kMaxCollectiveKeyBytes) {
      return RefuseReport(
          j, call, what,
          absl::InvalidArgumentError(absl::StrCat("collective_calls: a key of ", key.size(),
                                                  " bytes, longer than ", kMaxCollectiveKeyBytes)));
    }
  }
  if (j.rec.state == JobState::kSucceeded) {  // every report is in already
    out.duplicate = true;
    return out;
  }
  if (j.rec.state != JobState::kRunning) {
    return absl::FailedPreconditionError(
        absl::StrCat(j.rec.job_id, ": job is ", JobStateName(j.rec.state)));
  }
  if (report.step >= j.latches.next_window()) {
    return RefuseReport(j, call, what,
                        absl::FailedPreconditionError(
                            absl::StrCat("step: latch(", report.step, ") is not published yet")));
  }
  LK_ASSIGN_OR_RETURN(std::vector<PublishedLatch> latch, j.latches.Read(*store_, report.step, 1));
  const int64_t generation = latch.front().latch.generation;
  if (report.latch_generation != generation) {
    return RefuseReport(
        j, call, what,
        absl::AbortedError(absl::StrCat(
            "latch_generation: step ", report.step, " ran under generation ",
            report.latch_generation, " but latch(", report.step, ") has generation ", generation)));
  }
  record.job_id = j.rec.job_id;
  record.rank = call.rank;
  record.report_time = clock_->Now();
  LK_ASSIGN_OR_RETURN(bool inserted, store_->StageStepReport(record));
  if (!inserted && report.step < rank.steps_reported) {
    LK_ASSIGN_OR_RETURN(std::string conflict, RetryConflict(j, record));
    if (!conflict.empty()) return RefuseReport(j, call, what, absl::AbortedError(conflict));
  }
  // Durable with the group's commit; nothing staged: everything is durable already (a repeat
  // included: what it repeats was committed).
  *ticket = store_->HasStaged() ? ++staged_ : 0;
  if (inserted) {
    j.steps.Add(record);
  } else {
    // A re-run of a stored step (or a retry): the first report stays; the rank moves on. A step
    // this rank has not reported in this attempt yet was stored by an earlier one: a re-run.
    out.duplicate = true;
    if (report.step >= rank.steps_reported) LK_RETURN_IF_ERROR(CheckDeterminism(j, record));
  }
  if (report.step >= rank.steps_reported) {  // not a retry
    const std::optional<WindowArrival> arrival =
        j.arrivals.Note(report.step, call.rank, report.boundary_wait_seconds, j.world_size());
    if (arrival && observer_) observer_->BoundaryArrivalLag(arrival->lag_seconds);
    NoteSpeed(j, call.rank, report);
  }
  j.ranks.SetStepsReported(call.rank, std::max(rank.steps_reported, report.step + 1));
  LK_RETURN_IF_ERROR(Advance(j));
  if (rank.steps_reported >= j.spec.steps) {
    LK_RETURN_IF_ERROR(SetWorkerState(j, call.rank, WorkerState::kDone));
  }
  out.state = j.rec.state;
  return out;
}

absl::StatusOr<std::string> Coordinator::RetryConflict(const Job& job,
                                                       const StepReportRecord& record) {
  const StepReport& r = record.report;
  LK_ASSIGN_OR_RETURN(StepReportRecord stored,
                      store_->LoadStepReport(job.rec.job_id, record.rank, r.step));
  const StepReport& s = stored.report;
  // What a worker sends again after a lost answer is the report it sent: the same numbers.
  if (SameMeasure(s.loss, r.loss) && SameMeasure(s.grad_norm, r.grad_norm) &&
      s.micro_batches == r.micro_batches && s.tokens == r.tokens) {
    return std::string();
  }
  return absl::StrFormat(
      "step %d was reported by rank %d in attempt %d with loss %.17g, grad_norm %.17g, "
      "micro_batches %d, tokens %d; this report has loss %.17g, grad_norm %.17g, "
      "micro_batches %d, tokens %d (the first report is kept)",
      r.step, record.rank, job.attempts.attempt(), s.loss, s.grad_norm, s.micro_batches, s.tokens,
      r.loss, r.grad_norm, r.micro_batches, r.tokens);
}

absl::Status Coordinator::CheckDeterminism(Job& job, const StepReportRecord& record) {
  const StepReport& r = record.report;
  if (job.attempts.ViolationCounted(r.step)) return absl::OkStatus();
  LK_ASSIGN_OR_RETURN(StepReportRecord first,
                      store_->LoadStepReport(job.rec.job_id, record.rank, r.step));
  // Only a re-run of the same latch is compared: a new layout re-decides its windows under a
  // new generation, and sums in another order (the determinism holds within a layout).
  if (first.report.latch_generation != r.latch_generation) return absl::OkStatus();
  if (SameBits(first.report.loss, r.loss)) return absl::OkStatus();
  JobRecord next = job.rec;
  next.determinism_violations++;
  next.update_time = clock_->Now();
  const std::string message = absl::StrFormat(
      "step %d re-run by rank %d in attempt %d: loss %.17g differs from the first report's "
      "%.17g (kept)",
      r.step, record.rank, job.attempts.attempt(), r.loss, first.report.loss);
  LK_RETURN_IF_ERROR(
      store_->UpdateJobWithEvent(next, Event(job, "determinism_violation", message)));
  job.rec = std::move(next);
  job.attempts.CountViolation(r.step);
  Log(absl::StrCat(job.rec.job_id, ": ", message));
  Touch(job);
  return absl::OkStatus();
}

absl::StatusOr<WorkerStatus> Coordinator::ReportCheckpoint(const WorkerCall& call,
                                                           const CheckpointReport& report) {
  if (report.manifest_sha256.empty())
    return absl::InvalidArgumentError("manifest_sha256: required");
  if (report.bytes < 0) return absl::InvalidArgumentError("bytes: must be >= 0");
  absl::MutexLock lock(&mu_);
  const std::string what = Named("ReportCheckpoint", report.step);
  LK_ASSIGN_OR_RETURN(Job * found, FindReporter(call, what));
  Job& j = *found;
  j.ranks.at(call.rank).last_seen = clock_->Now();
  if (report.step < 0 || report.step >= j.spec.steps) {
    return RefuseReport(j, call, what,
                        absl::InvalidArgumentError(absl::StrCat(
                            "step: ", report.step, " is outside [0, ", j.spec.steps, ")")));
  }
  if (report.manifest_sha256.size() > kMaxManifestShaBytes) {
    return RefuseReport(
        j, call, what,
        absl::InvalidArgumentError(absl::StrCat("manifest_sha256: ", report.manifest_sha256.size(),
                                                " bytes, longer than ", kMaxManifestShaBytes)));
  }
  if (j.rec.state == JobState::kPending || j.rec.state == JobState::kFailed ||
      j.rec.state == JobState::kCancelled) {
    return absl::FailedPreconditionError(
        absl::StrCat(j.rec.job_id, ": job is ", JobStateName(j.rec.state)));
  }
  // A checkpoint holds the state after its step: the step ran, so its latch was published.
  if (report.step >= j.latches.next_window()) {
    return RefuseReport(
        j, call, what,
        absl::FailedPreconditionError(absl::StrCat(
            "step: latch(", report.step, ") is not published yet, so no rank has run that step")));
  }
  WorkerStatus out{j.rec.state, j.rec.failure_reason, false, j.attempts.attempt(), {}};
  LK_ASSIGN_OR_RETURN(std::vector<CheckpointRecord> known, store_->LoadCheckpoints(j.rec.job_id));
  for (const CheckpointRecord& k : known) {
    if (k.step != report.step) continue;
    if (k.manifest_sha256 == report.manifest_sha256) {
      out.duplicate = true;  // a repeat: already recorded
      // A stop whose step was saved already (the attempt's resume point, or a save of the
      // cadence) ends with this report.
      LK_RETURN_IF_ERROR(MaybeFinishStop(j, report.step));
      out.state = j.rec.state;
      out.attempt = j.attempts.attempt();
      return out;
    }
    // A rank that re-ran the step saved it again, and the folder on disk now holds that save:
    // its checkpoint replaces the earlier one, in a later attempt or in the same one (a worker
    // that re-joins its attempt after a coordinator restart runs it again from its resume
    // point). The audit keeps both reports.
  }
  CheckpointRecord c;
  c.job_id = j.rec.job_id;
  c.step = report.step;
  c.manifest_sha256 = report.manifest_sha256;
  c.bytes = report.bytes;
  c.attempt = j.attempts.attempt();
  c.report_time = clock_->Now();
  JobRecord next = j.rec;
  if (report.step >= next.last_checkpoint_step) {
    next.last_checkpoint_step = report.step;
    next.last_checkpoint_sha256 = report.manifest_sha256;
  }
  next.update_time = c.report_time;
  const std::string message =
      absl::StrCat("checkpoint after step ", report.step, " committed by rank ", call.rank, " (",
                   report.bytes, " bytes, manifest sha256 ", report.manifest_sha256, ")");
  LK_RETURN_IF_ERROR(store_->PutCheckpoint(c, next, Event(j, "checkpoint", message)));
  j.rec = std::move(next);
  Log(absl::StrCat(j.rec.job_id, ": ", message));
  Touch(j);
  // A stop saved its step: the job stops here (coordinator_stop.cc). Else a shrunk elastic job
  // grows back here, resuming from this checkpoint.
  if (j.stop && report.step == j.stop->before_window - 1) {
    LK_RETURN_IF_ERROR(MaybeFinishStop(j, report.step));
    out.state = j.rec.state;
    out.attempt = j.attempts.attempt();
  } else if (j.rec.last_checkpoint_step == report.step) {
    LK_RETURN_IF_ERROR(MaybeGrow(j));
    out.attempt = j.attempts.attempt();
  }
  return out;
}

}  // namespace latchkey
