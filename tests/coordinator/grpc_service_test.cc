// Every RPC of JobService and WorkerService over a real gRPC server on loopback, including each
// error code of the table in docs/protocol.md.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/job_client.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "server/sqlite_store.h"
#include "tests/coordinator/grpc_fixture.h"

namespace latchkey::testing {
namespace {

class GrpcServiceTest : public CoordinatorRpcTest {
 protected:
  grpc::Status Join(const v1::SubmitJobResponse& job, const std::string& worker,
                    v1::JoinResponse* resp, int rank = -1) {
    v1::JoinRequest req;
    *req.mutable_identity() = Id(job, worker);
    if (rank >= 0) req.mutable_requested_rank()->set_value(rank);
    return workers_->Join(Ctx().get(), req, resp);
  }
};

TEST_F(GrpcServiceTest, SubmitGetListCancel) {
  v1::SubmitJobResponse job = Submit();
  EXPECT_EQ(job.job().state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(job.join_token().size(), 32u);

  v1::GetJobRequest get;
  get.set_job_id(job.job_id());
  v1::GetJobResponse got;
  ASSERT_TRUE(jobs_->GetJob(Ctx().get(), get, &got).ok());
  EXPECT_EQ(got.job().world_size(), 2);
  EXPECT_EQ(got.job().tp(), 2);
  EXPECT_EQ(got.job().steps(), 10);
  EXPECT_EQ(got.job().policy().kv_reduce(), v1::KV_REDUCE_POLICY_AUTO);
  EXPECT_NE(got.job().spec_json().find("gpt_bigcode"), std::string::npos);

  Submit();
  v1::ListJobsRequest list;
  v1::ListJobsResponse listed;
  ASSERT_TRUE(jobs_->ListJobs(Ctx().get(), list, &listed).ok());
  ASSERT_EQ(listed.jobs_size(), 2);
  EXPECT_EQ(listed.jobs(1).job_id(), job.job_id());  // newest first

  v1::CancelJobRequest cancel;
  cancel.set_job_id(job.job_id());
  cancel.set_reason("test");
  v1::CancelJobResponse cancelled;
  ASSERT_TRUE(jobs_->CancelJob(Ctx().get(), cancel, &cancelled).ok());
  EXPECT_EQ(cancelled.job().state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(cancelled.job().failure_reason(), "test");
  list.add_states(v1::JOB_STATE_CANCELLED);
  ASSERT_TRUE(jobs_->ListJobs(Ctx().get(), list, &listed).ok());
  ASSERT_EQ(listed.jobs_size(), 1);

  // FAILED_PRECONDITION: already ended.
  EXPECT_EQ(jobs_->CancelJob(Ctx().get(), cancel, &cancelled).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  // NOT_FOUND: unknown job.
  get.set_job_id("job-424242");
  EXPECT_EQ(jobs_->GetJob(Ctx().get(), get, &got).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(GrpcServiceTest, SubmitRefusesBadSpecsNamingTheField) {
  struct Case {
    SpecParams params;
    std::string json;  // used when set
    std::string field;
  };
  auto with = [](auto f) {
    SpecParams p;
    f(p);
    return p;
  };
  std::vector<Case> cases = {
      {with([](SpecParams& p) { p.tp = 3, p.world_size = 3; }), "", "tensor_parallel.autotp_size"},
      {with([](SpecParams& p) { p.tp = 16, p.world_size = 16; }), "",
       "tensor_parallel.autotp_size"},
      {with([](SpecParams& p) { p.zero_stage = 3; }), "", "zero_optimization.stage"},
      {with([](SpecParams& p) { p.gas = 0; }), "", "gradient_accumulation_steps"},
      {with([](SpecParams& p) { p.world_size = 3; }), "", "latchkey.world_size"},
      {with([](SpecParams& p) {
         p.extra_latchkey = {{"bogus", 1}};
       }),
       "", "latchkey.bogus"},
      {{},
       [] {
         nlohmann::json j = SpecObject();
         j["model"]["wat"] = 1;
         return j.dump();
       }(),
       "model.wat"},
      {{}, "not json", ""},
  };
  for (const Case& c : cases) {
    v1::SubmitJobRequest req;
    req.set_spec_json(c.json.empty() ? SpecJson(c.params) : c.json);
    v1::SubmitJobResponse resp;
    grpc::Status st = jobs_->SubmitJob(Ctx().get(), req, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << req.spec_json();
    EXPECT_NE(st.error_message().find(c.field), std::string::npos)
        << "want field " << c.field << " in: " << st.error_message();
  }
  // seq_len > n_positions
  nlohmann::json spec = SpecObject();
  spec["latchkey"]["seq_len"] = 65;
  v1::SubmitJobRequest req;
  req.set_spec_json(spec.dump());
  v1::SubmitJobResponse resp;
  grpc::Status st = jobs_->SubmitJob(Ctx().get(), req, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("latchkey.seq_len"), std::string::npos) << st.error_message();
}

// A second coordinator given a port the first serves on is refused, whether that socket was
// bound the way gRPC binds by default (SO_REUSEPORT, as older coordinators did: the kernel would
// have split the workers between the two) or as latchkey-coordinator binds now.
TEST(ServerPortTest, APortInUseIsRefused) {
  InProcessCoordinator first;
  auto store = SqliteStore::Open(":memory:");
  ASSERT_TRUE(store.ok()) << store.status();
  auto core = Coordinator::Create(*std::move(store), {}, nullptr);
  ASSERT_TRUE(core.ok()) << core.status();
  ServerOptions so;
  so.listen = first.address();
  auto second = CoordinatorServer::Start(core->get(), so);
  EXPECT_FALSE(second.ok()) << "both serve " << so.listen;
  if (!second.ok()) {
    EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  }

  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), len), 0);
  ASSERT_EQ(listen(fd, 16), 0);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  so.listen = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  auto third = CoordinatorServer::Start(core->get(), so);
  EXPECT_FALSE(third.ok()) << "shares " << so.listen << " with a SO_REUSEPORT socket";
  close(fd);
}

TEST_F(GrpcServiceTest, ServerBoundsMessageSize) {
  v1::SubmitJobRequest req;
  req.set_spec_json(std::string(2 << 20, ' '));  // 2 MiB > the 1 MiB bound
  v1::SubmitJobResponse resp;
  EXPECT_EQ(jobs_->SubmitJob(Ctx().get(), req, &resp).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  req.set_spec_json(std::string(512 << 10, ' '));  // under the transport bound, over the spec's
  EXPECT_EQ(jobs_->SubmitJob(Ctx().get(), req, &resp).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(GrpcServiceTest, JoinErrorsAndRendezvous) {
  v1::SubmitJobResponse job = Submit();
  v1::JoinResponse r;
  ASSERT_TRUE(Join(job, "a", &r).ok());
  EXPECT_EQ(r.rank(), 0);
  EXPECT_EQ(r.rendezvous().host(), "127.0.0.1");  // rank 0's peer address
  EXPECT_EQ(r.rendezvous().port(), 29500);
  EXPECT_EQ(r.state(), v1::JOB_STATE_PENDING);
  EXPECT_GT(r.liveness_timeout().seconds(), 0);
  ASSERT_TRUE(Join(job, "a", &r).ok());  // idempotent
  EXPECT_EQ(r.rank(), 0);
  // ABORTED: rank conflict.
  EXPECT_EQ(Join(job, "b", &r, 0).error_code(), grpc::StatusCode::ABORTED);
  ASSERT_TRUE(Join(job, "b", &r).ok());
  EXPECT_EQ(r.rank(), 1);
  EXPECT_EQ(r.tp_rank(), 1);
  EXPECT_EQ(r.dp_rank(), 0);
  EXPECT_EQ(r.state(), v1::JOB_STATE_RUNNING);
  // ABORTED: full.
  EXPECT_EQ(Join(job, "c", &r).error_code(), grpc::StatusCode::ABORTED);
  // UNAUTHENTICATED: bad token.
  v1::SubmitJobResponse forged = job;
  forged.set_join_token("0000");
  EXPECT_EQ(Join(forged, "d", &r).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  // NOT_FOUND: unknown job.
  forged.set_job_id("job-777777");
  EXPECT_EQ(Join(forged, "d", &r).error_code(), grpc::StatusCode::NOT_FOUND);
  // INVALID_ARGUMENT: no worker id.
  EXPECT_EQ(Join(job, "", &r).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // FAILED_PRECONDITION: the job ended.
  v1::CancelJobRequest cancel;
  cancel.set_job_id(job.job_id());
  v1::CancelJobResponse cr;
  ASSERT_TRUE(jobs_->CancelJob(Ctx().get(), cancel, &cr).ok());
  EXPECT_EQ(Join(job, "a", &r).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(GrpcServiceTest, LatchStreamReportStepHeartbeatUpdateAndAudit) {
  SpecParams p;
  p.steps = 3;
  v1::SubmitJobResponse job = Submit(p);
  v1::JoinResponse r;
  ASSERT_TRUE(Join(job, "a", &r).ok());
  ASSERT_TRUE(Join(job, "b", &r).ok());

  // The stream of rank 0 from window 0: lookahead 1 -> windows 0 and 1 right away.
  auto ctx = Ctx();
  v1::WatchLatchesRequest wreq;
  *wreq.mutable_identity() = Id(job, "a");
  wreq.set_rank(0);
  auto stream = workers_->WatchLatches(ctx.get(), wreq);
  v1::WatchLatchesResponse m;
  ASSERT_TRUE(stream->Read(&m));
  EXPECT_EQ(m.latch().window(), 0);
  EXPECT_EQ(m.latch().kv_mode(), v1::KV_MODE_COALESCED);
  EXPECT_GT(m.latch().publish_time().seconds(), 0);
  ASSERT_TRUE(stream->Read(&m));
  EXPECT_EQ(m.latch().window(), 1);

  // ABORTED: a stream for a rank the caller does not hold.
  {
    auto c2 = Ctx();
    v1::WatchLatchesRequest bad = wreq;
    bad.set_rank(1);
    auto s2 = workers_->WatchLatches(c2.get(), bad);
    v1::WatchLatchesResponse m2;
    EXPECT_FALSE(s2->Read(&m2));
    EXPECT_EQ(s2->Finish().error_code(), grpc::StatusCode::ABORTED);
  }

  // UpdateJobPolicy: windows 0, 1 are published, so the change starts at 2.
  v1::UpdateJobPolicyRequest ureq;
  ureq.set_job_id(job.job_id());
  ureq.set_kv_reduce(v1::KV_REDUCE_POLICY_PER_MICRO_BATCH);
  ureq.mutable_expected_generation()->set_value(0);
  v1::UpdateJobPolicyResponse uresp;
  ASSERT_TRUE(jobs_->UpdateJobPolicy(Ctx().get(), ureq, &uresp).ok());
  EXPECT_EQ(uresp.first_window(), 2);
  EXPECT_EQ(uresp.policy().generation(), 1);
  // ABORTED: stale generation.
  EXPECT_EQ(jobs_->UpdateJobPolicy(Ctx().get(), ureq, &uresp).error_code(),
            grpc::StatusCode::ABORTED);
  // INVALID_ARGUMENT: nothing to change.
  v1::UpdateJobPolicyRequest empty;
  empty.set_job_id(job.job_id());
  EXPECT_EQ(jobs_->UpdateJobPolicy(Ctx().get(), empty, &uresp).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);

  auto report = [&](const std::string& worker, int rank, int64_t step, int64_t gen) {
    v1::ReportStepRequest req;
    *req.mutable_identity() = Id(job, worker);
    req.set_rank(rank);
    req.set_step(step);
    req.set_kv_mode(v1::KV_MODE_COALESCED);
    req.set_latch_generation(gen);
    req.set_loss(2.0);
    req.set_tokens(256);
    req.set_step_seconds(0.5);
    (*req.mutable_collective_calls())["all_reduce/tp"] = 96;
    v1::ReportStepResponse resp;
    return workers_->ReportStep(Ctx().get(), req, &resp);
  };
  // ABORTED: the step ran under a stale generation.
  EXPECT_EQ(report("a", 0, 0, 1).error_code(), grpc::StatusCode::ABORTED);
  // FAILED_PRECONDITION: no latch for that window yet.
  EXPECT_EQ(report("a", 0, 2, 1).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  // INVALID_ARGUMENT: beyond the job.
  EXPECT_EQ(report("a", 0, 99, 0).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // UNAUTHENTICATED on every worker call.
  v1::HeartbeatRequest hb;
  *hb.mutable_identity() = Id(job, "a");
  hb.mutable_identity()->set_join_token("x");
  v1::HeartbeatResponse hr;
  EXPECT_EQ(workers_->Heartbeat(Ctx().get(), hb, &hr).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  *hb.mutable_identity() = Id(job, "a");
  ASSERT_TRUE(workers_->Heartbeat(Ctx().get(), hb, &hr).ok());
  EXPECT_EQ(hr.state(), v1::JOB_STATE_RUNNING);

  ASSERT_TRUE(report("a", 0, 0, 0).ok());
  ASSERT_TRUE(report("a", 0, 0, 0).ok());  // idempotent
  ASSERT_TRUE(report("b", 1, 0, 0).ok());
  ASSERT_TRUE(stream->Read(&m));  // window 2, decided under generation 1
  EXPECT_EQ(m.latch().window(), 2);
  EXPECT_EQ(m.latch().generation(), 1);
  EXPECT_EQ(m.latch().kv_mode(), v1::KV_MODE_PER_MICRO_BATCH);
  for (int64_t s = 1; s < 3; ++s) {
    ASSERT_TRUE(report("a", 0, s, s < 2 ? 0 : 1).ok());
    ASSERT_TRUE(report("b", 1, s, s < 2 ? 0 : 1).ok());
  }
  ASSERT_TRUE(stream->Read(&m));
  ASSERT_TRUE(m.has_job_ended());
  EXPECT_EQ(m.job_ended().state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_FALSE(stream->Read(&m));
  EXPECT_TRUE(stream->Finish().ok());

  v1::ListLatchesRequest lreq;
  lreq.set_job_id(job.job_id());
  lreq.set_page_size(2);
  v1::ListLatchesResponse lresp;
  ASSERT_TRUE(jobs_->ListLatches(Ctx().get(), lreq, &lresp).ok());
  ASSERT_EQ(lresp.latches_size(), 2);
  EXPECT_EQ(lresp.next_start_window(), 2);
  ASSERT_EQ(lresp.policy_changes_size(), 1);
  EXPECT_EQ(lresp.policy_changes(0).first_window(), 2);
  lreq.set_start_window(2);
  ASSERT_TRUE(jobs_->ListLatches(Ctx().get(), lreq, &lresp).ok());
  ASSERT_EQ(lresp.latches_size(), 1);
  EXPECT_EQ(lresp.next_start_window(), 0);

  // The job's summary carries the last step.
  v1::GetJobRequest get;
  get.set_job_id(job.job_id());
  v1::GetJobResponse got;
  ASSERT_TRUE(jobs_->GetJob(Ctx().get(), get, &got).ok());
  EXPECT_EQ(got.job().state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(got.job().last_step().step(), 2);
  EXPECT_EQ(got.job().last_step().ranks_reported(), 2);
  EXPECT_EQ(got.job().workers(1).state(), v1::WORKER_STATE_DONE);
  // FAILED_PRECONDITION: policy of an ended job.
  ureq.clear_expected_generation();
  EXPECT_EQ(jobs_->UpdateJobPolicy(Ctx().get(), ureq, &uresp).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(GrpcServiceTest, ReportFailureFailsJobAndEndsStreams) {
  SpecParams p;
  p.extra_latchkey = {{"max_restarts", 0}};  // a failure fails the job
  v1::SubmitJobResponse job = Submit(p);
  v1::JoinResponse r;
  ASSERT_TRUE(Join(job, "a", &r).ok());
  ASSERT_TRUE(Join(job, "b", &r).ok());
  auto ctx = Ctx();
  v1::WatchLatchesRequest wreq;
  *wreq.mutable_identity() = Id(job, "a");
  wreq.set_start_window(5);  // nothing there yet: the stream waits
  auto stream = workers_->WatchLatches(ctx.get(), wreq);

  v1::ReportFailureRequest freq;
  *freq.mutable_identity() = Id(job, "b");
  freq.set_rank(1);
  freq.set_message("latchkey.data.tokens_file: /nope.bin: no such file");
  v1::ReportFailureResponse fresp;
  ASSERT_TRUE(workers_->ReportFailure(Ctx().get(), freq, &fresp).ok());
  EXPECT_EQ(fresp.state(), v1::JOB_STATE_FAILED);
  v1::WatchLatchesResponse m;
  ASSERT_TRUE(stream->Read(&m));
  ASSERT_TRUE(m.has_job_ended());
  EXPECT_EQ(m.job_ended().state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(m.job_ended().reason().find("rank 1"), std::string::npos);
  EXPECT_NE(m.job_ended().reason().find("latchkey.data.tokens_file"), std::string::npos);
}

TEST_F(GrpcServiceTest, WatchJobStreamsStateAndSteps) {
  SpecParams p;
  p.world_size = 1;
  p.tp = 1;
  p.steps = 2;
  v1::SubmitJobResponse job = Submit(p);
  JobClient client({server_->address(), absl::Seconds(5), absl::ZeroDuration(), {}});
  std::vector<JobUpdate> seen;
  absl::Notification first;
  std::optional<JobState> first_state;
  std::thread watcher([&] {
    auto end = client.WatchJob(
        job.job_id(),
        [&](const JobUpdate& m) {
          seen.push_back(m);
          if (!first.HasBeenNotified()) {
            first_state = m.job.state;
            first.Notify();
          }
          return true;
        },
        absl::Now() + absl::Seconds(20));
    EXPECT_TRUE(end.ok()) << end.status();
    if (end.ok()) {
      EXPECT_EQ(end->state, JobState::kSucceeded);
    }
  });
  ASSERT_TRUE(first.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(first_state, JobState::kPending);  // the job as it was
  v1::JoinResponse r;
  ASSERT_TRUE(Join(job, "solo", &r).ok());
  for (int64_t s = 0; s < 2; ++s) {
    v1::ReportStepRequest req;
    *req.mutable_identity() = Id(job, "solo");
    req.set_step(s);
    req.set_kv_mode(v1::KV_MODE_COALESCED);
    req.set_loss(3.0 - s);
    v1::ReportStepResponse resp;
    ASSERT_TRUE(workers_->ReportStep(Ctx().get(), req, &resp).ok());
  }
  watcher.join();
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back().job.state, JobState::kSucceeded);
  int steps = 0;
  for (const auto& m : seen) steps += m.step.has_value() ? 1 : 0;
  EXPECT_GE(steps, 1);
  // NOT_FOUND through the stream.
  auto missing = client.WatchJob(
      "job-555555", [](const JobUpdate&) { return true; }, absl::Now() + absl::Seconds(5));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
}

// A watcher that attaches after steps completed sees them only when it asks for the replay;
// either way the steps after it attached follow, each once, in order.
TEST_F(GrpcServiceTest, WatchJobReplaysTheStepsBeforeItOnlyWhenAsked) {
  SpecParams p;
  p.world_size = 1;
  p.tp = 1;
  p.steps = 3;
  v1::SubmitJobResponse job = Submit(p);
  v1::JoinResponse r;
  ASSERT_TRUE(Join(job, "solo", &r).ok());
  const auto report = [&](int64_t s) {
    v1::ReportStepRequest req;
    *req.mutable_identity() = Id(job, "solo");
    req.set_step(s);
    req.set_kv_mode(v1::KV_MODE_COALESCED);
    req.set_loss(3.0 - s);
    v1::ReportStepResponse resp;
    return workers_->ReportStep(Ctx().get(), req, &resp);
  };
  ASSERT_TRUE(report(0).ok());
  ASSERT_TRUE(report(1).ok());
  JobClient client({server_->address(), absl::Seconds(5), absl::ZeroDuration(), {}});
  for (const bool replay : {false, true}) {
    std::vector<int64_t> steps;
    absl::Notification attached;
    std::thread watcher([&] {
      auto end = client.WatchJob(
          job.job_id(),
          [&](const JobUpdate& m) {
            if (m.step) steps.push_back(m.step->report.step);
            if (!attached.HasBeenNotified()) attached.Notify();
            return true;
          },
          absl::Now() + absl::Seconds(20), replay);
      EXPECT_TRUE(end.ok()) << end.status();  // the stream ends with the job
    });
    ASSERT_TRUE(attached.WaitForNotificationWithTimeout(absl::Seconds(10)));
    if (!replay) {
      absl::SleepFor(absl::Milliseconds(200));  // the stream is open before the last step
      ASSERT_TRUE(report(2).ok());
    }
    watcher.join();
    EXPECT_EQ(steps, replay ? (std::vector<int64_t>{0, 1, 2}) : (std::vector<int64_t>{2}))
        << "replay " << replay;
  }
}

TEST_F(GrpcServiceTest, MetricsCountJobsWorkersAndLatches) {
  SpecParams p;
  p.steps = 4;
  v1::SubmitJobResponse job = Submit(p);
  v1::JoinResponse r;
  ASSERT_TRUE(Join(job, "a", &r).ok());
  ASSERT_TRUE(Join(job, "b", &r).ok());
  const std::string text = server_->metrics().Serialize();
  EXPECT_NE(text.find("latchkey_jobs{state=\"running\"} 1"), std::string::npos) << text;
  EXPECT_NE(text.find("latchkey_workers{state=\"active\"} 2"), std::string::npos) << text;
  EXPECT_NE(text.find("latchkey_latches_published_total{kv_mode=\"coalesced\"} 2"),
            std::string::npos)
      << text;
}

}  // namespace
}  // namespace latchkey::testing
