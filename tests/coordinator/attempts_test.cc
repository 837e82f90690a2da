// Attempts over real gRPC on loopback (docs/fault-tolerance.md): the join answer of a new
// attempt, the fence as a worker sees it (ABORTED naming both attempts, its latch stream ended),
// ReportCheckpoint, heartbeat positions, the job's fault-tolerance fields and events through
// JobClient, the metrics of recoveries, and the rejoin deadline under the liveness checker.
#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <string>

#include "client/job_client.h"
#include "common/error_info.h"
#include "gtest/gtest.h"
#include "proto/grpc_status.h"
#include "proto/wire.h"
#include "tests/coordinator/grpc_fixture.h"

namespace latchkey::testing {
namespace {

class AttemptsTest : public CoordinatorRpcTest {
 protected:
  v1::SubmitJobResponse Submit(int max_restarts = -1) {
    SpecParams p;
    p.steps = 4;
    if (max_restarts >= 0) p.extra_latchkey["max_restarts"] = max_restarts;
    return CoordinatorRpcTest::Submit(p);
  }

  JoinInfo Join(const v1::SubmitJobResponse& job, const std::string& worker, int rank) {
    v1::JoinRequest req;
    *req.mutable_identity() = Id(job, worker, 0);
    req.mutable_requested_rank()->set_value(rank);
    v1::JoinResponse resp;
    grpc::Status st = workers_->Join(Ctx().get(), req, &resp);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return FromProto(resp);
  }

  grpc::Status Step(const v1::SubmitJobResponse& job, const std::string& worker, int64_t attempt,
                    int rank, int64_t step, double boundary_wait) {
    StepReport report;
    report.step = step;
    report.loss = 2.0;
    report.boundary_wait_seconds = boundary_wait;
    v1::ReportStepRequest req = ToProto(report);
    *req.mutable_identity() = Id(job, worker, attempt);
    req.set_rank(rank);
    v1::ReportStepResponse resp;
    return workers_->ReportStep(Ctx().get(), req, &resp);
  }
};

TEST_F(AttemptsTest, RecoveryFencesTheOldAttemptAndTheNewOneResumesFromTheCheckpoint) {
  const std::string before = server_->metrics().Serialize();
  for (const char* series :
       {"latchkey_stalled_ranks 0", "latchkey_job_restarts_total 0",
        "latchkey_boundary_arrival_lag_seconds_count 0", "latchkey_jobs{state=\"recovering\"} 0"}) {
    EXPECT_NE(before.find(series), std::string::npos) << series << "\n" << before;
  }
  v1::SubmitJobResponse job = Submit();
  JoinInfo a = Join(job, "a", 0);
  Join(job, "b", 1);
  EXPECT_EQ(a.attempt, 1);
  EXPECT_EQ(a.rendezvous_prefix, job.job_id());
  EXPECT_EQ(a.heartbeat_interval, absl::Seconds(1));

  // Rank 1 waits in the boundary collective a quarter second longer than rank 0.
  ASSERT_TRUE(Step(job, "a", 1, 0, 0, 0.5).ok());
  ASSERT_TRUE(Step(job, "b", 1, 1, 0, 0.75).ok());
  v1::ReportCheckpointRequest ck = ToProto(CheckpointReport{0, "5ha", 2048, 0.1});
  *ck.mutable_identity() = Id(job, "a", 1);
  v1::ReportCheckpointResponse ckr;
  ASSERT_TRUE(workers_->ReportCheckpoint(Ctx().get(), ck, &ckr).ok());
  EXPECT_EQ(ckr.state(), v1::JOB_STATE_RUNNING);

  RankPosition pos;
  pos.attempt = 1;
  pos.window = 1;
  pos.micro_batch = 2;
  pos.phase = RankPhase::kCollective;
  pos.op = "all_reduce";
  pos.group = "tp";
  pos.seq = 3;
  pos.seconds = 0.25;
  v1::HeartbeatRequest hb;
  *hb.mutable_identity() = Id(job, "a", 1);
  *hb.mutable_position() = ToProto(pos);
  v1::HeartbeatResponse hbr;
  ASSERT_TRUE(workers_->Heartbeat(Ctx().get(), hb, &hbr).ok());
  EXPECT_EQ(hbr.attempt(), 1);

  // Rank 0's latch stream from window 2: nothing there yet.
  auto sctx = Ctx();
  v1::WatchLatchesRequest wreq;
  *wreq.mutable_identity() = Id(job, "a", 1);
  wreq.set_start_window(3);
  auto stream = workers_->WatchLatches(sctx.get(), wreq);

  // A supervisor reports rank 1's death (attempt 0: whatever attempt it was in).
  v1::ReportFailureRequest fail;
  *fail.mutable_identity() = Id(job, "b", 0);
  fail.set_rank(1);
  fail.set_message("process exited: killed by signal 9");
  v1::ReportFailureResponse failr;
  ASSERT_TRUE(workers_->ReportFailure(Ctx().get(), fail, &failr).ok());
  EXPECT_EQ(failr.state(), v1::JOB_STATE_RECOVERING);
  EXPECT_EQ(failr.attempt(), 2);

  // The old attempt's stream ends ABORTED, naming the attempts; so does every other call.
  v1::WatchLatchesResponse m;
  while (stream->Read(&m)) {
  }
  grpc::Status ended = stream->Finish();
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::ABORTED);
  const std::string fenced =
      "worker a is at attempt 1; job " + job.job_id() + " is at attempt 2 (fenced)";
  EXPECT_EQ(ended.error_message(), fenced);
  grpc::Status late = Step(job, "a", 1, 0, 1, 0.0);
  EXPECT_EQ(late.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_EQ(late.error_message(), fenced);
  // The fence as data: ATTEMPT_FENCED with both attempts, whatever the message says.
  for (const grpc::Status& st : {ended, late}) {
    const std::optional<ErrorInfo> info = GetErrorInfo(FromGrpcStatus(st));
    ASSERT_TRUE(info.has_value()) << st.error_message();
    EXPECT_EQ(info->domain, "latchkey.v1");
    EXPECT_EQ(info->reason, "ATTEMPT_FENCED");
    EXPECT_EQ(info->IntMetadata("job_attempt"), 2);
    EXPECT_EQ(info->IntMetadata("worker_attempt"), 1);
  }
  EXPECT_EQ(workers_->Heartbeat(Ctx().get(), hb, &hbr).error_code(), grpc::StatusCode::ABORTED);

  // The new attempt: a fresh rendezvous, the checkpoint to resume from.
  JoinInfo b2 = Join(job, "b2", 1);
  EXPECT_EQ(b2.attempt, 2);
  EXPECT_EQ(b2.rendezvous_prefix, job.job_id() + "/a2");
  EXPECT_EQ(b2.rendezvous_host, "");  // rank 0 of attempt 2 has not joined
  EXPECT_EQ(b2.resume_step, 0);
  EXPECT_EQ(b2.resume_manifest_sha256, "5ha");
  EXPECT_EQ(b2.hang_timeout, absl::Seconds(20));
  JoinInfo a2 = Join(job, "a", 0);
  EXPECT_EQ(a2.attempt, 2);
  EXPECT_FALSE(a2.rendezvous_host.empty());
  EXPECT_EQ(a2.state, JobState::kRunning);
  ASSERT_TRUE(Step(job, "a", 2, 0, 1, 0.0).ok());

  JobClient client({server_->address(), absl::Seconds(10), absl::ZeroDuration(), {}});
  auto info = client.GetJob(job.job_id());
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->state, JobState::kRunning);
  EXPECT_EQ(info->attempt, 2);
  EXPECT_EQ(info->restarts, 1);
  EXPECT_EQ(info->max_restarts, 3);
  EXPECT_EQ(info->last_checkpoint_step, 0);
  EXPECT_EQ(info->resume_step, 0);
  EXPECT_NE(info->last_recovery_reason.find("killed by signal 9"), std::string::npos)
      << info->last_recovery_reason;
  ASSERT_EQ(info->slowest.size(), 1u);
  EXPECT_EQ(info->slowest[0].slowest_rank, 0);
  EXPECT_EQ(info->slowest[0].lag_seconds, 0.25);

  v1::ListLatchesRequest lreq;
  lreq.set_job_id(job.job_id());
  v1::ListLatchesResponse lresp;
  ASSERT_TRUE(jobs_->ListLatches(Ctx().get(), lreq, &lresp).ok());
  LatchAuditPage page = FromProto(lresp);
  ASSERT_EQ(page.events.size(), 2u);
  EXPECT_EQ(page.events[0].kind, "checkpoint");
  EXPECT_EQ(page.events[1].kind, "recovery");
  EXPECT_EQ(page.events[1].attempt, 2);
  EXPECT_GT(page.events[1].time, absl::UnixEpoch());

  const std::string after = server_->metrics().Serialize();
  EXPECT_NE(after.find("latchkey_job_restarts_total 1"), std::string::npos) << after;
  EXPECT_NE(after.find("latchkey_boundary_arrival_lag_seconds_count 1"), std::string::npos)
      << after;
  EXPECT_NE(after.find("latchkey_jobs{state=\"running\"} 1"), std::string::npos) << after;
  EXPECT_NE(after.find("latchkey_workers{state=\"active\"} 2"), std::string::npos) << after;
}

TEST_F(AttemptsTest, StallVerdictShowsInTheGaugeUntilTheNextAttemptCompletesAStep) {
  SpecParams p;
  p.steps = 4;
  p.extra_latchkey = {{"hang_timeout_seconds", 0.2}};
  v1::SubmitJobRequest sreq;
  sreq.set_spec_json(SpecJson(p));
  v1::SubmitJobResponse job;
  ASSERT_TRUE(jobs_->SubmitJob(Ctx().get(), sreq, &job).ok());
  Join(job, "a", 0);
  Join(job, "b", 1);
  // Rank 0 waits in a collective; rank 1 heartbeats without a position (idle, before the plan).
  RankPosition waiting;
  waiting.attempt = 1;
  waiting.window = 0;
  waiting.micro_batch = 3;
  waiting.phase = RankPhase::kCollective;
  waiting.op = "all_reduce";
  waiting.group = "dp";
  waiting.seq = 1;
  waiting.seconds = 1.0;
  v1::HeartbeatRequest hb;
  *hb.mutable_identity() = Id(job, "b", 1);
  hb.set_rank(1);
  v1::HeartbeatResponse hbr;
  ASSERT_TRUE(workers_->Heartbeat(Ctx().get(), hb, &hbr).ok());
  *hb.mutable_identity() = Id(job, "a", 1);
  hb.set_rank(0);
  *hb.mutable_position() = ToProto(waiting);
  ASSERT_TRUE(workers_->Heartbeat(Ctx().get(), hb, &hbr).ok());

  JobClient client({server_->address(), absl::Seconds(10), absl::ZeroDuration(), {}});
  absl::StatusOr<JobInfo> info;
  for (int i = 0; i < 100; ++i) {  // the liveness checker runs every second
    info = client.GetJob(job.job_id());
    ASSERT_TRUE(info.ok()) << info.status();
    if (info->state != JobState::kRunning) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_EQ(info->state, JobState::kRecovering);
  ASSERT_EQ(info->stalled.size(), 1u);
  EXPECT_EQ(info->stalled[0].rank, 1);
  EXPECT_EQ(info->stalled[0].where, "idle");
  EXPECT_EQ(info->last_recovery_reason.rfind("rank 1 stalled before the first window (idle)", 0),
            0u)
      << info->last_recovery_reason;
  EXPECT_NE(info->last_recovery_reason.find("; rank 0 waiting in all_reduce/dp #1"),
            std::string::npos)
      << info->last_recovery_reason;
  std::string text = server_->metrics().Serialize();
  EXPECT_NE(text.find("latchkey_stalled_ranks 1"), std::string::npos) << text;
  EXPECT_NE(text.find("latchkey_job_restarts_total 1"), std::string::npos) << text;

  JoinInfo a2 = Join(job, "a", 0);
  Join(job, "b", 1);
  EXPECT_EQ(a2.attempt, 2);
  ASSERT_TRUE(Step(job, "a", 2, 0, 0, 0.0).ok());
  ASSERT_TRUE(Step(job, "b", 2, 1, 0, 0.0).ok());
  EXPECT_TRUE(client.GetJob(job.job_id())->stalled.empty());
  text = server_->metrics().Serialize();
  EXPECT_NE(text.find("latchkey_stalled_ranks 0"), std::string::npos) << text;
}

// Nobody rejoins after a supervisor reported a death: once the liveness timeout has passed since
// the recovery began, the liveness checker fails the attempt, and with no restart left the job.
TEST_F(AttemptsTest, RanksThatNeverRejoinFailTheJobOnceTheRestartsAreSpent) {
  CoordinatorOptions opt;
  opt.liveness_timeout = absl::Milliseconds(300);
  opt.heartbeat_interval = absl::Milliseconds(100);
  Start(opt);  // in place of the fixture's coordinator
  v1::SubmitJobResponse job = Submit(/*max_restarts=*/1);
  Join(job, "a", 0);
  Join(job, "b", 1);
  v1::ReportFailureRequest fail;
  *fail.mutable_identity() = Id(job, "b", 0);
  fail.set_rank(1);
  fail.set_message("process exited: killed by signal 9");
  v1::ReportFailureResponse failr;
  ASSERT_TRUE(workers_->ReportFailure(Ctx().get(), fail, &failr).ok());
  ASSERT_EQ(failr.state(), v1::JOB_STATE_RECOVERING);

  JobClient client({server_->address(), absl::Seconds(10), absl::ZeroDuration(), {}});
  absl::StatusOr<JobInfo> info;
  for (int i = 0; i < 200; ++i) {
    info = client.GetJob(job.job_id());
    ASSERT_TRUE(info.ok()) << info.status();
    if (info->state != JobState::kRecovering) break;
    absl::SleepFor(absl::Milliseconds(25));
  }
  ASSERT_EQ(info->state, JobState::kFailed);
  EXPECT_EQ(info->attempt, 2);
  EXPECT_EQ(info->failure_reason,
            "ranks 0, 1 did not rejoin attempt 2 within 300ms (after 1 restart)");
  const std::string text = server_->metrics().Serialize();
  for (const char* series : {"latchkey_job_restarts_total 1", "latchkey_jobs{state=\"failed\"} 1",
                             "latchkey_jobs{state=\"recovering\"} 0"}) {
    EXPECT_NE(text.find(series), std::string::npos) << series << "\n" << text;
  }
  v1::JoinRequest late;
  *late.mutable_identity() = Id(job, "a", 0);
  v1::JoinResponse resp;
  EXPECT_EQ(workers_->Join(Ctx().get(), late, &resp).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(AttemptsTest, WireKeepsEveryFaultToleranceField) {
  JobInfo job;
  job.attempt = 3;
  job.restarts = 2;
  job.max_restarts = 5;
  job.last_checkpoint_step = 11;
  job.resume_step = 7;
  job.last_recovery_reason = "rank 1 stalled";
  job.stalled.push_back({1, 12, 3, "compute", 14.5, 2});
  job.determinism_violations = 4;
  job.slowest.push_back({12, 3, 0.125});
  const JobInfo back = FromProto(ToProto(job));
  EXPECT_EQ(back.attempt, 3);
  EXPECT_EQ(back.restarts, 2);
  EXPECT_EQ(back.max_restarts, 5);
  EXPECT_EQ(back.last_checkpoint_step, 11);
  EXPECT_EQ(back.resume_step, 7);
  EXPECT_EQ(back.last_recovery_reason, "rank 1 stalled");
  ASSERT_EQ(back.stalled.size(), 1u);
  EXPECT_EQ(back.stalled[0].where, "compute");
  EXPECT_EQ(back.stalled[0].seconds, 14.5);
  EXPECT_EQ(back.stalled[0].attempt, 2);
  EXPECT_EQ(back.determinism_violations, 4);
  ASSERT_EQ(back.slowest.size(), 1u);
  EXPECT_EQ(back.slowest[0].lag_seconds, 0.125);

  for (RankPhase phase : {RankPhase::kIdle, RankPhase::kLatch, RankPhase::kCompute,
                          RankPhase::kCollective, RankPhase::kCheckpoint, RankPhase::kEval}) {
    RankPosition p;
    p.phase = phase;
    p.seconds = 1.5;
    EXPECT_EQ(FromProto(ToProto(p)).phase, phase) << RankPhaseName(phase);
    EXPECT_EQ(FromProto(ToProto(p)).seconds, 1.5);
  }
  v1::RankPosition unknown;
  unknown.set_phase("dreaming");
  EXPECT_EQ(FromProto(unknown).phase, RankPhase::kIdle);

  v1::ReportCheckpointRequest no_sha;
  no_sha.set_step(3);
  EXPECT_EQ(FromProto(no_sha).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace latchkey::testing
