#include "proto/wire.h"

namespace latchkey {

namespace v1 = ::latchkey::v1;

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

}  // namespace latchkey
