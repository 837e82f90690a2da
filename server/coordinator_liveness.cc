// Coordinator: liveness and hang verdicts. The checker thread, and the three verdicts it gives
// on a live job: a worker past its liveness deadline, a rank that did not rejoin a recovery in
// time, a running job the hang detector (hang_detector.h) finds stalled. Each verdict is a
// failure for FailOrRecover (coordinator_attempts.cc). Stall verdicts stay listed on the job
// until the attempt they caused completed a step.
#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "server/coordinator.h"
#include "server/coordinator_internal.h"
#include "server/hang_detector.h"

namespace latchkey {

void Coordinator::StartLivenessChecker() {
  if (liveness_thread_.joinable()) return;
  // The period is real time: it paces the checks; the verdict reads the coordinator's clock.
  // A quarter second keeps a hang verdict close to hang_timeout; a check is a pass over the
  // live jobs' rank tables under the lock.
  const absl::Duration period = std::min(
      absl::Milliseconds(250), std::max(absl::Milliseconds(10), options_.liveness_timeout / 4));
  liveness_thread_ = std::thread([this, period] {
    // The monotonic clock of the process (not the coordinator's Clock): it keeps running while
    // the process is stopped (SIGSTOP, a frozen VM, starvation), which is what it measures. Two
    // checks' starts further apart than the period plus kPauseThreshold mean the coordinator
    // did not run in between; heartbeats that arrived meanwhile could not be counted, so no
    // rank is judged on that gap (GraceAfterPause) before this check.
    auto last_start = std::chrono::steady_clock::now();
    absl::MutexLock lock(&liveness_mu_);
    while (!liveness_stop_) {
      liveness_cv_.WaitWithTimeout(&liveness_mu_, period);
      if (liveness_stop_) break;
      liveness_mu_.Unlock();
      const auto start = std::chrono::steady_clock::now();
      const absl::Duration gap = absl::FromChrono(start - last_start);
      last_start = start;
      if (gap > period + kPauseThreshold) GraceAfterPause(gap);
      CheckLiveness();
      liveness_mu_.Lock();
    }
  });
}

void Coordinator::GraceAfterPause(absl::Duration gap) {
  absl::MutexLock lock(&mu_);
  if (shutdown_) return;
  const int granted = GrantGrace(clock_->Now());
  Log(absl::StrCat("coordinator did not run for ",
                   absl::FormatDuration(absl::Trunc(gap, absl::Milliseconds(100))),
                   " (stopped, frozen or starved): ", granted,
                   granted == 1 ? " live job gets" : " live jobs get",
                   " a fresh liveness and hang grace period"));
}

int Coordinator::GrantGrace(absl::Time now) {
  int granted = 0;
  for (auto& [id, job] : jobs_) {
    if (IsTerminal(job->rec.state)) continue;
    for (int i = 0; i < job->world_size(); ++i) {
      RankTable::Rank& r = job->ranks.at(i);
      r.last_seen = std::max(r.last_seen, now);
      r.heartbeat_time = std::max(r.heartbeat_time, now);
    }
    // No liveness verdict for two liveness timeouts: a rank may have to make its connection
    // anew (its keepalive gave up on the silent coordinator) while the woken coordinator works
    // through what queued up meanwhile.
    job->liveness_grace_until = now + 2 * options_.liveness_timeout;
    for (auto& [worker, spare] : job->spares) spare.last_seen = std::max(spare.last_seen, now);
    if (job->rec.state == JobState::kRecovering) {
      job->attempts.set_recovery_start(std::max(job->attempts.recovery_start(), now));
    }
    // A rank's reported position can hold the whole gap (waiting for a latch the coordinator
    // could not publish): no hang verdict until a full hang timeout after waking.
    job->hang_grace_until = now + absl::Seconds(job->spec.hang_timeout_seconds);
    ++granted;
  }
  return granted;
}

void Coordinator::CheckLiveness() {
  absl::MutexLock lock(&mu_);
  if (shutdown_) return;
  const absl::Time now = clock_->Now();
  if (SuspectOwnNetwork(now)) return;
  int unreachable = 0;
  for (auto& [id, job] : jobs_) {
    if (IsTerminal(job->rec.state)) continue;
    if (std::optional<PartitionVerdict> cut = CurrentPartition(*job, now)) {
      unreachable += cut->pairs;
    }
    if (job->ranks.all_joined() &&
        (job->rec.state == JobState::kPending || job->rec.state == JobState::kRecovering ||
         job->rec.state == JobState::kPreempted)) {
      (void)MaybeStart(*job, now);  // a store failure leaves it waiting; the next check retries
      if (IsTerminal(job->rec.state)) continue;
    }
    std::vector<int> late = job->ranks.Late(now, options_.liveness_timeout);
    if (now < job->liveness_grace_until) late.clear();  // GraceAfterPause
    if (job->rec.state == JobState::kPreempted) {
      // Waiting for its ranks without a deadline: a joined rank that went silent gives its
      // rank up for another worker; it is no failure.
      for (int i : late) {
        (void)ReleaseRank(*job, i, "went silent while the job waited for its ranks");
      }
      continue;
    }
    if (job->rec.state == JobState::kSuspended) continue;
    if (!late.empty()) {
      LivenessVerdict(*job, late, now);
      continue;
    }
    if (CheckRejoin(*job, now)) continue;
    if (!job->spares.empty()) LiveSpares(*job, now);
    CheckHang(*job, now);
  }
  if (observer_) observer_->UnreachablePeers(unreachable);
}

void Coordinator::LivenessVerdict(Job& job, const std::vector<int>& late, absl::Time now) {
  std::vector<std::string> names;
  for (int i : late) {
    const RankTable::Rank& r = job.ranks.at(i);
    std::string name = absl::StrCat(
        "rank ", i, " (worker ", r.worker_id, ", unseen for ",
        absl::FormatDuration(absl::Trunc(now - r.last_seen, absl::Milliseconds(100))), ")");
    if (r.position && r.position->window >= 0) {
      absl::StrAppend(&name, ", last ", DescribePosition(*r.position));
    }
    names.push_back(std::move(name));
  }
  for (int i : late) {
    SetWorkerState(job, i, WorkerState::kLost).IgnoreError();  // the verdict reports store errors
  }
  // A position ends in a comma before the verb ("..., micro-batch 0 (latch), missed"); the
  // names are joined with one comma each.
  const RankTable::Rank& last = job.ranks.at(late.back());
  const bool positioned = last.position && last.position->window >= 0;
  const std::string cause = absl::StrCat(absl::StrJoin(names, ", "), positioned ? "," : "",
                                         " missed the liveness deadline of ",
                                         absl::FormatDuration(options_.liveness_timeout));
  absl::Status s = FailOrRecover(job, -1, WorkerState::kLost, cause);
  (void)s;  // a store failure leaves the job live; the next check tries again
}

bool Coordinator::CheckRejoin(Job& job, absl::Time now) {
  // latchkey.rejoin_timeout_seconds, else the liveness timeout.
  const absl::Duration timeout = job.spec.rejoin_timeout_seconds > 0
                                     ? absl::Seconds(job.spec.rejoin_timeout_seconds)
                                     : options_.liveness_timeout;
  if (job.rec.state != JobState::kRecovering || job.ranks.all_joined() ||
      job.resume_awaits_first_join || now - job.attempts.recovery_start() <= timeout) {
    return false;
  }
  std::vector<int> missing;
  for (int i = 0; i < job.world_size(); ++i) {
    if (job.ranks.at(i).worker_id.empty()) missing.push_back(i);
  }
  // Ranks cut off by a partition rejoin once their link is back: that wait spends nothing, up
  // to latchkey.partition_timeout_seconds.
  if (job.partition &&
      now - job.partition->since <= absl::Seconds(job.spec.partition_timeout_seconds)) {
    return false;
  }
  const std::string cause =
      absl::StrCat(missing.size() == 1 ? "rank " : "ranks ", absl::StrJoin(missing, ", "),
                   " did not rejoin attempt ", job.attempts.attempt(), " within ",
                   absl::FormatDuration(timeout));
  Log(absl::StrCat(job.rec.job_id, ": ", cause));
  // An elastic job goes on with the workers at hand, in the layout they fill.
  if (MaybeShrink(job, cause, now)) return true;
  absl::Status s = FailOrRecover(job, -1, WorkerState::kLost, cause);
  (void)s;  // as in LivenessVerdict
  return true;
}

absl::Duration Coordinator::HeartbeatInterval(int world_size) const {
  const absl::Duration base = options_.heartbeat_interval;
  if (options_.job_heartbeats_per_second <= 0) return base;
  const absl::Duration spread = absl::Seconds(1) * world_size / options_.job_heartbeats_per_second;
  if (spread <= base) return base;
  return std::max(base, std::min(spread, options_.liveness_timeout / 3));
}

bool Coordinator::CheckHang(Job& job, absl::Time now) {
  if (job.rec.state != JobState::kRunning || !job.ranks.all_joined()) return false;
  if (now < job.hang_grace_until) return false;  // GraceAfterPause
  const int64_t attempt = job.attempts.attempt();
  std::vector<RankWatch> watch;
  for (int i = 0; i < job.world_size(); ++i) {
    const RankTable::Rank& r = job.ranks.at(i);
    if (!r.position || !IsLive(r.state)) continue;
    if (r.position->attempt != 0 && r.position->attempt != attempt) continue;
    watch.push_back({i, *r.position, now - r.heartbeat_time});
  }
  if (watch.empty()) return false;
  std::optional<StallVerdict> v = FindStall(watch, absl::Seconds(job.spec.hang_timeout_seconds),
                                            2 * HeartbeatInterval(job.world_size()));
  if (!v) return false;
  if (std::optional<PartitionVerdict> cut = CurrentPartition(job, now)) {
    // Not a stalled rank: a cut link (FailOrRecover names it and spends no restart).
    Log(absl::StrCat(job.rec.job_id, ": network partition: ", cut->message));
    absl::Status s = FailOrRecover(job, -1, WorkerState::kLost, v->message);
    (void)s;  // as in LivenessVerdict
    return true;
  }
  v->stalled.attempt = attempt;
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
      job.ranks.StepsCompleted() <= job.attempts.resume_step() + 1) {
    return absl::OkStatus();
  }
  JobRecord next = job.rec;
  auto& st = next.stalled;
  const int64_t attempt = job.attempts.attempt();
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

}  // namespace latchkey
