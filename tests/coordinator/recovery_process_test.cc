// latchkey-coordinator as a process killed at the crash point recovery.after_attempt (the new
// attempt is persisted, nothing else happened yet): restarted on the same SQLite file and port
// it finishes the recovery (docs/fault-tolerance.md "Testing faults").
#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "client/job_client.h"
#include "gtest/gtest.h"
#include "latchkey/v1/worker_service.grpc.pb.h"
#include "proto/channel.h"
#include "proto/wire.h"
#include "tests/coordinator/harness.h"
#include "tests/support/specs.h"
#include "tests/support/temp_dir.h"

namespace latchkey::testing {
namespace {

std::unique_ptr<grpc::ClientContext> Ctx() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  return ctx;
}

v1::WorkerIdentity Id(const SubmittedJob& job, const std::string& worker, int64_t attempt) {
  v1::WorkerIdentity id;
  id.set_job_id(job.job_id);
  id.set_join_token(job.join_token);
  id.set_worker_id(worker);
  id.set_attempt(attempt);
  return id;
}

grpc::Status Join(v1::WorkerService::Stub& stub, const SubmittedJob& job, const std::string& worker,
                  int rank, JoinInfo* out) {
  v1::JoinRequest req;
  *req.mutable_identity() = Id(job, worker, 0);
  req.mutable_requested_rank()->set_value(rank);
  v1::JoinResponse resp;
  grpc::Status st = stub.Join(Ctx().get(), req, &resp);
  if (st.ok()) *out = FromProto(resp);
  return st;
}

TEST(RecoveryProcessTest, KilledRightAfterPersistingANewAttemptItFinishesTheRecoveryOnRestart) {
  const ScopedTempDir dir("coord-db");
  const std::string db = dir / "coord.db";
  const std::vector<std::string> args = {"--liveness-timeout", "60"};
  auto first = std::make_unique<CoordinatorProcess>(db, 0, args);
  first->set_env({"LATCHKEY_TEST_CRASH=recovery.after_attempt"});
  ASSERT_TRUE(first->Start());
  const int port = first->grpc_port();
  const std::string address = first->address();
  JobClient client({address, absl::Seconds(5), absl::ZeroDuration(), {}});
  JobSubmission submission;
  submission.spec_json = SpecJson();
  auto job = client.SubmitJob(submission);
  ASSERT_TRUE(job.ok()) << job.status();
  {
    auto stub = v1::WorkerService::NewStub(MakeCoordinatorChannel(address));
    JoinInfo info;
    ASSERT_TRUE(Join(*stub, *job, "a", 0, &info).ok());
    ASSERT_TRUE(Join(*stub, *job, "b", 1, &info).ok());
    EXPECT_EQ(info.attempt, 1);
    v1::ReportFailureRequest fail;
    *fail.mutable_identity() = Id(*job, "b", 0);
    fail.set_rank(1);
    fail.set_message("process exited: killed by signal 9");
    v1::ReportFailureResponse resp;
    EXPECT_FALSE(stub->ReportFailure(Ctx().get(), fail, &resp).ok());  // it died answering
  }
  ASSERT_TRUE(first->Exited(absl::Seconds(10)));

  CoordinatorProcess second(db, port, args);
  ASSERT_TRUE(second.Start());
  auto stub = v1::WorkerService::NewStub(MakeCoordinatorChannel(second.address()));
  JobClient again({second.address(), absl::Seconds(5), absl::ZeroDuration(), {}});
  auto recovering = again.GetJob(job->job_id);
  ASSERT_TRUE(recovering.ok()) << recovering.status();
  EXPECT_EQ(recovering->state, JobState::kRecovering);
  EXPECT_EQ(recovering->attempt, 2);
  EXPECT_EQ(recovering->restarts, 1);
  EXPECT_NE(recovering->last_recovery_reason.find("killed by signal 9"), std::string::npos)
      << recovering->last_recovery_reason;
  EXPECT_EQ(recovering->workers_joined, 0);

  // The old attempt is fenced; the ranks join attempt 2 and the job runs again.
  v1::HeartbeatRequest hb;
  *hb.mutable_identity() = Id(*job, "a", 1);
  v1::HeartbeatResponse hbr;
  grpc::Status fenced = stub->Heartbeat(Ctx().get(), hb, &hbr);
  EXPECT_EQ(fenced.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_NE(fenced.error_message().find("is at attempt 2 (fenced)"), std::string::npos)
      << fenced.error_message();
  JoinInfo b2;
  ASSERT_TRUE(Join(*stub, *job, "b2", 1, &b2).ok());
  EXPECT_EQ(b2.attempt, 2);
  EXPECT_EQ(b2.rendezvous_prefix, job->job_id + "/a2");
  EXPECT_EQ(b2.rendezvous_host, "");
  JoinInfo a2;
  ASSERT_TRUE(Join(*stub, *job, "a", 0, &a2).ok());
  EXPECT_EQ(a2.state, JobState::kRunning);
  hb.mutable_identity()->set_attempt(2);
  ASSERT_TRUE(stub->Heartbeat(Ctx().get(), hb, &hbr).ok());
  EXPECT_EQ(hbr.attempt(), 2);
  EXPECT_EQ(hbr.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(second.Terminate(), 0);
}

}  // namespace
}  // namespace latchkey::testing
