// proto/wire.h: the shared vocabulary of types.proto (KV modes and policies, job and worker
// states, latches, policies) and the well-known Timestamp / Duration.
#include <cstdint>
#include <optional>

#include "proto/wire.h"

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
  out.set_first_sample(latch.first_sample);
  out.set_micro_batches(latch.n);
  out.set_kv_mode(ToProto(latch.kv_mode));
  for (bool b : latch.no_sync) out.add_no_sync(b);
  out.set_reason(latch.reason);
  for (int c : latch.replica_micro_batches) out.add_replica_micro_batches(c);
  return out;
}

Latch FromProto(const v1::Latch& latch) {
  Latch out;
  out.job_id = latch.job_id();
  out.window = latch.window();
  out.generation = latch.generation();
  out.first_micro_batch = latch.first_micro_batch();
  out.first_sample = latch.first_sample();
  out.n = latch.micro_batches();
  out.kv_mode = FromProto(latch.kv_mode()).value_or(KvMode::kPerMicroBatch);
  out.no_sync.assign(latch.no_sync().begin(), latch.no_sync().end());
  out.reason = latch.reason();
  out.replica_micro_batches.assign(latch.replica_micro_batches().begin(),
                                   latch.replica_micro_batches().end());
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
    case JobState::kPreempted:
      return v1::JOB_STATE_PREEMPTED;
    case JobState::kSuspended:
      return v1::JOB_STATE_SUSPENDED;
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

}  // namespace latchkey
