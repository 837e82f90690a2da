// proto/wire.h: JobService's messages (jobs, their workers and steps, submissions, policy
// updates, the watch stream, the latch audit with its job events, stall verdicts and arrival
// lag).
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "proto/wire.h"

namespace latchkey {

// Inside namespace latchkey, v1 names latchkey::v1 (the generated code).

namespace {

// An unset time stays unset on the wire (and in proto JSON).
void SetTime(absl::Time t, google::protobuf::Timestamp* out) {
  if (t != absl::UnixEpoch()) *out = ToProtoTime(t);
}

}  // namespace

v1::StepSummary ToProto(const CompletedStep& step) {
  const StepReport& r = step.report;
  v1::StepSummary out;
  out.set_step(r.step);
  out.set_micro_batches(r.micro_batches);
  out.set_loss(r.loss);
  out.set_grad_norm(r.grad_norm);
  out.set_kv_mode(ToProto(r.kv_mode));
  out.set_kv_allreduce_calls(r.kv_allreduce_calls);
  out.set_replicated_allreduce_calls(r.replicated_allreduce_calls);
  out.set_step_seconds(r.step_seconds);
  out.set_tokens(r.tokens);
  out.set_ranks_reported(step.ranks_reported);
  out.set_lr(r.lr);
  if (r.eval_loss) out.mutable_eval_loss()->set_value(*r.eval_loss);
  out.set_peak_memory_bytes(r.peak_memory_bytes);
  return out;
}

CompletedStep FromProto(const v1::StepSummary& step) {
  CompletedStep out;
  StepReport& r = out.report;
  r.step = step.step();
  r.micro_batches = step.micro_batches();
  r.loss = step.loss();
  r.grad_norm = step.grad_norm();
  r.kv_mode = FromProto(step.kv_mode()).value_or(KvMode::kPerMicroBatch);
  r.kv_allreduce_calls = step.kv_allreduce_calls();
  r.replicated_allreduce_calls = step.replicated_allreduce_calls();
  r.step_seconds = step.step_seconds();
  r.tokens = step.tokens();
  r.lr = step.lr();
  if (step.has_eval_loss()) r.eval_loss = step.eval_loss().value();
  r.peak_memory_bytes = step.peak_memory_bytes();
  out.ranks_reported = step.ranks_reported();
  return out;
}

v1::WorkerInfo ToProto(const JobWorkerInfo& worker) {
  v1::WorkerInfo out;
  out.set_rank(worker.rank);
  out.set_worker_id(worker.worker_id);
  out.set_state(ToProto(worker.state));
  out.set_tp_rank(worker.tp_rank);
  out.set_dp_rank(worker.dp_rank);
  out.set_host(worker.host);
  SetTime(worker.last_seen, out.mutable_last_seen_time());
  out.set_steps_reported(worker.steps_reported);
  return out;
}

JobWorkerInfo FromProto(const v1::WorkerInfo& worker) {
  JobWorkerInfo out;
  out.rank = worker.rank();
  out.worker_id = worker.worker_id();
  out.state = FromProto(worker.state()).value_or(WorkerState::kJoined);
  out.tp_rank = worker.tp_rank();
  out.dp_rank = worker.dp_rank();
  out.host = worker.host();
  if (worker.has_last_seen_time()) out.last_seen = FromProtoTime(worker.last_seen_time());
  out.steps_reported = worker.steps_reported();
  return out;
}

v1::Job ToProto(const JobInfo& job) {
  v1::Job out;
  out.set_job_id(job.job_id);
  out.set_state(ToProto(job.state));
  out.set_spec_json(job.spec_json);
  out.set_base_dir(job.base_dir);
  out.set_world_size(job.world_size);
  out.set_tp(job.tp);
  out.set_dp(job.dp);
  out.set_steps(job.steps);
  *out.mutable_policy() = ToProto(job.policy);
  out.mutable_rendezvous()->set_host(job.rendezvous_host);
  out.mutable_rendezvous()->set_port(job.rendezvous_port);
  out.set_workers_joined(job.workers_joined);
  for (const JobWorkerInfo& w : job.workers) *out.add_workers() = ToProto(w);
  out.set_windows_published(job.windows_published);
  out.set_steps_completed(job.steps_completed);
  if (job.last_step) *out.mutable_last_step() = ToProto(*job.last_step);
  out.set_failure_reason(job.failure_reason);
  for (const std::string& w : job.warnings) out.add_warnings(w);
  SetTime(job.create_time, out.mutable_create_time());
  SetTime(job.update_time, out.mutable_update_time());
  out.set_attempt(job.attempt);
  out.set_restarts(job.restarts);
  out.set_max_restarts(job.max_restarts);
  out.set_last_checkpoint_step(job.last_checkpoint_step);
  out.set_resume_step(job.resume_step);
  out.set_last_recovery_reason(job.last_recovery_reason);
  for (const StalledRank& r : job.stalled) *out.add_stalled() = ToProto(r);
  out.set_determinism_violations(job.determinism_violations);
  for (const WindowArrival& a : job.slowest) *out.add_slowest() = ToProto(a);
  for (const StragglerInfo& s : job.stragglers) {
    v1::Straggler* p = out.add_stragglers();
    p->set_rank(s.rank);
    p->set_host(s.host);
    p->set_slowdown(s.slowdown);
    p->set_since_step(s.since_step);
  }
  for (int c : job.replica_micro_batches) out.add_replica_micro_batches(c);
  out.set_world(job.world);
  for (const AttemptSummary& a : job.attempts) {
    v1::AttemptInfo* p = out.add_attempts();
    p->set_attempt(a.attempt);
    p->set_world(a.world);
    p->set_tp(a.tp);
    p->set_dp(a.dp);
    p->set_gradient_accumulation_steps(a.gradient_accumulation_steps);
    p->set_resume_step(a.resume_step);
    p->set_cause(a.cause);
  }
  out.set_job_uid(job.job_uid);
  return out;
}

JobInfo FromProto(const v1::Job& job) {
  JobInfo out;
  out.job_id = job.job_id();
  out.state = FromProto(job.state()).value_or(JobState::kPending);
  out.spec_json = job.spec_json();
  out.base_dir = job.base_dir();
  out.world_size = job.world_size();
  out.tp = job.tp();
  out.dp = job.dp();
  out.steps = job.steps();
  out.policy = FromProto(job.policy());
  out.rendezvous_host = job.rendezvous().host();
  out.rendezvous_port = job.rendezvous().port();
  out.workers_joined = job.workers_joined();
  for (const v1::WorkerInfo& w : job.workers()) out.workers.push_back(FromProto(w));
  out.windows_published = job.windows_published();
  out.steps_completed = job.steps_completed();
  if (job.has_last_step()) out.last_step = FromProto(job.last_step());
  out.failure_reason = job.failure_reason();
  out.warnings.assign(job.warnings().begin(), job.warnings().end());
  if (job.has_create_time()) out.create_time = FromProtoTime(job.create_time());
  if (job.has_update_time()) out.update_time = FromProtoTime(job.update_time());
  out.attempt = job.attempt();
  out.restarts = job.restarts();
  out.max_restarts = job.max_restarts();
  out.last_checkpoint_step = job.last_checkpoint_step();
  out.resume_step = job.resume_step();
  out.last_recovery_reason = job.last_recovery_reason();
  for (const v1::StalledRank& r : job.stalled()) out.stalled.push_back(FromProto(r));
  out.determinism_violations = job.determinism_violations();
  for (const v1::WindowArrival& a : job.slowest()) out.slowest.push_back(FromProto(a));
  for (const v1::Straggler& s : job.stragglers()) {
    out.stragglers.push_back({s.rank(), s.host(), s.slowdown(), s.since_step()});
  }
  out.replica_micro_batches.assign(job.replica_micro_batches().begin(),
                                   job.replica_micro_batches().end());
  // A coordinator from before elastic recovery runs the spec's world in every attempt.
  out.world = job.world() > 0 ? job.world() : job.world_size();
  for (const v1::AttemptInfo& a : job.attempts()) {
    out.attempts.push_back({a.attempt(), a.world(), a.tp(), a.dp(), a.gradient_accumulation_steps(),
                            a.resume_step(), a.cause()});
  }
  out.job_uid = job.job_uid();
  return out;
}

v1::SubmitJobRequest ToProto(const JobSubmission& submission) {
  v1::SubmitJobRequest out;
  out.set_spec_json(submission.spec_json);
  out.set_base_dir(submission.base_dir);
  out.set_rendezvous_host(submission.rendezvous_host);
  out.set_rendezvous_port(submission.rendezvous_port);
  out.set_job_id(submission.job_id);
  out.set_join_token_sha256(submission.join_token_sha256);
  return out;
}

v1::SubmitJobResponse ToProto(const SubmittedJob& submitted) {
  v1::SubmitJobResponse out;
  out.set_job_id(submitted.job_id);
  out.set_join_token(submitted.join_token);
  *out.mutable_job() = ToProto(submitted.job);
  out.set_already_submitted(submitted.already_submitted);
  return out;
}

JobSubmission FromProto(const v1::SubmitJobRequest& submission) {
  JobSubmission out;
  out.spec_json = submission.spec_json();
  out.base_dir = submission.base_dir();
  out.rendezvous_host = submission.rendezvous_host();
  out.rendezvous_port = submission.rendezvous_port();
  out.job_id = submission.job_id();
  out.join_token_sha256 = submission.join_token_sha256();
  return out;
}

SubmittedJob FromProto(const v1::SubmitJobResponse& submitted) {
  SubmittedJob out;
  out.job_id = submitted.job_id();
  out.join_token = submitted.join_token();
  out.job = FromProto(submitted.job());
  out.already_submitted = submitted.already_submitted();
  return out;
}

v1::UpdateJobPolicyRequest ToProto(const JobPolicyUpdate& update) {
  v1::UpdateJobPolicyRequest out;
  out.set_job_id(update.job_id);
  if (update.kv_reduce) out.set_kv_reduce(ToProto(*update.kv_reduce));
  if (update.gradient_accumulation_steps) {
    out.mutable_gradient_accumulation_steps()->set_value(*update.gradient_accumulation_steps);
  }
  if (update.expected_generation) {
    out.mutable_expected_generation()->set_value(*update.expected_generation);
  }
  return out;
}

absl::StatusOr<JobPolicyUpdate> FromProto(const v1::UpdateJobPolicyRequest& update) {
  JobPolicyUpdate out;
  out.job_id = update.job_id();
  if (update.kv_reduce() != v1::KV_REDUCE_POLICY_UNSPECIFIED) {
    out.kv_reduce = FromProto(update.kv_reduce());
    if (!out.kv_reduce) {
      return absl::InvalidArgumentError("kv_reduce: " + std::to_string(update.kv_reduce()) +
                                        " is not a policy");
    }
  }
  if (update.has_gradient_accumulation_steps()) {
    out.gradient_accumulation_steps = update.gradient_accumulation_steps().value();
  }
  if (update.has_expected_generation()) {
    out.expected_generation = update.expected_generation().value();
  }
  return out;
}

v1::UpdateJobPolicyResponse ToProto(const JobPolicyUpdateResult& result) {
  v1::UpdateJobPolicyResponse out;
  *out.mutable_policy() = ToProto(result.policy);
  out.set_first_window(result.first_window);
  return out;
}

JobPolicyUpdateResult FromProto(const v1::UpdateJobPolicyResponse& result) {
  JobPolicyUpdateResult out;
  out.policy = FromProto(result.policy());
  out.first_window = result.first_window();
  return out;
}

v1::WatchJobResponse ToProto(const JobUpdate& update) {
  v1::WatchJobResponse out;
  *out.mutable_job() = ToProto(update.job);
  if (update.step) *out.mutable_step() = ToProto(*update.step);
  return out;
}

JobUpdate FromProto(const v1::WatchJobResponse& update) {
  JobUpdate out;
  out.job = FromProto(update.job());
  if (update.has_step()) out.step = FromProto(update.step());
  return out;
}

v1::ListLatchesResponse ToProto(const LatchAuditPage& page) {
  v1::ListLatchesResponse out;
  for (const AuditedLatch& l : page.latches) {
    v1::Latch* latch = out.add_latches();
    *latch = ToProto(l.latch);
    SetTime(l.publish_time, latch->mutable_publish_time());
  }
  for (const AuditedPolicyChange& c : page.policy_changes) {
    v1::PolicyChange* change = out.add_policy_changes();
    *change->mutable_policy() = ToProto(c.policy);
    change->set_first_window(c.first_window);
    SetTime(c.change_time, change->mutable_change_time());
  }
  for (const AuditedEvent& e : page.events) *out.add_events() = ToProto(e);
  out.set_next_start_window(page.next_start_window);
  return out;
}

LatchAuditPage FromProto(const v1::ListLatchesResponse& page) {
  LatchAuditPage out;
  for (const v1::Latch& l : page.latches()) {
    AuditedLatch a;
    a.latch = FromProto(l);
    if (l.has_publish_time()) a.publish_time = FromProtoTime(l.publish_time());
    out.latches.push_back(std::move(a));
  }
  for (const v1::PolicyChange& c : page.policy_changes()) {
    AuditedPolicyChange a;
    a.policy = FromProto(c.policy());
    a.first_window = c.first_window();
    if (c.has_change_time()) a.change_time = FromProtoTime(c.change_time());
    out.policy_changes.push_back(std::move(a));
  }
  for (const v1::JobEvent& e : page.events()) out.events.push_back(FromProto(e));
  out.next_start_window = page.next_start_window();
  return out;
}

v1::ListJobsResponse ToProto(const std::vector<JobInfo>& jobs) {
  v1::ListJobsResponse out;
  for (const JobInfo& j : jobs) *out.add_jobs() = ToProto(j);
  return out;
}

v1::GetJobRequest MakeGetJobRequest(const std::string& job_id) {
  v1::GetJobRequest out;
  out.set_job_id(job_id);
  return out;
}

v1::CancelJobRequest MakeCancelJobRequest(const std::string& job_id, const std::string& reason) {
  v1::CancelJobRequest out;
  out.set_job_id(job_id);
  out.set_reason(reason);
  return out;
}

v1::WatchJobRequest MakeWatchJobRequest(const std::string& job_id, bool replay_recent_steps) {
  v1::WatchJobRequest out;
  out.set_job_id(job_id);
  out.set_replay_recent_steps(replay_recent_steps);
  return out;
}

v1::ListLatchesRequest MakeListLatchesRequest(const std::string& job_id, int64_t start_window,
                                              int page_size) {
  v1::ListLatchesRequest out;
  out.set_job_id(job_id);
  out.set_start_window(start_window);
  out.set_page_size(page_size);
  return out;
}

v1::ListJobsRequest MakeListJobsRequest(const std::vector<JobState>& states, int page_size) {
  v1::ListJobsRequest out;
  for (JobState s : states) out.add_states(ToProto(s));
  out.set_page_size(page_size);
  return out;
}

absl::StatusOr<std::vector<JobState>> JobStatesOf(const v1::ListJobsRequest& request) {
  std::vector<JobState> states;
  for (int s : request.states()) {
    std::optional<JobState> state =
        v1::JobState_IsValid(s) ? FromProto(static_cast<v1::JobState>(s)) : std::nullopt;
    if (!state) {
      return absl::InvalidArgumentError("states: " + std::to_string(s) + " is not a job state");
    }
    states.push_back(*state);
  }
  return states;
}

v1::StalledRank ToProto(const StalledRank& s) {
  v1::StalledRank out;
  out.set_rank(s.rank);
  out.set_window(s.window);
  out.set_micro_batch(s.micro_batch);
  out.set_where(s.where);
  out.set_seconds(s.seconds);
  out.set_attempt(s.attempt);
  return out;
}

StalledRank FromProto(const v1::StalledRank& s) {
  StalledRank out;
  out.rank = s.rank();
  out.window = s.window();
  out.micro_batch = s.micro_batch();
  out.where = s.where();
  out.seconds = s.seconds();
  out.attempt = s.attempt();
  return out;
}

v1::WindowArrival ToProto(const WindowArrival& a) {
  v1::WindowArrival out;
  out.set_window(a.window);
  out.set_slowest_rank(a.slowest_rank);
  out.set_lag_seconds(a.lag_seconds);
  return out;
}

WindowArrival FromProto(const v1::WindowArrival& a) {
  WindowArrival out;
  out.window = a.window();
  out.slowest_rank = a.slowest_rank();
  out.lag_seconds = a.lag_seconds();
  return out;
}

v1::JobEvent ToProto(const AuditedEvent& e) {
  v1::JobEvent out;
  if (e.time != absl::UnixEpoch()) *out.mutable_time() = ToProtoTime(e.time);
  out.set_attempt(e.attempt);
  out.set_kind(e.kind);
  out.set_message(e.message);
  return out;
}

AuditedEvent FromProto(const v1::JobEvent& e) {
  AuditedEvent out;
  if (e.has_time()) out.time = FromProtoTime(e.time());
  out.attempt = e.attempt();
  out.kind = e.kind();
  out.message = e.message();
  return out;
}

}  // namespace latchkey
