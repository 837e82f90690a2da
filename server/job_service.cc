#include "server/job_service.h"

#include <string>
#include <vector>

#include "common/status_macros.h"
#include "proto/wire.h"

namespace latchkey {

grpc::Status JobServiceImpl::Guard(const grpc::ServerContext& ctx, const char* method,
                                   JobAccess access, const std::string& job_id,
                                   const std::function<absl::Status(const Principal&)>& body) {
  return gate_.Run(ctx, method, [&]() -> absl::Status {
    LK_ASSIGN_OR_RETURN(Principal who, Authorize(ctx, method, access, job_id));
    return body(who);
  });
}

absl::StatusOr<Principal> JobServiceImpl::Authorize(const grpc::ServerContext& ctx,
                                                    const char* method, JobAccess access,
                                                    const std::string& job_id) const {
  LK_ASSIGN_OR_RETURN(Principal who, gate_.Authenticate(ctx));
  std::string owner;
  if (access == JobAccess::kModify && who.role == Role::kSubmit) {
    LK_ASSIGN_OR_RETURN(JobView job, core_->GetJob(job_id, /*with_workers=*/false));
    owner = job.record.submitter;
  }
  LK_RETURN_IF_ERROR(Permit(who, access, method, owner));
  return who;
}

grpc::Status JobServiceImpl::SubmitJob(grpc::ServerContext* ctx, const v1::SubmitJobRequest* req,
                                       v1::SubmitJobResponse* resp) {
  return Guard(*ctx, "SubmitJob", JobAccess::kSubmit, "", [&](const Principal& who) {
    LK_ASSIGN_OR_RETURN(SubmitResult r, core_->SubmitJob(FromProto(*req), who.name));
    *resp = ToProto(
        SubmittedJob{r.job.record.job_id, r.join_token, ToJobInfo(r.job), r.already_submitted});
    return absl::OkStatus();
  });
}

grpc::Status JobServiceImpl::GetJob(grpc::ServerContext* ctx, const v1::GetJobRequest* req,
                                    v1::GetJobResponse* resp) {
  return Guard(*ctx, "GetJob", JobAccess::kRead, req->job_id(), [&](const Principal&) {
    LK_ASSIGN_OR_RETURN(JobView r, core_->GetJob(req->job_id(), /*with_workers=*/true));
    *resp->mutable_job() = ToProto(ToJobInfo(r));
    return absl::OkStatus();
  });
}

grpc::Status JobServiceImpl::ListJobs(grpc::ServerContext* ctx, const v1::ListJobsRequest* req,
                                      v1::ListJobsResponse* resp) {
  return Guard(*ctx, "ListJobs", JobAccess::kRead, "", [&](const Principal&) {
    LK_ASSIGN_OR_RETURN(std::vector<JobState> states, JobStatesOf(*req));
    LK_ASSIGN_OR_RETURN(std::vector<JobView> r, core_->ListJobs(states, req->page_size()));
    std::vector<JobInfo> jobs;
    jobs.reserve(r.size());
    for (const JobView& v : r) jobs.push_back(ToJobInfo(v));
    *resp = ToProto(jobs);
    return absl::OkStatus();
  });
}

grpc::Status JobServiceImpl::CancelJob(grpc::ServerContext* ctx, const v1::CancelJobRequest* req,
                                       v1::CancelJobResponse* resp) {
  return Guard(*ctx, "CancelJob", JobAccess::kModify, req->job_id(), [&](const Principal&) {
    LK_ASSIGN_OR_RETURN(JobView r, core_->CancelJob(req->job_id(), req->reason().substr(0, 1024)));
    *resp->mutable_job() = ToProto(ToJobInfo(r));
    return absl::OkStatus();
  });
}

// The same access as CancelJob: resuming is the user's decision over a job it may cancel.
grpc::Status JobServiceImpl::ResumeJob(grpc::ServerContext* ctx, const v1::ResumeJobRequest* req,
                                       v1::ResumeJobResponse* resp) {
  return Guard(*ctx, "ResumeJob", JobAccess::kModify, req->job_id(), [&](const Principal&) {
    LK_ASSIGN_OR_RETURN(JobView r, core_->ResumeJob(req->job_id(), req->reason().substr(0, 1024)));
    *resp->mutable_job() = ToProto(ToJobInfo(r));
    return absl::OkStatus();
  });
}

// The same access as CancelJob: suspending frees the job's machines as cancelling does.
grpc::Status JobServiceImpl::SuspendJob(grpc::ServerContext* ctx, const v1::SuspendJobRequest* req,
                                        v1::SuspendJobResponse* resp) {
  return Guard(*ctx, "SuspendJob", JobAccess::kModify, req->job_id(), [&](const Principal&) {
    LK_ASSIGN_OR_RETURN(JobView r, core_->SuspendJob(req->job_id(), req->reason().substr(0, 1024)));
    *resp->mutable_job() = ToProto(ToJobInfo(r));
    return absl::OkStatus();
  });
}

grpc::Status JobServiceImpl::UpdateJobPolicy(grpc::ServerContext* ctx,
                                             const v1::UpdateJobPolicyRequest* req,
                                             v1::UpdateJobPolicyResponse* resp) {
  return Guard(*ctx, "UpdateJobPolicy", JobAccess::kModify, req->job_id(), [&](const Principal&) {
    LK_ASSIGN_OR_RETURN(JobPolicyUpdate update, FromProto(*req));
    LK_ASSIGN_OR_RETURN(JobPolicyUpdateResult r, core_->UpdateJobPolicy(update));
    *resp = ToProto(r);
    return absl::OkStatus();
  });
}

grpc::Status JobServiceImpl::WatchJob(grpc::ServerContext* ctx, const v1::WatchJobRequest* req,
                                      grpc::ServerWriter<v1::WatchJobResponse>* writer) {
  return Guard(*ctx, "WatchJob", JobAccess::kRead, req->job_id(), [&](const Principal&) {
    return Watch(*ctx, req->job_id(), req->replay_recent_steps(), writer);
  });
}

absl::Status JobServiceImpl::Watch(const grpc::ServerContext& ctx, const std::string& job_id,
                                   bool replay, grpc::ServerWriter<v1::WatchJobResponse>* writer) {
  uint64_t version = 0;
  int64_t last_step = -1;
  bool first = true;
  while (!ctx.IsCancelled()) {
    auto u = core_->WaitJobChange(job_id, version, last_step, absl::Now() + poll_);
    if (!u.ok()) {
      if (absl::IsDeadlineExceeded(u.status())) continue;
      return u.status();
    }
    version = u->version;
    JobUpdate update;
    update.job = ToJobInfo(u->job);
    if (first || u->steps.empty()) {
      // The first message is the job as it is now; with `replay` the recent steps follow it.
      if (!writer->Write(ToProto(update))) return absl::CancelledError("client gone");
      for (size_t i = 0; first && replay && i < u->steps.size(); ++i) {
        update.step = u->steps[i];
        if (!writer->Write(ToProto(update))) return absl::CancelledError("client gone");
      }
    } else {
      for (const CompletedStep& s : u->steps) {
        update.step = s;
        if (!writer->Write(ToProto(update))) return absl::CancelledError("client gone");
      }
    }
    if (!u->steps.empty()) last_step = u->steps.back().report.step;
    first = false;
    if (IsTerminal(u->job.record.state)) return absl::OkStatus();
  }
  return absl::CancelledError("client cancelled");
}

grpc::Status JobServiceImpl::ListLatches(grpc::ServerContext* ctx,
                                         const v1::ListLatchesRequest* req,
                                         v1::ListLatchesResponse* resp) {
  return Guard(*ctx, "ListLatches", JobAccess::kRead, req->job_id(), [&](const Principal&) {
    LK_ASSIGN_OR_RETURN(LatchAudit r,
                        core_->ListLatches(req->job_id(), req->start_window(), req->page_size()));
    *resp = ToProto(ToAuditPage(r));
    return absl::OkStatus();
  });
}

// The answer holds whole ranks up to this size; the others are named in omitted_ranks.
constexpr size_t kMaxTraceAnswerBytes = 64u << 20;

grpc::Status JobServiceImpl::GetTrace(grpc::ServerContext* ctx, const v1::GetTraceRequest* req,
                                      v1::GetTraceResponse* resp) {
  return Guard(*ctx, "GetTrace", JobAccess::kRead, req->job_id(), [&](const Principal&) {
    if (req->first_step() < 0 || req->last_step() < -1 ||
        (req->last_step() >= 0 && req->last_step() < req->first_step())) {
      return absl::InvalidArgumentError("first_step, last_step: need 0 <= first <= last (or -1)");
    }
    if (req->timeout_seconds() < 0 || req->timeout_seconds() > 120) {
      return absl::InvalidArgumentError("timeout_seconds: must be 0..120");
    }
    const absl::Duration wait =
        absl::Seconds(req->timeout_seconds() == 0 ? 10 : req->timeout_seconds());
    LK_ASSIGN_OR_RETURN(TraceAnswers got, core_->CollectTrace(req->job_id(), req->first_step(),
                                                              req->last_step(), wait));
    size_t bytes = 0;
    for (auto& [rank, jsonl] : got.answers) {
      if (bytes + jsonl.size() > kMaxTraceAnswerBytes) {
        resp->add_omitted_ranks(rank);
        continue;
      }
      bytes += jsonl.size();
      v1::RankTraceLines* t = resp->add_ranks();
      t->set_rank(rank);
      t->set_jsonl(std::move(jsonl));
    }
    for (int r : got.missing) resp->add_missing_ranks(r);
    return absl::OkStatus();
  });
}

}  // namespace latchkey
