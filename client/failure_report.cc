#include "client/failure_report.h"

#include <grpcpp/client_context.h>
#include <unistd.h>

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
  v1::ReportFailureRequest req;
  v1::WorkerIdentity* id = req.mutable_identity();
  id->set_job_id(failure.job_id);
  id->set_join_token(failure.join_token);
  id->set_worker_id(failure.worker_id);
  id->set_attempt(0);
  req.set_rank(failure.rank);
  req.set_message(failure.message);
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

std::string WorkerIdOf(int pid) {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  return std::string(host) + ":" + std::to_string(pid);
}

}  // namespace latchkey
