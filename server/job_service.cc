#include "server/job_service.h"

#include <optional>
#include <string>
#include <vector>

#include "proto/grpc_status.h"
#include "proto/wire.h"

namespace latchkey {

grpc::Status JobServiceImpl::Check(const grpc::ServerContext& ctx, const char* method,
                                   JobAccess access, const std::string& job_id,
                                   Principal* who) const {
  auto principal = gate_.Authenticate(ctx);
  if (!principal.ok()) return gate_.Refuse(ctx, method, ToGrpcStatus(principal.status()));
  *who = *principal;
  std::string owner;
  if (access == JobAccess::kModify && who->role == Role::kSubmit) {
    auto job = core_->GetJob(job_id, /*with_workers=*/false);
    if (!job.ok()) return ToGrpcStatus(job.status());
    owner = job->record.submitter;
  }
  absl::Status permit = Permit(*who, access, method, owner);
  if (!permit.ok()) return gate_.Refuse(ctx, method, ToGrpcStatus(permit));
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::SubmitJob(grpc::ServerContext* ctx, const v1::SubmitJobRequest* req,
                                       v1::SubmitJobResponse* resp) {
  auto slot = gate_.Admit(*ctx);
  if (!slot->ok()) return gate_.Refuse(*ctx, "SubmitJob", gate_.ExhaustedStatus());
  Principal who;
  if (grpc::Status st = Check(*ctx, "SubmitJob", JobAccess::kSubmit, "", &who); !st.ok()) {
    return st;
  }
  JobSubmission args;
  args.spec_json = req->spec_json();
  args.base_dir = req->base_dir();
  args.rendezvous_host = req->rendezvous_host();
  args.rendezvous_port = req->rendezvous_port();
  args.job_id = req->job_id();
  args.join_token_sha256 = req->join_token_sha256();
  auto r = core_->SubmitJob(args, who.name);
  if (!r.ok()) return ToGrpcStatus(r.status());
  *resp = ToProto(
      SubmittedJob{r->job.record.job_id, r->join_token, ToJobInfo(r->job), r->already_submitted});
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::GetJob(grpc::ServerContext* ctx, const v1::GetJobRequest* req,
                                    v1::GetJobResponse* resp) {
  auto slot = gate_.Admit(*ctx);
  if (!slot->ok()) return gate_.Refuse(*ctx, "GetJob", gate_.ExhaustedStatus());
  Principal who;
  if (grpc::Status st = Check(*ctx, "GetJob", JobAccess::kRead, req->job_id(), &who); !st.ok()) {
    return st;
  }
  auto r = core_->GetJob(req->job_id(), /*with_workers=*/true);
  if (!r.ok()) return ToGrpcStatus(r.status());
  *resp->mutable_job() = ToProto(ToJobInfo(*r));
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::ListJobs(grpc::ServerContext* ctx, const v1::ListJobsRequest* req,
                                      v1::ListJobsResponse* resp) {
  auto slot = gate_.Admit(*ctx);
  if (!slot->ok()) return gate_.Refuse(*ctx, "ListJobs", gate_.ExhaustedStatus());
  Principal who;
  if (grpc::Status st = Check(*ctx, "ListJobs", JobAccess::kRead, "", &who); !st.ok()) {
    return st;
  }
  std::vector<JobState> states;
  for (int s : req->states()) {
    std::optional<JobState> state =
        v1::JobState_IsValid(s) ? FromProto(static_cast<v1::JobState>(s)) : std::nullopt;
    if (!state) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "states: " + std::to_string(s) + " is not a job state");
    }
    states.push_back(*state);
  }
  auto r = core_->ListJobs(states, req->page_size());
  if (!r.ok()) return ToGrpcStatus(r.status());
  for (const JobView& v : *r) *resp->add_jobs() = ToProto(ToJobInfo(v));
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::CancelJob(grpc::ServerContext* ctx, const v1::CancelJobRequest* req,
                                       v1::CancelJobResponse* resp) {
  auto slot = gate_.Admit(*ctx);
  if (!slot->ok()) return gate_.Refuse(*ctx, "CancelJob", gate_.ExhaustedStatus());
  Principal who;
  if (grpc::Status st = Check(*ctx, "CancelJob", JobAccess::kModify, req->job_id(), &who);
      !st.ok()) {
    return st;
  }
  auto r = core_->CancelJob(req->job_id(), req->reason().substr(0, 1024));
  if (!r.ok()) return ToGrpcStatus(r.status());
  *resp->mutable_job() = ToProto(ToJobInfo(*r));
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::UpdateJobPolicy(grpc::ServerContext* ctx,
                                             const v1::UpdateJobPolicyRequest* req,
                                             v1::UpdateJobPolicyResponse* resp) {
  auto slot = gate_.Admit(*ctx);
  if (!slot->ok()) return gate_.Refuse(*ctx, "UpdateJobPolicy", gate_.ExhaustedStatus());
  Principal who;
  if (grpc::Status st = Check(*ctx, "UpdateJobPolicy", JobAccess::kModify, req->job_id(), &who);
      !st.ok()) {
    return st;
  }
  JobPolicyUpdate u;
  u.job_id = req->job_id();
  if (req->kv_reduce() != v1::KV_REDUCE_POLICY_UNSPECIFIED) {
    u.kv_reduce = FromProto(req->kv_reduce());
    if (!u.kv_reduce) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "kv_reduce: " + std::to_string(req->kv_reduce()) + " is not a policy");
    }
  }
  if (req->has_gradient_accumulation_steps()) {
    u.gradient_accumulation_steps = req->gradient_accumulation_steps().value();
  }
  if (req->has_expected_generation()) u.expected_generation = req->expected_generation().value();
  auto r = core_->UpdateJobPolicy(u);
  if (!r.ok()) return ToGrpcStatus(r.status());
  *resp = ToProto(JobPolicyUpdateResult{r->policy, r->first_window});
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::WatchJob(grpc::ServerContext* ctx, const v1::WatchJobRequest* req,
                                      grpc::ServerWriter<v1::WatchJobResponse>* writer) {
  auto slot = gate_.Admit(*ctx);
  if (!slot->ok()) return gate_.Refuse(*ctx, "WatchJob", gate_.ExhaustedStatus());
  Principal who;
  if (grpc::Status st = Check(*ctx, "WatchJob", JobAccess::kRead, req->job_id(), &who); !st.ok()) {
    return st;
  }
  uint64_t version = 0;
  int64_t last_step = -1;
  bool first = true;
  while (!ctx->IsCancelled()) {
    auto u = core_->WaitJobChange(req->job_id(), version, last_step, absl::Now() + poll_);
    if (!u.ok()) {
      if (absl::IsDeadlineExceeded(u.status())) continue;
      return ToGrpcStatus(u.status());
    }
    version = u->version;
    const v1::Job job = ToProto(ToJobInfo(u->job));
    if (first || u->steps.empty()) {
      // The first message is the job as it is now, not a replay of its history.
      v1::WatchJobResponse m;
      *m.mutable_job() = job;
      if (!writer->Write(m)) return grpc::Status(grpc::StatusCode::CANCELLED, "client gone");
    } else {
      for (const CompletedStep& s : u->steps) {
        v1::WatchJobResponse m;
        *m.mutable_job() = job;
        *m.mutable_step() = ToProto(s);
        if (!writer->Write(m)) return grpc::Status(grpc::StatusCode::CANCELLED, "client gone");
      }
    }
    if (!u->steps.empty()) last_step = u->steps.back().report.step;
    first = false;
    if (IsTerminal(u->job.record.state)) return grpc::Status::OK;
  }
  return grpc::Status(grpc::StatusCode::CANCELLED, "client cancelled");
}

grpc::Status JobServiceImpl::ListLatches(grpc::ServerContext* ctx,
                                         const v1::ListLatchesRequest* req,
                                         v1::ListLatchesResponse* resp) {
  auto slot = gate_.Admit(*ctx);
  if (!slot->ok()) return gate_.Refuse(*ctx, "ListLatches", gate_.ExhaustedStatus());
  Principal who;
  if (grpc::Status st = Check(*ctx, "ListLatches", JobAccess::kRead, req->job_id(), &who);
      !st.ok()) {
    return st;
  }
  auto r = core_->ListLatches(req->job_id(), req->start_window(), req->page_size());
  if (!r.ok()) return ToGrpcStatus(r.status());
  *resp = ToProto(ToAuditPage(*r));
  return grpc::Status::OK;
}

}  // namespace latchkey
