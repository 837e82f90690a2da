#include "client/failure_report.h"

#include <grpcpp/client_context.h>

#include "latchkey/v1/worker_service.grpc.pb.h"
#include "proto/channel.h"
#include "proto/grpc_status.h"
#include "proto/wire.h"

namespace latchkey {

absl::StatusOr<WorkerFailureResult> ReportWorkerFailure(const ClientOptions& options,
                                                        const WorkerFailure& failure) {
  auto channel = MakeCoordinatorChannel(options.coordinator, options.credentials);
  if (!channel.ok()) return channel.status();
  auto stub = v1::WorkerService::NewStub(*channel);
  // Attempt 0: whatever attempt the worker is in.
  const WorkerIdentity who{failure.job_id, failure.join_token, failure.worker_id, 0};
  const v1::ReportFailureRequest req = MakeReportFailureRequest(who, failure.rank, failure.message,
                                                                failure.permanent, failure.reason);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + options.timeout));
  v1::ReportFailureResponse resp;
  const grpc::Status st = stub->ReportFailure(&ctx, req, &resp);
  if (!st.ok()) return FromGrpcStatus(st);
  WorkerFailureResult out;
  out.state = FromProto(resp.state()).value_or(JobState::kRunning);
  out.attempt = resp.attempt();
  return out;
}

}  // namespace latchkey
