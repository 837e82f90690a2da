#include "proto/wire.h"

#include <utility>

namespace latchkey {

// Inside namespace latchkey, v1 names latchkey::v1 (the generated code).

v1::KvMode ToProto(KvMode mode) {
  switch (mode) {
    case KvMode::kPerMicroBatch:
      return v1::KV_MODE_PER_MICRO_BATCH;
    case KvMode::kDeferred:
      return v1::KV_MODE_DEFERRED;
    case KvMode::kCoalesced:
      return v1::KV_MODE_COALESCED;
  }
  return v1::KV_MODE_UNSPECIFIED;
}

std::optional<KvMode> FromProto(v1::KvMode mode) {
  switch (mode) {
    case v1::KV_MODE_PER_MICRO_BATCH:
      return KvMode::kPerMicroBatch;
    case v1::KV_MODE_DEFERRED:
      return KvMode::kDeferred;
    case v1::KV_MODE_COALESCED:
      return KvMode::kCoalesced;
    default:
      return std::nullopt;
  }
}

v1::KvReducePolicy ToProto(KvReducePolicy policy) {
  switch (policy) {
    case KvReducePolicy::kAuto:
      return v1::KV_REDUCE_POLICY_AUTO;
    case KvReducePolicy::kPerMicroBatch:
      return v1::KV_REDUCE_POLICY_PER_MICRO_BATCH;
    case KvReducePolicy::kDeferred:
      return v1::KV_REDUCE_POLICY_DEFERRED;
    case KvReducePolicy::kCoalesced:
      return v1::KV_REDUCE_POLICY_COALESCED;
  }
  return v1::KV_REDUCE_POLICY_UNSPECIFIED;
}

std::optional<KvReducePolicy> FromProto(v1::KvReducePolicy policy) {
  switch (policy) {
    case v1::KV_REDUCE_POLICY_AUTO:
      return KvReducePolicy::kAuto;
    case v1::KV_REDUCE_POLICY_PER_MICRO_BATCH:
      return KvReducePolicy::kPerMicroBatch;
    case v1::KV_REDUCE_POLICY_DEFERRED:
      return KvReducePolicy::kDeferred;
    case v1::KV_REDUCE_POLICY_COALESCED:
      return KvReducePolicy::kCoalesced;
    default:
      return std::nullopt;
  }
}

v1::Latch ToProto(const Latch& latch) {
  v1::Latch out;
  out.set_job_id(latch.job_id);
  out.set_window(latch.window);
  out.set_generation(latch.generation);
  out.set_first_micro_batch(latch.first_micro_batch);
  out.set_micro_batches(latch.n);
  out.set_kv_mode(ToProto(latch.kv_mode));
  for (bool b : latch.no_sync) out.add_no_sync(b);
  out.set_reason(latch.reason);
  return out;
}

Latch FromProto(const v1::Latch& latch) {
  Latch out;
  out.job_id = latch.job_id();
  out.window = latch.window();
  out.generation = latch.generation();
  out.first_micro_batch = latch.first_micro_batch();
  out.n = latch.micro_batches();
  out.kv_mode = FromProto(latch.kv_mode()).value_or(KvMode::kPerMicroBatch);
  out.no_sync.assign(latch.no_sync().begin(), latch.no_sync().end());
  out.reason = latch.reason();
  return out;
}

google::protobuf::Timestamp ToProtoTime(absl::Time t) {
  google::protobuf::Timestamp out;
  const int64_t nanos = absl::ToUnixNanos(t);
  int64_t seconds = nanos / 1000000000;
  int64_t rem = nanos % 1000000000;
  if (rem < 0) {
    rem += 1000000000;
    --seconds;
  }
  out.set_seconds(seconds);
  out.set_nanos(static_cast<int32_t>(rem));
  return out;
}

absl::Time FromProtoTime(const google::protobuf::Timestamp& t) {
  return absl::FromUnixSeconds(t.seconds()) + absl::Nanoseconds(t.nanos());
}

google::protobuf::Duration ToProtoDuration(absl::Duration d) {
  google::protobuf::Duration out;
  const int64_t nanos = absl::ToInt64Nanoseconds(d);
  out.set_seconds(nanos / 1000000000);
  out.set_nanos(static_cast<int32_t>(nanos % 1000000000));
  return out;
}

absl::Duration FromProtoDuration(const google::protobuf::Duration& d) {
  return absl::Seconds(d.seconds()) + absl::Nanoseconds(d.nanos());
}

v1::JobState ToProto(JobState state) {
  // The enums share their values (common/states.h); the switch keeps the mapping checked.
  switch (state) {
    case JobState::kPending:
      return v1::JOB_STATE_PENDING;
    case JobState::kRunning:
      return v1::JOB_STATE_RUNNING;
    case JobState::kSucceeded:
      return v1::JOB_STATE_SUCCEEDED;
    case JobState::kFailed:
      return v1::JOB_STATE_FAILED;
    case JobState::kCancelled:
      return v1::JOB_STATE_CANCELLED;
    case JobState::kRecovering:
      return v1::JOB_STATE_RECOVERING;
  }
  return v1::JOB_STATE_UNSPECIFIED;
}

std::optional<JobState> FromProto(v1::JobState state) {
  for (JobState s : kAllJobStates) {
    if (ToProto(s) == state) return s;
  }
  return std::nullopt;
}

v1::WorkerState ToProto(WorkerState state) {
  switch (state) {
    case WorkerState::kJoined:
      return v1::WORKER_STATE_JOINED;
    case WorkerState::kActive:
      return v1::WORKER_STATE_ACTIVE;
    case WorkerState::kDone:
      return v1::WORKER_STATE_DONE;
    case WorkerState::kLost:
      return v1::WORKER_STATE_LOST;
    case WorkerState::kFailed:
      return v1::WORKER_STATE_FAILED;
  }
  return v1::WORKER_STATE_UNSPECIFIED;
}

std::optional<WorkerState> FromProto(v1::WorkerState state) {
  for (WorkerState s : kAllWorkerStates) {
    if (ToProto(s) == state) return s;
  }
  return std::nullopt;
}

v1::JobPolicy ToProto(const LatchPolicy& policy) {
  v1::JobPolicy out;
  out.set_kv_reduce(ToProto(policy.kv_reduce));
  out.set_gradient_accumulation_steps(policy.gradient_accumulation_steps);
  out.set_generation(policy.generation);
  return out;
}

LatchPolicy FromProto(const v1::JobPolicy& policy) {
  LatchPolicy out;
  out.kv_reduce = FromProto(policy.kv_reduce()).value_or(KvReducePolicy::kAuto);
  out.gradient_accumulation_steps = policy.gradient_accumulation_steps();
  out.generation = policy.generation();
  return out;
}

namespace {

// An unset time stays unset on the wire (and in proto JSON).
void SetTime(absl::Time t, google::protobuf::Timestamp* out) {
  if (t != absl::UnixEpoch()) *out = ToProtoTime(t);
}

}  // namespace

v1::JoinResponse ToProto(const JoinInfo& info) {
  v1::JoinResponse out;
  out.set_rank(info.rank);
  out.set_world_size(info.world_size);
  out.set_tp(info.tp);
  out.set_dp(info.dp);
  out.set_tp_rank(info.tp_rank);
  out.set_dp_rank(info.dp_rank);
  out.set_spec_json(info.spec_json);
  out.set_base_dir(info.base_dir);
  out.mutable_rendezvous()->set_host(info.rendezvous_host);
  out.mutable_rendezvous()->set_port(info.rendezvous_port);
  out.set_state(ToProto(info.state));
  *out.mutable_heartbeat_interval() = ToProtoDuration(info.heartbeat_interval);
  *out.mutable_liveness_timeout() = ToProtoDuration(info.liveness_timeout);
  out.set_steps(info.steps);
  out.set_attempt(info.attempt);
  out.set_rendezvous_prefix(info.rendezvous_prefix);
  out.set_resume_step(info.resume_step);
  out.set_resume_manifest_sha256(info.resume_manifest_sha256);
  *out.mutable_hang_timeout() = ToProtoDuration(info.hang_timeout);
  return out;
}

JoinInfo FromProto(const v1::JoinResponse& info) {
  JoinInfo out;
  out.rank = info.rank();
  out.world_size = info.world_size();
  out.tp = info.tp();
  out.dp = info.dp();
  out.tp_rank = info.tp_rank();
  out.dp_rank = info.dp_rank();
  out.spec_json = info.spec_json();
  out.base_dir = info.base_dir();
  out.rendezvous_host = info.rendezvous().host();
  out.rendezvous_port = info.rendezvous().port();
  out.state = FromProto(info.state()).value_or(JobState::kPending);
  out.heartbeat_interval = FromProtoDuration(info.heartbeat_interval());
  out.liveness_timeout = FromProtoDuration(info.liveness_timeout());
  out.steps = info.steps();
  out.attempt = info.attempt();
  out.rendezvous_prefix = info.rendezvous_prefix();
  out.resume_step = info.resume_step();
  out.resume_manifest_sha256 = info.resume_manifest_sha256();
  out.hang_timeout = FromProtoDuration(info.hang_timeout());
  return out;
}

v1::ReportStepRequest ToProto(const StepReport& report) {
  v1::ReportStepRequest out;
  out.set_step(report.step);
  out.set_micro_batches(report.micro_batches);
  out.set_loss(report.loss);
  out.set_grad_norm(report.grad_norm);
  out.set_kv_mode(ToProto(report.kv_mode));
  out.set_kv_allreduce_calls(report.kv_allreduce_calls);
  for (const auto& [k, v] : report.collective_calls) (*out.mutable_collective_calls())[k] = v;
  out.set_step_seconds(report.step_seconds);
  out.set_tokens(report.tokens);
  out.set_latch_generation(report.latch_generation);
  out.set_lr(report.lr);
  if (report.eval_loss) out.mutable_eval_loss()->set_value(*report.eval_loss);
  out.set_boundary_wait_seconds(report.boundary_wait_seconds);
  return out;
}

absl::StatusOr<StepReport> FromProto(const v1::ReportStepRequest& report) {
  StepReport out;
  std::optional<KvMode> mode = FromProto(report.kv_mode());
  if (!mode) return absl::InvalidArgumentError("kv_mode: required (the mode the step ran)");
  out.step = report.step();
  out.micro_batches = report.micro_batches();
  out.loss = report.loss();
  out.grad_norm = report.grad_norm();
  out.kv_mode = *mode;
  out.kv_allreduce_calls = report.kv_allreduce_calls();
  for (const auto& [k, v] : report.collective_calls()) out.collective_calls[k] = v;
  out.step_seconds = report.step_seconds();
  out.tokens = report.tokens();
  out.latch_generation = report.latch_generation();
  out.lr = report.lr();
  if (report.has_eval_loss()) out.eval_loss = report.eval_loss().value();
  out.boundary_wait_seconds = report.boundary_wait_seconds();
  return out;
}

v1::StepSummary ToProto(const CompletedStep& step) {
  const StepReport& r = step.report;
  v1::StepSummary out;
  out.set_step(r.step);
  out.set_micro_batches(r.micro_batches);
  out.set_loss(r.loss);
  out.set_grad_norm(r.grad_norm);
  out.set_kv_mode(ToProto(r.kv_mode));
  out.set_kv_allreduce_calls(r.kv_allreduce_calls);
  out.set_step_seconds(r.step_seconds);
  out.set_tokens(r.tokens);
  out.set_ranks_reported(step.ranks_reported);
  out.set_lr(r.lr);
  if (r.eval_loss) out.mutable_eval_loss()->set_value(*r.eval_loss);
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
  r.step_seconds = step.step_seconds();
  r.tokens = step.tokens();
  r.lr = step.lr();
  if (step.has_eval_loss()) r.eval_loss = step.eval_loss().value();
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

}  // namespace latchkey
