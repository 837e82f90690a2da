// Conversions between the plain C++ types of common/ and the latchkey.v1 wire messages.
// Pure functions; thread-safe.
#ifndef LATCHKEY_PROTO_WIRE_H_
#define LATCHKEY_PROTO_WIRE_H_

#include <optional>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/job_info.h"
#include "common/job_spec.h"
#include "common/join_info.h"
#include "common/latch.h"
#include "common/rank_position.h"
#include "common/states.h"
#include "common/step_report.h"
#include "google/protobuf/duration.pb.h"
#include "google/protobuf/timestamp.pb.h"
#include "latchkey/v1/job_service.pb.h"
#include "latchkey/v1/types.pb.h"
#include "latchkey/v1/worker_service.pb.h"

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

// Job and worker states: the values are equal (common/states.h); nullopt for UNSPECIFIED or
// an unknown value.
latchkey::v1::JobState ToProto(JobState state);
std::optional<JobState> FromProto(latchkey::v1::JobState state);
latchkey::v1::WorkerState ToProto(WorkerState state);
std::optional<WorkerState> FromProto(latchkey::v1::WorkerState state);

// JobPolicy carries kv_reduce, gradient_accumulation_steps and generation, not no_sync.
// An unknown kv_reduce becomes kAuto.
latchkey::v1::JobPolicy ToProto(const LatchPolicy& policy);
LatchPolicy FromProto(const latchkey::v1::JobPolicy& policy);

// JobService's messages and the plain values of common/job_info.h. Unknown enum values
// become the field's default; an unset Timestamp is absl::UnixEpoch() and back. Job carries
// JobInfo's fault-tolerance fields (attempt ... slowest) and ListLatchesResponse its events.
latchkey::v1::StepSummary ToProto(const CompletedStep& step);
CompletedStep FromProto(const latchkey::v1::StepSummary& step);
latchkey::v1::WorkerInfo ToProto(const JobWorkerInfo& worker);
JobWorkerInfo FromProto(const latchkey::v1::WorkerInfo& worker);
latchkey::v1::Job ToProto(const JobInfo& job);
JobInfo FromProto(const latchkey::v1::Job& job);
latchkey::v1::SubmitJobRequest ToProto(const JobSubmission& submission);
latchkey::v1::SubmitJobResponse ToProto(const SubmittedJob& submitted);
SubmittedJob FromProto(const latchkey::v1::SubmitJobResponse& submitted);
latchkey::v1::UpdateJobPolicyRequest ToProto(const JobPolicyUpdate& update);
latchkey::v1::UpdateJobPolicyResponse ToProto(const JobPolicyUpdateResult& result);
JobPolicyUpdateResult FromProto(const latchkey::v1::UpdateJobPolicyResponse& result);
latchkey::v1::WatchJobResponse ToProto(const JobUpdate& update);
JobUpdate FromProto(const latchkey::v1::WatchJobResponse& update);
latchkey::v1::ListLatchesResponse ToProto(const LatchAuditPage& page);
LatchAuditPage FromProto(const latchkey::v1::ListLatchesResponse& page);

// WorkerService's messages. Join: the rank's JoinInfo (common/join_info.h); an unknown state
// becomes kPending. ReportStep: the request's step fields (identity and rank are the caller's);
// StepReport's optimizer_state_bytes and latch_wait_seconds are not on the wire; eval_loss is
// a google.protobuf.DoubleValue, unset when the step ran no evaluation; checkpoint_seconds is
// not on the wire (boundary_wait_seconds is). A request
// without a kv_mode is INVALID_ARGUMENT (the coordinator must know the mode the step ran).
latchkey::v1::JoinResponse ToProto(const JoinInfo& info);
JoinInfo FromProto(const latchkey::v1::JoinResponse& info);
latchkey::v1::ReportStepRequest ToProto(const StepReport& report);
absl::StatusOr<StepReport> FromProto(const latchkey::v1::ReportStepRequest& report);

// Fault tolerance (docs/fault-tolerance.md; wire_faults.cc). The JoinResponse fields attempt,
// rendezvous_prefix, resume_step, resume_manifest_sha256 and hang_timeout are JoinInfo's (above);
// WorkerIdentity.attempt and HeartbeatResponse.attempt are plain integers the adapters copy.
//
// RankPosition: `phase` is one of "idle", "latch", "compute", "collective", "checkpoint",
// "eval" (RankPhaseName); an unknown or empty phase reads as kIdle. `seconds` travels as the
// Duration in_position (a negative one reads as 0).
const char* RankPhaseName(RankPhase phase);
std::optional<RankPhase> RankPhaseFromName(const std::string& name);
latchkey::v1::RankPosition ToProto(const RankPosition& position);
RankPosition FromProto(const latchkey::v1::RankPosition& position);
latchkey::v1::StalledRank ToProto(const StalledRank& stalled);
StalledRank FromProto(const latchkey::v1::StalledRank& stalled);
latchkey::v1::WindowArrival ToProto(const WindowArrival& arrival);
WindowArrival FromProto(const latchkey::v1::WindowArrival& arrival);
latchkey::v1::JobEvent ToProto(const AuditedEvent& event);
AuditedEvent FromProto(const latchkey::v1::JobEvent& event);
// ReportCheckpoint: the request's checkpoint fields (identity and rank are the caller's). A
// request with a negative step or an empty manifest_sha256 is INVALID_ARGUMENT.
latchkey::v1::ReportCheckpointRequest ToProto(const CheckpointReport& report);
absl::StatusOr<CheckpointReport> FromProto(const latchkey::v1::ReportCheckpointRequest& report);

google::protobuf::Timestamp ToProtoTime(absl::Time t);
absl::Time FromProtoTime(const google::protobuf::Timestamp& t);
google::protobuf::Duration ToProtoDuration(absl::Duration d);
absl::Duration FromProtoDuration(const google::protobuf::Duration& d);

}  // namespace latchkey

#endif  // LATCHKEY_PROTO_WIRE_H_
