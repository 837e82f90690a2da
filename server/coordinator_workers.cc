// Coordinator: the WorkerService half (join, latch streams, step reports, liveness), latch
// publication, and the state transitions shared with coordinator.cc.
#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/coordinator.h"
#include "server/coordinator_internal.h"

namespace latchkey {
namespace {

// Compares without an early exit so the time taken does not reveal a matching prefix.
bool TokenEquals(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= a[i] ^ b[i % std::max<size_t>(1, b.size())];
  return diff == 0;
}

bool Live(WorkerState s) { return s == WorkerState::kJoined || s == WorkerState::kActive; }

}  // namespace

absl::StatusOr<Coordinator::Job*> Coordinator::FindForWorker(const WorkerCall& call,
                                                             bool check_rank) {
  auto job = FindJob(call.job_id);
  if (!job.ok()) return job.status();
  Job& j = **job;
  if (!TokenEquals(call.join_token, j.rec.join_token)) {
    return absl::UnauthenticatedError(absl::StrCat(call.job_id, ": join token does not match"));
  }
  if (call.worker_id.empty()) return absl::InvalidArgumentError("identity.worker_id: required");
  if (!check_rank) return &j;
  if (call.rank < 0 || call.rank >= j.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank: ", call.rank, " is outside [0, ", j.world_size(), ")"));
  }
  const Rank& r = j.ranks[static_cast<size_t>(call.rank)];
  if (r.worker_id != call.worker_id) {
    return absl::AbortedError(
        absl::StrCat("rank ", call.rank, " of job ", call.job_id, " is held by ",
                     r.worker_id.empty() ? std::string("no worker (join first)")
                                         : absl::StrCat("worker ", r.worker_id),
                     ", not ", call.worker_id));
  }
  return &j;
}

absl::Status Coordinator::SetJobState(Job& job, JobState state, const std::string& reason) {
  JobRecord rec = job.rec;
  rec.state = state;
  rec.failure_reason = reason;
  rec.update_time = absl::Now();
  absl::Status s = store_->UpdateJob(rec);
  if (!s.ok()) return s;
  if (observer_) {
    observer_->AddJobs(job.rec.state, -1);
    observer_->AddJobs(state, 1);
  }
  Log(absl::StrCat(job.rec.job_id, ": ", JobStateName(job.rec.state), " -> ", JobStateName(state),
                   reason.empty() ? "" : absl::StrCat(" (", reason, ")")));
  job.rec = std::move(rec);
  Touch(job);
  return absl::OkStatus();
}

absl::Status Coordinator::SetWorkerState(Job& job, Rank& rank, WorkerState state) {
  if (rank.worker_id.empty() || rank.state == state) return absl::OkStatus();
  WorkerRecord w;
  w.job_id = job.rec.job_id;
  w.rank = static_cast<int>(&rank - job.ranks.data());
  w.worker_id = rank.worker_id;
  w.host = rank.host;
  w.state = state;
  w.join_time = rank.join_time;
  absl::Status s = store_->PutWorker(w);
  if (!s.ok()) return s;
  if (observer_) {
    observer_->AddWorkers(rank.state, -1);
    observer_->AddWorkers(state, 1);
  }
  rank.state = state;
  Touch(job);
  return absl::OkStatus();
}

absl::Status Coordinator::EndJob(Job& job, JobState state, const std::string& reason,
                                 WorkerState worker_state) {
  for (Rank& r : job.ranks) {
    if (Live(r.state)) {
      absl::Status s = SetWorkerState(job, r, worker_state);
      if (!s.ok()) return s;
    }
  }
  absl::Status s = SetJobState(job, state, reason);
  if (!s.ok()) return s;
  // Ended jobs serve no stream: their latches are read from the store if ever asked for.
  job.latches.clear();
  job.latches.shrink_to_fit();  // std::deque: releases its blocks
  job.latch_base = job.rec.next_window;
  job.partial.clear();
  return absl::OkStatus();
}

absl::Status Coordinator::Publish(Job& job) {
  if (job.rec.state != JobState::kRunning) return absl::OkStatus();
  const int64_t frontier =
      std::min<int64_t>(job.spec.steps, job.steps_completed + 1 + options_.latch_lookahead);
  if (job.rec.next_window >= frontier) return absl::OkStatus();
  std::vector<PublishedLatch> batch;
  int64_t m = job.rec.next_first_micro_batch;
  const absl::Time now = absl::Now();
  for (int64_t w = job.rec.next_window; w < frontier; ++w) {
    PublishedLatch p;
    p.latch = DecideLatch(job.spec, job.rec.policy, w, m);
    p.latch.job_id = job.rec.job_id;
    p.publish_time = now;
    m += p.latch.n;
    batch.push_back(std::move(p));
  }
  // Persist first: nothing is visible to a stream until it is durable.
  absl::Status s = store_->AppendLatches(job.rec.job_id, batch, frontier, m);
  if (!s.ok()) return s;
  for (PublishedLatch& p : batch) {
    if (observer_) observer_->LatchPublished(p.latch.kv_mode);
    job.latches.push_back(std::move(p));
  }
  job.rec.next_window = frontier;
  job.rec.next_first_micro_batch = m;
  Touch(job);
  return absl::OkStatus();
}

absl::StatusOr<JoinResult> Coordinator::Join(const JoinArgs& args) {
  absl::MutexLock lock(&mu_);
  auto found = FindForWorker(args.call, /*check_rank=*/false);
  if (!found.ok()) return found.status();
  Job& j = **found;
  if (IsTerminal(j.rec.state)) {
    return absl::FailedPreconditionError(absl::StrCat(
        j.rec.job_id, ": already ended (", JobStateName(j.rec.state), ")",
        j.rec.failure_reason.empty() ? "" : absl::StrCat(" (", j.rec.failure_reason, ")")));
  }
  int rank = -1;
  for (int i = 0; i < j.world_size(); ++i) {
    if (j.ranks[static_cast<size_t>(i)].worker_id == args.call.worker_id) rank = i;
  }
  if (rank >= 0) {  // a rejoin: same worker, same rank
    if (args.requested_rank && *args.requested_rank != rank) {
      return absl::AbortedError(absl::StrCat("worker ", args.call.worker_id, " already holds rank ",
                                             rank, ", not ", *args.requested_rank));
    }
  } else {
    if (args.requested_rank) {
      rank = *args.requested_rank;
      if (rank < 0 || rank >= j.world_size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("requested_rank: ", rank, " is outside [0, ", j.world_size(), ")"));
      }
      const Rank& held = j.ranks[static_cast<size_t>(rank)];
      if (!held.worker_id.empty()) {
        return absl::AbortedError(absl::StrCat("rank ", rank, " of job ", j.rec.job_id,
                                               " is held by worker ", held.worker_id));
      }
    } else {
      for (int i = 0; i < j.world_size() && rank < 0; ++i) {
        if (j.ranks[static_cast<size_t>(i)].worker_id.empty()) rank = i;
      }
      if (rank < 0) {
        return absl::AbortedError(
            absl::StrCat(j.rec.job_id, ": all ", j.world_size(), " ranks taken"));
      }
    }
    Rank& r = j.ranks[static_cast<size_t>(rank)];
    WorkerRecord w;
    w.job_id = j.rec.job_id;
    w.rank = rank;
    w.worker_id = args.call.worker_id;
    w.host = !args.advertise_host.empty() ? args.advertise_host : args.peer_host;
    w.state = WorkerState::kJoined;
    w.join_time = absl::Now();
    absl::Status s = store_->PutWorker(w);
    if (!s.ok()) return s;
    r.worker_id = w.worker_id;
    r.host = w.host;
    r.state = w.state;
    r.join_time = w.join_time;
    j.joined++;
    if (observer_) observer_->AddWorkers(WorkerState::kJoined, 1);
    Log(absl::StrCat(j.rec.job_id, ": rank ", rank, " joined (worker ", w.worker_id, " at ",
                     w.host.empty() ? "?" : w.host, "), ", j.joined, "/", j.world_size()));
    if (rank == 0 && !j.rec.rendezvous_host_fixed) {
      // Rank 0 hosts the TCP store, so its address is the rendezvous host.
      JobRecord rec = j.rec;
      rec.rendezvous_host = r.host.empty() ? "127.0.0.1" : r.host;
      rec.update_time = absl::Now();
      s = store_->UpdateJob(rec);
      if (!s.ok()) return s;
      j.rec = std::move(rec);
    }
    if (j.joined == j.world_size() && j.rec.state == JobState::kPending) {
      s = SetJobState(j, JobState::kRunning, "");
      for (Rank& each : j.ranks) {
        if (s.ok()) s = SetWorkerState(j, each, WorkerState::kActive);
      }
      if (s.ok()) s = Publish(j);
      if (!s.ok()) return s;
    }
    Touch(j);
  }
  j.ranks[static_cast<size_t>(rank)].last_seen = absl::Now();

  JoinResult out;
  out.rank = rank;
  out.world_size = j.world_size();
  out.tp = j.spec.tp;
  out.dp = j.spec.dp();
  out.spec_json = j.rec.spec_json;
  out.base_dir = j.rec.base_dir;
  out.rendezvous_host = j.rec.rendezvous_host;
  out.rendezvous_port = j.rec.rendezvous_port;
  out.state = j.rec.state;
  out.heartbeat_interval = options_.heartbeat_interval;
  out.liveness_timeout = options_.liveness_timeout;
  out.steps = j.spec.steps;
  return out;
}

absl::StatusOr<bool> Coordinator::LatchesNow(Job& j, int64_t window, int max, LatchBatch* out) {
  out->state = j.rec.state;
  out->reason = j.rec.failure_reason;
  const bool failed = j.rec.state == JobState::kFailed || j.rec.state == JobState::kCancelled;
  if (!failed && window < j.rec.next_window) {
    const int64_t end = std::min<int64_t>(j.rec.next_window, window + max);
    if (window >= j.latch_base) {
      for (int64_t w = window; w < end; ++w) {
        out->latches.push_back(j.latches[static_cast<size_t>(w - j.latch_base)]);
      }
    } else {
      auto stored = store_->LoadLatches(j.rec.job_id, window, end - window);
      if (!stored.ok()) return stored.status();
      out->latches = *std::move(stored);
    }
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
    auto found = FindForWorker(call, /*check_rank=*/true);
    if (!found.ok()) return found.status();
    Job& j = **found;
    j.ranks[static_cast<size_t>(call.rank)].last_seen = absl::Now();
    LatchBatch out;
    auto ready = LatchesNow(j, window, max, &out);
    if (!ready.ok()) return ready.status();
    if (*ready) return out;
    if (absl::Now() >= deadline) return absl::DeadlineExceededError("no latch yet");
    j.cv.WaitWithDeadline(&mu_, deadline);
  }
}

absl::StatusOr<LatchBatch> Coordinator::PollLatches(const WorkerCall& call, int64_t window,
                                                    int max) {
  if (window < 0) return absl::InvalidArgumentError("start_window: must be >= 0");
  absl::MutexLock lock(&mu_);
  auto found = FindForWorker(call, /*check_rank=*/true);
  if (!found.ok()) return found.status();
  LatchBatch out;
  auto ready = LatchesNow(**found, window, std::max(1, max), &out);
  if (!ready.ok()) return ready.status();
  return out;
}

absl::StatusOr<Subscription> Coordinator::SubscribeLatches(const WorkerCall& call,
                                                           std::shared_ptr<JobListener> listener) {
  absl::MutexLock lock(&mu_);
  auto found = FindForWorker(call, /*check_rank=*/true);
  if (!found.ok()) return found.status();
  Job& j = **found;
  Rank& r = j.ranks[static_cast<size_t>(call.rank)];
  r.open_streams++;
  r.last_seen = absl::Now();
  Subscription sub{j.rec.job_id, call.rank, ++last_listener_id_};
  j.listeners.emplace(sub.id, std::move(listener));
  return sub;
}

void Coordinator::Unsubscribe(const Subscription& sub) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(sub.job_id);  // not FindJob: this also runs during shutdown
  if (it == jobs_.end() || it->second->listeners.erase(sub.id) == 0) return;
  Rank& r = it->second->ranks[static_cast<size_t>(sub.rank)];
  r.open_streams--;
  r.last_seen = absl::Now();  // the deadline runs from the stream's end
}

void Coordinator::AddStepReport(Job& job, const StepReportRecord& r) {
  if (job.recent.count(r.step)) return;
  PartialStep& p = job.partial[r.step];
  p.count++;
  StepSummary& sum = p.summary;
  sum.step = r.step;
  sum.step_seconds = std::max(sum.step_seconds, r.step_seconds);
  sum.ranks_reported = p.count;
  if (r.rank == 0 || p.count == 1) {
    sum.micro_batches = r.micro_batches;
    sum.loss = r.loss;
    sum.grad_norm = r.grad_norm;
    sum.kv_mode = r.kv_mode;
    sum.kv_allreduce_calls = r.kv_allreduce_calls;
    sum.tokens = r.tokens;
  }
  if (p.count < job.world_size()) return;
  job.recent[r.step] = sum;
  job.partial.erase(r.step);
  while (job.recent.size() > std::max<size_t>(1, options_.recent_steps)) {
    job.recent.erase(job.recent.begin());
  }
}

absl::Status Coordinator::RecomputeProgress(Job& job) {
  if (job.joined < job.world_size()) return absl::OkStatus();
  int64_t completed = std::numeric_limits<int64_t>::max();
  for (const Rank& r : job.ranks) completed = std::min(completed, r.steps_reported);
  if (completed != job.steps_completed) {
    job.steps_completed = completed;
    Touch(job);
    // Keep a few windows behind the slowest rank in memory; a long job's older latches are
    // served from the store.
    constexpr int64_t kKeptBehind = 16;
    while (!job.latches.empty() && job.latch_base < job.steps_completed - kKeptBehind) {
      job.latches.pop_front();
      job.latch_base++;
    }
  }
  if (job.rec.state == JobState::kRunning && job.steps_completed >= job.spec.steps) {
    return EndJob(job, JobState::kSucceeded, "", WorkerState::kDone);
  }
  return Publish(job);
}

absl::StatusOr<WorkerStatus> Coordinator::ReportStep(const WorkerCall& call,
                                                     StepReportRecord report) {
  absl::MutexLock lock(&mu_);
  auto found = FindForWorker(call, /*check_rank=*/true);
  if (!found.ok()) return found.status();
  Job& j = **found;
  Rank& rank = j.ranks[static_cast<size_t>(call.rank)];
  rank.last_seen = absl::Now();
  WorkerStatus out;
  out.state = j.rec.state;
  out.reason = j.rec.failure_reason;
  if (report.step < 0 || report.step >= j.spec.steps) {
    return absl::InvalidArgumentError(
        absl::StrCat("step: ", report.step, " is outside [0, ", j.spec.steps, ")"));
  }
  if (j.rec.state == JobState::kSucceeded) {  // every report is in already
    out.duplicate = true;
    return out;
  }
  if (j.rec.state != JobState::kRunning) {
    return absl::FailedPreconditionError(
        absl::StrCat(j.rec.job_id, ": job is ", JobStateName(j.rec.state)));
  }
  if (report.step >= j.rec.next_window) {
    return absl::FailedPreconditionError(
        absl::StrCat("step: latch(", report.step, ") is not published yet"));
  }
  int64_t generation = 0;
  if (report.step >= j.latch_base) {
    generation = j.latches[static_cast<size_t>(report.step - j.latch_base)].latch.generation;
  } else {
    auto stored = store_->LoadLatches(j.rec.job_id, report.step, 1);
    if (!stored.ok()) return stored.status();
    if (!stored->empty()) generation = stored->front().latch.generation;
  }
  if (report.latch_generation != generation) {
    return absl::AbortedError(absl::StrCat(
        "latch_generation: step ", report.step, " ran under generation ", report.latch_generation,
        " but latch(", report.step, ") has generation ", generation));
  }
  report.job_id = j.rec.job_id;
  report.rank = call.rank;
  report.report_time = absl::Now();
  auto inserted = store_->InsertStepReport(report);
  if (!inserted.ok()) return inserted.status();
  if (!*inserted) {
    out.duplicate = true;
    return out;
  }
  AddStepReport(j, report);
  rank.steps_reported = std::max(rank.steps_reported, report.step + 1);
  absl::Status s = RecomputeProgress(j);
  if (!s.ok()) return s;
  if (rank.steps_reported >= j.spec.steps) {
    s = SetWorkerState(j, rank, WorkerState::kDone);
    if (!s.ok()) return s;
  }
  out.state = j.rec.state;
  return out;
}

absl::StatusOr<WorkerStatus> Coordinator::Heartbeat(const WorkerCall& call) {
  absl::MutexLock lock(&mu_);
  auto found = FindForWorker(call, /*check_rank=*/true);
  if (!found.ok()) return found.status();
  Job& j = **found;
  j.ranks[static_cast<size_t>(call.rank)].last_seen = absl::Now();
  return WorkerStatus{j.rec.state, j.rec.failure_reason, false};
}

absl::StatusOr<WorkerStatus> Coordinator::ReportFailure(const WorkerCall& call,
                                                        const std::string& message) {
  absl::MutexLock lock(&mu_);
  auto found = FindForWorker(call, /*check_rank=*/true);
  if (!found.ok()) return found.status();
  Job& j = **found;
  if (!IsTerminal(j.rec.state)) {
    Rank& rank = j.ranks[static_cast<size_t>(call.rank)];
    absl::Status s = SetWorkerState(j, rank, WorkerState::kFailed);
    if (s.ok()) {
      s = EndJob(j, JobState::kFailed,
                 absl::StrCat("rank ", call.rank, " (worker ", call.worker_id,
                              "): ", message.empty() ? "failed" : message),
                 WorkerState::kDone);
    }
    if (!s.ok()) return s;
  }
  return WorkerStatus{j.rec.state, j.rec.failure_reason, false};
}

void Coordinator::CheckLiveness() {
  absl::MutexLock lock(&mu_);
  if (shutdown_) return;
  const absl::Time now = absl::Now();
  for (auto& [id, job] : jobs_) {
    if (IsTerminal(job->rec.state)) continue;
    std::vector<std::string> late;
    for (int i = 0; i < job->world_size(); ++i) {
      Rank& r = job->ranks[static_cast<size_t>(i)];
      if (r.worker_id.empty() || !Live(r.state)) continue;
      if (r.open_streams > 0) r.last_seen = now;  // a dead process's connection closes
      if (now - r.last_seen <= options_.liveness_timeout) continue;
      late.push_back(absl::StrCat(
          "rank ", i, " (worker ", r.worker_id, ", unseen for ",
          absl::FormatDuration(absl::Trunc(now - r.last_seen, absl::Milliseconds(100))), ")"));
      SetWorkerState(*job, r, WorkerState::kLost).IgnoreError();  // EndJob reports a store error
    }
    if (late.empty()) continue;
    absl::Status s =
        EndJob(*job, JobState::kFailed,
               absl::StrCat(absl::StrJoin(late, ", "), " missed the liveness deadline of ",
                            absl::FormatDuration(options_.liveness_timeout)),
               WorkerState::kDone);
    (void)s;  // a store failure leaves the job live; the next check tries again
  }
}

}  // namespace latchkey
