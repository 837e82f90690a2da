#include "client/job_client.h"

#include <grpcpp/client_context.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/connection_hint.h"
#include "latchkey/v1/job_service.grpc.pb.h"
#include "proto/channel.h"
#include "proto/grpc_status.h"
#include "proto/wire.h"

namespace latchkey {

struct JobClient::Impl {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::JobService::Stub> stub;
  // Whether a call was ever answered: a channel that worked and broke (a coordinator restart)
  // is waited for, one that never worked fails at once ("is the coordinator running?").
  mutable std::atomic<bool> answered{false};
  absl::Status channel_error;  // the credentials could not be loaded: every call fails so
  bool tls = false;
  std::string coordinator;

  // An unreachable coordinator: nothing listening, or one that speaks TLS to a plaintext
  // client (or the reverse, or one whose certificate the CA did not sign): say which
  // (common/connection_hint.h).
  absl::Status Explain(const grpc::Status& st) const {
    absl::Status s = FromGrpcStatus(st);
    if (s.code() != absl::StatusCode::kUnavailable) return s;
    return absl::Status(s.code(), ExplainUnavailable(s.message(), coordinator, tls));
  }
};

JobClient::JobClient(ClientOptions options)
    : impl_(std::make_unique<Impl>()), options_(std::move(options)) {
  impl_->tls = options_.credentials.tls();
  impl_->coordinator = options_.coordinator;
  auto channel = MakeCoordinatorChannel(options_.coordinator, options_.credentials);
  if (!channel.ok()) {
    impl_->channel_error = channel.status();
    channel = MakeCoordinatorChannel(options_.coordinator);
  }
  impl_->channel = *channel;
  impl_->stub = v1::JobService::NewStub(impl_->channel);
}

JobClient::~JobClient() = default;

namespace {

template <typename Resp, typename Req, typename Method, typename Impl>
absl::StatusOr<Resp> Call(const Impl& impl, Method method, const Req& req, absl::Duration timeout) {
  if (!impl.channel_error.ok()) return impl.channel_error;
  const absl::Time deadline = absl::Now() + timeout;
  Resp resp;
  grpc::Status st;
  for (int sent = 0; sent < 2; ++sent) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline));
    st = (impl.stub.get()->*method)(&ctx, req, &resp);
    if (st.ok()) impl.answered = true;
    // A call on a channel that broke fails at once; gRPC reconnects it only while someone
    // waits on it. A client that was answered before waits (within the call's deadline) for
    // the coordinator to come back, and sends the call once more.
    if (st.error_code() != grpc::StatusCode::UNAVAILABLE || !impl.answered ||
        !impl.channel->WaitForConnected(absl::ToChronoTime(deadline))) {
      break;
    }
  }
  if (!st.ok()) return impl.Explain(st);
  return resp;
}

}  // namespace

absl::StatusOr<SubmittedJob> JobClient::SubmitJob(const JobSubmission& submission) {
  auto r = Call<v1::SubmitJobResponse>(*impl_, &v1::JobService::Stub::SubmitJob,
                                       ToProto(submission), options_.timeout);
  if (!r.ok()) return r.status();
  return FromProto(*r);
}

absl::StatusOr<JobInfo> JobClient::GetJob(const std::string& job_id) {
  auto r = Call<v1::GetJobResponse>(*impl_, &v1::JobService::Stub::GetJob,
                                    MakeGetJobRequest(job_id), options_.timeout);
  if (!r.ok()) return r.status();
  return FromProto(r->job());
}

absl::StatusOr<std::vector<JobInfo>> JobClient::ListJobs(const std::vector<JobState>& states,
                                                         int limit) {
  auto r = Call<v1::ListJobsResponse>(*impl_, &v1::JobService::Stub::ListJobs,
                                      MakeListJobsRequest(states, limit), options_.timeout);
  if (!r.ok()) return r.status();
  std::vector<JobInfo> out;
  out.reserve(static_cast<size_t>(r->jobs_size()));
  for (const v1::Job& j : r->jobs()) out.push_back(FromProto(j));
  return out;
}

absl::StatusOr<JobInfo> JobClient::CancelJob(const std::string& job_id, const std::string& reason) {
  auto r = Call<v1::CancelJobResponse>(*impl_, &v1::JobService::Stub::CancelJob,
                                       MakeCancelJobRequest(job_id, reason), options_.timeout);
  if (!r.ok()) return r.status();
  return FromProto(r->job());
}

absl::StatusOr<JobInfo> JobClient::ResumeJob(const std::string& job_id, const std::string& reason) {
  v1::ResumeJobRequest req;
  req.set_job_id(job_id);
  req.set_reason(reason);
  auto r =
      Call<v1::ResumeJobResponse>(*impl_, &v1::JobService::Stub::ResumeJob, req, options_.timeout);
  if (!r.ok()) return r.status();
  return FromProto(r->job());
}

absl::StatusOr<JobInfo> JobClient::SuspendJob(const std::string& job_id,
                                              const std::string& reason) {
  v1::SuspendJobRequest req;
  req.set_job_id(job_id);
  req.set_reason(reason);
  auto r = Call<v1::SuspendJobResponse>(*impl_, &v1::JobService::Stub::SuspendJob, req,
                                        options_.timeout);
  if (!r.ok()) return r.status();
  return FromProto(r->job());
}

absl::StatusOr<JobPolicyUpdateResult> JobClient::UpdateJobPolicy(const JobPolicyUpdate& update) {
  auto r = Call<v1::UpdateJobPolicyResponse>(*impl_, &v1::JobService::Stub::UpdateJobPolicy,
                                             ToProto(update), options_.timeout);
  if (!r.ok()) return r.status();
  return FromProto(*r);
}

absl::StatusOr<LatchAuditPage> JobClient::ListLatches(const std::string& job_id,
                                                      int64_t start_window, int page_size) {
  auto r = Call<v1::ListLatchesResponse>(*impl_, &v1::JobService::Stub::ListLatches,
                                         MakeListLatchesRequest(job_id, start_window, page_size),
                                         options_.timeout);
  if (!r.ok()) return r.status();
  return FromProto(*r);
}

absl::StatusOr<JobClient::TraceLines> JobClient::GetTrace(const std::string& job_id,
                                                          int64_t first_step, int64_t last_step,
                                                          absl::Duration wait) {
  v1::GetTraceRequest req;
  req.set_job_id(job_id);
  req.set_first_step(first_step);
  req.set_last_step(last_step);
  req.set_timeout_seconds(static_cast<int32_t>(absl::ToInt64Seconds(wait)));
  // The call lasts as long as the ranks are waited for, and then some.
  auto r = Call<v1::GetTraceResponse>(*impl_, &v1::JobService::Stub::GetTrace, req,
                                      wait + options_.timeout);
  if (!r.ok()) return r.status();
  TraceLines out;
  for (const v1::RankTraceLines& t : r->ranks()) out.ranks[t.rank()] = t.jsonl();
  out.missing.assign(r->missing_ranks().begin(), r->missing_ranks().end());
  out.omitted.assign(r->omitted_ranks().begin(), r->omitted_ranks().end());
  return out;
}

absl::StatusOr<LatchAuditPage> JobClient::ListAllLatches(const std::string& job_id,
                                                         int64_t start_window) {
  LatchAuditPage all;
  int64_t next = start_window;
  while (true) {
    auto page = ListLatches(job_id, next);
    if (!page.ok()) return page.status();
    for (AuditedLatch& l : page->latches) all.latches.push_back(std::move(l));
    // Every page carries the job's whole list of policy changes; events are kept once each
    // (however the pages split them).
    all.policy_changes = std::move(page->policy_changes);
    for (AuditedEvent& e : page->events) {
      const bool seen = std::any_of(all.events.begin(), all.events.end(), [&](const auto& x) {
        return x.time == e.time && x.attempt == e.attempt && x.kind == e.kind &&
               x.message == e.message;
      });
      if (!seen) all.events.push_back(std::move(e));
    }
    // The coordinator always moves forward; a next window that does not would loop forever.
    if (page->next_start_window == 0 || page->next_start_window <= next) break;
    next = page->next_start_window;
  }
  return all;
}

absl::StatusOr<JobInfo> JobClient::WatchJob(const std::string& job_id,
                                            const std::function<bool(const JobUpdate&)>& on_update,
                                            absl::Time deadline, bool replay_recent_steps) {
  if (!impl_->channel_error.ok()) return impl_->channel_error;
  v1::WatchJobRequest req = MakeWatchJobRequest(job_id, replay_recent_steps);
  // A reopened stream replays the steps the coordinator holds, and those delivered already are
  // dropped: the steps completed while the stream was down (a coordinator restart, a network
  // blip) reach the caller, none twice.
  int64_t last_delivered_step = -1;
  bool got_any_before = false;  // any message on any stream
  absl::Duration backoff = absl::Milliseconds(100);
  absl::Time unreachable_since = absl::InfiniteFuture();
  // Even an endless watch has a deadline per stream: it is reopened after each.
  constexpr absl::Duration kStreamAttempt = absl::Minutes(30);
  while (true) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(std::min(deadline, absl::Now() + kStreamAttempt)));
    auto reader = impl_->stub->WatchJob(&ctx, req);
    req.set_replay_recent_steps(true);
    v1::WatchJobResponse m;
    JobInfo last;
    bool got_any = false;
    while (reader->Read(&m)) {
      got_any = true;
      impl_->answered = true;
      unreachable_since = absl::InfiniteFuture();
      backoff = absl::Milliseconds(100);
      JobUpdate update = FromProto(m);
      last = update.job;
      if (!got_any_before && !replay_recent_steps && update.job.last_step) {
        // Without replay the caller starts from the job as it is: older steps stay unsent.
        last_delivered_step = std::max(last_delivered_step, update.job.last_step->report.step);
      }
      got_any_before = true;
      if (update.step) {
        if (update.step->report.step <= last_delivered_step) continue;
        last_delivered_step = update.step->report.step;
      }
      if (!on_update(update)) {
        ctx.TryCancel();
        reader->Finish().ok();
        return absl::CancelledError("watch stopped");
      }
    }
    grpc::Status st = reader->Finish();
    if (st.ok() && got_any) return last;  // the server ends the stream when the job ends
    if (!st.ok() && !IsRetryable(st.error_code())) return impl_->Explain(st);
    const absl::Time now = absl::Now();
    if (now >= deadline) return absl::DeadlineExceededError("watch deadline passed");
    if (unreachable_since == absl::InfiniteFuture()) unreachable_since = now;
    const absl::Duration patience = options_.watch_reconnect > absl::ZeroDuration()
                                        ? options_.watch_reconnect
                                        : options_.timeout;
    if (now - unreachable_since > patience) {
      return st.ok() ? absl::UnavailableError("watch stream ended without news")
                     : impl_->Explain(st);
    }
    // Waiting on the channel, not a plain sleep: gRPC reconnects a broken channel only while
    // someone waits on it, and a stream opened on it fails at once.
    const absl::Time wake = now + std::min(backoff, deadline - now);
    if (st.ok() || !impl_->channel->WaitForConnected(absl::ToChronoTime(wake))) {
      absl::SleepFor(wake - absl::Now());  // (returns at once past `wake`)
    }
    backoff = std::min(backoff * 2, absl::Seconds(2));
  }
}

}  // namespace latchkey
