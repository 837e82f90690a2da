// Coordinator: attempts (docs/fault-tolerance.md). Recovery after a failure, the attempt fence's
// bookkeeping, the hang and liveness verdicts, boundary arrival lag, determinism checks of re-run
// steps and checkpoint reports.
#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/crash_point.h"
#include "common/status_macros.h"
#include "server/coordinator.h"
#include "server/coordinator_internal.h"
#include "server/hang_detector.h"
#include "server/job_state_machine.h"

namespace latchkey {
namespace {

bool SameBits(double a, double b) { return std::memcmp(&a, &b, sizeof(double)) == 0; }

// One window's arrival from every rank's boundary wait: the rank that waited least arrived last
// (the lowest rank among equals); the lag is max - min.
WindowArrival Spread(int64_t window, const std::map<int, double>& waits) {
  int slowest = waits.begin()->first;
  double lo = waits.begin()->second;
  double hi = lo;
  for (const auto& [r, w] : waits) {
    if (w < lo) {
      lo = w;
      slowest = r;
    }
    hi = std::max(hi, w);
  }
  return WindowArrival{window, slowest, hi - lo};
}

}  // namespace

JobEventRecord Coordinator::Event(const Job& job, const std::string& kind,
                                  const std::string& message) const {
  JobEventRecord e;
  e.job_id = job.rec.job_id;
  e.time = clock_->Now();
  e.attempt = job.rec.attempt;
  e.kind = kind;
  e.message = message;
  return e;
}

absl::Status Coordinator::FailOrRecover(Job& job, int rank, WorkerState worker_state,
                                        const std::string& cause) {
  if (rank >= 0) LK_RETURN_IF_ERROR(SetWorkerState(job, rank, worker_state));
  const bool live = job.rec.state == JobState::kRunning || job.rec.state == JobState::kRecovering;
  if (live && job.rec.restarts < job.spec.max_restarts) return BeginAttempt(job, cause);
  std::string reason = cause;
  if (job.rec.restarts > 0) {
    absl::StrAppend(&reason, " (after ", job.rec.restarts,
                    job.rec.restarts == 1 ? " restart)" : " restarts)");
  }
  return EndJob(job, JobState::kFailed, reason, WorkerState::kDone);
}

absl::Status Coordinator::BeginAttempt(Job& job, const std::string& cause) {
  JobRecord next = job.rec;
  next.attempt++;
  next.restarts++;
  next.resume_step = job.rec.last_checkpoint_step;
  next.resume_manifest_sha256 = job.rec.last_checkpoint_sha256;
  next.last_recovery_reason = cause;
  JobEventRecord event = Event(job, "recovery", "");
  event.attempt = next.attempt;
  event.message = absl::StrCat(
      "attempt ", next.attempt, " (restart ", next.restarts, " of ", job.spec.max_restarts,
      ") resumes ",
      next.resume_step >= 0 ? absl::StrCat("from the checkpoint after step ", next.resume_step)
                            : std::string("from the start"),
      ": ", cause);
  absl::Status s = machine_->Recover(job.rec, std::move(next), event);
  Touch(job);
  LK_RETURN_IF_ERROR(s);
  MaybeCrash("recovery.after_attempt");
  if (observer_) observer_->JobRestarted();
  Log(absl::StrCat(job.rec.job_id, ": ", event.message));
  ResetRanks(job);
  job.recovery_start = clock_->Now();
  return absl::OkStatus();
}

void Coordinator::ResetRanks(Job& job) {
  for (int i = 0; i < job.world_size(); ++i) {
    const RankTable::Rank& r = job.ranks.at(i);
    if (r.worker_id.empty()) continue;
    job.fenced[r.worker_id] = r.attempt;
    if (observer_) observer_->AddWorkers(r.state, -1);  // it leaves the job's table
  }
  job.ranks.Reset(job.rec.resume_step + 1);
  job.violated_steps.clear();
  job.arrivals.clear();
  // Waiters and latch streams of the old attempt look again and are refused (fenced).
  Touch(job);
}

void Coordinator::LivenessVerdict(Job& job, const std::vector<int>& late, absl::Time now) {
  std::vector<std::string> names;
  for (int i : late) {
    const RankTable::Rank& r = job.ranks.at(i);
    std::string name = absl::StrCat(
        "rank ", i, " (worker ", r.worker_id, ", unseen for ",
        absl::FormatDuration(absl::Trunc(now - r.last_seen, absl::Milliseconds(100))), ")");
    if (r.position && r.position->window >= 0) {
      absl::StrAppend(&name, ", last ", DescribePosition(*r.position), ",");
    }
    names.push_back(std::move(name));
  }
  for (int i : late) {
    SetWorkerState(job, i, WorkerState::kLost).IgnoreError();  // the verdict reports store errors
  }
  const std::string cause =
      absl::StrCat(absl::StrJoin(names, ", "), " missed the liveness deadline of ",
                   absl::FormatDuration(options_.liveness_timeout));
  absl::Status s = FailOrRecover(job, -1, WorkerState::kLost, cause);
  (void)s;  // a store failure leaves the job live; the next check tries again
}

bool Coordinator::CheckRejoin(Job& job, absl::Time now) {
  if (job.rec.state != JobState::kRecovering || job.ranks.all_joined() ||
      now - job.recovery_start <= options_.liveness_timeout) {
    return false;
  }
  std::vector<int> missing;
  for (int i = 0; i < job.world_size(); ++i) {
    if (job.ranks.at(i).worker_id.empty()) missing.push_back(i);
  }
  const std::string cause =
      absl::StrCat(missing.size() == 1 ? "rank " : "ranks ", absl::StrJoin(missing, ", "),
                   " did not rejoin attempt ", job.rec.attempt, " within ",
                   absl::FormatDuration(options_.liveness_timeout));
  Log(absl::StrCat(job.rec.job_id, ": ", cause));
  absl::Status s = FailOrRecover(job, -1, WorkerState::kLost, cause);
  (void)s;  // as in LivenessVerdict
  return true;
}

bool Coordinator::CheckHang(Job& job, absl::Time now) {
  if (job.rec.state != JobState::kRunning || !job.ranks.all_joined()) return false;
  std::vector<RankWatch> watch;
  for (int i = 0; i < job.world_size(); ++i) {
    const RankTable::Rank& r = job.ranks.at(i);
    if (!r.position || !IsLive(r.state)) continue;
    if (r.position->attempt != 0 && r.position->attempt != job.rec.attempt) continue;
    watch.push_back({i, *r.position, now - r.heartbeat_time});
  }
  if (watch.empty()) return false;
  std::optional<StallVerdict> v = FindStall(watch, absl::Seconds(job.spec.hang_timeout_seconds),
                                            2 * options_.heartbeat_interval);
  if (!v) return false;
  v->stalled.attempt = job.rec.attempt;
  JobRecord next = job.rec;
  next.stalled.push_back(v->stalled);
  next.update_time = now;
  if (!store_->UpdateJobWithEvent(next, Event(job, "stalled", v->message)).ok()) return false;
  job.rec = std::move(next);
  if (observer_) observer_->AddStalledRanks(1);
  Log(absl::StrCat(job.rec.job_id, ": ", v->message));
  absl::Status s = FailOrRecover(job, v->stalled.rank, WorkerState::kLost, v->message);
  (void)s;  // as in LivenessVerdict
  return true;
}

absl::Status Coordinator::ClearStalled(Job& job) {
  if (job.rec.stalled.empty() || !job.ranks.all_joined() ||
      job.ranks.StepsCompleted() <= job.rec.resume_step + 1) {
    return absl::OkStatus();
  }
  JobRecord next = job.rec;
  auto& st = next.stalled;
  const int64_t attempt = job.rec.attempt;
  st.erase(std::remove_if(st.begin(), st.end(),
                          [attempt](const StalledRank& s) { return s.attempt < attempt; }),
           st.end());
  const int removed = static_cast<int>(job.rec.stalled.size() - st.size());
  if (removed == 0) return absl::OkStatus();
  LK_RETURN_IF_ERROR(store_->UpdateJob(next));
  job.rec = std::move(next);
  if (observer_) observer_->AddStalledRanks(-removed);
  Touch(job);
  return absl::OkStatus();
}

void Coordinator::NoteArrival(Job& job, int rank, const StepReport& report) {
  std::map<int, double>& waits = job.arrivals[report.step];
  waits[rank] = report.boundary_wait_seconds;
  if (static_cast<int>(waits.size()) < job.world_size()) return;
  const WindowArrival a = Spread(report.step, waits);
  job.arrivals.erase(report.step);
  job.slowest.push_back(a);
  while (job.slowest.size() > Job::kSlowestKept) job.slowest.pop_front();
  if (observer_) observer_->BoundaryArrivalLag(a.lag_seconds);
}

void Coordinator::RestoreArrivals(Job& job, const std::vector<StepReportRecord>& reports) {
  std::map<int64_t, std::map<int, double>> windows;
  std::set<int64_t> unknown;  // a rank's report was stored before schema v4 kept its wait
  for (const StepReportRecord& r : reports) {
    if (!r.boundary_wait_stored) unknown.insert(r.report.step);
    windows[r.report.step][r.rank] = r.report.boundary_wait_seconds;
  }
  job.slowest.clear();
  job.arrivals.clear();
  for (const auto& [window, waits] : windows) {
    if (unknown.count(window)) continue;
    if (static_cast<int>(waits.size()) == job.world_size()) {
      job.slowest.push_back(Spread(window, waits));
      while (job.slowest.size() > Job::kSlowestKept) job.slowest.pop_front();
    } else if (job.rec.attempt == 1 && !IsTerminal(job.rec.state)) {
      // The ranks that reported it before the restart will not report it again.
      job.arrivals[window] = waits;
    }
  }
}

absl::Status Coordinator::CheckDeterminism(Job& job, const StepReportRecord& record) {
  const StepReport& r = record.report;
  if (job.violated_steps.count(r.step)) return absl::OkStatus();
  LK_ASSIGN_OR_RETURN(StepReportRecord first,
                      store_->LoadStepReport(job.rec.job_id, record.rank, r.step));
  if (SameBits(first.report.loss, r.loss)) return absl::OkStatus();
  JobRecord next = job.rec;
  next.determinism_violations++;
  next.update_time = clock_->Now();
  const std::string message = absl::StrFormat(
      "step %d re-run by rank %d in attempt %d: loss %.17g differs from the first report's "
      "%.17g (kept)",
      r.step, record.rank, job.rec.attempt, r.loss, first.report.loss);
  LK_RETURN_IF_ERROR(
      store_->UpdateJobWithEvent(next, Event(job, "determinism_violation", message)));
  job.rec = std::move(next);
  job.violated_steps.insert(r.step);
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
  LK_ASSIGN_OR_RETURN(Job * found, FindForWorker(call, /*check_rank=*/true));
  Job& j = *found;
  j.ranks.at(call.rank).last_seen = clock_->Now();
  if (report.step < 0 || report.step >= j.spec.steps) {
    return absl::InvalidArgumentError(
        absl::StrCat("step: ", report.step, " is outside [0, ", j.spec.steps, ")"));
  }
  if (j.rec.state == JobState::kPending || j.rec.state == JobState::kFailed ||
      j.rec.state == JobState::kCancelled) {
    return absl::FailedPreconditionError(
        absl::StrCat(j.rec.job_id, ": job is ", JobStateName(j.rec.state)));
  }
  WorkerStatus out{j.rec.state, j.rec.failure_reason, false, j.rec.attempt};
  LK_ASSIGN_OR_RETURN(std::vector<CheckpointRecord> known, store_->LoadCheckpoints(j.rec.job_id));
  for (const CheckpointRecord& k : known) {
    if (k.step == report.step && k.manifest_sha256 == report.manifest_sha256) {
      out.duplicate = true;  // a repeat: already recorded
      return out;
    }
  }
  CheckpointRecord c;
  c.job_id = j.rec.job_id;
  c.step = report.step;
  c.manifest_sha256 = report.manifest_sha256;
  c.bytes = report.bytes;
  c.attempt = j.rec.attempt;
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
  return out;
}

}  // namespace latchkey
