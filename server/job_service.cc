#include "server/job_service.h"

#include <string>
#include <vector>

#include "proto/grpc_status.h"
#include "proto/wire.h"

namespace latchkey {
namespace {

v1::StepSummary ToProto(const StepSummary& s) {
  v1::StepSummary out;
  out.set_step(s.step);
  out.set_micro_batches(s.micro_batches);
  out.set_loss(s.loss);
  out.set_grad_norm(s.grad_norm);
  out.set_kv_mode(latchkey::ToProto(s.kv_mode));
  out.set_kv_allreduce_calls(s.kv_allreduce_calls);
  out.set_step_seconds(s.step_seconds);
  out.set_tokens(s.tokens);
  out.set_ranks_reported(s.ranks_reported);
  return out;
}

v1::JobPolicy ToProto(const LatchPolicy& p) {
  v1::JobPolicy out;
  out.set_kv_reduce(latchkey::ToProto(p.kv_reduce));
  out.set_gradient_accumulation_steps(p.gradient_accumulation_steps);
  out.set_generation(p.generation);
  return out;
}

v1::Job ToProto(const JobView& v) {
  const JobRecord& r = v.record;
  v1::Job out;
  out.set_job_id(r.job_id);
  out.set_state(static_cast<v1::JobState>(r.state));
  out.set_spec_json(r.spec_json);
  out.set_base_dir(r.base_dir);
  out.set_world_size(v.world_size);
  out.set_tp(v.tp);
  out.set_dp(v.dp);
  out.set_steps(v.steps);
  *out.mutable_policy() = ToProto(r.policy);
  out.mutable_rendezvous()->set_host(r.rendezvous_host);
  out.mutable_rendezvous()->set_port(r.rendezvous_port);
  out.set_workers_joined(v.workers_joined);
  for (const WorkerView& w : v.workers) {
    v1::WorkerInfo* o = out.add_workers();
    o->set_rank(w.rank);
    o->set_worker_id(w.worker_id);
    o->set_state(static_cast<v1::WorkerState>(w.state));
    o->set_tp_rank(w.tp_rank);
    o->set_dp_rank(w.dp_rank);
    o->set_host(w.host);
    *o->mutable_last_seen_time() = ToProtoTime(w.last_seen);
    o->set_steps_reported(w.steps_reported);
  }
  out.set_windows_published(r.next_window);
  out.set_steps_completed(v.steps_completed);
  if (v.last_step) *out.mutable_last_step() = ToProto(*v.last_step);
  out.set_failure_reason(r.failure_reason);
  for (const std::string& w : r.warnings) out.add_warnings(w);
  *out.mutable_create_time() = ToProtoTime(r.create_time);
  *out.mutable_update_time() = ToProtoTime(r.update_time);
  return out;
}

}  // namespace

grpc::Status JobServiceImpl::SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest* req,
                                       v1::SubmitJobResponse* resp) {
  SubmitArgs args;
  args.spec_json = req->spec_json();
  args.base_dir = req->base_dir();
  args.rendezvous_host = req->rendezvous_host();
  args.rendezvous_port = req->rendezvous_port();
  auto r = core_->SubmitJob(args);
  if (!r.ok()) return ToGrpcStatus(r.status());
  resp->set_job_id(r->job.record.job_id);
  resp->set_join_token(r->join_token);
  *resp->mutable_job() = ToProto(r->job);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::GetJob(grpc::ServerContext*, const v1::GetJobRequest* req,
                                    v1::GetJobResponse* resp) {
  auto r = core_->GetJob(req->job_id(), /*with_workers=*/true);
  if (!r.ok()) return ToGrpcStatus(r.status());
  *resp->mutable_job() = ToProto(*r);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::ListJobs(grpc::ServerContext*, const v1::ListJobsRequest* req,
                                      v1::ListJobsResponse* resp) {
  std::vector<JobState> states;
  for (int s : req->states()) {
    if (s < static_cast<int>(JobState::kPending) || s > static_cast<int>(JobState::kCancelled)) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "states: " + std::to_string(s) + " is not a job state");
    }
    states.push_back(static_cast<JobState>(s));
  }
  auto r = core_->ListJobs(states, req->page_size());
  if (!r.ok()) return ToGrpcStatus(r.status());
  for (const JobView& v : *r) *resp->add_jobs() = ToProto(v);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::CancelJob(grpc::ServerContext*, const v1::CancelJobRequest* req,
                                       v1::CancelJobResponse* resp) {
  auto r = core_->CancelJob(req->job_id(), req->reason().substr(0, 1024));
  if (!r.ok()) return ToGrpcStatus(r.status());
  *resp->mutable_job() = ToProto(*r);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::UpdateJobPolicy(grpc::ServerContext*,
                                             const v1::UpdateJobPolicyRequest* req,
                                             v1::UpdateJobPolicyResponse* resp) {
  PolicyUpdate u;
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
  *resp->mutable_policy() = ToProto(r->policy);
  resp->set_first_window(r->first_window);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::WatchJob(grpc::ServerContext* ctx, const v1::WatchJobRequest* req,
                                      grpc::ServerWriter<v1::WatchJobResponse>* writer) {
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
    const v1::Job job = ToProto(u->job);
    if (first || u->steps.empty()) {
      // The first message is the job as it is now, not a replay of its history.
      v1::WatchJobResponse m;
      *m.mutable_job() = job;
      if (!writer->Write(m)) return grpc::Status(grpc::StatusCode::CANCELLED, "client gone");
    } else {
      for (const StepSummary& s : u->steps) {
        v1::WatchJobResponse m;
        *m.mutable_job() = job;
        *m.mutable_step() = ToProto(s);
        if (!writer->Write(m)) return grpc::Status(grpc::StatusCode::CANCELLED, "client gone");
      }
    }
    if (!u->steps.empty()) last_step = u->steps.back().step;
    first = false;
    if (IsTerminal(u->job.record.state)) return grpc::Status::OK;
  }
  return grpc::Status(grpc::StatusCode::CANCELLED, "client cancelled");
}

grpc::Status JobServiceImpl::ListLatches(grpc::ServerContext*, const v1::ListLatchesRequest* req,
                                         v1::ListLatchesResponse* resp) {
  auto r = core_->ListLatches(req->job_id(), req->start_window(), req->page_size());
  if (!r.ok()) return ToGrpcStatus(r.status());
  for (const PublishedLatch& p : r->latches) {
    v1::Latch* l = resp->add_latches();
    *l = latchkey::ToProto(p.latch);
    *l->mutable_publish_time() = ToProtoTime(p.publish_time);
  }
  for (const PolicyChangeRecord& c : r->policy_changes) {
    v1::PolicyChange* o = resp->add_policy_changes();
    *o->mutable_policy() = ToProto(c.policy);
    o->set_first_window(c.first_window);
    *o->mutable_change_time() = ToProtoTime(c.change_time);
  }
  resp->set_next_start_window(r->next_start_window);
  return grpc::Status::OK;
}

}  // namespace latchkey
