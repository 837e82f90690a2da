#include "client/job_client.h"

#include <grpcpp/client_context.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/channel.h"
#include "latchkey/v1/job_service.grpc.pb.h"
#include "proto/grpc_status.h"

namespace latchkey {

struct JobClient::Impl {
  std::unique_ptr<v1::JobService::Stub> stub;
};

JobClient::JobClient(ClientOptions options)
    : impl_(std::make_unique<Impl>()), options_(std::move(options)) {
  impl_->stub = v1::JobService::NewStub(MakeCoordinatorChannel(options_.coordinator));
}

JobClient::~JobClient() = default;

namespace {

template <typename Req, typename Resp, typename Method>
absl::StatusOr<Resp> Call(v1::JobService::Stub* stub, Method method, const Req& req,
                          absl::Duration timeout) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  Resp resp;
  grpc::Status st = (stub->*method)(&ctx, req, &resp);
  if (!st.ok()) return FromGrpcStatus(st);
  return resp;
}

}  // namespace

absl::StatusOr<v1::SubmitJobResponse> JobClient::SubmitJob(const v1::SubmitJobRequest& req) {
  return Call<v1::SubmitJobRequest, v1::SubmitJobResponse>(
      impl_->stub.get(), &v1::JobService::Stub::SubmitJob, req, options_.timeout);
}

absl::StatusOr<v1::Job> JobClient::GetJob(const std::string& job_id) {
  v1::GetJobRequest req;
  req.set_job_id(job_id);
  auto r = Call<v1::GetJobRequest, v1::GetJobResponse>(
      impl_->stub.get(), &v1::JobService::Stub::GetJob, req, options_.timeout);
  if (!r.ok()) return r.status();
  return r->job();
}

absl::StatusOr<v1::ListJobsResponse> JobClient::ListJobs(const v1::ListJobsRequest& req) {
  return Call<v1::ListJobsRequest, v1::ListJobsResponse>(
      impl_->stub.get(), &v1::JobService::Stub::ListJobs, req, options_.timeout);
}

absl::StatusOr<v1::Job> JobClient::CancelJob(const std::string& job_id, const std::string& reason) {
  v1::CancelJobRequest req;
  req.set_job_id(job_id);
  req.set_reason(reason);
  auto r = Call<v1::CancelJobRequest, v1::CancelJobResponse>(
      impl_->stub.get(), &v1::JobService::Stub::CancelJob, req, options_.timeout);
  if (!r.ok()) return r.status();
  return r->job();
}

absl::StatusOr<v1::UpdateJobPolicyResponse> JobClient::UpdateJobPolicy(
    const v1::UpdateJobPolicyRequest& req) {
  return Call<v1::UpdateJobPolicyRequest, v1::UpdateJobPolicyResponse>(
      impl_->stub.get(), &v1::JobService::Stub::UpdateJobPolicy, req, options_.timeout);
}

absl::StatusOr<v1::ListLatchesResponse> JobClient::ListLatches(const v1::ListLatchesRequest& req) {
  return Call<v1::ListLatchesRequest, v1::ListLatchesResponse>(
      impl_->stub.get(), &v1::JobService::Stub::ListLatches, req, options_.timeout);
}

absl::StatusOr<v1::Job> JobClient::WatchJob(
    const std::string& job_id, const std::function<bool(const v1::WatchJobResponse&)>& on_update,
    absl::Time deadline) {
  v1::WatchJobRequest req;
  req.set_job_id(job_id);
  absl::Duration backoff = absl::Milliseconds(100);
  absl::Time unreachable_since = absl::InfiniteFuture();
  // Even an endless watch has a deadline per stream: it is reopened after each.
  constexpr absl::Duration kStreamAttempt = absl::Minutes(30);
  while (true) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(std::min(deadline, absl::Now() + kStreamAttempt)));
    auto reader = impl_->stub->WatchJob(&ctx, req);
    v1::WatchJobResponse m;
    v1::Job last;
    bool got_any = false;
    while (reader->Read(&m)) {
      got_any = true;
      unreachable_since = absl::InfiniteFuture();
      backoff = absl::Milliseconds(100);
      last = m.job();
      if (!on_update(m)) {
        ctx.TryCancel();
        reader->Finish().ok();
        return absl::CancelledError("watch stopped");
      }
    }
    grpc::Status st = reader->Finish();
    if (st.ok() && got_any) return last;  // the server ends the stream when the job ends
    if (!st.ok() && !IsRetryable(st.error_code())) return FromGrpcStatus(st);
    const absl::Time now = absl::Now();
    if (now >= deadline) return absl::DeadlineExceededError("watch deadline passed");
    if (unreachable_since == absl::InfiniteFuture()) unreachable_since = now;
    if (now - unreachable_since > options_.timeout) {
      return st.ok() ? absl::UnavailableError("watch stream ended without news")
                     : FromGrpcStatus(st);
    }
    absl::SleepFor(std::min(backoff, deadline - now));
    backoff = std::min(backoff * 2, absl::Seconds(2));
  }
}

}  // namespace latchkey
