// Conversions between the plain C++ types of common/ and the latchkey.v1 wire messages.
// Pure functions; thread-safe.
#ifndef LATCHKEY_PROTO_WIRE_H_
#define LATCHKEY_PROTO_WIRE_H_

#include <optional>

#include "absl/time/time.h"
#include "common/job_spec.h"
#include "common/latch.h"
#include "google/protobuf/duration.pb.h"
#include "google/protobuf/timestamp.pb.h"
#include "latchkey/v1/types.pb.h"

namespace latchkey {

latchkey::v1::KvMode ToProto(KvMode mode);
// nullopt for KV_MODE_UNSPECIFIED or an unknown value.
std::optional<KvMode> FromProto(latchkey::v1::KvMode mode);

latchkey::v1::KvReducePolicy ToProto(KvReducePolicy policy);
// nullopt for KV_REDUCE_POLICY_UNSPECIFIED or an unknown value.
std::optional<KvReducePolicy> FromProto(latchkey::v1::KvReducePolicy policy);

// publish_time is left unset; callers that know it set it.
latchkey::v1::Latch ToProto(const Latch& latch);
// Unknown kv_mode values become kPerMicroBatch (the always-valid choice).
Latch FromProto(const latchkey::v1::Latch& latch);

google::protobuf::Timestamp ToProtoTime(absl::Time t);
absl::Time FromProtoTime(const google::protobuf::Timestamp& t);
google::protobuf::Duration ToProtoDuration(absl::Duration d);
absl::Duration FromProtoDuration(const google::protobuf::Duration& d);

}  // namespace latchkey

#endif  // LATCHKEY_PROTO_WIRE_H_
