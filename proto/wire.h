// Conversions between the plain C++ types of common/ and the latchkey.v1 wire messages: the only
// code that builds a latchkey.v1 message (the adapters in server/, client/ and worker/session/
// call these). wire_values.cc holds the shared vocabulary of types.proto, wire_job.cc
// JobService's messages, wire_worker.cc WorkerService's. Statuses: proto/grpc_status.h.
// Pure functions; thread-safe.
#ifndef LATCHKEY_PROTO_WIRE_H_
#define LATCHKEY_PROTO_WIRE_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/job_info.h"
#include "common/job_spec.h"
#include "common/join_info.h"
#include "common/latch.h"
#include "common/rank_position.h"
#include "common/states.h"
#include "common/step_report.h"
#include "common/worker_protocol.h"
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
JobSubmission FromProto(const latchkey::v1::SubmitJobRequest& submission);
latchkey::v1::SubmitJobResponse ToProto(const SubmittedJob& submitted);
SubmittedJob FromProto(const latchkey::v1::SubmitJobResponse& submitted);
latchkey::v1::UpdateJobPolicyRequest ToProto(const JobPolicyUpdate& update);
// INVALID_ARGUMENT for a kv_reduce that is no policy (UNSPECIFIED: leave it as it is).
absl::StatusOr<JobPolicyUpdate> FromProto(const latchkey::v1::UpdateJobPolicyRequest& update);
latchkey::v1::UpdateJobPolicyResponse ToProto(const JobPolicyUpdateResult& result);
JobPolicyUpdateResult FromProto(const latchkey::v1::UpdateJobPolicyResponse& result);
latchkey::v1::WatchJobResponse ToProto(const JobUpdate& update);
JobUpdate FromProto(const latchkey::v1::WatchJobResponse& update);
latchkey::v1::ListLatchesResponse ToProto(const LatchAuditPage& page);
LatchAuditPage FromProto(const latchkey::v1::ListLatchesResponse& page);
latchkey::v1::ListJobsResponse ToProto(const std::vector<JobInfo>& jobs);
// The requests that name a job and little else.
latchkey::v1::GetJobRequest MakeGetJobRequest(const std::string& job_id);
latchkey::v1::CancelJobRequest MakeCancelJobRequest(const std::string& job_id,
                                                    const std::string& reason);
latchkey::v1::WatchJobRequest MakeWatchJobRequest(const std::string& job_id,
                                                  bool replay_recent_steps = false);
latchkey::v1::ListLatchesRequest MakeListLatchesRequest(const std::string& job_id,
                                                        int64_t start_window, int page_size);
// ListJobs: the states to list (empty: all) and at most `page_size` jobs (0: the server's page).
latchkey::v1::ListJobsRequest MakeListJobsRequest(const std::vector<JobState>& states,
                                                  int page_size);
// INVALID_ARGUMENT naming a value that is no job state (or UNSPECIFIED).
absl::StatusOr<std::vector<JobState>> JobStatesOf(const latchkey::v1::ListJobsRequest& request);

// WorkerService's messages. Join: the rank's JoinInfo (common/join_info.h); an unknown state
// becomes kPending. ReportStep: the request's step fields (identity and rank are the caller's);
// StepReport's optimizer_state_bytes and latch_wait_seconds are not on the wire; eval_loss is
// a google.protobuf.DoubleValue, unset when the step ran no evaluation; checkpoint_seconds is
// not on the wire (boundary_wait_seconds and the three memory fields are). A request
// without a kv_mode is INVALID_ARGUMENT (the coordinator must know the mode the step ran).
latchkey::v1::JoinResponse ToProto(const JoinInfo& info);
JoinInfo FromProto(const latchkey::v1::JoinResponse& info);
latchkey::v1::ReportStepRequest ToProto(const StepReport& report);
absl::StatusOr<StepReport> FromProto(const latchkey::v1::ReportStepRequest& report);

// Fault tolerance (docs/fault-tolerance.md). The JoinResponse fields attempt,
// rendezvous_prefix, resume_step, resume_manifest_sha256 and hang_timeout are JoinInfo's (above).
//
// RankPosition: `phase` is RankPhaseName (common/rank_position.h); an unknown or empty phase
// reads as kIdle. `seconds` travels as the Duration in_position (a negative one reads as 0).
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

// WorkerService's calls as a rank makes them (worker/session, client/failure_report.cc): the
// identity, and each request with the identity and the caller's rank. The report requests take
// their fields as ToProto(StepReport) / ToProto(CheckpointReport) above.
latchkey::v1::WorkerIdentity ToProto(const WorkerIdentity& identity);
WorkerIdentity FromProto(const latchkey::v1::WorkerIdentity& identity);
latchkey::v1::JoinRequest MakeJoinRequest(const WorkerIdentity& identity,
                                          std::optional<int> requested_rank,
                                          const std::string& advertise_host, int probe_port = 0,
                                          const std::string& node = "");
latchkey::v1::WatchLatchesRequest MakeWatchLatchesRequest(const WorkerIdentity& identity, int rank,
                                                          int64_t start_window);
latchkey::v1::ReportStepRequest MakeReportStepRequest(const WorkerIdentity& identity, int rank,
                                                      const StepReport& report);
latchkey::v1::ReportCheckpointRequest MakeReportCheckpointRequest(const WorkerIdentity& identity,
                                                                  int rank,
                                                                  const CheckpointReport& report);
// `position`, `reachability` null: the heartbeat carries none.
latchkey::v1::HeartbeatRequest MakeHeartbeatRequest(const WorkerIdentity& identity, int rank,
                                                    const RankPosition* position,
                                                    const Reachability* reachability = nullptr,
                                                    bool want_peers = false, int probe_port = 0);
latchkey::v1::Reachability ToProto(const Reachability& r);
Reachability FromProto(const latchkey::v1::Reachability& r);
// `reason`: the ErrorInfo reason of the error ("" when it has none).
latchkey::v1::ReportFailureRequest MakeReportFailureRequest(const WorkerIdentity& identity,
                                                            int rank, const std::string& message,
                                                            bool permanent,
                                                            const std::string& reason = "");
// The latch stream's two messages: a latch with its publish time, and the job's end.
latchkey::v1::WatchLatchesResponse MakeLatchMessage(const Latch& latch, absl::Time publish_time);
latchkey::v1::WatchLatchesResponse MakeJobEndedMessage(JobState state, const std::string& reason);
// The stream's last message when the attempt stops before `before_window` (a preemption, a
// suspend).
latchkey::v1::WatchLatchesResponse MakeStopMessage(int64_t before_window);
latchkey::v1::LeaveRequest MakeLeaveRequest(const WorkerIdentity& identity, int rank,
                                            const std::string& reason);
// The coordinator's answers: each response carries the WorkerReply fields it has
// (common/worker_protocol.h); an unknown state reads as kPending.
void ToProto(const WorkerReply& reply, latchkey::v1::ReportStepResponse* out);
void ToProto(const WorkerReply& reply, latchkey::v1::HeartbeatResponse* out);
void ToProto(const WorkerReply& reply, latchkey::v1::ReportFailureResponse* out);
void ToProto(const WorkerReply& reply, latchkey::v1::ReportCheckpointResponse* out);
void ToProto(const WorkerReply& reply, latchkey::v1::LeaveResponse* out);
WorkerReply FromProto(const latchkey::v1::ReportStepResponse& reply);
WorkerReply FromProto(const latchkey::v1::HeartbeatResponse& reply);
WorkerReply FromProto(const latchkey::v1::ReportFailureResponse& reply);
WorkerReply FromProto(const latchkey::v1::ReportCheckpointResponse& reply);
WorkerReply FromProto(const latchkey::v1::LeaveResponse& reply);  // stop is set

google::protobuf::Timestamp ToProtoTime(absl::Time t);
absl::Time FromProtoTime(const google::protobuf::Timestamp& t);
google::protobuf::Duration ToProtoDuration(absl::Duration d);
absl::Duration FromProtoDuration(const google::protobuf::Duration& d);

}  // namespace latchkey

#endif  // LATCHKEY_PROTO_WIRE_H_
