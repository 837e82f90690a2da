// Coordinator: the calls a rank makes to take part (join, latch streams, heartbeats, failure
// reports); its progress reports are in coordinator_reports.cc. Each checks the caller (token,
// the attempt fence of the AttemptLog, the RankTable), then hands the change to its owner.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/error_info.h"
#include "common/status_macros.h"
#include "server/coordinator.h"
#include "server/coordinator_internal.h"
#include "server/job_state_machine.h"
#include "server/security.h"

namespace latchkey {

absl::StatusOr<Coordinator::Job*> Coordinator::FindForWorker(const WorkerCall& call,
                                                             bool check_rank, bool fence) {
  LK_ASSIGN_OR_RETURN(Job * j, FindJob(call.job_id));
  const bool known =
      !j->verified_token.empty() && ConstantTimeEquals(call.join_token, j->verified_token);
  if (!known) {
    if (!ConstantTimeEquals(Sha256Hex(call.join_token), j->rec.join_token)) {
      return absl::UnauthenticatedError(absl::StrCat(call.job_id, ": join token does not match"));
    }
    j->verified_token = call.join_token;
  }
  if (call.worker_id.empty()) return absl::InvalidArgumentError("identity.worker_id: required");
  if (call.attempt < 0) return absl::InvalidArgumentError("identity.attempt: must be >= 0");
  if (fence) {
    LK_RETURN_IF_ERROR(j->attempts.CheckFence(j->rec.job_id, call.worker_id, call.attempt,
                                              j->ranks.RankOf(call.worker_id).has_value()));
  }
  if (check_rank) LK_RETURN_IF_ERROR(j->ranks.CheckHolder(call.job_id, call.rank, call.worker_id));
  return j;
}

absl::StatusOr<JoinResult> Coordinator::Join(const JoinArgs& args) {
  absl::MutexLock lock(&mu_);
  LK_ASSIGN_OR_RETURN(Job * found, FindForWorker(args.call, /*check_rank=*/false, /*fence=*/false));
  Job& j = *found;
  // A spare of an ended job hears how it ended, as data: it is not needed and exits (0 when the
  // job succeeded) instead of failing on a refused join.
  if (IsTerminal(j.rec.state) && j.spares.count(args.call.worker_id) > 0) {
    JoinResult out = SpareResult(j);
    j.spares.erase(args.call.worker_id);
    return out;
  }
  if (j.rec.state == JobState::kSuspended) {
    ErrorInfo info;
    info.reason = error_reason::kJobSuspended;
    return WithErrorInfo(
        absl::FailedPreconditionError(
            absl::StrCat(j.rec.job_id, ": is suspended (", j.rec.failure_reason,
                         "); it takes workers again after `latchkey resume ", j.rec.job_id, "`")),
        info);
  }
  if (IsTerminal(j.rec.state)) {
    return absl::FailedPreconditionError(absl::StrCat(
        j.rec.job_id, ": already ended (", JobStateName(j.rec.state), ")",
        j.rec.failure_reason.empty() ? "" : absl::StrCat(" (", j.rec.failure_reason, ")")));
  }
  std::optional<int> rank = j.ranks.RankOf(args.call.worker_id);
  if (rank) {  // a rejoin: same worker, same rank
    // In an elastic job the layout is the coordinator's: a worker placed at another rank than
    // the one it asks for (a spare, a shrink's survivor) keeps the rank it holds.
    if (args.requested_rank && *args.requested_rank != *rank && !j.attempts.elastic()) {
      return absl::AbortedError(absl::StrCat("worker ", args.call.worker_id, " already holds rank ",
                                             *rank, ", not ", *args.requested_rank));
    }
  } else {
    if (j.attempts.elastic() && !HasRankFor(j, args.requested_rank)) {
      // Elastic: a worker the current layout has no rank for waits as a spare (it polls Join)
      // and is used when the job grows.
      Job::Spare& spare = j.spares[args.call.worker_id];
      if (spare.last_seen == absl::UnixEpoch()) {
        Log(absl::StrCat(j.rec.job_id, ": worker ", args.call.worker_id, " waits as a spare (",
                         j.spares.size(), " now; world ", j.world_size(), ")"));
      }
      spare.requested_rank = args.requested_rank;
      spare.host = !args.advertise_host.empty() ? args.advertise_host : args.peer_host;
      spare.last_seen = clock_->Now();
      return SpareResult(j);
    }
    JoinArgs claim = args;
    // A survivor of a shrink (or a spare placed by a grow) whose rank number is past the new
    // world takes the lowest free rank: the layout was chosen for the workers at hand.
    if (j.attempts.elastic() && claim.requested_rank &&
        !j.ranks.grid().contains(*claim.requested_rank)) {
      claim.requested_rank.reset();
    }
    if (j.attempts.elastic() && claim.requested_rank &&
        !j.ranks.at(*claim.requested_rank).worker_id.empty()) {
      claim.requested_rank.reset();
    }
    LK_ASSIGN_OR_RETURN(rank, ClaimRank(j, claim));
    j.spares.erase(args.call.worker_id);
    // The join that completed the job's ranks may have ended it (a layout refused before any
    // collective, coordinator_partition.cc): this worker hears it as the others do.
    if (IsTerminal(j.rec.state)) {
      return absl::FailedPreconditionError(
          absl::StrCat(j.rec.job_id, ": ended (", JobStateName(j.rec.state), ") as rank ", *rank,
                       " joined (", j.rec.failure_reason, ")"));
    }
  }
  j.ranks.at(*rank).last_seen = clock_->Now();
  return JoinResultFor(j, *rank);
}

bool Coordinator::HasRankFor(const Job& j, std::optional<int> requested) const {
  if (j.ranks.all_joined()) return false;
  // A running job's free rank is one whose worker is being replaced: any joiner takes it. A
  // rank number past the world belongs to the recovery's survivors only while it recovers.
  if (requested && !j.ranks.grid().contains(*requested)) {
    return j.rec.state == JobState::kRecovering || j.rec.state == JobState::kPending ||
           j.rec.state == JobState::kPreempted;
  }
  return true;
}

JoinResult Coordinator::SpareResult(const Job& j) const {
  JoinResult out = JoinResultFor(j, 0);
  out.spare = true;
  out.rank = -1;
  out.tp_rank = out.dp_rank = 0;
  out.rendezvous_host.clear();
  out.failure_reason = j.rec.failure_reason;
  return out;
}

absl::StatusOr<int> Coordinator::ClaimRank(Job& j, const JoinArgs& args) {
  const int64_t attempt = j.attempts.attempt();
  LK_ASSIGN_OR_RETURN(int rank, j.ranks.Claim(j.rec.job_id, args.requested_rank));
  WorkerRecord w;
  w.job_id = j.rec.job_id;
  w.rank = rank;
  w.worker_id = args.call.worker_id;
  w.host = !args.advertise_host.empty() ? args.advertise_host : args.peer_host;
  w.state = WorkerState::kJoined;
  w.join_time = clock_->Now();
  w.attempt = attempt;
  LK_RETURN_IF_ERROR(store_->PutWorker(w));
  j.ranks.Place(w, w.join_time);
  j.attempts.Unfence(w.worker_id);  // it is of the current attempt now
  if (j.resume_awaits_first_join) {
    // A resumed job's rejoin window opens with its first worker (ResumeJob).
    j.resume_awaits_first_join = false;
    j.attempts.set_recovery_start(clock_->Now());
  }
  if (observer_) observer_->AddWorkers(WorkerState::kJoined, 1);
  Log(absl::StrCat(j.rec.job_id, ": rank ", rank, " joined (worker ", w.worker_id, " at ",
                   w.host.empty() ? "?" : w.host, "), ", j.ranks.joined(), "/", j.world_size(),
                   attempt > 1 ? absl::StrCat(" of attempt ", attempt) : ""));
  if (rank == 0 && !j.rec.rendezvous_host_fixed) {
    // Rank 0 hosts the TCP store, so its address is the rendezvous host.
    JobRecord rec = j.rec;
    rec.rendezvous_host = w.host.empty() ? "127.0.0.1" : w.host;
    rec.update_time = clock_->Now();
    LK_RETURN_IF_ERROR(store_->UpdateJob(rec));
    j.rec = std::move(rec);
  }
  j.ranks.at(rank).probe_port = args.probe_port;
  j.ranks.at(rank).node = args.node;
  // The attempt forms once its ranks reach each other (coordinator_partition.cc).
  LK_RETURN_IF_ERROR(MaybeStart(j, clock_->Now()));
  Touch(j);
  return rank;
}

JoinResult Coordinator::JoinResultFor(const Job& j, int rank) const {
  const AttemptLog::Attempt& attempt = j.attempts.current();
  const RankGrid grid = attempt.layout.grid();
  JoinResult out;
  out.rank = rank;
  out.world_size = attempt.layout.world_size;
  out.tp = attempt.layout.tp;
  out.dp = attempt.layout.dp;
  out.tp_rank = grid.tp_rank(rank);
  out.dp_rank = grid.dp_rank(rank);
  out.spec_json = j.rec.spec_json;
  out.base_dir = j.rec.base_dir;
  out.rendezvous_host = j.rec.rendezvous_host;
  // A new attempt meets at a fresh store: its host once rank 0 of the attempt has joined.
  if (attempt.number > 1 && j.ranks.at(0).worker_id.empty()) out.rendezvous_host.clear();
  out.rendezvous_port = j.rec.rendezvous_port;
  out.state = j.rec.state;
  out.heartbeat_interval = HeartbeatInterval(attempt.layout.world_size);
  out.liveness_timeout = options_.liveness_timeout;
  out.steps = j.spec.steps;
  out.attempt = attempt.number;
  out.rendezvous_prefix =
      attempt.number == 1 ? j.rec.job_id : absl::StrCat(j.rec.job_id, "/a", attempt.number);
  out.resume_step = attempt.resume_step;
  out.resume_manifest_sha256 = attempt.resume_manifest_sha256;
  out.hang_timeout = absl::Seconds(j.spec.hang_timeout_seconds);
  out.gradient_accumulation_steps = attempt.layout.gradient_accumulation_steps;
  out.elastic = j.attempts.elastic();
  out.job_uid = j.rec.job_uid;
  return out;
}

absl::StatusOr<bool> Coordinator::LatchesNow(Job& j, int64_t window, int max, LatchBatch* out) {
  out->state = j.rec.state;
  out->reason = j.rec.failure_reason;
  const bool failed = j.rec.state == JobState::kFailed || j.rec.state == JobState::kCancelled;
  if (!failed && j.stop && window >= j.stop->before_window) {
    out->stop_before = j.stop->before_window;  // coordinator_stop.cc
    return true;
  }
  if (!failed && window < j.latches.next_window()) {
    LK_ASSIGN_OR_RETURN(out->latches, j.latches.Read(*store_, window, max));
    return true;
  }
  if (IsTerminal(j.rec.state)) {
    out->job_ended = true;
    return true;
  }
  return false;
}

absl::StatusOr<LatchBatch> Coordinator::WaitLatches(const WorkerCall& call, int64_t window, int max,
                                                    absl::Time deadline) {
  if (window < 0) return absl::InvalidArgumentError("start_window: must be >= 0");
  max = std::max(1, max);
  absl::MutexLock lock(&mu_);
  while (true) {
    LK_ASSIGN_OR_RETURN(Job * j, FindForWorker(call, /*check_rank=*/true));
    j->ranks.at(call.rank).last_seen = clock_->Now();
    LatchBatch out;
    LK_ASSIGN_OR_RETURN(bool ready, LatchesNow(*j, window, max, &out));
    if (ready) return out;
    if (absl::Now() >= deadline) return absl::DeadlineExceededError("no latch yet");
    j->cv.WaitWithDeadline(&mu_, deadline);
  }
}

absl::StatusOr<LatchBatch> Coordinator::PollLatches(const WorkerCall& call, int64_t window,
                                                    int max) {
  if (window < 0) return absl::InvalidArgumentError("start_window: must be >= 0");
  absl::MutexLock lock(&mu_);
  LK_ASSIGN_OR_RETURN(Job * j, FindForWorker(call, /*check_rank=*/true));
  LatchBatch out;
  LK_RETURN_IF_ERROR(LatchesNow(*j, window, std::max(1, max), &out).status());
  return out;
}

absl::StatusOr<Subscription> Coordinator::SubscribeLatches(const WorkerCall& call,
                                                           std::shared_ptr<JobListener> listener) {
  absl::MutexLock lock(&mu_);
  LK_ASSIGN_OR_RETURN(Job * j, FindForWorker(call, /*check_rank=*/true));
  RankTable::Rank& r = j->ranks.at(call.rank);
  r.open_streams++;
  r.last_seen = clock_->Now();
  Subscription sub{j->rec.job_id, call.rank, ++last_listener_id_, j->attempts.attempt()};
  j->listeners.emplace(sub.id, std::move(listener));
  return sub;
}

void Coordinator::Unsubscribe(const Subscription& sub) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(sub.job_id);  // not FindJob: this also runs during shutdown
  if (it == jobs_.end() || it->second->listeners.erase(sub.id) == 0) return;
  CountLive(*it->second);
  // A stream of an earlier attempt: its rank was freed with the attempt.
  if (sub.attempt != it->second->attempts.attempt()) return;
  RankTable::Rank& r = it->second->ranks.at(sub.rank);
  r.open_streams--;
  r.last_seen = clock_->Now();  // the deadline runs from the stream's end
}

absl::StatusOr<WorkerStatus> Coordinator::Heartbeat(const WorkerCall& call,
                                                    const std::optional<RankPosition>& position) {
  HeartbeatArgs args;
  args.position = position;
  return Heartbeat(call, args);
}

absl::StatusOr<WorkerStatus> Coordinator::Heartbeat(const WorkerCall& call,
                                                    const HeartbeatArgs& args) {
  absl::MutexLock lock(&mu_);
  LK_ASSIGN_OR_RETURN(Job * j, FindForWorker(call, /*check_rank=*/true));
  RankTable::Rank& r = j->ranks.at(call.rank);
  const absl::Time now = clock_->Now();
  r.last_seen = r.heartbeat_time = now;
  // A client that sends no position is idle to the hang detector: it is judged only once it
  // goes silent (a stopped process keeps its latch stream open, so liveness never ends it).
  if (args.position) {
    r.position = *args.position;
  } else if (!r.position) {
    r.position = RankPosition{};
  }
  if (args.probe_port > 0 && args.probe_port != r.probe_port) {
    // A coordinator restarted since the Join: the peer list has this rank's address again.
    r.probe_port = args.probe_port;
    j->ranks.PeersChanged();
  }
  if (args.reach) {
    r.reach = *args.reach;
    r.reach_time = now;
    // A job waiting to form its attempt starts once every rank reached every other.
    LK_RETURN_IF_ERROR(MaybeStart(*j, now));
  }
  WorkerStatus out{j->rec.state, j->rec.failure_reason, false, j->attempts.attempt(), {}};
  out.stop = j->stop.has_value();
  out.peers.version = j->ranks.peers_version();
  if (args.want_peers) out.peers = PeersOf(*j);
  if (j->trace.id != 0 && j->trace.asked.count(call.rank) && !j->trace.answers.count(call.rank)) {
    out.trace = {j->trace.id, j->trace.first_step, j->trace.last_step};  // coordinator_trace.cc
  }
  return out;
}

absl::StatusOr<WorkerStatus> Coordinator::ReportFailure(const WorkerCall& call,
                                                        const std::string& message, bool permanent,
                                                        const std::string& reason) {
  absl::MutexLock lock(&mu_);
  LK_ASSIGN_OR_RETURN(Job * j, FindForWorker(call, /*check_rank=*/true));
  // A suspended job runs nothing: what its ranks meet on their way out is no failure of it.
  if (!IsTerminal(j->rec.state) && j->rec.state != JobState::kSuspended) {
    const std::string cause = absl::StrCat("rank ", call.rank, " (worker ", call.worker_id,
                                           "): ", message.empty() ? "failed" : message);
    // A diverged training is an outcome of the job's own numbers, not a fault: the last
    // checkpoint stays the newest, and a recovery from it would diverge the same way.
    const bool diverged = reason == error_reason::kTrainingDiverged;
    if (diverged) {
      LK_RETURN_IF_ERROR(SetWorkerState(*j, call.rank, WorkerState::kFailed));
      const std::string why = cause + " (training diverged: not retried)";
      const JobEventRecord event = Event(*j, "diverged", why);
      LK_RETURN_IF_ERROR(EndJob(*j, JobState::kFailed, why, WorkerState::kDone, &event));
    } else if (permanent) {
      LK_RETURN_IF_ERROR(SetWorkerState(*j, call.rank, WorkerState::kFailed));
      LK_RETURN_IF_ERROR(EndJob(*j, JobState::kFailed,
                                cause + " (a configuration error: not retried)",
                                WorkerState::kDone));
    } else {
      LK_RETURN_IF_ERROR(FailOrRecover(*j, call.rank, WorkerState::kFailed, cause));
    }
  }
  return WorkerStatus{j->rec.state, j->rec.failure_reason, false, j->attempts.attempt(), {}};
}

}  // namespace latchkey
