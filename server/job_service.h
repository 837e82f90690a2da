// gRPC adapter: latchkey.v1.JobService over Coordinator. Converts messages (proto/wire.h) and
// statuses only; every method passes the CallGate (server/call_gate.h) through Guard: a per-peer
// slot, the caller's role token authorized for the access the method needs, then the body.
// Thread-safety: as Coordinator (the gRPC sync server calls it from many threads).
#ifndef LATCHKEY_SERVER_JOB_SERVICE_H_
#define LATCHKEY_SERVER_JOB_SERVICE_H_

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "latchkey/v1/job_service.grpc.pb.h"
#include "server/call_gate.h"
#include "server/coordinator.h"

namespace latchkey {

class JobServiceImpl final : public latchkey::v1::JobService::Service {
 public:
  // `core` must outlive the service. `poll` bounds how long a stream handler waits before it
  // looks at the client's cancellation again.
  // `gate`: the role tokens and the per-peer cap (default: open, uncapped).
  explicit JobServiceImpl(Coordinator* core, absl::Duration poll = absl::Milliseconds(200),
                          CallGate gate = {})
      : core_(core), poll_(poll), gate_(std::move(gate)) {}

  grpc::Status SubmitJob(grpc::ServerContext* ctx, const v1::SubmitJobRequest* req,
                         v1::SubmitJobResponse* resp) override;
  grpc::Status GetJob(grpc::ServerContext* ctx, const v1::GetJobRequest* req,
                      v1::GetJobResponse* resp) override;
  grpc::Status ListJobs(grpc::ServerContext* ctx, const v1::ListJobsRequest* req,
                        v1::ListJobsResponse* resp) override;
  grpc::Status CancelJob(grpc::ServerContext* ctx, const v1::CancelJobRequest* req,
                         v1::CancelJobResponse* resp) override;
  grpc::Status ResumeJob(grpc::ServerContext* ctx, const v1::ResumeJobRequest* req,
                         v1::ResumeJobResponse* resp) override;
  grpc::Status SuspendJob(grpc::ServerContext* ctx, const v1::SuspendJobRequest* req,
                          v1::SuspendJobResponse* resp) override;
  grpc::Status UpdateJobPolicy(grpc::ServerContext* ctx, const v1::UpdateJobPolicyRequest* req,
                               v1::UpdateJobPolicyResponse* resp) override;
  grpc::Status WatchJob(grpc::ServerContext* ctx, const v1::WatchJobRequest* req,
                        grpc::ServerWriter<v1::WatchJobResponse>* writer) override;
  grpc::Status ListLatches(grpc::ServerContext* ctx, const v1::ListLatchesRequest* req,
                           v1::ListLatchesResponse* resp) override;
  grpc::Status GetTrace(grpc::ServerContext* ctx, const v1::GetTraceRequest* req,
                        v1::GetTraceResponse* resp) override;

 private:
  // The one guard of every method: gate_.Run around Authorize, then `body` with the caller.
  grpc::Status Guard(const grpc::ServerContext& ctx, const char* method, JobAccess access,
                     const std::string& job_id,
                     const std::function<absl::Status(const Principal&)>& body);
  // Authenticates and authorizes one call; `job_id` names the job for kModify (a submitter may
  // modify only its own jobs: NOT_FOUND for an unknown one).
  absl::StatusOr<Principal> Authorize(const grpc::ServerContext& ctx, const char* method,
                                      JobAccess access, const std::string& job_id) const;
  // WatchJob's stream: the job now, then each completed step, until the job ends or the client
  // goes (CANCELLED).
  absl::Status Watch(const grpc::ServerContext& ctx, const std::string& job_id, bool replay,
                     grpc::ServerWriter<v1::WatchJobResponse>* writer);

  Coordinator* const core_;
  const absl::Duration poll_;
  const CallGate gate_;
};

}  // namespace latchkey

#endif  // LATCHKEY_SERVER_JOB_SERVICE_H_
