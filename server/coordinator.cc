// Coordinator: construction, loading from the store, and the JobService half.
// The WorkerService half, latch publication and liveness are in coordinator_workers.cc.
#include "server/coordinator.h"

#include <algorithm>
#include <limits>
#include <random>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/coordinator_internal.h"

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

}  // namespace

Coordinator::Coordinator(std::unique_ptr<JobStore> store, CoordinatorOptions options,
                         CoordinatorObserver* observer)
    : options_(std::move(options)), observer_(observer), store_(std::move(store)) {}

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
    absl::Status s = c->Load();
    if (!s.ok()) return s;
  }
  Coordinator* raw = c.get();
  c->notifier_ = std::thread([raw] { raw->NotifierLoop(); });
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
  }
  if (notifier_.joinable()) notifier_.join();
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

void Coordinator::StartLivenessChecker() {
  if (liveness_thread_.joinable()) return;
  const absl::Duration period =
      std::min(absl::Seconds(1), std::max(absl::Milliseconds(10), options_.liveness_timeout / 4));
  liveness_thread_ = std::thread([this, period] {
    absl::MutexLock lock(&liveness_mu_);
    while (!liveness_stop_) {
      liveness_cv_.WaitWithTimeout(&liveness_mu_, period);
      if (liveness_stop_) break;
      liveness_mu_.Unlock();
      CheckLiveness();
      liveness_mu_.Lock();
    }
  });
}

absl::Status Coordinator::Load() {
  auto jobs = store_->LoadJobs();
  if (!jobs.ok()) return jobs.status();
  auto workers = store_->LoadWorkers();
  if (!workers.ok()) return workers.status();
  auto progress = store_->LoadProgress();
  if (!progress.ok()) return progress.status();
  const absl::Time now = absl::Now();

  std::vector<std::pair<Job*, std::string>> unparsable;
  for (JobRecord& rec : *jobs) {
    auto job = std::make_unique<Job>();
    auto spec = ParseJobSpec(rec.spec_json, rec.base_dir);
    if (spec.ok()) {
      job->spec = *std::move(spec);
    } else {
      // A spec this build no longer accepts: the job cannot run on; keep it, failed.
      job->spec.world_size = 1;
      unparsable.emplace_back(
          job.get(), absl::StrCat("stored spec no longer valid: ", spec.status().message()));
    }
    job->ranks.resize(static_cast<size_t>(std::max(1, job->spec.world_size)));
    last_seq_ = std::max(last_seq_, rec.seq);
    job->rec = std::move(rec);
    job->latch_base = job->rec.next_window;
    if (observer_) observer_->AddJobs(job->rec.state, 1);
    std::string id = job->rec.job_id;
    jobs_.emplace(std::move(id), std::move(job));
  }
  for (const WorkerRecord& w : *workers) {
    auto it = jobs_.find(w.job_id);
    if (it == jobs_.end() || w.rank < 0 || w.rank >= it->second->world_size()) continue;
    Rank& r = it->second->ranks[static_cast<size_t>(w.rank)];
    r.worker_id = w.worker_id;
    r.host = w.host;
    r.state = w.state;
    r.join_time = w.join_time;
    r.last_seen = now;
    it->second->joined++;
    if (observer_) observer_->AddWorkers(w.state, 1);
  }
  for (const RankProgress& p : *progress) {
    auto it = jobs_.find(p.job_id);
    if (it == jobs_.end() || p.rank < 0 || p.rank >= it->second->world_size()) continue;
    it->second->ranks[static_cast<size_t>(p.rank)].steps_reported = p.max_step + 1;
  }
  for (auto& [job, reason] : unparsable) {
    if (!IsTerminal(job->rec.state)) {
      absl::Status s = EndJob(*job, JobState::kFailed, reason, WorkerState::kDone);
      if (!s.ok()) return s;
    }
  }
  for (auto& [id, job] : jobs_) {
    absl::Status s = LoadJobSteps(*job);
    if (!s.ok()) return s;
    if (IsTerminal(job->rec.state)) continue;
    auto latches = store_->LoadLatches(id, 0, std::numeric_limits<int64_t>::max());
    if (!latches.ok()) return latches.status();
    if (static_cast<int64_t>(latches->size()) != job->rec.next_window) {
      return absl::DataLossError(absl::StrCat(
          id, ": ", latches->size(), " latches stored but next_window is ", job->rec.next_window));
    }
    job->latches.assign(std::make_move_iterator(latches->begin()),
                        std::make_move_iterator(latches->end()));
    job->latch_base = 0;
    // Finish what a crash may have interrupted between two writes.
    if (job->rec.state == JobState::kPending && job->joined == job->world_size()) {
      s = SetJobState(*job, JobState::kRunning, "");
      for (Rank& r : job->ranks) {
        if (s.ok()) s = SetWorkerState(*job, r, WorkerState::kActive);
      }
    }
    if (s.ok()) s = RecomputeProgress(*job);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status Coordinator::LoadJobSteps(Job& job) {
  job.steps_completed = 0;
  if (job.joined == job.world_size()) {
    job.steps_completed = std::numeric_limits<int64_t>::max();
    for (const Rank& r : job.ranks)
      job.steps_completed = std::min(job.steps_completed, r.steps_reported);
  }
  auto reports =
      store_->LoadStepReports(job.rec.job_id, std::max<int64_t>(0, job.steps_completed - 1));
  if (!reports.ok()) return reports.status();
  for (const StepReportRecord& r : *reports) AddStepReport(job, r);
  return absl::OkStatus();
}

absl::StatusOr<Coordinator::Job*> Coordinator::FindJob(const std::string& job_id) {
  if (shutdown_) return Unavailable();
  if (job_id.empty()) return absl::InvalidArgumentError("job_id: required");
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return JobNotFound(job_id);
  return it->second.get();
}

void Coordinator::Touch(Job& job) {
  job.version++;
  job.cv.SignalAll();
  if (!job.listeners.empty() && !job.dirty) {
    job.dirty = true;
    dirty_jobs_.push_back(job.rec.job_id);
    notify_cv_.Signal();
  }
}

JobView Coordinator::View(const Job& job, bool with_workers) const {
  JobView v;
  v.record = job.rec;
  v.record.join_token.clear();
  v.world_size = job.world_size();
  v.tp = job.spec.tp;
  v.dp = job.spec.tp > 0 ? job.world_size() / job.spec.tp : 0;
  v.steps = job.spec.steps;
  v.workers_joined = job.joined;
  v.steps_completed = job.steps_completed;
  if (!job.recent.empty()) v.last_step = job.recent.rbegin()->second;
  if (with_workers) {
    for (int i = 0; i < job.world_size(); ++i) {
      const Rank& r = job.ranks[static_cast<size_t>(i)];
      if (r.worker_id.empty()) continue;
      WorkerView w;
      w.rank = i;
      w.worker_id = r.worker_id;
      w.state = r.state;
      w.tp_rank = i % std::max(1, job.spec.tp);
      w.dp_rank = i / std::max(1, job.spec.tp);
      w.host = r.host;
      w.last_seen = r.last_seen;
      w.steps_reported = r.steps_reported;
      v.workers.push_back(std::move(w));
    }
  }
  return v;
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

absl::StatusOr<SubmitResult> Coordinator::SubmitJob(const SubmitArgs& args) {
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
  auto spec = ParseJobSpec(args.spec_json, args.base_dir);
  if (!spec.ok()) return spec.status();
  if (spec->world_size > options_.max_world_size) {
    return absl::InvalidArgumentError(absl::StrCat("latchkey.world_size: ", spec->world_size,
                                                   " exceeds the coordinator's limit of ",
                                                   options_.max_world_size));
  }

  absl::MutexLock lock(&mu_);
  if (shutdown_) return Unavailable();
  const absl::Time now = absl::Now();
  auto job = std::make_unique<Job>();
  job->spec = *spec;
  job->ranks.resize(static_cast<size_t>(spec->world_size));
  JobRecord& rec = job->rec;
  rec.seq = last_seq_ + 1;
  rec.job_id = absl::StrFormat("job-%06d", rec.seq);
  rec.state = JobState::kPending;
  rec.spec_json = JobSpecToJson(*spec);
  rec.base_dir = args.base_dir;
  rec.join_token = RandomToken();
  rec.rendezvous_host = args.rendezvous_host;
  rec.rendezvous_host_fixed = !args.rendezvous_host.empty();
  rec.rendezvous_port = args.rendezvous_port > 0 ? args.rendezvous_port : PickRendezvousPort();
  if (rec.rendezvous_port == 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "rendezvous_port: every port in ", options_.rendezvous_port_first, "-",
        options_.rendezvous_port_last, " is held by a live job; name one or widen the range"));
  }
  rec.policy = InitialPolicy(*spec);
  rec.warnings = spec->warnings;
  rec.create_time = rec.update_time = now;
  absl::Status s = store_->CreateJob(rec);
  if (!s.ok()) return s;
  last_seq_ = rec.seq;
  if (observer_) observer_->AddJobs(JobState::kPending, 1);
  Log(absl::StrCat(rec.job_id, ": submitted (world ", spec->world_size, ", tp ", spec->tp,
                   ", steps ", spec->steps, ", rendezvous port ", rec.rendezvous_port, ")"));
  SubmitResult out;
  out.join_token = rec.join_token;
  out.job = View(*job, false);
  std::string id = rec.job_id;
  jobs_.emplace(std::move(id), std::move(job));
  return out;
}

absl::StatusOr<JobView> Coordinator::GetJob(const std::string& job_id, bool with_workers) {
  absl::MutexLock lock(&mu_);
  auto job = FindJob(job_id);
  if (!job.ok()) return job.status();
  return View(**job, with_workers);
}

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
  auto job = FindJob(job_id);
  if (!job.ok()) return job.status();
  Job& j = **job;
  if (IsTerminal(j.rec.state)) {
    return absl::FailedPreconditionError(
        absl::StrCat(job_id, ": already ended (", JobStateName(j.rec.state), ")"));
  }
  absl::Status s = EndJob(j, JobState::kCancelled, reason.empty() ? "cancelled by user" : reason,
                          WorkerState::kDone);
  if (!s.ok()) return s;
  return View(j, true);
}

absl::StatusOr<PolicyUpdateResult> Coordinator::UpdateJobPolicy(const PolicyUpdate& update) {
  absl::MutexLock lock(&mu_);
  auto job = FindJob(update.job_id);
  if (!job.ok()) return job.status();
  Job& j = **job;
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
  change.policy = j.rec.policy;
  if (update.kv_reduce) change.policy.kv_reduce = *update.kv_reduce;
  if (update.gradient_accumulation_steps) {
    change.policy.gradient_accumulation_steps = *update.gradient_accumulation_steps;
  }
  change.policy.generation++;
  change.first_window = j.rec.next_window;  // published windows never change
  change.change_time = absl::Now();
  absl::Status s = store_->AppendPolicyChange(change);
  if (!s.ok()) return s;
  j.rec.policy = change.policy;
  j.rec.update_time = change.change_time;
  Log(absl::StrCat(j.rec.job_id, ": policy generation ", change.policy.generation,
                   " (kv_reduce=", KvReducePolicyName(change.policy.kv_reduce),
                   ", gas=", change.policy.gradient_accumulation_steps, ") from window ",
                   change.first_window));
  Touch(j);
  return PolicyUpdateResult{change.policy, change.first_window};
}

absl::StatusOr<JobWatchUpdate> Coordinator::WaitJobChange(const std::string& job_id,
                                                          uint64_t after_version,
                                                          int64_t after_step, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  while (true) {
    auto job = FindJob(job_id);
    if (!job.ok()) return job.status();
    Job& j = **job;
    if (j.version > after_version) {
      JobWatchUpdate out;
      out.version = j.version;
      out.job = View(j, false);
      for (auto it = j.recent.upper_bound(after_step); it != j.recent.end(); ++it) {
        out.steps.push_back(it->second);
      }
      return out;
    }
    if (absl::Now() >= deadline) return absl::DeadlineExceededError("no change");
    j.cv.WaitWithDeadline(&mu_, deadline);
  }
}

absl::StatusOr<LatchAudit> Coordinator::ListLatches(const std::string& job_id, int64_t start_window,
                                                    int limit) {
  if (start_window < 0) return absl::InvalidArgumentError("start_window: must be >= 0");
  if (limit < 0) return absl::InvalidArgumentError("page_size: must be >= 0");
  if (limit == 0) limit = 1000;
  limit = std::min(limit, 10000);
  absl::MutexLock lock(&mu_);
  auto job = FindJob(job_id);
  if (!job.ok()) return job.status();
  LatchAudit out;
  // The audit is read from the store: it is what survives a restart.
  auto latches = store_->LoadLatches(job_id, start_window, limit + 1);
  if (!latches.ok()) return latches.status();
  out.latches = *std::move(latches);
  if (out.latches.size() > static_cast<size_t>(limit)) {
    out.latches.resize(static_cast<size_t>(limit));
    out.next_start_window = out.latches.back().latch.window + 1;
  }
  auto changes = store_->LoadPolicyChanges(job_id);
  if (!changes.ok()) return changes.status();
  out.policy_changes = *std::move(changes);
  return out;
}

}  // namespace latchkey
