// Coordinator: construction, the notifier thread, the job registry, the state changes every
// call shares (start, end, publication, progress) and the JobService calls. The other files
// are one per concern: a rank's calls (coordinator_workers.cc) and progress reports
// (coordinator_reports.cc), recovery decisions (coordinator_attempts.cc), liveness and hang
// verdicts (coordinator_liveness.cc), restoring jobs on load (coordinator_load.cc). What each
// call changes is owned by the components of coordinator_internal.h.
#include "server/coordinator.h"

#include <algorithm>
#include <random>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/job_uid.h"
#include "common/status_macros.h"
#include "server/coordinator_internal.h"
#include "server/job_state_machine.h"
#include "server/security.h"

namespace latchkey {

absl::Status JobNotFound(const std::string& job_id) {
  return absl::NotFoundError(absl::StrCat(job_id, ": no such job"));
}
absl::Status Unavailable() { return absl::UnavailableError("coordinator is shutting down"); }

namespace {

std::string RandomToken() {
  std::random_device rd;  // /dev/urandom
  std::string out;
  for (int i = 0; i < 4; ++i) absl::StrAppend(&out, absl::Hex(rd(), absl::kZeroPad8));
  return out;
}

// A client-chosen job id: a DNS label (it names Kubernetes objects), never job-<digits>.
absl::Status CheckClientJobId(const std::string& id) {
  bool ok = !id.empty() && id.size() <= 63 && id.front() != '-' && id.back() != '-';
  for (char c : id) ok = ok && ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-');
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("job_id: '", id,
                     "' is not a DNS label (1-63 of a-z, 0-9 and '-', starting and ending "
                     "with a letter or digit)"));
  }
  if (id.size() > 4 && id.compare(0, 4, "job-") == 0 &&
      id.find_first_not_of("0123456789", 4) == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("job_id: '", id, "' has the form job-<digits> of the coordinator's own ids"));
  }
  return absl::OkStatus();
}

// 64 hex digits, returned lowercase (how Join compares them).
absl::StatusOr<std::string> CheckTokenHash(const std::string& hex) {
  std::string out = absl::AsciiStrToLower(hex);
  if (out.size() != 64 || out.find_first_not_of("0123456789abcdef") != std::string::npos) {
    return absl::InvalidArgumentError(
        "join_token_sha256: must be 64 hex digits (the SHA-256 of the join token)");
  }
  return out;
}

// The first field in which a repeated submit of `rec`'s job id asks for something else; "" if
// it is the same request.
std::string DifferingField(const JobRecord& rec, const std::string& spec_json,
                           const JobSubmission& args, const std::string& token_hash) {
  if (rec.spec_json != spec_json) return "spec_json";
  if (rec.base_dir != args.base_dir) return "base_dir";
  if (!token_hash.empty() && rec.join_token != token_hash) return "join_token_sha256";
  if ((rec.rendezvous_host_fixed ? rec.rendezvous_host : "") != args.rendezvous_host) {
    return "rendezvous_host";
  }
  if (args.rendezvous_port > 0 && rec.rendezvous_port != args.rendezvous_port) {
    return "rendezvous_port";
  }
  return "";
}

}  // namespace

Coordinator::Coordinator(std::unique_ptr<JobStore> store, CoordinatorOptions options,
                         CoordinatorObserver* observer)
    : options_(std::move(options)),
      clock_(options_.clock ? options_.clock : RealClock()),
      observer_(observer),
      store_(std::move(store)),
      audit_reader_(store_->audit_reader()),
      machine_(std::make_unique<JobStateMachine>(store_.get(), observer_, &options_.log, clock_)) {}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(std::unique_ptr<JobStore> store,
                                                                 CoordinatorOptions options,
                                                                 CoordinatorObserver* observer) {
  if (options.latch_lookahead < 0) {
    return absl::InvalidArgumentError("latch_lookahead: must be >= 0");
  }
  if (options.liveness_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("liveness_timeout: must be > 0");
  }
  if (options.rendezvous_port_first < 1 || options.rendezvous_port_last > 65535 ||
      options.rendezvous_port_first > options.rendezvous_port_last) {
    return absl::InvalidArgumentError("rendezvous_ports: need 1 <= first <= last <= 65535");
  }
  std::unique_ptr<Coordinator> c(new Coordinator(std::move(store), std::move(options), observer));
  {
    absl::MutexLock lock(&c->mu_);
    LK_RETURN_IF_ERROR(c->Load());
    for (auto& [id, job] : c->jobs_) c->CountLive(*job);
  }
  Coordinator* raw = c.get();
  c->notifier_ = std::thread([raw] { raw->NotifierLoop(); });
  c->committer_ = std::thread([raw] { raw->CommitterLoop(); });
  return c;
}

Coordinator::~Coordinator() { Shutdown(); }

void Coordinator::Shutdown() {
  {
    absl::MutexLock lock(&liveness_mu_);
    liveness_stop_ = true;
    liveness_cv_.SignalAll();
  }
  if (liveness_thread_.joinable()) liveness_thread_.join();
  {
    absl::MutexLock lock(&mu_);
    if (!shutdown_) {
      shutdown_ = true;
      // Every waiter and stream looks again, sees UNAVAILABLE and ends.
      for (auto& [id, job] : jobs_) Touch(*job);
    }
    notifier_stop_ = true;
    notify_cv_.Signal();
    committer_stop_ = true;
    commit_cv_.Signal();
  }
  if (notifier_.joinable()) notifier_.join();
  if (committer_.joinable()) committer_.join();  // it commits what is staged first
}

void Coordinator::NotifierLoop() {
  while (true) {
    std::vector<std::shared_ptr<JobListener>> batch;
    {
      absl::MutexLock lock(&mu_);
      while (dirty_jobs_.empty() && !notifier_stop_) notify_cv_.Wait(&mu_);
      if (dirty_jobs_.empty()) return;  // stopping, and nothing left to tell
      for (const std::string& id : dirty_jobs_) {
        auto it = jobs_.find(id);
        if (it == jobs_.end()) continue;
        it->second->dirty = false;
        for (const auto& [lid, listener] : it->second->listeners) batch.push_back(listener);
      }
      dirty_jobs_.clear();
    }
    // Outside the lock: listeners call back into the coordinator (PollLatches).
    for (const auto& listener : batch) listener->OnJobChanged();
  }
}

absl::StatusOr<Coordinator::Job*> Coordinator::FindJob(const std::string& job_id) {
  if (shutdown_) return Unavailable();
  if (job_id.empty()) return absl::InvalidArgumentError("job_id: required");
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return JobNotFound(job_id);
  return it->second.get();
}

void Coordinator::CountLive(Job& job) {
  // An ended job's ranks count until their streams closed: they still hold calls (a last
  // heartbeat, the stream that carries JobEnded) that the per-peer cap must not refuse.
  const bool live = !IsTerminal(job.rec.state) || !job.listeners.empty();
  if (live == job.counted_live) return;
  job.counted_live = live;
  live_ranks_.fetch_add(live ? job.spec.world_size : -job.spec.world_size);
}

void Coordinator::Touch(Job& job) {
  CountLive(job);
  job.version++;
  job.cv.SignalAll();
  if (!job.listeners.empty() && !job.dirty) {
    job.dirty = true;
    dirty_jobs_.push_back(job.rec.job_id);
    notify_cv_.Signal();
  }
}

JobEventRecord Coordinator::Event(const Job& job, const std::string& kind,
                                  const std::string& message) const {
  JobEventRecord e;
  e.job_id = job.rec.job_id;
  e.time = clock_->Now();
  e.attempt = job.attempts.attempt();
  e.kind = kind;
  e.message = message;
  return e;
}

void Coordinator::RecordEvent(const Job& job, const std::string& kind, const std::string& message) {
  Log(absl::StrCat(job.rec.job_id, ": ", message));
  if (absl::Status stored = store_->AppendEvent(Event(job, kind, message)); !stored.ok()) {
    Log(absl::StrCat(job.rec.job_id, ": cannot record the ", kind, " event: ", stored.message()));
  }
}

JobView Coordinator::View(const Job& job, bool with_workers) const {
  const RankGrid& grid = job.ranks.grid();
  const AttemptLayout& layout = job.attempts.layout();
  JobView v;
  v.record = job.rec;
  v.record.join_token.clear();
  v.world_size = layout.world_size;
  v.tp = layout.tp;
  v.dp = layout.dp;
  v.steps = job.spec.steps;
  v.workers_joined = job.ranks.joined();
  v.steps_completed = job.steps_completed;
  v.last_step = job.steps.Last();
  v.last_eval = job.steps.LastEval();
  v.max_restarts = job.spec.max_restarts;
  v.slowest.assign(job.arrivals.slowest().begin(), job.arrivals.slowest().end());
  for (const StragglerTracker::Named& n : job.stragglers.named()) {
    v.stragglers.push_back({n.rank, job.ranks.at(n.rank).host, n.slowdown, n.since_step});
  }
  v.replica_micro_batches = job.last_split;
  v.spec_world_size = job.attempts.spec_layout().world_size;
  for (const AttemptLog::Attempt& a : job.attempts.history()) {
    v.attempts.push_back({a.number, a.layout.world_size, a.layout.tp, a.layout.dp,
                          a.layout.gradient_accumulation_steps, a.resume_step, a.cause});
  }
  if (with_workers) {
    for (int i = 0; i < grid.world_size; ++i) {
      const RankTable::Rank& r = job.ranks.at(i);
      if (r.worker_id.empty()) continue;
      JobWorkerInfo w;
      w.rank = i;
      w.worker_id = r.worker_id;
      w.state = r.state;
      w.tp_rank = grid.tp_rank(i);
      w.dp_rank = grid.dp_rank(i);
      w.host = r.host;
      w.last_seen = r.last_seen;
      w.steps_reported = r.steps_reported;
      v.workers.push_back(std::move(w));
    }
  }
  return v;
}

absl::Status Coordinator::StartJob(Job& job) {
  absl::Status s = machine_->Start(job.rec, job.ranks);
  Touch(job);
  LK_RETURN_IF_ERROR(s);
  return Publish(job);
}

absl::Status Coordinator::EndJob(Job& job, JobState state, const std::string& reason,
                                 WorkerState worker_state, const JobEventRecord* event) {
  const int stalled = static_cast<int>(job.rec.stalled.size());
  job.stop.reset();
  absl::Status s = machine_->End(job.rec, job.ranks, state, reason, worker_state, event);
  Touch(job);
  LK_RETURN_IF_ERROR(s);
  if (observer_ && stalled > 0) observer_->AddStalledRanks(-stalled);  // live jobs' verdicts only
  if (observer_) observer_->RankSlowdowns(job.rec.job_id, {});         // live jobs' gauges only
  // Ended jobs serve no stream: their latches are read from the store if ever asked for.
  job.latches.ForgetAll();
  job.steps.DropPartial();
  return absl::OkStatus();
}

absl::Status Coordinator::SetWorkerState(Job& job, int rank, WorkerState state) {
  absl::Status s = machine_->SetWorkerState(job.rec.job_id, job.ranks, rank, state);
  Touch(job);
  return s;
}

absl::Status Coordinator::Publish(Job& job) {
  if (job.rec.state != JobState::kRunning) return absl::OkStatus();
  int64_t frontier =
      std::min<int64_t>(job.spec.steps, job.steps_completed + 1 + options_.latch_lookahead);
  if (job.stop) frontier = std::min(frontier, job.stop->before_window);  // coordinator_stop.cc
  LatchLog::SplitFn split;
  if (job.spec.stragglers.rebalance) {
    split = [&job](const Latch& l) { return job.stragglers.SplitFor(l.n); };
  }
  LK_ASSIGN_OR_RETURN(
      std::vector<PublishedLatch> published,
      job.latches.Publish(*store_, job.spec, job.rec.policy, frontier, clock_->Now(), split));
  if (published.empty()) return absl::OkStatus();
  NoteSplits(job, published);
  job.rec.next_window = job.latches.next_window();
  job.rec.next_first_micro_batch = job.latches.next_first_micro_batch();
  job.rec.next_first_sample = job.latches.next_first_sample();
  if (observer_) {
    for (const PublishedLatch& p : published) observer_->LatchPublished(p.latch.kv_mode);
  }
  Touch(job);
  return absl::OkStatus();
}

absl::Status Coordinator::Advance(Job& job) {
  LK_RETURN_IF_ERROR(ClearStalled(job));
  const int64_t completed = std::max(job.steps_completed, job.ranks.StepsCompleted());
  if (completed != job.steps_completed) {
    job.steps_completed = completed;
    Touch(job);
    // Keep a few windows behind the slowest rank in memory; a long job's older latches are
    // served from the store.
    constexpr int64_t kKeptBehind = 16;
    job.latches.ForgetBefore(job.steps_completed - kKeptBehind);
  }
  if (job.rec.state == JobState::kRunning && job.ranks.all_joined() &&
      job.ranks.StepsCompleted() >= job.spec.steps) {
    return EndJob(job, JobState::kSucceeded, "", WorkerState::kDone);
  }
  return Publish(job);
}

int Coordinator::PickRendezvousPort() const {
  std::set<int> used;
  for (const auto& [id, job] : jobs_) {
    if (!IsTerminal(job->rec.state)) used.insert(job->rec.rendezvous_port);
  }
  for (int p = options_.rendezvous_port_first; p <= options_.rendezvous_port_last; ++p) {
    if (!used.count(p)) return p;
  }
  return 0;
}

absl::StatusOr<SubmitResult> Coordinator::SubmitJob(const JobSubmission& args,
                                                    const std::string& submitter) {
  if (args.spec_json.size() > options_.max_spec_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("spec_json: ", args.spec_json.size(),
                                                   " bytes exceeds the limit of ",
                                                   options_.max_spec_bytes));
  }
  if (args.rendezvous_port < 0 || args.rendezvous_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous_port: ", args.rendezvous_port, " is not a port"));
  }
  // Parse outside the lock: it is pure and may take a while on a large spec.
  LK_ASSIGN_OR_RETURN(JobSpec spec, ParseJobSpec(args.spec_json, args.base_dir));
  LK_RETURN_IF_ERROR(CheckSpecLimits(spec, options_.spec_limits));
  if (!args.job_id.empty()) LK_RETURN_IF_ERROR(CheckClientJobId(args.job_id));
  std::string token_hash;
  if (!args.join_token_sha256.empty()) {
    LK_ASSIGN_OR_RETURN(token_hash, CheckTokenHash(args.join_token_sha256));
  }
  std::string spec_json = JobSpecToJson(spec);

  absl::MutexLock lock(&mu_);
  if (shutdown_) return Unavailable();
  if (auto it = jobs_.find(args.job_id); !args.job_id.empty() && it != jobs_.end()) {
    const std::string field = DifferingField(it->second->rec, spec_json, args, token_hash);
    if (!field.empty()) {
      return absl::AlreadyExistsError(absl::StrCat(
          "job_id: '", args.job_id, "' exists with a different ", field, "; choose another id"));
    }
    SubmitResult same;
    same.job = View(*it->second, false);
    same.already_submitted = true;
    return same;
  }
  const absl::Time now = clock_->Now();
  JobRecord rec;
  rec.seq = last_seq_ + 1;
  rec.job_id = args.job_id.empty() ? absl::StrFormat("job-%06d", rec.seq) : args.job_id;
  rec.job_uid = NewJobUid();
  rec.state = JobState::kPending;
  rec.spec_json = std::move(spec_json);
  rec.base_dir = args.base_dir;
  const std::string join_token = token_hash.empty() ? RandomToken() : "";
  rec.join_token = token_hash.empty() ? Sha256Hex(join_token) : token_hash;
  rec.submitter = submitter;
  rec.rendezvous_host = args.rendezvous_host;
  rec.rendezvous_host_fixed = !args.rendezvous_host.empty();
  rec.rendezvous_port = args.rendezvous_port > 0 ? args.rendezvous_port : PickRendezvousPort();
  if (rec.rendezvous_port == 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "rendezvous_port: every port in ", options_.rendezvous_port_first, "-",
        options_.rendezvous_port_last, " is held by a live job; name one or widen the range"));
  }
  rec.policy = InitialPolicy(spec);
  rec.warnings = spec.warnings;
  rec.create_time = rec.update_time = now;
  LK_RETURN_IF_ERROR(store_->CreateJob(rec));
  last_seq_ = rec.seq;
  if (observer_) observer_->AddJobs(JobState::kPending, 1);
  Log(absl::StrCat(rec.job_id, ": submitted (world ", spec.world_size, ", tp ", spec.tp, ", steps ",
                   spec.steps, ", rendezvous port ", rec.rendezvous_port, ")"));
  const AttemptLayout layout = SpecLayout(spec);
  auto job = std::make_unique<Job>(std::move(rec), std::move(spec), layout, options_.recent_steps);
  SubmitResult out;
  out.join_token = join_token;
  out.job = View(*job, false);
  std::string id = job->rec.job_id;
  CountLive(*job);
  jobs_.emplace(std::move(id), std::move(job));
  return out;
}

absl::StatusOr<JobView> Coordinator::GetJob(const std::string& job_id, bool with_workers) {
  absl::MutexLock lock(&mu_);
  LK_ASSIGN_OR_RETURN(Job * job, FindJob(job_id));
  return View(*job, with_workers);
}

absl::StatusOr<JobSnapshot> Coordinator::Snapshot(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  LK_ASSIGN_OR_RETURN(Job * job, FindJob(job_id));
  return JobSnapshot{View(*job, /*with_workers=*/true), job->steps.After(-1)};
}

int Coordinator::LiveRanks() const { return live_ranks_.load(std::memory_order_relaxed); }

absl::StatusOr<std::vector<JobView>> Coordinator::ListJobs(const std::vector<JobState>& states,
                                                           int limit) {
  if (limit < 0) return absl::InvalidArgumentError("page_size: must be >= 0");
  if (limit == 0) limit = 100;
  limit = std::min(limit, 1000);
  absl::MutexLock lock(&mu_);
  if (shutdown_) return Unavailable();
  std::vector<const Job*> match;
  for (const auto& [id, job] : jobs_) {
    if (states.empty() || std::find(states.begin(), states.end(), job->rec.state) != states.end()) {
      match.push_back(job.get());
    }
  }
  std::sort(match.begin(), match.end(),
            [](const Job* a, const Job* b) { return a->rec.seq > b->rec.seq; });
  if (match.size() > static_cast<size_t>(limit)) match.resize(static_cast<size_t>(limit));
  std::vector<JobView> out;
  for (const Job* j : match) out.push_back(View(*j, false));
  return out;
}

absl::StatusOr<JobView> Coordinator::CancelJob(const std::string& job_id,
                                               const std::string& reason) {
  absl::MutexLock lock(&mu_);
  LK_ASSIGN_OR_RETURN(Job * job, FindJob(job_id));
  if (IsTerminal(job->rec.state)) {
    return absl::FailedPreconditionError(
        absl::StrCat(job_id, ": already ended (", JobStateName(job->rec.state), ")"));
  }
  const std::string why = reason.empty() ? "cancelled by user" : reason;
  // The audit records who ended the job, as it records recoveries and stalls.
  const JobEventRecord event = Event(*job, "cancel", why);
  LK_RETURN_IF_ERROR(EndJob(*job, JobState::kCancelled, why, WorkerState::kDone, &event));
  return View(*job, true);
}

absl::StatusOr<JobPolicyUpdateResult> Coordinator::UpdateJobPolicy(const JobPolicyUpdate& update) {
  absl::MutexLock lock(&mu_);
  LK_ASSIGN_OR_RETURN(Job * found, FindJob(update.job_id));
  Job& j = *found;
  if (!update.kv_reduce && !update.gradient_accumulation_steps) {
    return absl::InvalidArgumentError(
        "kv_reduce, gradient_accumulation_steps: nothing to update (set at least one)");
  }
  if (update.gradient_accumulation_steps) {
    if (*update.gradient_accumulation_steps < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gradient_accumulation_steps: ", *update.gradient_accumulation_steps, " must be >= 1"));
    }
    if (!j.spec.managed_gradient_accumulation) {
      return absl::InvalidArgumentError(
          "gradient_accumulation_steps: the job's windows come from latchkey.window_schedule "
          "(managed_gradient_accumulation is false)");
    }
  }
  if (IsTerminal(j.rec.state)) {
    return absl::FailedPreconditionError(
        absl::StrCat(update.job_id, ": already ended (", JobStateName(j.rec.state), ")"));
  }
  if (update.expected_generation && *update.expected_generation != j.rec.policy.generation) {
    return absl::AbortedError(absl::StrCat("expected_generation: ", *update.expected_generation,
                                           " is stale; the policy is at generation ",
                                           j.rec.policy.generation));
  }
  PolicyChangeRecord change;
  change.job_id = j.rec.job_id;
  change.policy = j.rec.policy;  // the no_sync mask carries over
  if (update.kv_reduce) change.policy.kv_reduce = *update.kv_reduce;
  if (update.gradient_accumulation_steps) {
    change.policy.gradient_accumulation_steps = *update.gradient_accumulation_steps;
  }
  change.policy.generation++;
  change.first_window = j.latches.next_window();  // published windows never change
  change.change_time = clock_->Now();
  LK_RETURN_IF_ERROR(store_->AppendPolicyChange(change));
  j.rec.policy = change.policy;
  j.rec.update_time = change.change_time;
  Log(absl::StrCat(j.rec.job_id, ": policy generation ", change.policy.generation,
                   " (kv_reduce=", KvReducePolicyName(change.policy.kv_reduce),
                   ", gas=", change.policy.gradient_accumulation_steps, ") from window ",
                   change.first_window));
  Touch(j);
  return JobPolicyUpdateResult{change.policy, change.first_window};
}

absl::StatusOr<JobWatchUpdate> Coordinator::WaitJobChange(const std::string& job_id,
                                                          uint64_t after_version,
                                                          int64_t after_step, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  while (true) {
    LK_ASSIGN_OR_RETURN(Job * j, FindJob(job_id));
    if (j->version > after_version) {
      JobWatchUpdate out;
      out.version = j->version;
      out.job = View(*j, false);
      out.steps = j->steps.After(after_step);
      return out;
    }
    if (absl::Now() >= deadline) return absl::DeadlineExceededError("no change");
    j->cv.WaitWithDeadline(&mu_, deadline);
  }
}

// The status page must not make RPCs wait while it reads the disk. The lock guards the registry
// only for the lookup; the read goes to the AuditReader's own connection, so a commit made after
// the lookup may or may not be in it, just as a later call of ListLatches may see it.
absl::StatusOr<LatchAudit> Coordinator::ReadAudit(const std::string& job_id, int64_t start_window,
                                                  int limit) {
  if (audit_reader_ == nullptr) return ListLatches(job_id, start_window, limit);
  if (start_window < 0) return absl::InvalidArgumentError("start_window: must be >= 0");
  if (limit < 0) return absl::InvalidArgumentError("page_size: must be >= 0");
  if (limit == 0) limit = 1000;
  limit = std::min(limit, 10000);
  {
    absl::MutexLock lock(&mu_);
    LK_RETURN_IF_ERROR(FindJob(job_id).status());
  }
  LK_ASSIGN_OR_RETURN(AuditRows rows, audit_reader_->ReadAudit(job_id, start_window, limit + 1));
  LatchAudit out;
  out.latches = std::move(rows.latches);
  if (out.latches.size() > static_cast<size_t>(limit)) {
    out.latches.resize(static_cast<size_t>(limit));
    out.next_start_window = out.latches.back().latch.window + 1;
  }
  out.policy_changes = std::move(rows.policy_changes);
  out.events = std::move(rows.events);
  return out;
}

absl::StatusOr<LatchAudit> Coordinator::ListLatches(const std::string& job_id, int64_t start_window,
                                                    int limit) {
  if (start_window < 0) return absl::InvalidArgumentError("start_window: must be >= 0");
  if (limit < 0) return absl::InvalidArgumentError("page_size: must be >= 0");
  if (limit == 0) limit = 1000;
  limit = std::min(limit, 10000);
  absl::MutexLock lock(&mu_);
  LK_RETURN_IF_ERROR(FindJob(job_id).status());
  LatchAudit out;
  // The audit is read from the store: it is what survives a restart.
  LK_ASSIGN_OR_RETURN(out.latches, store_->LoadLatches(job_id, start_window, limit + 1));
  if (out.latches.size() > static_cast<size_t>(limit)) {
    out.latches.resize(static_cast<size_t>(limit));
    out.next_start_window = out.latches.back().latch.window + 1;
  }
  LK_ASSIGN_OR_RETURN(out.policy_changes, store_->LoadPolicyChanges(job_id));
  LK_ASSIGN_OR_RETURN(out.events, store_->LoadEvents(job_id));
  return out;
}

}  // namespace latchkey
